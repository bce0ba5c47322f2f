// Benchmark: sessions through the real Claude Code CLI, the adapter against the official SDK's
// query() driving the SAME CLI binary against the same fake Messages API.
//
//   node bench/session.mjs [--n=10] [--k=8] [--flood-mb=100] [--only=latency,memory,cancel,flood]
//
// Every measurement runs in a fresh `node --expose-gc` worker (bench/support/session-worker.mjs)
// so host RSS belongs to one implementation; the fake API runs here, in the parent, and cases
// run one after the other (never two workers at once). Figures:
//   1. latency  start → first output text, start → result (median, p95 over n; one warm-up run)
//   2. memory   host RSS per concurrent session, k sessions sitting in `echo x; sleep 20.<id>`
//   3. cancel   cancel → result settled, cancel → no process of the session left (/proc)
//   4. flood    relay throughput and host peak RSS for <flood-mb> MiB of assistant text
// A table with ratios (adapter / SDK) is printed at the end; raw data goes to bench/results/.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { bash, reply, scenario, structured, text, toolResults, userText, startFakeApi } from '../__test__/support/fake-api.mjs';
import { claudeBinaryPath, claudePackageVersion } from '../__test__/support/cli-env.mjs';
import { BENCH_DIR, fmtMiB, fmtMs, machine, MiB, printTable, processesWith, ratio, saveResults, arg, numberArg } from './support/common.mjs';

const N = numberArg('n', 10);
const K = numberArg('k', 8);
const FLOOD_MB = numberArg('flood-mb', 100);
const ONLY = arg('only', 'latency,memory,cancel,flood').split(',');

const cli = claudeBinaryPath();
const EMPTY_PLAN = { role: 'planner', create: [], close: [], update: [] };
const PLAN = { role: 'planner', create: [{ tempID: 't1', title: 'Do it', body: 'Body', labels: ['x'], blockedBy: [] }], close: [], update: [] };

/** First turn: `echo x; sleep <SLEEP from the spec>` when the prompt carries one; then the output. */
function sleepScript(body) {
  if (toolResults(body).length === 0) {
    const m = /SLEEP=([0-9.]+)/.exec(userText(body));
    if (m) return reply(bash(`echo x; sleep ${m[1]}`));
  }
  return reply(structured(EMPTY_PLAN));
}

const scripts = {
  latency: () => scenario.steps([reply(text('Planning.'), structured(PLAN))]),
  memory: () => sleepScript,
  cancel: () => sleepScript,
  flood: () => scenario.textFlood({ messages: FLOOD_MB, bytesPerMessage: MiB, output: EMPTY_PLAN }),
};

function workerEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k.startsWith('ANTHROPIC_') || k.startsWith('CLAUDE_')) continue;
    env[k] = v;
  }
  return env;
}

function runWorker(opts, timeoutMs = 15 * 60_000) {
  return new Promise((resolve, reject) => {
    const label = `${opts.case}/${opts.impl}${opts.logging === false ? ' (logging off)' : opts.case === 'flood' ? ' (logging on)' : ''}`;
    process.stderr.write(`  … ${label}\n`);
    const child = spawn(process.execPath, ['--expose-gc', join(BENCH_DIR, 'support', 'session-worker.mjs'), JSON.stringify(opts)], {
      env: workerEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      const line = out.split('\n').find((l) => l.startsWith('@@RESULT '));
      if (!line) return reject(new Error(`worker ${label} failed (code ${code}, signal ${signal}):\n${err.slice(-3000)}\n${out.slice(-2000)}`));
      if (err.trim()) process.stderr.write(err.replace(/^/gm, '    [worker] '));
      resolve(JSON.parse(line.slice('@@RESULT '.length)));
    });
  });
}

const api = await startFakeApi({ keepBodies: false });
const results = { bench: 'session', cli, cliVersion: claudePackageVersion(), sdkVersion: '0.3.330', params: { N, K, FLOOD_MB }, machineStart: machine(), cases: {} };
const base = { apiUrl: api.url, cli, n: N, k: K };

try {
  for (const c of ONLY) {
    api.setScript(scripts[c]());
    const variants = c === 'flood' ? [{ impl: 'adapter', logging: false }, { impl: 'adapter', logging: true }, { impl: 'sdk' }] : [{ impl: 'adapter', logging: true }, { impl: 'sdk' }];
    results.cases[c] = { machine: machine(), runs: {} };
    process.stderr.write(`case ${c} (load ${results.cases[c].machine.loadavg.join(' ')})\n`);
    for (const v of variants) {
      const key = v.impl === 'adapter' && c === 'flood' ? `adapter${v.logging ? '+log' : ''}` : v.impl;
      results.cases[c].runs[key] = await runWorker({ ...base, case: c, ...v });
    }
  }
} finally {
  await api.close();
}
results.machineEnd = machine();
const stray = processesWith(cli).map((p) => p.pid);
results.strayCliProcesses = stray;
const file = saveResults('session', results);

// ---------------------------------------------------------------- table
const rows = [];
const C = results.cases;
if (C.latency) {
  const a = C.latency.runs.adapter;
  const s = C.latency.runs.sdk;
  for (const [what, k] of [['first text', 'firstText'], ['result', 'result']]) {
    for (const st of ['median', 'p95']) rows.push([`1. start → ${what} (${st}, n=${a[k].n})`, fmtMs(a[k][st]), fmtMs(s[k][st]), ratio(a[k][st], s[k][st])]);
  }
  if (a.failures || s.failures) rows.push(['   failed runs', a.failures, s.failures, null]);
}
if (C.memory) {
  const a = C.memory.runs.adapter;
  const s = C.memory.runs.sdk;
  rows.push([`2. host RSS per session (k=${a.k})`, fmtMiB(a.perSession.rss), fmtMiB(s.perSession.rss), ratio(a.perSession.rss, s.perSession.rss)]);
  rows.push(['   JS heapUsed per session', fmtMiB(a.perSession.heapUsed), fmtMiB(s.perSession.heapUsed), ratio(a.perSession.heapUsed, s.perSession.heapUsed)]);
  rows.push(['   sessions running at measure', `${a.stillRunningAtMeasure}/${a.k}`, `${s.stillRunningAtMeasure}/${s.k}`, null]);
}
if (C.cancel) {
  const a = C.cancel.runs.adapter;
  const s = C.cancel.runs.sdk;
  for (const [what, k] of [['result settled / iterator ended', 'settled'], ['no process left', 'clean']]) {
    for (const st of ['median', 'p95']) rows.push([`3. cancel → ${what} (${st})`, fmtMs(a[k][st]), fmtMs(s[k][st]), ratio(a[k][st], s[k][st])]);
  }
  rows.push(['   runs with processes left after 10 s', `${a.orphanRuns}/${a.runs.length}`, `${s.orphanRuns}/${s.runs.length}`, null]);
}
if (C.flood) {
  const s = C.flood.runs.sdk;
  for (const key of ['adapter', 'adapter+log']) {
    const a = C.flood.runs[key];
    if (!a) continue;
    const tag = key === 'adapter' ? 'logging off' : 'logging on';
    rows.push([`4. relay ${FLOOD_MB} MiB, MiB/s (${tag})`, a.mibPerSec.toFixed(1), s.mibPerSec.toFixed(1), ratio(a.mibPerSec, s.mibPerSec)]);
    rows.push([`   host peak RSS growth (${tag})`, fmtMiB(a.peakGrowth), fmtMiB(s.peakGrowth), ratio(a.peakGrowth, s.peakGrowth)]);
    rows.push([`   host peak RSS abs. (${tag})`, fmtMiB(a.peakRssSampled), fmtMiB(s.peakRssSampled), ratio(a.peakRssSampled, s.peakRssSampled)]);
  }
  rows.push(['   bytes received', C.flood.runs.adapter?.bytes, s.bytes, null]);
}
console.log(`\nsession bench: CLI ${results.cliVersion}, SDK ${results.sdkVersion}, ${results.machineStart.cpus} CPUs, load ${results.machineStart.loadavg.join(' ')} → ${results.machineEnd.loadavg.join(' ')}`);
printTable(['figure', 'adapter', 'SDK query()', 'ratio'], rows);
console.log(`\nraw results: ${file}`);
if (stray.length) console.log(`WARNING: CLI processes still alive after the bench: ${stray.join(', ')}`);
