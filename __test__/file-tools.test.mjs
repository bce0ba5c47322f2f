// The mutation boundary holds for the CLI's own file tools too (issue 9). The OS sandbox only
// confines Bash; Write, Edit, MultiEdit and NotebookEdit run inside the CLI's process, so the
// adapter answers their PreToolUse hook itself from the session's write scope. Real CLI (under
// bypassPermissions), the fake Messages API scripting the tool calls; the engine's Bash
// validator approves everything and is never asked about file tools.
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { scenario, toolResults, toolUse } from './support/fake-api.mjs';
import { hostGitDir, setup, SHARED_BASE, viewOf } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

// Every role gets the file tools: the boundary must hold even when a definition grants them.
const FILE_AGENTS = agentsWithTools(['Read', 'Write', 'Edit', 'NotebookEdit', 'Glob', 'Grep']);

const README = '# temp repo\n';
const NOTEBOOK = JSON.stringify({ cells: [{ cell_type: 'code', id: 'c1', source: ['x = 1'], metadata: {}, outputs: [], execution_count: null }], metadata: {}, nbformat: 4, nbformat_minor: 5 });
const write = (file_path, content = 'agent was here\n') => toolUse('Write', { file_path, content });
const edit = (file_path) => toolUse('Edit', { file_path, old_string: 'temp repo', new_string: 'owned repo' });
const read = (file_path) => toolUse('Read', { file_path });

/** The session's cwd: an Implementor's worktree (`<repoRoot>/.worktrees/<branch>`), else its view of the repository. */
const cwdOf = (role) => (role === 'implementor' ? join(h.repo.root, '.worktrees', ROLES.implementor.params().branchName) : viewOf(h.repo.root));

/**
 * One session of `role` whose model makes each call of `calls` (a block, or a function of the
 * session's cwd giving one), one per turn, then answers. Resolves with the result and, per
 * call, the tool result the model saw.
 */
async function run(role, calls, config = {}, prepare = () => {}) {
  h = await setup({ repo: { agents: FILE_AGENTS, files: { 'nb.ipynb': NOTEBOOK } }, state: ROLE_STATE, bodies: ROLE_BODIES, config });
  prepare();
  const steps = [...calls, ROLES[role].done].map((c) => (typeof c === 'function' ? () => c(cwdOf(role)) : c));
  h.api.setScript(scenario.steps(steps));
  const handle = await h.adapter().startAgent(ROLES[role].params());
  const result = await handle.result;
  const results = toolResults(h.api.mainBodies().at(-1));
  expect(results).toHaveLength(calls.length);
  return { result, results, transcript: readFileSync(handle.logFilePath, 'utf8') };
}

const blocked = () => h.logger.entries.filter((e) => e.message.startsWith('file write blocked'));

describe('Implementor: its file tools write only inside its worktree', () => {
  it('Write and Edit on the engine checkout and a Write beside the repository are blocked; the model sees why; files unchanged', async () => {
    let beside;
    after.push(() => beside && rmSync(beside, { force: true }));
    const { result, results, transcript } = await run('implementor', [
      (cwd) => read(join(cwd, '../../README.md')),
      (cwd) => write(join(cwd, '../../README.md')),
      (cwd) => edit(join(cwd, '../../README.md')),
      () => write((beside = `${h.repo.root}-beside.txt`)),
      (cwd) => write(join(cwd, '../../planted.txt')),
      (cwd) => read(join(cwd, '../../nb.ipynb')),
      (cwd) => toolUse('NotebookEdit', { notebook_path: join(cwd, '../../nb.ipynb'), cell_id: 'c1', new_source: 'x = 2', edit_mode: 'replace', cell_type: 'code' }),
      (cwd) => write(join(cwd, 'inside.txt'), 'inside\n'),
    ]);
    const root = h.repo.root;
    // Inside its sandbox the engine checkout is not even there to read.
    for (const i of [0, 5]) expect(results[i].text, `call ${i}`).toMatch(/File does not exist/);
    for (const i of [1, 2, 3, 4, 6]) expect(results[i].is_error, `call ${i}: ${results[i].text}`).toBe(true);
    // Writes are refused by the hook, with the reason; an Edit of a file the sandbox does not
    // show fails before it (the CLI checks that the file exists first).
    for (const i of [1, 3, 4]) expect(results[i].text, `call ${i}`).toMatch(/may not write there with Write/);
    expect(results[1].text).toContain(`${root}, which this session may not write`);
    expect(results[3].text).toContain('outside every path this session may write');
    expect(results[3].text).toMatch(/may write only inside: .*\.worktrees/);
    expect(readFileSync(join(root, 'README.md'), 'utf8')).toBe(README);
    expect(existsSync(beside)).toBe(false);
    expect(existsSync(join(root, 'planted.txt'))).toBe(false);
    expect(readFileSync(join(root, 'nb.ipynb'), 'utf8')).toBe(NOTEBOOK);
    expect(blocked().map((e) => e.data.tool)).toEqual(['Write', 'Write', 'Write']);
    expect(transcript).toMatch(/file-guard.*blocked Write: \S+README\.md/);
    expect(h.hookCalls).toEqual([]); // the engine's Bash validator is not asked about file tools
    expect(results[7].is_error, results[7].text).toBe(false);
    expect(result.patch).toContain('+++ b/inside.txt');
    expect(result.patch).not.toContain('README.md');
  });

  it('a Write and an Edit inside its worktree land in the patch; its .git is refused', async () => {
    const { result, results } = await run('implementor', [
      (cwd) => write(join(cwd, 'inside.txt'), 'inside\n'),
      (cwd) => write(join(cwd, 'src/deep/new.rs'), 'fn main() {}\n'),
      (cwd) => read(join(cwd, 'README.md')),
      (cwd) => edit(join(cwd, 'README.md')),
      (cwd) => write(join(hostGitDir(cwd), 'config'), '[core]\n\tfsmonitor = evil\n'),
      // Its `.git`: a layered checkout's pointer file, a clone's directory (its HEAD).
      (cwd) => write(join(cwd, SHARED_BASE ? '.git' : '.git/HEAD'), 'gitdir: /elsewhere\n'),
    ]);
    for (const i of [0, 1, 2, 3]) expect(results[i].is_error, `call ${i}: ${results[i].text}`).toBe(false);
    expect(results[4].is_error).toBe(true);
    // A clone's .git is inside the checkout and denied by name; a layered checkout's git dir is
    // its layer's, in the repository (which is denied) outside the checkout.
    expect(results[4].text).toMatch(SHARED_BASE ? `is inside ${h.repo.root}, which this session may not write` : /\.git, which this session may not write/);
    expect(results[5].is_error).toBe(true);
    expect(results[5].text).toMatch(/\.git, which this session may not write/);
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('+++ b/inside.txt');
    expect(result.patch).toContain('+++ b/src/deep/new.rs');
    expect(result.patch).toContain('+# owned repo');
    expect(readFileSync(join(h.repo.root, 'README.md'), 'utf8')).toBe(README);
  });

  it('the guard holds with sandbox: false too', async () => {
    const { result, results } = await run('implementor', [(cwd) => write(join(cwd, '../../README.md')), (cwd) => write(join(cwd, 'inside.txt'))], { sandbox: false });
    expect(results.map((r) => r.is_error)).toEqual([true, false]);
    expect(result.patch).toContain('+++ b/inside.txt');
    expect(readFileSync(join(h.repo.root, 'README.md'), 'utf8')).toBe(README);
  });
});

describe('Planner and Reviewer: their file tools write nothing in the repository', () => {
  for (const role of ['planner', 'reviewer']) {
    it(`${role}: Write and Edit into the repository and its .git are blocked; the temp dir stays writable`, async () => {
      // The session's temp dir is its sandbox's private /tmp.
      const scratch = join('/tmp', `cra-${role}-scratch-${process.pid}-${Date.now()}.txt`);
      after.push(() => rmSync(scratch, { force: true }));
      const { results } = await run(role, [
        (cwd) => write(join(cwd, 'planted.txt')),
        (cwd) => read(join(cwd, 'README.md')),
        (cwd) => edit(join(cwd, 'README.md')),
        (cwd) => write(join(cwd, '.git/hooks/post-checkout'), '#!/bin/sh\n'),
        write(scratch, 'notes\n'),
        read(scratch),
      ]);
      for (const i of [0, 2, 3]) expect(results[i].is_error, `call ${i}: ${results[i].text}`).toBe(true);
      expect(results[0].text).toMatch(/may not write there with Write/);
      expect(results[4].is_error, results[4].text).toBe(false);
      const root = h.repo.root;
      expect(existsSync(join(root, 'planted.txt'))).toBe(false);
      expect(readFileSync(join(root, 'README.md'), 'utf8')).toBe(README);
      expect(existsSync(join(root, '.git/hooks/post-checkout'))).toBe(false);
      expect(results[5].text).toContain('notes');
      expect(existsSync(scratch)).toBe(false);
      expect(blocked()).toHaveLength(3);
    });
  }
});

// Credential stores are not readable (issue 9). Bash meets the sandbox's denyRead; the CLI's own
// Read, Glob and Grep run outside the OS sandbox, so the adapter answers their hook itself. The
// harness gives the CLI a scratch HOME (config.env.HOME), where the stores are planted.
describe('Read tools: credential stores in HOME are not readable', () => {
  const SECRET = 'SECRET-KEY-MATERIAL-4242';
  const NOTE = 'ORDINARY-NOTE-1717';
  const home = () => h.config.env.HOME;
  const plant = () => {
    // A HOME of the test's own, whatever HOME the suite runs with (CRA_TEST_REAL_HOME).
    h.config.env.HOME = join(h.scratch, 'home');
    mkdirSync(join(home(), '.ssh'), { recursive: true });
    writeFileSync(join(home(), '.ssh/id_rsa'), `-----BEGIN KEY-----\n${SECRET}\n`);
    writeFileSync(join(home(), '.netrc'), `machine example.com login me password ${SECRET}\n`);
    writeFileSync(join(home(), 'notes.txt'), `${NOTE}\n`);
  };
  const readBlocked = () => h.logger.entries.filter((e) => e.message.startsWith('file read blocked'));
  const sentToModel = () => JSON.stringify(h.api.requests.map((r) => r.body));

  for (const config of [{}, { sandbox: false }]) {
    it(`Read of the key and .netrc, a Grep over HOME and a Glob into .ssh are blocked; the secret never reaches the model; the repository and other files read fine${config.sandbox === false ? ' (sandbox: false)' : ''}`, async () => {
      const { results, transcript } = await run(
        'planner',
        [
          () => read(join(home(), '.ssh/id_rsa')),
          (cwd) => read(join(cwd, 'README.md')),
          () => toolUse('Grep', { pattern: 'KEY-MATERIAL-\\d+', path: home(), output_mode: 'content' }),
          () => toolUse('Glob', { pattern: '.ssh/*', path: home() }),
          () => toolUse('Glob', { pattern: `${home()}/.ssh/id_*` }),
          () => read(join(home(), '.netrc')),
          () => read(join(home(), 'notes.txt')),
          () => toolUse('Grep', { pattern: 'temp repo', output_mode: 'content' }),
          () => toolUse('Glob', { pattern: '**/*.md' }),
        ],
        config,
        plant,
      );
      for (const i of [0, 2, 3, 4, 5]) {
        expect(results[i].is_error, `call ${i}: ${results[i].text}`).toBe(true);
        expect(results[i].text, `call ${i}`).toMatch(/may not read there with (Read|Grep|Glob)/);
      }
      expect(results[0].text).toContain('inside the credential store');
      expect(results[2].text).toContain('would reach the credential store');
      const sandboxed = config.sandbox !== false;
      for (const i of [1, 7, 8]) expect(results[i].is_error, `call ${i}: ${results[i].text}`).toBe(false);
      // The session's HOME is private in the sandbox: an ordinary file there is not visible.
      expect(results[6].is_error, results[6].text).toBe(sandboxed);
      expect(results[1].text).toContain('temp repo');
      expect(results[7].text).toContain('temp repo');
      expect(results[8].text).toContain('README.md');
      // The check below can fail: a file read from HOME does reach the model (without the sandbox).
      if (!sandboxed) expect(sentToModel()).toContain(NOTE);
      expect(sentToModel()).not.toContain(SECRET);
      expect(readBlocked().map((e) => e.data.tool)).toEqual(['Read', 'Grep', 'Glob', 'Glob', 'Read']);
      expect(transcript).toMatch(/file-guard.*blocked Read: \S+\.ssh\/id_rsa/);
      expect(h.hookCalls).toEqual([]);
    });
  }
});
