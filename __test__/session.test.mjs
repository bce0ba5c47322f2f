// startAgent end to end: the real addon, the real Claude Code CLI, a fake Messages API on
// 127.0.0.1 scripted per test, real git repositories in temp dirs.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterEach, describe, expect, it } from 'vitest';
import { implementorDone, implementorParams, implementorState } from './support/roles.mjs';
import { apiError, bash, latestToolResultText, reply, scenario, structured, text, toolNames } from './support/fake-api.mjs';
import { collect, engineState, isViewOf, rejection, setup, sleepMarker } from './support/harness.mjs';

const done = implementorDone;

/** The cwd the transcript's init line names. */
const transcriptCwd = (log) => /\bcwd=(\S+) /.exec(log)?.[1];

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/**
 * Live processes whose command line, its arguments joined by spaces, contains `marker` (read
 * from /proc): the shell running `sleep <marker>` and the `sleep` itself (argv `sleep`,
 * `<marker>`), which a shell that execs its last command leaves alone.
 */
function processesWith(marker) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
      if (cmd.includes(marker) && state !== 'Z') found.push(Number(pid));
    } catch {
      // exited while we looked
    }
  }
  return found;
}

describe('each role resolves with its validated result', () => {
  it("planner resolves with its PlannerResult and runs in its view of the repository's default branch", async () => {
    const plan = { role: 'planner', create: [{ tempID: 't1', title: 'Do it', body: 'Body', labels: ['x'], blockedBy: [] }], close: [], update: [] };
    h = await setup({
      script: scenario.steps([reply(text('Planning.'), structured(plan))]),
      repo: { files: { 'specs/a.md': '# Spec A\n' } },
    });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ role: 'planner', specPaths: ['specs/a.md'] });
    const [out, result] = await Promise.all([collect(handle.output), handle.result]);
    expect(result).toEqual(plan);
    expect(out).toBe('Planning.');
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(isViewOf(h.repo.root, transcriptCwd(log)), log).toBe(true);
    // the enriched prompt reached the model
    const first = h.api.mainBodies()[0];
    expect(JSON.stringify(first.messages)).toContain('### specs/a.md (added)');
  });

  it('reviewer resolves with its ReviewerResult', async () => {
    const review = { role: 'reviewer', review: { verdict: 'needs-changes', summary: 'Fix it', comments: [{ path: 'a.ts', line: 3, body: 'typo' }] } };
    h = await setup({
      script: scenario.steps([structured(review)]),
      state: engineState({
        workItems: [{ id: '7', title: 'Add a file', status: 'in-review', linkedRevision: 'r1' }],
        revisions: [{ id: 'r1', title: 'PR 1', pipeline: null }],
      }),
      bodies: { 7: 'Body' },
      files: { r1: [{ path: 'a.ts', status: 'modified', patch: '@@ -1 +1 @@\n-a\n+b\n' }] },
    });
    const handle = await h.adapter().startAgent({ role: 'reviewer', workItemID: '7', revisionID: 'r1' });
    expect(await handle.result).toEqual(review);
    // no worktree: the reviewer runs in its read-only view of the default branch
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(isViewOf(h.repo.root, transcriptCwd(log)), log).toBe(true);
  });

  it('implementor resolves with its result and the extracted patch', async () => {
    h = await setup({
      script: scenario.steps([reply(text('Writing.'), bash('echo hi > done.txt')), done('wrote done.txt')]),
      state: implementorState,
      bodies: { 7: 'Create done.txt' },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    const result = await handle.result;
    expect(result).toMatchObject({ role: 'implementor', outcome: 'completed', summary: 'wrote done.txt' });
    expect(result.patch).toContain('+++ b/done.txt');
    expect(result.patch).toContain('+hi');
  });
});

describe('the agent definition reaches the CLI', () => {
  const plan = { role: 'planner', create: [], close: [], update: [] };

  it('a tools allowlist is offered with StructuredOutput added; disallowedTools are denied even if listed', async () => {
    h = await setup({
      script: scenario.steps([structured(plan)]),
      repo: { agents: false, files: { '.claude/agents/planner.md': '---\ndescription: p\ntools: Bash, Read, Grep\ndisallowedTools: [Grep]\n---\nYou plan.\n' } },
    });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(await handle.result).toEqual(plan);
    const tools = toolNames(h.api.mainBodies()[0]);
    expect(tools).toEqual(expect.arrayContaining(['Bash', 'Read', 'StructuredOutput']));
    expect(tools).not.toContain('Grep');
    expect(tools).not.toContain('Write');
  });

  it('an absent tools list inherits the default tools (not none)', async () => {
    h = await setup({
      script: scenario.steps([structured(plan)]),
      repo: { agents: false, files: { '.claude/agents/planner.md': '---\ndescription: p\n---\nYou plan.\n' } },
    });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(await handle.result).toEqual(plan);
    const tools = toolNames(h.api.mainBodies()[0]);
    expect(tools).toEqual(expect.arrayContaining(['Bash', 'Read', 'Write', 'Edit', 'StructuredOutput']));
  });
});

describe('the handle', () => {
  it('uses params.sessionID as the CLI session id when given', async () => {
    h = await setup({ script: scenario.steps([done()]), state: implementorState, bodies: { 7: 'x' } });
    const adapter = h.adapter();
    const sessionID = '0b7c6b1e-62a5-4a8e-9d64-1f0f6a4b5c3d';
    const handle = await adapter.startAgent({ role: 'planner', specPaths: [], sessionID });
    expect(handle.sessionID).toBe(sessionID);
    await rejection(handle.result).catch(() => {});
    expect(readFileSync(handle.logFilePath, 'utf8')).toContain(`Session ID: ${sessionID}`);
  });

  it('generates a UUID session id when none is given', async () => {
    h = await setup({ script: scenario.steps([structured({ role: 'planner', create: [], close: [], update: [] })]) });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(handle.sessionID).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    await handle.result;
  });

  it('refuses a second running session with the same id (ERR_DUPLICATE_SESSION)', async () => {
    h = await setup({
      script: scenario.steps([bash('echo slow; sleep 35.25'), structured({ role: 'planner', create: [], close: [], update: [] })]),
      repo: { agents: { planner: { description: 'p', tools: ['Bash'], prompt: 'p' } } },
    });
    const adapter = h.adapter();
    const sessionID = '2c1c6b1e-62a5-4a8e-9d64-1f0f6a4b5c3d';
    const first = await adapter.startAgent({ role: 'planner', specPaths: [], sessionID });
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [], sessionID }));
    expect(err.code).toBe('ERR_DUPLICATE_SESSION');
    adapter.cancelAgent(sessionID);
    expect((await rejection(first.result)).code).toBe('ERR_CANCELLED');
  });

  it('rejects a result late without an unhandledRejection', async () => {
    const unhandled = [];
    const onUnhandled = (r) => unhandled.push(r);
    process.on('unhandledRejection', onUnhandled);
    try {
      h = await setup({ script: scenario.steps([text('no output tool')]) });
      const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
      await collect(handle.output);
      await new Promise((r) => setTimeout(r, 300));
      const err = await rejection(handle.result);
      expect(err.code).toBe('ERR_OUTPUT_INVALID');
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });
});

describe('output carries only assistant text and always completes', () => {
  it('yields text blocks in order and no tool use, thinking or system messages', async () => {
    h = await setup({
      script: scenario.steps([
        reply({ type: 'thinking', thinking: 'secret thoughts', signature: 'sig' }, text('First.'), bash('echo tool-output-marker')),
        reply(text('Second.'), done()),
      ]),
      state: implementorState,
      bodies: { 7: 'x' },
      repo: { files: { 'a.txt': 'a\n' } },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    const out = await collect(handle.output);
    expect(out).toBe('First.Second.');
    expect(out).not.toContain('secret thoughts');
    expect(out).not.toContain('tool-output-marker');
    await rejection(handle.result); // nothing changed: ERR_EMPTY_PATCH, the output still ended
  });

  it('a consumer that breaks stops receiving but the agent still finishes', async () => {
    h = await setup({
      script: scenario.steps([reply(text('one'), bash('echo x > f.txt')), reply(text('two'), done())]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    for await (const chunk of handle.output) {
      expect(chunk).toBe('one');
      break;
    }
    const result = await handle.result;
    expect(result.patch).toContain('f.txt');
  });

  it('a consumer that never reads does not stall the agent', async () => {
    h = await setup({ script: scenario.textFlood({ messages: 40, bytesPerMessage: 256 * 1024, output: { role: 'planner', create: [], close: [], update: [] } }) });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(await handle.result).toEqual({ role: 'planner', create: [], close: [], update: [] });
    // all 10 MiB is in the transcript, and the unread output is still there to read
    expect(readFileSync(handle.logFilePath, 'utf8').length).toBeGreaterThan(10 * 1024 * 1024);
    const out = await collect(handle.output);
    expect(out.length).toBeGreaterThanOrEqual(10 * 1024 * 1024);
  });
});

describe('hooks fail closed', () => {
  const hookScenario = (cmd) => scenario.steps([bash(cmd), done()]);

  it('an approving hook lets the command run (its effect is on disk)', async () => {
    h = await setup({ script: hookScenario('echo approved > approved.txt'), state: implementorState, bodies: { 7: 'x' } });
    const handle = await h.adapter().startAgent(implementorParams);
    const result = await handle.result;
    expect(result.patch).toContain('approved.txt');
    expect(h.hookCalls[0]).toEqual({ tool_name: 'Bash', tool_input: expect.objectContaining({ command: 'echo approved > approved.txt' }) });
  });

  it('undefined from the hook approves', async () => {
    h = await setup({ script: hookScenario('echo u > u.txt'), state: implementorState, bodies: { 7: 'x' }, hook: async () => undefined });
    const result = await (await h.adapter().startAgent(implementorParams)).result;
    expect(result.patch).toContain('u.txt');
  });

  const blockedCases = [
    ['a block decision', async () => ({ decision: 'block', reason: 'Blocked: not today' }), 'Blocked: not today'],
    ['a hook that throws', () => { throw new Error('validator exploded'); }, 'Bash validator failed'],
    ['a hook that rejects', async () => { throw new Error('validator rejected'); }, 'Bash validator failed'],
    ['a hook that answers nonsense', async () => ({ decision: 'maybe' }), 'Bash validator failed'],
    ['a block without a reason', async () => ({ decision: 'block' }), 'Bash validator failed'],
  ];
  for (const [name, hook, reason] of blockedCases) {
    it(`${name} blocks the command (nothing on disk, the model is told why)`, async () => {
      h = await setup({
        script: scenario.steps([bash('echo blocked > blocked.txt'), structured({ role: 'implementor', outcome: 'blocked', summary: 'was blocked' })]),
        state: implementorState,
        bodies: { 7: 'x' },
        hook,
      });
      const handle = await h.adapter().startAgent(implementorParams);
      const result = await handle.result;
      expect(result).toEqual({ role: 'implementor', outcome: 'blocked', patch: null, summary: 'was blocked' });
      expect(latestToolResultText(h.api.mainBodies().at(-1))).toContain(reason);
      expect(readFileSync(handle.logFilePath, 'utf8')).toMatch(/\[hook\] blocked Bash/);
      if (reason === 'Bash validator failed') {
        expect(h.logger.entries.some((e) => e.level === 'error' && e.message.includes('validator hook failed'))).toBe(true);
      }
    });
  }

  it('a hook that never answers blocks the command once its bound passes', async () => {
    process.env.CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS = '300';
    // The hook keeps a way to settle its promise, as a slow validator would: the promise
    // stays reachable, so only the bound can end the wait.
    const unsettled = [];
    try {
      h = await setup({
        script: scenario.steps([bash('echo late > late.txt'), structured({ role: 'implementor', outcome: 'blocked', summary: 's' })]),
        state: implementorState,
        bodies: { 7: 'x' },
        hook: () => new Promise((resolve) => unsettled.push(resolve)),
      });
      const adapter = h.adapter();
      const result = await (await adapter.startAgent(implementorParams)).result;
      expect(result.outcome).toBe('blocked');
      expect(unsettled).toHaveLength(1);
      expect(latestToolResultText(h.api.mainBodies().at(-1))).toContain('did not answer within 300 ms');
    } finally {
      delete process.env.CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS;
    }
  });

  it('a hook whose promise nothing can settle blocks the command at once when the collector takes it, saying so', async () => {
    // `new Promise(() => {})` holds no way to settle it: a full collection may take it with
    // the reactions that would have answered (CI saw this as "oneshot canceled" before its
    // bound). Collections are forced here so it happens in every run, long before the bound.
    v8.setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc');
    const collecting = setInterval(gc, 20);
    process.env.CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS = '120000';
    try {
      h = await setup({
        script: scenario.steps([bash('echo late > late.txt'), structured({ role: 'implementor', outcome: 'blocked', summary: 's' })]),
        state: implementorState,
        bodies: { 7: 'x' },
        hook: () => new Promise(() => {}),
      });
      const started = Date.now();
      const result = await (await h.adapter().startAgent(implementorParams)).result;
      expect(result.outcome).toBe('blocked');
      const told = latestToolResultText(h.api.mainBodies().at(-1));
      expect(told).toContain('Bash validator failed');
      expect(told).toContain('the promise it returned was garbage-collected unsettled, so it can never answer');
      expect(Date.now() - started).toBeLessThan(30_000);
    } finally {
      clearInterval(collecting);
      delete process.env.CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS;
    }
  });
});

describe('result rejections carry the right code', () => {
  it('error_max_turns is ERR_AGENT_FAILED with the CLI errors', async () => {
    h = await setup({
      script: scenario.steps([bash('echo 1'), bash('echo 2'), done()]),
      repo: { agents: { implementor: { description: 'impl', tools: ['Bash'], maxTurns: 1, prompt: 'p' } } },
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const err = await rejection((await h.adapter().startAgent(implementorParams)).result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toContain('error_max_turns');
    expect(err.message).toContain('Reached maximum number of turns');
  });

  it('structured output retries exhausted is ERR_OUTPUT_INVALID', async () => {
    h = await setup({ script: scenario.always(reply(structured({ role: 'planner', create: 'not an array' }))) });
    const err = await rejection((await h.adapter().startAgent({ role: 'planner', specPaths: [] })).result);
    expect(err.code).toBe('ERR_OUTPUT_INVALID');
    expect(err.message).toContain('after the CLI');
  });

  it('a model that never produces output is ERR_OUTPUT_INVALID', async () => {
    h = await setup({ script: scenario.always(reply(text('I refuse to use tools.'))) });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_OUTPUT_INVALID');
    expect(err.message).toContain('without structured output');
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(log).toContain('=== Session failed ===');
    expect(log).not.toContain('Session completed');
  });

  it('an API error is ERR_AGENT_FAILED and its text is not output', async () => {
    // Held by nothing (apiOutageTolerance 0): what a failure past the tolerance comes to.
    h = await setup({ script: scenario.always(apiError(500, 'upstream on fire')), config: { apiOutageTolerance: 0 } });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    const [out, err] = await Promise.all([collect(handle.output), rejection(handle.result)]);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toContain('upstream on fire');
    expect(out).toBe('');
  });

  it('completed with no change is ERR_EMPTY_PATCH', async () => {
    h = await setup({ script: scenario.steps([done()]), state: implementorState, bodies: { 7: 'x' } });
    const err = await rejection((await h.adapter().startAgent(implementorParams)).result);
    expect(err.code).toBe('ERR_EMPTY_PATCH');
  });
});

describe('cancel and timeout stop everything', () => {
  it('cancelAgent during a long Bash command: ERR_CANCELLED, abort reason, no process left', async () => {
    const marker = sleepMarker(31);
    h = await setup({ script: scenario.steps([bash(`echo start; sleep ${marker}`), done()]), state: implementorState, bodies: { 7: 'x' } });
    const adapter = h.adapter();
    const handle = await adapter.startAgent(implementorParams);
    const seen = [];
    handle.abortSignal.addEventListener('abort', () => seen.push(['abort', handle.abortSignal.reason]));
    const outDone = collect(handle.output).then(() => seen.push(['output ended']));
    for (let i = 0; i < 100 && processesWith(`sleep ${marker}`).length === 0; i++) await new Promise((r) => setTimeout(r, 100));
    expect(processesWith(`sleep ${marker}`).length).toBeGreaterThan(0);
    const t0 = Date.now();
    adapter.cancelAgent(handle.sessionID);
    const err = await rejection(handle.result.finally(() => seen.push(['result settled'])));
    const elapsed = Date.now() - t0;
    await outDone;
    expect(err.code).toBe('ERR_CANCELLED');
    // abortSignal follows `result`: aborted with the reason right before the rejection
    expect(seen.slice(-2)).toEqual([['abort', 'cancelled'], ['result settled']]);
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(elapsed).toBeLessThan(10_000);
    // the worktree and branch are gone
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-7'))).toBe(false);
    expect(h.repo.git('branch', '--list', 'wi-7').trim()).toBe('');
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(log).toContain('=== Session cancelled ===');
  });

  it('maxAgentDuration elapsing: ERR_TIMEOUT, abort reason timeout, no process left', async () => {
    const marker = sleepMarker(32);
    // 10 s: the limit counts from startAgent, and the start (provisioning on a 2-core machine
    // busy with the rest of the suite) must fit in it for a handle to exist; 3 s once did not.
    h = await setup({ script: scenario.steps([bash(`echo start; sleep ${marker}`), done()]), state: implementorState, bodies: { 7: 'x' }, config: { maxAgentDuration: 10 } });
    const handle = await h.adapter().startAgent(implementorParams);
    const reasons = [];
    handle.abortSignal.addEventListener('abort', () => reasons.push(handle.abortSignal.reason));
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_TIMEOUT');
    expect(reasons).toEqual(['timeout']);
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
  });

  it('cancelAgent on an unknown id is a no-op', async () => {
    h = await setup({});
    expect(() => h.adapter().cancelAgent('no-such-session')).not.toThrow();
  });

  it('shutdown cancels every session and resolves after cleanup (resumeInterrupted: 0: the checkout removed; by default it is left for the next process, interrupted.test.mjs)', async () => {
    h = await setup({ script: scenario.steps([bash('echo a; sleep 33.5'), done()]), state: implementorState, bodies: { 7: 'x' }, config: { resumeInterrupted: 0 } });
    const adapter = h.adapter();
    const a = await adapter.startAgent(implementorParams);
    const b = await adapter.startAgent({ role: 'planner', specPaths: [] });
    const settled = Promise.allSettled([a.result, b.result]);
    await adapter.shutdown();
    const [ra, rb] = await settled;
    expect(ra.reason.code).toBe('ERR_CANCELLED');
    expect(rb.reason.code).toBe('ERR_CANCELLED');
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-7'))).toBe(false);
    expect(processesWith('sleep 33.5')).toEqual([]);
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CANCELLED');
  });
});

describe('the transcript', () => {
  it('records a success: header, init, text, tool use, hook, result, completed footer; no env values', async () => {
    h = await setup({
      script: scenario.steps([reply(text('Line one.\nLine two.'), bash('echo ok > ok.txt')), done('all good')]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    await handle.result;
    expect(handle.logFilePath).toMatch(/\/\d{13}-implementor-7-[0-9a-f-]{36}\.log$/);
    expect(handle.logFilePath).toContain(handle.sessionID);
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(log).toContain('=== Agent Session: implementor ===');
    expect(log).toContain(`Session ID: ${handle.sessionID}`);
    expect(log).toContain('Work Item: 7');
    expect(log).toMatch(/\[system\] init model=\S+ cwd=\S+wi-7 tools=\[.*Bash.*\]/);
    expect(log).toContain('[assistant]\n    Line one.\n    Line two.\n');
    expect(log).toContain('[tool_use] Bash: echo ok > ok.txt');
    expect(log).toContain('[hook] approved Bash: echo ok > ok.txt');
    expect(log).toMatch(/\[result\] subtype=success is_error=false duration_ms=\d+ cost_usd=\S+ turns=\d+ tokens\(in=\d+ out=\d+\)/);
    expect(log).toMatch(/=== Session completed ===\nReason: .*\nEnded: /);
    expect(log).not.toContain(h.config.env.ANTHROPIC_API_KEY);
    // the patch is kept next to the transcript
    expect(readFileSync(handle.logFilePath.replace(/\.log$/, '.patch'), 'utf8')).toContain('ok.txt');
  });

  it('is absent when logging is off (logFilePath null)', async () => {
    h = await setup({ script: scenario.steps([structured({ role: 'planner', create: [], close: [], update: [] })]), config: { logging: { agentSessions: false, logsDir: '' } } });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(handle.logFilePath).toBeNull();
    await handle.result;
  });

  it('a log that cannot be written never affects the session (warned through the logger)', async () => {
    h = await setup({ script: scenario.steps([structured({ role: 'planner', create: [], close: [], update: [] })]), config: { logging: { agentSessions: true, logsDir: '/proc/forbidden/logs' } } });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    expect(await handle.result).toEqual({ role: 'planner', create: [], close: [], update: [] });
    expect(h.logger.entries.some((e) => e.level === 'warn' && e.message.includes('cannot create session log'))).toBe(true);
  });
});
