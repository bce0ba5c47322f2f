// What goes wrong with a cluster settles the session with a clear code and cause, within a
// bound, leaving no pod (issue 21): an unreachable API server, a missing namespace, a missing
// image, an unschedulable pod, a pod deleted, OOM-killed or evicted for disk under the agent.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario } from '../support/fake-api.mjs';
import { rejection, setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
import { adapterPods, eventually, kubeBackend, kubectl } from './support.mjs';

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

async function kubeSetup(backend = {}, config = {}) {
  h = await setup({
    repo: { agents: agentsWithTools(['Bash']) },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { backend: kubeBackend(backend), ...config },
  });
  return h;
}

/** The error the Implementor's session settles with, and how long that took. */
async function failed(params = ROLES.implementor.params()) {
  const t0 = Date.now();
  const err = await rejection(h.adapter().startAgent(params).then((x) => x.result));
  return { err, ms: Date.now() - t0 };
}

describe('a cluster that cannot run the session', () => {
  it('an unreachable API server: ERR_PROVISION naming it, within seconds', { timeout: 60_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cra-kubeconfig-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    const kc = join(dir, 'config');
    writeFileSync(kc, readFileSync(process.env.KUBECONFIG, 'utf8').replace(/server: *"?https:\/\/[^"\s]+"?/, 'server: "https://127.0.0.1:1"'));
    await kubeSetup({ kubeconfig: kc });
    const { err, ms } = await failed();
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toMatch(/127\.0\.0\.1:1/);
    expect(err.message).toMatch(/unreachable/);
    expect(ms).toBeLessThan(30_000);
  });

  it('a missing namespace: ERR_PROVISION naming it', { timeout: 60_000 }, async () => {
    await kubeSetup({ namespace: 'cra-no-such-namespace' });
    const { err } = await failed();
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toMatch(/namespace cra-no-such-namespace \(backend\.kubernetes\.namespace\) does not exist/);
  });

  it('a missing image (ErrImageNeverPull): ERR_PROVISION naming the image, and no pod is left', { timeout: 90_000 }, async () => {
    await kubeSetup({ image: 'local/cra-no-such-image:0', imagePullPolicy: 'Never' });
    const { err } = await failed();
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain('local/cra-no-such-image:0');
    expect(err.message).toContain('ErrImageNeverPull');
    expect(adapterPods()).toEqual([]);
  });

  it('an unschedulable pod: ERR_PROVISION with the scheduler\'s reason once podStartTimeout passes, and no pod is left', { timeout: 90_000 }, async () => {
    await kubeSetup({ nodeSelector: { 'claude-runtime-adapter.test/nowhere': 'true' }, podStartTimeout: 8 });
    const { err, ms } = await failed();
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toMatch(/Unschedulable|node\(s\) didn't match/);
    expect(ms).toBeLessThan(40_000);
    expect(adapterPods()).toEqual([]);
  });
});

describe('a pod that goes under the agent', () => {
  it('deleted mid-session: ERR_AGENT_FAILED saying the pod was deleted; the session settles and nothing is left', { timeout: 120_000 }, async () => {
    await kubeSetup();
    h.api.setScript(scenario.steps([bash('echo started; sleep 120'), ROLES.implementor.done]));
    const handle = await h.adapter().startAgent(ROLES.implementor.params());
    await eventually(() => readFileSync(handle.logFilePath, 'utf8').includes('sleep 120'), 60_000, 'the agent ran its command');
    const [pod] = adapterPods(handle.sessionID);
    kubectl('delete', 'pod', pod.metadata.name, '--wait=false');
    const t0 = Date.now();
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toMatch(/pod \S+ (was deleted|is gone|was terminated)/);
    expect(Date.now() - t0).toBeLessThan(60_000);
    expect(adapterPods(handle.sessionID)).toEqual([]);
    // Not an API failure (issue 34): the CLI's conversation is not resumed.
    expect((await handle.stats).api.resumes).toBe(0);
  });

  it('OOM-killed: ERR_RESOURCE_LIMIT naming the pod\'s memory limit', { timeout: 120_000 }, async () => {
    await kubeSetup({ resources: { limits: { memory: '600Mi' } } });
    // Holds ever more memory: `tail -c N` keeps the last N bytes of its input.
    h.api.setScript(scenario.steps([bash('echo work > work.txt; head -c 2000M /dev/zero | tail -c 2000M > /dev/null; echo survived'), ROLES.implementor.done]));
    const { err } = await failed();
    expect(err.code).toBe('ERR_RESOURCE_LIMIT');
    expect(err.message).toMatch(/OOMKilled|memory/);
    expect(err.message).toContain('600Mi');
    expect(adapterPods()).toEqual([]);
  });

  it('evicted past its ephemeral-storage limit: ERR_RESOURCE_LIMIT naming that limit within seconds of the eviction, and no pod is left', { timeout: 330_000 }, async () => {
    // The checkout is the pod's disk (an emptyDir), so what the agent writes there counts, as
    // does the runtime's copy (~400 MB) in a user's image without nodeCache. When the kubelet
    // sees it is its own: it measures a pod's emptyDirs first 0-60 s after the pod appears, then
    // every 60-120 s (volumeStatsAggPeriod, jittered), and evicts on its next check (~10 s). So
    // the agent holds the file for longer than that worst case, and the adapter's own part,
    // from the kubelet's eviction to the session's settling, is what is timed.
    await kubeSetup({ resources: { limits: { 'ephemeral-storage': '1Gi' } } });
    // Two commands, each under the CLI's Bash timeout (2 min).
    h.api.setScript(scenario.steps([bash('head -c 1500M /dev/zero > big.bin; sleep 110'), bash('sleep 110; echo survived'), ROLES.implementor.done]));
    const { err } = await failed();
    const settled = Date.now();
    expect(err.code).toBe('ERR_RESOURCE_LIMIT');
    expect(err.message).toMatch(/was evicted for disk/);
    expect(err.message).toContain('1Gi (backend.kubernetes.resources.limits.ephemeral-storage)');
    expect(err.message).toMatch(/the kubelet: .*ephemeral (local )?storage/i);
    const pod = err.message.match(/pod (\S+) was evicted/)[1];
    // The kubelet posts its event apart from the pod's status (CI once read none right after
    // the session settled): waited for, bounded; its time is what is compared below.
    const evictions = () => JSON.parse(kubectl('get', 'events', '--field-selector', `involvedObject.name=${pod},reason=Evicted`, '-o', 'json')).items;
    const events = await eventually(() => evictions().length > 0 && evictions(), 20_000, `an Evicted event of pod ${pod}`);
    // Event times have whole seconds.
    const evicted = Math.min(...events.map((e) => Date.parse(e.firstTimestamp ?? e.eventTime)));
    expect(settled - evicted).toBeLessThan(30_000);
    expect(adapterPods()).toEqual([]);
  });
});
