// Issue 50: a record of each session that no agent can rewrite (config.audit). The real addon,
// the real Claude Code CLI in its sandbox, the fake Messages API: what the record holds of a
// session (its commit, a blocked command, a refused host, in order), that it verifies and names
// the returned patch, that each kind of tampering is found at the first bad entry, that the
// agent's own tools cannot reach it, that a killed engine leaves a valid unsealed prefix, and
// that two sessions at once keep two records.
import { execFileSync, spawnSync } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { copyFileSync, existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, reply, scenario, text, toolResults, toolUse } from './support/fake-api.mjs';
import { engineProcess, killAll } from './support/engine-process.mjs';
import { addon, rejection, setup, thrown } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { implementorDone, implementorParams, implementorState, ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
const engines = [];
afterEach(async () => {
  killAll(engines);
  await h?.cleanup();
  h = undefined;
});

const keys = () => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    signingKey: privateKey.export({ type: 'pkcs8', format: 'pem' }),
    publicKey: publicKey.export({ type: 'spki', format: 'pem' }),
  };
};
const entries = (path) => readFileSync(path, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const lines = (path) => readFileSync(path, 'utf8').split(/(?<=\n)/);
const BLOCKED = 'echo audit-blocked-marker';

/** A harness whose sessions keep a record in `<scratch>/audit`, signed with a fresh key. */
async function auditSetup({ script, signed = true, repo, state = implementorState, bodies = { 7: 'x' }, config = {} } = {}) {
  const k = keys();
  h = await setup({
    script,
    repo,
    state,
    bodies,
    hook: async (e) => (e.tool_input.command === BLOCKED ? { decision: 'block', reason: 'the marker is refused' } : { decision: 'approve' }),
    config: { audit: signed ? { signingKey: k.signingKey } : {}, ...config },
  });
  h.config.audit.dir = join(h.scratch, 'audit');
  return { ...k, dir: h.config.audit.dir };
}

describe('the record of a session', () => {
  it('holds its start, a commit, a blocked command and a refused host in order, ends sealed, and verifies against the key and the returned patch', async () => {
    const { publicKey, dir } = await auditSetup({
      script: scenario.steps([
        reply(text('Working.'), bash('echo one > one.txt && git add -A && git commit -qm one && echo committed')),
        reply(bash(BLOCKED)),
        reply(bash("curl -sS -m 5 https://refused-by-audit.example/ 2>&1; echo rc=$?")),
        implementorDone('committed one'),
      ]),
    });
    const handle = await h.adapter().startAgent(implementorParams);
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('one.txt');
    expect(handle.auditRecordPath.startsWith(dir)).toBe(true);
    const record = entries(handle.auditRecordPath);
    const kinds = record.map((e) => e.kind);
    expect(kinds[0]).toBe('start');
    expect(kinds[1]).toBe('agent');
    expect(kinds.at(-2)).toBe('end');
    expect(kinds.at(-1)).toBe('seal');
    expect(record.map((e) => e.seq)).toEqual(record.map((_, i) => i + 1));
    expect(record[0]).toMatchObject({ sessionID: handle.sessionID, role: 'implementor', params: { workItemID: '7', branchName: 'wi-7' } });
    expect(record[0].baseCommit).toBe(execFileSync('git', ['rev-parse', 'main'], { cwd: h.repo.root, encoding: 'utf8' }).trim());
    expect(record[1].prompt).toContain('x');
    const at = (pred) => record.findIndex(pred);
    const commit = at((e) => e.kind === 'tool_use' && e.input?.command?.includes('git commit'));
    const commitAllowed = at((e) => e.kind === 'tool_verdict' && e.command?.includes('git commit'));
    const blocked = at((e) => e.kind === 'tool_verdict' && e.command === BLOCKED);
    const refused = at((e) => e.kind === 'network' && e.host === 'refused-by-audit.example');
    expect([commit, commitAllowed, blocked, refused].every((i) => i > 0), JSON.stringify(kinds)).toBe(true);
    expect(commit).toBeLessThan(blocked);
    expect(blocked).toBeLessThan(refused);
    expect(record[commitAllowed]).toMatchObject({ verdict: 'allowed', by: 'bashValidatorHook', tool: 'Bash' });
    expect(record[blocked]).toMatchObject({ verdict: 'blocked', reason: 'the marker is refused' });
    expect(record[refused]).toMatchObject({ allowed: false, port: 443 });
    expect(record[refused].reason).toBeTruthy();
    // Every model request the relay sent, each with its answer.
    const requests = record.filter((e) => e.kind === 'model_request');
    const answers = record.filter((e) => e.kind === 'model_answer');
    expect(requests.length).toBeGreaterThanOrEqual(4);
    expect(answers.length).toBe(requests.length);
    expect(answers.filter((a) => a.status === 200 && a.usage?.input > 0 && /^[0-9a-f]{64}$/.test(a.sha256)).length).toBeGreaterThanOrEqual(4);
    expect(record.at(-2)).toMatchObject({ outcome: 'completed', code: null, patchBytes: result.patch.length });
    // Sealed over the returned patch and the branch's base commit, signed with the key.
    const verdict = await addon.verifyAuditRecord(handle.auditRecordPath, { publicKey, patch: result.patch });
    expect(verdict).toEqual({ ok: true, sealed: true, entries: record.length, firstBad: null, reason: null });
    const statement = JSON.parse(Buffer.from(record.at(-1).envelope.payload, 'base64').toString());
    expect(statement._type).toBe('https://in-toto.io/Statement/v1');
    expect(statement.subject[1]).toEqual({ name: 'wi-7', digest: { gitCommit: record[0].baseCommit } });
    expect(statement.predicate.record.entries).toBe(record.length - 1);
  });

  it('is found out at the first bad entry when a byte is changed, an entry removed, two swapped, or another patch given; the bin says the same', async () => {
    const { publicKey, dir } = await auditSetup({
      script: scenario.steps([reply(bash('echo a > a.txt')), reply(bash('echo b > b.txt')), implementorDone()]),
    });
    const handle = await h.adapter().startAgent(implementorParams);
    const { patch } = await handle.result;
    const original = lines(handle.auditRecordPath);
    const copy = join(dir, 'copy.jsonl');
    const check = async (ls, opts = { publicKey }) => {
      writeFileSync(copy, ls.join(''));
      return addon.verifyAuditRecord(copy, opts);
    };
    const changed = [...original];
    changed[3] = changed[3].replace('"kind":"', '"kind":"x');
    expect(await check(changed)).toMatchObject({ ok: false, firstBad: 4 });
    const removed = original.filter((_, i) => i !== 2);
    const v = await check(removed);
    expect(v).toMatchObject({ ok: false, firstBad: 3 });
    expect(v.reason).toMatch(/missing or out of place/);
    const swapped = [...original];
    [swapped[4], swapped[5]] = [swapped[5], swapped[4]];
    expect(await check(swapped)).toMatchObject({ ok: false, firstBad: 5 });
    const other = await check(original, { publicKey, patch: `${patch}\n` });
    expect(other).toMatchObject({ ok: false, firstBad: original.length });
    expect(other.reason).toMatch(/another patch/);
    expect(await check(original, { publicKey: keys().publicKey })).toMatchObject({ ok: false, firstBad: original.length });
    expect(await check(original, { publicKey, patch })).toMatchObject({ ok: true, sealed: true });
    // The same from a shell.
    const keyFile = join(dir, 'key.pem');
    const patchFile = join(dir, 'patch');
    writeFileSync(keyFile, publicKey);
    writeFileSync(patchFile, patch);
    const bin = (file, ...args) => spawnSync(process.execPath, ['bin/cra-verify-audit.mjs', file, '--public-key', keyFile, ...args], { encoding: 'utf8' });
    copyFileSync(handle.auditRecordPath, copy);
    const good = bin(copy, '--patch', patchFile);
    expect(good.status, good.stderr).toBe(0);
    expect(JSON.parse(good.stdout)).toMatchObject({ ok: true, sealed: true });
    writeFileSync(copy, removed.join(''));
    const bad = bin(copy);
    expect(bad.status).toBe(1);
    expect(JSON.parse(bad.stdout)).toMatchObject({ ok: false, firstBad: 3 });
    expect(bin(join(dir, 'no-such-record')).status).toBe(2);
  });

  it("is out of the agent's reach: its Bash, Read, Write and Edit can neither read nor change it", async () => {
    const { publicKey, dir } = await auditSetup({ repo: { agents: agentsWithTools(['Bash', 'Read', 'Write', 'Edit']) } });
    // Each step names the record the session is writing (there by the time the model is asked).
    const own = () => join(dir, readdirSync(dir).find((n) => n.endsWith('.audit.jsonl')));
    h.api.setScript(scenario.steps([
      () => reply(bash(`echo ordinary > work.txt; ls -la ${dir} 2>&1; cat ${own()} 2>&1; echo forged >> ${own()} 2>&1; echo rc=$?`)),
      () => reply(toolUse('Read', { file_path: own() })),
      () => reply(toolUse('Write', { file_path: own(), content: '{}\n' })),
      () => reply(toolUse('Edit', { file_path: own(), old_string: '"kind":"start"', new_string: '"kind":"forged"' })),
      implementorDone(),
    ]));
    const handle = await h.adapter().startAgent(implementorParams);
    const result = await handle.result;
    expect(result.patch).toContain('work.txt');
    const results = toolResults(h.api.mainBodies().at(-1));
    expect(results).toHaveLength(4);
    expect(results[0].text).toMatch(/No such file or directory/);
    expect(results[0].text).not.toContain('"kind":"start"');
    for (const r of results.slice(1)) expect(r.is_error, r.text).toBe(true);
    // Read and Write are refused by the adapter's guards; the sandboxed CLI's Edit finds no such
    // file (nothing of audit.dir is mounted), or a guard refuses it.
    expect(results[1].text).toContain("is inside the adapter's audit records");
    expect(results[2].text).toMatch(/which this session may not write/);
    expect(results[3].text).toMatch(/File does not exist|may not write/);
    // The agent's attempts are in the record (as its tool calls), none of them in its bytes.
    expect(readFileSync(handle.auditRecordPath, 'utf8')).not.toMatch(/^forged$/m);
    expect(await addon.verifyAuditRecord(handle.auditRecordPath, { publicKey, patch: result.patch })).toMatchObject({ ok: true, sealed: true });
  });
});

describe('records of sessions that end otherwise', () => {
  it('an engine killed mid-session leaves a prefix that verifies as unsealed', async () => {
    const { publicKey } = await auditSetup({
      script: scenario.steps([reply(bash('echo a > a.txt')), reply(bash('sleep 60')), implementorDone()]),
    });
    const { engine, audit } = await engineProcess(h, implementorParams, engines);
    // Killed once the agent is in its second step.
    for (let i = 0; i < 300 && !readFileSync(audit, 'utf8').includes('sleep 60'); i++) await new Promise((r) => setTimeout(r, 100));
    engine.kill('SIGKILL');
    await new Promise((r) => engine.once('exit', r));
    const record = entries(audit);
    expect(record.some((e) => e.kind === 'tool_use' && e.input.command === 'sleep 60')).toBe(true);
    const verdict = await addon.verifyAuditRecord(audit, { publicKey });
    expect(verdict).toEqual({ ok: true, sealed: false, entries: record.length, firstBad: null, reason: null });
    // An unsealed record names no patch.
    expect(await addon.verifyAuditRecord(audit, { publicKey, patch: '' })).toMatchObject({ ok: false });
  });

  it('two sessions at once keep two records, each of its own session only, and an unsigned one verifies without a key', async () => {
    const { publicKey, dir } = await auditSetup({
      signed: false,
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      script: scenario.steps([reply(bash('echo $PWD > where.txt')), implementorDone()]),
    });
    const adapter = h.adapter();
    const [a, b] = await Promise.all([
      adapter.startAgent(ROLES.implementor.params('wi-a')),
      adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-b' }),
    ]);
    const results = await Promise.all([a.result, b.result]);
    expect(results.map((r) => r.outcome)).toEqual(['completed', 'completed']);
    expect(a.auditRecordPath).not.toBe(b.auditRecordPath);
    expect(readdirSync(dir).filter((n) => n.endsWith('.audit.jsonl'))).toHaveLength(2);
    for (const handle of [a, b]) {
      const record = entries(handle.auditRecordPath);
      expect(record[0].sessionID).toBe(handle.sessionID);
      expect(record.at(-1).kind).toBe('seal');
      expect(JSON.stringify(record)).not.toContain((handle === a ? b : a).sessionID);
      const patch = results[handle === a ? 0 : 1].patch;
      expect(await addon.verifyAuditRecord(handle.auditRecordPath, { patch })).toMatchObject({ ok: true, sealed: true });
      // Unsigned: a key finds no signature.
      const v = await addon.verifyAuditRecord(handle.auditRecordPath, { publicKey });
      expect(v).toMatchObject({ ok: false, firstBad: record.length });
      expect(v.reason).toMatch(/not signed/);
    }
  });
});

describe('bad audit settings and arguments', () => {
  it('a relative dir or a key that is not Ed25519 PKCS#8 is ERR_INVALID_PARAMS naming the field', async () => {
    h = await setup({});
    const bad = (audit) => thrown(() => addon.createClaudeAdapter({ ...h.config, audit }, h.deps));
    expect(bad({ dir: 'relative/dir' })).toMatchObject({ code: 'ERR_INVALID_PARAMS', message: expect.stringContaining('config.audit.dir') });
    const rsa = generateKeyPairSync('rsa', { modulusLength: 1024 }).privateKey.export({ type: 'pkcs8', format: 'pem' });
    expect(bad({ dir: h.scratch, signingKey: rsa })).toMatchObject({ code: 'ERR_INVALID_PARAMS', message: expect.stringContaining('config.audit.signingKey is not an Ed25519') });
    expect(bad({ dir: h.scratch, signingKey: 'not a key' }).message).toContain('config.audit.signingKey');
    expect(bad({ dir: h.scratch, extra: 1 }).message).toContain('config.audit.extra');
    expect(bad('on').message).toContain('config.audit must be an object');
  });

  it('a dir the record cannot be made in rejects startAgent ERR_PROVISION before anything runs', async () => {
    h = await setup({ state: implementorState, bodies: { 7: 'x' } });
    const file = join(h.scratch, 'a-file');
    writeFileSync(file, 'x');
    const adapter = addon.createClaudeAdapter({ ...h.config, audit: { dir: join(file, 'audit') } }, h.deps);
    const e = await rejection(adapter.startAgent(implementorParams));
    expect(e.code).toBe('ERR_PROVISION');
    expect(e.message).toContain('audit record');
    expect(h.api.requests.length).toBe(0);
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-7'))).toBe(false);
  });

  it('verifyAuditRecord rejects ERR_INVALID_PARAMS for a missing file, a key that is not one, or options of the wrong type', async () => {
    h = await setup({});
    const missing = await rejection(addon.verifyAuditRecord(join(h.scratch, 'none.jsonl')));
    expect(missing).toMatchObject({ code: 'ERR_INVALID_PARAMS', message: expect.stringContaining('cannot read the audit record') });
    writeFileSync(join(h.scratch, 'r.jsonl'), '');
    expect(await rejection(addon.verifyAuditRecord(join(h.scratch, 'r.jsonl'), { publicKey: 'x' }))).toMatchObject({ code: 'ERR_INVALID_PARAMS', message: expect.stringContaining('publicKey') });
    expect((await rejection(addon.verifyAuditRecord(join(h.scratch, 'r.jsonl'), { patch: 5 }))).message).toContain('opts.patch must be a string');
    expect((await rejection(addon.verifyAuditRecord(42))).message).toContain('path must be a non-empty string');
    expect(await addon.verifyAuditRecord(join(h.scratch, 'r.jsonl'))).toMatchObject({ ok: false, entries: 0, reason: 'the record has no entries' });
  });
});
