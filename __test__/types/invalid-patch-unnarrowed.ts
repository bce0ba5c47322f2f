// @expect TS2339 — `patch` exists only on the implementor's result: narrow on `role` first.
import type { AgentRunHandle } from 'claude-runtime-adapter';
declare const handle: AgentRunHandle;
export async function f(): Promise<string> {
  const result = await handle.result;
  const patch: string = result.patch;
  return patch;
}
