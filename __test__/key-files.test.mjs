// Issue 36, item 3: a provider's key file or a credential store stays covered inside the
// sandbox whatever `sandbox.allowWrite` / `allowRead` bring in around it, and however its path
// is named (through a symlink). The real CLI runs a sandboxed session configured for the
// provider (support/fake-providers.mjs), and the agent's own Bash commands read and overwrite
// the file; the host's copy is then compared, and ordinary work in the same directory checked.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-sandbox-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { agentRuns } from './support/agent-bash.mjs';
import { setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE } from './support/roles.mjs';
import { startFakeBedrock, startFakeVertex } from './support/fake-providers.mjs';

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

/** A harness with `sandbox` whose CLI has no Anthropic credential (the provider's instead). */
async function providerHarness(sandbox) {
  h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash', 'Read']) }, config: { sandbox } });
  const env = { ...h.config.env };
  delete env.ANTHROPIC_API_KEY;
  delete env.ANTHROPIC_BASE_URL;
  h.config.env = env;
}

/** A fake Vertex AI whose service account key file is `keyFile(dir)`, the CLI configured for it. */
async function vertexWithKeyIn(dir, { via } = {}) {
  const vertex = await startFakeVertex({ api: h.api });
  after.push(() => vertex.close());
  const keyFile = vertex.keyFile(dir);
  if (via) symlinkSync(keyFile, via);
  Object.assign(h.config.env, {
    CLAUDE_CODE_USE_VERTEX: '1',
    ANTHROPIC_VERTEX_PROJECT_ID: 'fake-project',
    CLOUD_ML_REGION: 'us-east5',
    ANTHROPIC_VERTEX_BASE_URL: `${vertex.url}/v1`,
    GOOGLE_APPLICATION_CREDENTIALS: via ?? keyFile,
  });
  const secrets = JSON.parse(readFileSync(keyFile, 'utf8')).private_key.split('\n').filter((l) => l.length > 40);
  return { vertex, keyFile, secrets };
}

/** The agent reads `file`, tries to overwrite it, and writes a file of its own in `dir`. */
const READ_WRITE = (file, dir) => [
  `cat ${file} 2>&1; echo end-of-file`,
  `echo overwritten-by-the-agent > ${file} 2>&1; echo "write exit $?"`,
  `echo the-agents-work > ${dir}/notes.txt && cat ${dir}/notes.txt`,
];

function expectNoSecret(out, secrets) {
  for (const text of out) for (const s of secrets) expect(text).not.toContain(s);
}

describe('key files inside the directories a session may write or read', () => {
  it('a key file in an allowWrite directory can be neither read nor overwritten, and the rest of the directory is writable', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR, 'keys-rw-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    await providerHarness({ allowWrite: [dir] });
    const { vertex, keyFile, secrets } = await vertexWithKeyIn(dir);
    const before = readFileSync(keyFile, 'utf8');
    const { result, out } = await agentRuns(h, 'planner', READ_WRITE(keyFile, dir));
    expect(result).toMatchObject({ create: [] });
    expect(vertex.requests.filter((r) => r.rejected)).toEqual([]);
    expect(out[0]).toContain('end-of-file');
    expectNoSecret(out, secrets);
    expect(out[1]).not.toContain('write exit 0');
    expect(readFileSync(keyFile, 'utf8')).toBe(before);
    expect(out[2]).toContain('the-agents-work');
    expect(readFileSync(join(dir, 'notes.txt'), 'utf8')).toBe('the-agents-work\n');
  });

  it('a key file named through a symlink outside is covered where it really is, in an allowRead or an allowWrite directory', async () => {
    const read = mkdtempSync(join(process.env.TMPDIR, 'keys-ro-'));
    after.push(() => rmSync(read, { recursive: true, force: true }));
    const write = mkdtempSync(join(process.env.TMPDIR, 'keys-rw-'));
    after.push(() => rmSync(write, { recursive: true, force: true }));
    const links = mkdtempSync(join(process.env.TMPDIR, 'keys-link-'));
    after.push(() => rmSync(links, { recursive: true, force: true }));
    await providerHarness({ allowRead: [read], allowWrite: [write] });
    const { keyFile, secrets } = await vertexWithKeyIn(read, { via: join(links, 'key.json') });
    // A second key, for the AWS side, in the writable directory, also named through a link.
    const awsFile = join(write, 'credentials');
    writeFileSync(awsFile, '[default]\naws_access_key_id = AKIAKEYBEHINDASYMLINK\naws_secret_access_key = secretBehindASymlink0123456789\n');
    symlinkSync(awsFile, join(links, 'aws-credentials'));
    h.config.env.AWS_SHARED_CREDENTIALS_FILE = join(links, 'aws-credentials');
    const before = readFileSync(awsFile, 'utf8');
    const { out } = await agentRuns(h, 'planner', [`cat ${keyFile} 2>&1; echo end-of-file`, ...READ_WRITE(awsFile, write)]);
    expect(out[0]).toContain('end-of-file');
    expectNoSecret(out, [...secrets, 'AKIAKEYBEHINDASYMLINK', 'secretBehindASymlink0123456789']);
    expect(out[2]).not.toContain('write exit 0');
    expect(readFileSync(awsFile, 'utf8')).toBe(before);
    expect(readFileSync(join(write, 'notes.txt'), 'utf8')).toBe('the-agents-work\n');
  });

  it('a credential store under a writable tree (a home directory made writable) stays covered', async () => {
    // `HOME` of the CLI holds `.aws/credentials`; allowWrite names a directory above it.
    const top = mkdtempSync(join(process.env.TMPDIR, 'keys-home-'));
    after.push(() => rmSync(top, { recursive: true, force: true }));
    const home = join(top, 'home');
    mkdirSync(join(home, '.aws'), { recursive: true });
    const store = join(home, '.aws', 'credentials');
    writeFileSync(join(home, '.aws', 'config'), '[default]\nregion = eu-west-1\n');
    writeFileSync(store, '[default]\naws_access_key_id = AKIASTOREINAWRITABLETREE\naws_secret_access_key = secretOfTheStoreInTheTree0123\n');
    await providerHarness({ allowWrite: [top] });
    const bedrock = await startFakeBedrock({ api: h.api, region: 'eu-west-1', credentials: { accessKeyId: 'AKIASTOREINAWRITABLETREE', secretAccessKey: 'secretOfTheStoreInTheTree0123' } });
    after.push(() => bedrock.close());
    Object.assign(h.config.env, {
      HOME: home,
      CLAUDE_CODE_USE_BEDROCK: '1',
      AWS_REGION: 'eu-west-1',
      ANTHROPIC_BEDROCK_BASE_URL: bedrock.url,
      AWS_SHARED_CREDENTIALS_FILE: store,
      AWS_CONFIG_FILE: join(home, '.aws', 'config'),
    });
    const before = readFileSync(store, 'utf8');
    const { out } = await agentRuns(h, 'planner', [`ls -la ${home}/.aws 2>&1`, ...READ_WRITE(store, top)]);
    expect(bedrock.requests.filter((r) => r.rejected)).toEqual([]);
    expectNoSecret(out, ['AKIASTOREINAWRITABLETREE', 'secretOfTheStoreInTheTree0123']);
    expect(out[2]).not.toContain('write exit 0');
    expect(readFileSync(store, 'utf8')).toBe(before);
    expect(readFileSync(join(top, 'notes.txt'), 'utf8')).toBe('the-agents-work\n');
  });
});
