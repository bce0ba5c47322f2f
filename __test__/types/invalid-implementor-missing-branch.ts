// @expect TS2345 — the implementor needs a branchName.
import type { RuntimeAdapter } from 'claude-runtime-adapter';
declare const adapter: RuntimeAdapter;
export const handle = adapter.startAgent({ role: 'implementor', workItemID: 'w1' });
