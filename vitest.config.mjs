import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['__test__/**/*.test.{mjs,ts}'],
    // Sessions run the real CLI (~0.5 s each, ~230 MB): keep concurrency to the two cores.
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
