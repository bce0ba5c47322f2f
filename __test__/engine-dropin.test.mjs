// Issue 11, "A drop-in for the engine as it is": the adapter driven exactly the way the engine
// drives it (its own run id, cancelAgent with that id, getAgentStream for a late terminal UI,
// only `error.message` kept, abortSignal's reason deciding `timed-out`), then the new pieces the
// engine can opt into: params.model per dispatch, handle.stats, adapter.sessions(),
// shutdown({ graceMs }), and contextCallbackTimeout / hookTimeout from the config.
// Real addon, real Claude Code CLI, fake Messages API, real git.
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { apiError, bash, latestToolResultText, reply, scenario, structured, text } from './support/fake-api.mjs';
import { collect, engineState, rejection, setup, sleepMarker } from './support/harness.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

const CONTEXT_ENV = 'CLAUDE_RUNTIME_ADAPTER_CONTEXT_TIMEOUT_MS';
const HOOK_ENV = 'CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS';

const twoItems = engineState({
  workItems: [
    { id: '7', title: 'Add a file', status: 'in-progress', linkedRevision: null },
    { id: '8', title: 'Add another', status: 'in-progress', linkedRevision: null },
  ],
});
const bodies = { 7: 'Create the file', 8: 'Create the other file' };
const implementor = (id) => ({ role: 'implementor', workItemID: id, branchName: `wi-${id}` });
const done = (summary = 'done') => structured({ role: 'implementor', outcome: 'completed', summary });
const emptyPlan = { role: 'planner', create: [], close: [], update: [] };
/** A CLI-accepted long command (a bare `sleep N` is refused) whose argv marks this test run. */
const sleeper = () => {
  const marker = `sleep ${sleepMarker(31)}`;
  return { marker, command: `echo start; ${marker}` };
};
const wait = (ms) => new Promise((r) => setTimeout(r, ms));

/** Live (non-zombie) processes whose command line contains `marker`. */
function processesWith(marker) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      if (cmd.includes(marker) && procState(pid) !== 'Z') found.push(Number(pid));
    } catch {
      // exited while we looked
    }
  }
  return found;
}
const procState = (pid) => readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
/** The pid is a live process (zombies count as gone: they run nothing). */
function alive(pid) {
  try {
    return procState(pid) !== 'Z';
  } catch {
    return false;
  }
}
async function until(what, predicate, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await wait(25);
  }
}

/**
 * The engine as the issue observed it, in miniature (no engine code): a run id of its own,
 * handles keyed by it, `cancelAgent(itsOwnId)` on cancel and in stop(), then a bounded wait
 * (`shutdownTimeout`, 300 s in the engine); a terminal UI reading `getAgentStream(id)`;
 * `abortSignal.reason === 'timeout'` → `timed-out`; only `error.message` kept.
 * `passId` is the one-field change of docs/engine.md ("Wiring it into the engine").
 */
class TinyEngine {
  constructor(adapter, { passId, shutdownTimeoutMs = 300_000 }) {
    this.adapter = adapter;
    this.passId = passId;
    this.shutdownTimeoutMs = shutdownTimeoutMs;
    this.runs = new Map();
  }

  async dispatch(params) {
    const id = randomUUID();
    const handle = await this.adapter.startAgent(this.passId ? { ...params, sessionID: id } : params);
    const run = { id, handle, status: 'running', error: null, result: null, logFilePath: handle.logFilePath, abortReason: null };
    handle.abortSignal.addEventListener('abort', () => (run.abortReason = handle.abortSignal.reason));
    run.settled = handle.result.then(
      (result) => {
        run.status = 'completed';
        run.result = result;
      },
      (error) => {
        run.error = error.message; // the engine keeps the message only
        run.status = !handle.abortSignal.aborted ? 'failed' : handle.abortSignal.reason === 'timeout' ? 'timed-out' : 'cancelled';
      },
    );
    this.runs.set(id, run);
    return id;
  }

  getAgentStream(id) {
    return this.runs.get(id).handle.output;
  }

  cancel(id) {
    this.adapter.cancelAgent(id);
  }

  /** Cancel every run, then wait for their results up to shutdownTimeout. */
  async stop() {
    for (const id of this.runs.keys()) this.adapter.cancelAgent(id);
    const all = Promise.all([...this.runs.values()].map((r) => r.settled)).then(() => 'settled');
    return Promise.race([all, wait(this.shutdownTimeoutMs).then(() => 'shutdownTimeout elapsed')]);
  }
}

/** The CLI's pid for a handle, from adapter.sessions(). */
const cliPid = (adapter, sessionID) => adapter.sessions().find((s) => s.sessionID === sessionID)?.pid ?? null;

describe('the engine as it is: its own run id, no params.sessionID', () => {
  it("cancelAgent(engine's id) cannot reach the session: a no-op, the CLI and its Bash child run on", async () => {
    const { marker, command } = sleeper();
    h = await setup({ script: scenario.steps([bash(command), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    const engine = new TinyEngine(adapter, { passId: false, shutdownTimeoutMs: 1500 });
    const id = await engine.dispatch(implementor('7'));
    const { handle } = engine.runs.get(id);
    expect(handle.sessionID).not.toBe(id);
    await until('the Bash child', () => processesWith(marker).length > 0);
    const pid = cliPid(adapter, handle.sessionID);
    expect(pid).toBeGreaterThan(0);

    engine.cancel(id);
    const stopped = await engine.stop();
    // The engine's stop waited its whole shutdownTimeout (300 s in the engine; 1.5 s here).
    expect(stopped).toBe('shutdownTimeout elapsed');
    expect(engine.runs.get(id).status).toBe('running');
    expect(alive(pid)).toBe(true);
    expect(processesWith(marker).length).toBeGreaterThan(0);
    expect(adapter.sessions().map((s) => s.sessionID)).toEqual([handle.sessionID]);

    // Only the adapter's own id reaches it.
    adapter.cancelAgent(handle.sessionID);
    await engine.runs.get(id).settled;
    expect(engine.runs.get(id).error).toMatch(/^\[ERR_CANCELLED\] /);
    expect(processesWith(marker)).toEqual([]);
  });
});

describe("the engine passing its run id as params.sessionID", () => {
  it('handle.sessionID is the engine id; its cancel settles within a second with no CLI or Bash child left; the late UI gets the whole text', async () => {
    const { marker, command } = sleeper();
    h = await setup({
      script: scenario.steps([reply(text('Reading the work item. '), text('Running the tests. '), bash(command)), done()]),
      state: twoItems,
      bodies,
    });
    const adapter = h.adapter();
    const engine = new TinyEngine(adapter, { passId: true });
    const id = await engine.dispatch(implementor('7'));
    const run = engine.runs.get(id);
    expect(run.handle.sessionID).toBe(id);
    expect(adapter.sessions().map((s) => s.sessionID)).toEqual([id]);

    // A logger reads from the start; the terminal UI attaches once some text has arrived.
    let logged = '';
    const logger = (async () => {
      for await (const chunk of engine.getAgentStream(id)) logged += chunk;
      return logged;
    })();
    await until('some text', () => logged.length > 0);
    await until('the Bash child', () => processesWith(marker).length > 0);
    const ui = collect(engine.getAgentStream(id));
    const pid = cliPid(adapter, id);
    expect(alive(pid)).toBe(true);

    const t0 = performance.now();
    engine.cancel(id);
    await run.settled;
    const ms = performance.now() - t0;
    console.log(`[measure] engine cancel(its own id) → result settled in ${ms.toFixed(0)} ms`);
    expect(ms).toBeLessThan(5000);
    expect(run.status).toBe('cancelled');
    expect(run.abortReason).toBe('cancelled');
    expect(run.error).toMatch(/^\[ERR_CANCELLED\] /);
    expect(alive(pid)).toBe(false);
    expect(processesWith(marker)).toEqual([]);
    expect(adapter.sessions()).toEqual([]);

    const whole = 'Reading the work item. Running the tests. ';
    expect(await logger).toBe(whole);
    expect(await ui).toBe(whole);
    expect(run.logFilePath).toContain(id);
    expect(readFileSync(run.logFilePath, 'utf8')).toContain('=== Session cancelled ===');
  });

  it("the engine's stop() cancels every run and settles within a second, no CLI or Bash child left", async () => {
    const { marker, command } = sleeper();
    h = await setup({ script: scenario.steps([bash(command), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    const engine = new TinyEngine(adapter, { passId: true });
    const ids = [await engine.dispatch(implementor('7')), await engine.dispatch(implementor('8'))];
    await until('both Bash children', () => processesWith(marker).length >= 2);
    const pids = ids.map((id) => cliPid(adapter, id));
    expect(pids.every((p) => p > 0 && alive(p))).toBe(true);

    const t0 = performance.now();
    expect(await engine.stop()).toBe('settled');
    const ms = performance.now() - t0;
    console.log(`[measure] engine stop() with 2 runs → all settled in ${ms.toFixed(0)} ms`);
    expect(ms).toBeLessThan(5000);
    for (const id of ids) {
      expect(engine.runs.get(id).status).toBe('cancelled');
      expect(engine.runs.get(id).error).toMatch(/^\[ERR_CANCELLED\] /);
    }
    expect(pids.filter(alive)).toEqual([]);
    expect(processesWith(marker)).toEqual([]);
    expect(adapter.sessions()).toEqual([]);
  });

  it('a run past maxAgentDuration is timed-out for the engine (abort reason timeout, message [ERR_TIMEOUT])', async () => {
    const { marker, command } = sleeper();
    // 10 s: the limit counts from startAgent, and the start must fit in it on a busy machine.
    h = await setup({ script: scenario.steps([bash(command), done()]), state: twoItems, bodies, config: { maxAgentDuration: 10 } });
    const engine = new TinyEngine(h.adapter(), { passId: true });
    const id = await engine.dispatch(implementor('7'));
    const run = engine.runs.get(id);
    await run.settled;
    expect(run.status).toBe('timed-out');
    expect(run.abortReason).toBe('timeout');
    expect(run.error).toMatch(/^\[ERR_TIMEOUT\] /);
    expect(processesWith(marker)).toEqual([]);
  });

  it('a completed run: the engine reads handle.result and the transcript path', async () => {
    h = await setup({ script: scenario.steps([reply(text('Writing. '), bash('echo hi > done.txt')), done('wrote done.txt')]), state: twoItems, bodies });
    const engine = new TinyEngine(h.adapter(), { passId: true });
    const id = await engine.dispatch(implementor('7'));
    const run = engine.runs.get(id);
    await run.settled;
    expect(run.status).toBe('completed');
    expect(run.result).toMatchObject({ role: 'implementor', outcome: 'completed', summary: 'wrote done.txt' });
    expect(run.result.patch).toContain('done.txt');
    expect(run.abortReason).toBeNull();
    expect(existsSync(run.logFilePath)).toBe(true);
  });
});

describe('params.model reaches the CLI (argv and the model API)', () => {
  const DEF = 'claude-model-from-definition';
  const CONFIG = 'claude-model-from-config';
  const PARAM = 'claude-model-from-params';
  const cases = [
    ['params.model wins over config.model and the definition', { config: CONFIG, param: PARAM }, PARAM],
    ['config.model wins over the definition', { config: CONFIG }, CONFIG],
    ["the agent definition's model applies when neither is given", {}, DEF],
  ];
  for (const [name, given, expected] of cases) {
    it(name, async () => {
      let release;
      const argvRead = new Promise((r) => (release = r));
      h = await setup({
        script: async () => {
          await argvRead;
          return structured(emptyPlan);
        },
        repo: { agents: { planner: { description: 'Plans', tools: ['Read'], model: DEF, prompt: 'You are the planner.' } } },
        config: given.config ? { model: given.config } : {},
      });
      const adapter = h.adapter();
      const handle = await adapter.startAgent({ role: 'planner', specPaths: [], ...(given.param ? { model: given.param } : {}) });
      await until('the first model request', () => h.api.mainRequests().length > 0);
      const argv = readFileSync(`/proc/${cliPid(adapter, handle.sessionID)}/cmdline`, 'utf8').split('\0');
      release();
      expect(await handle.result).toEqual(emptyPlan);
      if (given.config || given.param) expect(argv).toContain(`--model=${expected}`);
      else expect(argv.some((a) => a.startsWith('--model'))).toBe(false);
      const models = h.api.mainBodies().map((b) => b.model);
      expect(models.length).toBeGreaterThan(0);
      expect(new Set(models)).toEqual(new Set([expected]));
      expect((await handle.stats).model).toBe(expected);
    });
  }
});

/** Settles `p` and reports when (ms since epoch). */
const settledAt = (p) => p.then(() => performance.now(), () => performance.now());

function expectResultStats(stats) {
  expect(stats.durationMs).toBeGreaterThan(0);
  expect(stats.turns).toBeGreaterThanOrEqual(1);
  expect(typeof stats.costUsd).toBe('number');
  expect(typeof stats.model).toBe('string');
  expect(stats.tokens.input).toBeGreaterThan(0);
  expect(stats.tokens.output).toBeGreaterThan(0);
  expect(stats.tokens).toHaveProperty('cacheRead');
  expect(stats.tokens).toHaveProperty('cacheCreation');
}

/** The logger's completed/failed entry and the transcript's [stats] note carry these stats. */
function expectStatsRecorded(handle, stats, message) {
  const entry = h.logger.entries.find((e) => e.message === message && e.data?.sessionID === handle.sessionID);
  expect(entry?.data?.stats).toEqual(stats);
  const note = readFileSync(handle.logFilePath, 'utf8').match(/\[stats\]\s*(\{.*\})/);
  expect(note, 'transcript has a [stats] note').not.toBeNull();
  expect(JSON.parse(note[1])).toEqual(stats);
}

describe('handle.stats', () => {
  it('a completed implementor: turns, cost, tokens, model, and the changed files with their line counts', async () => {
    h = await setup({
      script: scenario.steps([bash('printf "one\\ntwo\\n" > notes.txt && echo more >> README.md'), done('wrote notes')]),
      state: twoItems,
      bodies,
    });
    const handle = await h.adapter().startAgent(implementor('7'));
    const [resultAt, statsAt] = await Promise.all([settledAt(handle.result), settledAt(handle.stats)]);
    console.log(`[measure] stats settled ${(statsAt - resultAt).toFixed(1)} ms after result`);
    expect(Math.abs(statsAt - resultAt)).toBeLessThan(200);
    const stats = await handle.stats;
    expectResultStats(stats);
    expect(stats.turns).toBeGreaterThanOrEqual(2);
    expect([...stats.changedFiles].sort((a, b) => (a.path < b.path ? -1 : 1))).toEqual([
      { path: 'README.md', status: 'modified', added: 1, removed: 0 },
      { path: 'notes.txt', status: 'added', added: 2, removed: 0 },
    ]);
    expectStatsRecorded(handle, stats, 'agent session completed');
  });

  it('a blocked implementor (result without a patch) still lists the files it changed', async () => {
    h = await setup({
      script: scenario.steps([bash('printf "x\\ny\\nz\\n" > half.txt'), structured({ role: 'implementor', outcome: 'blocked', summary: 'stuck' })]),
      state: twoItems,
      bodies,
    });
    const handle = await h.adapter().startAgent(implementor('7'));
    expect(await handle.result).toMatchObject({ outcome: 'blocked', patch: null });
    const stats = await handle.stats;
    expectResultStats(stats);
    expect(stats.changedFiles).toEqual([{ path: 'half.txt', status: 'added', added: 3, removed: 0 }]);
    expectStatsRecorded(handle, stats, 'agent session completed');
  });

  it('a failed session (output that breaks the rules, no retries left): result stats, logged with the failure', async () => {
    const badPlan = { role: 'planner', create: [], close: ['99'], update: [] };
    h = await setup({ script: scenario.always(reply(structured(badPlan))), config: { outputRetries: 0 } });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    const err = await rejection(handle.result);
    expect(err.message).toMatch(/^\[ERR_OUTPUT_INVALID\] /);
    const stats = await handle.stats;
    expectResultStats(stats);
    expect(stats.changedFiles).toBeNull();
    expectStatsRecorded(handle, stats, 'agent session failed');
  });

  it('a failed session (the model API refuses the request): duration, and the failure logged with the stats', async () => {
    h = await setup({ script: scenario.always(apiError(400, 'fake: bad request')) });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    const err = await rejection(handle.result);
    expect(err.message).toMatch(/^\[ERR_AGENT_FAILED\] /);
    const stats = await handle.stats;
    expect(stats.durationMs).toBeGreaterThan(0);
    expectStatsRecorded(handle, stats, 'agent session failed');
  });

  it("a cancelled implementor: duration, what the CLI spent before the stop, and the files it had changed", async () => {
    const { marker, command } = sleeper();
    h = await setup({ script: scenario.steps([bash('echo partial > partial.txt'), bash(command), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    const handle = await adapter.startAgent(implementor('7'));
    await until('the Bash child', () => processesWith(marker).length > 0);
    adapter.cancelAgent(handle.sessionID);
    const [resultAt, statsAt] = await Promise.all([settledAt(handle.result), settledAt(handle.stats)]);
    expect(Math.abs(statsAt - resultAt)).toBeLessThan(200);
    expect((await rejection(handle.result)).message).toMatch(/^\[ERR_CANCELLED\] /);
    const stats = await handle.stats;
    // The pinned CLI answers the stop's interrupt with a result (error_during_execution)
    // carrying its accounting so far, so a cancelled session has result figures too.
    expectResultStats(stats);
    expect(stats.changedFiles).toEqual([{ path: 'partial.txt', status: 'added', added: 1, removed: 0 }]);
    expectStatsRecorded(handle, stats, 'agent session failed');
  });
});

describe('adapter.sessions() and shutdown({ graceMs })', () => {
  it('lists a running session with its CLI pid, and is empty after the result', async () => {
    let release;
    const gate = new Promise((r) => (release = r));
    h = await setup({ script: scenario.steps([async () => (await gate, bash('echo hi > a.txt')), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    expect(adapter.sessions()).toEqual([]);
    const before = Date.now();
    const handle = await adapter.startAgent({ ...implementor('7'), sessionID: 'engine-run-1' });
    await until('the first model request', () => h.api.mainRequests().length > 0);
    const list = adapter.sessions();
    expect(list).toHaveLength(1);
    const [s] = list;
    expect(s).toMatchObject({ sessionID: 'engine-run-1', role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    expect(s.startedAt).toBeGreaterThanOrEqual(before - 5);
    expect(s.startedAt).toBeLessThanOrEqual(Date.now());
    expect(alive(s.pid)).toBe(true);
    expect(readFileSync(`/proc/${s.pid}/cmdline`, 'utf8')).toContain('--output-format');
    release();
    await handle.result;
    expect(adapter.sessions()).toEqual([]);
    expect(alive(s.pid)).toBe(false);
  });

  it('shutdown({ graceMs: 5000 }) lets a short session finish: its result resolves', async () => {
    h = await setup({ script: scenario.always({ ...reply(structured(emptyPlan)), delayMs: 800 }) });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ role: 'planner', specPaths: [] });
    const t0 = performance.now();
    await adapter.shutdown({ graceMs: 5000 });
    const ms = performance.now() - t0;
    console.log(`[measure] shutdown({ graceMs: 5000 }) with an ~0.8 s session resolved in ${ms.toFixed(0)} ms`);
    expect(await handle.result).toEqual(emptyPlan);
    expect(ms).toBeLessThan(5000);
    expect((await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }))).message).toMatch(/^\[ERR_CANCELLED\] /);
  });

  it('shutdown({ graceMs }) cancels a session still running when the grace ends', async () => {
    const { marker, command } = sleeper();
    h = await setup({ script: scenario.steps([bash(command), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    const handle = await adapter.startAgent(implementor('7'));
    await until('the Bash child', () => processesWith(marker).length > 0);
    const t0 = performance.now();
    await adapter.shutdown({ graceMs: 700 });
    const ms = performance.now() - t0;
    console.log(`[measure] shutdown({ graceMs: 700 }) with a 31 s session resolved in ${ms.toFixed(0)} ms`);
    expect(ms).toBeGreaterThanOrEqual(690);
    expect(ms).toBeLessThan(5700);
    expect((await rejection(handle.result)).code).toBe('ERR_CANCELLED');
    expect(processesWith(marker)).toEqual([]);
  });

  it('shutdown() cancels at once; later starts reject ERR_CANCELLED', async () => {
    const { marker, command } = sleeper();
    h = await setup({ script: scenario.steps([bash(command), done()]), state: twoItems, bodies });
    const adapter = h.adapter();
    const handle = await adapter.startAgent(implementor('7'));
    await until('the Bash child', () => processesWith(marker).length > 0);
    const pid = cliPid(adapter, handle.sessionID);
    const t0 = performance.now();
    await adapter.shutdown();
    const ms = performance.now() - t0;
    console.log(`[measure] shutdown() with a 31 s session resolved in ${ms.toFixed(0)} ms`);
    expect(ms).toBeLessThan(5000);
    expect((await rejection(handle.result)).message).toMatch(/^\[ERR_CANCELLED\] /);
    expect(alive(pid)).toBe(false);
    expect(processesWith(marker)).toEqual([]);
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CANCELLED');
    expect(err.message).toMatch(/^\[ERR_CANCELLED\] /);
  });
});

describe('timeouts from the config (seconds), the environment variables only as overrides', () => {
  it('the env overrides are not set in this run (so the config is what applies)', () => {
    expect(process.env[CONTEXT_ENV]).toBeUndefined();
    expect(process.env[HOOK_ENV]).toBeUndefined();
  });

  it('contextCallbackTimeout: 0.2 — a getWorkItemBody that never settles fails startAgent with ERR_CONTEXT within the bound', async () => {
    h = await setup({ state: twoItems, config: { contextCallbackTimeout: 0.2 } });
    h.deps.workItemReader = { getWorkItemBody: () => new Promise(() => {}) };
    const adapter = h.adapter();
    const t0 = performance.now();
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }));
    const ms = performance.now() - t0;
    console.log(`[measure] contextCallbackTimeout 0.2 s → ERR_CONTEXT after ${ms.toFixed(0)} ms`);
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.message).toMatch(/^\[ERR_CONTEXT\] /);
    expect(err.message).toContain('did not settle within 200 ms');
    expect(ms).toBeGreaterThanOrEqual(190);
    expect(ms).toBeLessThan(2000);
    expect(adapter.sessions()).toEqual([]);
  });

  it('the environment variable still overrides contextCallbackTimeout', async () => {
    process.env[CONTEXT_ENV] = '350';
    try {
      h = await setup({ state: twoItems, config: { contextCallbackTimeout: 0.2 } });
      h.deps.workItemReader = { getWorkItemBody: () => new Promise(() => {}) };
      const adapter = h.adapter();
      const err = await rejection(adapter.previewPrompt({ role: 'planner', specPaths: [] }));
      expect(err.message).toContain('did not settle within 350 ms');
    } finally {
      delete process.env[CONTEXT_ENV];
    }
  });

  it('hookTimeout: 0.2 — a validator that never answers gets the command blocked, the model and the logs say why', async () => {
    h = await setup({
      script: scenario.steps([bash('echo late > late.txt'), structured({ role: 'implementor', outcome: 'blocked', summary: 'validator silent' })]),
      state: twoItems,
      bodies,
      config: { hookTimeout: 0.2 },
      hook: () => new Promise(() => {}),
    });
    const t0 = performance.now();
    const handle = await h.adapter().startAgent(implementor('7'));
    const result = await handle.result;
    const ms = performance.now() - t0;
    console.log(`[measure] hookTimeout 0.2 s: whole session with one silent-validator command took ${ms.toFixed(0)} ms`);
    expect(result).toEqual({ role: 'implementor', outcome: 'blocked', patch: null, summary: 'validator silent' });
    expect(h.hookCalls).toHaveLength(1);
    expect(latestToolResultText(h.api.mainBodies().at(-1))).toContain('did not answer within 200 ms');
    expect(readFileSync(handle.logFilePath, 'utf8')).toMatch(/\[hook\] blocked Bash \(validator failed: .*did not answer within 200 ms/);
    const logged = h.logger.entries.find((e) => e.message === 'bash validator hook failed; command blocked');
    expect(logged?.data?.error).toContain('did not answer within 200 ms');
    expect(ms).toBeLessThan(30_000);
  });
});
