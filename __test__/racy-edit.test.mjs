// Issue 26: an Implementor rewrites a tracked file with content of the same size, through its
// own Bash, Write and Edit tools in the real CLI, and ends `completed`. The edit is its work:
// every run must resolve with a patch holding it (it was lost as ERR_EMPTY_PATCH, with the
// checkout removed, 3 times in 20). Each case runs RACY_RUNS times, sessions started at the
// start of a second so that checkout and edit share it.
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { scenario } from './support/fake-api.mjs';
import { setup } from './support/harness.mjs';
import { atTheStartOfASecond, RACY_CASES, RACY_CHANGE, RACY_REPO, RACY_RUNS } from './support/racy-edits.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
beforeAll(async () => {
  h = await setup({ repo: RACY_REPO, state: ROLE_STATE, bodies: ROLE_BODIES });
});
afterAll(async () => h?.cleanup());

describe('a same-size edit is the agent\'s work, every time', () => {
  let n = 0;
  for (const [name, calls] of Object.entries(RACY_CASES)) {
    it(`${name}: ${RACY_RUNS} of ${RACY_RUNS} sessions resolve completed with the edit in the patch`, { timeout: RACY_RUNS * 30_000 }, async () => {
      const adapter = h.adapter();
      const lost = [];
      for (let run = 0; run < RACY_RUNS; run += 1) {
        const branch = `racy-${(n += 1)}`;
        const cwd = join(h.repo.root, '.worktrees', branch);
        h.api.setScript(scenario.steps([...calls(cwd), ROLES.implementor.done]));
        await atTheStartOfASecond();
        const handle = await adapter.startAgent(ROLES.implementor.params(branch));
        try {
          const result = await handle.result;
          expect(result.outcome).toBe('completed');
          expect(result.patch.match(/^\+\+\+ /gm)).toHaveLength(1);
          if (!result.patch.includes(RACY_CHANGE)) lost.push(`run ${run}: ${result.patch}`);
        } catch (e) {
          lost.push(`run ${run}: ${e.code} ${e.message}`);
        }
      }
      expect(lost).toEqual([]);
    });
  }
});
