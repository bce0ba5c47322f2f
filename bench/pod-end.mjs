// Benchmark (issue 37): an Implementor on a tree of 100,000 files, local against a pod, where
// both make the checkout once (the local base; the node's base with `nodeCache`) and a later
// session layers on it: start → handle, and its end (the model's last answer → result settled)
// with one file changed. The pod is a warm one (`warmPods: 1`) on one node (the base is the
// node's), in the session image.
//
//   node bench/pod-end.mjs [--n=5] [--files=100000] [--tmp=<dir>] [--node-cache=<dir>]
//
// Needs KUBECONFIG (a cluster up) and the session image from CRA_KUBE_IMAGE (else
// target/session-image/ref); CRA_KUBE_NAMESPACE (default `default`). --node-cache: a directory
// on the nodes writable by uid 1000 (default /var/tmp/cra-bench-pod-end-cache, made here: the
// local cluster's nodes share this machine's disk). Each mode: one warm-up (it makes the
// base), then n sessions; the agent appends a line to one file with Bash, then answers. Every
// patch is checked to hold that line and nothing else. Raw data goes to bench/results/.
import { execFileSync, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { assistantTurns, bash, reply, structured, startFakeApi } from '../__test__/support/fake-api.mjs';
import { offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { addon, recordingLogger } from '../__test__/support/harness.mjs';
import { agentFile } from '../__test__/support/repo.mjs';
import { benchDeps, cleanupOnce, fmtMs, machine, printTable, ratio, rmrf, saveResults, summary, tracked, arg, numberArg } from './support/common.mjs';

const N = numberArg('n', 5);
const FILES = numberArg('files', 100_000);
const WORK = arg('tmp', '/tmp');
const NODE_CACHE = arg('node-cache', '/var/tmp/cra-bench-pod-end-cache');
const IMAGE = process.env.CRA_KUBE_IMAGE ?? (existsSync('target/session-image/ref') ? readFileSync('target/session-image/ref', 'utf8').trim() : null);
const NAMESPACE = process.env.CRA_KUBE_NAMESPACE ?? 'default';
if (!process.env.KUBECONFIG || !IMAGE) throw new Error('needs KUBECONFIG and CRA_KUBE_IMAGE (or target/session-image/ref)');
const END_TARGET_MS = 1000;
const START_TARGET_MS = 1000;
const CHANGED = 'src/m1/s0/f0.rs';

const git = (cwd, ...a) => execFileSync('git', a, { cwd, stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 28 }).toString();
const say = (m) => process.stderr.write(`  ${m}\n`);

/** A repository of `files` generated files and the agent files, one commit (`git fast-import`). */
async function syntheticRepo(root) {
  mkdirSync(root);
  git(root, 'init', '-q', '-b', 'main');
  git(root, 'config', 'user.name', 'Bench User');
  git(root, 'config', 'user.email', 'bench@example.invalid');
  const parts = [];
  const data = (s) => `data ${Buffer.byteLength(s)}\n${s}\n`;
  const file = (p, c) => `M 100644 inline ${p}\n${data(c)}`;
  parts.push(`commit refs/heads/main\nmark :1\ncommitter Bench User <bench@example.invalid> ${Math.floor(Date.now() / 1000) - 60} +0000\n${data('synthetic tree')}`);
  for (const n of ['planner', 'implementor', 'reviewer']) parts.push(file(`.claude/agents/${n}.md`, agentFile({ name: n, description: n, tools: ['Bash', 'Read', 'Write'], prompt: `You are the ${n}.` })));
  for (let i = 0; i < FILES; i++) parts.push(file(`src/m${i % 100}/s${Math.floor(i / 100) % 10}/f${Math.floor(i / 1000)}.rs`, `// generated file ${i}\npub fn f${i}() -> u64 {\n    ${i}\n}\n`));
  parts.push('done\n');
  await new Promise((resolve, reject) => {
    const child = spawn('git', ['-c', 'pack.compression=1', 'fast-import', '--quiet', '--done'], { cwd: root, stdio: ['pipe', 'ignore', 'inherit'] });
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`git fast-import exited ${code}`))));
    child.stdin.end(parts.join(''));
  });
  git(root, 'reset', '-q', '--hard', 'main');
}

const work = mkdtempSync(join(WORK, 'cra-pod-end-'));
const live = new Set();
const api = await startFakeApi({ keepBodies: false });
const cleanup = cleanupOnce(live, api, [work]);
const madeCache = !existsSync(NODE_CACHE);
mkdirSync(NODE_CACHE, { recursive: true });
chownSync(NODE_CACHE, 1000, 1000);
const env = offlineCliEnv({ apiUrl: api.url, configDir: join(work, 'claude-config') });
const root = join(work, 'repo');
const results = { bench: 'pod-end', machine: machine(), n: N, files: FILES, image: IMAGE, modes: {} };
try {
  const t = performance.now();
  await syntheticRepo(root);
  say(`${FILES} files in ${((performance.now() - t) / 1000).toFixed(1)} s`);
  const node = JSON.parse(execFileSync('kubectl', ['get', 'nodes', '-o', 'json']).toString()).items[0].metadata.name;
  const backends = {
    local: {},
    pod: { backend: { kubernetes: { namespace: NAMESPACE, image: IMAGE, imagePullPolicy: 'IfNotPresent', kubeconfig: process.env.KUBECONFIG, nodeCache: NODE_CACHE, nodeSelector: { 'kubernetes.io/hostname': node }, warmPods: 1, podStartTimeout: 300 } } },
  };
  let seq = 0;
  const session = async (a) => {
    let last = 0;
    api.setScript((body) => {
      if (assistantTurns(body) === 0) return reply(bash(`echo changed >> ${CHANGED}`));
      last = performance.now();
      return reply(structured({ role: 'implementor', outcome: 'completed', summary: 'done' }));
    });
    const t0 = performance.now();
    const handle = await a.adapter.startAgent({ role: 'implementor', workItemID: '1', branchName: `bench-${++seq}` });
    const handleMs = performance.now() - t0;
    const result = await handle.result;
    const endMs = performance.now() - last;
    const files = [...(result.patch ?? '').matchAll(/^diff --git a\/(\S+)/gm)].map((m) => m[1]);
    if (result.outcome !== 'completed' || files.join() !== CHANGED || !result.patch.includes('+changed')) throw new Error(`session ${seq}: unexpected result ${JSON.stringify(result).slice(0, 400)}`);
    return { handleMs, endMs };
  };
  for (const [mode, extra] of Object.entries(backends)) {
    const logger = recordingLogger();
    const a = tracked(addon.createClaudeAdapter({ repoRoot: root, defaultBranch: 'main', contextPaths: [], maxAgentDuration: 0, logging: { agentSessions: false, logsDir: '' }, bashValidatorHook: addon.createBashValidatorHook(), logger, env, worktreeSetupCommand: null, sandbox: {}, extractionTimeout: 600, ...extra }, benchDeps(['1'], (id) => `Work item ${id}.`)()), logger, live);
    try {
      const warm = await session(a);
      say(`${mode}: warm-up (makes the base): start → handle ${fmtMs(warm.handleMs)}, end ${fmtMs(warm.endMs)}`);
      const runs = [];
      for (let i = 0; i < N; i++) {
        runs.push(await session(a));
        say(`${mode}: ${i + 1}/${N}: start → handle ${fmtMs(runs.at(-1).handleMs)}, end ${fmtMs(runs.at(-1).endMs)}`);
      }
      results.modes[mode] = { warmup: warm, runs };
      // A session whose layer was mounted by each step (no mount held for the session) ends
      // a walk of the whole tree slower: say so, with why.
      const unheld = logger.entries.filter((e) => e.message.startsWith('the layer is mounted by each step'));
      if (unheld.length) say(`${mode}: ${unheld.length} session(s) without the session's one mount: ${unheld.map((e) => e.message).join('; ')}`);
      // Which end each pod session took: only what its layer changed, or the whole checkout.
      const ends = logger.entries.filter((e) => e.message.startsWith('the work read out of the pod: '));
      if (ends.length) {
        const fromLayer = ends.filter((e) => e.message.includes('staged from the layer')).length;
        say(`${mode}: ${fromLayer} of ${ends.length} end(s) read only what the layer changed${fromLayer === ends.length ? '' : `; the others: ${ends.filter((e) => !e.message.includes('staged from the layer')).map((e) => e.message).join('; ')}`}`);
        results.modes[mode].endsFromLayer = fromLayer;
      }
    } finally {
      await a.shutdown();
    }
  }
} finally {
  await cleanup();
  if (madeCache) rmrf(NODE_CACHE);
}

const m = results.modes;
const med = (mode, k) => summary(m[mode].runs.map((r) => r[k])).median;
const span = (mode, k) => m[mode].runs.map((r) => Math.round(r[k])).join(' ');
console.log(`\npod-end bench: n=${N}; ${FILES} files; ${results.machine.cpus} CPUs (${results.machine.cpuModel}); load ${results.machine.loadavg.join(' ')}; image ${IMAGE}; repository in ${WORK}`);
printTable(['measure', 'local', 'pod (warm, nodeCache)', 'pod − local', 'pod / local', 'target', 'verdict'], [
  ['later Implementor start → handle', fmtMs(med('local', 'handleMs')), fmtMs(med('pod', 'handleMs')), fmtMs(med('pod', 'handleMs') - med('local', 'handleMs')), ratio(med('pod', 'handleMs'), med('local', 'handleMs')), `pod ≤ local + ${START_TARGET_MS} ms`, med('pod', 'handleMs') - med('local', 'handleMs') <= START_TARGET_MS ? 'met' : 'NOT met'],
  ['Implementor end, one file changed', fmtMs(med('local', 'endMs')), fmtMs(med('pod', 'endMs')), fmtMs(med('pod', 'endMs') - med('local', 'endMs')), ratio(med('pod', 'endMs'), med('local', 'endMs')), `each ≤ ${END_TARGET_MS} ms`, `local ${med('local', 'endMs') <= END_TARGET_MS ? 'met' : 'NOT met'}, pod ${med('pod', 'endMs') <= END_TARGET_MS ? 'met' : 'NOT met'}`],
]);
console.log(`raw (ms, run order): local start ${span('local', 'handleMs')}; end ${span('local', 'endMs')}; pod start ${span('pod', 'handleMs')}; end ${span('pod', 'endMs')}`);
console.log(`raw results: ${saveResults('pod-end', results)}`);
process.exit(0);
