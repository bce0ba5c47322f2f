// One side of bench/otel.mjs, in a process of its own (the exporter is the process's):
// `node otel-worker.mjs '<json options>'` with `{ apiUrl, n }`; the OTEL_* variables, or none,
// come from the parent. Runs one warm-up and n sandboxed Planner sessions (one Bash call, then
// the answer) one after the other, and prints `@@RESULT <json>`: start → handle and start →
// result per session, and the process's threads of the exporter.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import addon from '../../index.js';
import { offlineCliEnv } from '../../__test__/support/cli-env.mjs';
import { makeTempRepo } from '../../__test__/support/repo.mjs';
import { quietLogger } from './common.mjs';

const opts = JSON.parse(process.argv[2]);
const repo = makeTempRepo({ agents: { planner: { description: 'Plans', tools: ['Bash', 'Read'], prompt: 'You are the planner.' } } });
const scratch = mkdtempSync(join(tmpdir(), 'cra-bench-otel-'));
const env = offlineCliEnv({ apiUrl: opts.apiUrl, configDir: join(scratch, 'claude-config'), extra: { HOME: scratch } });
const adapter = addon.createClaudeAdapter(
  {
    repoRoot: repo.root,
    defaultBranch: 'main',
    contextPaths: [],
    maxAgentDuration: 0,
    logging: { agentSessions: false },
    bashValidatorHook: async () => ({ decision: 'approve' }),
    logger: quietLogger,
    env,
    worktreeSetupCommand: null,
    sandbox: {},
  },
  { getState: () => ({ workItems: new Map(), revisions: new Map(), lastPlannedSHAs: new Map() }), workItemReader: { getWorkItemBody: async () => '' }, revisionReader: { getRevisionFiles: async () => [] }, getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) },
);

/** The exporter's threads (the SDK's batch processor and periodic reader, the export runtime). */
const exporterThreads = () =>
  readdirSync('/proc/self/task')
    .map((t) => {
      try {
        return readFileSync(`/proc/self/task/${t}/comm`, 'utf8').trim();
      } catch {
        return '';
      }
    })
    .filter((name) => /OpenTelemetry|otel/i.test(name));

const handle = [];
const result = [];
try {
  for (let i = 0; i <= opts.n; i++) {
    const t0 = performance.now();
    const h = await adapter.startAgent({ role: 'planner', specPaths: [] });
    const t1 = performance.now();
    await h.result;
    const t2 = performance.now();
    if (i > 0) {
      handle.push(t1 - t0);
      result.push(t2 - t0);
    }
  }
  const threads = exporterThreads();
  await adapter.shutdown();
  console.log(`@@RESULT ${JSON.stringify({ handle, result, threads })}`);
} finally {
  repo.cleanup();
  rmSync(scratch, { recursive: true, force: true });
}
