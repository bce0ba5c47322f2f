// Issue 35: the adapter's own OpenTelemetry. The engine's process names a collector with the
// standard OTEL_* variables before createClaudeAdapter; a session through the real CLI and the
// fake API is then one trace (its lifecycle's steps in order, its model requests and tool calls
// under it, the engine's traceparent honoured) and the fleet's metrics count what ran. The
// collector on 127.0.0.1 decodes OTLP with the official protobuf definitions.
//
// The pipeline is the process's (configured once, by the first adapter that finds an endpoint),
// so this file sets the variables before its first adapter and every test reads what this file
// ran; the metrics are cumulative.
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
const total = (name, match = {}) =>
  points(name)
    .filter((p) => Object.entries(match).every(([k, v]) => p.attrs[k] === v))
    .reduce((n, p) => n + (p.value ?? p.count), 0);

async function eventually(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** What this file ran, for the metrics: sessions by role and outcome, model requests. */
const ran = { started: 0, ok: 0, errors: {}, requests: 0, tokens: { input: 0, output: 0 }, denied: 0 };
/** Counts the model requests harness `h`'s fake API answered. */
const usageOf = (h) => {
  ran.requests += h.api.requests.filter((q) => q.path === '/v1/messages').length;
};

describe("the adapter's own OpenTelemetry, configured by the engine's OTEL_* variables", () => {
  it("one Implementor session is one trace under the engine's traceparent: its steps in order, each model request and tool call under it, the blocked command marked", { timeout: 120_000 }, async () => {
    const h = await setup({
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      repo: { agents: agentsWithTools(['Bash']) },
      hook: async (event) => (String(event.tool_input?.command).includes('forbidden') ? { decision: 'block', reason: 'not this one' } : { decision: 'approve' }),
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
      ran.started += 1;
      ran.ok += 1;
      ran.denied += 1;
      usageOf(h);
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
    const h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) } });
    try {
      const adapter = h.adapter();
      for (const role of ['planner', 'reviewer']) {
        h.api.setScript(scenario.steps([ROLES[role].done]));
        await (await adapter.startAgent(ROLES[role].params())).result;
        ran.started += 1;
        ran.ok += 1;
      }
      // An Implementor that changed nothing: ERR_EMPTY_PATCH.
      h.api.setScript(scenario.steps([ROLES.implementor.done]));
      const failed = await rejection((await adapter.startAgent(ROLES.implementor.params('otel-2'))).result);
      expect(failed.code).toBe('ERR_EMPTY_PATCH');
      ran.started += 1;
      ran.errors[failed.code] = (ran.errors[failed.code] ?? 0) + 1;
      // Refused at the start (a malformed traceparent): an error, not a session.
      const refused = await rejection(adapter.startAgent({ ...ROLES.planner.params(), traceparent: '00-xyz' }));
      expect(refused.code).toBe('ERR_INVALID_PARAMS');
      expect(refused.message).toContain('params.traceparent');
      ran.errors.ERR_INVALID_PARAMS = (ran.errors.ERR_INVALID_PARAMS ?? 0) + 1;
      usageOf(h);
      await adapter.shutdown();

      await eventually(() => total('cra.sessions.ended') === ran.started, 10_000, `${ran.started} sessions ended in the metrics (got ${total('cra.sessions.ended')})`);
      expect(total('cra.sessions.started')).toBe(ran.started);
      expect(total('cra.sessions.started', { 'cra.role': 'planner' })).toBe(1);
      expect(total('cra.sessions.ended', { 'cra.outcome': 'success' })).toBe(ran.ok);
      for (const [code, n] of Object.entries(ran.errors)) expect(total('cra.errors', { 'error.type': code })).toBe(n);
      expect(total('cra.session.start.duration')).toBe(ran.started);
      expect(total('cra.session.duration')).toBe(ran.started);
      expect(total('gen_ai.client.operation.duration')).toBe(ran.requests);
      expect(total('gen_ai.client.token.usage', { 'gen_ai.token.type': 'input' })).toBe(ran.requests);
      expect(total('cra.model.tokens', { 'gen_ai.token.type': 'output' })).toBeGreaterThanOrEqual(ran.requests);
      expect(points('cra.model.cost').every((p) => p.attrs['gen_ai.response.model'])).toBe(true);
      expect(total('cra.model.cost')).toBeGreaterThan(0);
      expect(total('cra.sandbox.denials', { 'cra.denial.kind': 'command' })).toBe(ran.denied);
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
