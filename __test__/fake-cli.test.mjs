// The scripted fake CLI behaves as its modes promise (so adapter fault-injection tests can rely on it).
import { afterEach, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { isProcessAlive, spawnCli } from './support/cli-session.mjs';

const FAKE_CLI = fileURLToPath(new URL('./support/fake-cli.mjs', import.meta.url));
const sessions = [];
const pids = [];
afterEach(async () => {
  for (const s of sessions.splice(0)) if (!s.exitInfo) { s.kill('SIGKILL'); await s.exited; }
  for (const pid of pids.splice(0)) try { process.kill(-pid, 'SIGKILL'); } catch {}
});

async function start(mode, env = {}) {
  const s = spawnCli({ bin: FAKE_CLI, env: { ...process.env, FAKE_CLI_MODE: mode, ...env }, args: ['--session-id=11111111-2222-3333-4444-555555555555'] });
  sessions.push(s);
  const init = await s.initialize({ hooks: {} });
  expect(init).toMatchObject({ subtype: 'success', response: { pid: s.pid } });
  s.sendUser('go');
  return s;
}

describe('fake CLI', () => {
  it('ok: emits system/init, assistant text and a result carrying FAKE_CLI_OUTPUT', async () => {
    const s = await start('ok', { FAKE_CLI_OUTPUT: '{"summary":"fine"}' });
    const r = await s.result();
    expect(r).toMatchObject({ subtype: 'success', is_error: false, structured_output: { summary: 'fine' }, session_id: '11111111-2222-3333-4444-555555555555' });
    expect(s.messages.map((m) => m.type)).toEqual(['control_response', 'system', 'assistant', 'result']);
    s.child.stdin.end();
    expect((await s.exited).code).toBe(0);
  });

  it('garbage-line: writes one non-JSON line and then continues normally', async () => {
    const s = await start('garbage-line');
    await s.result();
    expect(s.badLines).toEqual(['this is not JSON {{{']);
    expect(s.messages.filter((m) => m.type === 'assistant')).toHaveLength(2);
  });

  it('crash-mid-stream: exits 3 after some text, with stderr and no result', async () => {
    const s = await start('crash-mid-stream');
    expect((await s.exited).code).toBe(3);
    expect(s.stderr).toContain('simulated crash');
    expect(s.messages.some((m) => m.type === 'assistant')).toBe(true);
    expect(s.messages.some((m) => m.type === 'result')).toBe(false);
  });

  it('exit-without-result: exits 0 after text without a result', async () => {
    const s = await start('exit-without-result');
    expect((await s.exited).code).toBe(0);
    expect(s.messages.some((m) => m.type === 'result')).toBe(false);
  });

  it('huge-line: emits a single assistant line of FAKE_CLI_HUGE_BYTES characters', async () => {
    const s = await start('huge-line', { FAKE_CLI_HUGE_BYTES: String(20 * 1024 * 1024) });
    await s.result();
    const a = s.messages.find((m) => m.type === 'assistant');
    expect(a.message.content[0].text.length).toBe(20 * 1024 * 1024);
  });

  it('answers interrupt with success and an error_during_execution result', async () => {
    const s2 = spawnCli({ bin: FAKE_CLI, env: { ...process.env, FAKE_CLI_MODE: 'ok' } });
    sessions.push(s2);
    await s2.initialize({});
    expect(await s2.controlRequest({ subtype: 'interrupt' })).toMatchObject({ subtype: 'success' });
    expect(await s2.result()).toMatchObject({ subtype: 'error_during_execution', is_error: true });
  });

  it('ignore-sigterm: survives SIGTERM, its detached grandchild survives the group SIGKILL of the CLI', async () => {
    const s = await start('ignore-sigterm');
    const { pid: childPid } = await s.waitFor((m) => m.type === 'system' && m.subtype === 'fake_child');
    pids.push(childPid);
    await s.waitFor((m) => m.type === 'assistant');
    s.child.kill('SIGTERM');
    s.child.kill('SIGINT');
    await new Promise((r) => setTimeout(r, 300));
    expect(s.exitInfo).toBeNull();
    s.kill('SIGKILL'); // the CLI's own group
    await s.exited;
    expect(isProcessAlive(childPid)).toBe(true); // in a group of its own: needs its own kill
    process.kill(-childPid, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 100));
    expect(isProcessAlive(childPid)).toBe(false);
  });
});
