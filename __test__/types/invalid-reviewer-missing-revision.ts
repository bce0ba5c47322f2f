// @expect TS2345 — the reviewer needs a revisionID.
import type { RuntimeAdapter } from 'claude-runtime-adapter';
declare const adapter: RuntimeAdapter;
export const prompt = adapter.previewPrompt({ role: 'reviewer', workItemID: 'w1' });
