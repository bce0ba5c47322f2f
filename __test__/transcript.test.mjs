// What the session log records of the agent's tool calls: each result or error as the model saw
// it (bounded), and never a secret the adapter knows of. Real addon, real Claude Code CLI (its
// OS sandbox on), fake Messages API.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { implementorDone, implementorParams, implementorState } from './support/roles.mjs';
import { bash, reply, scenario, text, toolUse } from './support/fake-api.mjs';
import { setup } from './support/harness.mjs';

const done = implementorDone;

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/** The transcript entry of a tool result: its header line and the indented text below it. */
const resultEntry = (log, status) =>
  log.match(new RegExp(`\\[tool_result\\] Bash: ${status}, \\d+ bytes(?: \\(first \\d+ shown\\))?\\n(?:    .*\\n)*`, 'g')) ?? [];

describe('the transcript records what each tool call returned', () => {
  it("shows a command's output and a failed command's error, each after its call", async () => {
    const marker = `marker-${randomUUID()}`;
    h = await setup({
      script: scenario.steps([
        reply(text('First.'), bash(`echo ${marker} | tee marker.txt`)),
        reply(bash('ls /no/such/dir-for-the-transcript')),
        done(),
      ]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    await handle.result;
    const log = readFileSync(handle.logFilePath, 'utf8');
    const ok = resultEntry(log, 'ok').find((e) => e.includes(marker));
    expect(ok, log).toMatch(new RegExp(`^\\[tool_result\\] Bash: ok, ${marker.length} bytes\\n    ${marker}\\n`));
    expect(log.indexOf(ok)).toBeGreaterThan(log.indexOf(`[tool_use] Bash: echo ${marker}`));
    const failed = resultEntry(log, 'error').find((e) => e.includes('/no/such/dir-for-the-transcript'));
    expect(failed, log).toContain('No such file or directory');
    expect(log.indexOf(failed)).toBeGreaterThan(log.indexOf('[tool_use] Bash: ls /no/such/dir-for-the-transcript'));
    // Each entry carries the transcript's timestamp format.
    expect(log).toMatch(/\n\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[tool_result\] Bash: error, /);
  });

  it('shows which file a Read, Write or Edit touched and which pattern a Grep or Glob searched where', async () => {
    h = await setup({ state: implementorState, bodies: { 7: 'x' } });
    const wt = join(h.repo.root, '.worktrees', implementorParams.branchName);
    const calls = [
      toolUse('Write', { file_path: join(wt, 'notes.md'), content: 'one\ntwo\n' }),
      toolUse('Read', { file_path: join(wt, 'notes.md') }),
      toolUse('Edit', { file_path: join(wt, 'notes.md'), old_string: 'two', new_string: 'three' }),
      toolUse('Grep', { pattern: 'thr+ee', path: wt }),
      toolUse('Glob', { pattern: '**/*.md', path: wt }),
    ];
    h.api.setScript(scenario.steps([...calls.map((c) => reply(c)), done()]));
    const handle = await h.adapter().startAgent(implementorParams);
    const result = await handle.result;
    expect(result.patch).toContain('+three');
    const log = readFileSync(handle.logFilePath, 'utf8');
    const lines = [
      `Write ${join(wt, 'notes.md')} (8 bytes)`,
      `Read ${join(wt, 'notes.md')}`,
      `Edit ${join(wt, 'notes.md')}`,
      `Grep thr+ee in ${wt}`,
      `Glob **/*.md in ${wt}`,
    ];
    let at = 0;
    for (const line of lines) {
      const i = log.indexOf(`[tool_use] ${line}\n`, at);
      expect(i, `${line}\n${log}`).toBeGreaterThan(at);
      // Each call's line comes before its own result (this CLI has no Grep or Glob tool: the
      // call, as the model made it, is still recorded, then the CLI's refusal).
      const tool = line.split(' ')[0];
      const res = log.indexOf(`[tool_result] ${tool}: `, i);
      expect(res, log).toBeGreaterThan(i);
      at = res;
    }
  });

  it('shows the first 4 KiB of a long result and its whole size', async () => {
    h = await setup({
      script: scenario.steps([reply(bash("head -c 10000 /dev/zero | tr '\\0' 'y' | tee long.txt")), done()]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const handle = await h.adapter().startAgent(implementorParams);
    await handle.result;
    const log = readFileSync(handle.logFilePath, 'utf8');
    const [entry] = resultEntry(log, 'ok');
    expect(entry, log).toMatch(/^\[tool_result\] Bash: ok, 10000 bytes \(first 4096 shown\)\n    y{4096}\n$/);
  });

  it('never writes a config.env value, even echoed by a command; values under 8 bytes are not treated as secrets', async () => {
    const secret = `https://deploy:${randomUUID()}@hooks.example/x`;
    h = await setup({
      script: scenario.steps([
        reply(bash('echo "hook=$DEPLOY_HOOK_URL level=$LOG_LEVEL_X" | tee hook.txt')),
        reply(text(`The hook is ${secret}.`), done(`configured ${secret}`)),
      ]),
      state: implementorState,
      bodies: { 7: 'x' },
    });
    h.config.env = { ...h.config.env, DEPLOY_HOOK_URL: secret, LOG_LEVEL_X: 'verbose' };
    const handle = await h.adapter().startAgent(implementorParams);
    await handle.result;
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(log).toContain('[tool_result] Bash: ok, ');
    expect(log).toContain('    hook=[REDACTED] level=verbose\n');
    expect(log).toContain('The hook is [REDACTED].');
    expect(log).not.toContain(secret);
    expect(log).not.toContain(h.config.env.ANTHROPIC_API_KEY);
  });
});
