// An engine in a child Node process, which a test SIGKILLs to see what a dead engine leaves
// behind and what the next adapter does with it.
import { spawn } from 'node:child_process';
import { join } from 'node:path';

/**
 * Starts a Node process that creates an adapter from harness `h`'s config (an approving hook, a
 * silent logger) and starts one session with `params` (an Implementor works on item 7).
 * Resolves, once `startAgent` has, with the process and the session's transcript path; the
 * process is pushed onto `engines` for the test's afterEach to kill whatever happened.
 */
export async function engineProcess(h, params, engines) {
  const engine = spawn(process.execPath, ['-e', `
    const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
    const noop = () => {};
    const config = { ...${JSON.stringify({ ...h.config, bashValidatorHook: undefined, logger: undefined })},
      bashValidatorHook: async () => ({ decision: 'approve' }), logger: { debug: noop, info: noop, error: noop, warn: noop } };
    const adapter = createClaudeAdapter(config, {
      workItemReader: { getWorkItemBody: async () => 'x' }, revisionReader: { getRevisionFiles: async () => [] },
      getState: () => ({ workItems: { 7: { id: '7', title: 'Seven', status: 'open', linkedRevision: null } }, revisions: {}, lastPlannedSHAs: {} }),
      getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
    adapter.startAgent(${JSON.stringify(params)}).then((h) => console.log(JSON.stringify({ log: h.logFilePath })));
    setInterval(noop, 1000);
  `], { stdio: ['ignore', 'pipe', 'inherit'] });
  engines.push(engine);
  const log = await new Promise((resolve, reject) => {
    engine.stdout.on('data', (d) => resolve(JSON.parse(d.toString()).log));
    engine.on('exit', (code) => reject(new Error(`engine exited ${code}`)));
  });
  return { engine, log };
}
