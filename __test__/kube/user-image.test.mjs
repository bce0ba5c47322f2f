// Issue 28 on a real cluster: sessions in the user's own image (the adapter's runtime copied in
// by an init container), the repository's devcontainer.json image, and the history on demand.
// The images are built without a registry by scripts/test-images.mjs (none has bubblewrap,
// socat or the CLI) and imported into both nodes by scripts/kube-ci.sh, which names them in
// CRA_KUBE_TOOLCHAIN_IMAGE, CRA_KUBE_MINIMAL_IMAGE, CRA_KUBE_NOGIT_IMAGE, CRA_KUBE_MUSL_IMAGE.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { scenario } from '../support/fake-api.mjs';
import { rejection, setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
import { adapterPods, IMAGE, kubeBackend, kubectl, onNode, podLine } from './support.mjs';

const IMAGES = {
  toolchain: process.env.CRA_KUBE_TOOLCHAIN_IMAGE,
  minimal: process.env.CRA_KUBE_MINIMAL_IMAGE,
  nogit: process.env.CRA_KUBE_NOGIT_IMAGE,
  musl: process.env.CRA_KUBE_MUSL_IMAGE,
};
for (const [name, ref] of Object.entries(IMAGES)) {
  if (!ref) throw new Error(`CRA_KUBE_${name.toUpperCase()}_IMAGE is not set: build the test images (scripts/test-images.mjs, scripts/kube-ci.sh)`);
}

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const AGENTS = agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']);

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/** A harness on the cluster in `image` (the session image is the runtime's), or on this machine. */
async function imageSetup({ image, local = false, config = {}, repo = {}, kube = {} } = {}) {
  h = await setup({
    repo: { agents: AGENTS, ...repo },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    // No `image`: the repository's devcontainer.json, else the runtime's (the session image).
    config: { ...(local ? {} : { backend: kubeBackend({ runtimeImage: IMAGE, image, ...kube }) }), ...config },
  });
  return h;
}

const transcriptOf = (handle) => readFileSync(handle.logFilePath, 'utf8');

// A project with a real npm dependency (left-pad 1.3.0, the registry's own tarball, vendored:
// the pod reaches no registry), node tests, a Python unittest and a C program.
const PROJECT = {
  '.gitignore': 'node_modules/\nyarn.lock\n__pycache__/\nhello\n',
  'package.json': JSON.stringify({ name: 'project', version: '1.0.0', private: true, scripts: { test: 'node test.js' }, dependencies: { 'left-pad': 'file:vendor/left-pad-1.3.0.tgz' } }, null, 2) + '\n',
  'vendor/left-pad-1.3.0.tgz': readFileSync(join(root, '__test__', 'fixtures', 'left-pad-1.3.0.tgz')),
  'pad.js': "const leftPad = require('left-pad');\nmodule.exports = (s) => leftPad(s, 5, '0');\n",
  'test.js': "const assert = require('assert');\nassert.strictEqual(require('./pad')('7'), '00007');\nconsole.log('node tests pass');\n",
  'calc.py': 'def add(a, b):\n    return a + b\n',
  'test_calc.py': 'import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\nif __name__ == "__main__":\n    unittest.main()\n',
  'hello.c': '#include <stdio.h>\nint main(void) { printf("hello from C\\n"); return 0; }\n',
};

// The agent's work: change code in each language, run each project's tests, commit.
const TOOLCHAIN_WORK = [
  [
    "sed -i 's/5, .0./6, \\x270\\x27/' pad.js && sed -i \"s/'00007'/'000007'/\" test.js",
    "sed -i 's/return a + b/return b + a/' calc.py",
    "sed -i 's/hello from C/hello from C, changed/' hello.c",
    '(npm test && python3 -m unittest -q 2>&1 && cc hello.c -o hello && ./hello) > /tmp/checks.txt 2>&1; echo "checks exit $?"; cat /tmp/checks.txt',
    'git add -A && git commit -qm "pad to six" && git log -1 --format=%s',
  ].join('; '),
];

describe('a session in the user\'s own image', () => {
  it('toolchain image: the default yarn install setup, the agent edits, runs npm test, python3 -m unittest and cc, commits; the patch is the local backend\'s', { timeout: 300_000 }, async () => {
    await imageSetup({ local: true, repo: { files: PROJECT } });
    const local = await agentRuns(h, 'implementor', TOOLCHAIN_WORK);
    await h.cleanup();
    // worktreeSetupCommand left to its default (yarn install).
    await imageSetup({ image: IMAGES.toolchain, repo: { files: PROJECT }, config: { worktreeSetupCommand: undefined } });
    const remote = await agentRuns(h, 'implementor', TOOLCHAIN_WORK);
    const out = remote.out[0];
    expect(out).toContain('checks exit 0');
    expect(out).toContain('node tests pass');
    expect(out).toMatch(/Ran 1 test/);
    expect(out).toContain('hello from C, changed');
    expect(out).toContain('pad to six');
    // The transcript names the pod's image (redacted there: a tag reads like a token), the log in full.
    expect(podLine(transcriptOf(remote.handle))).toContain('of image');
    for (const part of ['+++ b/pad.js', '+++ b/calc.py', '+++ b/hello.c']) expect(remote.result.patch).toContain(part);
    // yarn install's output (node_modules, yarn.lock) is the setup's, not the agent's work.
    expect(remote.result.patch).not.toContain('node_modules');
    expect(remote.result.patch).toBe(local.result.patch);
    expect(adapterPods(remote.handle.sessionID)).toEqual([]);
  });

  it('minimal image (git and a shell only): the same session without the toolchain edits, commits and returns the local backend\'s patch', { timeout: 240_000 }, async () => {
    const work = ["sed -i 's/return a + b/return b + a/' calc.py && echo new > new.txt && git add -A && git commit -qm edit && git log --oneline | wc -l && git status --short | wc -l; which bwrap socat claude node python3 cc | sort"];
    await imageSetup({ local: true, repo: { files: PROJECT } });
    const local = await agentRuns(h, 'implementor', work);
    await h.cleanup();
    await imageSetup({ image: IMAGES.minimal, repo: { files: PROJECT } });
    const remote = await agentRuns(h, 'implementor', work);
    const [commits, dirty, ...found] = remote.out[0].trim().split('\n');
    expect([commits, dirty]).toEqual(['2', '0']);
    // What the agent finds on its PATH is the runtime's, not the image's: the image has none.
    expect(found).toEqual(['/opt/claude-runtime-adapter/bin/bwrap', '/opt/claude-runtime-adapter/bin/claude', '/opt/claude-runtime-adapter/bin/socat']);
    expect(remote.result.patch).toBe(local.result.patch);
  });

  for (const [name, what] of [['nogit', 'a glibc image without git'], ['musl', 'a musl image (musl loader and libc, busybox, no glibc) without git']]) {
    it(`${what} is refused with ERR_PROVISION naming git, before the CLI starts, and no pod is left`, { timeout: 180_000 }, async () => {
      await imageSetup({ image: IMAGES[name] });
      const started = Date.now();
      const err = await rejection(h.adapter().startAgent(ROLES.implementor.params()));
      expect(err.code).toBe('ERR_PROVISION');
      expect(err.message).toContain(`the image ${IMAGES[name]} lacks git`);
      expect(err.message).toContain('needs /bin/sh, git');
      // The CLI never ran: the fake API saw no request.
      expect(h.api.mainBodies()).toEqual([]);
      expect(Date.now() - started).toBeLessThan(120_000);
      expect(adapterPods()).toEqual([]);
    });
  }
});

describe('the repository\'s devcontainer.json', () => {
  it('its image is used where backend.kubernetes.image is not given (comments and trailing commas allowed), and the log says so', { timeout: 180_000 }, async () => {
    const devcontainer = `// the team's image\n{\n  "name": "project",\n  /* pinned */ "image": "${IMAGES.minimal}",\n  "customizations": {},\n}\n`;
    await imageSetup({ repo: { files: { '.devcontainer/devcontainer.json': devcontainer } } });
    const { handle, out } = await agentRuns(h, 'planner', ['test -e /usr/bin/python3 && echo toolchain || echo minimal; git --version']);
    expect(out[0]).toMatch(/^minimal\ngit version 2\./);
    expect(podLine(transcriptOf(handle))).toContain('of image');
    const said = h.logger.entries.filter((e) => JSON.stringify(e).includes('.devcontainer/devcontainer.json'));
    expect(JSON.stringify(said)).toContain(IMAGES.minimal);
  });

  it('a devcontainer that builds its image from a Dockerfile is refused with ERR_PROVISION saying so, and no pod is made', { timeout: 120_000 }, async () => {
    const devcontainer = '{ "name": "project", "build": { "dockerfile": "Dockerfile" } }\n';
    await imageSetup({ repo: { files: { '.devcontainer/devcontainer.json': devcontainer, '.devcontainer/Dockerfile': 'FROM debian\n' } } });
    const err = await rejection(h.adapter().startAgent(ROLES.planner.params()));
    expect(err.code).toBe('ERR_PROVISION');
    expect(err.message).toContain('.devcontainer/devcontainer.json builds its image ("build")');
    expect(err.message).toContain('does not build images');
    expect(adapterPods()).toEqual([]);
  });
});

// 500 commits: each changes one line of story.txt and touches a file of its own.
function longHistory(repoRoot, commits = 500) {
  let script = '';
  const lines = Array.from({ length: 40 }, (_, i) => `line ${i}`);
  for (let c = 1; c <= commits; c += 1) {
    lines[c % 40] = `line ${c % 40} changed in commit ${c}`;
    const story = lines.join('\n') + '\n';
    const note = `note ${c}\n`;
    script += `commit refs/heads/main\ncommitter Historian <h@example.invalid> ${1700000000 + c * 3600} +0000\ndata <<EOM\ncommit ${c}\nEOM\n`;
    if (c === 1) script += 'from refs/heads/main^0\n';
    script += `M 100644 inline story.txt\ndata ${Buffer.byteLength(story)}\n${story}\nM 100644 inline notes/${c % 50}.txt\ndata ${Buffer.byteLength(note)}\n${note}\n`;
  }
  execFileSync('git', ['-C', repoRoot, 'fast-import', '--quiet'], { input: script });
  execFileSync('git', ['-C', repoRoot, 'reset', '-q', '--hard', 'main']);
}

describe('the history on demand', () => {
  it('git log -3 --stat, git blame of an old line and git show of an old commit answer in a pod as they do locally, on 500 commits', { timeout: 240_000 }, async () => {
    await imageSetup({ image: IMAGES.minimal });
    longHistory(h.repo.root);
    const old = h.repo.git('rev-parse', 'main~400').toString().trim();
    const commands = ['git log -3 --stat', 'git blame -L 3,3 story.txt', `git show ${old}`, 'git diff main~5 --stat', 'git rev-list --count HEAD'];
    const localOut = commands.map((c) => execFileSync('sh', ['-c', c], { cwd: h.repo.root }).toString());
    expect(localOut[4].trim()).toBe('501');
    // A Planner: its checkout is read-only, its git directory takes the history in.
    const { out } = await agentRuns(h, 'planner', commands);
    expect(out).toEqual(localOut.map((o) => o.trimEnd()));
  });

  it('four commands at once that need the history each see all of it, none told it could not be fetched, and nothing of the fetch is left in the git dir', { timeout: 240_000 }, async () => {
    // The CLI starts several git commands at once, and an agent may: each first fetches the
    // history, and a second fetch beside the first failed on git's lock (image/git-history).
    await imageSetup({ image: IMAGES.minimal });
    longHistory(h.repo.root);
    const { out } = await agentRuns(h, 'planner', [
      'for i in 1 2 3 4; do git rev-list --count HEAD 2>&1 & done; wait; ls -a "$(git rev-parse --git-dir)" | grep cra-history || echo none left',
    ]);
    expect(out[0].split('\n')).toEqual(['501', '501', '501', '501', 'none left']);
  });

  it('a fetch\'s lock left by a killed command does not hold the next: it fetches the history', { timeout: 240_000 }, async () => {
    await imageSetup({ image: IMAGES.minimal });
    longHistory(h.repo.root);
    const { out } = await agentRuns(h, 'planner', [
      'gd=$(git rev-parse --git-dir); test -f "$gd/shallow" && echo shallow; mkdir "$gd/cra-history.lock" && echo 999999 > "$gd/cra-history.lock/pid"; start=$(date +%s); git rev-list --count HEAD; echo "waited $(( $(date +%s) - start )) s"; test -e "$gd/cra-history.lock" || echo "no lock left"',
    ]);
    const [shallow, count, waited, left] = out[0].split('\n');
    expect([shallow, count, left]).toEqual(['shallow', '501', 'no lock left']);
    expect(Number(/waited (\d+) s/.exec(waited)[1])).toBeLessThan(10);
  });

  it('a pod gets only what defaultBranch reaches: another branch\'s commit is not served', { timeout: 180_000 }, async () => {
    await imageSetup({ image: IMAGES.minimal });
    h.repo.git('checkout', '-q', '-b', 'secret');
    execFileSync('sh', ['-c', 'echo secret > secret.txt && git add secret.txt && git commit -qm secret'], { cwd: h.repo.root });
    const secret = h.repo.git('rev-parse', 'HEAD').toString().trim();
    h.repo.git('checkout', '-q', 'main');
    const { out } = await agentRuns(h, 'planner', [`git log --oneline | wc -l; git show ${secret} 2>&1 | head -3; git fetch origin ${secret} 2>&1 | tail -1`]);
    expect(out[0]).toMatch(/^1\n/);
    expect(out[0]).not.toContain('secret.txt');
    expect(out[0]).toMatch(/bad object|unknown revision|not our ref|not allowed/);
  });
});

describe('the runtime in an image without glibc', () => {
  it('the musl image runs the copied runtime: cra-pod as pid 1, bubblewrap and socat through the runtime\'s own loader, the CLI through it too', { timeout: 180_000 }, async () => {
    // The adapter's pod spec for another image (cluster.rs), made by hand: the init container
    // of the session image copies the runtime, the musl image runs it.
    const name = `cra-musl-test-${process.pid}`;
    const pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name, labels: { 'claude-runtime-adapter-test': 'musl' } },
      spec: {
        restartPolicy: 'Never',
        terminationGracePeriodSeconds: 1,
        automountServiceAccountToken: false,
        securityContext: { runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true },
        volumes: [{ name: 'runtime', emptyDir: {} }],
        initContainers: [{ name: 'runtime', image: IMAGE, imagePullPolicy: 'IfNotPresent', command: ['cp', '-dR', '--preserve=mode', '/opt/claude-runtime-adapter', '/copy/runtime'], volumeMounts: [{ name: 'runtime', mountPath: '/copy' }] }],
        containers: [{ name: 'session', image: IMAGES.musl, imagePullPolicy: 'IfNotPresent', command: ['/opt/claude-runtime-adapter/bin/cra-pod', 'idle'], volumeMounts: [{ name: 'runtime', mountPath: '/opt/claude-runtime-adapter', subPath: 'runtime', readOnly: true }] }],
      },
    };
    execFileSync('kubectl', ['-n', process.env.CRA_KUBE_NAMESPACE ?? 'default', 'create', '-f', '-'], { input: JSON.stringify(pod) });
    try {
      kubectl('wait', '--for=condition=Ready', `pod/${name}`, '--timeout=120s');
      const rt = '/opt/claude-runtime-adapter';
      const out = kubectl('exec', name, '--', 'sh', '-c', [
        'test -e /lib64/ld-linux-x86-64.so.2 && echo has-glibc || echo no-glibc',
        'cat /proc/1/cmdline | tr "\\0" " "; echo',
        `${rt}/bin/bwrap --version`,
        `${rt}/bin/socat -V | grep -m1 'socat version'`,
        `${rt}/bin/claude --version`,
        `${rt}/bin/bwrap --unshare-user --unshare-net --ro-bind / / --dev /dev --ro-bind /proc /proc sh -c 'echo sandboxed; cat /proc/net/dev | grep -c :'`,
      ].join('; '));
      const lines = out.trim().split('\n');
      expect(lines[0]).toBe('no-glibc');
      expect(lines[1].trim()).toBe(`${rt}/bin/cra-pod idle`);
      expect(lines[2]).toMatch(/^bubblewrap \d/);
      expect(lines[3]).toMatch(/socat version \d/);
      expect(lines[4]).toMatch(/\(Claude Code\)$/);
      expect(lines.slice(5)).toEqual(['sandboxed', '1']);
    } finally {
      kubectl('delete', 'pod', name, '--wait=false', '--ignore-not-found');
    }
  });
});


describe('the runtime kept once per node (backend.kubernetes.nodeCache)', () => {
  const node = JSON.parse(kubectl('get', 'nodes', '-o', 'json')).items[0].metadata.name;
  const pinned = { nodeSelector: { 'kubernetes.io/hostname': node } };
  const dirs = [];
  const cacheDir = (name) => {
    const dir = `/var/tmp/cra-node-cache-${name}-${process.pid}`;
    dirs.push(dir);
    return dir;
  };
  afterAll(() => {
    for (const dir of dirs) onNode(node, dir, `rm -rf /host/${basename(dir)}`);
  }, 120_000);

  it('pods of a user\'s image get the runtime as links into one copy on the node, made by the first, reused by the next, read-only to the agent', { timeout: 300_000 }, async () => {
    const dir = cacheDir('rw');
    onNode(node, dir, `mkdir -p /host/${basename(dir)} && chown 1000:1000 /host/${basename(dir)}`);
    const work = [
      'readlink /opt/claude-runtime-adapter/bin; du -sk /opt/claude-runtime-adapter/ | cut -f1; ls /opt/claude-runtime-adapter-node/runtime; touch /opt/claude-runtime-adapter-node/runtime/planted 2>&1; mkdir /opt/claude-runtime-adapter-node/runtime/planted 2>&1; true',
      'echo new > new.txt && git add -A && git commit -qm edit && git log --oneline | wc -l',
    ];
    const runs = [];
    for (let i = 0; i < 2; i++) {
      await imageSetup({ image: IMAGES.minimal, kube: { nodeCache: dir, ...pinned } });
      runs.push({ ...(await agentRuns(h, 'implementor', work)), logs: h.logger.entries.map((e) => e.message) });
      await h.cleanup();
      h = undefined;
    }
    const said = runs.map((r) => r.logs.find((m) => m.includes('the runtime from the node cache')) ?? r.logs.join('\n'));
    const [, id] = said[0].match(/: filled ([0-9a-f]{32})$/) ?? [];
    expect(id, said[0]).toBeDefined();
    expect(said[1]).toMatch(new RegExp(`: reused ${id}$`));
    for (const r of runs) {
      const [link, kib, ls, ...denied] = r.out[0].trim().split('\n');
      // No copy in the pod: links into the node's copy, a few KiB.
      expect(link).toBe(`/opt/claude-runtime-adapter-node/runtime/${id}/bin`);
      expect(Number(kib)).toBeLessThan(64);
      // One copy on the node, and the agent can plant nothing in it.
      expect(ls).toBe(id);
      expect(denied.join('\n')).toMatch(/planted.*Read-only file system[^]*Read-only file system/);
      expect(r.out[1].trim()).toBe('2');
      expect(r.result.patch).toContain('+++ b/new.txt');
      expect(r.logs.some((m) => m.includes('not kept once on node'))).toBe(false);
      // The checkout layered on the node's base too: its end read only what the layer changed,
      // with the runtime's cra-pod in the user's image.
      expect(r.logs.filter((m) => m.includes('staged from the layer')), r.logs.join('\n')).toHaveLength(1);
    }
  });

  it('8 pods starting at once on a cold node make one copy: one fills it, the others wait and reuse it, nothing half-made is left', { timeout: 300_000 }, async () => {
    const dir = cacheDir('race');
    onNode(node, dir, `mkdir -p /host/${basename(dir)} && chown 1000:1000 /host/${basename(dir)}`);
    await imageSetup({ image: IMAGES.minimal, kube: { nodeCache: dir, ...pinned } });
    h.api.setScript(scenario.steps([ROLES.planner.done]));
    const adapter = h.adapter();
    const handles = await Promise.all(Array.from({ length: 8 }, () => adapter.startAgent(ROLES.planner.params())));
    const results = await Promise.allSettled(handles.map((x) => x.result));
    expect(results.filter((r) => r.status === 'rejected').map((r) => r.reason.message)).toEqual([]);
    const notes = h.logger.entries.map((e) => e.message).filter((m) => m.includes('the runtime from the node cache'));
    const ids = new Set(notes.map((m) => m.match(/: (?:filled|reused) ([0-9a-f]{32})$/)?.[1]));
    expect(notes.filter((m) => / filled /.test(m)), notes.join('\n')).toHaveLength(1);
    expect(notes.filter((m) => / reused /.test(m))).toHaveLength(7);
    expect(ids.size).toBe(1);
    // On the node: the one copy and the lock, no temporary copy left.
    const listed = onNode(node, dir, `ls -A /host/${basename(dir)}/runtime`).trim().split('\n');
    expect(listed.sort()).toEqual(['.lock', [...ids][0]].sort());
  });

  it('a node directory the pod\'s user cannot write is no failure: the pod copies the runtime as without a cache, and the log says why, once', { timeout: 300_000 }, async () => {
    // Not made beforehand: the kubelet makes it, root's, as on a node nobody prepared.
    const dir = cacheDir('ro');
    await imageSetup({ image: IMAGES.minimal, kube: { nodeCache: dir, ...pinned } });
    const adapter = h.adapter();
    const outs = [];
    for (let i = 0; i < 2; i++) outs.push((await agentRuns(h, 'planner', ['test -L /opt/claude-runtime-adapter/bin && echo links || echo copy; claude --version'], { adapter })).out[0]);
    for (const out of outs) expect(out).toMatch(/^copy\n.*\(Claude Code\)/);
    // Once for the runtime, once for the checkout's base (kept there too: node-base.test.mjs).
    const warned = h.logger.entries.filter((e) => e.level === 'warn' && e.message.includes('backend.kubernetes.nodeCache'));
    const runtime = warned.filter((e) => e.message.includes('the runtime was copied'));
    expect(warned.length, JSON.stringify(warned)).toBe(2);
    expect(runtime.length).toBe(1);
    expect(runtime[0].message).toContain(`the node cache ${dir} (backend.kubernetes.nodeCache) cannot be used there: the node cache is not writable by uid 1000 (owner 0:0`);
  });
});
