// Issue 35 on the Kubernetes backend: the adapter's own trace of a session in a pod. The relay
// and the lifecycle run in the engine as locally, so the trace has the same shape: the steps in
// order, a span per model request (through the pod's tunnel to the relay), a span per tool call,
// under the engine's traceparent. The pipeline is the process's: this file sets the OTEL_*
// variables before its first adapter.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { bash, scenario } from '../support/fake-api.mjs';
import { setup } from '../support/harness.mjs';
import { sessionTrace, spansOf, startCollector } from '../support/otlp-collector.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
import { adapterPods, eventually, kubeBackend } from './support.mjs';

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const PARENT_ID = 'b7ad6b7169203331';

let collector;
beforeAll(async () => {
  collector = await startCollector();
  Object.assign(process.env, { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_BSP_SCHEDULE_DELAY: '100' });
});
afterAll(async () => {
  delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
  delete process.env.OTEL_BSP_SCHEDULE_DELAY;
  await collector?.close();
});

it("an Implementor in a pod is one trace under the engine's traceparent: its steps in order, each model request and tool call under it", { timeout: 240_000 }, async () => {
  const h = await setup({ repo: { agents: agentsWithTools(['Bash']) }, state: ROLE_STATE, bodies: ROLE_BODIES, config: { backend: kubeBackend() } });
  try {
    const adapter = h.adapter();
    h.api.setScript(scenario.steps([bash('echo work > made.txt && git add -A && git commit -qm work'), ROLES.implementor.done]));
    const handle = await adapter.startAgent({ ...ROLES.implementor.params('otel-pod'), traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` });
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('made.txt');
    await adapter.shutdown();
    await eventually(() => spansOf(collector).some((s) => s.traceId === TRACE_ID && s.name === 'invoke_agent implementor'), 15_000, 'the session span');
    const { root, steps, chats, tools } = sessionTrace(collector, TRACE_ID, 'implementor');
    expect(root.parentSpanId).toBe(PARENT_ID);
    expect(root.attrs).toMatchObject({ 'cra.role': 'implementor', 'cra.branch': 'otel-pod', 'cra.outcome': 'success' });
    expect(steps.map((s) => s.name)).toEqual(['provision', 'assemble', 'spawn', 'supervise', 'extract', 'clean']);
    for (let i = 1; i < steps.length; i++) expect(steps[i].start >= steps[i - 1].end).toBe(true);
    expect(chats).toHaveLength(h.api.requests.filter((r) => r.path === '/v1/messages').length);
    for (const c of chats) expect(c.attrs['gen_ai.usage.output_tokens']).toBeGreaterThan(0);
    const bashCalls = tools.filter((t) => t.attrs['gen_ai.tool.name'] === 'Bash');
    expect(bashCalls).toHaveLength(1);
    expect(bashCalls[0].attrs['cra.tool.decision']).toBe('allowed');
    await eventually(() => adapterPods().length === 0, 60_000, 'no pod left');
  } finally {
    await h.cleanup();
  }
});
