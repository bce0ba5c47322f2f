import { BaseSequencer } from 'vitest/node';
import { configDefaults, defineConfig } from 'vitest/config';

// The files that run longest, in seconds as measured on 2 cores (a fresh clone's `npm test`,
// 2026-11-26). Vitest starts the files it has no timing of yet by size, largest first, which on
// a fresh machine (CI) left the longest of all — racy-edit, small but 190 s of sessions one
// after another — to start last, on one fork, for three minutes, while the other fork idled.
// Longest first packs the two forks; files not named here follow in vitest's own order.
const MEASURED = {
  'racy-edit.test.mjs': 110,
  'shared-base.test.mjs': 115,
  'api-outage.test.mjs': 85,
  'types.test.mjs': 60,
  'session.test.mjs': 50,
  'providers.test.mjs': 50,
  'concurrency.test.mjs': 45,
  'sandbox.test.mjs': 45,
  'engine-dropin.test.mjs': 43,
  'fake-api.test.mjs': 30,
};
const measured = (spec) => MEASURED[spec.moduleId.split('/').at(-1)] ?? 0;

class LongestFirst extends BaseSequencer {
  async sort(files) {
    const byVitest = await super.sort(files);
    return byVitest.map((spec, i) => ({ spec, i })).sort((a, b) => measured(b.spec) - measured(a.spec) || a.i - b.i).map(({ spec }) => spec);
  }
}

// Implementors' checkouts are copy-on-write layers by default; where no overlay can be mounted
// the adapter makes full clones instead. The `clones` project runs the suites that touch the
// checkout again with full clones (CRA_TEST_SHARED_BASE=0), in the same run as the rest so
// that both share the two forks (`npm run test:clones` runs it alone).
const CLONE_SUITES = ['worktree', 'racy-edit', 'sandbox', 'extraction', 'never-destroy', 'concurrency', 'file-tools'];

export default defineConfig({
  test: {
    // The cluster suite needs a cluster and an image: `npm run test:kube` (vitest.kube.config.mjs).
    exclude: [...configDefaults.exclude, '__test__/kube/**'],
    // Sessions run the real CLI (~0.5 s each, ~230 MB): keep concurrency to the two cores.
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    sequence: { sequencer: LongestFirst },
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      { extends: true, test: { name: 'layers', include: ['__test__/**/*.test.{mjs,ts}'] } },
      {
        extends: true,
        test: {
          name: 'clones',
          include: CLONE_SUITES.map((s) => `__test__/${s}.test.mjs`),
          env: { CRA_TEST_SHARED_BASE: '0' },
        },
      },
    ],
  },
});
