// One measurement of bench/session.mjs, in a process of its own so that the host RSS figures
// belong to one implementation only: `node --expose-gc session-worker.mjs '<json options>'`.
// Options: { case: 'latency'|'memory'|'cancel'|'flood', impl: 'adapter'|'sdk', apiUrl, cli,
//            n, k, logging }. Prints one line `@@RESULT <json>` at the end.
//
// Both implementations drive the same CLI binary against the same fake API with equivalent
// options: the planner agent inline (description, prompt, tools incl. StructuredOutput, model
// inherit), the planner JSON schema, no settings sources, bypassPermissions, a PreToolUse Bash
// hook that approves, the same env and cwd, and the same prompt (the SDK gets the adapter's
// previewPrompt, assembled before its clock starts). The fake API's script lives in the parent
// (bench/session.mjs); a spec file carries `SLEEP=<seconds>` when a session must sit in Bash.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { query } from '@anthropic-ai/claude-agent-sdk';
import addon from '../../index.js';
import { offlineCliEnv } from '../../__test__/support/cli-env.mjs';
import { makeTempRepo } from '../../__test__/support/repo.mjs';
import { alive, childrenWith, gc, MiB, procMemory, processesWith, quietLogger, sleep, summary } from './common.mjs';

const opts = JSON.parse(process.argv[2]);
const { impl, cli } = opts;

const PLANNER = {
  description: 'Plans work items from specs',
  tools: ['Bash', 'Read', 'Glob', 'Grep'],
  prompt: 'You are the planner.',
};

const repo = makeTempRepo({ agents: { planner: PLANNER } });
const scratch = mkdtempSync(join(tmpdir(), 'cra-bench-'));
const env = offlineCliEnv({ apiUrl: opts.apiUrl, configDir: join(scratch, 'claude-config'), extra: { HOME: scratch } });
let specCounter = 0;

/** A spec file for one session; `sleep` makes the fake API answer with `echo x; sleep <sleep>`. */
function specFile(sleepArg) {
  const rel = `specs/s${++specCounter}.md`;
  mkdirSync(join(repo.root, 'specs'), { recursive: true });
  writeFileSync(join(repo.root, rel), `# Spec ${specCounter}\n\n${sleepArg ? `SLEEP=${sleepArg}\n` : 'Plan it.\n'}`);
  return rel;
}

function adapterFor(logging) {
  const config = {
    repoRoot: repo.root,
    defaultBranch: 'main',
    contextPaths: [],
    maxAgentDuration: 0,
    logging: { agentSessions: logging, logsDir: join(scratch, 'logs') },
    bashValidatorHook: async () => ({ decision: 'approve' }),
    logger: quietLogger,
    env,
    claudeExecutable: cli,
    worktreeSetupCommand: null,
    // Like for like with the SDK's query(), which runs the CLI unsandboxed; what the sandbox
    // costs is bench/sandbox.mjs's figure.
    sandbox: false,
  };
  const deps = {
    workItemReader: { async getWorkItemBody() { return ''; } },
    revisionReader: { async getRevisionFiles() { return []; } },
    getState: () => ({ workItems: new Map(), revisions: new Map(), lastPlannedSHAs: new Map() }),
    getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
  };
  return addon.createClaudeAdapter(config, deps);
}

// The adapter also builds the SDK's prompt (previewPrompt runs nothing).
const adapter = adapterFor(opts.logging ?? true);

/**
 * Start one session. `onText(chunk, now)` sees every piece of assistant text.
 * Returns { settled: Promise<{ ok, value|error, at }>, done: Promise<at>, cancel(), startedAt }.
 * settled = adapter `result` / SDK `result` message (or the iterator ending without one);
 * done = the output iterable / SDK iterator ending.
 */
async function start(specRel, onText = () => {}) {
  const params = { role: 'planner', specPaths: [specRel] };
  if (impl === 'adapter') {
    const t0 = performance.now();
    const handle = await adapter.startAgent(params);
    const done = (async () => {
      for await (const chunk of handle.output) onText(chunk, performance.now());
      return performance.now();
    })();
    const settled = handle.result.then(
      (value) => ({ ok: true, value, at: performance.now() }),
      (error) => ({ ok: false, error: { code: error.code, message: String(error.message).slice(0, 300) }, at: performance.now() }),
    );
    return { t0, settled, done, cancel: () => adapter.cancelAgent(handle.sessionID), id: handle.sessionID, logFilePath: handle.logFilePath };
  }
  const prompt = await adapter.previewPrompt(params);
  const ac = new AbortController();
  const t0 = performance.now();
  const q = query({
    prompt,
    options: {
      abortController: ac,
      pathToClaudeCodeExecutable: cli,
      cwd: repo.root,
      env,
      agent: 'planner',
      agents: { planner: { ...PLANNER, tools: [...PLANNER.tools, 'StructuredOutput'], model: 'inherit' } },
      systemPrompt: '',
      outputFormat: { type: 'json_schema', schema: addon.outputSchemas.planner },
      settingSources: [],
      permissionMode: 'bypassPermissions',
      allowDangerouslySkipPermissions: true,
      hooks: { PreToolUse: [{ matcher: 'Bash', hooks: [async () => ({ continue: true })] }] },
    },
  });
  let resolveSettled;
  const settled = new Promise((r) => (resolveSettled = r));
  const done = (async () => {
    try {
      for await (const m of q) {
        if (m.type === 'assistant') {
          for (const b of m.message?.content ?? []) if (b.type === 'text') onText(b.text, performance.now());
        } else if (m.type === 'result') {
          const ok = m.subtype === 'success' && !m.is_error && m.structured_output != null;
          resolveSettled(ok ? { ok, value: m.structured_output, at: performance.now() } : { ok, error: { subtype: m.subtype, errors: m.errors }, at: performance.now() });
        }
      }
      resolveSettled({ ok: false, error: { message: 'iterator ended without a result' }, at: performance.now() });
    } catch (err) {
      resolveSettled({ ok: false, error: { name: err.name, message: String(err.message).slice(0, 300) }, at: performance.now() });
    }
    return performance.now();
  })();
  return { t0, settled, done, cancel: () => ac.abort(), id: null };
}

const cliChildren = () => childrenWith(cli).map((p) => p.pid);

async function waitFor(pred, timeoutMs, every = 20) {
  const end = performance.now() + timeoutMs;
  while (performance.now() < end) {
    if (pred()) return true;
    await sleep(every);
  }
  return pred();
}

function killAll(pids) {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
}

// ---------------------------------------------------------------- cases

async function latency() {
  const runs = [];
  for (let i = 0; i < opts.n + 1; i++) {
    let first = null;
    const s = await start(specFile(null), (_c, at) => (first ??= at));
    const r = await s.settled;
    const end = await s.done;
    if (i === 0) continue; // warm-up
    runs.push({ ok: r.ok, error: r.error, firstText: first - s.t0, result: r.at - s.t0, end: end - s.t0 });
  }
  return {
    runs,
    firstText: summary(runs.map((r) => r.firstText)),
    result: summary(runs.map((r) => r.result)),
    end: summary(runs.map((r) => r.end)),
    failures: runs.filter((r) => !r.ok).length,
  };
}

async function memory() {
  // warm-up: a batch of k concurrent sessions through Bash + hook + structured output, so that
  // heap, allocator arenas and thread pools are at their working size before the baseline
  const warm = await Promise.all(Array.from({ length: opts.k }, () => start(specFile('0.05'))));
  const wr = { ok: (await Promise.all(warm.map((w) => w.settled))).every((r) => r.ok) };
  await Promise.all(warm.map((w) => w.done));
  await waitFor(() => cliChildren().length === 0, 10_000);
  await sleep(500);
  gc();
  await sleep(300);
  gc();
  const before = process.memoryUsage();
  const base = procMemory();
  const markers = Array.from({ length: opts.k }, (_, i) => `20.${process.pid}${i}${Date.now() % 1000}`);
  const tStart = performance.now();
  const sessions = await Promise.all(markers.map((m) => start(specFile(m))));
  const allRunning = await waitFor(() => markers.every((m) => processesWith(`sleep ${m}`).length > 0), 60_000, 100);
  const startupMs = performance.now() - tStart;
  await sleep(1000);
  const samples = [];
  for (let i = 0; i < 5; i++) {
    gc();
    samples.push(process.memoryUsage());
    await sleep(200);
  }
  const stillRunning = markers.filter((m) => processesWith(`sleep ${m}`).length > 0).length;
  const during = samples.sort((a, b) => a.rss - b.rss)[2];
  const cliRss = cliChildren().map((pid) => procMemory(pid).rss);
  // tear down
  const cliPids = cliChildren();
  for (const s of sessions) s.cancel();
  await Promise.all(sessions.map((s) => s.settled));
  const clean = await waitFor(() => markers.every((m) => processesWith(`sleep ${m}`).length === 0) && cliPids.every((p) => !alive(p)), 15_000, 50);
  const leftovers = markers.flatMap((m) => processesWith(`sleep ${m}`).map((p) => p.pid)).concat(cliPids.filter(alive));
  killAll(leftovers);
  const d = (k) => during[k] - before[k];
  return {
    k: opts.k,
    warmupOk: wr.ok,
    allRunning,
    stillRunningAtMeasure: stillRunning,
    startupMs,
    before,
    during,
    perSession: { rss: d('rss') / opts.k, heapUsed: d('heapUsed') / opts.k, external: d('external') / opts.k, arrayBuffers: d('arrayBuffers') / opts.k },
    baseVmRss: base.rss,
    cliRssEachMiB: cliRss.map((x) => Math.round(x / MiB)),
    cleanAfterCancel: clean,
    leftoversKilled: leftovers.length,
  };
}

async function cancel() {
  const runs = [];
  for (let i = 0; i < opts.n + 1; i++) {
    const marker = `4${i}.${process.pid}${Date.now() % 100000}`;
    const s = await start(specFile(marker));
    const up = await waitFor(() => processesWith(`sleep ${marker}`).length > 0, 60_000, 20);
    const cliPids = cliChildren();
    const t0 = performance.now();
    s.cancel();
    const settledP = impl === 'adapter' ? s.settled : s.done;
    const r = await settledP;
    const tSettled = (typeof r === 'number' ? r : r.at) - t0;
    const isClean = () => processesWith(`sleep ${marker}`).length === 0 && cliPids.every((p) => !alive(p));
    const clean = await waitFor(isClean, 10_000, 5);
    const tClean = clean ? performance.now() - t0 : null;
    let leftovers = [];
    let cleanLate = null;
    if (!clean) {
      // report, then wait a bit longer to see whether they ever go, and kill them ourselves
      leftovers = processesWith(`sleep ${marker}`).map((p) => ({ pid: p.pid, cmd: p.cmd.slice(0, 120) }));
      for (const p of cliPids.filter(alive)) leftovers.push({ pid: p, cmd: 'CLI' });
      const late = await waitFor(isClean, 10_000, 50);
      cleanLate = late ? performance.now() - t0 : null;
      if (!late) killAll([...processesWith(`sleep ${marker}`).map((p) => p.pid), ...cliPids.filter(alive)]);
    }
    await s.done;
    // adapter: did the CLI answer the interrupt with a result before it was stopped? (the transcript says)
    let transcript;
    if (s.logFilePath) {
      const log = readFileSync(s.logFilePath, 'utf8');
      transcript = log.split('\n').filter((l) => /\[result\]|\[stderr\]|cancel|SIGTERM|exit/i.test(l)).slice(-8);
    }
    if (i === 0) continue; // warm-up
    runs.push({ transcript, up, cliPids, settled: tSettled, clean: tClean, outcome: typeof r === 'number' ? 'iterator ended' : r.ok ? 'resolved' : r.error, leftovers, cleanLate });
  }
  return {
    runs,
    settled: summary(runs.map((r) => r.settled)),
    clean: summary(runs.map((r) => r.clean)),
    orphanRuns: runs.filter((r) => r.clean == null).length,
  };
}

async function flood() {
  await sleep(300);
  gc();
  const base = procMemory();
  let peak = base.rss;
  const timer = setInterval(() => {
    const { rss } = procMemory();
    if (rss > peak) peak = rss;
  }, 20);
  let bytes = 0;
  let first = null;
  let last = null;
  let chunks = 0;
  const s = await start(specFile(null), (c, at) => {
    first ??= at;
    last = at;
    bytes += c.length;
    chunks += 1;
  });
  const end = await s.done;
  const r = await s.settled;
  clearInterval(timer);
  const hwm = procMemory().hwm;
  return {
    ok: r.ok,
    error: r.error,
    bytes,
    chunks,
    logging: opts.logging,
    firstMs: first - s.t0,
    consumeMs: end - first,
    lastTextMs: last - first,
    mibPerSec: bytes / MiB / ((end - first) / 1000),
    mibPerSecToLastText: bytes / MiB / ((last - first) / 1000),
    totalMs: r.at - s.t0,
    baseRss: base.rss,
    peakRssSampled: peak,
    peakGrowth: peak - base.rss,
    vmHwm: hwm,
  };
}

const cases = { latency, memory, cancel, flood };
let result;
try {
  result = await cases[opts.case]();
} finally {
  await adapter.shutdown().catch(() => {});
  repo.cleanup();
  rmSync(scratch, { recursive: true, force: true });
}
process.stdout.write(`@@RESULT ${JSON.stringify({ case: opts.case, impl, ...result })}\n`);
process.exit(0);
