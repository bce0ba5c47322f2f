// Issue 29: every model provider the CLI supports, with its credential outside the sandbox.
// The real CLI runs sandboxed sessions configured the way Claude Code documents each provider
// (`CLAUDE_CODE_USE_BEDROCK` / `_VERTEX` / `_FOUNDRY` and their variables in `config.env`), its
// requests go unsigned to the relay, and the relay authenticates them to fake provider endpoints
// on 127.0.0.1 that check the authentication with code that is not the adapter's
// (support/fake-providers.mjs). The agent's own commands then look for the credential inside:
// its environment, every process's environ, the key file itself.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-sandbox-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { apiError, scenario } from './support/fake-api.mjs';
import { agentRuns, unsandboxed } from './support/agent-bash.mjs';
import { rejection, setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';
import { startFakeBedrock, startFakeFoundry, startFakeVertex } from './support/fake-providers.mjs';

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

/** A harness whose CLI environment is the provider's `vars`, with no Anthropic credential. */
async function providerHarness(vars, sandbox = {}) {
  h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash', 'Read']) }, config: { sandbox } });
  const env = { ...h.config.env, ...vars };
  delete env.ANTHROPIC_API_KEY;
  delete env.ANTHROPIC_BASE_URL;
  h.config.env = env;
  return h;
}

/** What the agent runs to look for `secrets`: every environment it can see, and `files`. */
const LOOK = (files = []) => [
  'env',
  "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
  ...files.map((f) => `cat ${f} 2>&1; echo end-of-file`),
];

function expectNoSecret(out, secrets) {
  for (const text of out) for (const s of secrets) expect(text).not.toContain(s);
}

const AWS = {
  accessKeyId: 'AKIAFAKEPROVIDERKEY1',
  secretAccessKey: 'fakeSecretAccessKeyOfTheBedrockTest0123456',
  sessionToken: 'FwoGZXIvYXdzEFAKESESSIONTOKENofTheBedrockTest',
};

/** A fake Bedrock expecting `AWS` in eu-west-1, and the CLI configured for it with `keys`. */
async function bedrockWithKeys(keys) {
  await providerHarness({});
  const bedrock = await startFakeBedrock({ api: h.api, region: 'eu-west-1', credentials: AWS });
  after.push(() => bedrock.close());
  Object.assign(h.config.env, {
    CLAUDE_CODE_USE_BEDROCK: '1',
    AWS_REGION: 'eu-west-1',
    ANTHROPIC_BEDROCK_BASE_URL: bedrock.url,
    AWS_ACCESS_KEY_ID: keys.accessKeyId,
    AWS_SECRET_ACCESS_KEY: keys.secretAccessKey,
    AWS_SESSION_TOKEN: keys.sessionToken,
  });
  return bedrock;
}

describe('Amazon Bedrock through the relay', () => {
  it('a sandboxed session signs every request with SigV4 outside (verified by the AWS SDK for JavaScript), the event stream comes back unchanged, and no AWS key or token is readable inside', async () => {
    const bedrock = await bedrockWithKeys(AWS);
    const { result, out } = await agentRuns(h, 'planner', LOOK());
    expect(result).toMatchObject({ create: [] });
    const models = bedrock.requests.filter((r) => r.path.startsWith('/model/'));
    expect(models.length).toBeGreaterThanOrEqual(LOOK().length + 1);
    expect(bedrock.requests.filter((r) => r.rejected)).toEqual([]);
    expect(models.every((r) => r.path.endsWith('/invoke-with-response-stream'))).toBe(true);
    // What the agent saw came through the event stream: its own command's output.
    expect(out[0]).toContain('CLAUDE_CODE_USE_BEDROCK=1');
    expect(out[0]).toContain('AWS_REGION=eu-west-1');
    expectNoSecret(out, Object.values(AWS));
  });

  it("the fake's check is real: requests signed with another secret key are refused, and the session fails with the provider's answer", async () => {
    const bedrock = await bedrockWithKeys({ ...AWS, secretAccessKey: 'not-the-secret-the-fake-expects-000000000' });
    h.api.setScript(scenario.steps([ROLES.planner.done]));
    const e = await rejection((await h.adapter().startAgent(ROLES.planner.params())).result);
    expect(e.code).toBe('ERR_AGENT_FAILED');
    expect(bedrock.requests.length).toBeGreaterThan(0);
    expect(bedrock.requests.every((r) => /signature does not verify/.test(r.rejected))).toBe(true);
    expect(h.api.requests).toEqual([]);
  });

  it('an outage of Bedrock is held through like the API\'s: each request sent again is signed anew and verifies, and the session completes (issue 34)', async () => {
    const bedrock = await bedrockWithKeys(AWS);
    let until = null;
    h.api.setScript(() => {
      until ??= Date.now() + 4000;
      return Date.now() < until ? apiError(529, 'Overloaded') : ROLES.planner.done;
    });
    const handle = await h.adapter().startAgent(ROLES.planner.params());
    const [result, stats] = await Promise.all([handle.result, handle.stats]);
    expect(result).toMatchObject({ create: [] });
    expect(stats.api.retries).toBeGreaterThan(1);
    const models = bedrock.requests.filter((r) => r.path.startsWith('/model/'));
    expect(models).toHaveLength(stats.api.retries + 1);
    expect(bedrock.requests.filter((r) => r.rejected)).toEqual([]);
  });

  it('a Bedrock API key (AWS_BEARER_TOKEN_BEDROCK) is added outside as the bearer token', async () => {
    await providerHarness({});
    const bearer = 'ABSKFakeBedrockApiKeyOfTheTest0123456789';
    const bedrock = await startFakeBedrock({ api: h.api, region: 'us-east-1', bearer });
    after.push(() => bedrock.close());
    Object.assign(h.config.env, {
      CLAUDE_CODE_USE_BEDROCK: '1',
      AWS_REGION: 'us-east-1',
      ANTHROPIC_BEDROCK_BASE_URL: bedrock.url,
      AWS_BEARER_TOKEN_BEDROCK: bearer,
    });
    const { result, out } = await agentRuns(h, 'planner', LOOK());
    expect(result).toMatchObject({ create: [] });
    expect(bedrock.requests.length).toBeGreaterThan(0);
    expect(bedrock.requests.filter((r) => r.rejected)).toEqual([]);
    expectNoSecret(out, [bearer]);
  });

  it('credentials from a shared credentials file and profile (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE) sign too, and the file is not readable inside even under an allowRead directory', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR, 'aws-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, 'credentials');
    writeFileSync(join(dir, 'config'), '[profile agents]\nregion = eu-west-1\n');
    writeFileSync(file, `[default]\naws_access_key_id = AKIAWRONGDEFAULT0000\naws_secret_access_key = wrong\n\n[agents]\naws_access_key_id = ${AWS.accessKeyId}\naws_secret_access_key = ${AWS.secretAccessKey}\n`);
    await providerHarness({}, { allowRead: [dir] });
    const bedrock = await startFakeBedrock({ api: h.api, region: 'eu-west-1', credentials: { accessKeyId: AWS.accessKeyId, secretAccessKey: AWS.secretAccessKey } });
    after.push(() => bedrock.close());
    Object.assign(h.config.env, {
      CLAUDE_CODE_USE_BEDROCK: '1',
      AWS_REGION: 'eu-west-1',
      ANTHROPIC_BEDROCK_BASE_URL: bedrock.url,
      AWS_SHARED_CREDENTIALS_FILE: file,
      AWS_CONFIG_FILE: join(dir, 'config'),
      AWS_PROFILE: 'agents',
    });
    const { result, out } = await agentRuns(h, 'planner', LOOK([file, `${dir}/*`]));
    expect(result).toMatchObject({ create: [] });
    expect(bedrock.requests.length).toBeGreaterThan(0);
    expect(bedrock.requests.filter((r) => r.rejected)).toEqual([]);
    expect(out[2]).toContain('end-of-file');
    expectNoSecret(out, [AWS.secretAccessKey, AWS.accessKeyId]);
  });

  it('without AWS_REGION startAgent fails with ERR_INVALID_PARAMS naming it, and without any credential with ERR_PROVISION, before the CLI starts', async () => {
    await providerHarness({ CLAUDE_CODE_USE_BEDROCK: '1', ANTHROPIC_BEDROCK_BASE_URL: 'http://127.0.0.1:9' });
    const adapter = h.adapter();
    let e = await rejection(adapter.startAgent(ROLES.planner.params()));
    expect(e.code).toBe('ERR_INVALID_PARAMS');
    expect(e.message).toContain('AWS_REGION');
    const empty = mkdtempSync(join(process.env.TMPDIR, 'aws-empty-'));
    after.push(() => rmSync(empty, { recursive: true, force: true }));
    Object.assign(h.config.env, {
      AWS_REGION: 'eu-west-1',
      AWS_SHARED_CREDENTIALS_FILE: join(empty, 'none'),
      AWS_CONFIG_FILE: join(empty, 'none'),
      // No instance metadata here: the chain's last source fails fast.
      AWS_EC2_METADATA_DISABLED: 'true',
    });
    // The SDK's chain also reads the engine's own environment: none of it is AWS's here.
    const saved = Object.entries(process.env).filter(([k]) => k.startsWith('AWS_'));
    for (const [k] of saved) delete process.env[k];
    process.env.AWS_EC2_METADATA_DISABLED = 'true';
    try {
      e = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    } finally {
      delete process.env.AWS_EC2_METADATA_DISABLED;
      for (const [k, v] of saved) process.env[k] = v;
    }
    expect(e.code).toBe('ERR_PROVISION');
    expect(e.message).toMatch(/Bedrock: no usable AWS credentials/);
    expect(h.api.requests).toEqual([]);
  });
});

describe('Google Vertex AI through the relay', () => {
  it('a sandboxed session gets a Google access token outside from a service account key (the JWT checked by the fake token endpoint), the key file is not readable inside', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR, 'gcp-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    await providerHarness({}, { allowRead: [dir] });
    const vertex = await startFakeVertex({ api: h.api });
    after.push(() => vertex.close());
    const keyFile = vertex.keyFile(dir);
    Object.assign(h.config.env, {
      CLAUDE_CODE_USE_VERTEX: '1',
      ANTHROPIC_VERTEX_PROJECT_ID: 'fake-project',
      CLOUD_ML_REGION: 'us-east5',
      ANTHROPIC_VERTEX_BASE_URL: `${vertex.url}/v1`,
      GOOGLE_APPLICATION_CREDENTIALS: keyFile,
    });
    const { result, out } = await agentRuns(h, 'planner', LOOK([keyFile]));
    expect(result).toMatchObject({ create: [] });
    expect(vertex.requests.filter((r) => r.rejected)).toEqual([]);
    const predicts = vertex.requests.filter((r) => r.kind === 'predict');
    expect(predicts.length).toBeGreaterThanOrEqual(LOOK([keyFile]).length + 1);
    expect(predicts.every((r) => r.project === 'fake-project' && r.region === 'us-east5')).toBe(true);
    expect(out[0]).toContain('ANTHROPIC_VERTEX_PROJECT_ID=fake-project');
    const key = JSON.parse(readFileSync(keyFile, 'utf8'));
    const keyLines = key.private_key.split('\n').filter((l) => l.length > 40);
    expectNoSecret(out, [...keyLines, ...vertex.tokens.keys()]);
  });

  it('a token that expires mid-session is refreshed without the session noticing', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR, 'gcp-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    await providerHarness({});
    // gcp_auth renews a token 20 s before it expires: a 24 s token is renewed after ~4 s.
    const vertex = await startFakeVertex({ api: h.api, tokenLifetimeSec: 24 });
    after.push(() => vertex.close());
    Object.assign(h.config.env, {
      CLAUDE_CODE_USE_VERTEX: '1',
      ANTHROPIC_VERTEX_PROJECT_ID: 'fake-project',
      CLOUD_ML_REGION: 'us-east5',
      ANTHROPIC_VERTEX_BASE_URL: `${vertex.url}/v1`,
      GOOGLE_APPLICATION_CREDENTIALS: vertex.keyFile(dir),
    });
    h.api.setScript(scenario.steps([unsandboxed('sleep 6; echo one'), unsandboxed('sleep 6; echo two'), ROLES.planner.done]));
    const handle = await h.adapter().startAgent(ROLES.planner.params());
    const result = await handle.result;
    expect(result).toMatchObject({ create: [] });
    expect(vertex.requests.filter((r) => r.rejected)).toEqual([]);
    expect(vertex.requests.filter((r) => r.kind === 'token').length).toBeGreaterThanOrEqual(2);
    const used = new Set(vertex.requests.filter((r) => r.kind === 'predict').map((r) => r.headers.authorization));
    expect(used.size).toBeGreaterThanOrEqual(2);
  }, 120_000);

  it('without ANTHROPIC_VERTEX_PROJECT_ID or CLOUD_ML_REGION startAgent fails with ERR_INVALID_PARAMS naming it; a key file that is not a service account key fails with ERR_PROVISION', async () => {
    await providerHarness({ CLAUDE_CODE_USE_VERTEX: '1', CLOUD_ML_REGION: 'us-east5' });
    let e = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    expect(e.code).toBe('ERR_INVALID_PARAMS');
    expect(e.message).toContain('ANTHROPIC_VERTEX_PROJECT_ID');
    const dir = mkdtempSync(join(process.env.TMPDIR, 'gcp-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, 'bad.json'), '{"type":"nonsense"}');
    Object.assign(h.config.env, { ANTHROPIC_VERTEX_PROJECT_ID: 'p', GOOGLE_APPLICATION_CREDENTIALS: join(dir, 'bad.json') });
    e = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    expect(e.code).toBe('ERR_PROVISION');
    expect(e.message).toContain('GOOGLE_APPLICATION_CREDENTIALS');
    expect(h.api.requests).toEqual([]);
  });
});

describe('Microsoft Foundry through the relay', () => {
  it('a sandboxed session has the Foundry key added outside in place of the CLI\'s skip-auth placeholder; the key is not readable inside', async () => {
    await providerHarness({});
    const key = 'foundry-fake-key-0123456789abcdef';
    const foundry = await startFakeFoundry({ api: h.api, key });
    after.push(() => foundry.close());
    Object.assign(h.config.env, {
      CLAUDE_CODE_USE_FOUNDRY: '1',
      ANTHROPIC_FOUNDRY_BASE_URL: foundry.url,
      ANTHROPIC_FOUNDRY_API_KEY: key,
    });
    const { result, out } = await agentRuns(h, 'planner', LOOK());
    expect(result).toMatchObject({ create: [] });
    expect(foundry.requests.length).toBeGreaterThanOrEqual(LOOK().length + 1);
    expect(foundry.requests.filter((r) => r.rejected)).toEqual([]);
    expect(foundry.requests.every((r) => r.headers.authorization === undefined)).toBe(true);
    expectNoSecret(out, [key]);
  });

  it('without a key or an Entra ID service principal startAgent fails with ERR_PROVISION naming both', async () => {
    await providerHarness({ CLAUDE_CODE_USE_FOUNDRY: '1', ANTHROPIC_FOUNDRY_RESOURCE: 'my-resource' });
    const e = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    expect(e.code).toBe('ERR_PROVISION');
    expect(e.message).toContain('ANTHROPIC_FOUNDRY_API_KEY');
    expect(e.message).toContain('AZURE_CLIENT_SECRET');
  });
});

describe("a gateway of the user's own", () => {
  it('ANTHROPIC_CUSTOM_HEADERS reach the gateway from the relay, and their values are not readable inside', async () => {
    await providerHarness({});
    Object.assign(h.config.env, {
      ANTHROPIC_BASE_URL: h.api.url,
      ANTHROPIC_API_KEY: 'sk-ant-fake-key-for-tests',
      ANTHROPIC_CUSTOM_HEADERS: 'X-Gateway-Key: gw-secret-0123456789\nX-Team: agents',
    });
    const { result, out } = await agentRuns(h, 'planner', LOOK());
    expect(result).toMatchObject({ create: [] });
    const main = h.api.mainRequests();
    expect(main.length).toBeGreaterThan(0);
    expect(main.every((r) => r.headers['x-gateway-key'] === 'gw-secret-0123456789' && r.headers['x-team'] === 'agents')).toBe(true);
    expectNoSecret(out, ['gw-secret-0123456789', 'sk-ant-fake-key-for-tests']);
  });
});
