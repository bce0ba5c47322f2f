// @expect TS2322 — `sandbox` is off only as `false`; `true` is not a setting (omit it or pass `{}`).
import type { ClaudeAdapterConfig } from 'claude-runtime-adapter';
export const sandbox: ClaudeAdapterConfig['sandbox'] = true;
