// An engine in a child Node process, which a test SIGKILLs to see what a dead engine leaves
// behind and what the next adapter does with it.
import { spawn } from 'node:child_process';
import { join } from 'node:path';

/** SIGKILLs the engine processes a test started (whatever happened to it), emptying `engines`. */
export function killAll(engines) {
  for (const e of engines.splice(0)) e.kill('SIGKILL');
}

/**
 * Starts a Node process that creates an adapter from harness `h`'s config (an approving hook, a
 * silent logger) and starts one session with `params` (an Implementor works on item 7).
 * Resolves, once `startAgent` has, with the process and the session's transcript and audit
 * record paths (`audit`: null without `config.audit`); the process is pushed onto `engines` for
 * the test's afterEach to kill whatever happened. With `params` a list, its sessions start at
 * once, and `logs` lists their transcripts in its order. With `hostname`, the process runs in
 * a UTS namespace of its own under that name: an engine on another host, as its owner records
 * say.
 */
export async function engineProcess(h, params, engines, { hostname } = {}) {
  const argv = [process.execPath, '-e', `
    const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
    const noop = () => {};
    const config = { ...${JSON.stringify({ ...h.config, bashValidatorHook: undefined, logger: undefined })},
      bashValidatorHook: async () => ({ decision: 'approve' }), logger: { debug: noop, info: noop, error: noop, warn: noop } };
    const adapter = createClaudeAdapter(config, {
      workItemReader: { getWorkItemBody: async () => 'x' }, revisionReader: { getRevisionFiles: async () => [] },
      getState: () => ({ workItems: { 7: { id: '7', title: 'Seven', status: 'open', linkedRevision: null } }, revisions: {}, lastPlannedSHAs: {} }),
      getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
    const params = ${JSON.stringify(params)};
    if (Array.isArray(params)) Promise.all(params.map((p) => adapter.startAgent(p))).then((hs) => console.log(JSON.stringify({ logs: hs.map((h) => h.logFilePath) })));
    else adapter.startAgent(params).then((h) => console.log(JSON.stringify({ log: h.logFilePath, audit: h.auditRecordPath })));
    setInterval(noop, 1000);
  `];
  // unshare and sh exec: the process's pid is the engine's.
  const [program, ...args] = hostname ? ['unshare', '--uts', 'sh', '-c', 'hostname "$0" && exec "$@"', hostname, ...argv] : argv;
  const engine = spawn(program, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  engines.push(engine);
  let out = '';
  const { log, audit, logs } = await new Promise((resolve, reject) => {
    engine.stdout.on('data', (d) => {
      out += d.toString();
      if (out.endsWith('\n')) resolve(JSON.parse(out));
    });
    engine.on('exit', (code) => reject(new Error(`engine exited ${code}`)));
  });
  return { engine, log, audit, logs };
}

/**
 * Runs an engine in a child Node process the way a restarted engine's previous process ran:
 * an adapter from harness `h`'s config (its logger's entries are printed back), `sessions`
 * started one after the other, each awaited to its result, then `adapter.shutdown()`. With
 * `exit` (default) the process then exits on its own; else it stays alive (until killed) and
 * the promise resolves once shutdown is done. Resolves with `{ engine, results, logs }`:
 * each result `{ ok, code? }`, the child's log entries `{ level, message, data }`.
 */
export async function engineSessions(h, sessions, engines, { state, bodies = {}, exit = true } = {}) {
  const engine = spawn(process.execPath, ['-e', `
    const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
    const logs = [];
    const at = (level) => (message, data) => logs.push({ level, message, data });
    const config = { ...${JSON.stringify({ ...h.config, bashValidatorHook: undefined, logger: undefined })},
      bashValidatorHook: async () => ({ decision: 'approve' }), logger: { debug: at('debug'), info: at('info'), error: at('error'), warn: at('warn') } };
    const bodies = ${JSON.stringify(bodies)};
    const adapter = createClaudeAdapter(config, {
      workItemReader: { getWorkItemBody: async (id) => bodies[id] ?? 'x' }, revisionReader: { getRevisionFiles: async () => [] },
      getState: () => (${JSON.stringify(state ?? { workItems: {}, revisions: {}, lastPlannedSHAs: {} })}),
      getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
    (async () => {
      const results = [];
      for (const params of ${JSON.stringify(sessions)}) {
        try {
          await (await adapter.startAgent(params)).result;
          results.push({ ok: true });
        } catch (e) {
          results.push({ ok: false, code: e.code, message: e.message });
        }
      }
      await adapter.shutdown();
      console.log(JSON.stringify({ results, logs }));
      if (${JSON.stringify(exit)}) process.exit(0);
      setInterval(() => {}, 1000);
    })();
  `], { stdio: ['ignore', 'pipe', 'inherit'] });
  engines.push(engine);
  let out = '';
  const done = await new Promise((resolve, reject) => {
    engine.stdout.on('data', (d) => {
      out += d.toString();
      if (out.endsWith('\n')) resolve(JSON.parse(out));
    });
    engine.on('exit', (code) => reject(new Error(`engine exited ${code} before it said it was done`)));
  });
  if (exit) await new Promise((r) => (engine.exitCode !== null ? r() : engine.on('exit', r)));
  return { engine, ...done };
}
