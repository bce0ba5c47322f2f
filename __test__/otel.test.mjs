// Issue 35: the adapter's own OpenTelemetry. The engine's process names a collector with the
// standard OTEL_* variables before createClaudeAdapter; a session through the real CLI and the
// fake API is then one trace (its lifecycle's steps in order, its model requests and tool calls
// under it, the engine's traceparent honoured) and the fleet's metrics count what ran. The
// collector on 127.0.0.1 decodes OTLP with the official protobuf definitions.
//
// The pipeline is the process's (configured once, by the first adapter that finds an endpoint),
// so this file sets the variables before its first adapter. The metrics are cumulative over the
// process: a test counts what it ran itself and compares it with how much the exported totals
// grew while it ran, so that each test passes alone (`-t`) as in the file (issue 51: the metrics
// test used to compare them with a count the trace test had added to).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bash, scenario } from './support/fake-api.mjs';
import { rejection, setup } from './support/harness.mjs';
import { metricPoints, sessionTrace, spansOf, startCollector } from './support/otlp-collector.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

const TOKEN = 'adapter-otel-token-8c1d';
const VARS = {
  OTEL_EXPORTER_OTLP_HEADERS: `authorization=Bearer%20${TOKEN}`,
  OTEL_METRIC_EXPORT_INTERVAL: '300',
  OTEL_BSP_SCHEDULE_DELAY: '100',
  OTEL_SERVICE_NAME: 'engine-under-test',
};
/** What the engine passes: its dispatch's span. */
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT_ID = '00f067aa0ba902b7';

let collector;
beforeAll(async () => {
  collector = await startCollector();
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = collector.url;
  Object.assign(process.env, VARS);
});
afterAll(async () => {
  for (const k of ['OTEL_EXPORTER_OTLP_ENDPOINT', ...Object.keys(VARS)]) delete process.env[k];
  await collector?.close();
});

const spans = () => spansOf(collector);
const points = (name) => metricPoints(collector, name);
/** A metric's total over its points that have the attributes of `match`. */
const sum = (pts, match) =>
  pts.filter((p) => Object.entries(match).every(([k, v]) => p.attrs[k] === v)).reduce((n, p) => n + (p.value ?? p.count), 0);
const total = (name, match = {}) => sum(points(name), match);

async function eventually(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The engine's Bash validator: blocks any command that says `forbidden` (a sandbox denial). */
const blockForbidden = async (event) =>
  String(event.tool_input?.command).includes('forbidden') ? { decision: 'block', reason: 'not this one' } : { decision: 'approve' };

/**
 * The exported totals now, once whatever was recorded before this call has been exported (two
 * exports arrived after it, so one began after it; none within 3 s: nothing is exported yet,
 * every total is 0).
 * Resolves with `grown(name, match)`: how much a total has grown since.
 */
async function totalsNow() {
  const seen = collector.of('metrics').length;
  const deadline = Date.now() + 3_000;
  while (collector.of('metrics').length < seen + 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  const then = new Map([...new Set(collector.metricNames())].map((name) => [name, points(name)]));
  return (name, match = {}) => total(name, match) - sum(then.get(name) ?? [], match);
}

describe("the adapter's own OpenTelemetry, configured by the engine's OTEL_* variables", () => {
  it("one Implementor session is one trace under the engine's traceparent: its steps in order, each model request and tool call under it, the blocked command marked", { timeout: 120_000 }, async () => {
    const h = await setup({
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      repo: { agents: agentsWithTools(['Bash']) },
      hook: blockForbidden,
    });
    try {
      const adapter = h.adapter();
      h.api.setScript(
        scenario.steps([
          bash('echo work > made.txt && git add -A && git commit -qm work'),
          bash('echo forbidden'),
          ROLES.implementor.done,
        ]),
      );
      const handle = await adapter.startAgent({ ...ROLES.implementor.params('otel-1'), sessionID: 'otel-session-1', traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` });
      const result = await handle.result;
      expect(result.outcome).toBe('completed');
      await adapter.shutdown();

      await eventually(() => spans().some((s) => s.name === 'invoke_agent implementor'), 10_000, 'the session span');
      const { root, steps, chats, tools } = sessionTrace(collector, TRACE_ID, 'implementor');
      expect(root.parentSpanId).toBe(PARENT_ID);
      expect(root.attrs).toMatchObject({
        'cra.session.id': 'otel-session-1',
        'cra.role': 'implementor',
        'cra.work_item.id': '1',
        'cra.branch': 'otel-1',
        'cra.outcome': 'success',
        'gen_ai.operation.name': 'invoke_agent',
      });
      expect(root.attrs['cra.cost.usd']).toBeGreaterThan(0);
      expect(root.resource['service.name']).toBe('engine-under-test');
      // The lifecycle's steps, children of the session, one after another.
      expect(steps.map((s) => s.name)).toEqual(['provision', 'assemble', 'spawn', 'supervise', 'extract', 'clean']);
      for (let i = 1; i < steps.length; i++) expect(steps[i].start >= steps[i - 1].end).toBe(true);
      expect(steps[0].start >= root.start && steps.at(-1).end <= root.end).toBe(true);
      // One span per model request the fake API answered, with its usage.
      const sent = h.api.requests.filter((r) => r.path === '/v1/messages');
      expect(chats).toHaveLength(sent.length);
      for (const c of chats) {
        expect(c.parentSpanId).toBe(root.spanId);
        expect(c.attrs['http.response.status_code']).toBe(200);
        expect(c.attrs['gen_ai.usage.input_tokens']).toBeGreaterThan(0);
        expect(c.attrs['gen_ai.usage.output_tokens']).toBeGreaterThan(0);
        expect(c.name).toBe(`chat ${c.attrs['gen_ai.response.model']}`);
      }
      // The tool calls: the two commands (the second blocked by the engine's validator) and the answer.
      const byName = (n) => tools.filter((t) => t.attrs['gen_ai.tool.name'] === n);
      expect(byName('Bash')).toHaveLength(2);
      const [allowed, blocked] = byName('Bash').sort((a, b) => (a.start < b.start ? -1 : 1));
      expect(allowed.attrs['cra.tool.decision']).toBe('allowed');
      expect(blocked.attrs).toMatchObject({ 'cra.tool.decision': 'blocked', 'cra.tool.reason': 'not this one' });
      for (const t of tools) expect(t.parentSpanId).toBe(root.spanId);
      expect(allowed.end > allowed.start).toBe(true);
      // The collector's header, from OTEL_EXPORTER_OTLP_HEADERS.
      expect(collector.of('traces').every((e) => e.headers.authorization === `Bearer ${TOKEN}`)).toBe(true);
    } finally {
      await h.cleanup();
    }
  });

  it('the metrics count the sessions by role and outcome, errors by code, tokens and cost by model, the starts and results, the sandbox denials', { timeout: 180_000 }, async () => {
    const h = await setup({
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      repo: { agents: agentsWithTools(['Bash']) },
      hook: blockForbidden,
    });
    try {
      const grown = await totalsNow();
      const adapter = h.adapter();
      for (const role of ['planner', 'reviewer']) {
        h.api.setScript(scenario.steps([ROLES[role].done]));
        await (await adapter.startAgent(ROLES[role].params())).result;
      }
      // An Implementor whose one command the engine's validator blocks, and that so changed
      // nothing: a sandbox denial, then ERR_EMPTY_PATCH.
      h.api.setScript(scenario.steps([bash('echo forbidden > f.txt'), ROLES.implementor.done]));
      const failed = await rejection((await adapter.startAgent(ROLES.implementor.params('otel-2'))).result);
      expect(failed.code).toBe('ERR_EMPTY_PATCH');
      // Refused at the start (a malformed traceparent): an error, not a session.
      const refused = await rejection(adapter.startAgent({ ...ROLES.planner.params(), traceparent: '00-xyz' }));
      expect(refused.code).toBe('ERR_INVALID_PARAMS');
      expect(refused.message).toContain('params.traceparent');
      const requests = h.api.requests.filter((q) => q.path === '/v1/messages').length;
      await adapter.shutdown();

      // Three sessions (two ended in success, one in ERR_EMPTY_PATCH), one refused start.
      await eventually(() => grown('cra.sessions.ended') === 3, 10_000, `3 sessions ended in the metrics (got ${grown('cra.sessions.ended')})`);
      expect(grown('cra.sessions.started')).toBe(3);
      expect(grown('cra.sessions.started', { 'cra.role': 'planner' })).toBe(1);
      expect(grown('cra.sessions.ended', { 'cra.outcome': 'success' })).toBe(2);
      expect(grown('cra.errors', { 'error.type': 'ERR_EMPTY_PATCH' })).toBe(1);
      expect(grown('cra.errors', { 'error.type': 'ERR_INVALID_PARAMS' })).toBe(1);
      expect(grown('cra.session.start.duration')).toBe(3);
      expect(grown('cra.session.duration')).toBe(3);
      expect(requests).toBeGreaterThanOrEqual(4);
      expect(grown('gen_ai.client.operation.duration')).toBe(requests);
      expect(grown('gen_ai.client.token.usage', { 'gen_ai.token.type': 'input' })).toBe(requests);
      expect(grown('cra.model.tokens', { 'gen_ai.token.type': 'output' })).toBeGreaterThanOrEqual(requests);
      expect(points('cra.model.cost').every((p) => p.attrs['gen_ai.response.model'])).toBe(true);
      expect(grown('cra.model.cost')).toBeGreaterThan(0);
      expect(grown('cra.sandbox.denials', { 'cra.denial.kind': 'command' })).toBe(1);
      expect(collector.of('metrics').every((e) => e.headers.authorization === `Bearer ${TOKEN}`)).toBe(true);
      // The failed session's span carries its code, with the status ERROR.
      await eventually(() => spans().some((s) => s.attrs['error.type'] === 'ERR_EMPTY_PATCH'), 10_000, 'the failed session span');
      const failedSpan = spans().find((s) => s.attrs['error.type'] === 'ERR_EMPTY_PATCH');
      expect(failedSpan).toMatchObject({ name: 'invoke_agent implementor', attrs: { 'cra.outcome': 'error', 'cra.branch': 'otel-2' } });
      expect(failedSpan.status.code).toBe(2);
      expect(failedSpan.status.message).toContain('changed nothing');
    } finally {
      await h.cleanup();
    }
  });
});
