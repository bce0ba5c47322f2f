// Issue 27: a session's checkout costs O(1) in the size of the repository. Implementors on one
// commit share one base (checked out once, the setup command run once) and each works in a
// copy-on-write layer over it; Planners and Reviewers read a base of the commit itself
// (src/git/base.rs). Real CLI, real bubblewrap and overlayfs, real git.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured, toolResults } from './support/fake-api.mjs';
import { addon, basesOf, engineState, rejection, setup, sleepMarker } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { agentRuns } from './support/agent-bash.mjs';

import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
const N = 16;
const items = engineState({ workItems: Array.from({ length: N }, (_, i) => ({ id: String(i), title: `Item ${i}`, status: 'open', linkedRevision: null })) });
const bodies = Object.fromEntries(Array.from({ length: N }, (_, i) => [String(i), `Write file-${i}.txt`]));
const implementor = (i, branch = `wi-${i}`) => ({ role: 'implementor', workItemID: String(i), branchName: branch });
const done = structured({ role: 'implementor', outcome: 'completed', summary: 'done' });
/** The work item a request is for (its prompt says "Write file-<n>.txt"). */
const itemOf = (body) => JSON.stringify(body.messages[0]).match(/Write file-(\d+)\.txt/)[1];

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

/** A setup command that counts its runs in `counter` (outside the repository) and installs a file. */
function countingSetup() {
  const dir = mkdtempSyncSafe();
  const counter = join(dir, 'runs');
  return { counter, runs: () => (existsSync(counter) ? readFileSync(counter, 'utf8').split('\n').filter(Boolean).length : 0), command: ['sh', '-c', `echo run >> ${counter} && echo installed > install-state.txt`] };
}

function mkdtempSyncSafe() {
  const dir = join(tmpdir(), `cra-counter-${process.pid}-${Date.now()}-${Math.random().toString(16).slice(2)}`);
  mkdirSync(dir, { recursive: true });
  after.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

describe('one base per commit, made once', () => {
  it(`${N} Implementors racing on a new commit: the setup runs once, each sees its output and commits its own work; a new commit gets a new base and the old one goes`, { timeout: 300_000 }, async () => {
    const setupRun = countingSetup();
    h = await setup({ state: items, bodies, config: { worktreeSetupCommand: setupRun.command } });
    h.api.setScript(
      scenario.steps([
        (body) => bash(`cat install-state.txt && printf '${itemOf(body)}\\n' > file-${itemOf(body)}.txt && git add -A && git commit -q -m "file ${itemOf(body)}" && git status --porcelain && echo committed`),
        done,
      ]),
    );
    const adapter = h.adapter();
    const root = h.repo.root;
    const round = async () => {
      const handles = await Promise.all(Array.from({ length: N }, (_, i) => adapter.startAgent(implementor(i))));
      const results = await Promise.all(handles.map((x) => x.result));
      for (const [i, r] of results.entries()) {
        expect(r.outcome).toBe('completed');
        // Its own file, and not the setup's output (the base's, before the agent ran).
        expect(r.patch.match(/^\+\+\+ .*$/gm)).toEqual([`+++ b/file-${i}.txt`]);
      }
      const outs = h.api.mainBodies().filter((b) => toolResults(b).length).slice(-N).map((b) => toolResults(b)[0].text);
      for (const out of outs) expect(out).toBe('installed\ncommitted');
    };
    await round();
    expect(setupRun.runs()).toBe(1);
    const first = basesOf(root);
    expect(first).toHaveLength(1);
    // The base stays for later sessions on the tip: a second round makes nothing.
    await round();
    expect(setupRun.runs()).toBe(1);
    expect(basesOf(root)).toEqual(first);
    // defaultBranch moves: a new base, made once, and the old one (unused, not the tip) goes.
    git(root, 'commit', '-q', '--allow-empty', '-m', 'upstream');
    await round();
    expect(setupRun.runs()).toBe(2);
    const second = basesOf(root);
    expect(second).toHaveLength(1);
    expect(second).not.toEqual(first);
    expect(readdirSync(join(root, '.worktrees'))).toEqual(second);
    await adapter.shutdown({ keepBases: false });
    expect(existsSync(join(root, '.worktrees')) ? readdirSync(join(root, '.worktrees')) : []).toEqual([]);
    expect(existsSync(join(root, '.git/claude-runtime-adapter'))).toBe(false);
    expect(git(root, 'branch', '--format=%(refname:short)').trim()).toBe('main');
  });

  it('a base in use is kept after defaultBranch moved, and goes when its last session ends', { timeout: 120_000 }, async () => {
    h = await setup({ state: items, bodies });
    const marker = sleepMarker(31);
    h.api.setScript(
      scenario.steps([
        (body) => (itemOf(body) === '0' ? bash(`echo mine > mine.txt && sleep ${marker}`) : bash(`echo x > file-${itemOf(body)}.txt && git status --porcelain`)),
        done,
      ]),
    );
    const adapter = h.adapter();
    const root = h.repo.root;
    const a = await adapter.startAgent(implementor(0));
    for (let i = 0; i < 400 && h.api.mainBodies().length < 1; i++) await new Promise((r) => setTimeout(r, 50));
    const old = basesOf(root);
    expect(old).toHaveLength(1);
    git(root, 'commit', '-q', '--allow-empty', '-m', 'upstream');
    const b = await (await adapter.startAgent(implementor(1))).result;
    expect(b.patch).toContain('+++ b/file-1.txt');
    // The new tip's base, and the old one still under the running session.
    const both = basesOf(root);
    expect(both).toHaveLength(2);
    expect(both).toEqual(expect.arrayContaining(old));
    adapter.cancelAgent(a.sessionID);
    expect((await rejection(a.result)).code).toBe('ERR_CANCELLED');
    const tip = both.filter((n) => !old.includes(n));
    expect(basesOf(root)).toEqual(tip);
    // The tip's base stays for the next process (kept-bases.test.mjs); asked, it goes too.
    await adapter.shutdown();
    expect(basesOf(root)).toEqual(tip);
    await h.adapter().shutdown({ keepBases: false });
    expect(basesOf(root)).toEqual([]);
  });

  it('a setup command that fails in the base: every session waiting for it gets ERR_PROVISION with its output, it ran once, nothing is left', { timeout: 120_000 }, async () => {
    const dir = mkdtempSyncSafe();
    const counter = join(dir, 'runs');
    h = await setup({ state: items, bodies, config: { worktreeSetupCommand: ['sh', '-c', `echo run >> ${counter}; sleep 1; echo installing; echo 'boom: no lockfile' >&2; exit 7`] } });
    const adapter = h.adapter();
    const errors = await Promise.all(Array.from({ length: 4 }, (_, i) => rejection(adapter.startAgent(implementor(i)))));
    for (const e of errors) {
      expect(e.code).toBe('ERR_PROVISION');
      expect(e.message).toContain('exit status 7');
      expect(e.message).toContain('boom: no lockfile');
    }
    expect(readFileSync(counter, 'utf8')).toBe('run\n');
    const root = h.repo.root;
    expect(readdirSync(join(root, '.worktrees'))).toEqual([]);
    expect(existsSync(join(root, '.git/claude-runtime-adapter'))).toBe(false);
    expect(git(root, 'branch', '--format=%(refname:short)').trim()).toBe('main');
    // A later session tries again (the failure is not remembered past the sessions that waited).
    expect((await rejection(adapter.startAgent(implementor(5)))).code).toBe('ERR_PROVISION');
    expect(readFileSync(counter, 'utf8')).toBe('run\nrun\n');
  });

  it('a setup that writes outside its checkout changes nothing a session sees: its files beside the base and in the repository are not visible, its output in the checkout is', { timeout: 120_000 }, async () => {
    h = await setup({
      state: items,
      bodies,
      repo: { agents: agentsWithTools(['Bash', 'Read']) },
      config: { worktreeSetupCommand: ['sh', '-c', 'echo beside > ../setup-beside.txt && echo root > ../../setup-root.txt && echo inside > setup-inside.txt'] },
    });
    const root = h.repo.root;
    after.push(() => rmSync(join(root, '.worktrees', 'setup-beside.txt'), { force: true }));
    h.api.setScript(scenario.steps([bash(`cat setup-inside.txt; cat ../setup-beside.txt ${root}/setup-root.txt 2>&1; echo agent > agent.txt; echo end`), done]));
    const adapter = h.adapter();
    for (const i of [0, 1]) {
      const r = await (await adapter.startAgent(implementor(i))).result;
      const out = toolResults(h.api.mainBodies().at(-1))[0].text;
      expect(out.split('\n')[0]).toBe('inside');
      expect(out).not.toMatch(/^beside$|^root$/m);
      expect(out).toMatch(/No such file or directory/);
      expect(r.patch.match(/^\+\+\+ .*$/gm)).toEqual(['+++ b/agent.txt']);
    }
    // The setup ran once, on the host, as it always has: what it wrote outside is its own.
    expect(readFileSync(join(root, '.worktrees', 'setup-beside.txt'), 'utf8')).toBe('beside\n');
    await adapter.shutdown({ keepBases: false });
    // The adapter removes only what it made: the setup's stray file is left to its owner.
    expect(readdirSync(join(root, '.worktrees'))).toEqual(['setup-beside.txt']);
  });
});

describe('Planners and Reviewers read the base itself', () => {
  it('two Planners at once and a later Reviewer work in the one base of the commit: no copy per session, kept for the next', { timeout: 120_000 }, async () => {
    h = await setup({ repo: { agents: agentsWithTools(['Bash', 'Read']) }, state: ROLE_STATE, bodies: ROLE_BODIES });
    const root = h.repo.root;
    const adapter = h.adapter();
    const cwdOf = async (role) => {
      h.api.setScript(scenario.steps([bash('pwd; git log --format=%s -1'), ROLES[role].done]));
      const handle = await adapter.startAgent(ROLES[role].params());
      await handle.result;
    };
    await Promise.all([cwdOf('planner'), cwdOf('planner')]);
    await cwdOf('reviewer');
    const seen = h.api.mainBodies().filter((b) => toolResults(b).length).map((b) => toolResults(b)[0].text);
    expect(seen).toHaveLength(3);
    const bases = basesOf(root);
    expect(bases).toHaveLength(1);
    for (const out of seen) expect(out).toBe(`${join(root, '.worktrees', bases[0])}\ninitial commit`);
    await adapter.shutdown();
    expect(basesOf(root)).toEqual(bases);
  });
});

describe("a layered checkout's patch is the full clone's, byte for byte", () => {
  const RUNS = 20;
  const files = {
    'src/index.js': 'export const answer = 42;\n',
    'src/edit.txt': 'one\n',
    'src/gone.txt': 'gone\n',
    'src/keep.txt': 'keep\n',
    'src/rename-me.txt': 'a file long enough for git to see a rename of it\n'.repeat(4),
    'bin/blob.bin': Buffer.from([0, 1, 2, 3, 255, 254, 0, 10, 13, 0]),
    'tool.sh': '#!/bin/sh\necho tool\n',
    'unstaged-gone.txt': 'bye\n',
  };
  // Every patch case: committed, staged, unstaged, untracked, deletions (staged and not), a
  // rename, a mode change, a symlink, binary content, non-UTF-8 content and name, and the
  // same-size rewrite in the second of the checkout.
  const commands = [
    "printf 'export const answer = 43;\\n' > src/index.js",
    'echo committed >> src/edit.txt && git commit -q -am "agent commit"',
    'git mv src/rename-me.txt src/renamed.txt && git rm -q src/gone.txt && rm unstaged-gone.txt',
    'chmod +x tool.sh && ln -s src/keep.txt link-to-keep',
    "printf '\\000\\377\\020\\200' >> bin/blob.bin && printf 'caf\\351\\n' > latin1.txt && printf 'x\\n' > \"$(printf 'n\\377me.txt')\"",
    'echo staged > staged.txt && git add staged.txt && echo untracked > notes.md && echo done',
  ];

  it(`${RUNS} sessions, alternating layered and full clone: every patch is the same, holds every case, and applies on the base`, { timeout: RUNS * 30_000 }, async () => {
    h = await setup({ repo: { files }, state: items, bodies });
    h.api.setScript(scenario.steps([...commands.map((c) => bash(c)), done]));
    const layered = h.adapter();
    const clone = addon.createClaudeAdapter({ ...h.config, sharedBase: false }, h.deps);
    const patches = [];
    for (let run = 0; run < RUNS; run += 1) {
      const adapter = run % 2 ? clone : layered;
      await new Promise((r) => setTimeout(r, 1005 - (Date.now() % 1000)));
      const r = await (await adapter.startAgent(implementor(0, `same-${run}`))).result;
      expect(r.outcome, `run ${run}`).toBe('completed');
      patches.push(r.patch);
    }
    for (const [run, p] of patches.entries()) expect(p, `run ${run} (${run % 2 ? 'clone' : 'layered'})`).toBe(patches[1]);
    const p = patches[0];
    for (const f of ['src/index.js', 'src/edit.txt', 'src/renamed.txt', 'tool.sh', 'link-to-keep', 'bin/blob.bin', 'latin1.txt', 'staged.txt', 'notes.md']) expect(p).toContain(f);
    expect(p).toContain('-export const answer = 42;\n+export const answer = 43;\n');
    expect(p).toContain('deleted file mode 100644');
    expect(p).toContain('rename from src/rename-me.txt');
    expect(p).toContain('new mode 100755');
    expect(p).toContain('new file mode 120000');
    expect(p).toContain('GIT binary patch');
    const applied = mkdtempSyncSafe();
    git(applied, 'clone', '-q', h.repo.root, 'c');
    execFileSync('git', ['apply', '--index', '-'], { cwd: join(applied, 'c'), input: p });
    expect(readFileSync(join(applied, 'c', 'src/index.js'), 'utf8')).toBe('export const answer = 43;\n');
    await layered.shutdown();
    await clone.shutdown();
  });
});

describe('where no overlay can be mounted, a full clone', () => {
  it("a repository whose path overlayfs cannot take (a ','): Implementors get full clones, the log says once why, the work is the same", { timeout: 120_000 }, async () => {
    h = await setup({ state: items, bodies });
    const root = join(mkdtempSyncSafe(), 'repo,with,commas');
    execFileSync('cp', ['-a', h.repo.root, root]);
    h.api.setScript(scenario.steps([bash('test -d .git && echo clone; grep -c " overlay " /proc/self/mountinfo; echo work > work.txt'), done]));
    const adapter = addon.createClaudeAdapter({ ...h.config, repoRoot: root }, h.deps);
    for (const i of [0, 1]) {
      const r = await (await adapter.startAgent(implementor(i))).result;
      expect(r.patch.match(/^\+\+\+ .*$/gm)).toEqual(['+++ b/work.txt']);
      expect(toolResults(h.api.mainBodies().at(-1))[0].text).toBe('clone\n0');
    }
    const why = h.logger.entries.filter((e) => e.message.includes('Implementors get full clones'));
    expect(why).toHaveLength(1);
    expect(why[0].level).toBe('warn');
    expect(why[0].data.reason).toContain("character overlayfs options cannot carry (',' ':' '\\')");
    await adapter.shutdown();
    expect(readdirSync(join(root, '.worktrees'))).toEqual([]);
  });
});

describe("an agent's ordinary file work in a layered checkout", () => {
  it('removing a directory of the base, moving one, and making a directory where a file of the base was all work, and the patch holds each change', { timeout: 120_000 }, async () => {
    h = await setup({
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      repo: { agents: agentsWithTools(['Bash']), files: { 'src/a.txt': 'a\n', 'src/deep/b.txt': 'b\n', 'lib/c.txt': 'c\n', 'e.txt': 'e\n' } },
    });
    const { result, out } = await agentRuns(h, 'implementor', ['rm -rf src && mv lib lib2 && rm e.txt && mkdir e.txt && echo new > e.txt/f && ls && echo ok']);
    expect(out[0]).toMatch(/ok\n?$/);
    expect(out[0]).not.toMatch(/Input\/output error|cannot/);
    const files = (re) => [...result.patch.matchAll(re)].map((m) => m[1]).sort();
    expect(files(/^deleted file mode \d+\n(?:index .*\n)?--- a\/(\S+)/gm)).toEqual(['e.txt', 'src/a.txt', 'src/deep/b.txt']);
    expect(result.patch).toMatch(/rename from lib\/c\.txt\nrename to lib2\/c\.txt/);
    expect(result.patch).toContain('+++ b/e.txt/f');
  });
});
