// Issue "Never destroy what the adapter did not make, never hang, never crash the host": the
// reproductions that concern the host process and the session's bookkeeping, each through the
// built addon (and the real CLI where an agent runs).
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured } from './support/fake-api.mjs';
import { addon, collect, engineState, rejection, setup, thrown, sleepMarker } from './support/harness.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

const plannerOk = scenario.steps([structured({ role: 'planner', create: [], close: [], update: [] })]);
const implementorState = engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] });

/** Runs `body` (a script using `createClaudeAdapter`, `config`, `deps`) in a child Node; returns its exit and output. */
function inChild(h, body, env = {}) {
  const script = `
    const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
    const noop = () => {};
    const config = { ...${JSON.stringify({ ...h.config, bashValidatorHook: undefined, logger: undefined })},
      bashValidatorHook: async () => ({ decision: 'approve' }), logger: { debug: noop, info: noop, error: noop, warn: noop } };
    const deps = { workItemReader: { getWorkItemBody: async () => 'b' }, revisionReader: { getRevisionFiles: async () => [] },
      getState: () => ({ workItems: {}, revisions: {}, lastPlannedSHAs: {} }), getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) };
    const report = (x) => console.log(JSON.stringify(x));
    (async () => { ${body} })().then(() => report({ done: true }), (e) => report({ threw: String(e) }));`;
  const r = spawnSync(process.execPath, ['-e', script], { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 30_000 });
  const lines = r.stdout.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
  return { status: r.status, signal: r.signal, stderr: r.stderr, lines };
}

describe('no number in the config crashes the host', () => {
  const fields = ['maxAgentDuration', 'worktreeSetupTimeout', 'extractionTimeout', 'contextConcurrency', 'contextCallbackTimeout', 'hookTimeout', 'outputRetries'];
  const bad = [1e20, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, -1, '12'];
  it('maxAgentDuration: 1e20 is ERR_INVALID_PARAMS naming the field and its range; the process lives on', async () => {
    h = await setup({});
    const r = inChild(h, `try { createClaudeAdapter({ ...config, maxAgentDuration: 1e20 }, deps); report({ created: true }); }
      catch (e) { report({ code: e.code, message: e.message }); }`);
    expect(r.signal).toBe(null);
    expect(r.status).toBe(0);
    expect(r.lines[0].code).toBe('ERR_INVALID_PARAMS');
    expect(r.lines[0].message).toContain('config.maxAgentDuration must be a number in [0, 31536000] (got 100000000000000000000)');
  });

  for (const field of fields) {
    it(`${field}: NaN, ±Infinity, negative, huge and non-number values are each ERR_INVALID_PARAMS naming the field and range`, async () => {
      h = await setup({});
      for (const value of bad) {
        const err = thrown(() => addon.createClaudeAdapter({ ...h.config, [field]: value }, h.deps));
        expect(err.code, `${field}=${value}`).toBe('ERR_INVALID_PARAMS');
        expect(err.message).toMatch(new RegExp(`config\\.${field} must be (a number|an integer) in \\[`));
      }
    });
  }

  it('every invalid field is reported in one error', async () => {
    h = await setup({});
    const err = thrown(() =>
      addon.createClaudeAdapter(
        { ...h.config, maxAgentDuration: Number.NaN, hookTimeout: -5, contextPaths: ['../x'], model: '', sandbox: 'yes', logger: { info() {} } },
        { ...h.deps, getState: 1 },
      ),
    );
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    for (const field of ['config.maxAgentDuration', 'config.hookTimeout', 'config.contextPaths[0]', 'config.model', 'config.sandbox', 'config.logger.debug', 'config.logger.error', 'deps.getState']) {
      expect(err.message).toContain(field);
    }
    expect(err.message).toContain('(got NaN)');
  });

  it('the error code also leads the message, for engines that keep only the message', async () => {
    h = await setup({});
    const err = thrown(() => addon.createClaudeAdapter({ ...h.config, maxAgentDuration: -1 }, h.deps));
    expect(err.message).toMatch(/^\[ERR_INVALID_PARAMS\] config\.maxAgentDuration/);
  });

  it('shutdown({ graceMs }) with NaN or a negative number rejects ERR_INVALID_PARAMS', async () => {
    h = await setup({});
    const adapter = h.adapter();
    for (const graceMs of [Number.NaN, -1, Number.POSITIVE_INFINITY, 'soon']) {
      const err = thrown(() => adapter.shutdown({ graceMs }));
      expect(err.code).toBe('ERR_INVALID_PARAMS');
      expect(err.message).toContain('options.graceMs');
    }
    await adapter.shutdown();
  });
});

describe('git 2.30 or newer', () => {
  it('createClaudeAdapter with an older git on PATH throws ERR_PROVISION naming the minimum', async () => {
    h = await setup({});
    const bin = join(h.scratch, 'old-git-bin');
    mkdirSync(bin);
    writeFileSync(join(bin, 'git'), `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "git version 2.29.2"; exit 0; fi\nexec ${execFileSync('sh', ['-c', 'command -v git']).toString().trim()} "$@"\n`);
    chmodSync(join(bin, 'git'), 0o755);
    const r = inChild(h, `try { createClaudeAdapter(config, deps); report({ created: true }); }
      catch (e) { report({ code: e.code, message: e.message }); }`, { PATH: `${bin}:${process.env.PATH}` });
    expect(r.lines[0].code).toBe('ERR_PROVISION');
    expect(r.lines[0].message).toContain('git 2.30 or newer is required');
    expect(r.lines[0].message).toContain('git version 2.29.2');
  });
});

describe('claudeExecutable names the CLI, or the session does not start', () => {
  it('an empty claudeExecutable is ERR_INVALID_PARAMS', async () => {
    h = await setup({});
    const err = thrown(() => addon.createClaudeAdapter({ ...h.config, claudeExecutable: '' }, h.deps));
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    expect(err.message).toContain('config.claudeExecutable');
  });

  it('a claudeExecutable that does not exist is ERR_CLI_NOT_FOUND naming it, though the bundled CLI is installed (no fallback)', async () => {
    h = await setup({ script: plannerOk, config: { claudeExecutable: '/nonexistent/claude-typo' } });
    const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CLI_NOT_FOUND');
    expect(err.message).toContain('/nonexistent/claude-typo does not exist');
    expect(h.api.requests.length).toBe(0);
  });

  it('a claudeExecutable that is not executable is ERR_CLI_NOT_FOUND naming it', async () => {
    h = await setup({ script: plannerOk });
    const file = join(h.scratch, 'claude');
    writeFileSync(file, '#!/bin/sh\n');
    chmodSync(file, 0o644);
    const adapter = addon.createClaudeAdapter({ ...h.config, claudeExecutable: file }, h.deps);
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CLI_NOT_FOUND');
    expect(err.message).toContain(`${file} is not an executable file`);
  });
});

describe('a panic never aborts the host (ERR_INTERNAL)', () => {
  // The addon panics on purpose where CLAUDE_RUNTIME_ADAPTER_PANIC says (fault injection).
  it('a panic in createClaudeAdapter throws ERR_INTERNAL and the process exits normally', async () => {
    h = await setup({});
    const r = inChild(h, `try { createClaudeAdapter(config, deps); report({ created: true }); }
      catch (e) { report({ code: e.code, message: e.message }); }`, { CLAUDE_RUNTIME_ADAPTER_PANIC: 'createClaudeAdapter' });
    expect(r.signal).toBe(null);
    expect(r.status).toBe(0);
    expect(r.lines[0].code).toBe('ERR_INTERNAL');
    expect(r.lines[0].message).toContain('injected panic in createClaudeAdapter');
    expect(r.lines[1]).toEqual({ done: true });
  });

  for (const entry of ['startAgent', 'startAgent.async']) {
    it(`a panic in ${entry} rejects ERR_INTERNAL; the adapter still works afterwards`, async () => {
      h = await setup({});
      const r = inChild(h, `const adapter = createClaudeAdapter(config, deps);
        try { await adapter.startAgent({ role: 'planner', specPaths: [] }); report({ started: true }); }
        catch (e) { report({ code: e.code, message: e.message }); }
        report({ sessions: adapter.sessions().length });
        await adapter.shutdown();`, { CLAUDE_RUNTIME_ADAPTER_PANIC: entry });
      expect(r.signal).toBe(null);
      expect(r.status).toBe(0);
      expect(r.lines[0].code).toBe('ERR_INTERNAL');
      expect(r.lines[1]).toEqual({ sessions: 0 });
      expect(r.lines[2]).toEqual({ done: true });
    });
  }
});

describe('transcripts and patch files are unique per session', () => {
  it('two sessions of one role started together get their own transcript, named with their session id', async () => {
    h = await setup({ script: plannerOk });
    const adapter = h.adapter();
    const [a, b] = await Promise.all([adapter.startAgent({ role: 'planner', specPaths: [] }), adapter.startAgent({ role: 'planner', specPaths: [] })]);
    await Promise.all([a.result, b.result]);
    expect(a.logFilePath).not.toBe(b.logFilePath);
    expect(a.logFilePath).toContain(a.sessionID);
    expect(b.logFilePath).toContain(b.sessionID);
    expect(readFileSync(a.logFilePath, 'utf8')).toContain(`Session ID: ${a.sessionID}`);
    expect(readFileSync(b.logFilePath, 'utf8')).toContain(`Session ID: ${b.sessionID}`);
  });
});

describe('abortSignal and result never disagree', () => {
  it('a cancel that arrives after the CLI ended (during patch extraction and cleanup) leaves the signal unaborted and the result resolved', async () => {
    h = await setup({
      script: scenario.steps([bash('echo work > done.txt'), structured({ role: 'implementor', outcome: 'completed', summary: 'wrote done.txt' })]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    // The output ends when the CLI has ended; extraction and cleanup come after.
    await collect(handle.output);
    adapter.cancelAgent(handle.sessionID);
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('+++ b/done.txt');
    expect(handle.abortSignal.aborted).toBe(false);
  });

  it('a session cancelled while it runs aborts the signal with "cancelled" and rejects ERR_CANCELLED', async () => {
    const marker = sleepMarker(30);
    h = await setup({
      script: scenario.steps([bash(`echo start; sleep ${marker}`), structured({ role: 'implementor', outcome: 'blocked', summary: 'x' })]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    const running = () => execFileSync('ps', ['-eo', 'args']).toString().includes(`sleep ${marker}`);
    for (let i = 0; i < 200 && !running(); i++) await new Promise((r) => setTimeout(r, 25));
    adapter.cancelAgent(handle.sessionID);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_CANCELLED');
    expect(handle.abortSignal.aborted).toBe(true);
    expect(handle.abortSignal.reason).toBe('cancelled');
  });
});

describe('provisioning obeys the stop signal', () => {
  const hung = (marker) => ({ worktreeSetupCommand: ['sh', '-c', `sleep ${marker}; true`] });
  const alive = (marker) => execFileSync('ps', ['-eo', 'args']).toString().split('\n').filter((l) => l.includes(`sleep ${marker}`) && !l.includes('ps -eo'));
  const waitFor = async (cond) => {
    for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 25));
  };

  for (const [how, stop, code] of [
    ['cancelAgent', (adapter, id) => adapter.cancelAgent(id), 'ERR_CANCELLED'],
    ['shutdown()', (adapter) => adapter.shutdown(), 'ERR_CANCELLED'],
  ]) {
    it(`${how} one second into a hung setup command: startAgent rejects ${code} at once, the setup is killed, nothing is left`, async () => {
      const marker = sleepMarker(40);
      h = await setup({ script: plannerOk, state: implementorState, bodies: { 7: 'x' }, config: hung(marker) });
      const adapter = h.adapter();
      const started = adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'run-hung' });
      started.catch(() => {}); // awaited below; shutdown() settles it first
      await waitFor(() => alive(marker).length > 0);
      expect(alive(marker).length).toBeGreaterThan(0);
      const t0 = Date.now();
      await stop(adapter, 'run-hung');
      const err = await rejection(started);
      expect(Date.now() - t0).toBeLessThan(5_000); // hang detection, not a timing assertion
      expect(err.code).toBe(code);
      await waitFor(() => alive(marker).length === 0 && !existsSync(join(h.repo.root, '.worktrees', 'wi-7')));
      expect(alive(marker)).toEqual([]);
      expect(existsSync(join(h.repo.root, '.worktrees', 'wi-7'))).toBe(false);
      await waitFor(() => h.repo.git('branch', '--list', 'wi-7').trim() === '');
      expect(h.repo.git('branch', '--list', 'wi-7').trim()).toBe('');
      await adapter.shutdown();
    });
  }

  it('the time limit reaches a hung setup command: ERR_TIMEOUT', async () => {
    const marker = sleepMarker(41);
    h = await setup({ script: plannerOk, state: implementorState, bodies: { 7: 'x' }, config: { ...hung(marker), maxAgentDuration: 1 } });
    const adapter = h.adapter();
    const err = await rejection(adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' }));
    expect(err.code).toBe('ERR_TIMEOUT');
    await waitFor(() => alive(marker).length === 0);
    expect(alive(marker)).toEqual([]);
  });
});
