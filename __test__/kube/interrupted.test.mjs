// Issue 48 in pods: an engine restart costs no agent's work. An engine process runs an
// Implementor in its pod (real CLI, real cluster, the fake Messages API scripting it) that commits
// one file, writes a second, and is in its third step when the engine is SIGKILLed. The pod stays
// (its `cra-pod mux` kills the CLI when the stream ends; the checkout and the conversation stay).
// A new engine dispatches the same work item on the same branch with a new session id: it takes
// the pod over and continues there, on the CLI's conversation — the API is never asked for step
// one again — and its patch holds both files. A conversation the agent broke, or a pod nobody
// dispatches again within resumeInterrupted, is saved as a patch instead.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { assistantTurns, bash, reply, scenario } from '../support/fake-api.mjs';
import { engineProcess, killAll } from '../support/engine-process.mjs';
import { BODY, expectContinued, steps } from '../support/interrupted.mjs';
import { implementorDone } from '../support/roles.mjs';
import { engineState, logEntry, rejection, setup, sleepMarker } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { adapterPods, eventually, kubeBackend, kubectl, podLine } from './support.mjs';

const state = engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] });
const LOOPS = Number(process.env.CRA_TEST_INTERRUPTED_LOOPS ?? 1);

// Session ids of this run alone (another suite, or a run of this one, may share the namespace);
// each test's pods are deleted after it whatever became of them: a pod kept for a continuation
// would otherwise wait out resumeInterrupted.
let run = 0;
let t;
afterEach(async () => {
  killAll(t.engines);
  for (const id of Object.values(t.ids)) for (const p of adapterPods(id)) kubectl('delete', 'pod', p.metadata.name, '--grace-period=0', '--force', '--ignore-not-found');
  await t.h?.cleanup();
});

const kubeSetup = async (config = {}) => {
  run += 1;
  const ids = { first: `first-${process.pid}-${run}`, second: `second-${process.pid}-${run}` };
  const h = await setup({ repo: { agents: agentsWithTools(['Bash']) }, state, bodies: { 7: BODY }, config: { backend: kubeBackend(), ...config } });
  t = { h, ids, engines: [] };
  return t;
};
const params = (sessionID) => ({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID });

/** The pod of session `id` once its agent is in step three (its third request answered). */
async function inStepThree({ h }, id, log, marker) {
  const [pod] = await eventually(() => adapterPods(id).length === 1 && adapterPods(id), 120_000, 'the session has its pod');
  await eventually(() => h.api.mainRequests().length >= 3 && readFileSync(log(), 'utf8').includes(`sleep ${marker}`), 120_000, 'the agent is in step three');
  // The command starts in the pod a moment after its request was answered.
  await new Promise((r) => setTimeout(r, 2000));
  return pod;
}

/** An engine process runs the first session and is SIGKILLed in step three. */
async function interrupted() {
  const { h, ids, engines } = t;
  const marker = sleepMarker(300);
  h.api.setScript(steps(marker));
  const { engine, log } = await engineProcess(h, params(ids.first), engines);
  const pod = await inStepThree(t, ids.first, () => log, marker);
  const asked = h.api.mainRequests().length;
  engine.kill('SIGKILL');
  await new Promise((r) => (engine.exitCode !== null || engine.signalCode ? r() : engine.on('exit', r)));
  // The agent records what continuing it needs once its CLI started.
  const { annotations } = adapterPods(ids.first)[0].metadata;
  expect(JSON.parse(annotations['claude-runtime-adapter/agent']).branch).toBe('wi-7');
  // With nodeCache the checkout is a layer on the node's base, which a continuation holds again.
  const work = JSON.parse(annotations['claude-runtime-adapter/work']);
  if (process.env.CRA_KUBE_NODE_CACHE) expect(work.nodeBase).toMatch(/^[0-9a-f]{32}$/);
  else expect(work.nodeBase).toBeUndefined();
  return { log, asked, pod: pod.metadata.name };
}

const salvagedOf = (id) => {
  const dir = join(t.h.repo.root, '.git', 'claude-runtime-adapter', 'salvaged');
  try {
    return readdirSync(dir).filter((n) => n.startsWith(`${id}-`)).map((n) => readFileSync(join(dir, n), 'utf8'));
  } catch {
    return [];
  }
};

/** The dispatch again, continuing in pod `pod`: it ran there, and the pod is gone after. */
async function continuesIn(adapter, pod, asked) {
  const { h, ids } = t;
  const handle = await adapter.startAgent(params(ids.second));
  const logFile = await expectContinued(h, handle, ids.first, asked);
  expect(podLine(readFileSync(logFile, 'utf8'))).toContain(`Kubernetes pod ${pod} `);
  expect(adapterPods().filter((p) => p.metadata.name === pod)).toEqual([]);
  expect(salvagedOf(ids.first)).toEqual([]);
}

describe('an Implementor interrupted by its engine is continued in its pod by the next dispatch (resumeInterrupted)', () => {
  for (let loop = 0; loop < LOOPS; loop++) {
    it(`engine SIGKILLed in step three (after a commit and an uncommitted write): the re-dispatched session takes over the pod, continues on the same conversation, never asks for step one again, and its patch holds both files${LOOPS > 1 ? ` (run ${loop + 1})` : ''}`, { timeout: 300_000 }, async () => {
      await kubeSetup();
      const { asked, pod } = await interrupted();
      const adapter = t.h.adapter();
      await continuesIn(adapter, pod, asked);
      await adapter.shutdown();
    });
  }

  it("shutdown() (a deploy's SIGTERM) during step three: the session settles ERR_CANCELLED with its work saved, its pod is let go, and the next adapter's dispatch continues in it", { timeout: 300_000 }, async () => {
    const { h, ids } = await kubeSetup();
    const marker = sleepMarker(300);
    h.api.setScript(steps(marker));
    const first = h.adapter();
    const handle = await first.startAgent(params(ids.first));
    const pod = await inStepThree(t, ids.first, () => handle.logFilePath, marker);
    const asked = h.api.mainRequests().length;
    await first.shutdown({ graceMs: 0 });
    expect((await rejection(handle.result)).code).toBe('ERR_CANCELLED');
    expect(readFileSync(handle.logFilePath.replace(/\.log$/, '.patch'), 'utf8')).toContain('+++ b/two.txt');
    const [left] = adapterPods(ids.first);
    expect(left.metadata.annotations['claude-runtime-adapter/left']).toContain(` pid=${process.pid} `);
    const next = h.adapter();
    await continuesIn(next, pod.metadata.name, asked);
    await next.shutdown();
  });

  // What the agent could do to its conversation (the jail binds it at ~/.claude): fill it with
  // junk, or replace it by a link to a file of the pod it should not get into the model's
  // context (here the pod's hostname file, naming the pod).
  const BROKEN = {
    'filled with junk': { script: 'printf \'{"type":"user"}\\nthis is not json\\n\' > "$f"', why: /line 2 of the conversation is not JSON/ },
    'replaced by a link to the pod\'s hostname file': { script: 'rm "$f" && ln -s /etc/hostname "$f"', why: /conversation \S+\.jsonl is missing or not a plain file/ },
  };
  for (const [how, { script, why }] of Object.entries(BROKEN)) {
    it(`a conversation ${how} in the pod: not continued (a warning says why), the work saved as a patch, the pod deleted, a fresh start`, { timeout: 300_000 }, async () => {
      const { h, ids } = await kubeSetup();
      const { asked, pod } = await interrupted();
      kubectl('exec', pod, '-c', 'session', '--', 'sh', '-c', `for f in /var/lib/cra/claude-config/projects/*/*.jsonl /home/agent/.claude/projects/*/*.jsonl; do [ -f "$f" ] && ${script}; done; true`);
      h.api.setScript(scenario.steps([bash('echo fresh > fresh.txt && echo made'), reply(implementorDone())]));
      const adapter = h.adapter();
      const handle = await adapter.startAgent(params(ids.second));
      const result = await handle.result;
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('+++ b/fresh.txt');
      expect(result.patch).not.toContain('two.txt');
      expect((await handle.stats).continuedFrom).toBeNull();
      expect(assistantTurns(h.api.mainRequests()[asked].body)).toBe(0);
      expect(JSON.stringify(h.api.mainRequests().slice(asked).map((r) => r.body))).not.toContain(pod);
      const warned = h.logger.entries.find((e) => e.level === 'warn' && /cannot be continued in its pod/.test(e.message) && why.test(e.message));
      expect(warned).toBeTruthy();
      const [saved, ...more] = salvagedOf(ids.first);
      expect(more).toEqual([]);
      expect(saved).toContain('+++ b/one.txt');
      expect(saved).toContain('+++ b/two.txt');
      expect(adapterPods().filter((p) => p.metadata.name === pod)).toEqual([]);
      await adapter.shutdown();
    });
  }

  it("two engines alive: the second one's dispatch on the branch never takes the first one's live pod", { timeout: 300_000 }, async () => {
    const { h, ids, engines } = await kubeSetup();
    const marker = sleepMarker(300);
    h.api.setScript(steps(marker));
    const { log } = await engineProcess(h, params(ids.first), engines);
    const pod = await inStepThree(t, ids.first, () => log, marker);
    const adapter = h.adapter();
    h.api.setScript(scenario.steps([bash('echo fresh > fresh.txt && echo made'), reply(implementorDone())]));
    const handle = await adapter.startAgent(params(ids.second));
    const result = await handle.result;
    expect(result.patch).not.toContain('two.txt');
    expect((await handle.stats).continuedFrom).toBeNull();
    expect(podLine(readFileSync(handle.logFilePath, 'utf8'))).not.toContain(pod.metadata.name);
    // The first engine's pod is still its own, its session running.
    const [still] = adapterPods(ids.first);
    expect(still.metadata.name).toBe(pod.metadata.name);
    expect(still.metadata.annotations['claude-runtime-adapter/owner']).toBe(pod.metadata.annotations['claude-runtime-adapter/owner']);
    expect(kubectl('exec', pod.metadata.name, '-c', 'session', '--', 'sh', '-c', 'ps -o args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr "\\0" " "')).toContain(`sleep ${marker}`);
    await adapter.shutdown();
  });

  it('interrupted and never dispatched again: the next adapter keeps the pod until resumeInterrupted has passed, then saves its work and deletes it', { timeout: 300_000 }, async () => {
    const BOUND = 20;
    const { h, ids } = await kubeSetup({ resumeInterrupted: BOUND });
    const { pod } = await interrupted();
    const adapter = h.adapter();
    await logEntry(h.logger, /kept for the next session on its branch to continue/, 60_000);
    expect(adapterPods().filter((p) => p.metadata.name === pod)).toHaveLength(1);
    expect(salvagedOf(ids.first)).toEqual([]);
    await eventually(() => salvagedOf(ids.first).length === 1, (BOUND + 60) * 1000, 'the work was saved after the bound');
    const [saved] = salvagedOf(ids.first);
    expect(saved).toContain('+++ b/one.txt');
    expect(saved).toContain('+++ b/two.txt');
    await eventually(() => adapterPods().every((p) => p.metadata.name !== pod), 60_000, 'the pod was deleted');
    await adapter.shutdown();
  });
});
