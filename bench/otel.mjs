// Benchmark: what the adapter's own OpenTelemetry costs a session (issue 35).
//
//   node bench/otel.mjs [--n=30]
//
// The same sandboxed Planner session (the real CLI against the fake API: one Bash call, then
// the answer; 2 model requests, 2 tool calls, 6 steps) in two worker processes alive side by
// side: one with no OTEL_* variable ("off"), one exporting traces and metrics to a collector on
// 127.0.0.1 ("on": OTLP/HTTP protobuf, decoded by the official definitions; spans batched every
// 200 ms and metrics every second, so exports happen while sessions run). The parent asks them
// for one session at a time, in turn (which goes first alternates), so a change of the
// machine's load falls on both alike. Figures: start → handle and start → result (median and
// p95 of n each, after one warm-up each), the ratio on / off, the median of the n paired
// ratios; and the exporter's threads in each process ("off" must have none: nothing is
// created when nothing is set).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { bash, reply, scenario, startFakeApi, structured } from '../__test__/support/fake-api.mjs';
import { startCollector } from '../__test__/support/otlp-collector.mjs';
import { BENCH_DIR, fmtMs, machine, median, printTable, ratio, saveResults, summary, numberArg } from './support/common.mjs';

const N = numberArg('n', 30);

function workerEnv(otel) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k.startsWith('ANTHROPIC_') || k.startsWith('CLAUDE_') || k.startsWith('OTEL_')) continue;
    env[k] = v;
  }
  return { ...env, ...otel };
}

/** A worker: `run()` resolves with one session's figures, `end()` with its threads. */
function startWorker(label, otel, apiUrl) {
  const child = spawn(process.execPath, [join(BENCH_DIR, 'support', 'otel-worker.mjs'), JSON.stringify({ apiUrl })], { env: workerEnv(otel), stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  const waiting = [];
  child.stderr.on('data', (d) => (err += d));
  child.stdout.on('data', (d) => {
    out += d;
    let nl;
    while ((nl = out.indexOf('\n')) >= 0) {
      const line = out.slice(0, nl);
      out = out.slice(nl + 1);
      const m = /^@@(SESSION|RESULT) (.*)$/.exec(line);
      if (m) waiting.shift()?.resolve(JSON.parse(m[2]));
    }
  });
  child.on('exit', (code) => {
    for (const w of waiting.splice(0)) w.reject(new Error(`worker ${label} exited (${code}):\n${err.slice(-3000)}`));
  });
  const ask = (command) =>
    new Promise((resolve, reject) => {
      waiting.push({ resolve, reject });
      child.stdin.write(`${command}\n`);
    });
  return { run: () => ask('run'), end: () => ask('end') };
}

const api = await startFakeApi({ keepBodies: false });
api.setScript(scenario.steps([reply(bash('echo x')), reply(structured({ role: 'planner', create: [], close: [], update: [] }))]));
const collector = await startCollector();
const ON = { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_BSP_SCHEDULE_DELAY: '200', OTEL_METRIC_EXPORT_INTERVAL: '1000' };
const results = { bench: 'otel', params: { N }, machineStart: machine(), sessions: { off: [], on: [] } };
const workers = { off: startWorker('off', {}, api.url), on: startWorker('on', ON, api.url) };
let threads;
try {
  await workers.off.run();
  await workers.on.run();
  for (let i = 0; i < N; i++) {
    process.stderr.write(`  … session ${i + 1}/${N}\n`);
    for (const side of i % 2 === 0 ? ['off', 'on'] : ['on', 'off']) results.sessions[side].push(await workers[side].run());
  }
  threads = { off: (await workers.off.end()).threads, on: (await workers.on.end()).threads };
} finally {
  await api.close();
  await collector.close();
}
results.machineEnd = machine();
const all = (side, k) => results.sessions[side].map((x) => x[k]);
const paired = (k) => median(results.sessions.on.map((x, i) => x[k] / results.sessions.off[i][k]));
const spansReceived = collector.of('traces').reduce((n, e) => n + (e.decoded?.resourceSpans ?? []).flatMap((rs) => rs.scopeSpans ?? []).flatMap((ss) => ss.spans ?? []).length, 0);
results.summary = {
  handle: { off: summary(all('off', 'handle')), on: summary(all('on', 'handle')) },
  result: { off: summary(all('off', 'result')), on: summary(all('on', 'result')) },
  paired: { handle: paired('handle'), result: paired('result') },
  threads,
  exports: { traces: collector.of('traces').length, metrics: collector.of('metrics').length, spans: spansReceived },
};
const file = saveResults('otel', results);
const S = results.summary;
printTable(['figure', 'exporter on', 'off (no OTEL_*)', 'on / off'], [
  [`start → handle (median, n=${S.handle.on.n})`, fmtMs(S.handle.on.median), fmtMs(S.handle.off.median), ratio(S.handle.on.median, S.handle.off.median)],
  [`start → result (median, n=${S.result.on.n})`, fmtMs(S.result.on.median), fmtMs(S.result.off.median), ratio(S.result.on.median, S.result.off.median)],
  ['start → result (p95)', fmtMs(S.result.on.p95), fmtMs(S.result.off.p95), ratio(S.result.on.p95, S.result.off.p95)],
  ['median of the paired ratios (handle / result)', null, null, `${S.paired.handle.toFixed(3)}x / ${S.paired.result.toFixed(3)}x`],
  ["the exporter's threads", S.threads.on.join(', ') || 'none', S.threads.off.join(', ') || 'none', null],
  ['exports received (traces / metrics), spans', `${S.exports.traces} / ${S.exports.metrics}, ${S.exports.spans}`, '0 / 0, 0', null],
]);
console.log(`\nload ${results.machineStart.loadavg.join(' ')} → ${results.machineEnd.loadavg.join(' ')}; raw: ${file}`);
