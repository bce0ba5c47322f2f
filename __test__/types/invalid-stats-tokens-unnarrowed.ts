// @expect TS18047 — `stats.tokens` is null for a session that never got a result: narrow first.
import type { SessionStats } from 'claude-runtime-adapter';
export function input(s: SessionStats): number {
  return s.tokens.input;
}
