// Benchmark: what the audit record (config.audit, issue 50) costs a session.
//
//   node bench/audit.mjs [--n=20]
//
// The same sandboxed Implementor session (the real CLI against the fake API: a Bash call that
// writes and commits a file, then the answer; 2 model requests, 1 tool call) from two adapters
// in one process on one repository: one with a signed audit record, one without. The sessions
// alternate (which goes first alternates too), so a change of the machine's load falls on both
// alike. Figures: start → result (median and p95 of n each, after one warm-up each), the ratio
// on / off, the median of the n paired ratios (target: within 2 %), and the record's size: bytes
// per session and per model request.
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bash, reply, scenario, structured } from '../__test__/support/fake-api.mjs';
import { addon, setup } from '../__test__/support/harness.mjs';
import { fmtMs, machine, median, printTable, ratio, saveResults, summary, numberArg } from './support/common.mjs';

const N = numberArg('n', 20);

const items = Array.from({ length: 2 * N + 2 }, (_, i) => ({ id: String(i), title: `Item ${i}`, status: 'in-progress', linkedRevision: null }));
const h = await setup({
  state: { workItems: new Map(items.map((w) => [w.id, w])), revisions: new Map(), lastPlannedSHAs: new Map() },
  bodies: Object.fromEntries(items.map((w) => [w.id, `Add file ${w.id}.`])),
  script: scenario.steps([
    reply(bash('echo work > work.txt && git add -A && git commit -qm work')),
    reply(structured({ role: 'implementor', outcome: 'completed', summary: 'done' })),
  ]),
});
const { privateKey } = generateKeyPairSync('ed25519');
const dir = mkdtempSync(join(tmpdir(), 'cra-bench-audit-'));
const adapters = {
  off: h.adapter(),
  on: addon.createClaudeAdapter({ ...h.config, audit: { dir, signingKey: privateKey.export({ type: 'pkcs8', format: 'pem' }) } }, h.deps),
};
const results = { bench: 'audit', params: { N }, machineStart: machine(), sessions: { off: [], on: [] }, records: [] };
let next = 0;
async function run(side) {
  const id = String(next++);
  const t0 = performance.now();
  const handle = await adapters[side].startAgent({ role: 'implementor', workItemID: id, branchName: `bench-audit-${id}` });
  const result = await handle.result;
  const ms = performance.now() - t0;
  if (result.outcome !== 'completed') throw new Error(`session ${id} (${side}): ${JSON.stringify(result)}`);
  if (handle.auditRecordPath) {
    const lines = readFileSync(handle.auditRecordPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const verdict = await addon.verifyAuditRecord(handle.auditRecordPath, { patch: result.patch });
    if (!verdict.ok) throw new Error(`record ${handle.auditRecordPath}: ${verdict.reason}`);
    results.records.push({ bytes: statSync(handle.auditRecordPath).size, entries: lines.length, requests: lines.filter((e) => e.kind === 'model_request').length });
  }
  return ms;
}
try {
  await run('off');
  await run('on');
  results.records = [];
  for (let i = 0; i < N; i++) {
    process.stderr.write(`  … session ${i + 1}/${N}\n`);
    for (const side of i % 2 === 0 ? ['off', 'on'] : ['on', 'off']) results.sessions[side].push(await run(side));
  }
} finally {
  await Promise.all([adapters.on.shutdown({ keepBases: false }), adapters.off.shutdown({ keepBases: false })]);
  await h.cleanup();
}
results.machineEnd = machine();
const S = {
  on: summary(results.sessions.on),
  off: summary(results.sessions.off),
  paired: median(results.sessions.on.map((x, i) => x / results.sessions.off[i])),
  bytes: median(results.records.map((r) => r.bytes)),
  perRequest: median(results.records.map((r) => r.bytes / Math.max(1, r.requests))),
  entries: median(results.records.map((r) => r.entries)),
};
results.summary = S;
const file = saveResults('audit', results);
printTable(['figure', 'record on', 'off', 'on / off'], [
  [`start → result (median, n=${S.on.n})`, fmtMs(S.on.median), fmtMs(S.off.median), ratio(S.on.median, S.off.median)],
  ['start → result (p95)', fmtMs(S.on.p95), fmtMs(S.off.p95), ratio(S.on.p95, S.off.p95)],
  ['median of the paired ratios', null, null, `${S.paired.toFixed(3)}x`],
  ['record: bytes a session (median), entries', `${S.bytes} B, ${S.entries}`, null, null],
  ['record: bytes per model request (median)', `${Math.round(S.perRequest)} B`, null, null],
]);
console.log(`\nload ${results.machineStart.loadavg.join(' ')} → ${results.machineEnd.loadavg.join(' ')}; raw: ${file}`);
