// @expect TS2345 — `sessions()[i].pid` is null until the CLI runs: narrow first.
import type { SessionInfo } from 'claude-runtime-adapter';
export function signal(s: SessionInfo): boolean {
  return process.kill(s.pid, 0);
}
