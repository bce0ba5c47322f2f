// The Kubernetes suite's wiring: the cluster and the session image come from the environment
// (`KUBECONFIG`, `CRA_KUBE_IMAGE`; `CRA_KUBE_NAMESPACE` default `default`,
// `CRA_KUBE_PULL_POLICY` default `IfNotPresent`), so the suite runs against kind, k3d or any
// cluster as well as the local one `.ci/run` brings up. Pods are read with `kubectl`.
import { execFileSync } from 'node:child_process';

export const IMAGE = process.env.CRA_KUBE_IMAGE;
export const NAMESPACE = process.env.CRA_KUBE_NAMESPACE ?? 'default';
const PULL = process.env.CRA_KUBE_PULL_POLICY ?? 'IfNotPresent';

if (!process.env.KUBECONFIG || !IMAGE) {
  throw new Error('the Kubernetes suite needs KUBECONFIG and CRA_KUBE_IMAGE (see docs/contributing.md: the Kubernetes suite)');
}

// CRA_KUBE_SESSION_IMAGE: run the sessions in that image instead (a user's image, the runtime
// copied in from CRA_KUBE_IMAGE): kube-ci.sh runs the boundary and lifecycle cases again so.
const SESSION_IMAGE = process.env.CRA_KUBE_SESSION_IMAGE;
// CRA_KUBE_NODE_CACHE (with CRA_KUBE_SESSION_IMAGE): those sessions' runtime kept once per node
// there (`nodeCache`, a directory on the nodes writable by uid 1000) instead of copied per pod.
const NODE_CACHE = process.env.CRA_KUBE_NODE_CACHE;

/** `backend` of an adapter config for the cluster under test, with `extra` fields merged in. */
export const kubeBackend = (extra = {}) => ({
  kubernetes: {
    namespace: NAMESPACE,
    image: SESSION_IMAGE ?? IMAGE,
    ...(SESSION_IMAGE ? { runtimeImage: IMAGE, ...(NODE_CACHE ? { nodeCache: NODE_CACHE } : {}) } : {}),
    imagePullPolicy: PULL,
    kubeconfig: process.env.KUBECONFIG,
    ...extra,
  },
});

export const MANAGED = 'app.kubernetes.io/managed-by=claude-runtime-adapter';

export function kubectl(...args) {
  return execFileSync('kubectl', ['-n', NAMESPACE, ...args], { stdio: ['ignore', 'pipe', 'pipe'], timeout: 30_000 }).toString();
}

/** The adapter's pods in the namespace (optionally those of one session id). */
export function adapterPods(sessionID) {
  const items = JSON.parse(kubectl('get', 'pods', '-l', MANAGED, '-o', 'json')).items;
  return sessionID === undefined ? items : items.filter((p) => p.metadata.annotations?.['claude-runtime-adapter/session-id'] === sessionID);
}

/** Resolves once `pred()` holds; fails after `ms`. */
export async function eventually(pred, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The `[sandbox]` line of a transcript: which pod on which node the session ran in. */
export function podLine(transcript) {
  return transcript.split('\n').find((l) => l.includes('Kubernetes pod')) ?? '';
}
