// @expect TS2322 — `sandbox.limits` sizes are numbers of MiB, not strings like '4G'.
import type { ClaudeAdapterConfig } from 'claude-runtime-adapter';
export const sandbox: ClaudeAdapterConfig['sandbox'] = { limits: { memoryMiB: '4G' } };
