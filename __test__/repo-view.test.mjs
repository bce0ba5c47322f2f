// A Planner or Reviewer works in a view of the repository (issue 19, item 4): the default
// branch's tracked content and history, read-only — not the repository directory, which holds a
// token in `remote.origin.url`, the `http.<url>.extraheader` a CI checkout writes, ignored
// `.env` files and every Implementor's clone. Tried through the addon with the real CLI: each
// probe is the agent's own Bash or Read (scripted through the fake Messages API; what it printed
// is read back from the tool results the CLI sends the model). The test's validator hook
// approves everything, so only the view and the sandbox stand between the agent and the secrets.
// Repositories live under /var/tmp: inside the sandbox /tmp is the session's own tmpfs.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-sandbox-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { scenario, toolResults, toolUse } from './support/fake-api.mjs';
import { agentRuns, unsandboxed as bash } from './support/agent-bash.mjs';
import { basesOf, rejection, setup, sleepMarker } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

const read = (path) => toolUse('Read', { file_path: path });

const ORIGIN_TOKEN = 'ghp_ORIGINTOKEN0123456789';
const HEADER_TOKEN = 'EXTRAHEADERTOKEN0123456789';
const DOTENV_SECRET = 'DOTENVSECRET0123456789';
const CLONE_WORK = 'IMPLEMENTORWORK0123456789';
const SECRETS = [ORIGIN_TOKEN, HEADER_TOKEN, DOTENV_SECRET, CLONE_WORK];

/**
 * An adapter on a repository as a CI checkout and a busy engine leave it: a token in the origin
 * URL, a token in an extraheader, an ignored `.env` with a secret, an Implementor's clone with
 * its work under `.worktrees/`, and the engine's checkout on another branch with an uncommitted
 * change. `main` has two commits and `tracked.txt` says `main content`.
 */
async function repoWithSecrets(config = {}) {
  h = await setup({ repo: { agents: agentsWithTools(['Bash', 'Read', 'Glob', 'Grep']) }, state: ROLE_STATE, bodies: ROLE_BODIES, config });
  const root = h.repo.root;
  writeFileSync(join(root, 'tracked.txt'), 'main content\n');
  writeFileSync(join(root, '.gitignore'), '.env\n');
  git(root, 'add', '-A');
  git(root, 'commit', '-q', '-m', 'add tracked file');
  git(root, 'remote', 'add', 'origin', `https://x-access-token:${ORIGIN_TOKEN}@github.com/o/r.git`);
  git(root, 'config', 'http.https://github.com/.extraheader', `AUTHORIZATION: basic ${HEADER_TOKEN}`);
  writeFileSync(join(root, '.env'), `API_SECRET=${DOTENV_SECRET}\n`);
  git(root, 'clone', '-q', '--shared', root, join(root, '.worktrees/wi-9'));
  writeFileSync(join(root, '.worktrees/wi-9/work.txt'), `${CLONE_WORK}\n`);
  git(root, 'checkout', '-q', '-b', 'other');
  writeFileSync(join(root, 'tracked.txt'), 'other branch\n');
  git(root, 'commit', '-q', '-am', 'other branch commit');
  writeFileSync(join(root, 'tracked.txt'), 'uncommitted\n');
  return root;
}

/** One session of `role` whose model takes each step in turn (see agentRuns). */
const run = (role, steps, adapter = h.adapter()) => agentRuns(h, role, steps, { adapter });

/** The first tool result's text in the request the step answers (the agent's `pwd`). */
const cwdSeen = (body) => toolResults(body)[0].text.trim();

/**
 * What the adapter keeps in the repository for a session once it is over: the view of the tip,
 * for the next session (src/git/base.rs), until `shutdown({ keepBases: false })`; then nothing
 * (the default keeps it for the next process: kept-bases.test.mjs).
 */
async function leftovers(adapter, root, kept = 1) {
  expect(basesOf(root)).toHaveLength(kept);
  await adapter.shutdown({ keepBases: false });
  return {
    worktrees: readdirSync(join(root, '.worktrees')).sort(),
    records: existsSync(join(root, '.git/claude-runtime-adapter')),
  };
}

/** The engine's checkout as `repoWithSecrets` left it. */
function engineCheckoutUntouched(root) {
  expect(git(root, 'branch', '--show-current').trim()).toBe('other');
  expect(readFileSync(join(root, 'tracked.txt'), 'utf8')).toBe('uncommitted\n');
  expect(readFileSync(join(root, '.env'), 'utf8')).toContain(DOTENV_SECRET);
}

describe("Planner and Reviewer: the default branch's content and history, none of the repository's credentials", () => {
  for (const role of ['planner', 'reviewer']) {
    it(`${role}: .git/config, git config, the ignored .env and another session's clone are unreadable, by relative and absolute path, with Bash and Read; git log/show/grep/diff, cat and Read of a tracked file give main's content although the engine's checkout is elsewhere`, async () => {
      const root = await repoWithSecrets();
      const adapter = h.adapter();
      const { out, results } = await run(role, [
        'pwd',
        'cat .git/config',
        'git config --list',
        'cat .env; ls -a',
        `ls -a .worktrees; ls -a ${root}/.worktrees; cat ${root}/.worktrees/wi-9/work.txt`,
        `cat ${root}/.git/config; cat ${root}/.env`,
        'git log --format=%s',
        'cat tracked.txt',
        'git show HEAD:tracked.txt && git grep -c "main content" && git diff --stat HEAD~1 HEAD && git status --porcelain && echo clean',
        (body) => read(`${cwdSeen(body)}/tracked.txt`),
        read(`${root}/.git/config`),
        read(`${root}/.env`),
        read(`${root}/.worktrees/wi-9/work.txt`),
      ], adapter);
      const all = out.join('\n');
      for (const secret of SECRETS) expect(all).not.toContain(secret);
      expect(out[0]).not.toBe(root);
      expect(out[2]).not.toMatch(/remote\.origin|extraheader/);
      expect(out[3].split('\n')).not.toContain('.env');
      expect(out[6].split('\n')).toEqual(['add tracked file', 'initial commit']);
      expect(out[7]).toBe('main content');
      for (const i of [6, 7, 8, 9]) expect(results[i].is_error, `step ${i}: ${out[i]}`).toBe(false);
      expect(out[8]).toMatch(/^main content\ntracked\.txt:1\n.*tracked\.txt/s);
      expect(out[8]).toMatch(/\nclean$/);
      expect(out[9]).toContain('main content');
      for (const i of [10, 11, 12]) expect(results[i].is_error, `step ${i}: ${out[i]}`).toBe(true);
      expect(await leftovers(adapter, root)).toEqual({ worktrees: ['wi-9'], records: false });
      engineCheckoutUntouched(root);
    });
  }

  it('the view is read-only: a write, a commit and a ref in it all fail', async () => {
    const root = await repoWithSecrets();
    const adapter = h.adapter();
    const { results, out } = await run('planner', [
      'echo x >> tracked.txt',
      'git commit -q --allow-empty -m sneaky',
      'git branch agent-p',
      'git log --format=%s -1',
    ], adapter);
    for (const i of [0, 1, 2]) expect(results[i].is_error, `step ${i}: ${out[i]}`).toBe(true);
    expect(out[3]).toBe('add tracked file');
    expect(await leftovers(adapter, root)).toEqual({ worktrees: ['wi-9'], records: false });
  });

  it('a cancelled Reviewer: its view held none of the secrets, and nothing of it remains', async () => {
    const root = await repoWithSecrets();
    const marker = sleepMarker(33);
    h.api.setScript(scenario.steps([bash('pwd; cat .env .git/config; git config --list'), bash(`echo waiting; sleep ${marker}`), ROLES.reviewer.done]));
    const adapter = h.adapter();
    const handle = await adapter.startAgent(ROLES.reviewer.params());
    for (let i = 0; i < 400 && h.api.mainBodies().length < 2; i++) await new Promise((r) => setTimeout(r, 50));
    const seen = toolResults(h.api.mainBodies().at(-1))[0].text;
    const cwd = seen.split('\n')[0];
    expect(existsSync(join(cwd, 'tracked.txt'))).toBe(true);
    adapter.cancelAgent(handle.sessionID);
    expect((await rejection(handle.result)).code).toBe('ERR_CANCELLED');
    for (const secret of SECRETS) expect(seen).not.toContain(secret);
    expect(await leftovers(adapter, root)).toEqual({ worktrees: ['wi-9'], records: false });
    expect(existsSync(cwd)).toBe(false);
    engineCheckoutUntouched(root);
  });

  it('sandbox: false: the Planner still works in the view (cwd), so its relative reads find main and no secret', async () => {
    const root = await repoWithSecrets({ sandbox: false });
    const adapter = h.adapter();
    const { out } = await run('planner', ['pwd', 'cat .env .git/config; git config --list; ls -a .worktrees', 'cat tracked.txt'], adapter);
    const all = out.join('\n');
    for (const secret of SECRETS) expect(all).not.toContain(secret);
    expect(out[0]).not.toBe(root);
    expect(out[2]).toBe('main content');
    expect(existsSync(out[0])).toBe(false);
    // Unsandboxed, each session has a view of its own, gone with it.
    expect(await leftovers(adapter, root, 0)).toEqual({ worktrees: ['wi-9'], records: false });
  });
});
