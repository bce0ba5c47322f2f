// The Kubernetes suite's wiring: the cluster and the session image come from the environment
// (`KUBECONFIG`, `CRA_KUBE_IMAGE`; `CRA_KUBE_NAMESPACE` default `default`,
// `CRA_KUBE_PULL_POLICY` default `IfNotPresent`), so the suite runs against kind, k3d or any
// cluster as well as the local one `.ci/run` brings up. Pods are read with `kubectl`.
import { execFileSync } from 'node:child_process';
import { dirname } from 'node:path';

export const IMAGE = process.env.CRA_KUBE_IMAGE;
export const NAMESPACE = process.env.CRA_KUBE_NAMESPACE ?? 'default';
const PULL = process.env.CRA_KUBE_PULL_POLICY ?? 'IfNotPresent';

if (!process.env.KUBECONFIG || !IMAGE) {
  throw new Error('the Kubernetes suite needs KUBECONFIG and CRA_KUBE_IMAGE (see docs/contributing.md: the Kubernetes suite)');
}

// CRA_KUBE_SESSION_IMAGE: run the sessions in that image instead (a user's image, the runtime
// copied in from CRA_KUBE_IMAGE): kube-ci.sh runs the boundary and lifecycle cases again so.
const SESSION_IMAGE = process.env.CRA_KUBE_SESSION_IMAGE;
// CRA_KUBE_NODE_CACHE: `nodeCache`, a directory on the nodes writable by uid 1000: the
// checkouts' bases kept there once per node, and with CRA_KUBE_SESSION_IMAGE the sessions'
// runtime too instead of copied per pod.
const NODE_CACHE = process.env.CRA_KUBE_NODE_CACHE;

/** `backend` of an adapter config for the cluster under test, with `extra` fields merged in. */
export const kubeBackend = (extra = {}) => ({
  kubernetes: {
    namespace: NAMESPACE,
    image: SESSION_IMAGE ?? IMAGE,
    ...(SESSION_IMAGE ? { runtimeImage: IMAGE } : {}),
    ...(NODE_CACHE ? { nodeCache: NODE_CACHE } : {}),
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

/**
 * Runs `script` as root on `node` in a pod of the session image, with the node's `dir`'s parent
 * at /host (the test's own set-up and clean-up of a node directory; the adapter's pods never
 * run as root). Returns its output once it succeeded.
 */
export function onNode(node, dir, script) {
  const name = `cra-node-test-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
  const parent = dirname(dir);
  const pod = {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name },
    spec: {
      nodeName: node,
      restartPolicy: 'Never',
      terminationGracePeriodSeconds: 1,
      automountServiceAccountToken: false,
      volumes: [{ name: 'host', hostPath: { path: parent, type: 'Directory' } }],
      containers: [{ name: 'c', image: IMAGE, imagePullPolicy: 'IfNotPresent', command: ['sh', '-c', script], securityContext: { runAsUser: 0 }, volumeMounts: [{ name: 'host', mountPath: '/host' }] }],
    },
  };
  execFileSync('kubectl', ['-n', process.env.CRA_KUBE_NAMESPACE ?? 'default', 'create', '-f', '-'], { input: JSON.stringify(pod) });
  try {
    kubectl('wait', '--for=jsonpath={.status.phase}=Succeeded', `pod/${name}`, '--timeout=60s');
    // A container that has just ended may not have its log in place yet: an empty answer is
    // read again, a few times (a script with no output costs 1.5 s more).
    let out = kubectl('logs', name);
    for (let i = 0; i < 3 && !out; i++) {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 500);
      out = kubectl('logs', name);
    }
    return out;
  } finally {
    kubectl('delete', 'pod', name, '--wait=false', '--ignore-not-found');
  }
}

// The agent's work covering what a patch must carry: a rename, a mode change, a symlink, a
// binary file, non-UTF-8 text, a deletion, a commit, an uncommitted edit, an untracked file,
// and an edit to a file the agent marked "assume unchanged" (which `git add -A` alone would
// not see: the extraction must refresh such an entry first).
export const EDGE_FILES = {
  'rename-me.txt': 'line\n'.repeat(40),
  'tool.sh': '#!/bin/sh\necho tool\n',
  'gone.txt': 'to delete\n',
  'keep.txt': 'kept\n',
  'assumed.txt': 'assumed\n',
};
export const EDGE_WORK = [
  [
    'git mv rename-me.txt renamed.txt',
    'chmod +x tool.sh',
    'ln -s renamed.txt link-to-renamed',
    "printf '\\000\\001\\002\\377binary' > blob.bin",
    "printf 'caf\\351\\n' > latin1.txt",
    'rm gone.txt',
    "echo committed > committed.txt && git add committed.txt && git -c user.name=A -c user.email=a@example.invalid commit -qm c",
    'echo more >> keep.txt',
    'mkdir -p new/dir && echo untracked > new/dir/file.txt',
    'git update-index --assume-unchanged assumed.txt && echo edited-while-assumed >> assumed.txt',
  ].join(' && '),
];
