// An engine identity that outlives its host (backend.kubernetes.engineId), on a real cluster:
// engine processes really killed, one in a UTS namespace of its own (another hostname, so its
// liveness cannot be checked from here). Mostly waiting on Leases: kube-ci runs it beside the
// suites that need the cluster's CPU.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { bash, scenario } from '../support/fake-api.mjs';
import { BODY, expectContinued, steps } from '../support/interrupted.mjs';
import { engineProcess, killAll } from '../support/engine-process.mjs';
import { logEntry, setup, sleepMarker } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { implementorParams, ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
import { adapterPods, eventually, kubeBackend, kubectl, podLine } from './support.mjs';

/** A harness whose adapters run sessions on the cluster with `backend`'s fields. */
// resumeInterrupted: 0: the predecessor's pod is saved and deleted at once, not kept for a
// continuation (__test__/kube/interrupted.test.mjs).
const kubeSetup = (backend, config = { resumeInterrupted: 0 }, bodies = ROLE_BODIES) =>
  setup({ repo: { agents: agentsWithTools(['Bash']) }, state: ROLE_STATE, bodies, config: { backend: kubeBackend(backend), ...config } });

/** The engines killed, the identity's Lease and pods deleted, the harness cleaned up. */
async function ended(h, engines, engineId) {
  killAll(engines);
  try {
    kubectl('delete', 'lease', `cra-engine-${engineId}`, '--ignore-not-found');
    kubectl('delete', 'pods', '-l', `claude-runtime-adapter/engine=${engineId}`, '--grace-period=0', '--force', '--ignore-not-found');
  } catch {}
  await h.cleanup();
}

describe('an engine identity that outlives its host (backend.kubernetes.engineId)', () => {
  it("a second engine of the identity leaves the first's live pod alone; once the first is killed it takes the identity and the pod, saving the work first", { timeout: 240_000 }, async () => {
    const engineId = `e-${process.pid}-${Date.now() % 1_000_000}`;
    const lease = `cra-engine-${engineId}`;
    const LEASE = 5;
    const h = await kubeSetup({ engineId, engineLease: LEASE });
    const engines = [];
    try {
      const work = 'echo moved > moved.txt && git add -A && git commit -qm moved && echo loose > loose.txt';
      h.api.setScript(scenario.steps([bash(work), bash('echo started; sleep 120'), ROLES.implementor.done]));
      // The first process, on a host this one cannot see into (its own UTS namespace).
      const elsewhere = `elsewhere-${process.pid}`;
      const { engine, log } = await engineProcess(h, implementorParams, engines, { hostname: elsewhere });
      const [pod] = await eventually(() => {
        const pods = adapterPods().filter((p) => p.metadata.labels['claude-runtime-adapter/engine'] === engineId);
        return pods.length === 1 && pods;
      }, 90_000, 'the first engine made its pod');
      expect(pod.metadata.annotations['claude-runtime-adapter/owner']).toContain(`host=${elsewhere}`);
      await eventually(() => readFileSync(log, 'utf8').includes('sleep 120'), 90_000, 'the agent did its work');
      const holder = () => JSON.parse(kubectl('get', 'lease', lease, '-o', 'json')).spec.holderIdentity;
      expect(holder()).toContain(`host=${elsewhere}`);
      const sessionID = pod.metadata.annotations['claude-runtime-adapter/session-id'];
      // A second engine of the identity while the first lives (a deploy's new process): it
      // cannot see the first's host, so it waits, and the first's renewals keep it waiting.
      const adapter = h.adapter();
      await logEntry(h.logger, /another engine process holds this engineId/, 30_000);
      await new Promise((r) => setTimeout(r, 3 * LEASE * 1000));
      expect(adapterPods(sessionID)).toHaveLength(1);
      expect(holder()).toContain(`host=${elsewhere}`);
      // The first dies: its Lease lapses, and the second takes the identity and its pod.
      engine.kill('SIGKILL');
      const t0 = Date.now();
      await new Promise((r) => engine.once('exit', r));
      await eventually(() => adapterPods(sessionID).length === 0, 90_000, "the predecessor's pod was taken over");
      const waited = Date.now() - t0;
      expect(waited).toBeGreaterThanOrEqual(LEASE * 1000);
      expect(holder()).toContain(` pid=${process.pid} `);
      const salvaged = join(h.repo.root, '.git', 'claude-runtime-adapter', 'salvaged');
      const [saved, ...more] = readdirSync(salvaged).filter((n) => n.startsWith(`${sessionID}-`));
      expect(more).toEqual([]);
      const patch = readFileSync(join(salvaged, saved), 'utf8');
      expect(patch).toContain('+++ b/moved.txt');
      expect(patch).toContain('+++ b/loose.txt');
      console.log(`[measure] engineLease ${LEASE} s: the predecessor's pod taken over ${waited} ms after it was killed`);
      // A graceful end gives the identity up: a successor need not wait the Lease out.
      await adapter.shutdown();
      expect(holder()).toBeUndefined();
    } finally {
      await ended(h, engines, engineId);
    }
  });

  it("an engine killed mid-session on another host: the next engine's dispatch on that branch waits for the identity and continues the session in its pod", { timeout: 240_000 }, async () => {
    const engineId = `c-${process.pid}-${Date.now() % 1_000_000}`;
    const LEASE = 5;
    const h = await kubeSetup({ engineId, engineLease: LEASE }, {}, { 7: BODY });
    const engines = [];
    const [first, second] = ['first', 'second'].map((n) => `${n}-${engineId}`);
    try {
      const marker = sleepMarker(300);
      h.api.setScript(steps(marker));
      const { engine, log } = await engineProcess(h, { ...implementorParams, sessionID: first }, engines, { hostname: `elsewhere-${process.pid}` });
      const [pod] = await eventually(() => adapterPods(first).length === 1 && adapterPods(first), 90_000, 'the first engine made its pod');
      await eventually(() => h.api.mainRequests().length >= 3 && readFileSync(log, 'utf8').includes(`sleep ${marker}`), 90_000, 'the agent is in step three');
      await new Promise((r) => setTimeout(r, 2000));
      const asked = h.api.mainRequests().length;
      engine.kill('SIGKILL');
      await new Promise((r) => engine.once('exit', r));
      // The engine comes back (here: this process, another host than the first's) and
      // dispatches the work item again at once, before its Lease is held.
      const t0 = Date.now();
      const adapter = h.adapter();
      const handle = await adapter.startAgent({ ...implementorParams, sessionID: second });
      const logFile = await expectContinued(h, handle, first, asked);
      expect(podLine(readFileSync(logFile, 'utf8'))).toContain(`Kubernetes pod ${pod.metadata.name} `);
      // It waited for the identity: its predecessor's Lease lapsed first.
      expect(Date.now() - t0).toBeGreaterThanOrEqual(LEASE * 1000);
      expect(h.logger.entries.some((e) => /waiting for the identity before continuing it/.test(e.message))).toBe(true);
      await adapter.shutdown();
    } finally {
      await ended(h, engines, engineId);
    }
  });
});
