// @expect TS2322 — 'tester' is not a role.
import type { RuntimeAdapter } from 'claude-runtime-adapter';
declare const adapter: RuntimeAdapter;
export const handle = adapter.startAgent({ role: 'tester', workItemID: 'w1', branchName: 'b' });
