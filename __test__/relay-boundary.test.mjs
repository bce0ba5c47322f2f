// Issue 36: the model-API relay as an agent would use it against the engine, through the real
// CLI: every request of a session passes the relay, which holds the credential and runs in the
// engine's process.
import { afterEach, describe, expect, it } from 'vitest';
import { rejection, setup } from './support/harness.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

describe('the relay sends a request once', () => {
  it('a request the API read whole and then dropped without an answer is not sent again (it may have been billed): the session fails, the API saw it once', async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, script: () => ({ cut: true }) });
    const handle = await h.adapter().startAgent(ROLES.implementor.params());
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    // The CLI's own retries are off in the tests (CLAUDE_CODE_MAX_RETRIES=0): what the API saw
    // more than once, the relay sent more than once.
    expect(h.api.mainRequests()).toHaveLength(1);
  });
});
