import { configDefaults, defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['__test__/**/*.test.{mjs,ts}'],
    // The cluster suite needs a cluster and an image: `npm run test:kube` (vitest.kube.config.mjs).
    exclude: [...configDefaults.exclude, '__test__/kube/**'],
    // Sessions run the real CLI (~0.5 s each, ~230 MB): keep concurrency to the two cores.
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
