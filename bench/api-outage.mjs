// Benchmark: the model API's failures (issue 34), through the real CLI and the real addon.
//
//   node bench/api-outage.mjs [--sessions=16] [--per-window=12] [--window-s=15] [--outage-s=20] [--long-outage-s=0]
//
//   1. pacing    `sessions` Implementors at once against a fake API that takes `per-window`
//                requests per `window-s` seconds (the account's rate limit, the API's 1 minute
//                shortened) and answers 429 with retry-after beyond it, sending the
//                anthropic-ratelimit-requests-* headers on every answer as the API does. Run twice
//                in one process, fleetPacing on and off: 429s the fake sent, wall time, sessions
//                completed.
//   2. recovery  one Implementor whose API is down (529, no retry-after) for `outage-s`: the time
//                from the API's recovery to the session's next model request (target: <= 2 s).
//   3. long      the same with an outage of `long-outage-s` (the 10 minutes: 600), when
//                given; too long for CI.
// The CLI's own retries are off (CLAUDE_CODE_MAX_RETRIES=0, as in the tests): what survives, the
// adapter made survive. Raw data goes to bench/results/.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addon } from '../__test__/support/harness.mjs';
import { offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { apiError, bash, reply, scenario, startFakeApi, structured } from '../__test__/support/fake-api.mjs';
import { agentsWithTools, makeTempRepo } from '../__test__/support/repo.mjs';
import { machine, printTable, saveResults, numberArg } from './support/common.mjs';

const SESSIONS = numberArg('sessions', 16);
const PER_WINDOW = numberArg('per-window', 12);
const WINDOW_S = numberArg('window-s', 15);
const OUTAGE_S = numberArg('outage-s', 20);
const LONG_OUTAGE_S = numberArg('long-outage-s', 0);

const done = structured({ role: 'implementor', outcome: 'completed', summary: 'done' });
const silent = { debug() {}, info() {}, warn() {}, error() {} };

/** A fleet's engine: one adapter over a fresh repository, the fake API at `api`. */
function engine(api, extra = {}) {
  const repo = makeTempRepo({ agents: agentsWithTools(['Bash']) });
  const scratch = mkdtempSync(join(tmpdir(), 'cra-bench-outage-'));
  const state = {
    workItems: new Map(Array.from({ length: SESSIONS }, (_, i) => [String(i + 1), { id: String(i + 1), title: `Item ${i + 1}`, status: 'in-progress', linkedRevision: null }])),
    revisions: new Map(),
    lastPlannedSHAs: new Map(),
  };
  const adapter = addon.createClaudeAdapter(
    {
      repoRoot: repo.root,
      defaultBranch: 'main',
      contextPaths: ['.claude/CLAUDE.md'],
      maxAgentDuration: 0,
      logging: { agentSessions: false, logsDir: join(scratch, 'logs') },
      bashValidatorHook: async () => ({ decision: 'approve' }),
      logger: silent,
      env: offlineCliEnv({ apiUrl: api.url, configDir: join(scratch, 'claude-config') }),
      worktreeSetupCommand: null,
      ...extra,
    },
    {
      workItemReader: { getWorkItemBody: async (id) => `Do item ${id}.` },
      revisionReader: { getRevisionFiles: async () => [] },
      getState: () => state,
      getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
    },
  );
  return {
    adapter,
    async close() {
      await adapter.shutdown();
      repo.cleanup();
      rmSync(scratch, { recursive: true, force: true });
    },
  };
}

/** An account's rate limit: `perWindow` main requests per window, 429 + retry-after beyond. */
function rateLimited(perWindow, windowS) {
  const counts = { ok: 0, limited: 0 };
  let windowStart = Date.now();
  let used = 0;
  const limit = (replyFor) => (body) => {
    const now = Date.now();
    if (now - windowStart >= windowS * 1000) {
      windowStart = now;
      used = 0;
    }
    const reset = new Date(windowStart + windowS * 1000).toISOString();
    const retryAfter = String(Math.max(1, Math.ceil((windowStart + windowS * 1000 - now) / 1000)));
    if (used >= perWindow) {
      counts.limited += 1;
      return { ...apiError(429, 'Number of requests has exceeded your rate limit'), headers: { 'retry-after': retryAfter, 'anthropic-ratelimit-requests-limit': String(perWindow), 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': reset } };
    }
    used += 1;
    counts.ok += 1;
    return { ...replyFor(body), headers: { 'anthropic-ratelimit-requests-limit': String(perWindow), 'anthropic-ratelimit-requests-remaining': String(perWindow - used), 'anthropic-ratelimit-requests-reset': reset } };
  };
  return { counts, limit };
}

async function pacingRun(pacing) {
  const { counts, limit } = rateLimited(PER_WINDOW, WINDOW_S);
  const steps = scenario.steps([reply(bash('echo work > w.txt && git add -A && git commit -qm w && echo ok')), done]);
  const api = await startFakeApi({ script: limit(steps) });
  const e = engine(api, { fleetPacing: pacing });
  const started = Date.now();
  try {
    const settled = await Promise.allSettled(
      Array.from({ length: SESSIONS }, async (_, i) => {
        const handle = await e.adapter.startAgent({ role: 'implementor', workItemID: String(i + 1), branchName: `wi-${i + 1}` });
        const [result, stats] = await Promise.all([handle.result, handle.stats]);
        return { ok: result.outcome === 'completed' && result.patch.includes('w.txt'), stats };
      }),
    );
    const completed = settled.filter((s) => s.status === 'fulfilled' && s.value.ok).length;
    const failures = settled.filter((s) => s.status === 'rejected').map((s) => s.reason?.message?.slice(0, 160));
    const retries = settled.reduce((n, s) => n + (s.status === 'fulfilled' ? s.value.stats.api.retries : 0), 0);
    return { pacing, completed, wallMs: Date.now() - started, limited: counts.limited, accepted: counts.ok, retries, failures };
  } finally {
    await e.close();
    await api.close();
  }
}

/** One Implementor whose API is down for `outageS` after its work step; the time from the
 * recovery to the next request the API received. */
async function recoveryRun(outageS) {
  const outage = { start: null, end: null, firstAfter: null, downReplies: 0 };
  const api = await startFakeApi({
    script: scenario.steps([
      reply(bash('echo work > w.txt && echo ok')),
      () => {
        const now = Date.now();
        outage.start ??= now;
        outage.end ??= outage.start + outageS * 1000;
        if (now < outage.end) {
          outage.downReplies += 1;
          return apiError(529, 'Overloaded');
        }
        outage.firstAfter ??= now;
        return done;
      },
    ]),
  });
  const e = engine(api);
  try {
    const handle = await e.adapter.startAgent({ role: 'implementor', workItemID: '1', branchName: 'wi-1' });
    const [result, stats] = await Promise.all([handle.result, handle.stats]);
    return {
      outageS,
      completed: result.outcome === 'completed',
      recoveryToNextRequestMs: outage.firstAfter - outage.end,
      failedAnswers: outage.downReplies,
      waitedMs: stats.api.waitedMs,
      resumes: stats.api.resumes,
    };
  } finally {
    await e.close();
    await api.close();
  }
}

console.log(`machine: ${JSON.stringify(machine())}`);
console.log(`pacing: ${SESSIONS} Implementors, the API takes ${PER_WINDOW} requests per ${WINDOW_S} s`);
const on = await pacingRun(true);
const off = await pacingRun(false);
printTable(
  ['fleetPacing', 'completed', '429s sent by the API', 'requests taken', 'held retries', 'wall time'],
  [on, off].map((r) => [r.pacing ? 'on' : 'off', `${r.completed}/${SESSIONS}`, String(r.limited), String(r.accepted), String(r.retries), `${(r.wallMs / 1000).toFixed(1)} s`]),
);
for (const r of [on, off]) if (r.failures.length) console.log(`failures with pacing ${r.pacing ? 'on' : 'off'}: ${r.failures.join(' | ')}`);
const recoveries = [await recoveryRun(OUTAGE_S)];
if (LONG_OUTAGE_S > 0) recoveries.push(await recoveryRun(LONG_OUTAGE_S));
printTable(
  ['outage', 'completed', 'recovery → next request', 'failed answers', 'held', 'resumes'],
  recoveries.map((r) => [`${r.outageS} s`, String(r.completed), `${r.recoveryToNextRequestMs} ms`, String(r.failedAnswers), `${(r.waitedMs / 1000).toFixed(1)} s`, String(r.resumes)]),
);
saveResults('api-outage', { machine: machine(), sessions: SESSIONS, perWindow: PER_WINDOW, windowS: WINDOW_S, pacing: { on, off }, recoveries });
