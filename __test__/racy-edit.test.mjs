// Issue 26: an Implementor rewrites a tracked file with content of the same size, through its
// own Bash, Write and Edit tools in the real CLI, and ends `completed`. The edit is its work:
// every run must resolve with a patch holding it (it was lost as ERR_EMPTY_PATCH, with the
// checkout removed, 3 times in 20). RACY_AT_ONCE sessions at a time, each started at the start
// of a second so that checkout and edit may share it; one case shares it for sure and runs 20
// times, the others 5 (20 in `npm run test:loops`; support/racy-edits.mjs says why).
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { scenario } from './support/fake-api.mjs';
import { setup } from './support/harness.mjs';
import { atTheStartOfASecond, pooled, racyCases, RACY_CHANGE, RACY_REPO } from './support/racy-edits.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

// Sessions side by side: they wait on the CLI's start and the second's start much of their
// time, and every run is its own branch and checkout, as the engine's would be.
const RACY_AT_ONCE = 3;

let h;
beforeAll(async () => {
  h = await setup({ repo: RACY_REPO, state: ROLE_STATE, bodies: ROLE_BODIES });
});
afterAll(async () => h?.cleanup());

describe('a same-size edit is the agent\'s work, every time', () => {
  let n = 0;
  for (const [name, calls, runs] of racyCases()) {
    it(`${name}: ${runs} of ${runs} sessions resolve completed with the edit in the patch`, { timeout: 60_000 + runs * 30_000 }, async () => {
      const adapter = h.adapter();
      const worktrees = join(h.repo.root, '.worktrees');
      // The file tools take absolute paths: each request's own checkout, read from what the CLI
      // tells the model of its working directory (the first checkout path the request names).
      h.api.setScript((body) => {
        const branch = JSON.stringify(body).match(/\.worktrees\/(racy-\d+)/)?.[1];
        if (!branch) throw new Error('racy-edit: the request names no checkout of this suite');
        return scenario.steps([...calls(join(worktrees, branch)), ROLES.implementor.done])(body);
      });
      const lost = [];
      await pooled(runs, RACY_AT_ONCE, async (run) => {
        const branch = `racy-${(n += 1)}`;
        await atTheStartOfASecond();
        try {
          const handle = await adapter.startAgent(ROLES.implementor.params(branch));
          const result = await handle.result;
          expect(result.outcome).toBe('completed');
          expect(result.patch.match(/^\+\+\+ /gm)).toHaveLength(1);
          if (!result.patch.includes(RACY_CHANGE)) lost.push(`run ${run}: ${result.patch}`);
        } catch (e) {
          lost.push(`run ${run}: ${e.code ?? ''} ${e.message}`);
        }
      });
      expect(lost).toEqual([]);
    });
  }
});
