// Implementor worktrees and the patch, end to end through the addon: the real CLI for the
// agent's edits, the fake CLI where only provisioning and cleanup are under test.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { killAll } from './support/engine-process.mjs';
import { bash, reply, scenario, structured, toolUse } from './support/fake-api.mjs';
import { addon, engineState, logEntry, markedProcesses, rejection, setup, SWEPT, sleepMarker } from './support/harness.mjs';

const FAKE_CLI = fileURLToPath(new URL('./support/fake-cli.mjs', import.meta.url));
const git = (cwd, ...args) => execFileSync('git', args, { cwd }).toString();

let h;
/** Engine processes a test spawned: killed after it whatever happened, so none outlives it. */
const engines = [];
afterEach(async () => {
  killAll(engines);
  await h?.cleanup();
  h = undefined;
});

const items = (n) => engineState({ workItems: Array.from({ length: n }, (_, i) => ({ id: String(i), title: `Item ${i}`, status: 'open', linkedRevision: null })) });
const bodies = (n) => Object.fromEntries(Array.from({ length: n }, (_, i) => [String(i), `Body ${i}`]));

function worktreesAndBranches(root) {
  return { worktrees: git(root, 'worktree', 'list').trim().split('\n').length - 1, branches: git(root, 'branch', '--format=%(refname:short)').trim().split('\n') };
}

describe('the implementor works in a worktree and its patch loses nothing', () => {
  it('commits, staged, unstaged, untracked, deleted and executable changes all land in the patch, and it applies onto the base', async () => {
    h = await setup({
      repo: { files: { 'src/keep.txt': 'keep\n', 'src/gone.txt': 'gone\n', 'src/edit.txt': 'one\n', '.gitignore': 'node_modules/\n' } },
      state: items(1),
      bodies: bodies(1),
    });
    // The Write tool needs an absolute path inside the worktree.
    const root = h.repo.root;
    const worktree = join(root, '.worktrees', 'wi-mixed');
    const steps = scenario.steps([
      toolUse('Write', { file_path: join(worktree, 'src/new.txt'), content: 'brand new\n' }),
      bash('git add src/new.txt && git commit -q -m "agent: add new.txt"'),
      bash('echo two >> src/edit.txt && git mv src/gone.txt src/moved.txt'),
      bash('mkdir -p node_modules && echo ignored > node_modules/x.js && printf "#!/bin/sh\\necho hi\\n" > run.sh && chmod +x run.sh && echo untracked > notes.md'),
      structured({ role: 'implementor', outcome: 'completed', summary: 'mixed changes' }),
    ]);
    h.api.setScript(steps);
    const base = git(root, 'rev-parse', 'main').trim();
    const handle = await h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-mixed' });
    // main advances during the session: that must not leak into the patch as a reverse change
    execFileSync('sh', ['-c', 'echo upstream > upstream.txt && git add upstream.txt && git commit -q -m upstream'], { cwd: root });
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    const patch = result.patch;
    for (const f of ['src/new.txt', 'src/edit.txt', 'src/moved.txt', 'run.sh', 'notes.md']) expect(patch).toContain(f);
    expect(patch).not.toContain('node_modules');
    expect(patch).not.toContain('upstream.txt');
    // round trip: apply onto a fresh clone at the base commit
    const clone = mkdtempSync(join(tmpdir(), 'cra-apply-'));
    try {
      git(tmpdir(), 'clone', '-q', root, clone);
      git(clone, 'checkout', '-q', base);
      execFileSync('git', ['apply', '--index', '-'], { cwd: clone, input: patch });
      expect(readFileSync(join(clone, 'src/new.txt'), 'utf8')).toBe('brand new\n');
      expect(readFileSync(join(clone, 'src/edit.txt'), 'utf8')).toBe('one\ntwo\n');
      expect(existsSync(join(clone, 'src/gone.txt'))).toBe(false);
      expect(readFileSync(join(clone, 'src/moved.txt'), 'utf8')).toBe('gone\n');
      expect(readFileSync(join(clone, 'notes.md'), 'utf8')).toBe('untracked\n');
      expect(git(clone, 'ls-files', '-s', 'run.sh')).toMatch(/^100755 /);
    } finally {
      rmSync(clone, { recursive: true, force: true });
    }
    // cleaned up: no worktree, no branch; the main checkout is clean
    expect(worktreesAndBranches(root)).toEqual({ worktrees: 0, branches: ['main'] });
    expect(git(root, 'status', '--porcelain')).toBe('');
    expect(readFileSync(handle.logFilePath.replace(/\.log$/, '.patch'), 'utf8')).toBe(patch);
  });

  it('blocked and validation-failure outcomes give a null patch and still clean up', async () => {
    h = await setup({ state: items(1), bodies: bodies(1), script: scenario.steps([bash('echo x > x.txt'), structured({ role: 'implementor', outcome: 'validation-failure', summary: 'tests fail' })]) });
    const result = await (await h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-vf' })).result;
    expect(result).toEqual({ role: 'implementor', outcome: 'validation-failure', patch: null, summary: 'tests fail' });
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });
});

describe('work is never silently lost', () => {
  it('a cancelled implementor leaves its changes as a .patch next to the transcript', async () => {
    const marker = sleepMarker(34);
    h = await setup({ state: items(1), bodies: bodies(1), script: scenario.steps([bash('echo wip > wip.txt'), bash(`echo waiting; sleep ${marker}`), structured({ role: 'implementor', outcome: 'completed', summary: 's' })]) });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-wip' });
    // The second request carries the first command's result: wip.txt is written (in a layer
    // the host's path shows nothing, so the API's view is what is waited for), and the agent
    // is in its long command. Bounded, for a loaded machine.
    for (let i = 0; i < 1200 && h.api.mainBodies().length < 2; i++) await new Promise((r) => setTimeout(r, 50));
    expect(h.api.mainBodies().length).toBe(2);
    adapter.cancelAgent(handle.sessionID);
    expect((await rejection(handle.result)).code).toBe('ERR_CANCELLED');
    const saved = readFileSync(handle.logFilePath.replace(/\.log$/, '.patch'), 'utf8');
    expect(saved).toContain('+++ b/wip.txt');
    expect(readFileSync(handle.logFilePath, 'utf8')).toContain("[patch] the worktree's changes were saved to");
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });
});

describe('provisioning', () => {
  const fakeConfig = (extra = {}) => ({
    claudeExecutable: FAKE_CLI,
    env: { ...h.config.env, FAKE_CLI_MODE: 'ok', FAKE_CLI_OUTPUT: JSON.stringify({ role: 'implementor', outcome: 'blocked', summary: 's' }), ...extra },
  });

  it('16 implementor sessions started at once are all provisioned and all cleaned', async () => {
    h = await setup({ state: items(16), bodies: bodies(16) });
    const adapter = addon.createClaudeAdapter({ ...h.config, ...fakeConfig() }, h.deps);
    const handles = await Promise.all(Array.from({ length: 16 }, (_, i) => adapter.startAgent({ role: 'implementor', workItemID: String(i), branchName: `wi/${i}` })));
    const results = await Promise.all(handles.map((x) => x.result));
    expect(results.every((r) => r.outcome === 'blocked')).toBe(true);
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });

  it('a failing setup command is ERR_PROVISION with its exit status and output; nothing is left', async () => {
    h = await setup({ state: items(1), bodies: bodies(1), config: { worktreeSetupCommand: ['sh', '-c', 'echo installing; echo boom >&2; exit 7'] } });
    const err = await rejection(h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-setup' }));
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain('7');
    expect(err.message).toContain('boom');
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });

  it('a setup command that cannot start is ERR_PROVISION', async () => {
    h = await setup({ state: items(1), bodies: bodies(1), config: { worktreeSetupCommand: ['no-such-installer-xyz'] } });
    const err = await rejection(h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-nostart' }));
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain('no-such-installer-xyz');
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });

  it('a branch in use by a running session is ERR_DUPLICATE_SESSION and its worktree is untouched', async () => {
    h = await setup({ state: items(2), bodies: bodies(2) });
    const adapter = addon.createClaudeAdapter({ ...h.config, ...fakeConfig({ FAKE_CLI_MODE: 'ignore-sigterm' }) }, h.deps);
    const first = await adapter.startAgent({ role: 'implementor', workItemID: '0', branchName: 'shared' });
    const err = await rejection(adapter.startAgent({ role: 'implementor', workItemID: '1', branchName: 'shared' }));
    expect(err.code).toBe('ERR_DUPLICATE_SESSION');
    expect(existsSync(join(h.repo.root, '.worktrees', 'shared'))).toBe(true);
    adapter.cancelAgent(first.sessionID);
    expect((await rejection(first.result)).code).toBe('ERR_CANCELLED');
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });

  it('an existing branch is force-reset to defaultBranch', async () => {
    h = await setup({ state: items(1), bodies: bodies(1) });
    git(h.repo.root, 'checkout', '-q', '-b', 'wi-old');
    execFileSync('sh', ['-c', 'echo stale > stale.txt && git add stale.txt && git commit -q -m stale && git checkout -q main'], { cwd: h.repo.root });
    const adapter = addon.createClaudeAdapter({ ...h.config, ...fakeConfig({ FAKE_CLI_MODE: 'ignore-sigterm' }) }, h.deps);
    const handle = await adapter.startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-old' });
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-old', 'stale.txt'))).toBe(false);
    expect(git(join(h.repo.root, '.worktrees', 'wi-old'), 'rev-parse', 'HEAD')).toBe(git(h.repo.root, 'rev-parse', 'main'));
    adapter.cancelAgent(handle.sessionID);
    await rejection(handle.result);
  });

  it("a stale worktree another tool left at the session's path is saved as a patch (path logged at warn), then replaced with its branch; the session runs", async () => {
    h = await setup({ state: items(1), bodies: bodies(1), script: scenario.steps([bash('echo new > new.txt'), structured({ role: 'implementor', outcome: 'completed', summary: 's' })]) });
    const root = h.repo.root;
    // What the TypeScript adapter or the v1 agent manager leaves after a crash: an unlocked
    // worktree on the session's branch, with a commit and uncommitted work.
    git(root, 'worktree', 'add', '-q', '-b', 'wi-0', join(root, '.worktrees', 'wi-0'), 'main');
    execFileSync('sh', ['-c', 'echo one > committed.txt && git add -A && git commit -q -m old && echo old > old.txt'], { cwd: join(root, '.worktrees', 'wi-0') });
    const handle = await h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-0' });
    const result = await handle.result;
    expect(result.patch).toContain('+++ b/new.txt');
    expect(result.patch).not.toContain('old.txt');
    const warned = h.logger.entries.find((e) => e.level === 'warn' && /stale worktree was in the way/.test(e.message));
    expect(warned, JSON.stringify(h.logger.entries.map((e) => e.message))).toBeTruthy();
    const saved = readFileSync(warned.data.patch, 'utf8');
    expect(saved).toContain('+++ b/old.txt');
    expect(saved).toContain('+++ b/committed.txt');
    // The branch of the session's branchName goes too (spec 000 resets and deletes it); its
    // commit is in the saved patch.
    expect(worktreesAndBranches(root)).toEqual({ worktrees: 0, branches: ['main'] });
  });

  it('an Implementor on the default branch or on a branch checked out in the repository is ERR_INVALID_PARAMS naming branchName; nothing is made', async () => {
    h = await setup({ state: items(1), bodies: bodies(1), script: scenario.steps([structured({ role: 'implementor', outcome: 'completed', summary: 's' })]) });
    const root = h.repo.root;
    const elsewhere = mkdtempSync(join(tmpdir(), 'cra-elsewhere-'));
    rmSync(elsewhere, { recursive: true });
    git(root, 'worktree', 'add', '-q', '-b', 'busy', elsewhere, 'main');
    const marker = join(h.scratch, 'setup-ran');
    const adapter = addon.createClaudeAdapter({ ...h.config, worktreeSetupCommand: ['sh', '-c', `touch ${marker}`] }, h.deps);
    try {
      for (const [branchName, why] of [['main', 'is the defaultBranch'], ['busy', `is checked out in the repository at ${elsewhere}`]]) {
        const err = await rejection(adapter.startAgent({ role: 'implementor', workItemID: '0', branchName }));
        expect(err.code).toBe('ERR_INVALID_PARAMS');
        expect(err.message).toContain(`branchName "${branchName}" ${why}`);
      }
      expect(existsSync(join(root, '.worktrees'))).toBe(false);
      expect(existsSync(marker)).toBe(false);
      expect(existsSync(h.config.logging.logsDir) ? readdirSync(h.config.logging.logsDir) : []).toEqual([]);
      expect(worktreesAndBranches(root)).toEqual({ worktrees: 1, branches: ['busy', 'main'] });
      expect(h.api.requests).toEqual([]);
    } finally {
      git(root, 'worktree', 'remove', '--force', elsewhere);
    }
  });

  it("a locked worktree at the session's path is ERR_PROVISION naming the path and what to do; it is untouched", async () => {
    h = await setup({ state: items(1), bodies: bodies(1) });
    const root = h.repo.root;
    const path = join(root, '.worktrees', 'wi-0');
    git(root, 'worktree', 'add', '-q', '--lock', '-b', 'wi-0', path, 'main');
    execFileSync('sh', ['-c', 'echo mine > mine.txt'], { cwd: path });
    const err = await rejection(h.adapter().startAgent({ role: 'implementor', workItemID: '0', branchName: 'wi-0' }));
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain(path);
    expect(err.message).toContain('git worktree unlock');
    expect(readFileSync(join(path, 'mine.txt'), 'utf8')).toBe('mine\n');
    expect(worktreesAndBranches(root)).toEqual({ worktrees: 1, branches: ['main', 'wi-0'] });
  });

  it('a killed engine process leaves a worktree that the next createClaudeAdapter sweeps; its CLI dies with it', async () => {
    h = await setup({ state: items(1), bodies: bodies(1) });
    const marker = `orphan-${process.pid}-${Date.now()}`;
    const cfg = { ...h.config, ...fakeConfig({ FAKE_CLI_MODE: 'hang', FAKE_CLI_MARKER: marker }) };
    const child = spawn(process.execPath, ['-e', `
      const { createClaudeAdapter } = require(${JSON.stringify(join(process.cwd(), 'index.js'))});
      const cfg = ${JSON.stringify({ ...cfg, bashValidatorHook: undefined, logger: undefined })};
      const noop = () => {};
      const adapter = createClaudeAdapter({ ...cfg, bashValidatorHook: async () => undefined, logger: { debug: noop, info: noop, error: noop } }, {
        workItemReader: { getWorkItemBody: async () => 'b' }, revisionReader: { getRevisionFiles: async () => [] },
        getState: () => ({ workItems: { 0: { id: '0', title: 't', status: 'open', linkedRevision: null } }, revisions: {}, lastPlannedSHAs: {} }),
        getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
      adapter.startAgent({ role: 'implementor', workItemID: '0', branchName: 'orphan' }).then(() => console.log('started'));
    `], { stdio: ['ignore', 'pipe', 'inherit'] });
    engines.push(child);
    await new Promise((resolve, reject) => {
      child.stdout.on('data', (d) => d.toString().includes('started') && resolve());
      child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
    });
    expect(existsSync(join(h.repo.root, '.worktrees', 'orphan'))).toBe(true);
    // the fake CLI and its sandbox, seen from the host
    expect(markedProcesses(marker).some((p) => p.cmdline.includes('fake-cli'))).toBe(true);
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    for (let i = 0; i < 50 && markedProcesses(marker).length > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(markedProcesses(marker)).toEqual([]);
    addon.createClaudeAdapter(h.config, h.deps);
    await logEntry(h.logger, SWEPT);
    expect(existsSync(join(h.repo.root, '.worktrees', 'orphan'))).toBe(false);
    expect(worktreesAndBranches(h.repo.root)).toEqual({ worktrees: 0, branches: ['main'] });
  });
});
