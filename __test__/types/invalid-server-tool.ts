// @expect TS2322 — `sandbox.serverTools` takes only the features the relay knows; a name it does not know is no setting.
import type { ClaudeAdapterConfig } from 'claude-runtime-adapter';
export const sandbox: ClaudeAdapterConfig['sandbox'] = { serverTools: ['browser'] };
