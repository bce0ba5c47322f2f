// Fake model-provider endpoints on 127.0.0.1, in front of the fake Messages API (fake-api.mjs):
// each checks the provider's authentication itself, with code that is not the adapter's (the
// AWS SDK for JavaScript's SigV4 signer, node:crypto's RS256 check), and answers the way the
// provider does (Bedrock in AWS event-stream framing, Vertex AI and Foundry as the Messages API).
// Every request is recorded with what was wrong with its authentication (`rejected`).
//
//   const bedrock = await startFakeBedrock({ api, region, credentials });   // { url, requests, close() }
//   const vertex = await startFakeVertex({ api, tokenLifetimeSec });        // { url, keyFile(dir), tokens, ... }
//   const foundry = await startFakeFoundry({ api, key });
import { createServer } from 'node:http';
import { createVerify, generateKeyPairSync, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SignatureV4 } from '@smithy/signature-v4';
import { Hash } from '@smithy/hash-node';
import { keepIdleConnections } from './fake-api.mjs';

/** A server on 127.0.0.1 whose `handle(req, res, raw)` answers; records nothing itself. */
async function serve(handle) {
  const sockets = new Set();
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () =>
      handle(req, res, Buffer.concat(chunks)).catch((err) => {
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
        res.end(`fake provider bug: ${err.stack}`);
      }),
    );
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  keepIdleConnections(server);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function json(res, status, obj, headers = {}) {
  const data = JSON.stringify(obj);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data), ...headers });
  res.end(data);
}

/** The Messages API request a provider's body stands for (`model` from the path). */
function messagesBody(raw, model, stream) {
  const body = JSON.parse(raw.toString('utf8'));
  delete body.anthropic_version;
  return { ...body, model, stream };
}

/** POSTs `body` to the fake Messages API; resolves with its fetch Response. */
function toApi(api, body) {
  return fetch(`${api.url}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'fake' },
    body: JSON.stringify(body),
  });
}

/** Pipes the fake API's answer (SSE or JSON) back unchanged. */
async function pipeAnswer(upstream, res) {
  res.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'application/json' });
  for await (const chunk of upstream.body) res.write(chunk);
  res.end();
}

// ---------------------------------------------------------------- Bedrock

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(buf) {
  let c = 0xffffffff;
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** One AWS event-stream message: string headers, then the payload, with both CRCs. */
export function eventStreamMessage(headers, payload) {
  const hs = Buffer.concat(
    Object.entries(headers).map(([name, value]) => {
      const n = Buffer.from(name);
      const v = Buffer.from(value);
      const h = Buffer.alloc(1 + n.length + 1 + 2 + v.length);
      h.writeUInt8(n.length, 0);
      n.copy(h, 1);
      h.writeUInt8(7, 1 + n.length); // string
      h.writeUInt16BE(v.length, 2 + n.length);
      v.copy(h, 4 + n.length);
      return h;
    }),
  );
  const total = 12 + hs.length + payload.length + 4;
  const prelude = Buffer.alloc(8);
  prelude.writeUInt32BE(total, 0);
  prelude.writeUInt32BE(hs.length, 4);
  const preludeCrc = Buffer.alloc(4);
  preludeCrc.writeUInt32BE(crc32(prelude), 0);
  const body = Buffer.concat([prelude, preludeCrc, hs, payload]);
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(body), 0);
  return Buffer.concat([body, crc]);
}

/** The SSE events of a Messages API stream, as parsed JSON objects, in order. */
async function* sseEvents(response) {
  let buf = '';
  for await (const chunk of response.body) {
    buf += Buffer.from(chunk).toString('utf8');
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = block.split('\n').find((l) => l.startsWith('data: '));
      if (data) yield JSON.parse(data.slice(6));
    }
  }
}

/**
 * What is wrong with `req`'s SigV4 signature for `credentials` in `region` (service `bedrock`),
 * or null: the AWS SDK for JavaScript signs the same request (the headers the signature names,
 * its date) and the two must be equal.
 */
async function sigV4Problem(req, raw, { region, credentials }) {
  const auth = req.headers.authorization ?? '';
  const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, SignedHeaders=([^,]+), Signature=([0-9a-f]{64})$/.exec(auth);
  if (!m) return `not a SigV4 authorization: ${auth ? auth.slice(0, 40) : 'none'}`;
  const [, keyId, , signedRegion, service, signedHeaders] = m;
  if (keyId !== credentials.accessKeyId) return `signed with key ${keyId}`;
  if (signedRegion !== region || service !== 'bedrock') return `signed for ${signedRegion}/${service}`;
  const date = req.headers['x-amz-date'];
  if (!/^\d{8}T\d{6}Z$/.test(date ?? '')) return 'no x-amz-date';
  const signingDate = new Date(`${date.slice(0, 4)}-${date.slice(4, 6)}-${date.slice(6, 8)}T${date.slice(9, 11)}:${date.slice(11, 13)}:${date.slice(13, 15)}Z`);
  if (Math.abs(Date.now() - signingDate) > 5 * 60_000) return 'x-amz-date is not now';
  const names = signedHeaders.split(';');
  for (const required of ['host', 'x-amz-date', ...(credentials.sessionToken ? ['x-amz-security-token'] : [])]) {
    if (!names.includes(required)) return `${required} is not signed`;
  }
  if (credentials.sessionToken && req.headers['x-amz-security-token'] !== credentials.sessionToken) return 'wrong session token';
  const u = new URL(req.url, 'http://x');
  const signer = new SignatureV4({ credentials, region, service: 'bedrock', sha256: Hash.bind(null, 'sha256'), applyChecksum: false });
  const signed = await signer.sign(
    {
      method: req.method,
      protocol: 'http:',
      hostname: req.headers.host.split(':')[0],
      path: decodeURIComponent(u.pathname),
      query: Object.fromEntries(u.searchParams),
      headers: Object.fromEntries(names.map((n) => [n, req.headers[n]])),
      body: raw.length ? raw : undefined,
    },
    { signingDate },
  );
  return signed.headers.authorization === auth ? null : `the signature does not verify (expected ${signed.headers.authorization.split('Signature=')[1]})`;
}

/**
 * Bedrock's runtime and control plane in one: `GET /inference-profiles`,
 * `POST /model/<id>/invoke[-with-response-stream]`, each signed with SigV4 for `credentials`
 * (`{ accessKeyId, secretAccessKey, sessionToken? }`) in `region`, or with `bearer` as the
 * API key when given.
 */
export async function startFakeBedrock({ api, region, credentials, bearer }) {
  const requests = [];
  const server = await serve(async (req, res, raw) => {
    const entry = { method: req.method, path: new URL(req.url, 'http://x').pathname, headers: req.headers };
    requests.push(entry);
    entry.rejected = bearer
      ? req.headers.authorization === `Bearer ${bearer}`
        ? null
        : 'wrong bearer token'
      : await sigV4Problem(req, raw, { region, credentials });
    if (entry.rejected) {
      return json(res, 403, { message: `fake Bedrock: ${entry.rejected}` }, { 'x-amzn-errortype': 'InvalidSignatureException' });
    }
    if (req.method === 'GET' && entry.path === '/inference-profiles') return json(res, 200, { inferenceProfileSummaries: [] });
    const m = /^\/model\/([^/]+)\/(invoke|invoke-with-response-stream)$/.exec(entry.path);
    if (req.method !== 'POST' || !m) return json(res, 404, { message: `fake Bedrock: no ${req.method} ${entry.path}` });
    const model = decodeURIComponent(m[1]);
    const stream = m[2] === 'invoke-with-response-stream';
    const upstream = await toApi(api, messagesBody(raw, model, stream));
    if (!stream || upstream.status !== 200) return pipeAnswer(upstream, res);
    res.writeHead(200, { 'content-type': 'application/vnd.amazon.eventstream', 'x-amzn-bedrock-content-type': 'application/json' });
    for await (const event of sseEvents(upstream)) {
      const payload = Buffer.from(JSON.stringify({ bytes: Buffer.from(JSON.stringify(event)).toString('base64') }));
      res.write(eventStreamMessage({ ':event-type': 'chunk', ':content-type': 'application/json', ':message-type': 'event' }, payload));
    }
    res.end();
  });
  return { ...server, requests };
}

// ---------------------------------------------------------------- Vertex AI

/**
 * Vertex AI with Google's OAuth token endpoint: `POST /token` takes a service account's signed
 * JWT (checked against the key pair made here) and issues a token living `tokenLifetimeSec`;
 * `POST /v1/projects/…/models/<m>:streamRawPredict|rawPredict` takes only an unexpired token.
 * `keyFile(dir)` writes the service account key file the adapter is given.
 */
export async function startFakeVertex({ api, tokenLifetimeSec = 3600 }) {
  const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const email = 'agent@fake-project.iam.gserviceaccount.com';
  const tokens = new Map(); // token → expiry (ms)
  const requests = [];
  const server = await serve(async (req, res, raw) => {
    const path = new URL(req.url, 'http://x').pathname;
    const entry = { method: req.method, path, headers: req.headers };
    requests.push(entry);
    if (req.method === 'POST' && path === '/token') {
      entry.kind = 'token';
      const form = new URLSearchParams(raw.toString('utf8'));
      entry.rejected = jwtProblem(form, publicKey, email, `${server.url}/token`);
      if (entry.rejected) return json(res, 400, { error: 'invalid_grant', error_description: entry.rejected });
      const token = `ya29.fake-${randomBytes(16).toString('hex')}`;
      tokens.set(token, Date.now() + tokenLifetimeSec * 1000);
      return json(res, 200, { access_token: token, expires_in: tokenLifetimeSec, token_type: 'Bearer' });
    }
    const m = /^\/v1\/projects\/([^/]+)\/locations\/([^/]+)\/publishers\/anthropic\/models\/([^/:]+):(streamRawPredict|rawPredict)$/.exec(path);
    if (req.method !== 'POST' || !m) return json(res, 404, { error: { code: 404, message: `fake Vertex: no ${req.method} ${path}` } });
    entry.kind = 'predict';
    entry.project = m[1];
    entry.region = m[2];
    const token = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const expiry = tokens.get(token);
    entry.rejected = expiry == null ? 'unknown token' : expiry <= Date.now() ? 'expired token' : null;
    if (entry.rejected) return json(res, 401, { error: { code: 401, message: `fake Vertex: ${entry.rejected}`, status: 'UNAUTHENTICATED' } });
    const body = JSON.parse(raw.toString('utf8'));
    if (body.anthropic_version !== 'vertex-2023-10-16') entry.rejected = `anthropic_version ${body.anthropic_version}`;
    const upstream = await toApi(api, messagesBody(raw, m[3], m[4] === 'streamRawPredict'));
    return pipeAnswer(upstream, res);
  });
  return {
    ...server,
    requests,
    tokens,
    keyFile(dir) {
      const file = join(dir, 'vertex-service-account.json');
      writeFileSync(
        file,
        JSON.stringify({
          type: 'service_account',
          project_id: 'fake-project',
          private_key_id: randomBytes(8).toString('hex'),
          private_key: privateKey.export({ type: 'pkcs8', format: 'pem' }),
          client_email: email,
          client_id: '1',
          token_uri: `${server.url}/token`,
        }),
      );
      return file;
    },
  };
}

/** What is wrong with a jwt-bearer grant, or null. */
function jwtProblem(form, publicKey, email, audience) {
  if (form.get('grant_type') !== 'urn:ietf:params:oauth:grant-type:jwt-bearer') return `grant_type ${form.get('grant_type')}`;
  const parts = (form.get('assertion') ?? '').split('.');
  if (parts.length !== 3) return 'no JWT assertion';
  const [h, p, sig] = parts;
  const header = JSON.parse(Buffer.from(h, 'base64url').toString());
  if (header.alg !== 'RS256') return `alg ${header.alg}`;
  if (!createVerify('RSA-SHA256').update(`${h}.${p}`).verify(publicKey, Buffer.from(sig, 'base64url'))) return 'the JWT signature does not verify';
  const claims = JSON.parse(Buffer.from(p, 'base64url').toString());
  const now = Date.now() / 1000;
  if (claims.iss !== email) return `iss ${claims.iss}`;
  if (claims.aud !== audience) return `aud ${claims.aud}`;
  if (!String(claims.scope).split(' ').includes('https://www.googleapis.com/auth/cloud-platform')) return `scope ${claims.scope}`;
  if (!(claims.iat <= now + 60 && claims.exp > now)) return 'the JWT is not current';
  return null;
}

// ---------------------------------------------------------------- Foundry

/** Foundry's Messages API under `/anthropic`, taking only `key` (as `x-api-key` or `api-key`). */
export async function startFakeFoundry({ api, key }) {
  const requests = [];
  const server = await serve(async (req, res, raw) => {
    const path = new URL(req.url, 'http://x').pathname;
    const entry = { method: req.method, path, headers: req.headers };
    requests.push(entry);
    const given = req.headers['x-api-key'] ?? req.headers['api-key'];
    entry.rejected = given === key ? null : `wrong key (${req.headers.authorization ? 'authorization present' : 'no authorization'})`;
    if (entry.rejected) return json(res, 401, { error: { code: '401', message: `fake Foundry: ${entry.rejected}` } });
    if (req.method !== 'POST' || path !== '/anthropic/v1/messages') return json(res, 404, { error: { code: '404', message: `fake Foundry: no ${req.method} ${path}` } });
    const body = JSON.parse(raw.toString('utf8'));
    return pipeAnswer(await toApi(api, body), res);
  });
  return { ...server, url: `${server.url}/anthropic`, requests };
}
