// Benchmark: what an Implementor's start (start → handle: checkout made, sandbox or pod and CLI
// up) costs on the Kubernetes backend against the local one, on a real repository and on one
// with the same tree and a history ten times longer: a pod now receives one commit's tree
// (`git pack-objects` of `defaultBranch`'s commit, src/environment/kubernetes/mod.rs), no longer
// a bundle of the whole history, so the history's length should not show in its start.
//
//   node bench/pod-start.mjs [--n=3] [--cargo=<git dir>] [--only=cargo,cargo10x]
//                            [--modes=local,local-new,session,session-cache,session-warm,user,
//                                     user-cache,user-warm]
//                            [--scale=10]
//                            [--tmp=<dir>] [--node-cache=<dir>]
//
// Needs KUBECONFIG (a cluster up) for the pod modes; the images come from CRA_KUBE_IMAGE (else
// target/session-image/ref) and CRA_KUBE_MINIMAL_IMAGE (else the `minimal` line of
// target/test-images/refs); CRA_KUBE_NAMESPACE (default `default`), CRA_KUBE_PULL_POLICY
// (default `IfNotPresent`) as in the Kubernetes suite. The cargo history is taken from --cargo=,
// CRA_BENCH_CARGO or /work/.mirror/rust-lang+cargo/repo (a git dir, e.g. a bare mirror).
//
// Repositories:
//   cargo      a clone of rust-lang/cargo, `main` at its default branch's tip, plus one commit
//              adding the agent definitions (.claude/agents/*.md)
//   cargo10x   the same final tree (checked: HEAD^{tree} equal) after a linear history of
//              <scale> × cargo's commit count: a `git fast-import` chain, each commit changing
//              one small file, then one commit whose tree is cargo's tip tree. Made in a clone
//              of cargo with its refs deleted, so that tree's objects are packed as in cargo.
// Modes (one adapter each per repository; the fake Messages API answers at once, outcome
// `blocked`, so each session ends right after its start; its result is awaited before the next):
//   local      local backend, sandbox as default, the commit's shared base already made
//              (steady state: the warm-up made it)
//   local-new  local backend on a new commit (an empty commit on main just before): the start
//              makes the base (checks out the tree)
//   session    one pod per session in the session image (`image` = CRA_KUBE_IMAGE)
//   session-cache the same with `nodeCache` = --node-cache=: the checkout's base kept once per
//              node (its warm-up makes it), each pod's checkout an overlay on it
//   user       one pod per session in a user image (`image` = CRA_KUBE_MINIMAL_IMAGE, git and a
//              shell only; `runtimeImage` = CRA_KUBE_IMAGE copied in by an init container)
//   user-cache the same with `nodeCache` = --node-cache= (default /var/tmp/cra-bench-node-cache,
//              made here owned by uid 1000: the local cluster's nodes share this machine's disk;
//              on another cluster give a directory prepared on its nodes): the runtime kept once
//              per node, each pod linking to it, and the checkout's base as in session-cache;
//              its size on disk is printed
//   session-warm, user-warm  session-cache and user-cache with `warmPods: 1`: a session takes a pod
//              started before it asked (each waits, untimed, until the pool has one running again)
// n runs of each mode, interleaved (the order rotates each round), after one warm-up each.
// Figures: median and min–max of start → handle per repository × mode; on cargo, pod − local in
// seconds against the target (≤ 1.0 s, issue 37); per mode, cargo10x / cargo against ≤ 1.10; per
// repository, user / session image. Also what a pod receives, by size: the pack of one commit's
// tree (now) against `git bundle create - main` (before). Raw data goes to bench/results/.
import { execFileSync, spawn } from 'node:child_process';
import { chownSync, existsSync, readdirSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { reply, structured, startFakeApi } from '../__test__/support/fake-api.mjs';
import { claudePackageVersion, offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { addon, recordingLogger } from '../__test__/support/harness.mjs';
import { agentFile } from '../__test__/support/repo.mjs';
import { fmtMs, machine, MiB, printTable, ratio, ROOT, saveResults, summary, tracked, rmrf, benchDeps, cleanupOnce, arg, numberArg } from './support/common.mjs';

const MIRROR = '/work/.mirror/rust-lang+cargo/repo';
const N = numberArg('n', 3);
const CARGO = arg('cargo', process.env.CRA_BENCH_CARGO ?? (existsSync(MIRROR) ? MIRROR : ''));
const ONLY = arg('only', 'cargo,cargo10x').split(',');
const MODES = arg('modes', 'local,local-new,session,session-cache,user,user-cache').split(',');
const NODE_CACHE = arg('node-cache', '/var/tmp/cra-bench-node-cache');
const SCALE = numberArg('scale', 10);
const WORK = arg('tmp', tmpdir());
const POD_TARGET_MS = 1000;
const HISTORY_TARGET = 1.1;
const RESULT_TIMEOUT_MS = 300_000;
const KNOWN_MODES = ['local', 'local-new', 'session', 'session-cache', 'session-warm', 'user', 'user-cache', 'user-warm'];
for (const m of MODES) if (!KNOWN_MODES.includes(m)) throw new Error(`unknown mode ${m} (known: ${KNOWN_MODES.join(', ')})`);
for (const r of ONLY) if (!['cargo', 'cargo10x'].includes(r)) throw new Error(`unknown repository ${r} (known: cargo, cargo10x)`);
if (!CARGO) throw new Error('no cargo history: give --cargo=<git dir> (or CRA_BENCH_CARGO)');

// ---------------------------------------------------------------- the cluster

const readRef = (file, pick) => {
  try {
    return pick(readFileSync(join(ROOT, file), 'utf8'));
  } catch {
    return undefined;
  }
};
const SESSION_IMAGE = process.env.CRA_KUBE_IMAGE ?? readRef('target/session-image/ref', (s) => s.trim());
const USER_IMAGE = process.env.CRA_KUBE_MINIMAL_IMAGE ?? readRef('target/test-images/refs', (s) => /^minimal (\S+)/m.exec(s)?.[1]);
const NAMESPACE = process.env.CRA_KUBE_NAMESPACE ?? 'default';
const PULL = process.env.CRA_KUBE_PULL_POLICY ?? 'IfNotPresent';
const podModes = MODES.filter((m) => m.startsWith('session') || m.startsWith('user'));
if (podModes.length && !process.env.KUBECONFIG) throw new Error('the pod modes need KUBECONFIG (or give --modes=local,local-new)');
if (podModes.length && !SESSION_IMAGE) throw new Error('no session image: set CRA_KUBE_IMAGE (or build target/session-image/ref)');
if (MODES.some((m) => m.startsWith('user')) && !USER_IMAGE) throw new Error('no user image: set CRA_KUBE_MINIMAL_IMAGE (or build target/test-images/refs)');
const kubeBackend = (extra) => ({ kubernetes: { namespace: NAMESPACE, imagePullPolicy: PULL, kubeconfig: process.env.KUBECONFIG, ...extra } });
const BACKENDS = {
  local: {},
  'local-new': {},
  session: { backend: kubeBackend({ image: SESSION_IMAGE }) },
  'session-cache': { backend: kubeBackend({ image: SESSION_IMAGE, nodeCache: NODE_CACHE }) },
  user: { backend: kubeBackend({ image: USER_IMAGE, runtimeImage: SESSION_IMAGE }) },
  'user-cache': { backend: kubeBackend({ image: USER_IMAGE, runtimeImage: SESSION_IMAGE, nodeCache: NODE_CACHE }) },
  'session-warm': { backend: kubeBackend({ image: SESSION_IMAGE, nodeCache: NODE_CACHE, warmPods: 1 }) },
  'user-warm': { backend: kubeBackend({ image: USER_IMAGE, runtimeImage: SESSION_IMAGE, nodeCache: NODE_CACHE, warmPods: 1 }) },
};
const IMAGE_OF = { session: SESSION_IMAGE, 'session-cache': SESSION_IMAGE, 'session-warm': SESSION_IMAGE, user: USER_IMAGE, 'user-cache': USER_IMAGE, 'user-warm': USER_IMAGE };
const cacheModes = MODES.some((m) => m.endsWith('-cache') || m.endsWith('-warm'));
const madeNodeCache = cacheModes && !existsSync(NODE_CACHE);
if (cacheModes) {
  mkdirSync(NODE_CACHE, { recursive: true });
  chownSync(NODE_CACHE, 1000, 1000);
}
/** The adapter's pods left in the namespace (none once every session has settled). */
function adapterPods() {
  const out = execFileSync('kubectl', ['-n', NAMESPACE, 'get', 'pods', '-l', 'app.kubernetes.io/managed-by=claude-runtime-adapter', '-o', 'name'], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 });
  return out.toString().split('\n').filter(Boolean);
}

/** Resolves once this process has a running warm pod (`warmPods`), bounded. */
async function warmPodRunning() {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const out = execFileSync('kubectl', ['-n', NAMESPACE, 'get', 'pods', '-l', 'claude-runtime-adapter/warm=true', '-o', 'json'], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 });
    const mine = JSON.parse(out.toString()).items.filter((p) => p.metadata.annotations['claude-runtime-adapter/owner'].includes(` pid=${process.pid} `));
    if (mine.some((p) => p.status?.phase === 'Running' && !p.metadata.deletionTimestamp)) return;
    if (Date.now() > deadline) throw new Error('no warm pod running within 60 s');
    await new Promise((r) => setTimeout(r, 100));
  }
}

// ---------------------------------------------------------------- helpers

const AGENTS = {
  planner: { description: 'planner', tools: ['Bash', 'Read'], prompt: 'You are the planner.' },
  implementor: { description: 'implementor', tools: ['Bash', 'Read', 'Write'], prompt: 'You are the implementor.' },
  reviewer: { description: 'reviewer', tools: ['Read'], prompt: 'You are the reviewer.' },
};
// Answered at once, with nothing changed: `blocked` (a `completed` with no change is ERR_EMPTY_PATCH).
const DONE = structured({ role: 'implementor', outcome: 'blocked', summary: 'bench: nothing to do' });

const T0 = performance.now();
const say = (msg) => process.stderr.write(`  [${((performance.now() - T0) / 1000).toFixed(0).padStart(4)} s] ${msg}\n`);
const since = (t) => performance.now() - t;
const fmtS = (ms) => (ms == null ? null : `${(ms / 1000).toFixed(2)} s`);

function git(cwd, ...args) {
  return execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 256 * MiB }).toString();
}
function timed(fn) {
  const t = performance.now();
  const value = fn();
  return [since(t), value];
}
function identity(root) {
  git(root, 'config', 'user.name', 'Bench User');
  git(root, 'config', 'user.email', 'bench@example.invalid');
  git(root, 'config', 'commit.gpgsign', 'false');
}
/** Bytes a shell pipeline writes (counted by `wc -c`, nothing held here), and how long it took. */
function pipeBytes(cwd, script) {
  const [ms, out] = timed(() => execFileSync('bash', ['-o', 'pipefail', '-c', `${script} | wc -c`], { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString());
  return { bytes: Number(out.trim()), ms };
}

// ---------------------------------------------------------------- shared state, cleanup

mkdirSync(WORK, { recursive: true });
const scratch = mkdtempSync(join(tmpdir(), 'cra-pod-start-'));
const work = mkdtempSync(join(WORK, 'cra-pod-start-work-'));
// A node cache this run made goes with its other temporary directories.
const temps = [scratch, work, ...(madeNodeCache ? [NODE_CACHE] : [])];
let aborted = false;
const checkAborted = () => {
  if (aborted) throw new Error('aborted');
};
const liveAdapters = new Set();
const api = await startFakeApi({ keepBodies: false, script: () => reply(DONE) });
const env = offlineCliEnv({ apiUrl: api.url, configDir: join(scratch, 'claude-config') });
// Not the CLI's business; and a config value of `env` is redacted from transcripts, so the
// image refs in CRA_KUBE_* would show as [REDACTED] in the pod line checked below.
for (const k of Object.keys(env)) if (k.startsWith('CRA_KUBE_') || k.startsWith('CRA_BENCH_') || k === 'KUBECONFIG') delete env[k];
const deps = benchDeps(['1'], () => 'Work item 1.\n\nNothing to change: answer at once.\n');

const cleanup = cleanupOnce(liveAdapters, api, temps);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, () => {
    console.error(`\n${sig}: stopping; cleaning up (shutting the adapters down deletes their pods)`);
    aborted = true;
    const hard = setTimeout(() => {
      console.error('cleanup took over 90 s: removing the temp dirs and exiting');
      for (const t of temps) rmrf(t);
      process.exit(130);
    }, 90_000);
    cleanup().finally(() => {
      clearTimeout(hard);
      process.exit(130);
    });
  });
}

/** An adapter on `root` for `mode` (its own logs dir: the transcript says which pod and image). */
function adapterOn(root, mode) {
  checkAborted();
  const logger = recordingLogger();
  const logsDir = mkdtempSync(join(scratch, `logs-${mode}-`));
  const adapter = addon.createClaudeAdapter(
    {
      repoRoot: root,
      defaultBranch: 'main',
      contextPaths: [],
      maxAgentDuration: 0,
      logging: { agentSessions: true, logsDir },
      bashValidatorHook: addon.createBashValidatorHook(),
      logger,
      env,
      worktreeSetupCommand: null,
      ...BACKENDS[mode],
    },
    deps(),
  );
  return tracked(adapter, logger, liveAdapters);
}

let seq = 0;
/** One Implementor: start → handle, then its result awaited (cancelled if it does not come). */
async function session(a, root, mode) {
  checkAborted();
  const tag = `s${++seq}`;
  if (mode === 'local-new') git(root, 'commit', '-q', '--allow-empty', '-m', `bench: new commit for ${tag}`);
  const preparedBefore = prepared(a).length;
  if (mode.endsWith('-warm')) await warmPodRunning();
  const t0 = performance.now();
  const handle = await a.adapter.startAgent({ role: 'implementor', workItemID: '1', branchName: `bench-${tag}` });
  const handleMs = since(t0);
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => {
      a.adapter.cancelAgent(handle.sessionID);
      reject(new Error(`no result within ${RESULT_TIMEOUT_MS / 1000} s: cancelled`));
    }, RESULT_TIMEOUT_MS);
  });
  let result;
  try {
    result = await Promise.race([handle.result, timeout]);
  } finally {
    clearTimeout(timer);
  }
  const resultMs = since(t0);
  if (result.outcome !== 'blocked') throw new Error(`session ${tag} (${mode}) failed: ${JSON.stringify(result).slice(0, 300)}`);
  let pod = null;
  if (IMAGE_OF[mode] && handle.logFilePath) {
    try {
      pod = readFileSync(handle.logFilePath, 'utf8').split('\n').find((l) => l.includes('Kubernetes pod')) ?? null;
    } catch {
      // no transcript
    }
  }
  const node = pod ? /on node (\S+?);/.exec(pod)?.[1] ?? null : null;
  const imageSeen = pod == null || pod.includes('[REDACTED]') ? null : pod.includes(`of image ${IMAGE_OF[mode]}`);
  // The adapter's own account of the pod's preparation (a debug line): phase → ms.
  const phases = Object.fromEntries([...(prepared(a)[preparedBefore] ?? '').matchAll(/ ([^:;]+?) (\d+) ms;/g)].map((m) => [m[1], Number(m[2])]));
  return { handleMs, resultMs, pod, node, imageSeen, phases };
}

/** The adapter's "the pod was prepared in …" lines so far. */
const prepared = (a) => a.logger.entries.map((e) => e.message).filter((m) => m.startsWith('the pod was prepared in '));

// ---------------------------------------------------------------- repositories

function writeAgents(root) {
  for (const [n, def] of Object.entries(AGENTS)) {
    mkdirSync(join(root, '.claude', 'agents'), { recursive: true });
    writeFileSync(join(root, '.claude', 'agents', `${n}.md`), agentFile({ name: n, ...def }));
  }
}
const countFiles = (root) => git(root, 'ls-files').split('\n').filter(Boolean).length;
const countCommits = (root) => Number(git(root, 'rev-list', '--count', 'main').trim());

/** A clone of the cargo history, `main` at its default branch's tip, agent files committed. */
function cargoRepo(src) {
  const root = mkdtempSync(join(work, 'cargo-'));
  const [cloneMs] = timed(() => git(work, 'clone', '-q', src, root));
  git(root, 'checkout', '-q', '-B', 'main');
  identity(root);
  writeAgents(root);
  git(root, 'add', '.claude');
  git(root, 'commit', '-q', '-m', 'bench: agent definitions');
  return { root, makeMs: cloneMs, files: countFiles(root), commits: countCommits(root), tree: git(root, 'rev-parse', 'HEAD^{tree}').trim() };
}

/** Writes `chunks()`'s strings to `git fast-import` in `root`, minding the pipe's back-pressure. */
function fastImport(root, chunks) {
  return new Promise((resolve, reject) => {
    const child = spawn('git', ['-c', 'pack.compression=1', 'fast-import', '--quiet', '--done'], { cwd: root, stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`git fast-import exited ${code}: ${err.slice(-2000)}`))));
    const it = chunks();
    const pump = () => {
      for (;;) {
        const { value, done } = it.next();
        if (done) return child.stdin.end();
        if (!child.stdin.write(value)) return child.stdin.once('drain', pump);
      }
    };
    child.stdin.on('error', reject);
    pump();
  });
}

/**
 * cargo's tip tree after a linear history of `scale` × its commit count: a chain of commits each
 * changing one of 64 small files, then a commit whose tree is `cargo`'s. The repository starts as
 * a clone of `cargo` with every ref deleted, so the tip tree's objects are stored exactly as in
 * cargo (deltas against cargo's history, now unreachable): a fresh pack of just that tree would
 * make `git pack-objects` of it, part of a pod's start, several times cheaper than on cargo.
 */
async function longHistoryRepo(cargo, scale) {
  const root = join(work, 'cargo10x');
  const t0 = performance.now();
  git(work, 'clone', '-q', '--no-checkout', cargo.root, root);
  identity(root);
  git(root, 'remote', 'remove', 'origin');
  const refs = git(root, 'for-each-ref', '--format=delete %(refname)');
  execFileSync('git', ['update-ref', '--stdin'], { cwd: root, input: refs });
  git(root, 'symbolic-ref', 'HEAD', 'refs/heads/main');
  const chain = Math.round(scale * cargo.commits) - 1;
  const start = 1_300_000_000;
  function* stream() {
    const data = (s) => `data ${Buffer.byteLength(s)}\n${s}\n`;
    let batch = '';
    for (let c = 1; c <= chain; c++) {
      batch += `commit refs/heads/main\ncommitter Historian <h@example.invalid> ${start + c * 600} +0000\n${data(`step ${c}`)}M 100644 inline history/${c % 64}.txt\n${data(`step ${c} of ${chain}\n`)}`;
      if (batch.length > 1 << 20) {
        yield batch;
        batch = '';
      }
    }
    yield `${batch}done\n`;
  }
  const t1 = performance.now();
  await fastImport(root, stream);
  const importMs = since(t1);
  const when = `${start + (chain + 1) * 600} +0000`;
  const tip = execFileSync('git', ['commit-tree', cargo.tree, '-p', 'main', '-m', "cargo's tip tree"], { cwd: root, env: { ...process.env, GIT_AUTHOR_DATE: when, GIT_COMMITTER_DATE: when } }).toString().trim();
  git(root, 'update-ref', 'refs/heads/main', tip);
  git(root, 'reset', '-q', '--hard', 'main');
  const makeMs = since(t0);
  const tree = git(root, 'rev-parse', 'HEAD^{tree}').trim();
  if (tree !== cargo.tree) throw new Error(`cargo10x's tree ${tree} is not cargo's ${cargo.tree}`);
  const others = git(root, 'for-each-ref', '--format=%(refname)').split('\n').filter((r) => r && r !== 'refs/heads/main');
  if (others.length) throw new Error(`cargo10x has refs besides main: ${others.join(' ')}`);
  return { root, makeMs, importMs, files: countFiles(root), commits: countCommits(root), tree };
}

/** What a pod receives now (one commit's tree, packed) against before (a bundle of main's history). */
function podSizes(root) {
  return {
    treePack: pipeBytes(root, 'git rev-list --objects --no-walk HEAD | git pack-objects --stdout -q'),
    bundle: pipeBytes(root, 'git bundle create -q - main'),
  };
}

// ---------------------------------------------------------------- measuring

/** Every mode on one repository: one warm-up each, then n rounds, the order rotated each round. */
async function measureRepo(name, root) {
  const out = Object.fromEntries(MODES.map((m) => [m, []]));
  const warmup = {};
  const adapters = {};
  // local and local-new share one adapter (and so the repository's bases).
  const adapterFor = (mode) => {
    const key = mode === 'local-new' ? 'local' : mode;
    adapters[key] ??= adapterOn(root, key);
    return adapters[key];
  };
  try {
    for (const m of MODES) {
      checkAborted();
      const w = await session(adapterFor(m), root, m);
      warmup[m] = w;
      say(`${name}: warm-up ${m}: start → handle ${fmtMs(w.handleMs)}, → result ${fmtMs(w.resultMs)}${w.node ? ` (${w.node})` : ''}${w.imageSeen === false ? ` (POD LINE DOES NOT NAME ${IMAGE_OF[m]}: ${w.pod})` : ''}`);
    }
    for (let i = 0; i < N; i++) {
      const order = MODES.map((_, k) => MODES[(k + i) % MODES.length]);
      const line = [];
      for (const m of order) {
        const s = await session(adapterFor(m), root, m);
        out[m].push(s);
        line.push(`${m} ${fmtMs(s.handleMs)}`);
      }
      say(`${name}: ${i + 1}/${N}: ${line.join(', ')}`);
    }
  } finally {
    for (const a of Object.values(adapters)) await a.shutdown();
  }
  let podsLeft = [];
  try {
    if (podModes.length) podsLeft = adapterPods();
  } catch (err) {
    podsLeft = [`(kubectl failed: ${err.message.split('\n')[0]})`];
  }
  return { runs: out, warmup, warnings: [...new Set(Object.values(adapters).flatMap((a) => a.warnings()))], podsLeft };
}

// ---------------------------------------------------------------- main

const results = { bench: 'pod-start', machine: machine(), cli: claudePackageVersion(), n: N, scale: SCALE, modes: MODES, images: { session: SESSION_IMAGE, user: USER_IMAGE }, namespace: NAMESPACE, repos: {}, errors: {} };
let cargo = null;
try {
  if (!aborted) {
    try {
      say(`cargo: cloning ${CARGO}`);
      cargo = cargoRepo(CARGO);
      say(`cargo: ${cargo.files} files, ${cargo.commits} commits, cloned in ${fmtMs(cargo.makeMs)}`);
    } catch (err) {
      results.errors.cargo = err.stack ?? String(err);
      console.error(`\ncargo FAILED: ${err.stack ?? err}\n`);
    }
  }
  const repos = [];
  if (cargo && ONLY.includes('cargo')) repos.push(['cargo', () => cargo]);
  if (cargo && ONLY.includes('cargo10x')) {
    repos.push([
      'cargo10x',
      async () => {
        say(`cargo10x: fast-import of ${Math.round(SCALE * cargo.commits) - 1} commits, then cargo's tree`);
        const r = await longHistoryRepo(cargo, SCALE);
        say(`cargo10x: ${r.files} files, ${r.commits} commits, made in ${fmtMs(r.makeMs)} (fast-import ${fmtMs(r.importMs)}); tree ${r.tree} = cargo's`);
        return r;
      },
    ]);
  }
  for (const [name, make] of repos) {
    if (aborted) break;
    try {
      const r = await make();
      const sizes = podSizes(r.root);
      say(`${name}: tree pack ${(sizes.treePack.bytes / MiB).toFixed(2)} MiB (${fmtMs(sizes.treePack.ms)}), bundle of main ${(sizes.bundle.bytes / MiB).toFixed(2)} MiB (${fmtMs(sizes.bundle.ms)})`);
      results.repos[name] = { files: r.files, commits: r.commits, tree: r.tree, makeMs: r.makeMs, importMs: r.importMs, sizes };
      Object.assign(results.repos[name], await measureRepo(name, r.root));
    } catch (err) {
      results.errors[name] = err.stack ?? String(err);
      console.error(`\n${name} FAILED: ${err.stack ?? err}\n`);
    }
  }
} finally {
  results.totalMs = since(T0);
  if (cacheModes && existsSync(NODE_CACHE)) {
    const du = (dir) => Number(execFileSync('du', ['-sk', dir]).toString().split('\t')[0]) * 1024;
    const copies = readdirSafe(join(NODE_CACHE, 'runtime'));
    const bases = (existsSync(join(NODE_CACHE, 'bases')) ? readdirSync(join(NODE_CACHE, 'bases')) : []).filter((e) => e.startsWith('.b-'));
    results.nodeCache = { dir: NODE_CACHE, bytes: du(NODE_CACHE), copies, runtimeBytes: copies.length ? du(join(NODE_CACHE, 'runtime', copies[0])) : null, bases: bases.length, basesBytes: du(join(NODE_CACHE, 'bases')) };
  }
  await cleanup();
}

// ---------------------------------------------------------------- report

const hs = (xs) => (xs ?? []).map((x) => x.handleMs);
const med = (xs) => summary(hs(xs)).median;
const raw = (xs) => hs(xs).map((x) => Math.round(x)).join(' ');
const range = (xs) => {
  const s = summary(hs(xs));
  return s.min == null ? null : `${Math.round(s.min)}–${Math.round(s.max)}`;
};
const verdict = (ok) => (ok == null ? '-' : ok ? 'met' : 'NOT met');
const R = results.repos;

console.log(`\npod-start bench: n=${N}; CLI ${results.cli}; ${results.machine.cpus} CPUs (${results.machine.cpuModel}); kernel ${results.machine.kernel}; load ${results.machine.loadavg.join(' ')}`);
console.log(`images: session ${SESSION_IMAGE ?? '-'}; user ${USER_IMAGE ?? '-'} (runtime from the session image); namespace ${NAMESPACE}, pull ${PULL}`);
for (const [name, r] of Object.entries(R)) {
  console.log(`${name}: ${r.files} files, ${r.commits} commits on main, tree ${r.tree.slice(0, 12)}; made in ${fmtS(r.makeMs)}${r.importMs != null ? ` (fast-import ${fmtS(r.importMs)})` : ''}`);
}

const rows = [];
for (const [name, r] of Object.entries(R)) {
  if (!r.runs) continue;
  for (const m of MODES) rows.push([name, m, fmtMs(med(r.runs[m])), range(r.runs[m]), raw(r.runs[m]), r.runs[m].map((x) => x.node ?? '-').join(' '), fmtMs(summary(r.runs[m].map((x) => x.resultMs)).median), fmtMs(r.warmup[m]?.handleMs)]);
}
if (rows.length) {
  console.log('\nImplementor start → handle (ms)');
  printTable(['repo', 'mode', 'median', 'min–max', 'raw (run order)', 'pods\' nodes', 'start → result', 'warm-up'], rows);
}

const cmp = [];
const c = R.cargo?.runs;
if (c) {
  for (const pod of podModes) {
    for (const local of ['local', 'local-new'].filter((m) => MODES.includes(m))) {
      const d = med(c[pod]) - med(c[local]);
      cmp.push([`cargo: ${pod} − ${local}`, fmtS(d), `≤ ${fmtS(POD_TARGET_MS)}`, local === 'local' ? verdict(d <= POD_TARGET_MS) : '(info)']);
    }
  }
}
const x = R.cargo10x?.runs;
if (c && x) {
  for (const m of MODES) {
    const q = med(x[m]) / med(c[m]);
    cmp.push([`${m}: cargo10x / cargo`, ratio(med(x[m]), med(c[m])), `≤ ${HISTORY_TARGET.toFixed(2)}x`, verdict(q <= HISTORY_TARGET)]);
  }
}
for (const [name, r] of Object.entries(R)) {
  if (r.runs?.user && r.runs?.session) cmp.push([`${name}: user / session image`, ratio(med(r.runs.user), med(r.runs.session)), '', `(${fmtS(med(r.runs.user) - med(r.runs.session))} more)`]);
  if (r.runs?.['user-cache'] && r.runs?.user) cmp.push([`${name}: user-cache / user`, ratio(med(r.runs['user-cache']), med(r.runs.user)), '', `(${fmtS(med(r.runs.user) - med(r.runs['user-cache']))} less)`]);
  for (const w of ['session', 'user']) {
    if (r.runs?.[`${w}-warm`] && r.runs?.[`${w}-cache`]) cmp.push([`${name}: ${w}-warm / ${w}-cache`, ratio(med(r.runs[`${w}-warm`]), med(r.runs[`${w}-cache`])), '', `(${fmtS(med(r.runs[`${w}-cache`]) - med(r.runs[`${w}-warm`]))} less)`]);
  }
  if (r.runs?.['session-cache'] && r.runs?.session) cmp.push([`${name}: session-cache / session`, ratio(med(r.runs['session-cache']), med(r.runs.session)), '', `(${fmtS(med(r.runs.session) - med(r.runs['session-cache']))} less)`]);
  if (r.runs?.['user-cache'] && r.runs?.session) cmp.push([`${name}: user-cache − session`, fmtS(med(r.runs['user-cache']) - med(r.runs.session)), '', '(info)']);
}
if (cmp.length) {
  console.log('\nagainst the targets (medians)');
  printTable(['comparison', 'value', 'target', 'verdict'], cmp);
}

const sizeRows = Object.entries(R)
  .filter(([, r]) => r.sizes)
  .map(([name, r]) => [name, `${(r.sizes.treePack.bytes / MiB).toFixed(2)} MiB`, `${(r.sizes.bundle.bytes / MiB).toFixed(2)} MiB`, ratio(r.sizes.treePack.bytes, r.sizes.bundle.bytes)]);
if (sizeRows.length) {
  console.log('\nwhat a pod receives: pack of one commit\'s tree (now) vs `git bundle create - main` (before)');
  printTable(['repo', 'tree pack', 'bundle', 'ratio'], sizeRows);
}

for (const [name, r] of Object.entries(R)) {
  if (!r.runs) continue;
  const pods = podModes.flatMap((m) => [...r.runs[m], r.warmup[m]]);
  const named = pods.filter((s) => s.imageSeen === true).length;
  const redacted = pods.filter((s) => s.pod?.includes('[REDACTED]')).length;
  const wrong = pods.filter((s) => s.imageSeen === false || s.pod == null);
  if (pods.length) console.log(`${name}: pod sessions whose transcript names their mode's image: ${named}/${pods.length}${redacted ? `; image redacted in ${redacted}` : ''}${wrong.length ? `; ${wrong.length} wrong or without a pod line, e.g. ${wrong[0].pod ?? 'no pod line'}` : ''}`);
  if (r.podsLeft.length) console.log(`${name}: adapter pods left after shutdown: ${r.podsLeft.join(', ')}`);
  if (r.warnings.length) console.log(`${name}: adapter warnings: ${r.warnings.join(' | ')}`);
}
if (results.nodeCache) {
  const { dir, bytes, copies, runtimeBytes, bases, basesBytes } = results.nodeCache;
  console.log(`\nnode cache ${dir}: ${(bytes / MiB).toFixed(0)} MiB on disk for every *-cache pod of the run (${copies.length} runtime cop${copies.length === 1 ? 'y' : 'ies'}; ${bases} checkout base${bases === 1 ? '' : 's'}, ${(basesBytes / MiB).toFixed(0)} MiB); each \`user\` pod copies one such runtime (${((runtimeBytes ?? 0) / MiB).toFixed(0)} MiB) into its own emptyDir`);
}
for (const [name, r] of Object.entries(R)) {
  const modes = podModes.filter((m) => r.runs?.[m]?.some((x) => Object.keys(x.phases).length));
  if (!modes.length) continue;
  const names = [...new Set(modes.flatMap((m) => r.runs[m].flatMap((x) => Object.keys(x.phases))))];
  console.log(`\n${name}: where a pod's start goes after it runs (the adapter's debug line; medians, ms)`);
  printTable(['phase', ...modes], names.map((p) => [p, ...modes.map((m) => String(Math.round(summary(r.runs[m].map((x) => x.phases[p]).filter((v) => v != null)).median ?? NaN)))]));
}
const errs = Object.entries(results.errors);
for (const [name, e] of errs) console.log(`\n${name} FAILED: ${e.split('\n')[0]}`);
console.log(`\ntotal ${(results.totalMs / 1000).toFixed(0)} s; raw results: ${saveResults('pod-start', results)}`);
process.exit(errs.length ? 1 : 0);

function readdirSafe(dir) {
  try {
    return readdirSync(dir).filter((e) => !e.startsWith('.'));
  } catch {
    return [];
  }
}
