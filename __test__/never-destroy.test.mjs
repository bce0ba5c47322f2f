// Issue 10: the adapter never destroys what it did not make. The sweep that runs when an adapter
// is created removes only worktrees carrying this adapter's owner record whose process is gone
// (saving their work first); a person's worktree under .worktrees/ is never touched. So do the
// temp dirs named after a process that is gone.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured } from './support/fake-api.mjs';
import { engineProcess, killAll } from './support/engine-process.mjs';
import { addon, engineState, logEntry, rejection, setup, SWEPT, TEMP_SWEPT, workOf } from './support/harness.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd }).toString();

let h;
/** Engine processes a test spawned: killed after it whatever happened, so none outlives it. */
const engines = [];
afterEach(async () => {
  killAll(engines);
  await h?.cleanup();
  h = undefined;
});

/** A worktree at .worktrees/<name> whose owner record names a process that has exited. */
function deadSessionWorktree(root, name) {
  git(root, 'worktree', 'add', '-q', '--lock', '-b', name, join('.worktrees', name), 'main');
  const pid = Number(execFileSync('sh', ['-c', 'echo $$']).toString().trim());
  const admin = readFileSync(join(root, '.worktrees', name, '.git'), 'utf8').trim().replace(/^gitdir: /, '');
  writeFileSync(join(admin, 'locked'), `claude-runtime-adapter owner pid=${pid} start=1 host=${hostname()}\n`);
}

describe('the sweep never destroys what the adapter did not make', () => {
  it("a person's worktree with an uncommitted file survives createClaudeAdapter; a dead session's beside it is saved, then swept", async () => {
    h = await setup({ state: engineState({ workItems: [] }), bodies: {} });
    const root = h.repo.root;
    git(root, 'worktree', 'add', '-q', '.worktrees/my-work', '-b', 'manual');
    writeFileSync(join(root, '.worktrees', 'my-work', 'draft.md'), 'mine\n');
    deadSessionWorktree(root, 'crashed');
    writeFileSync(join(root, '.worktrees', 'crashed', 'unsaved.txt'), 'agent work\n');

    addon.createClaudeAdapter(h.config, h.deps);
    // The sweep runs in the background; its log entry comes once it is wholly done.
    await logEntry(h.logger, SWEPT);

    expect(existsSync(join(root, '.worktrees', 'crashed'))).toBe(false);
    expect(readFileSync(join(root, '.worktrees', 'my-work', 'draft.md'), 'utf8')).toBe('mine\n');
    expect(git(root, 'branch', '--format=%(refname:short)').trim().split('\n')).toEqual(['main', 'manual']);
    const salvaged = join(root, '.git', 'claude-runtime-adapter', 'salvaged');
    const saved = readdirSync(salvaged);
    expect(saved).toHaveLength(1);
    expect(readFileSync(join(salvaged, saved[0]), 'utf8')).toContain('unsaved.txt');
  });
});

describe('a crash loses no work', () => {
  it('engine SIGKILLed mid-Implementor with uncommitted work: the next adapter saves it as a patch beside the transcript, then removes the worktree; a foreign worktree beside it survives', async () => {
    h = await setup({
      // The agent writes its work and is still running a command (the sandbox's mount points are
      // in place) when the engine dies.
      script: scenario.steps([bash(`echo "agent work" > unsaved.txt; sleep 30.${Date.now() % 1000}`, 'write work, then wait'), { hang: true }]),
      state: engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] }),
      bodies: { 7: 'x' },
      // Swept by the next adapter at once, not left for a continuation (interrupted.test.mjs).
      config: { resumeInterrupted: 0 },
    });
    const root = h.repo.root;
    git(root, 'worktree', 'add', '-q', '.worktrees/theirs', '-b', 'theirs');
    writeFileSync(join(root, '.worktrees', 'theirs', 'draft.md'), 'a person\'s draft\n');
    const { engine, log } = await engineProcess(h, { role: 'implementor', workItemID: '7', branchName: 'wi-7' }, engines);
    const checkout = join(root, '.worktrees', 'wi-7');
    const work = () => join(workOf(checkout), 'unsaved.txt');
    const written = () => existsSync(join(checkout, '.git')) && existsSync(work()) && readFileSync(work(), 'utf8') === 'agent work\n';
    for (let i = 0; i < 400 && !written(); i++) await new Promise((r) => setTimeout(r, 25));
    expect(written()).toBe(true);
    // The session's socket directory, named after the engine process that made it.
    const tempDirs = () => readdirSync(tmpdir()).filter((n) => n.startsWith(`claude-runtime-adapter-sockets-${engine.pid}-`));
    expect(tempDirs()).toHaveLength(1);
    const leftDir = join(tmpdir(), tempDirs()[0]);
    engine.kill('SIGKILL');
    await new Promise((r) => engine.on('exit', r));
    expect(existsSync(leftDir)).toBe(true);

    addon.createClaudeAdapter(h.config, h.deps);
    const swept = await logEntry(h.logger, SWEPT);
    // The killed engine's temp dirs go too; this process's own (a live owner's) are kept.
    const removed = await logEntry(h.logger, TEMP_SWEPT);
    expect(removed.data.paths).toContain(leftDir);
    expect(removed.data.paths.every((p) => !p.includes(`-${process.pid}-`))).toBe(true);
    expect(existsSync(leftDir)).toBe(false);
    expect(existsSync(join(root, '.worktrees', 'wi-7'))).toBe(false);
    // Its layer and the base it was over went too (after the work was read through them).
    expect(readdirSync(join(root, '.worktrees'))).toEqual(['theirs']);
    expect(swept.data.patches).toEqual([log.replace(/\.log$/, '.patch')]);
    const patch = readFileSync(swept.data.patches[0], 'utf8');
    expect(patch).toContain('+++ b/unsaved.txt');
    // Only the agent's file: nothing of the killed session's sandbox is in the checkout.
    expect(patch.match(/^diff --git .*$/gm)).toEqual(['diff --git a/unsaved.txt b/unsaved.txt']);
    // the saved work applies on the base commit
    git(root, 'apply', '--check', '--index', swept.data.patches[0]);
    expect(readFileSync(join(root, '.worktrees', 'theirs', 'draft.md'), 'utf8')).toBe("a person's draft\n");
    expect(git(root, 'branch', '--format=%(refname:short)').trim().split('\n')).toEqual(['main', 'theirs']);
  });
});

describe('the patch is the agent\'s work, not the setup\'s', () => {
  // A setup step that writes an install marker and touches a tracked file (as a lockfile update does).
  const setupCmd = ['sh', '-c', 'echo installed > install-state.txt && echo "# touched by setup" >> README.md'];
  const state = engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] });

  it('what the setup command wrote or changed is not in the patch; the agent\'s change is, and it applies on the base commit', async () => {
    h = await setup({
      script: scenario.steps([bash('echo feature > feature.txt'), structured({ role: 'implementor', outcome: 'completed', summary: 'feature' })]),
      state,
      bodies: { 7: 'x' },
      config: { worktreeSetupCommand: setupCmd },
    });
    const handle = await h.adapter().startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    const result = await handle.result;
    expect(result.patch).toContain('+++ b/feature.txt');
    expect(result.patch).not.toContain('install-state.txt');
    expect(result.patch).not.toContain('README.md');
    writeFileSync(join(h.scratch, 'p.patch'), result.patch);
    git(h.repo.root, 'apply', '--check', '--index', join(h.scratch, 'p.patch'));
  });

  it('an agent that changed nothing after the setup and says completed is ERR_EMPTY_PATCH', async () => {
    h = await setup({
      script: scenario.steps([structured({ role: 'implementor', outcome: 'completed', summary: 'nothing' })]),
      state,
      bodies: { 7: 'x' },
      config: { worktreeSetupCommand: setupCmd },
    });
    const handle = await h.adapter().startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' });
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_EMPTY_PATCH');
  });

  it('a setup command past worktreeSetupTimeout is ERR_PROVISION naming the timeout; nothing is left', async () => {
    h = await setup({ state, bodies: { 7: 'x' }, config: { worktreeSetupCommand: ['sh', '-c', 'echo x; sleep 30'], worktreeSetupTimeout: 0.5 } });
    const err = await rejection(h.adapter().startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7' }));
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain('worktreeSetupTimeout');
    expect(existsSync(join(h.repo.root, '.worktrees', 'wi-7'))).toBe(false);
    expect(git(h.repo.root, 'branch', '--list', 'wi-7').trim()).toBe('');
  });
});
