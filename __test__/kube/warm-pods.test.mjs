// Issue 37: pods started before any session asks for one (backend.kubernetes.warmPods). A session
// takes a Running warm pod (the pod's creation, scheduling and start off its path), which is
// made that session's (labels, id, deadline) and replaced; a warm pod that is gone is no
// failure; shutdown() deletes the pool, and a dead engine's pool goes with the next sweep.
// Real cluster, real CLI, the fake API on the engine.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { killAll } from '../support/engine-process.mjs';
import { bash, scenario } from '../support/fake-api.mjs';
import { RACY_CASES, RACY_CHANGE, RACY_REPO, RACY_RUNS } from '../support/racy-edits.mjs';
import { addon, rejection, setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
import { adapterPods, EDGE_FILES, EDGE_WORK, eventually, kubeBackend, kubectl, podLine } from './support.mjs';

const AGENTS = agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']);
const WARM = 'claude-runtime-adapter/warm';

let h;
const adapters = [];
const engines = [];
afterEach(async () => {
  killAll(engines);
  for (const a of adapters.splice(0)) await a.shutdown();
  await h?.cleanup();
  h = undefined;
});

async function warmSetup({ local = false, config = {}, backend = {}, repo = {} } = {}) {
  h = await setup({
    repo: { agents: AGENTS, ...repo },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { ...(local ? {} : { backend: kubeBackend({ warmPods: 1, ...backend }) }), ...config },
  });
  return h;
}

function adapter() {
  const a = h.adapter();
  adapters.push(a);
  return a;
}

/** The running warm pods (owned by `pid`, default this process). */
const warmPods = (pid = process.pid) =>
  adapterPods().filter((p) => p.metadata.labels?.[WARM] === 'true' && p.metadata.annotations['claude-runtime-adapter/owner'].includes(` pid=${pid} `));
const running = (pods) => pods.filter((p) => p.status?.phase === 'Running' && !p.metadata.deletionTimestamp);
/** Resolves with the running warm pods of `pid` once there are `n` (kubectl read once a poll)
 * and, for this process's, once its pool has them ready too: it learns that a pod runs from
 * the same status, read every 200 ms, and a session started in between would find one fewer
 * (19 of 20 in a CI run; a session that started its own pod in another). */
const warmRunning = (n, what, pid = process.pid) =>
  eventually(() => {
    const pods = running(warmPods(pid));
    const ready = (p) => h.logger.entries.some((e) => e.message === 'a warm pod is ready' && e.data?.pod === p.metadata.name);
    return pods.length === n && (pid !== process.pid || pods.every(ready)) && pods;
  }, 120_000, what);

describe('warm pods (backend.kubernetes.warmPods)', () => {
  it("a session takes the pod started before it asked: the pod becomes the session's (labels, id, a deadline from its start), and a new warm pod replaces it", { timeout: 180_000 }, async () => {
    await warmSetup({ config: { maxAgentDuration: 600 } });
    const a = adapter();
    const [warm] = await warmRunning(1, 'a warm pod runs');
    expect(warm.metadata.name).toMatch(/^cra-warm-[0-9a-f]{12}$/);
    // Nobody's yet: no session label, role or id; its deadline is a session's life (the
    // agent's 600 s and the steps around it) and an hour.
    expect(warm.metadata.labels['claude-runtime-adapter/session']).toBeUndefined();
    expect(warm.metadata.labels['claude-runtime-adapter/role']).toBeUndefined();
    expect(warm.metadata.annotations['claude-runtime-adapter/session-id']).toBeUndefined();
    const life = warm.spec.activeDeadlineSeconds - 3600;
    expect(life).toBeGreaterThan(600);
    h.api.setScript(scenario.steps([bash('echo started; sleep 120'), ROLES.implementor.done]));
    const asked = Date.now();
    const handle = await a.startAgent(ROLES.implementor.params());
    const [pod] = adapterPods(handle.sessionID);
    expect(pod.metadata.name).toBe(warm.metadata.name);
    expect(pod.metadata.labels[WARM]).toBeUndefined();
    expect(pod.metadata.labels['claude-runtime-adapter/role']).toBe('implementor');
    expect(pod.metadata.labels['claude-runtime-adapter/session']).toBeTruthy();
    // Counted from the pod's start: a whole session's life from when the session asked (the
    // API server's clock is this machine's; its startTime is cut to the second, as for any
    // pod), and less than the warm pod's.
    const ends = Date.parse(pod.status.startTime) + pod.spec.activeDeadlineSeconds * 1000;
    expect(ends).toBeGreaterThanOrEqual(asked + (life - 1) * 1000);
    expect(pod.spec.activeDeadlineSeconds).toBeLessThan(life + 3600);
    expect(h.logger.entries.map((e) => e.message)).toContain('the session took a warm pod');
    // The pool is refilled with a fresh pod (never one a session ran in).
    const [next] = await warmRunning(1, 'a new warm pod runs');
    expect(next.metadata.name).not.toBe(warm.metadata.name);
    a.cancelAgent(handle.sessionID);
    await rejection(handle.result);
    expect(adapterPods(handle.sessionID)).toEqual([]);
    await a.shutdown();
    expect(adapterPods()).toEqual([]);
  });

  it("an Implementor in a warm pod leaves the local backend's patch, byte for byte", { timeout: 300_000 }, async () => {
    await warmSetup({ local: true, repo: { files: EDGE_FILES } });
    const local = await agentRuns(h, 'implementor', EDGE_WORK);
    await h.cleanup();
    await warmSetup({ repo: { files: EDGE_FILES } });
    const a = adapter();
    const [warm] = await warmRunning(1, 'a warm pod runs');
    const run = await agentRuns(h, 'implementor', EDGE_WORK, { adapter: a });
    expect(run.out[0]).toBe(local.out[0]);
    expect(run.result.patch).toBe(local.result.patch);
    expect(podLine(readFileSync(run.handle.logFilePath, 'utf8'))).toContain(warm.metadata.name);
  });

  it(`a same-size edit in the second of the checkout: ${RACY_RUNS} of ${RACY_RUNS} Implementors in warm pods return the local backend's patch, byte for byte`, { timeout: 120_000 + RACY_RUNS * 15_000 }, async () => {
    // A warm pod's checkout is made within a second or so of startAgent: the agent's edit lands
    // in the snapshot's second more often than in a pod started for the session.
    const calls = Object.values(RACY_CASES)[0];
    await warmSetup({ local: true, repo: RACY_REPO });
    const local = await agentRuns(h, 'implementor', calls(`${h.repo.root}/.worktrees/racy-local`), { branchName: 'racy-local' });
    expect(local.result.patch).toContain(RACY_CHANGE);
    await h.cleanup();
    const AT_ONCE = 4;
    await warmSetup({ repo: RACY_REPO, backend: { warmPods: AT_ONCE } });
    h.api.setScript(scenario.steps([...calls('/workspace/repo'), ROLES.implementor.done]));
    const a = adapter();
    const differ = [];
    const run = async (n) => {
      try {
        const result = await (await a.startAgent(ROLES.implementor.params(`racy-${n}`))).result;
        if (result.patch !== local.result.patch) differ.push(`run ${n}: ${result.patch}`);
      } catch (e) {
        differ.push(`run ${n}: ${e.code} ${e.message}`);
      }
    };
    for (let first = 0; first < RACY_RUNS; first += AT_ONCE) {
      await warmRunning(AT_ONCE, `${AT_ONCE} warm pods run`);
      await Promise.all(Array.from({ length: Math.min(AT_ONCE, RACY_RUNS - first) }, (_, i) => run(first + i)));
    }
    expect(differ).toEqual([]);
    expect(h.logger.entries.filter((e) => e.message === 'the session took a warm pod')).toHaveLength(RACY_RUNS);
  });

  it('a warm pod deleted from outside: the session starts its own pod and succeeds', { timeout: 180_000 }, async () => {
    await warmSetup();
    const a = adapter();
    const [warm] = await warmRunning(1, 'a warm pod runs');
    kubectl('delete', 'pod', warm.metadata.name, '--grace-period=0', '--wait=true');
    const run = await agentRuns(h, 'implementor', ['echo hi > hi.txt'], { adapter: a });
    expect(run.result.outcome).toBe('completed');
    expect(run.result.patch).toContain('hi.txt');
    expect(podLine(readFileSync(run.handle.logFilePath, 'utf8'))).not.toContain(warm.metadata.name);
    expect(h.logger.entries.map((e) => e.message)).toContain('a warm pod could not be claimed; the session starts its own');
  });

  it('shutdown() deletes the warm pods, those still starting too', { timeout: 120_000 }, async () => {
    await warmSetup({ backend: { warmPods: 3 } });
    const a = h.adapter();
    await eventually(() => warmPods().length > 0, 60_000, 'warm pods were created');
    await a.shutdown();
    expect(warmPods()).toEqual([]);
  });

  it("a dead engine's warm pods are deleted by the next adapter's sweep; a live engine's are not", { timeout: 180_000 }, async () => {
    await warmSetup({ backend: { warmPods: 2 } });
    const engine = spawn(process.execPath, ['-e', `
      const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
      const noop = () => {};
      const config = { ...${JSON.stringify({ ...h.config, bashValidatorHook: undefined, logger: undefined })},
        bashValidatorHook: async () => ({ decision: 'approve' }), logger: { debug: noop, info: noop, error: noop, warn: noop } };
      createClaudeAdapter(config, { workItemReader: { getWorkItemBody: async () => 'x' }, revisionReader: { getRevisionFiles: async () => [] },
        getState: () => ({ workItems: {}, revisions: {}, lastPlannedSHAs: {} }), getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
      setInterval(noop, 1000);
    `], { stdio: 'ignore' });
    engines.push(engine);
    await warmRunning(2, "the engine's two warm pods run", engine.pid);
    // A live engine's pool is its own: another adapter's sweep leaves it.
    const mine = adapter();
    await warmRunning(2, "this process's two warm pods run");
    expect(running(warmPods(engine.pid))).toHaveLength(2);
    engine.kill('SIGKILL');
    await new Promise((r) => engine.once('exit', r));
    const sweeper = addon.createClaudeAdapter({ ...h.config, backend: kubeBackend({ warmPods: 0 }) }, h.deps);
    adapters.push(sweeper);
    await eventually(() => warmPods(engine.pid).length === 0, 60_000, "the dead engine's warm pods were deleted");
    expect(running(warmPods())).toHaveLength(2);
    await mine.shutdown();
  });
});
