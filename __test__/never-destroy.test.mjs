// Issue 10: the adapter never destroys what it did not make. The sweep that runs when an adapter
// is created removes only worktrees carrying this adapter's owner record whose process is gone
// (saving their work first); a person's worktree under .worktrees/ is never touched.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { addon, engineState, setup } from './support/harness.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd }).toString();

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/** A worktree at .worktrees/<name> whose owner record names a process that has exited. */
function deadSessionWorktree(root, name) {
  git(root, 'worktree', 'add', '-q', '--lock', '-b', name, join('.worktrees', name), 'main');
  const pid = Number(execFileSync('sh', ['-c', 'sh -c "echo \\$\\$"']).toString().trim());
  const host = execFileSync('hostname').toString().trim();
  const admin = readFileSync(join(root, '.worktrees', name, '.git'), 'utf8').trim().replace(/^gitdir: /, '');
  writeFileSync(join(admin, 'locked'), `claude-runtime-adapter owner pid=${pid} start=1 host=${host}\n`);
}

/** The sweep may run in the background: wait (bounded) until it has removed `path`. */
async function sweptAway(path) {
  for (let i = 0; i < 250 && existsSync(path); i++) await new Promise((r) => setTimeout(r, 20));
  return !existsSync(path);
}

describe('the sweep never destroys what the adapter did not make', () => {
  it("a person's worktree with an uncommitted file survives createClaudeAdapter; a dead session's beside it is saved and swept", async () => {
    h = await setup({ state: engineState({ workItems: [] }), bodies: {} });
    const root = h.repo.root;
    git(root, 'worktree', 'add', '-q', '.worktrees/my-work', '-b', 'manual');
    writeFileSync(join(root, '.worktrees', 'my-work', 'draft.md'), 'mine\n');
    deadSessionWorktree(root, 'crashed');
    writeFileSync(join(root, '.worktrees', 'crashed', 'unsaved.txt'), 'agent work\n');

    addon.createClaudeAdapter(h.config, h.deps);

    expect(await sweptAway(join(root, '.worktrees', 'crashed'))).toBe(true);
    expect(readFileSync(join(root, '.worktrees', 'my-work', 'draft.md'), 'utf8')).toBe('mine\n');
    expect(git(root, 'branch', '--format=%(refname:short)').trim().split('\n')).toEqual(['main', 'manual']);
    const salvaged = join(root, '.git', 'claude-runtime-adapter', 'salvaged');
    const saved = readdirSync(salvaged);
    expect(saved).toHaveLength(1);
    expect(readFileSync(join(salvaged, saved[0]), 'utf8')).toContain('unsaved.txt');
  });
});
