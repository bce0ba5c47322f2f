// The fake Messages API and the real Claude Code CLI working together, WITHOUT the adapter:
// these tests pin down the CLI behaviour the Rust protocol code relies on (PROTOCOL-NOTES.md).
import { afterEach, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  apiError,
  bash,
  latestToolResultText,
  reply,
  scenario,
  startFakeApi,
  structured,
  systemText,
  text,
  thinking,
  toolNames,
  toolResults,
  userText,
} from './support/fake-api.mjs';
import { claudeBinaryPath, offlineCliEnv } from './support/cli-env.mjs';
import { makeTempRepo } from './support/repo.mjs';
import { cliArgs, randomUUID, spawnCli } from './support/cli-session.mjs';

const SCHEMA = {
  type: 'object',
  properties: { summary: { type: 'string' } },
  required: ['summary'],
  additionalProperties: false,
};
const AGENT_PROMPT = 'You are the implementor agent. Follow the work item.';

const open = []; // { session, api, repo, configDir } to clean up after each test

afterEach(async () => {
  while (open.length) {
    const { session, api, repo, configDir } = open.pop();
    if (session && !session.exitInfo) {
      session.kill('SIGKILL');
      await session.exited;
    }
    await api?.close();
    repo?.cleanup();
    if (configDir) rmSync(configDir, { recursive: true, force: true });
  }
});

/**
 * One CLI session against a fresh fake API and temp repo. Returns once `initialize` was answered
 * and the prompt sent; the caller awaits `session.result()`.
 */
async function startSession({
  script,
  steps,
  hook = () => ({ continue: true }),
  matcher = { onFailure: 'block' },
  maxTurns,
  maxRetries = 0,
  schema = SCHEMA,
  prompt = 'Implement the work item.',
} = {}) {
  const api = await startFakeApi({ script: script ?? scenario.steps(steps) });
  const repo = makeTempRepo();
  const configDir = mkdtempSync(join(tmpdir(), 'claude-config-'));
  const hookCalls = [];
  const session = spawnCli({
    bin: claudeBinaryPath(),
    cwd: repo.root,
    env: offlineCliEnv({ apiUrl: api.url, configDir, maxRetries }),
    args: cliArgs({ agent: 'implementor', jsonSchema: schema, maxTurns, sessionId: randomUUID() }),
    onControl: async (request) => {
      if (request.subtype !== 'hook_callback') throw new Error(`unexpected control request ${request.subtype}`);
      hookCalls.push(request);
      return hook(request);
    },
  });
  const ctx = { session, api, repo, configDir, hookCalls };
  open.push(ctx);
  ctx.init = await session.initialize({
    hooks: { PreToolUse: [{ matcher: 'Bash', hookCallbackIds: ['hook_0'], ...matcher }] },
    jsonSchema: schema,
    systemPrompt: [''],
    agents: {
      implementor: { description: 'Implements one work item', prompt: AGENT_PROMPT, tools: ['Bash', 'Read', 'StructuredOutput'], model: 'inherit' },
    },
  });
  session.sendUser(prompt);
  return ctx;
}

const DENY = { hookSpecificOutput: { hookEventName: 'PreToolUse', permissionDecision: 'deny', permissionDecisionReason: 'nope' } };

describe('real CLI against the fake Messages API', () => {
  it('answers initialize, sends the agent prompt, schema tool and model to the API, and returns StructuredOutput as result.structured_output', async () => {
    const { session, api, init } = await startSession({ steps: [structured({ summary: 'all done' })] });
    const result = await session.result();

    expect(init.subtype).toBe('success');
    expect(init.response).toMatchObject({ claude_code_version: expect.any(String), hooks_applied: true, pid: session.pid });
    const sysInit = session.messages.find((m) => m.type === 'system' && m.subtype === 'init');
    expect(sysInit).toMatchObject({ cwd: expect.any(String), tools: ['Bash', 'Read', 'StructuredOutput'], permissionMode: 'bypassPermissions' });

    expect(result).toMatchObject({ type: 'result', subtype: 'success', is_error: false, structured_output: { summary: 'all done' } });
    expect(result.session_id).toBe(sysInit.session_id);

    // Only main-loop requests, all POST /v1/messages?beta=true, streaming.
    expect(api.requests.map((r) => `${r.method} ${r.path} ${r.query.beta} ${r.kind}`)).toEqual(['POST /v1/messages true main']);
    const body = api.requests[0].body;
    expect(body.stream).toBe(true);
    expect(typeof body.model).toBe('string');
    expect(toolNames(body)).toContain('StructuredOutput');
    expect(toolNames(body)).toContain('Bash');
    expect(body.tools.find((t) => t.name === 'StructuredOutput').input_schema).toEqual(SCHEMA);
    expect(systemText(body)).toContain(AGENT_PROMPT);
    expect(userText(body)).toContain('Implement the work item.');
    // A valid StructuredOutput ends the session without another API call.
    expect(api.requests).toHaveLength(1);
    expect((await session.close()).code).toBe(0);
  });

  it('runs an approved Bash call ({continue:true}) and passes the hook the tool input', async () => {
    const { session, api, repo, hookCalls } = await startSession({
      steps: [bash('echo hi > x.txt', 'write x'), structured({ summary: 'wrote x' })],
    });
    const result = await session.result();
    expect(result.subtype).toBe('success');
    expect(existsSync(join(repo.root, 'x.txt'))).toBe(true);
    expect(hookCalls).toHaveLength(1);
    expect(hookCalls[0]).toMatchObject({
      subtype: 'hook_callback',
      callback_id: 'hook_0',
      tool_use_id: expect.any(String),
      input: {
        hook_event_name: 'PreToolUse',
        tool_name: 'Bash',
        tool_input: { command: 'echo hi > x.txt', description: 'write x' },
        permission_mode: 'bypassPermissions',
        agent_type: 'implementor',
        cwd: expect.any(String),
        session_id: result.session_id,
      },
    });
    expect(hookCalls[0].input.tool_use_id).toBe(hookCalls[0].tool_use_id);
    expect(latestToolResultText(api.mainBodies()[1])).toBe('(Bash completed with no output)');
  });

  it('runs a Bash call approved with the hookSpecificOutput allow form', async () => {
    const { session, repo } = await startSession({
      steps: [bash('echo hi > y.txt'), structured({ summary: 'ok' })],
      hook: () => ({ hookSpecificOutput: { hookEventName: 'PreToolUse', permissionDecision: 'allow' } }),
    });
    expect((await session.result()).subtype).toBe('success');
    expect(existsSync(join(repo.root, 'y.txt'))).toBe(true);
  });

  it('does not run a Bash call the hook denies, and the model sees the reason in the tool_result', async () => {
    const { session, api, repo } = await startSession({
      steps: [bash('echo hi > x.txt'), structured({ summary: 'blocked' })],
      hook: () => DENY,
    });
    const result = await session.result();
    expect(existsSync(join(repo.root, 'x.txt'))).toBe(false);
    const [tr] = toolResults(api.mainBodies()[1]);
    expect(tr.is_error).toBe(true);
    expect(tr.text).toBe('PreToolUse:Bash hook error: nope');
    expect(result).toMatchObject({ subtype: 'success', structured_output: { summary: 'blocked' } });
    expect(result.permission_denials).toEqual([expect.objectContaining({ tool_name: 'Bash', tool_input: expect.objectContaining({ command: 'echo hi > x.txt' }) })]);
  });

  it('also blocks with the legacy {decision:"block", reason} answer', async () => {
    const { session, api, repo } = await startSession({
      steps: [bash('echo hi > x.txt'), structured({ summary: 'blocked' })],
      hook: () => ({ decision: 'block', reason: 'legacy nope' }),
    });
    await session.result();
    expect(existsSync(join(repo.root, 'x.txt'))).toBe(false);
    expect(latestToolResultText(api.mainBodies()[1])).toBe('PreToolUse:Bash hook error: legacy nope');
  });

  it('blocks the tool when the hook answer is an error and the matcher has onFailure:"block"', async () => {
    const { session, api, repo } = await startSession({
      steps: [bash('echo hi > x.txt'), structured({ summary: 'x' })],
      hook: () => {
        throw new Error('validator crashed');
      },
      matcher: { onFailure: 'block' },
    });
    await session.result();
    expect(existsSync(join(repo.root, 'x.txt'))).toBe(false);
    expect(latestToolResultText(api.mainBodies()[1])).toContain('blocking because onFailure is "block"');
    expect(session.messages).toContainEqual(expect.objectContaining({ type: 'system', subtype: 'informational', tag: 'hook_callback_failed' }));
  });

  it('fails open (runs the tool) on a hook error answer when the matcher has no onFailure', async () => {
    const { session, repo } = await startSession({
      steps: [bash('echo hi > x.txt'), structured({ summary: 'x' })],
      hook: () => {
        throw new Error('validator crashed');
      },
      matcher: {},
    });
    await session.result();
    expect(existsSync(join(repo.root, 'x.txt'))).toBe(true);
  });

  it('ends with error_max_turns when --max-turns is reached', async () => {
    const { session } = await startSession({ steps: [bash('echo hi > x.txt'), structured({ summary: 'x' })], maxTurns: 1 });
    const result = await session.result();
    expect(result).toMatchObject({ subtype: 'error_max_turns', is_error: true, terminal_reason: 'max_turns', errors: ['Reached maximum number of turns (1)'] });
    expect(result.structured_output).toBeUndefined();
    expect((await session.close()).code).toBe(1);
  });

  it('ends with error_max_structured_output_retries after 5 invalid StructuredOutput calls', async () => {
    const { session, api } = await startSession({ steps: [structured({ wrong: 1 })] });
    const result = await session.result();
    expect(result).toMatchObject({ subtype: 'error_max_structured_output_retries', is_error: true, terminal_reason: 'structured_output_retry_exhausted' });
    expect(result.errors[0]).toMatch(/^Failed to provide valid structured output after 5 attempts/);
    expect(result.errors[0]).toContain("must have required property 'summary'");
    expect(api.mainRequests()).toHaveLength(5);
    expect(latestToolResultText(api.mainBodies()[1])).toMatch(/^Output does not match required schema: /);
  });

  it.each([
    [500, 'api_error', 'fake server error'],
    [529, 'overloaded_error', 'Overloaded'],
  ])('reports an API %i as subtype success with is_error and api_error_status (no retries with CLAUDE_CODE_MAX_RETRIES=0)', async (status, type, message) => {
    const { session, api } = await startSession({ steps: [apiError(status, message, type)] });
    const result = await session.result();
    expect(result).toMatchObject({ subtype: 'success', is_error: true, api_error_status: status, terminal_reason: 'api_error' });
    expect(result.result).toContain(`API Error: ${status} ${message}`);
    expect(result.structured_output).toBeUndefined();
    expect(api.mainRequests()).toHaveLength(1);
    // The error is also emitted as a synthetic assistant text message.
    expect(session.messages).toContainEqual(
      expect.objectContaining({ type: 'assistant', is_api_error_message: true, api_error_status: status, message: expect.objectContaining({ model: '<synthetic>' }) }),
    );
    expect((await session.close()).code).toBe(1);
  });

  it('retries a 5xx CLAUDE_CODE_MAX_RETRIES times, announcing each retry as system/api_retry', async () => {
    const { session, api } = await startSession({ steps: [apiError(500)], maxRetries: 1 });
    const result = await session.result();
    expect(result).toMatchObject({ is_error: true, api_error_status: 500 });
    expect(api.mainRequests()).toHaveLength(2);
    const retries = session.messages.filter((m) => m.type === 'system' && m.subtype === 'api_retry');
    expect(retries).toEqual([expect.objectContaining({ attempt: 1, max_retries: 1, error_status: 500, retry_delay_ms: expect.any(Number) })]);
  });

  it('reports an API 400 as an error result (after a few quick fallback re-sends)', async () => {
    const { session, api } = await startSession({ steps: [apiError(400, 'bad request')] });
    const result = await session.result();
    expect(result).toMatchObject({ subtype: 'success', is_error: true, api_error_status: 400, result: 'API Error: 400 bad request' });
    // The CLI re-sends with reduced features (thinking display, tools) even with MAX_RETRIES=0.
    expect(api.mainRequests().length).toBeGreaterThanOrEqual(1);
  });

  it('stops a long-running Bash call on an interrupt control request with error_during_execution', async () => {
    // A leading `sleep N` is refused by the CLI's Bash tool ("Blocked: standalone sleep"), so lead with echo.
    const { session, repo } = await startSession({ steps: [bash('echo start; sleep 30; echo finished > slept.txt'), structured({ summary: 'x' })] });
    await session.waitFor((m) => m.type === 'control_request' && m.request.subtype === 'hook_callback');
    await new Promise((r) => setTimeout(r, 500)); // let the command start
    const t0 = performance.now();
    const ack = await session.controlRequest({ subtype: 'interrupt' });
    expect(ack).toMatchObject({ subtype: 'success', response: { still_queued: [] } });
    const result = await session.result({ timeoutMs: 10_000 });
    const ms = performance.now() - t0;
    expect(result).toMatchObject({ subtype: 'error_during_execution', is_error: true, terminal_reason: 'aborted_tools' });
    expect(ms).toBeLessThan(5_000);
    expect(existsSync(join(repo.root, 'slept.txt'))).toBe(false);
  });

  it('nudges a model that answers with text only once, then ends as success without structured_output', async () => {
    const { session, api } = await startSession({ steps: [text('I am done.'), text('Still just text.')] });
    const result = await session.result();
    const bodies = api.mainBodies();
    expect(bodies).toHaveLength(2);
    expect(userText(bodies[1])).toContain('[structured-output-enforce] You MUST call the StructuredOutput tool');
    expect(result).toMatchObject({ subtype: 'success', is_error: false, result: 'Still just text.' });
    expect(result.structured_output).toBeUndefined();
  });

  it('accepts StructuredOutput given in answer to the nudge', async () => {
    const { session } = await startSession({ steps: [text('I am done.'), structured({ summary: 'late' })] });
    const result = await session.result();
    expect(result).toMatchObject({ subtype: 'success', structured_output: { summary: 'late' } });
  });

  it('emits one assistant message per content block, sharing the API message id', async () => {
    const { session } = await startSession({
      steps: [reply(thinking('let me think'), text('Running it.'), bash('echo a')), structured({ summary: 'x' })],
    });
    await session.result();
    const assistants = session.messages.filter((m) => m.type === 'assistant');
    expect(assistants.slice(0, 3).map((m) => m.message.content.map((b) => b.type))).toEqual([['thinking'], ['text'], ['tool_use']]);
    expect(new Set(assistants.slice(0, 3).map((m) => m.message.id)).size).toBe(1);
    expect(assistants[1].message.content[0].text).toBe('Running it.');
  });

  it('relays large assistant text (10 x 1 MB blocks) as 10 assistant messages', async () => {
    const { session } = await startSession({ script: scenario.textFlood({ messages: 10, bytesPerMessage: 1_000_000, output: { summary: 'flood' } }) });
    const result = await session.result();
    const texts = session.messages.filter((m) => m.type === 'assistant' && m.message.content[0].type === 'text');
    expect(texts).toHaveLength(10);
    expect(texts.every((m) => m.message.content[0].text.length === 1_000_000)).toBe(true);
    expect(result.structured_output).toEqual({ summary: 'flood' });
  });

  it('measures spawn → initialize answer → result for a one-step session', async () => {
    const { session } = await startSession({ steps: [structured({ summary: 'x' })] });
    await session.result();
    const { initialized, result } = session.timings;
    console.log(`timings: spawn→initialize response ${initialized.toFixed(0)} ms, spawn→result ${result.toFixed(0)} ms`);
    expect(initialized).toBeGreaterThan(0);
    expect(result).toBeGreaterThan(initialized);
    expect(result).toBeLessThan(15_000);
  });
});
