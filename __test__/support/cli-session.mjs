// Drive a Claude Code CLI process (real or fake-cli.mjs) over stream-json, without the adapter.
//   const s = spawnCli({ bin, cwd, env, args });
//   await s.initialize({ hooks, jsonSchema, systemPrompt: [''], agents });
//   s.sendUser('do it');
//   const result = await s.waitFor((m) => m.type === 'result');
//   await s.close();
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';

/** The argv the official SDK passes (flags as --flag=value). */
export function cliArgs({ agent, jsonSchema, maxTurns, model, sessionId, extra = [] } = {}) {
  const a = ['--output-format', 'stream-json', '--verbose', '--input-format', 'stream-json'];
  if (maxTurns != null) a.push(`--max-turns=${maxTurns}`);
  if (model) a.push(`--model=${model}`);
  if (agent) a.push(`--agent=${agent}`);
  if (jsonSchema) a.push(`--json-schema=${JSON.stringify(jsonSchema)}`);
  a.push('--setting-sources=', '--permission-mode=bypassPermissions', '--allow-dangerously-skip-permissions');
  if (sessionId) a.push(`--session-id=${sessionId}`);
  return [...a, ...extra];
}

/**
 * Spawn the CLI in its own process group. `onControl(request, msg)` answers CLI→host control
 * requests (hook_callback, can_use_tool, …): return the `response` payload, or throw to send an
 * error response. Every stdout line is parsed and kept in `messages` (non-JSON lines in `badLines`).
 */
export function spawnCli({ bin, cwd, env, args = [], onControl } = {}) {
  const t0 = performance.now();
  const child = spawn(bin, args, { cwd, env, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
  const messages = [];
  const badLines = [];
  const timings = { spawn: 0 };
  let stderr = '';
  const waiters = new Set();
  const pending = new Map(); // our request_id → resolve
  let exitInfo = null;
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exitInfo = { code, signal, at: performance.now() - t0 };
      resolve(exitInfo);
      for (const w of waiters) w.reject(new Error(`CLI exited (code ${code}, signal ${signal}) before the awaited message; stderr: ${stderr.slice(-2000)}`));
      waiters.clear();
    });
  });
  child.on('error', () => {});
  child.stdin.on('error', () => {});
  child.stderr.on('data', (d) => {
    stderr += d;
  });

  // Line splitter that stays linear for huge lines: only the new chunk is scanned for '\n'.
  let parts = [];
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (d) => {
    let start = 0;
    let nl;
    while ((nl = d.indexOf('\n', start)) >= 0) {
      parts.push(d.slice(start, nl));
      const line = parts.length === 1 ? parts[0] : parts.join('');
      parts = [];
      start = nl + 1;
      handleLine(line);
    }
    if (start < d.length) parts.push(d.slice(start));
  });

  function handleLine(line) {
    if (!line.trim()) return;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      badLines.push(line.length > 10_000 ? line.slice(0, 10_000) : line);
      return;
    }
    msg.__t = performance.now() - t0;
    onMessage(msg);
  }

  const write = (obj) => child.stdin.write(JSON.stringify(obj) + '\n');

  async function onMessage(msg) {
    messages.push(msg);
    if (msg.type === 'control_response') {
      const id = msg.response?.request_id;
      const p = pending.get(id);
      if (p) {
        pending.delete(id);
        p(msg.response);
      }
    } else if (msg.type === 'control_request') {
      let response;
      try {
        response = onControl ? await onControl(msg.request, msg) : {};
        write({ type: 'control_response', response: { subtype: 'success', request_id: msg.request_id, response: response ?? {} } });
      } catch (err) {
        write({ type: 'control_response', response: { subtype: 'error', request_id: msg.request_id, error: String(err?.message ?? err) } });
      }
    }
    if (msg.type === 'result' && timings.result == null) timings.result = msg.__t;
    for (const w of [...waiters]) {
      if (w.pred(msg)) {
        waiters.delete(w);
        w.resolve(msg);
      }
    }
  }

  function waitFor(pred, { timeoutMs = 30_000 } = {}) {
    const found = messages.find(pred);
    if (found) return Promise.resolve(found);
    if (exitInfo) return Promise.reject(new Error(`CLI already exited (code ${exitInfo.code}); stderr: ${stderr.slice(-2000)}`));
    return new Promise((resolve, reject) => {
      const w = { pred, resolve, reject };
      const timer = setTimeout(() => {
        waiters.delete(w);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for a message; last: ${JSON.stringify(messages.slice(-3)).slice(0, 2000)}; stderr: ${stderr.slice(-2000)}`));
      }, timeoutMs);
      w.resolve = (m) => {
        clearTimeout(timer);
        resolve(m);
      };
      w.reject = (e) => {
        clearTimeout(timer);
        reject(e);
      };
      waiters.add(w);
    });
  }

  /** Send a control request and resolve with the CLI's `response` object ({subtype, request_id, response|error}). */
  function controlRequest(request, { timeoutMs = 30_000 } = {}) {
    const request_id = `req_${randomUUID()}`;
    const p = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no control_response to ${request.subtype} in ${timeoutMs} ms; stderr: ${stderr.slice(-2000)}`)), timeoutMs);
      pending.set(request_id, (r) => {
        clearTimeout(timer);
        resolve(r);
      });
      exited.then((e) => reject(new Error(`CLI exited (code ${e.code}) before answering ${request.subtype}; stderr: ${stderr.slice(-2000)}`)));
    });
    write({ type: 'control_request', request_id, request });
    return p;
  }

  return {
    child,
    pid: child.pid,
    messages,
    badLines,
    timings,
    get stderr() {
      return stderr;
    },
    exited,
    write,
    waitFor,
    controlRequest,
    async initialize(fields = {}) {
      const r = await controlRequest({ subtype: 'initialize', ...fields });
      timings.initialized = performance.now() - t0;
      return r;
    },
    sendUser(textOrContent) {
      const content = typeof textOrContent === 'string' ? [{ type: 'text', text: textOrContent }] : textOrContent;
      write({ type: 'user', session_id: '', message: { role: 'user', content }, parent_tool_use_id: null });
    },
    result(opts) {
      return waitFor((m) => m.type === 'result', opts);
    },
    /** Close stdin and wait for exit; SIGKILL the process group after `graceMs`. */
    async close({ graceMs = 5_000 } = {}) {
      if (exitInfo) return exitInfo;
      child.stdin.end();
      const t = setTimeout(() => this.kill(), graceMs);
      const e = await exited;
      clearTimeout(t);
      return e;
    },
    /** SIGKILL the CLI's process group (the CLI runs Bash commands in groups of their own). */
    kill(signal = 'SIGKILL') {
      if (exitInfo) return;
      try {
        process.kill(-child.pid, signal);
      } catch {
        try {
          child.kill(signal);
        } catch {
          // gone
        }
      }
    },
    get exitInfo() {
      return exitInfo;
    },
  };
}

/** True while `pid` exists and is not a zombie (Linux: reads /proc; elsewhere signal 0). */
export function isProcessAlive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    if (process.platform === 'linux') return false;
  }
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

export { randomUUID };
