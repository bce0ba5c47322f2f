// Faults the real CLI cannot be made to produce, injected with a scripted fake CLI
// (`support/fake-cli.mjs`), plus the exact argv and environment the adapter starts the CLI with.
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { addon, collect, isViewOf, markedProcesses, rejection, setup } from './support/harness.mjs';

const FAKE_CLI = fileURLToPath(new URL('./support/fake-cli.mjs', import.meta.url));
const plan = { role: 'planner', create: [], close: [], update: [] };

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

async function fakeSession(mode, env = {}, config = {}) {
  h = await setup({});
  const adapter = addon.createClaudeAdapter(
    { ...h.config, claudeExecutable: FAKE_CLI, env: { ...h.config.env, FAKE_CLI_MODE: mode, FAKE_CLI_OUTPUT: JSON.stringify(plan), ...env }, ...config },
    h.deps,
  );
  return { adapter, handle: await adapter.startAgent({ role: 'planner', specPaths: [] }) };
}

const alive = (pid) => {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] !== 'Z';
  } catch {
    return false;
  }
};

describe('faults the real CLI cannot produce', () => {
  it('a crash mid-stream is ERR_AGENT_FAILED with the exit status and the stderr tail; output ends', async () => {
    const { handle } = await fakeSession('crash-mid-stream');
    const [out, err] = await Promise.all([collect(handle.output), rejection(handle.result)]);
    expect(out).toBe('working on it');
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toContain('exit code 3');
    expect(err.message).toContain('simulated crash');
    expect(readFileSync(handle.logFilePath, 'utf8')).toContain('=== Session failed ===');
  });

  it('a garbage line is skipped with a warning and the session completes', async () => {
    const { handle } = await fakeSession('garbage-line');
    const [out, result] = await Promise.all([collect(handle.output), handle.result]);
    expect(result).toEqual(plan);
    expect(out).toBe('working on itworking on it (after garbage)');
    expect(h.logger.entries.some((e) => e.level === 'warn' && e.message.includes('unreadable line'))).toBe(true);
    expect(readFileSync(handle.logFilePath, 'utf8')).toContain('[warning] unreadable line from the CLI');
  });

  it('a 100 MB line is read whole and relayed', async () => {
    const { handle } = await fakeSession('huge-line', {}, { logging: { agentSessions: false, logsDir: '' } });
    let bytes = 0;
    for await (const chunk of handle.output) bytes += chunk.length;
    expect(await handle.result).toEqual(plan);
    expect(bytes).toBe(100 * 1024 * 1024);
  });

  it('an exit without a result is ERR_AGENT_FAILED', async () => {
    const { handle } = await fakeSession('exit-without-result');
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toContain('ended without a result');
    expect(err.message).toContain('exit code 0');
  });

  it('a CLI that ignores interrupt and SIGTERM is killed with everything it started', async () => {
    const marker = `ignore-sigterm-${process.pid}-${Date.now()}`;
    const { adapter, handle } = await fakeSession('ignore-sigterm', { FAKE_CLI_MARKER: marker });
    // wait for the fake to start its stubborn grandchild (in a process session of its own)
    let procs = [];
    for (let i = 0; i < 100 && !procs.some((p) => p.cmdline.includes('setInterval')); i++) {
      await new Promise((r) => setTimeout(r, 50));
      procs = markedProcesses(marker);
    }
    const childPid = procs.find((p) => p.cmdline.includes('setInterval'))?.pid;
    const cliPid = procs.find((p) => p.cmdline.includes('fake-cli'))?.pid;
    expect(childPid && cliPid).toBeTruthy();
    const t0 = Date.now();
    adapter.cancelAgent(handle.sessionID);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_CANCELLED');
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(alive(cliPid)).toBe(false);
    expect(alive(childPid)).toBe(false);
    expect(markedProcesses(marker)).toEqual([]);
  });
});

describe('how the CLI is started', () => {
  it('argv and env are what the official SDK would build; config.env wins over process.env', async () => {
    // what the host's own environment holds: inherited, except what the SDK strips too
    Object.assign(process.env, { FROM_PROCESS: 'yes', PROBE: 'from-process', NODE_OPTIONS: '--max-old-space-size=100', DEBUG: '*' });
    h = await setup({
      repo: { agents: { planner: { description: 'p', tools: ['Read'], maxTurns: 4, prompt: 'p' } } },
    });
    const argvFile = join(h.scratch, 'argv.json');
    const adapter = addon.createClaudeAdapter(
      {
        ...h.config,
        claudeExecutable: FAKE_CLI,
        model: 'opus',
        env: { ...h.config.env, FAKE_CLI_MODE: 'ok', FAKE_CLI_OUTPUT: JSON.stringify(plan), FAKE_CLI_ARGV_FILE: argvFile, FAKE_CLI_ENV_KEYS: 'PROBE,NODE_OPTIONS,DEBUG,CLAUDE_CODE_ENTRYPOINT,FROM_PROCESS', PROBE: 'from-config' },
        // the fake writes its record from inside the session's sandbox
        sandbox: { allowWrite: [h.scratch] },
      },
      h.deps,
    );
    const sessionID = '9d4c6b1e-62a5-4a8e-9d64-1f0f6a4b5c3d';
    const handle = await adapter.startAgent({ role: 'planner', specPaths: [], sessionID });
    await handle.result;
    const { argv, cwd, env } = JSON.parse(readFileSync(argvFile, 'utf8'));
    expect(isViewOf(h.repo.root, cwd), cwd).toBe(true);
    expect(env).toEqual({ PROBE: 'from-config', NODE_OPTIONS: null, DEBUG: null, CLAUDE_CODE_ENTRYPOINT: 'sdk-ts', FROM_PROCESS: 'yes' });
    expect(argv.slice(0, 5)).toEqual(['--output-format', 'stream-json', '--verbose', '--input-format', 'stream-json']);
    expect(argv).toContain('--max-turns=4');
    expect(argv).toContain('--model=opus');
    expect(argv).toContain('--agent=planner');
    expect(argv).toContain('--setting-sources=');
    expect(argv).toContain('--permission-mode=bypassPermissions');
    expect(argv).toContain('--allow-dangerously-skip-permissions');
    expect(argv).toContain(`--session-id=${sessionID}`);
    const schema = JSON.parse(argv.find((a) => a.startsWith('--json-schema=')).slice('--json-schema='.length));
    expect(schema.properties.role.const).toBe('planner');
    expect(JSON.stringify(schema)).not.toContain('2020-12');
    for (const k of ['FROM_PROCESS', 'PROBE', 'NODE_OPTIONS', 'DEBUG']) delete process.env[k];
  });

  it('--max-turns is omitted when the agent file has no maxTurns', async () => {
    h = await setup({});
    const argvFile = join(h.scratch, 'argv.json');
    const adapter = addon.createClaudeAdapter(
      { ...h.config, claudeExecutable: FAKE_CLI, env: { ...h.config.env, FAKE_CLI_MODE: 'ok', FAKE_CLI_OUTPUT: JSON.stringify(plan), FAKE_CLI_ARGV_FILE: argvFile }, sandbox: { allowWrite: [h.scratch] } },
      h.deps,
    );
    await (await adapter.startAgent({ role: 'planner', specPaths: [] })).result;
    const { argv } = JSON.parse(readFileSync(argvFile, 'utf8'));
    expect(argv.some((a) => a.startsWith('--max-turns'))).toBe(false);
    expect(argv.some((a) => a.startsWith('--model'))).toBe(false);
  });
});
