// Benchmark: what the adapter's own OpenTelemetry costs a session (issue 35).
//
//   node bench/otel.mjs [--n=8] [--rounds=3]
//
// The same sandboxed Planner session (the real CLI against the fake API: one Bash call, then
// the answer; 2 model requests, 2 tool calls, 6 steps) run n times in a worker process with
// no OTEL_* variable ("off") and in one exporting traces and metrics to a collector on
// 127.0.0.1 ("on": OTLP/HTTP protobuf, decoded by the official definitions; spans batched
// every 200 ms and metrics every second, so exports happen while sessions run). Rounds
// alternate which goes first. Figures: start → handle and start → result, medians over every
// round, the ratio on / off; and the exporter's threads in each process ("off" must have
// none: nothing is created when nothing is set).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { bash, reply, scenario, structured } from '../__test__/support/fake-api.mjs';
import { startFakeApi } from '../__test__/support/fake-api.mjs';
import { startCollector } from '../__test__/support/otlp-collector.mjs';
import { BENCH_DIR, fmtMs, machine, printTable, ratio, saveResults, summary } from './support/common.mjs';

const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? Number(a.slice(name.length + 3)) : dflt;
};
const N = arg('n', 8);
const ROUNDS = arg('rounds', 3);

function workerEnv(otel) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k.startsWith('ANTHROPIC_') || k.startsWith('CLAUDE_') || k.startsWith('OTEL_')) continue;
    env[k] = v;
  }
  return { ...env, ...otel };
}

function runWorker(label, otel, apiUrl) {
  return new Promise((resolve, reject) => {
    process.stderr.write(`  … ${label}\n`);
    const child = spawn(process.execPath, [join(BENCH_DIR, 'support', 'otel-worker.mjs'), JSON.stringify({ apiUrl, n: N })], { env: workerEnv(otel), stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => {
      const line = out.split('\n').find((l) => l.startsWith('@@RESULT '));
      if (!line) return reject(new Error(`worker ${label} failed (${code}):\n${err.slice(-3000)}`));
      resolve(JSON.parse(line.slice('@@RESULT '.length)));
    });
  });
}

const api = await startFakeApi({ keepBodies: false });
api.setScript(scenario.steps([reply(bash('echo x')), reply(structured({ role: 'planner', create: [], close: [], update: [] }))]));
const collector = await startCollector();
const ON = { OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_BSP_SCHEDULE_DELAY: '200', OTEL_METRIC_EXPORT_INTERVAL: '1000' };
const runs = { off: [], on: [] };
const results = { bench: 'otel', params: { N, ROUNDS }, machineStart: machine(), rounds: [] };
try {
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? ['off', 'on'] : ['on', 'off'];
    for (const side of order) {
      const got = await runWorker(`round ${r + 1} ${side}`, side === 'on' ? ON : {}, api.url);
      runs[side].push(got);
      results.rounds.push({ round: r + 1, side, ...got });
    }
  }
} finally {
  await api.close();
  await collector.close();
}
results.machineEnd = machine();
const all = (side, k) => runs[side].flatMap((w) => w[k]);
const spansReceived = collector.of('traces').reduce((n, e) => n + (e.decoded?.resourceSpans ?? []).flatMap((rs) => rs.scopeSpans ?? []).flatMap((ss) => ss.spans ?? []).length, 0);
results.summary = {
  handle: { off: summary(all('off', 'handle')), on: summary(all('on', 'handle')) },
  result: { off: summary(all('off', 'result')), on: summary(all('on', 'result')) },
  threads: { off: [...new Set(runs.off.flatMap((w) => w.threads))], on: [...new Set(runs.on.flatMap((w) => w.threads))] },
  exports: { traces: collector.of('traces').length, metrics: collector.of('metrics').length, spans: spansReceived },
};
const file = saveResults('otel', results);
const S = results.summary;
printTable(['figure', 'exporter on', 'off (no OTEL_*)', 'on / off'], [
  [`start → handle (median, n=${S.handle.on.n})`, fmtMs(S.handle.on.median), fmtMs(S.handle.off.median), ratio(S.handle.on.median, S.handle.off.median)],
  [`start → result (median, n=${S.result.on.n})`, fmtMs(S.result.on.median), fmtMs(S.result.off.median), ratio(S.result.on.median, S.result.off.median)],
  ['start → result (p95)', fmtMs(S.result.on.p95), fmtMs(S.result.off.p95), ratio(S.result.on.p95, S.result.off.p95)],
  ["the exporter's threads", S.threads.on.join(', ') || 'none', S.threads.off.join(', ') || 'none', null],
  ['exports received (traces / metrics), spans', `${S.exports.traces} / ${S.exports.metrics}, ${S.exports.spans}`, '0 / 0, 0', null],
]);
console.log(`\nload ${results.machineStart.loadavg.join(' ')} → ${results.machineEnd.loadavg.join(' ')}; raw: ${file}`);
