// `npm run test:kube`: the Kubernetes backend's suite against a real cluster. Needs KUBECONFIG
// (or kubectl's default config) and CRA_KUBE_IMAGE (the session image, already on the nodes or
// pullable); scripts/kube-ci.sh sets both up on the local test cluster.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['__test__/kube/**/*.test.{mjs,ts}'],
    // Pods run on the cluster's nodes, but on this machine the nodes share the two cores.
    pool: 'forks',
    // One file at a time: the suites count the namespace's adapter pods, and 16 sessions at once
    // is meant to have the cluster to itself.
    fileParallelism: false,
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    // Pod creation, image unpacking and scheduling add to every test's time.
    testTimeout: 180_000,
    hookTimeout: 180_000,
  },
});
