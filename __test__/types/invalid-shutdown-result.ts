// @expect TS2322 — shutdown resolves to nothing.
import type { RuntimeAdapter } from 'claude-runtime-adapter';
declare const adapter: RuntimeAdapter;
export async function f(): Promise<void> {
  const n: number = await adapter.shutdown();
  void n;
}
