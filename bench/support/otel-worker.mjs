// One side of bench/otel.mjs, in a process of its own (the exporter is the process's):
// `node otel-worker.mjs '<json options>'` with `{ apiUrl }`; the OTEL_* variables, or none,
// come from the parent. For each line `run` on stdin it runs one sandboxed Planner session (one
// Bash call, then the answer) and prints `@@SESSION {handle, result}` (ms from startAgent);
// on `end`, `@@RESULT {threads}` (the process's threads of the exporter), then it exits.
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

let lines = '';
process.stdin.setEncoding('utf8');
try {
  for await (const chunk of process.stdin) {
    lines += chunk;
    let nl;
    while ((nl = lines.indexOf('\n')) >= 0) {
      const command = lines.slice(0, nl).trim();
      lines = lines.slice(nl + 1);
      if (command === 'run') {
        const t0 = performance.now();
        const h = await adapter.startAgent({ role: 'planner', specPaths: [] });
        const t1 = performance.now();
        await h.result;
        console.log(`@@SESSION ${JSON.stringify({ handle: t1 - t0, result: performance.now() - t0 })}`);
      } else if (command === 'end') {
        const threads = exporterThreads();
        await adapter.shutdown();
        console.log(`@@RESULT ${JSON.stringify({ threads })}`);
        process.stdin.destroy();
      }
    }
  }
} finally {
  repo.cleanup();
  rmSync(scratch, { recursive: true, force: true });
}
