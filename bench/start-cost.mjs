// Benchmark: what it costs to start a session (start → handle: checkout made, sandbox and CLI
// up) now that Implementors share one checkout of a commit (a "base", made and set up once)
// and each write to a copy-on-write layer over it, against the TypeScript adapter's way (a
// `git worktree add` per session, then the setup command in it) measured in the same run.
//
//   node bench/start-cost.mjs [--n=5] [--cargo=<git dir>] [--files=100000] [--parallel=16]
//                             [--tmp=<dir>] [--only=fixture,cargo,synthetic,setup,disk]
//
// --tmp: where the repositories and checkouts are made (default the OS temp dir). The file
// system matters: on ext4 without a journal, creating files soon after many were deleted is
// quadratic (the inode allocator skips recently deleted inodes, `recently_deleted`), which is
// what every 100,000-file checkout after a removed one hits; the bench says so when it sees one.
//
// The cargo history is taken from --cargo= or CRA_BENCH_CARGO (a local git directory, e.g. a
// bare mirror of rust-lang/cargo); without it that column is skipped. Figures:
//   1. fixture     the tiny test fixture (~10 files): Implementor start → handle, which is the
//                  fixed start cost the targets add to `git worktree add`
//   2. per repo    (the fixture, cargo, a synthetic tree of <files> files): `git worktree add`
//                  of main (fresh path, removed after); Implementor and Planner start → handle,
//                  first on a new commit (an empty commit on main just before: no base exists)
//                  and later on the same commit (base made); `sharedBase: false` Implementor
//                  (a full clone each). n of each, interleaved, after one warm-up session.
//                  Then n restarts (issue 37): on a new tip, an engine process makes the base
//                  and shuts down; each of n new processes creates an adapter and starts an
//                  Implementor at once (it adopts the kept base). Target: ≤ later + 0.2 s.
//                  Targets: later ≤ 1.0 s on the synthetic tree; first ≤ 1.1 × (`git worktree
//                  add` + the fixture's fixed cost).
//   3. setup       the synthetic tree with a package.json + package-lock.json (jest + eslint,
//                  ≥ 300 packages) and worktreeSetupCommand `npm ci --ignore-scripts …`:
//                  Implementor first (the base pays the install) and later, against
//                  `git worktree add` + the same `npm ci` in it (same npm cache, warmed first).
//   4. disk        <parallel> concurrent Implementors on the synthetic tree, each changing one
//                  file and then held (the fake API keeps their next turn) while
//                  `du -s --block-size=1` (hard links once) of <repo>/.worktrees is taken:
//                  minus the base, per session, against one `git worktree add` checkout.
// Every session is sandboxed (`sandbox: {}`), with the native Bash validator hook, the real
// CLI and the fake Messages API. The table is printed at the end; raw data goes to bench/results/.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { assistantTurns, bash, reply, structured, userText, startFakeApi } from '../__test__/support/fake-api.mjs';
import { claudePackageVersion, offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { addon, recordingLogger } from '../__test__/support/harness.mjs';
import { agentFile } from '../__test__/support/repo.mjs';
import { fmtMs, machine, MiB, printTable, ratio, ROOT, saveResults, summary, tracked, rmrf, benchDeps, cleanupOnce, arg, numberArg } from './support/common.mjs';

/** Which build of the addon is loaded (as bench/sandbox.mjs tells it). */
function build() {
  const node = join(ROOT, 'claude-runtime-adapter.linux-x64-gnu.node');
  const candidates = [join(ROOT, 'target', 'release'), join(ROOT, 'target', 'x86_64-unknown-linux-gnu', 'release')].map((d) => join(d, 'libclaude_runtime_adapter.so'));
  try {
    const size = statSync(node).size;
    return candidates.some((so) => existsSync(so) && statSync(so).size === size) ? 'release' : 'debug';
  } catch {
    return 'debug';
  }
}

const N = numberArg('n', 5);
const FILES = numberArg('files', 100_000);
const PARALLEL = numberArg('parallel', 16);
const CARGO = arg('cargo', process.env.CRA_BENCH_CARGO ?? '');
const ONLY = arg('only', 'fixture,cargo,synthetic,setup,disk').split(',');
const WORK = arg('tmp', tmpdir());
const SETUP = ['npm', 'ci', '--ignore-scripts', '--no-audit', '--no-fund', '--prefer-offline'];
const SETUP_PACKAGES = ['jest@29', 'eslint@8'];
const LATER_TARGET_MS = 1000;
const FIRST_TARGET = 1.1;

const AGENTS = {
  planner: { description: 'planner', tools: ['Bash', 'Read'], prompt: 'You are the planner.' },
  implementor: { description: 'implementor', tools: ['Bash', 'Read', 'Write'], prompt: 'You are the implementor.' },
  reviewer: { description: 'reviewer', tools: ['Read'], prompt: 'You are the reviewer.' },
};
const DONE = {
  implementor: structured({ role: 'implementor', outcome: 'completed', summary: 'done' }),
  planner: structured({ role: 'planner', create: [], close: [], update: [] }),
};

const T0 = performance.now();
const say = (msg) => process.stderr.write(`  [${((performance.now() - T0) / 1000).toFixed(0).padStart(4)} s] ${msg}\n`);
const since = (t) => performance.now() - t;

function git(cwd, ...args) {
  return execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 256 * MiB }).toString();
}
function timed(fn) {
  const t = performance.now();
  fn();
  return since(t);
}
/** `du -s --block-size=1` of all `paths` in one invocation (a file hard-linked twice counts once). */
function du(...paths) {
  const out = execFileSync('du', ['-s', '-c', '--block-size=1', ...paths], { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
  return Number(/^(\d+)\s+total$/m.exec(out)[1]);
}
function run(cmd, args, opts) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.stdout.on('data', () => {});
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${err.slice(-2000)}`))));
  });
}
const entries = (root, prefix) => {
  try {
    return readdirSync(join(root, '.worktrees')).filter((n) => n.startsWith(prefix));
  } catch {
    return [];
  }
};

/** The file system `dir` is on: its type, and for ext4 whether it has a journal. */
function fileSystem(dir) {
  const real = realpathSync(dir);
  const mounts = readFileSync('/proc/mounts', 'utf8').split('\n').map((l) => l.split(' ')).filter((m) => m.length > 2);
  const m = mounts.filter(([, at]) => real === at || real.startsWith(at.endsWith('/') ? at : `${at}/`)).sort((a, b) => b[1].length - a[1].length)[0];
  if (!m) return { type: 'unknown' };
  const [dev, at, type] = m;
  let journal = null;
  if (type === 'ext4') {
    try {
      journal = readFileSync(`/sys/fs/ext4/${basename(dev)}/journal_task`, 'utf8').trim() !== '<none>';
    } catch {
      // unknown
    }
  }
  return { dev, at, type, journal };
}

// ---------------------------------------------------------------- shared state, cleanup

const scratch = mkdtempSync(join(tmpdir(), 'cra-start-cost-'));
mkdirSync(WORK, { recursive: true });
const work = mkdtempSync(join(WORK, 'cra-start-cost-work-'));
const temps = [scratch, work];
let aborted = false;
const checkAborted = () => {
  if (aborted) throw new Error('aborted');
};
const liveAdapters = new Set();
const api = await startFakeApi({ keepBodies: false });
const npmCache = execFileSync('npm', ['config', 'get', 'cache']).toString().trim();
const env = offlineCliEnv({ apiUrl: api.url, configDir: join(scratch, 'claude-config'), extra: { npm_config_cache: npmCache } });
const items = Array.from({ length: Math.max(PARALLEL, 1) }, (_, i) => String(i + 1));
const deps = benchDeps(items, (id) => `Work item ${id}.\n\nCHANGE=${id}\n`);

const cleanup = cleanupOnce(liveAdapters, api, temps);
let releaseHeld = () => {};
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, () => {
    console.error(`\n${sig}: stopping; cleaning up`);
    aborted = true;
    releaseHeld();
    // Bounded: whatever is still in flight after a minute, the temp dirs go and the process ends.
    const hard = setTimeout(() => {
      console.error('cleanup took over 60 s: removing the temp dirs and exiting');
      for (const t of temps) rmrf(t);
      process.exit(130);
    }, 60_000);
    cleanup().finally(() => {
      clearTimeout(hard);
      process.exit(130);
    });
  });
}

/** An adapter on `root` (sandboxed, native validator hook, no setup unless `extra` says). */
function adapterOn(root, extra = {}) {
  checkAborted();
  const logger = recordingLogger();
  const adapter = addon.createClaudeAdapter(
    {
      repoRoot: root,
      defaultBranch: 'main',
      contextPaths: [],
      maxAgentDuration: 0,
      logging: { agentSessions: false, logsDir: '' },
      bashValidatorHook: addon.createBashValidatorHook(),
      logger,
      env,
      worktreeSetupCommand: null,
      sandbox: {},
      ...extra,
    },
    deps(),
  );
  return tracked(adapter, logger, liveAdapters);
}

// ---------------------------------------------------------------- sessions

let seq = 0;
/**
 * One session, start → handle and start → result. Implementors run one Bash write and answer;
 * Planners answer at once. `layered`: an Implementor's checkout is a `.layer-*`; `basesRemoved`:
 * bases that were there before the start and gone when the handle resolved.
 */
async function session(a, root, role) {
  checkAborted();
  const tag = `s${++seq}`;
  // When the model's last answer went out: the end of the session (checkout read out, result
  // settled) is measured from there.
  let lastAnswer = 0;
  api.setScript((body) => {
    if (assistantTurns(body) === 0 && role === 'implementor') return reply(bash(`echo ${tag} > bench-${tag}.txt`));
    lastAnswer = performance.now();
    return reply(DONE[role]);
  });
  const params = role === 'implementor' ? { role, workItemID: '1', branchName: `bench-${tag}` } : { role, specPaths: [] };
  const basesBefore = entries(root, '.base-');
  const t0 = performance.now();
  const handle = await a.adapter.startAgent(params);
  const handleMs = since(t0);
  const basesAfter = entries(root, '.base-');
  const layered = role === 'implementor' ? entries(root, '.layer-').length > 0 : null;
  const result = await handle.result;
  const resultMs = since(t0);
  const endMs = since(lastAnswer);
  if (role === 'implementor' && result.outcome !== 'completed') throw new Error(`session failed: ${JSON.stringify(result).slice(0, 300)}`);
  return { handleMs, resultMs, endMs, layered, basesRemoved: basesBefore.filter((b) => !basesAfter.includes(b)).length };
}

const newCommit = (root, what) => git(root, 'commit', '-q', '--allow-empty', '-m', `bench: ${what}`);

/** `git worktree add` of main at a fresh path (the TypeScript adapter's way); removed after. */
function worktreeAdd(root, then) {
  checkAborted();
  const k = ++seq;
  const path = join(work, `wt-${k}`);
  const addMs = timed(() => git(root, 'worktree', 'add', '-q', '-b', `bench-wt-${k}`, path, 'main'));
  const extra = then ? then(path, k) : undefined;
  const removeMs = timed(() => {
    git(root, 'worktree', 'remove', '--force', path);
    git(root, 'branch', '-q', '-D', `bench-wt-${k}`);
  });
  return { addMs, removeMs, ...extra };
}

/**
 * An engine restarted on `root` (issue 37): a new Node process creates an adapter and starts one
 * Implementor at once; its start → handle, and whether it adopted the base the previous process
 * kept. The process then shuts down (keeping the tip's base for the next) and exits.
 */
async function restartedSession(root) {
  checkAborted();
  const tag = `s${++seq}`;
  api.setScript((body) => (assistantTurns(body) === 0 ? reply(bash(`echo ${tag} > bench-${tag}.txt`)) : reply(DONE.implementor)));
  const config = { repoRoot: root, defaultBranch: 'main', contextPaths: [], maxAgentDuration: 0, logging: { agentSessions: false, logsDir: '' }, env, worktreeSetupCommand: null, sandbox: {} };
  const out = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', `
      const addon = require(${JSON.stringify(join(ROOT, 'index.js'))});
      const { performance } = require('node:perf_hooks');
      const said = [];
      const at = (message) => said.push(message);
      const adapter = addon.createClaudeAdapter({ ...${JSON.stringify(config)}, bashValidatorHook: addon.createBashValidatorHook(),
        logger: { debug: at, info: at, warn: at, error: at } }, {
        workItemReader: { getWorkItemBody: async () => 'Work item 1.' }, revisionReader: { getRevisionFiles: async () => [] },
        getState: () => ({ workItems: { 1: { id: '1', title: 'Item 1', status: 'open', linkedRevision: null } }, revisions: {}, lastPlannedSHAs: {} }),
        getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
      (async () => {
        const t0 = performance.now();
        const handle = await adapter.startAgent({ role: 'implementor', workItemID: '1', branchName: 'bench-${tag}' });
        const handleMs = performance.now() - t0;
        const result = await handle.result;
        await adapter.shutdown();
        console.log(JSON.stringify({ handleMs, outcome: result.outcome, adopted: said.includes('adopted the base a previous process kept for the tip') }));
        process.exit(0);
      })().catch((e) => { console.error(e); process.exit(1); });
    `], { stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    child.stdout.on('data', (d) => (text += d));
    child.on('exit', (code) => (code === 0 ? resolve(JSON.parse(text)) : reject(new Error(`restarted engine exited ${code}`))));
  });
  if (out.outcome !== 'completed') throw new Error(`restarted session failed: ${JSON.stringify(out)}`);
  return out;
}

/** Every start → handle figure of one repository (section 2). */
async function measureRepo(name, root) {
  const out = { wtAdd: [], wtRemove: [], implFirst: [], implLater: [], planFirst: [], planLater: [], fullClone: [] };
  const a = adapterOn(root);
  try {
    say(`${name}: warm-up`);
    await session(a, root, 'implementor');
    await session(a, root, 'planner');
    for (let i = 0; i < N; i++) {
      const wt = worktreeAdd(root);
      out.wtAdd.push(wt.addMs);
      out.wtRemove.push(wt.removeMs);
      newCommit(root, `implementor ${i}`);
      out.implFirst.push(await session(a, root, 'implementor'));
      out.implLater.push(await session(a, root, 'implementor'));
      newCommit(root, `planner ${i}`);
      out.planFirst.push(await session(a, root, 'planner'));
      out.planLater.push(await session(a, root, 'planner'));
      say(`${name}: ${i + 1}/${N} (worktree add ${fmtMs(wt.addMs)}, Implementor first ${fmtMs(out.implFirst.at(-1).handleMs)} / later ${fmtMs(out.implLater.at(-1).handleMs)}, Planner first ${fmtMs(out.planFirst.at(-1).handleMs)} / later ${fmtMs(out.planLater.at(-1).handleMs)})`);
    }
    out.warnings = a.warnings();
  } finally {
    await a.shutdown({ keepBases: false });
  }
  // Restarts on a new tip: the first engine makes its base, each next one adopts it.
  newCommit(root, 'restarts');
  out.restartMakes = await restartedSession(root);
  out.restarted = [];
  for (let i = 0; i < N; i++) {
    out.restarted.push(await restartedSession(root));
    say(`${name}: restarted engine ${i + 1}/${N} (first Implementor ${fmtMs(out.restarted.at(-1).handleMs)}, adopted: ${out.restarted.at(-1).adopted})`);
  }
  const b = adapterOn(root, { sharedBase: false });
  try {
    await session(b, root, 'implementor'); // warm-up
    for (let i = 0; i < N; i++) {
      out.fullClone.push(await session(b, root, 'implementor'));
      say(`${name}: sharedBase: false ${i + 1}/${N} (${fmtMs(out.fullClone.at(-1).handleMs)})`);
    }
    out.warningsFullClone = b.warnings();
  } finally {
    await b.shutdown();
  }
  out.leftAfterShutdown = readdirSync(join(root, '.worktrees')).filter((n) => n.startsWith('.'));
  return out;
}

// ---------------------------------------------------------------- repositories

function writeAgents(root) {
  for (const [n, def] of Object.entries(AGENTS)) {
    mkdirSync(join(root, '.claude', 'agents'), { recursive: true });
    writeFileSync(join(root, '.claude', 'agents', `${n}.md`), agentFile({ name: n, ...def }));
  }
}
function identity(root) {
  git(root, 'config', 'user.name', 'Bench User');
  git(root, 'config', 'user.email', 'bench@example.invalid');
  git(root, 'config', 'commit.gpgsign', 'false');
}

/** The test fixture's shape (__test__/support/repo.mjs): a README, the agent files, a few sources. */
function fixtureRepo() {
  const root = mkdtempSync(join(work, 'fixture-'));
  git(root, 'init', '-q', '-b', 'main');
  identity(root);
  writeAgents(root);
  const files = { 'README.md': '# temp repo\n', '.claude/CLAUDE.md': '# Project\n\nTest repository.\n', 'src/a.js': 'export const a = 1;\n', 'src/b.js': 'export const b = 2;\n', 'test/a.test.js': "import { a } from '../src/a.js';\n", 'package.json': '{ "name": "fixture" }\n' };
  for (const [rel, content] of Object.entries(files)) {
    mkdirSync(dirname(join(root, rel)), { recursive: true });
    writeFileSync(join(root, rel), content);
  }
  git(root, 'add', '-A');
  git(root, 'commit', '-q', '-m', 'initial commit');
  return root;
}

/** A clone of the cargo history, `main` at its default branch's tip, agent files committed. */
function cargoRepo(src) {
  const root = mkdtempSync(join(work, 'cargo-'));
  const cloneMs = timed(() => git(work, 'clone', '-q', src, root));
  git(root, 'checkout', '-q', '-B', 'main');
  identity(root);
  writeAgents(root);
  git(root, 'add', '.claude');
  git(root, 'commit', '-q', '-m', 'bench: agent definitions');
  const files = Number(git(root, 'ls-files').split('\n').filter(Boolean).length);
  const commits = Number(git(root, 'rev-list', '--count', 'main').trim());
  return { root, cloneMs, files, commits, head: git(root, 'rev-parse', '--short', 'HEAD~1').trim() };
}

/** A repository of `files` generated files + agent files, two commits, by one `git fast-import` stream. */
async function syntheticRepo(files) {
  const root = mkdtempSync(join(work, 'synthetic-'));
  git(root, 'init', '-q', '-b', 'main');
  identity(root);
  const t0 = performance.now();
  const parts = [];
  const data = (s) => `data ${Buffer.byteLength(s)}\n${s}\n`;
  const file = (path, content) => `M 100644 inline ${path}\n${data(content)}`;
  const content = (i, rev) => `// generated file ${i} (${rev})\npub fn f${i}() -> u64 {\n    ${i}\n}\n\npub const NAME: &str = "module ${i % 100} / part ${(i / 100) % 10 | 0}";\n`;
  const pathOf = (i) => `src/m${String(i % 100).padStart(2, '0')}/s${Math.floor(i / 100) % 10}/f${String(Math.floor(i / 1000)).padStart(3, '0')}.rs`;
  const when = Math.floor(Date.now() / 1000);
  parts.push(`commit refs/heads/main\nmark :1\ncommitter Bench User <bench@example.invalid> ${when - 60} +0000\n${data('synthetic tree')}`);
  parts.push(file('README.md', '# synthetic\n'));
  for (const [n, def] of Object.entries(AGENTS)) parts.push(file(`.claude/agents/${n}.md`, agentFile({ name: n, ...def })));
  for (let i = 0; i < files; i++) parts.push(file(pathOf(i), content(i, 1)));
  parts.push(`commit refs/heads/main\nmark :2\ncommitter Bench User <bench@example.invalid> ${when} +0000\n${data('second commit: 1% of the files changed')}from :1\n`);
  for (let i = 0; i < files; i += 100) parts.push(file(pathOf(i), content(i, 2)));
  parts.push('done\n');
  const stream = parts.join('');
  await new Promise((resolve, reject) => {
    const child = spawn('git', ['-c', 'pack.compression=1', 'fast-import', '--quiet', '--done'], { cwd: root, stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`git fast-import exited ${code}: ${err}`))));
    child.stdin.end(stream);
  });
  const importMs = since(t0);
  const checkoutMs = timed(() => git(root, 'reset', '-q', '--hard', 'main'));
  const total = Number(git(root, 'ls-files').split('\n').filter(Boolean).length);
  return { root, importMs, checkoutMs, files: total, streamMiB: Buffer.byteLength(stream) / MiB };
}

// ---------------------------------------------------------------- section 3: setup

async function measureSetup(root) {
  const out = { tsWtAdd: [], tsNpmCi: [], tsTotal: [], implFirst: [], implLater: [] };
  // The lockfile: resolved by npm from the registry (metadata only), then the cache warmed by
  // one untimed install, so every measured `npm ci` finds the same cache.
  const lockDir = join(work, 'lock');
  mkdirSync(lockDir);
  writeFileSync(join(lockDir, 'package.json'), JSON.stringify({ name: 'bench-setup', version: '1.0.0', private: true }, null, 2));
  let t = performance.now();
  await run('npm', ['install', '--package-lock-only', '--no-audit', '--no-fund', ...SETUP_PACKAGES], { cwd: lockDir, env: { ...process.env, npm_config_cache: npmCache } });
  out.lockMs = since(t);
  out.packages = Number(execFileSync(process.execPath, ['-e', 'const l=require(process.argv[1]);console.log(Object.keys(l.packages).filter(Boolean).length)', join(lockDir, 'package-lock.json')]).toString().trim());
  say(`setup: lockfile of ${SETUP_PACKAGES.join(' + ')} has ${out.packages} packages (${fmtMs(out.lockMs)})`);
  if (out.packages < 300) throw new Error(`the lockfile has ${out.packages} packages, fewer than 300`);
  t = performance.now();
  await run(SETUP[0], SETUP.slice(1), { cwd: lockDir, env: { ...process.env, npm_config_cache: npmCache } });
  out.cacheWarmMs = since(t);
  rmrf(join(lockDir, 'node_modules'));
  say(`setup: npm cache warmed (${fmtMs(out.cacheWarmMs)})`);
  for (const f of ['package.json', 'package-lock.json']) writeFileSync(join(root, f), execFileSync('cat', [join(lockDir, f)]));
  writeFileSync(join(root, '.gitignore'), 'node_modules/\n');
  git(root, 'add', 'package.json', 'package-lock.json', '.gitignore');
  git(root, 'commit', '-q', '-m', 'bench: package.json + lockfile');

  const a = adapterOn(root, { worktreeSetupCommand: SETUP, worktreeSetupTimeout: 1800 });
  try {
    for (let i = 0; i < N; i++) {
      const ts = worktreeAdd(root, (path) => {
        const tn = performance.now();
        execFileSync(SETUP[0], SETUP.slice(1), { cwd: path, stdio: 'ignore', env: { ...process.env, npm_config_cache: npmCache } });
        const npmMs = since(tn);
        if (!existsSync(join(path, 'node_modules', 'jest'))) throw new Error('npm ci left no node_modules/jest');
        return { npmMs };
      });
      out.tsWtAdd.push(ts.addMs);
      out.tsNpmCi.push(ts.npmMs);
      out.tsTotal.push(ts.addMs + ts.npmMs);
      newCommit(root, `setup ${i}`);
      out.implFirst.push(await session(a, root, 'implementor'));
      out.implLater.push(await session(a, root, 'implementor'));
      const base = entries(root, '.base-')[0];
      out.baseHasJest ??= base ? existsSync(join(root, '.worktrees', base, 'node_modules', 'jest')) : false;
      say(`setup: ${i + 1}/${N} (worktree add + npm ci ${fmtMs(out.tsTotal.at(-1))}, Implementor first ${fmtMs(out.implFirst.at(-1).handleMs)} / later ${fmtMs(out.implLater.at(-1).handleMs)})`);
    }
    out.warnings = a.warnings();
  } finally {
    await a.shutdown();
  }
  return out;
}

// ---------------------------------------------------------------- section 4: disk

async function measureDisk(root) {
  const out = {};
  // One checkout the TypeScript adapter's way: the worktree and its admin dir (its index).
  worktreeAdd(root, (path, k) => {
    out.checkoutBytes = du(path, join(root, '.git', 'worktrees', `wt-${k}`));
  });
  const a = adapterOn(root);
  let release;
  const released = new Promise((r) => (release = r));
  releaseHeld = release;
  const changed = new Set();
  api.setScript(async (body) => {
    const turn = assistantTurns(body);
    const id = /CHANGE=(\d+)/.exec(userText(body))?.[1];
    if (turn === 0) return reply(bash(`echo change-${id} >> README.md`));
    changed.add(id);
    await released; // the session stays alive, its change made, until measured
    return reply(DONE.implementor);
  });
  try {
    newCommit(root, 'disk');
    const t0 = performance.now();
    const handles = await Promise.all(items.slice(0, PARALLEL).map((id) => a.adapter.startAgent({ role: 'implementor', workItemID: id, branchName: `bench-disk-${id}` })));
    out.allHandlesMs = since(t0);
    say(`disk: ${PARALLEL} handles in ${fmtMs(out.allHandlesMs)}; waiting for every change`);
    const results = handles.map((h) => h.result.then((r) => ({ ok: r.outcome === 'completed', r }), (e) => ({ ok: false, e: String(e.message).slice(0, 300) })));
    const deadline = performance.now() + 300_000;
    while (changed.size < PARALLEL && performance.now() < deadline && !aborted) await new Promise((r) => setTimeout(r, 100));
    checkAborted();
    out.allChangedMs = since(t0);
    out.changedAtMeasure = changed.size;
    const wt = join(root, '.worktrees');
    const bases = entries(root, '.base-').map((b) => join(wt, b));
    const layers = entries(root, '.layer-').map((l) => join(wt, l));
    out.bases = bases.length;
    out.layers = layers.length;
    out.worktreesBytes = du(wt);
    out.baseBytes = bases.length ? du(...bases) : 0;
    out.layersBytes = layers.length ? du(...layers) : 0;
    out.uppersBytes = layers.length ? du(...layers.map((l) => join(l, 'upper'))) : 0;
    out.layerGitBytes = layers.length ? du(...layers.map((l) => join(l, 'git'))) : 0;
    out.changedInUpper = layers.filter((l) => existsSync(join(l, 'upper', 'README.md'))).length;
    out.overheadBytes = out.worktreesBytes - out.baseBytes;
    out.perSessionBytes = out.overheadBytes / PARALLEL;
    release();
    const settled = await Promise.all(results);
    out.failed = settled.filter((s) => !s.ok).map((s) => s.e ?? JSON.stringify(s.r).slice(0, 200));
    out.warnings = a.warnings();
  } finally {
    release();
    await a.shutdown();
  }
  return out;
}

// ---------------------------------------------------------------- main

const results = { bench: 'start-cost', machine: machine(), build: build(), work: WORK, fs: fileSystem(work), cli: claudePackageVersion(), n: N, files: FILES, parallel: PARALLEL, repos: {}, errors: {} };
const phase = async (name, fn) => {
  if (!ONLY.includes(name) || aborted) return;
  try {
    await fn();
  } catch (err) {
    results.errors[name] = err.stack ?? String(err);
    console.error(`\n${name} FAILED: ${err.stack ?? err}\n`);
  }
};

try {
  await phase('fixture', async () => {
    const root = fixtureRepo();
    results.repos.fixture = { files: git(root, 'ls-files').split('\n').filter(Boolean).length, ...(await measureRepo('fixture', root)) };
  });
  await phase('cargo', async () => {
    if (!CARGO) {
      results.repos.cargo = { skipped: 'no --cargo=<git dir> (or CRA_BENCH_CARGO) given' };
      say('cargo: skipped (give --cargo=<git dir of rust-lang/cargo> or CRA_BENCH_CARGO)');
      return;
    }
    say(`cargo: cloning ${CARGO}`);
    const c = cargoRepo(CARGO);
    say(`cargo: ${c.files} files, ${c.commits} commits at ${c.head}, cloned in ${fmtMs(c.cloneMs)}`);
    results.repos.cargo = { files: c.files, commits: c.commits, head: c.head, cloneMs: c.cloneMs, ...(await measureRepo('cargo', c.root)) };
  });
  let synth = null;
  const needSynth = ['synthetic', 'setup', 'disk'].some((p) => ONLY.includes(p));
  if (needSynth) {
    await phase(ONLY.includes('synthetic') ? 'synthetic' : ONLY.find((p) => p === 'setup' || p === 'disk'), async () => {
      say(`synthetic: generating ${FILES} files`);
      synth = await syntheticRepo(FILES);
      results.synthetic = { files: synth.files, importMs: synth.importMs, checkoutMs: synth.checkoutMs, streamMiB: synth.streamMiB };
      say(`synthetic: ${synth.files} files; fast-import ${fmtMs(synth.importMs)} (${synth.streamMiB.toFixed(1)} MiB stream), checkout ${fmtMs(synth.checkoutMs)}`);
      if (ONLY.includes('synthetic')) results.repos.synthetic = { files: synth.files, ...(await measureRepo('synthetic', synth.root)) };
    });
  }
  // Disk before setup: the setup adds node_modules to the base, which is not what is measured.
  await phase('disk', async () => {
    if (!synth) throw new Error('no synthetic repository');
    results.disk = await measureDisk(synth.root);
  });
  await phase('setup', async () => {
    if (!synth) throw new Error('no synthetic repository');
    results.setup = await measureSetup(synth.root);
  });
} finally {
  results.totalMs = since(T0);
  await cleanup();
}

// ---------------------------------------------------------------- report

const med = (xs) => summary(xs).median;
const hs = (xs) => xs.map((x) => (typeof x === 'number' ? x : x.handleMs));
const raw = (xs) => hs(xs).map((x) => Math.round(x)).join(' ');
const fx = results.repos.fixture;
// The fixed start cost: an Implementor on the fixture whose base exists (no repository-sized
// work left in it: sandbox check, layer, proxy, CLI up). Planner likewise.
const fixedImpl = fx ? med(hs(fx.implLater)) : null;
const fixedPlan = fx ? med(hs(fx.planLater)) : null;

console.log(`\nstart-cost bench: addon build ${results.build}; CLI ${results.cli}; n=${N}; ${results.machine.cpus} CPUs (${results.machine.cpuModel}); kernel ${results.machine.kernel}; load ${results.machine.loadavg.join(' ')}`);
const fsNote = results.fs.type === 'ext4' && results.fs.journal === false ? ' — ext4 WITHOUT a journal: file creation soon after mass deletion is slow (recently_deleted), checkout figures are inflated' : '';
console.log(`repositories and checkouts in ${WORK} (${results.fs.type} on ${results.fs.dev ?? '?'}${results.fs.type === 'ext4' ? `, journal: ${results.fs.journal}` : ''})${fsNote}`);
if (fx) {
  console.log(`\n1. fixed start cost (fixture, ${fx.files} files): Implementor start → handle, base made: median ${fmtMs(fixedImpl)} [${raw(fx.implLater)}]`);
  console.log(`   (Implementor first on a new commit: ${fmtMs(med(hs(fx.implFirst)))} [${raw(fx.implFirst)}]; Planner later: ${fmtMs(fixedPlan)} [${raw(fx.planLater)}])`);
}

const rows = [];
const verdict = (ok) => (ok == null ? '-' : ok ? 'met' : 'NOT met');
for (const [name, r] of Object.entries(results.repos)) {
  if (r.skipped) {
    rows.push([`${name}: skipped (${r.skipped})`, '', '', '', '', '', '']);
    continue;
  }
  const label = `${name} (${r.files} files)`;
  const wt = med(r.wtAdd);
  const peerFirstImpl = wt != null && fixedImpl != null ? wt + fixedImpl : null;
  const peerFirstPlan = wt != null && fixedPlan != null ? wt + fixedPlan : null;
  const iF = med(hs(r.implFirst));
  const iL = med(hs(r.implLater));
  const pF = med(hs(r.planFirst));
  const pL = med(hs(r.planLater));
  const fc = med(hs(r.fullClone));
  const big = name === 'synthetic';
  rows.push([`${label}: git worktree add`, fmtMs(wt), raw(r.wtAdd), '', '', '', `(remove: ${fmtMs(med(r.wtRemove))})`]);
  rows.push([`  Implementor first (new commit)`, fmtMs(iF), raw(r.implFirst), 'worktree add + fixed', fmtMs(peerFirstImpl), ratio(iF, peerFirstImpl), `≤ ${FIRST_TARGET}x: ${verdict(peerFirstImpl == null ? null : iF <= FIRST_TARGET * peerFirstImpl)}`]);
  rows.push([`  Implementor later (same commit)`, fmtMs(iL), raw(r.implLater), 'worktree add + fixed', fmtMs(peerFirstImpl), ratio(iL, peerFirstImpl), big ? `≤ ${LATER_TARGET_MS} ms: ${verdict(iL <= LATER_TARGET_MS)}` : '']);
  rows.push([`  Planner first (new commit)`, fmtMs(pF), raw(r.planFirst), 'worktree add + fixed', fmtMs(peerFirstPlan), ratio(pF, peerFirstPlan), '']);
  rows.push([`  Planner later (same commit)`, fmtMs(pL), raw(r.planLater), 'worktree add + fixed', fmtMs(peerFirstPlan), ratio(pL, peerFirstPlan), big ? `≤ ${LATER_TARGET_MS} ms: ${verdict(pL <= LATER_TARGET_MS)}` : '']);
  rows.push([`  sharedBase: false Implementor`, fmtMs(fc), raw(r.fullClone), 'Implementor first', fmtMs(iF), ratio(fc, iF), '']);
  if (r.restarted) {
    const rs = med(hs(r.restarted));
    const adopted = r.restarted.filter((x) => x.adopted).length;
    rows.push([`  restarted engine, first Implementor (same tip; adopted ${adopted}/${r.restarted.length})`, fmtMs(rs), raw(r.restarted), 'Implementor later', fmtMs(iL), ratio(rs, iL), `≤ later + 200 ms: ${verdict(rs <= iL + 200)}`]);
  }
}
if (rows.length) {
  console.log('\n2. start → handle, median of n (raw values in ms, in run order)');
  printTable(['measure', 'median', 'raw (ms)', 'peer', 'peer median', 'ratio', 'target'], rows);
  console.log(`   fixed = the fixture's Implementor (Planner) start → handle with its base made: ${fmtMs(fixedImpl)} (${fmtMs(fixedPlan)})`);
  for (const [name, r] of Object.entries(results.repos)) {
    if (r.skipped) continue;
    const notLayered = [...r.implFirst, ...r.implLater].filter((x) => !x.layered).length;
    const removedInStart = r.implFirst.filter((x) => x.basesRemoved > 0).length;
    console.log(`   ${name}: Implementors not on a layer: ${notLayered}/${r.implFirst.length + r.implLater.length}; first Implementors that removed the previous commit's base before their handle: ${removedInStart}/${r.implFirst.length}; full clones on a layer (should be 0): ${r.fullClone.filter((x) => x.layered).length}; left in .worktrees after shutdown: ${r.leftAfterShutdown.length ? r.leftAfterShutdown.join(', ') : 'nothing'}`);
    const rs = (xs) => fmtMs(med(xs.map((x) => x.resultMs)));
    console.log(`   ${name}: start → result medians: Implementor first ${rs(r.implFirst)}, later ${rs(r.implLater)}; Planner first ${rs(r.planFirst)}, later ${rs(r.planLater)}; sharedBase: false ${rs(r.fullClone)}`);
    const ends = (xs) => fmtMs(med(xs.map((x) => x.endMs)));
    console.log(`   ${name}: Implementor end (last model answer → result settled) medians: first ${ends(r.implFirst)}, later ${ends(r.implLater)}; sharedBase: false ${ends(r.fullClone)}`);
    const w = [...new Set([...(r.warnings ?? []), ...(r.warningsFullClone ?? [])])];
    if (w.length) console.log(`   ${name}: adapter warnings: ${w.join(' | ')}`);
  }
}
if (results.synthetic) console.log(`   synthetic tree generated: ${results.synthetic.files} files, git fast-import ${fmtMs(results.synthetic.importMs)}, checkout ${fmtMs(results.synthetic.checkoutMs)}`);

if (results.setup) {
  const s = results.setup;
  const ts = med(s.tsTotal);
  const iF = med(hs(s.implFirst));
  const iL = med(hs(s.implLater));
  console.log(`\n3. setup: \`${SETUP.join(' ')}\` of ${s.packages} packages (${SETUP_PACKAGES.join(' + ')}) on the synthetic tree, npm cache ${npmCache} (warmed: ${fmtMs(s.cacheWarmMs)}); node_modules in the base: ${s.baseHasJest ? 'yes' : 'NO'}`);
  printTable(
    ['measure', 'median', 'raw (ms)', 'peer', 'peer median', 'ratio'],
    [
      ['git worktree add + npm ci (TS adapter)', fmtMs(ts), raw(s.tsTotal), '', '', ''],
      ['  of which git worktree add', fmtMs(med(s.tsWtAdd)), raw(s.tsWtAdd), '', '', ''],
      ['  of which npm ci', fmtMs(med(s.tsNpmCi)), raw(s.tsNpmCi), '', '', ''],
      ['Implementor first (new commit, installs)', fmtMs(iF), raw(s.implFirst), 'worktree add + npm ci', fmtMs(ts), ratio(iF, ts)],
      ['Implementor later (same commit)', fmtMs(iL), raw(s.implLater), 'worktree add + npm ci', fmtMs(ts), ratio(iL, ts)],
    ],
  );
  if (s.warnings?.length) console.log(`   adapter warnings: ${s.warnings.join(' | ')}`);
}

if (results.disk) {
  const d = results.disk;
  const m = (b) => `${(b / MiB).toFixed(2)} MiB`;
  console.log(`\n4. disk: ${PARALLEL} concurrent Implementors on the synthetic tree, each changed README.md (${d.changedAtMeasure}/${PARALLEL} had when measured; ${d.changedInUpper} changes seen in layers' upper/), du -s --block-size=1`);
  printTable(
    ['measure', 'bytes', 'MiB', 'peer', 'peer MiB', 'ratio'],
    [
      ['one checkout (git worktree add: tree + admin dir)', d.checkoutBytes, m(d.checkoutBytes), '', '', ''],
      [`<repo>/.worktrees with ${d.layers} layers, ${d.bases} base(s)`, d.worktreesBytes, m(d.worktreesBytes), '', '', ''],
      ['  the base(s)', d.baseBytes, m(d.baseBytes), 'one checkout', m(d.checkoutBytes), ratio(d.baseBytes, d.checkoutBytes)],
      ['  everything but the base(s)', d.overheadBytes, m(d.overheadBytes), `${PARALLEL} checkouts`, m(PARALLEL * d.checkoutBytes), ratio(d.overheadBytes, PARALLEL * d.checkoutBytes)],
      ['  per session', Math.round(d.perSessionBytes), m(d.perSessionBytes), 'one checkout', m(d.checkoutBytes), ratio(d.perSessionBytes, d.checkoutBytes)],
      ['    of which upper/ (all layers, per session)', Math.round(d.uppersBytes / PARALLEL), m(d.uppersBytes / PARALLEL), '', '', ''],
      ['    of which git/ (all layers, per session)', Math.round(d.layerGitBytes / PARALLEL), m(d.layerGitBytes / PARALLEL), '', '', ''],
    ],
  );
  console.log(`   ${PARALLEL} handles after ${fmtMs(d.allHandlesMs)}; all changes made after ${fmtMs(d.allChangedMs)}; failed sessions: ${d.failed.length}${d.failed.length ? ` (${d.failed.join(' | ')})` : ''}`);
  if (d.warnings?.length) console.log(`   adapter warnings: ${d.warnings.join(' | ')}`);
}

const errs = Object.entries(results.errors);
for (const [name, e] of errs) console.log(`\n${name} FAILED: ${e.split('\n')[0]}`);
console.log(`\ntotal ${(results.totalMs / 1000).toFixed(0)} s; raw results: ${saveResults('start-cost', results)}`);
process.exit(errs.length ? 1 : 0);
