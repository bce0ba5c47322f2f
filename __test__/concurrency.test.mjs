// Many sessions at once on one repository, each in its own sandbox (issue 14): real CLI, real
// bubblewrap, every agent committing with `git add -A && git commit` as agents do. Before the
// whole-session sandbox, per-file mounts into the shared .git raced other sessions' git and
// 1–3 of 8 sessions lost their work in most runs; so this runs several rounds.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured } from './support/fake-api.mjs';
import { basesOf, engineState, setup, SHARED_BASE, sleepMarker } from './support/harness.mjs';

const N = 16;
const ROUNDS = 3;
const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
const items = engineState({ workItems: Array.from({ length: N }, (_, i) => ({ id: String(i), title: `Item ${i}`, status: 'open', linkedRevision: null })) });
const bodies = Object.fromEntries(Array.from({ length: N }, (_, i) => [String(i), `Write file-${i}.txt`]));

/** A number no other process has on its command line; session `n`'s background command is `sleep <MARK><n>`. */
const MARK = sleepMarker(600);

/** Each session's model commits the file its work item names (leaving a command running in the background, detached), then answers. */
const script = scenario.steps([
  (body) => {
    const n = JSON.stringify(body.messages[0]).match(/Write file-(\d+)\.txt/)[1];
    return bash(`printf '${n}\\n' > file-${n}.txt && git add -A && git commit -q -m "file ${n}" && git status --porcelain && (setsid sleep ${MARK}${n} >/dev/null 2>&1 &) && echo committed-${n}`);
  },
  structured({ role: 'implementor', outcome: 'completed', summary: 'done' }),
]);

/** Live processes (not zombies) whose command line contains `text`. */
function processesWith(text) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      if (!cmdline.includes(text) || readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] === 'Z') continue;
      found.push(`${pid}: ${cmdline.slice(0, 120)}`);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

describe(`${N} Implementors at once on one repository`, () => {
  it(`each of ${N} resolves with its own patch, no sandbox fails to start, nothing is left (no process of a session once its result settles); ${ROUNDS} rounds`, { timeout: 300_000 }, async () => {
    // Ordinary work under a generous disk bound (issue 52): the watch of 16 sessions at once stops none.
    h = await setup({ script, state: items, bodies, config: { sandbox: { limits: { diskMiB: 1024 } } } });
    const adapter = h.adapter();
    const root = h.repo.root;
    const before = git(root, 'status', '--porcelain', '--ignored');
    let firstBases;
    for (let round = 0; round < ROUNDS; round++) {
      const t0 = Date.now();
      const handles = await Promise.all(Array.from({ length: N }, (_, i) => adapter.startAgent({ role: 'implementor', workItemID: String(i), branchName: `wi-${i}` })));
      // At the moment each result settles, its CLI and its sandbox are gone (their argv names
      // the session); what the agent detached into a session of its own is gone once all are.
      const leftAtSettle = [];
      const results = await Promise.allSettled(
        handles.map((x) =>
          x.result.finally(() => {
            leftAtSettle.push(...processesWith(`--session-id=${x.sessionID}`));
          }),
        ),
      );
      expect(leftAtSettle, `round ${round}`).toEqual([]);
      for (let i = 0; i < N; i++) expect(processesWith(`sleep ${MARK}${i}`), `round ${round} session ${i}`).toEqual([]);
      const failures = results.flatMap((r, i) => (r.status === 'rejected' ? [`${i}: ${r.reason.message}`] : []));
      expect(failures, `round ${round}`).toEqual([]);
      for (const [i, r] of results.entries()) {
        const patch = r.value.patch;
        expect(patch, `round ${round} session ${i}`).toContain(`+++ b/file-${i}.txt`);
        expect(patch.match(/^\+\+\+ /gm)).toHaveLength(1);
      }
      console.log(`[measure] round ${round}: ${N} implementors, start → all results in ${Date.now() - t0} ms`);
      // Every round on the same commit shares one base, made once and kept while it is the tip.
      const bases = basesOf(root);
      expect(bases).toHaveLength(SHARED_BASE ? 1 : 0);
      if (round === 0) firstBases = bases;
      expect(bases).toEqual(firstBases);
      expect(readdirSync(join(root, '.worktrees'))).toEqual(bases);
      expect(existsSync(join(root, '.git/claude-runtime-adapter'))).toBe(SHARED_BASE);
      expect(git(root, 'branch', '--format=%(refname:short)').trim()).toBe('main');
      // (`.worktrees/`, where the kept base is, is in the repository's info/exclude.)
      expect(git(root, 'status', '--porcelain', '--ignored')).toBe(SHARED_BASE ? `${before}!! .worktrees/\n` : before);
      expect(adapter.sessions()).toEqual([]);
    }
    // Without the tip's base, which the default keeps for the next process (kept-bases.test.mjs).
    await adapter.shutdown({ keepBases: false });
    expect(git(root, 'status', '--porcelain', '--ignored')).toBe(before);
    expect(readdirSync(join(root, '.worktrees'))).toEqual([]);
    expect(existsSync(join(root, '.git/claude-runtime-adapter'))).toBe(false);
  });
});
