// @expect TS2322 — output chunks are strings.
import type { AgentRunHandle } from 'claude-runtime-adapter';
declare const handle: AgentRunHandle;
export async function f(): Promise<void> {
  for await (const chunk of handle.output) {
    const n: number = chunk;
    void n;
  }
}
