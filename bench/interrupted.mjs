// Benchmark: what an engine restart costs an Implementor, continued (resumeInterrupted, issue 48)
// against started over (resumeInterrupted: 0), in one run.
//
//   node bench/interrupted.mjs [--n=5] [--kube]
//
// --kube: the sessions run in pods of the cluster KUBECONFIG names, in image CRA_KUBE_IMAGE
// (`scripts/kube-ci.sh prepare` makes both): continued in the interrupted session's pod, or
// started over in a new one.
//
// Each round runs the same Implementor twice (the real CLI, sandboxed, against the fake API): five
// steps, each a Bash call that writes, commits and prints a file of ~12 KB, and the engine process
// is SIGKILLed during the fifth (its command running). A new adapter then dispatches the same work
// item on the same branch: once with continuation on, once with it off (both engines' config),
// the two orders alternating. Figures: the tokens the fake API billed for the re-dispatched run
// (input + output of every main-loop request after the kill, the fake API's count: 4 characters a
// token), continued / started over; model requests after the kill; and the time from the restarted
// engine's startAgent to the re-dispatched run's first model request.
import { bash, reply, scenario, structured } from '../__test__/support/fake-api.mjs';
import { engineProcess } from '../__test__/support/engine-process.mjs';
import { setup, sleepMarker } from '../__test__/support/harness.mjs';
import { agentsWithTools } from '../__test__/support/repo.mjs';
import { fmtMs, machine, median, printTable, ratio, saveResults, numberArg } from './support/common.mjs';

const N = numberArg('n', 5);
const KUBE = process.argv.includes('--kube');
if (KUBE && !(process.env.KUBECONFIG && process.env.CRA_KUBE_IMAGE)) throw new Error('--kube needs KUBECONFIG and CRA_KUBE_IMAGE');
const kube = {
  repo: { agents: agentsWithTools(['Bash']) },
  backend: { kubernetes: { namespace: 'default', image: process.env.CRA_KUBE_IMAGE, imagePullPolicy: 'IfNotPresent', kubeconfig: process.env.KUBECONFIG } },
};
const STEPS = 5;

/** The fake API's token count of a request (its usage: 4 characters a token) plus its answer's. */
const tokensOf = (body) => Math.round((JSON.stringify(body?.messages ?? []).length + JSON.stringify(body?.system ?? '').length) / 4) + 50;

const waitFor = async (cond, ms) => {
  for (const end = Date.now() + ms; Date.now() < end && !cond(); ) await new Promise((r) => setTimeout(r, 25));
  return cond();
};

async function round(continued) {
  const config = { ...(continued ? {} : { resumeInterrupted: 0 }), ...(KUBE ? { backend: kube.backend } : {}) };
  const h = await setup({
    ...(KUBE ? { repo: kube.repo } : {}),
    state: { workItems: new Map([['7', { id: '7', title: 'Seven', status: 'in-progress', linkedRevision: null }]]), revisions: new Map(), lastPlannedSHAs: new Map() },
    bodies: { 7: 'Write five files, one a step, committing each.' },
    config,
  });
  const engines = [];
  try {
    const marker = sleepMarker(300);
    let killed = false;
    const step = (i) => bash(`seq ${i}0000 ${i}2500 > f${i}.txt && git add -A && git commit -qm f${i} && cat f${i}.txt`);
    h.api.setScript(
      scenario.steps([
        ...Array.from({ length: STEPS - 1 }, (_, i) => step(i)),
        () => (killed ? step(STEPS - 1) : bash(`echo step ${STEPS} && sleep ${marker}`)),
        reply(structured({ role: 'implementor', outcome: 'completed', summary: 'done' })),
      ]),
    );
    const { engine } = await engineProcess(h, { role: 'implementor', workItemID: '7', branchName: 'wi-7' }, engines);
    const running = () => h.api.mainRequests().length >= STEPS;
    if (!(await waitFor(running, 120_000))) throw new Error('the first run never reached its last step');
    await new Promise((r) => setTimeout(r, 300));
    engine.kill('SIGKILL');
    await new Promise((r) => (engine.exitCode !== null || engine.signalCode ? r() : engine.on('exit', r)));
    killed = true;
    const asked = h.api.mainRequests().length;
    const adapter = h.adapter();
    const t0 = Date.now();
    const handle = await adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    const result = await handle.result;
    const stats = await handle.stats;
    await adapter.shutdown({ keepBases: false });
    if (result.outcome !== 'completed' || (stats.continuedFrom !== null) !== continued) throw new Error(`unexpected end: ${JSON.stringify({ result, stats })}`);
    const after = h.api.mainRequests().slice(asked);
    return {
      tokens: after.reduce((sum, r) => sum + tokensOf(r.body), 0),
      requests: after.length,
      firstRequestMs: after[0].at - t0,
    };
  } finally {
    for (const e of engines) e.kill('SIGKILL');
    await h.cleanup();
  }
}

const results = { bench: KUBE ? 'interrupted-kube' : 'interrupted', params: { N, STEPS, kube: KUBE }, machineStart: machine(), continued: [], restarted: [] };
for (let i = 0; i < N; i++) {
  process.stderr.write(`  … round ${i + 1}/${N}\n`);
  for (const continued of i % 2 === 0 ? [true, false] : [false, true]) results[continued ? 'continued' : 'restarted'].push(await round(continued));
}
results.machineEnd = machine();
const med = (side, k) => median(results[side].map((r) => r[k]));
const S = {
  tokens: { continued: med('continued', 'tokens'), restarted: med('restarted', 'tokens') },
  requests: { continued: med('continued', 'requests'), restarted: med('restarted', 'requests') },
  firstRequestMs: { continued: med('continued', 'firstRequestMs'), restarted: med('restarted', 'firstRequestMs') },
};
results.summary = S;
const file = saveResults(results.bench, results);
printTable(['figure (median)', 'continued', 'started over', 'continued / over'], [
  [`tokens billed after the restart (n=${N})`, String(S.tokens.continued), String(S.tokens.restarted), ratio(S.tokens.continued, S.tokens.restarted)],
  ['model requests after the restart', String(S.requests.continued), String(S.requests.restarted), ratio(S.requests.continued, S.requests.restarted)],
  ['startAgent → first model request', fmtMs(S.firstRequestMs.continued), fmtMs(S.firstRequestMs.restarted), ratio(S.firstRequestMs.continued, S.firstRequestMs.restarted)],
]);
console.log(`\nload ${results.machineStart.loadavg.join(' ')} → ${results.machineEnd.loadavg.join(' ')}; raw: ${file}`);
