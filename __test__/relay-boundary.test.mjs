// Issue 36: the model-API relay as an agent would use it against the engine, through the real
// CLI: every request of a session passes the relay, which holds the credential and runs in the
// engine's process.
import { afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from './support/agent-bash.mjs';
import { toolUse } from './support/fake-api.mjs';
import { post, REACHING_OUT, reachingOut, rssGrowthWhile, uploads } from './support/relay-probes.mjs';
import { rejection, setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

describe('the relay sends a request once', () => {
  it('a request the API read whole and then dropped without an answer is not sent again (it may have been billed): the session fails, the API saw it once', async () => {
    // Not resumed either (apiOutageTolerance 0): the relay's own sending is what is tested.
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, script: () => ({ cut: true }), config: { apiOutageTolerance: 0 } });
    const handle = await h.adapter().startAgent(ROLES.implementor.params());
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    // The CLI's own retries are off in the tests (CLAUDE_CODE_MAX_RETRIES=0): what the API saw
    // more than once, the relay sent more than once.
    expect(h.api.mainRequests()).toHaveLength(1);
  });
});

describe("the relay's memory is bounded", () => {
  it("32 uploads held open by the agent's own commands grow the engine's memory by its session's share (64 MB), not by what they send (0.9 GB)", { timeout: 120_000 }, async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) } });
    const { value: { out }, grownMiB: grown } = await rssGrowthWhile(() => agentRuns(h, 'planner', [`${uploads({ n: 32, declared: 30_000_000, sent: 29_000_000, holdS: 15 })}; sleep 12; echo held`]));
    expect(out[0]).toContain('held');
    console.log(`[measure] engine RSS grew ${grown.toFixed(0)} MiB at its peak while the agent held 32 uploads of 29 MB`);
    expect(grown).toBeLessThan(160);
  });

  it('an upload declaring more than the API takes (32 MB) is answered 413 at once, before its body is read', async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) } });
    const { out } = await agentRuns(h, 'planner', [
      'hp=${ANTHROPIC_BASE_URL#http://}; hp=${hp%%/*}; exec 3<>/dev/tcp/${hp%:*}/${hp##*:}; '
        + "printf 'POST /v1/messages HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 40000000\\r\\n\\r\\n' >&3; "
        + 'timeout 10 head -n 1 <&3',
    ]);
    expect(out[0]).toMatch(/^HTTP\/1\.1 413 /);
  });
});

describe('the model API is no way around the network allowlist', () => {
  it("requests the agent's own commands post that ask the API to reach out (MCP servers, web fetch, code execution) are refused 400 and never reach the API; the session's own requests go on", async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) } });
    const { out, result } = await agentRuns(h, 'planner', Object.values(REACHING_OUT).map(([json, headers]) => post(json, headers)));
    for (const [i, what] of Object.keys(REACHING_OUT).entries()) expect(out[i], what).toMatch(/^HTTP\/1\.1 400 /);
    expect(reachingOut(h.api)).toEqual([]);
    expect(result.role).toBe('planner');
  });

  it('allowed by sandbox.serverTools, the same request reaches the API', async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) }, config: { sandbox: { serverTools: ['web_fetch'] } } });
    const [json] = REACHING_OUT['a web_fetch server tool'];
    const { out } = await agentRuns(h, 'planner', [post(json), post(REACHING_OUT['a code_execution server tool'][0])]);
    expect(out[0]).toMatch(/^HTTP\/1\.1 200 /);
    expect(out[1]).toMatch(/^HTTP\/1\.1 400 /);
    expect(reachingOut(h.api).map((r) => r.body.tools[0].type)).toEqual(['web_fetch_20250910']);
  });

  it("the CLI's own WebSearch reaches the API where sandbox.serverTools allows web_search; where not, its request is refused and the session goes on", async () => {
    const webSearches = (api) => reachingOut(api).filter((r) => r.body.tools.some((t) => t.type.startsWith('web_search_')));
    for (const serverTools of [['web_search'], []]) {
      h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash', 'WebSearch']) }, config: { sandbox: { serverTools } } });
      const { result } = await agentRuns(h, 'planner', [toolUse('WebSearch', { query: 'tokio runtime' })]);
      expect(result.role).toBe('planner');
      expect(webSearches(h.api), `serverTools ${JSON.stringify(serverTools)}`).toHaveLength(serverTools.length);
      await h.cleanup();
      h = undefined;
    }
  });
});
