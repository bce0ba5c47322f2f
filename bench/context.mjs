// Benchmark: planner context assembly through previewPrompt with many work items.
//
//   node bench/context.mjs [--items=1000] [--delay=5] [--runs=5]
//
// A provider class whose getWorkItemBody resolves after <delay> ms (a method using `this`, like
// the engine's providers) counts calls in flight. With the default contextConcurrency (16) the
// lower bound is items × delay / 16; the wall time should stay within 1.5× of it.
import { performance } from 'node:perf_hooks';
import addon from '../index.js';
import { makeTempRepo } from '../__test__/support/repo.mjs';
import { fmtMs, machine, median, printTable, quietLogger, saveResults, numberArg } from './support/common.mjs';

const ITEMS = numberArg('items', 1000);
const DELAY = numberArg('delay', 5);
const RUNS = numberArg('runs', 5);
const CONCURRENCY = 16; // the documented default; not passed in the config

class SlowWorkItemProvider {
  constructor(delayMs) {
    this.delayMs = delayMs;
    this.calls = 0;
    this.inFlight = 0;
    this.peak = 0;
  }
  async getWorkItemBody(id) {
    this.calls += 1;
    this.inFlight += 1;
    if (this.inFlight > this.peak) this.peak = this.inFlight;
    try {
      await new Promise((r) => setTimeout(r, this.delayMs));
      return `Body of work item ${id}.\n`;
    } finally {
      this.inFlight -= 1;
    }
  }
  reset() {
    this.calls = 0;
    this.peak = 0;
  }
}

const repo = makeTempRepo({ files: { 'specs/a.md': '# Spec A\n\nSomething to plan.\n' } });
const workItems = new Map(
  Array.from({ length: ITEMS }, (_, i) => [String(i + 1), { id: String(i + 1), title: `Item ${i + 1}`, status: 'open', linkedRevision: null }]),
);
const provider = new SlowWorkItemProvider(DELAY);
const adapter = addon.createClaudeAdapter(
  {
    repoRoot: repo.root,
    defaultBranch: 'main',
    contextPaths: ['.claude/CLAUDE.md'],
    maxAgentDuration: 0,
    logging: { agentSessions: false, logsDir: '' },
    bashValidatorHook: async () => ({ decision: 'approve' }),
    logger: quietLogger,
    worktreeSetupCommand: null,
  },
  {
    workItemReader: provider,
    revisionReader: { async getRevisionFiles() { return []; } },
    getState: () => ({ workItems, revisions: new Map(), lastPlannedSHAs: new Map() }),
    getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
  },
);

const bound = (ITEMS * DELAY) / CONCURRENCY;
const runs = [];
let promptChars = 0;
try {
  for (let i = 0; i < RUNS + 1; i++) {
    provider.reset();
    const t0 = performance.now();
    const prompt = await adapter.previewPrompt({ role: 'planner', specPaths: ['specs/a.md'] });
    const wall = performance.now() - t0;
    promptChars = prompt.length;
    if (!prompt.includes(`Body of work item ${ITEMS}.`)) throw new Error('the prompt lacks the last work item body');
    if (i === 0) continue; // warm-up
    runs.push({ wall, calls: provider.calls, peak: provider.peak });
  }
} finally {
  await adapter.shutdown();
  repo.cleanup();
}

// setTimeout(5) itself takes a little over 5 ms; measure it to separate timer slack from the adapter.
const timerSamples = [];
for (let i = 0; i < 50; i++) {
  const t = performance.now();
  await new Promise((r) => setTimeout(r, DELAY));
  timerSamples.push(performance.now() - t);
}
const timerMs = median(timerSamples);

const wallMedian = median(runs.map((r) => r.wall));
const result = {
  bench: 'context',
  machine: machine(),
  params: { ITEMS, DELAY, RUNS, CONCURRENCY },
  runs,
  promptChars,
  boundMs: bound,
  wallMedianMs: wallMedian,
  ratioToBound: wallMedian / bound,
  measuredTimerMs: timerMs,
  boundWithMeasuredTimerMs: (ITEMS * timerMs) / CONCURRENCY,
};
const file = saveResults('context', result);
console.log(`\ncontext bench: previewPrompt(planner), ${ITEMS} work items, getWorkItemBody ${DELAY} ms, contextConcurrency default ${CONCURRENCY}; load ${result.machine.loadavg.join(' ')}`);
printTable(
  ['figure', 'value'],
  [
    [`wall time (median of ${RUNS}, 1 warm-up)`, fmtMs(wallMedian)],
    ['wall time min / max', `${fmtMs(Math.min(...runs.map((r) => r.wall)))} / ${fmtMs(Math.max(...runs.map((r) => r.wall)))}`],
    ['peak calls in flight (max over runs)', Math.max(...runs.map((r) => r.peak))],
    ['calls per run', runs[0].calls],
    [`bound ${ITEMS} × ${DELAY} ms / ${CONCURRENCY}`, fmtMs(bound)],
    ['ratio wall / bound (expected ≤ 1.5)', `${result.ratioToBound.toFixed(2)}x`],
    [`measured setTimeout(${DELAY}) median`, fmtMs(timerMs)],
    ['bound with the measured timer', fmtMs(result.boundWithMeasuredTimerMs)],
    ['prompt length', `${promptChars} chars`],
  ],
);
console.log(`\nraw results: ${file}`);
