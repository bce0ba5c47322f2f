// A fake Anthropic Messages API for driving the real Claude Code CLI offline.
//
//   const api = await startFakeApi({ script });   // { url, port, requests, mainRequests(), setScript(), close() }
//   env.ANTHROPIC_BASE_URL = api.url;
//
// `script(body, request)` decides each reply from the request body alone (stateless). A reply is
//   { content: [block…], stop_reason?, usage?, delayMs?, headers? }
//   { error: { status, type?, message? }, delayMs?, headers? }   → HTTP error with the API's error body
//   { streamError: { type?, message? }, content? }               → 200, some blocks, then an SSE `error` event
//   { hang: true }                                               → never answers (until close())
//   { cut: true }                                                → reads the request, then closes the
//                                                                  connection without an answer
//   { cutMidway: true }                                          → 200 and the answer's first events,
//                                                                  then closes the connection
// where a block is one of
//   { type:'text', text }            { type:'thinking', thinking, signature? }
//   { type:'tool_use', name, input, id? }
// Helpers below build blocks (text(), bash(), structured(), thinking(), toolUse()) and scripts
// (scenario.steps()). Requests that are not the agent's main loop (no tools offered) get a
// harmless text reply and never reach the script (see isMainLoopRequest).
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';

/** Large text deltas are split into chunks of this many characters. */
const DELTA_CHUNK = 256 * 1024;

let idCounter = 0;
const newId = (prefix) => `${prefix}_${randomBytes(6).toString('hex')}${(++idCounter).toString(36)}`;

// ---------------------------------------------------------------- block / reply builders

export const text = (t) => ({ type: 'text', text: String(t) });
export const thinking = (t, signature = 'sig_fake') => ({ type: 'thinking', thinking: String(t), signature });
export const toolUse = (name, input, id) => ({ type: 'tool_use', name, input, ...(id ? { id } : {}) });
export const bash = (command, description = 'run a command') => toolUse('Bash', { command, description });
export const structured = (output) => toolUse('StructuredOutput', output);
/** A reply: `reply(text('a'), bash('ls'))`. Plain strings become text blocks. */
export const reply = (...blocks) => ({ content: blocks.map((b) => (typeof b === 'string' ? text(b) : b)) });
export const apiError = (status, message = `fake ${status}`, type = defaultErrorType(status)) => ({ error: { status, type, message } });
/** `bytes` characters of filler text (ASCII, so characters = bytes). */
export const filler = (bytes, unit = 'lorem ipsum dolor sit amet ') => unit.repeat(Math.ceil(bytes / unit.length)).slice(0, bytes);

function defaultErrorType(status) {
  return (
    {
      400: 'invalid_request_error',
      401: 'authentication_error',
      403: 'permission_error',
      404: 'not_found_error',
      413: 'request_too_large',
      429: 'rate_limit_error',
      500: 'api_error',
      529: 'overloaded_error',
    }[status] ?? 'api_error'
  );
}

/** Normalise what a script returned: a block, an array of blocks or a string → a reply. */
function normaliseReply(r) {
  if (r == null) return reply(text('ok'));
  if (typeof r === 'string') return reply(text(r));
  if (Array.isArray(r)) return reply(...r);
  if (r.type) return reply(r); // a single block
  return r;
}

// ---------------------------------------------------------------- request inspection

/**
 * The agent's main loop offers tools (at least StructuredOutput when a schema is set); side
 * queries the CLI may make (titles, summaries, classifiers) offer none.
 */
export function isMainLoopRequest(body) {
  return Array.isArray(body?.tools) && body.tools.length > 0;
}

/** Number of assistant turns already in the conversation = index of the turn being asked for. */
export function assistantTurns(body) {
  return (body?.messages ?? []).filter((m) => m.role === 'assistant').length;
}

function contentArray(m) {
  return typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : (m.content ?? []);
}

function toolResultText(block) {
  const c = block.content;
  if (typeof c === 'string') return c;
  if (Array.isArray(c)) return c.map((x) => (x.type === 'text' ? x.text : '')).join('');
  return '';
}

/** All tool_result blocks of the request, oldest first: [{ tool_use_id, is_error, text }]. */
export function toolResults(body) {
  const out = [];
  for (const m of body?.messages ?? []) {
    if (m.role !== 'user') continue;
    for (const b of contentArray(m)) {
      if (b.type === 'tool_result') out.push({ tool_use_id: b.tool_use_id, is_error: !!b.is_error, text: toolResultText(b) });
    }
  }
  return out;
}

/** Text of the latest tool_result in the request (e.g. a hook's block reason), or null. */
export function latestToolResultText(body) {
  const all = toolResults(body);
  return all.length ? all[all.length - 1].text : null;
}

/** Names of the tools offered in the request. */
export const toolNames = (body) => (body?.tools ?? []).map((t) => t.name);

/** The system prompt as one string (the API accepts a string or an array of text blocks). */
export function systemText(body) {
  const s = body?.system;
  if (typeof s === 'string') return s;
  if (Array.isArray(s)) return s.map((b) => b.text ?? '').join('\n');
  return '';
}

/** Text of every user message block (the prompt and any reminders), joined. */
export function userText(body) {
  return (body?.messages ?? [])
    .filter((m) => m.role === 'user')
    .flatMap((m) => contentArray(m))
    .filter((b) => b.type === 'text')
    .map((b) => b.text)
    .join('\n');
}

// ---------------------------------------------------------------- scripts

export const scenario = {
  /**
   * Step i answers the i-th assistant turn (the number of assistant messages in the request);
   * past the end the last step repeats. A step is a reply, a block, an array of blocks, a
   * string, or a function (body) => any of those.
   */
  steps(steps) {
    if (!steps.length) throw new Error('scenario.steps needs at least one step');
    return (body) => {
      const step = steps[Math.min(assistantTurns(body), steps.length - 1)];
      return typeof step === 'function' ? step(body) : step;
    };
  },
  /** Always the same reply. */
  always(r) {
    return () => r;
  },
  /**
   * One API response made of `messages` text blocks of `bytesPerMessage` characters each
   * (the CLI emits one assistant message per content block), then a StructuredOutput call if
   * `output` is given; after that turn, `then` (default: the structured output again / 'done').
   */
  textFlood({ messages, bytesPerMessage, output, then } = {}) {
    const chunk = filler(bytesPerMessage);
    const blocks = Array.from({ length: messages }, () => ({ type: 'text', text: chunk }));
    const first = { content: output !== undefined ? [...blocks, structured(output)] : blocks };
    const after = then ?? (output !== undefined ? reply(structured(output)) : reply(text('done')));
    return scenario.steps([first, after]);
  },
};

// ---------------------------------------------------------------- SSE writer

function writeAsync(res, chunk) {
  if (res.destroyed) return Promise.resolve();
  if (res.write(chunk)) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

const sse = (event, data) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;

function usageFor(body, outChars, extra) {
  const inChars = JSON.stringify(body?.messages ?? []).length + JSON.stringify(body?.system ?? '').length;
  return {
    input_tokens: Math.max(1, Math.round(inChars / 4)),
    output_tokens: Math.max(1, Math.round(outChars / 4)),
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 0,
    ...extra,
  };
}

function finalBlocks(content) {
  return content.map((b) => {
    if (b.type === 'tool_use') return { type: 'tool_use', id: b.id ?? newId('toolu'), name: b.name, input: b.input ?? {} };
    if (b.type === 'thinking') return { type: 'thinking', thinking: b.thinking ?? '', signature: b.signature ?? 'sig_fake' };
    if (b.type === 'text') return { type: 'text', text: b.text ?? '' };
    return b;
  });
}

function stopReasonFor(r, blocks) {
  return r.stop_reason ?? (blocks.some((b) => b.type === 'tool_use') ? 'tool_use' : 'end_turn');
}

async function writeStream(res, body, r) {
  const blocks = finalBlocks(r.content ?? []);
  const model = body?.model ?? 'claude-fake';
  const msgId = newId('msg');
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'request-id': newId('req'),
    ...(r.headers ?? {}),
  });
  await writeAsync(
    res,
    sse('message_start', {
      type: 'message_start',
      message: {
        id: msgId,
        type: 'message',
        role: 'assistant',
        model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: usageFor(body, 0, { output_tokens: 1 }),
      },
    }),
  );
  if (r.cutMidway) {
    // The answer began (the client has its head and its first event), then the connection goes.
    await writeAsync(res, sse('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }));
    await writeAsync(res, sse('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Half an ans' } }));
    await new Promise((resolve) => setTimeout(resolve, 50));
    res.socket?.destroy();
    return;
  }
  let outChars = 0;
  for (let index = 0; index < blocks.length; index++) {
    const b = blocks[index];
    if (res.destroyed) return;
    if (b.type === 'text') {
      await writeAsync(res, sse('content_block_start', { type: 'content_block_start', index, content_block: { type: 'text', text: '' } }));
      for (let i = 0; i < b.text.length || i === 0; i += DELTA_CHUNK) {
        await writeAsync(
          res,
          sse('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'text_delta', text: b.text.slice(i, i + DELTA_CHUNK) } }),
        );
        if (b.text.length === 0) break;
      }
      outChars += b.text.length;
    } else if (b.type === 'thinking') {
      await writeAsync(res, sse('content_block_start', { type: 'content_block_start', index, content_block: { type: 'thinking', thinking: '', signature: '' } }));
      await writeAsync(res, sse('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'thinking_delta', thinking: b.thinking } }));
      await writeAsync(res, sse('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'signature_delta', signature: b.signature } }));
      outChars += b.thinking.length;
    } else if (b.type === 'tool_use') {
      await writeAsync(
        res,
        sse('content_block_start', { type: 'content_block_start', index, content_block: { type: 'tool_use', id: b.id, name: b.name, input: {} } }),
      );
      const json = JSON.stringify(b.input);
      await writeAsync(res, sse('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: json } }));
      outChars += json.length;
    }
    await writeAsync(res, sse('content_block_stop', { type: 'content_block_stop', index }));
  }
  if (r.streamError) {
    const e = r.streamError;
    await writeAsync(res, sse('error', { type: 'error', error: { type: e.type ?? 'overloaded_error', message: e.message ?? 'Overloaded' } }));
    res.end();
    return;
  }
  await writeAsync(
    res,
    sse('message_delta', {
      type: 'message_delta',
      delta: { stop_reason: stopReasonFor(r, blocks), stop_sequence: null },
      usage: { output_tokens: Math.max(1, Math.round(outChars / 4)), ...(r.usage ?? {}) },
    }),
  );
  await writeAsync(res, sse('message_stop', { type: 'message_stop' }));
  res.end();
}

function writeJsonMessage(res, body, r) {
  const blocks = finalBlocks(r.content ?? []);
  const outChars = JSON.stringify(blocks).length;
  sendJson(res, 200, {
    id: newId('msg'),
    type: 'message',
    role: 'assistant',
    model: body?.model ?? 'claude-fake',
    content: blocks,
    stop_reason: stopReasonFor(r, blocks),
    stop_sequence: null,
    usage: { ...usageFor(body, outChars), ...(r.usage ?? {}) },
  }, r.headers ?? {});
}

function sendJson(res, status, obj, headers = {}) {
  const data = JSON.stringify(obj);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), 'request-id': newId('req'), ...headers });
  res.end(data);
}

// ---------------------------------------------------------------- server

/**
 * Idle keep-alive connections stay open longer than the relay keeps them in its pool (60 s),
 * as the real API's do: Node's default (5 s) closes them while the relay may be sending the next
 * turn on one, and the relay, which sends a request once (it cannot know the server did not act
 * on it), answers that turn 502 — which the CLI retries in use, but not in the tests
 * (CLAUDE_CODE_MAX_RETRIES=0). `close()` still ends them at once.
 */
export function keepIdleConnections(server) {
  server.keepAliveTimeout = 120_000;
  server.headersTimeout = 121_000;
}

/**
 * Start the fake on 127.0.0.1 (random port).
 * @param {object} [opts]
 * @param {(body: any, request: object) => any} [opts.script] decides main-loop replies (default: text 'ok')
 * @param {(body: any, request: object) => any} [opts.sideScript] replies to non-main-loop requests (default: text 'ok')
 * @param {boolean} [opts.keepBodies=true] keep parsed bodies in `requests` (turn off for big benchmarks)
 */
export async function startFakeApi({ script, sideScript, keepBodies = true } = {}) {
  let currentScript = script ?? (() => reply(text('ok')));
  const requests = [];
  const sockets = new Set();
  const hanging = new Set();

  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      handle(req, res, Buffer.concat(chunks)).catch((err) => {
        if (!res.headersSent) sendJson(res, 500, { type: 'error', error: { type: 'api_error', message: `fake-api bug: ${err.stack}` } });
        else res.destroy();
      });
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  keepIdleConnections(server);

  async function handle(req, res, raw) {
    const u = new URL(req.url, 'http://127.0.0.1');
    let body = null;
    if (raw.length) {
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        body = raw.toString('utf8');
      }
    }
    const path = u.pathname;
    const isMessages = req.method === 'POST' && path === '/v1/messages';
    const kind = isMessages ? (isMainLoopRequest(body) ? 'main' : 'side') : 'other';
    const entry = {
      method: req.method,
      path,
      query: Object.fromEntries(u.searchParams),
      headers: req.headers,
      body: keepBodies ? body : undefined,
      kind,
      at: Date.now(),
    };
    requests.push(entry);

    if (req.method === 'POST' && path === '/v1/messages/count_tokens') {
      return sendJson(res, 200, { input_tokens: Math.max(1, Math.round(raw.length / 4)) });
    }
    if (req.method === 'HEAD' || (req.method === 'GET' && path === '/api/hello')) {
      res.writeHead(200);
      return res.end();
    }
    if (req.method === 'GET' && path === '/v1/models') {
      return sendJson(res, 200, { data: [], has_more: false, first_id: null, last_id: null });
    }
    if (!isMessages) {
      return sendJson(res, 404, { type: 'error', error: { type: 'not_found_error', message: `fake-api: no ${req.method} ${path}` } });
    }

    const decide = kind === 'main' ? currentScript : (sideScript ?? (() => reply(text('ok'))));
    const r = normaliseReply(await decide(body, entry));
    entry.reply = r.hang ? 'hang' : r.cut ? 'cut' : r.cutMidway ? 'cutMidway' : r.error ? { error: r.error } : { content: (r.content ?? []).map((b) => b.type + (b.name ? `:${b.name}` : '')) };

    if (r.delayMs) await new Promise((resolve) => setTimeout(resolve, r.delayMs));
    // The request arrived whole; the connection goes without an answer (a server that failed
    // after reading it: whether it acted on it, the client cannot know).
    if (r.cut) return req.socket.destroy();
    if (r.hang) {
      hanging.add(res);
      res.on('close', () => hanging.delete(res));
      return;
    }
    if (r.error) {
      const { status = 500, type = defaultErrorType(status), message = `fake ${status}` } = r.error;
      return sendJson(res, status, { type: 'error', error: { type, message } }, r.headers ?? {});
    }
    if (body?.stream) return writeStream(res, body, r);
    return writeJsonMessage(res, body, r);
  }

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    /** Main-loop /v1/messages requests only. */
    mainRequests: () => requests.filter((r) => r.kind === 'main'),
    /** Bodies of main-loop requests, in order. */
    mainBodies: () => requests.filter((r) => r.kind === 'main').map((r) => r.body),
    setScript(fn) {
      currentScript = fn;
    },
    async close() {
      for (const res of hanging) res.destroy();
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
