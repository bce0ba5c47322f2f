// @expect TS2322 — even narrowed, `patch` is string | null.
import type { AgentRunHandle } from 'claude-runtime-adapter';
declare const handle: AgentRunHandle;
export async function f(): Promise<string> {
  const result = await handle.result;
  if (result.role !== 'implementor') return '';
  const patch: string = result.patch;
  return patch;
}
