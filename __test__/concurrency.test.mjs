// Many sessions at once on one repository, each in its own sandbox (issue 14): real CLI, real
// bubblewrap, every agent committing with `git add -A && git commit` as agents do. Before the
// whole-session sandbox, per-file mounts into the shared .git raced other sessions' git and
// 1–3 of 8 sessions lost their work in most runs; so this runs several rounds.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured } from './support/fake-api.mjs';
import { basesOf, engineState, setup, SHARED_BASE } from './support/harness.mjs';

const N = 16;
const ROUNDS = 3;
const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
const items = engineState({ workItems: Array.from({ length: N }, (_, i) => ({ id: String(i), title: `Item ${i}`, status: 'open', linkedRevision: null })) });
const bodies = Object.fromEntries(Array.from({ length: N }, (_, i) => [String(i), `Write file-${i}.txt`]));

/** Each session's model commits the file its work item names, then answers. */
const script = scenario.steps([
  (body) => {
    const n = JSON.stringify(body.messages[0]).match(/Write file-(\d+)\.txt/)[1];
    return bash(`printf '${n}\\n' > file-${n}.txt && git add -A && git commit -q -m "file ${n}" && git status --porcelain && echo committed-${n}`);
  },
  structured({ role: 'implementor', outcome: 'completed', summary: 'done' }),
]);

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

describe(`${N} Implementors at once on one repository`, () => {
  it(`each of ${N} resolves with its own patch, no sandbox fails to start, nothing is left; ${ROUNDS} rounds`, { timeout: 300_000 }, async () => {
    h = await setup({ script, state: items, bodies });
    const adapter = h.adapter();
    const root = h.repo.root;
    const before = git(root, 'status', '--porcelain', '--ignored');
    let firstBases;
    for (let round = 0; round < ROUNDS; round++) {
      const t0 = Date.now();
      const handles = await Promise.all(Array.from({ length: N }, (_, i) => adapter.startAgent({ role: 'implementor', workItemID: String(i), branchName: `wi-${i}` })));
      const results = await Promise.allSettled(handles.map((x) => x.result));
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
