#!/usr/bin/env node
// A scripted stand-in for the Claude Code CLI, for fault injection the real CLI cannot do.
// Speaks stream-json like the real one (see PROTOCOL-NOTES.md). Selected by env:
//   FAKE_CLI_MODE = ok | hang | crash-mid-stream | garbage-line | huge-line | exit-without-result | ignore-sigterm | memory-hog
//   FAKE_CLI_OUTPUT        JSON put in result.structured_output (mode ok / garbage-line / huge-line; default {})
//   FAKE_CLI_TEXT          assistant text to emit (default "working on it")
//   FAKE_CLI_HUGE_BYTES    size of the huge-line text (default 100 MB)
//   FAKE_CLI_ARGV_FILE     if set, argv and cwd are written there as JSON (so tests can check them)
// ignore-sigterm: ignores SIGTERM/SIGINT, spawns a detached grandchild (own process group) that
// also ignores SIGTERM and sleeps forever, reports its pid as {"type":"system","subtype":"fake_child","pid":N},
// never answers `interrupt` and never ends on its own.
// memory-hog: the CLI process itself grows by 16 MiB steps (touched) up to 4 GiB, then hangs:
// what ends a session is the CLI out of memory, not one of the agent's commands.
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

const mode = process.env.FAKE_CLI_MODE ?? 'ok';
const sessionId = (process.argv.find((a) => a.startsWith('--session-id=')) ?? '').slice('--session-id='.length) || randomUUID();
// FAKE_CLI_ENV_KEYS: comma-separated variable names whose values (or null) are recorded too.
const envKeys = (process.env.FAKE_CLI_ENV_KEYS ?? '').split(',').filter(Boolean);
const env = Object.fromEntries(envKeys.map((k) => [k, process.env[k] ?? null]));
if (process.env.FAKE_CLI_ARGV_FILE) writeFileSync(process.env.FAKE_CLI_ARGV_FILE, JSON.stringify({ argv: process.argv.slice(2), cwd: process.cwd(), pid: process.pid, env }));

const KNOWN = ['ok', 'hang', 'crash-mid-stream', 'garbage-line', 'huge-line', 'exit-without-result', 'ignore-sigterm', 'memory-hog'];
if (!KNOWN.includes(mode)) {
  process.stderr.write(`fake-cli: unknown FAKE_CLI_MODE ${mode}\n`);
  process.exit(2);
}

if (mode === 'ignore-sigterm') {
  process.on('SIGTERM', () => {});
  process.on('SIGINT', () => {});
}

/** Write one line; resolve when it is flushed to the pipe (so exits don't lose output). */
function emit(obj) {
  const line = (typeof obj === 'string' ? obj : JSON.stringify(obj)) + '\n';
  return new Promise((resolve) => {
    if (process.stdout.write(line)) resolve();
    else process.stdout.once('drain', resolve);
  });
}

const assistantText = (text) => ({
  type: 'assistant',
  message: {
    id: `msg_${randomUUID().replace(/-/g, '').slice(0, 20)}`,
    type: 'message',
    role: 'assistant',
    model: 'claude-fake',
    content: [{ type: 'text', text }],
    stop_reason: null,
    stop_sequence: null,
    usage: { input_tokens: 1, output_tokens: 1 },
  },
  parent_tool_use_id: null,
  session_id: sessionId,
  uuid: randomUUID(),
});

function structuredOutput() {
  try {
    return JSON.parse(process.env.FAKE_CLI_OUTPUT ?? '{}');
  } catch {
    return {};
  }
}

const result = (extra = {}) => ({
  type: 'result',
  subtype: 'success',
  is_error: false,
  num_turns: 2,
  result: JSON.stringify(structuredOutput()),
  structured_output: structuredOutput(),
  stop_reason: 'tool_use',
  terminal_reason: 'completed',
  session_id: sessionId,
  total_cost_usd: 0,
  usage: { input_tokens: 1, output_tokens: 1 },
  modelUsage: {},
  permission_denials: [],
  errors: [],
  duration_ms: 1,
  uuid: randomUUID(),
  ...extra,
});

let started = false;
let keepAlive = null;

async function runTurn() {
  await emit({ type: 'system', subtype: 'init', cwd: process.cwd(), session_id: sessionId, tools: ['Bash', 'StructuredOutput'], model: 'claude-fake', permissionMode: 'bypassPermissions', claude_code_version: '0.0.0-fake', fake: true });
  const text = process.env.FAKE_CLI_TEXT ?? 'working on it';
  switch (mode) {
    case 'ok':
      await emit(assistantText(text));
      await emit(result());
      return;
    case 'garbage-line':
      await emit(assistantText(text));
      await emit('this is not JSON {{{');
      await emit(assistantText(`${text} (after garbage)`));
      await emit(result());
      return;
    case 'huge-line': {
      const n = Number(process.env.FAKE_CLI_HUGE_BYTES ?? 100 * 1024 * 1024);
      await emit(assistantText('x'.repeat(n)));
      await emit(result());
      return;
    }
    case 'crash-mid-stream':
      await emit(assistantText(text));
      process.stderr.write('fake-cli: simulated crash (mid-stream)\n');
      process.exit(3);
      return;
    case 'hang':
      // runs until signalled (default SIGTERM handling: it dies)
      await emit(assistantText(text));
      keepAlive = setInterval(() => {}, 1e9);
      return;
    case 'exit-without-result':
      await emit(assistantText(text));
      process.exit(0);
      return;
    case 'memory-hog': {
      await emit(assistantText(text));
      const held = [];
      for (let i = 0; i < 256; i += 1) {
        held.push(Buffer.alloc(16 << 20, 1));
        await new Promise((r) => setTimeout(r, 5));
      }
      keepAlive = setInterval(() => held.length, 1e9);
      return;
    }
    case 'ignore-sigterm': {
      const child = spawn(
        process.execPath,
        ['-e', "process.on('SIGTERM',()=>{});process.on('SIGINT',()=>{});setInterval(()=>{},1e9)"],
        { detached: true, stdio: 'ignore' },
      );
      child.unref();
      await emit({ type: 'system', subtype: 'fake_child', pid: child.pid, session_id: sessionId });
      await emit(assistantText(text));
      keepAlive = setInterval(() => {}, 1e9); // never ends by itself
      return;
    }
  }
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', async (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch {
    process.stderr.write(`fake-cli: bad input line: ${line.slice(0, 200)}\n`);
    return;
  }
  if (msg.type === 'control_request') {
    const sub = msg.request?.subtype;
    if (sub === 'initialize') {
      await emit({
        type: 'control_response',
        response: { subtype: 'success', request_id: msg.request_id, response: { pid: process.pid, claude_code_version: '0.0.0-fake', hooks_applied: true, hook_on_failure_supported: true, agents: [], models: [], commands: [] } },
      });
    } else if (sub === 'interrupt') {
      if (mode === 'ignore-sigterm') return; // never answers
      await emit({ type: 'control_response', response: { subtype: 'success', request_id: msg.request_id, response: { still_queued: [] } } });
      await emit(result({ subtype: 'error_during_execution', is_error: true, structured_output: undefined, result: undefined, terminal_reason: 'aborted_tools', errors: ['interrupted'] }));
    } else {
      await emit({ type: 'control_response', response: { subtype: 'error', request_id: msg.request_id, error: `fake-cli: unsupported control request ${sub}` } });
    }
  } else if (msg.type === 'user' && !started) {
    started = true;
    await runTurn();
  }
});
rl.on('close', () => {
  // stdin closed: like the real CLI, exit once idle (ignore-sigterm keeps running regardless).
  if (mode !== 'ignore-sigterm') setTimeout(() => process.exit(0), 10);
  else if (!keepAlive) keepAlive = setInterval(() => {}, 1e9);
});
