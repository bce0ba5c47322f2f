// The session image on a real cluster: a pod of CRA_KUBE_IMAGE with the pod settings of the
// image contract, and what runs in it under cra-jail (the CLI, git, the sandbox's boundaries).
// Needs only KUBECONFIG (or kubectl's default config) and CRA_KUBE_IMAGE, plus kubectl on PATH;
// CRA_KUBE_NAMESPACE picks a namespace (default: the kubeconfig's). `npm run test:kube`.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const IMAGE = process.env.CRA_KUBE_IMAGE;
const NS = process.env.CRA_KUBE_NAMESPACE ? ['--namespace', process.env.CRA_KUBE_NAMESPACE] : [];
// The image's own PATH is mkimage.py's (no /usr/local/bin): the engine always passes the whole
// environment, so the commands here do too.
const PATH = 'PATH=/usr/local/bin:/usr/bin:/bin';
const JAIL = '/usr/local/bin/cra-jail';
const CLI_PACKAGE = '@anthropic-ai/claude-agent-sdk-linux-x64';

function kubectl(args, { input, timeout = 60_000 } = {}) {
  const r = spawnSync('kubectl', [...NS, ...args], { input, encoding: 'utf8', timeout });
  if (r.error) throw new Error(`kubectl ${args.join(' ')}: ${r.error.message}`);
  return r;
}

// A command in the pod (outside the jail): its stdout, or an error with everything it said.
function podSh(pod, script) {
  const r = kubectl(['exec', pod, '--', 'env', PATH, 'sh', '-c', script]);
  if (r.status !== 0) throw new Error(`in ${pod}: ${script}\nexit ${r.status}\n${r.stdout}${r.stderr}`);
  return r.stdout;
}

// `cra-jail MODE WORKDIR -- bash -c SCRIPT` in the pod: { status, stdout, stderr }.
function jailed(pod, mode, workdir, script) {
  return kubectl(['exec', pod, '--', 'env', PATH, JAIL, mode, workdir, '--', 'bash', '-c', script]);
}

// The contract's pod (docs/kubernetes.md, "The adapter's session image"), with its command.
function podSpec(name, extraPodSecurity = {}) {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, labels: { 'claude-runtime-adapter-test': 'image' } },
    spec: {
      restartPolicy: 'Never',
      terminationGracePeriodSeconds: 1,
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      securityContext: { runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true, ...extraPodSecurity },
      containers: [
        {
          name: 'session',
          image: IMAGE,
          imagePullPolicy: 'IfNotPresent',
          command: ['/usr/local/bin/cra-pod', 'idle'],
          securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } },
        },
      ],
    },
  };
}

const created = [];
function createPod(extraPodSecurity) {
  const name = `cra-image-test-${randomBytes(4).toString('hex')}`;
  const r = kubectl(['create', '-f', '-'], { input: JSON.stringify(podSpec(name, extraPodSecurity)) });
  if (r.status !== 0) throw new Error(`creating pod ${name}: ${r.stderr}`);
  created.push(name);
  const w = kubectl(['wait', '--for=condition=Ready', `pod/${name}`, '--timeout=120s'], { timeout: 130_000 });
  if (w.status !== 0) {
    const status = kubectl(['get', 'pod', name, '-o', 'jsonpath={.status}']).stdout;
    throw new Error(`pod ${name} of ${IMAGE} not Ready: ${w.stderr}\nstatus: ${status}`);
  }
  return name;
}

let pod;
beforeAll(() => {
  if (!IMAGE) throw new Error('CRA_KUBE_IMAGE is not set: the session image reference to test (see scripts/kube-ci.sh)');
  pod = createPod();
  podSh(pod, 'mkdir -p /workspace/repo /workspace/other && echo sibling > /workspace/other/file');
}, 150_000);

afterAll(() => {
  if (created.length > 0) kubectl(['delete', 'pod', '--wait=false', '--ignore-not-found', ...created]);
});

describe('session image', () => {
  it('runs the pinned CLI and git inside cra-jail', () => {
    const pinned = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).optionalDependencies[CLI_PACKAGE];
    const cliDir = join(root, 'node_modules', ...CLI_PACKAGE.split('/'));
    expect(JSON.parse(readFileSync(join(cliDir, 'package.json'), 'utf8')).version).toBe(pinned);
    // The CLI reports its own version (not the npm package's): the pinned package's binary says which.
    const local = spawnSync(join(cliDir, 'claude'), ['--version'], { encoding: 'utf8' }).stdout.trim();
    expect(local).toMatch(/\(Claude Code\)$/);

    const r = kubectl(['exec', pod, '--', 'env', PATH, JAIL, 'rw', '/workspace', '--', 'sh', '-c', 'claude --version; git --version']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    const [cli, git] = r.stdout.trim().split('\n');
    expect(cli).toBe(local);
    expect(git).toMatch(/^git version \d+\./);
  });

  it('gives the jail no network: the API server the pod reaches is unreachable inside', () => {
    const ep = kubectl(['get', 'endpoints', 'kubernetes', '--namespace', 'default', '-o',
      'jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}']).stdout.trim();
    const [host, port] = ep.split(':');
    expect(host).toMatch(/^[0-9a-f.:]+$/);
    const connect = `timeout 5 bash -c 'exec 3<>/dev/tcp/${host}/${port}' && echo connected`;
    // The pod itself reaches it: the failure inside is the jail's doing.
    expect(podSh(pod, connect)).toBe('connected\n');
    const r = jailed(pod, 'rw', '/workspace/repo', `${connect}; grep -c : /proc/net/dev`);
    expect(r.stdout).not.toContain('connected');
    expect(r.stderr).toMatch(/Network is unreachable/);
    // Only lo: the header lines aside, one interface.
    expect(r.stdout.trim()).toBe('1');
  });

  it('shows nothing of the pod but the system, the workdir and the sockets', () => {
    const r = jailed(pod, 'rw', '/workspace/repo', 'ls -A /; echo ---; ls -A /workspace; echo ---; ls -A /run; ls -d /var /var/lib/cra /var/run/secrets /workspace/other 2>&1');
    const [top, workspace, rest] = r.stdout.split('---\n');
    expect(top.trim().split('\n').sort()).toEqual(
      ['bin', 'dev', 'etc', 'home', 'lib', 'lib64', 'opt', 'proc', 'run', 'sbin', 'tmp', 'usr', 'workspace'],
    );
    expect(workspace.trim()).toBe('repo');
    expect(rest.split('\n')[0]).toBe('claude-runtime-adapter');
    for (const p of ['/var', '/var/lib/cra', '/var/run/secrets', '/workspace/other']) {
      expect(rest).toContain(`ls: cannot access '${p}': No such file or directory`);
    }
  });

  it('makes the workdir writable in rw and read-only in ro', () => {
    const rw = jailed(pod, 'rw', '/workspace/repo', 'echo written > rw-file && cat rw-file');
    expect(rw.status).toBe(0);
    expect(rw.stdout).toBe('written\n');
    expect(podSh(pod, 'cat /workspace/repo/rw-file')).toBe('written\n');

    const ro = jailed(pod, 'ro', '/workspace/repo', 'cat rw-file && echo again >> rw-file');
    expect(ro.stdout).toBe('written\n');
    expect(ro.status).not.toBe(0);
    expect(ro.stderr).toMatch(/Read-only file system/);
    expect(podSh(pod, 'cat /workspace/repo/rw-file')).toBe('written\n');
  });

  it("gives the jail its own empty /tmp and HOME, gone when it ends, but for the CLI's config dir, the pod's own, kept across runs", () => {
    podSh(pod, 'echo pod > /tmp/pod-file');
    const r = jailed(pod, 'rw', '/workspace/repo',
      'echo $HOME; stat -f -c %T /tmp "$HOME"; ls -A /tmp "$HOME"; echo jail > /tmp/jail-file; echo jail > "$HOME/jail-file"; echo conversation > "$HOME/.claude/kept"; echo ok');
    expect(r.status).toBe(0);
    expect(r.stdout).toBe('/home/agent\ntmpfs\ntmpfs\n/home/agent:\n.claude\n\n/tmp:\nok\n');
    expect(podSh(pod, 'ls -A /tmp /home/agent | grep -c jail-file || true').trim()).toBe('0');
    // Issue 34: what the CLI keeps there (its conversation) is the pod's, and the next run sees it.
    expect(podSh(pod, 'cat /var/lib/cra/claude-config/kept')).toBe('conversation\n');
    expect(jailed(pod, 'rw', '/workspace/repo', 'cat "$HOME/.claude/kept"').stdout).toBe('conversation\n');
  });

  it('reaches a unix socket of /var/lib/cra/sockets at /run/claude-runtime-adapter', () => {
    // A listener in the pod, detached from the exec stream (its fds would keep it open).
    podSh(pod, 'setsid socat UNIX-LISTEN:/var/lib/cra/sockets/model.sock,fork SYSTEM:"echo pong" </dev/null >/dev/null 2>&1 & '
      + 'for i in $(seq 100); do [ -S /var/lib/cra/sockets/model.sock ] && exit 0; sleep 0.05; done; exit 1');
    const r = jailed(pod, 'ro', '/workspace/repo', 'socat - UNIX-CONNECT:/run/claude-runtime-adapter/model.sock </dev/null');
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('pong\n');
  });

  it('commits with git in rw, with the git identity of /var/lib/cra/gitconfig', () => {
    podSh(pod, 'printf "[user]\\n\\tname = Agent\\n\\temail = agent@example.invalid\\n" > /var/lib/cra/gitconfig');
    const r = jailed(pod, 'rw', '/workspace/repo', 'git init -q && git add -A && git commit -qm first && git log -1 --format="%an %s"');
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('Agent first\n');
    expect(podSh(pod, 'git -C /workspace/repo log -1 --format=%s')).toBe('first\n');
  });

  it('keeps the sandbox alive when the process that started cra-jail ends, and ends it all on a signal to its process group', () => {
    // The starter (a shell here, a short-lived thread of the pod agent there) ends after 1 s.
    const out = podSh(pod, `
      setsid sh -c '${JAIL} rw /workspace/repo -- sleep 777 </dev/null >/dev/null 2>&1 & sleep 1' &
      sleep 2
      echo "after the starter ended: $(pgrep -c -f '^sleep 777$')"
      pg=$(ps -o pgid= -p "$(pgrep -o -f '^/bin/sh ${JAIL} rw')" | tr -d ' ')
      kill -TERM -"$pg"
      for i in $(seq 100); do pgrep -f '^(sleep 777|\S+ld-linux\S+ --library-path \S+ \S+/bwrap)' >/dev/null || break; sleep 0.05; done
      echo "after the signal: $(pgrep -c -f '^(sleep 777|\S+ld-linux\S+ --library-path \S+ \S+/bwrap|/bin/sh ${JAIL})')"`);
    expect(out).toBe('after the starter ended: 1\nafter the signal: 0\n');
  });

  it('refuses with exit 125 and a cra-jail: line before the command runs when the pod forbids user namespaces', () => {
    // seccomp RuntimeDefault refuses unshare(CLONE_NEWUSER) to a process without CAP_SYS_ADMIN.
    const strict = createPod({ seccompProfile: { type: 'RuntimeDefault' } });
    const r = kubectl(['exec', strict, '--', 'env', PATH, 'sh', '-c',
      `mkdir -p /workspace/r && ${JAIL} rw /workspace/r -- sh -c 'echo ran; touch /workspace/r/ran'; echo "status $?"; ls /workspace/r`]);
    expect(r.stdout).toBe('status 125\n');
    expect(r.stderr).toMatch(/^cra-jail: bubblewrap cannot create the sandbox here: bwrap: .+\n$/);
  }, 150_000);
});
