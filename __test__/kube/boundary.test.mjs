// The boundary inside the pod (issue 21), tried by the agent's own commands through the real
// CLI: no model key anywhere it can read, nothing of the pod or the engine outside its
// checkout, no network but the egress proxy's allowlist, no push — and its ordinary work
// (commit, build) still works.
import { readFileSync, rmSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { addon, setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE } from '../support/roles.mjs';
import { kubeBackend, kubectl } from './support.mjs';
import { post, REACHING_OUT, reachingOut, rssGrowthWhile, uploads } from '../support/relay-probes.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

async function kubeSetup(config = {}) {
  h = await setup({
    repo: { agents: agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']) },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { backend: kubeBackend(), ...config },
  });
  return h;
}

/** The Implementor's probes, then a file it writes: its session must have work to return. */
const implementorRuns = (commands) => agentRuns(h, 'implementor', [...commands, 'echo probed > probed.txt']);

/** A TCP connect from bash, bounded: `reached` or `blocked`. */
const probe = (host, port) => `timeout 5 bash -c 'exec 3<>/dev/tcp/${host}/${port}' 2>/dev/null && echo reached || echo blocked`;

describe('the boundary inside the pod', () => {
  it("the model key is in no environment the agent can read (its own, every readable /proc/*/environ), nor any path of the engine's machine", { timeout: 180_000 }, async () => {
    await kubeSetup();
    const key = h.config.env.ANTHROPIC_API_KEY;
    const { out } = await implementorRuns([
      'env | grep -E "^ANTHROPIC_(API_KEY|AUTH_TOKEN)=" ; echo end',
      'for f in /proc/[0-9]*/environ; do { tr "\\0" "\\n" < "$f"; } 2>/dev/null; done > /tmp/all-env; grep -c . /tmp/all-env; grep -E "^ANTHROPIC_(API_KEY|AUTH_TOKEN)=" /tmp/all-env | sort -u',
      'env',
    ]);
    expect(out[0]).toMatch(/ANTHROPIC_API_KEY=sk-ant-sandbox-placeholder-/);
    // Nothing of the engine's machine either: no path of it in the agent's environment.
    for (const enginePath of [h.repo.root, h.scratch, process.env.HOME, process.cwd()]) expect(out[2]).not.toContain(enginePath);
    expect(out[2]).toContain('HOME=/home/agent');
    expect(Number(out[1].split('\n')[0])).toBeGreaterThan(5); // environments were read
    for (const o of out) expect(o).not.toContain(key);
  });

  it("files outside the checkout are not there: the pod's state, other workspaces, its service account, the engine's repository", { timeout: 180_000 }, async () => {
    await kubeSetup();
    const { out } = await implementorRuns([
      `for p in /var/lib/cra /var/lib/cra/gitconfig /workspace/other /var/run/secrets/kubernetes.io/serviceaccount/token ${h.repo.root}/README.md; do cat "$p" >/dev/null 2>&1 && echo "read $p" || echo "no $p"; done; ls /workspace`,
    ]);
    expect(out[0]).not.toMatch(/^read /m);
    expect(out[0]).toContain(`no ${h.repo.root}/README.md`);
    expect(out[0].trim().split('\n').at(-1)).toBe('repo');
  });

  it("the egress proxy refuses a host not allowed, and push fails (to a URL: no route; to origin, the history's read-only transport: refused); the engine's audit record holds the pod's tool calls and the refused host, and verifies", { timeout: 180_000 }, async () => {
    const auditDir = `/var/tmp/cra-kube-audit-${process.pid}`;
    await kubeSetup({ audit: { dir: auditDir } });
    const { out, handle, result } = await implementorRuns([
      "exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n' >&3 && head -1 <&3",
      'git push https://example.com/x.git HEAD 2>&1; echo "push rc=$?"; git push origin HEAD:refs/heads/x 2>&1; echo "origin rc=$?"',
    ]);
    expect(out[0]).toMatch(/HTTP\/1\.1 403/);
    expect(out[1]).toMatch(/push rc=[1-9]/);
    expect(out[1]).toMatch(/transport 'ext' not allowed/);
    expect(out[1]).toMatch(/origin rc=[1-9]/);
    // Issue 50: the pod's tool calls and proxy decisions reach the engine's record.
    const record = readFileSync(handle.auditRecordPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(record[1].environment).toMatch(/^Kubernetes pod /);
    const pushed = record.findIndex((e) => e.kind === 'tool_use' && e.input.command.startsWith('git push https://example.com'));
    const refused = record.findIndex((e) => e.kind === 'network' && e.host === 'example.com' && e.port === 443 && !e.allowed);
    expect(pushed).toBeGreaterThan(0);
    expect(refused).toBeGreaterThan(0);
    expect(refused).toBeLessThan(pushed);
    expect(record.some((e) => e.kind === 'tool_verdict' && e.verdict === 'allowed' && e.command?.startsWith('git push'))).toBe(true);
    expect(record.filter((e) => e.kind === 'model_answer' && e.status === 200).length).toBeGreaterThanOrEqual(3);
    expect(await addon.verifyAuditRecord(handle.auditRecordPath, { patch: result.patch })).toMatchObject({ ok: true, sealed: true });
    rmSync(auditDir, { recursive: true, force: true });
  });

  it('the direct probe: the node the pod runs on is reachable from the pod, not from the agent', { timeout: 180_000 }, async () => {
    await kubeSetup();
    const podName = `cra-probe-${process.pid}`;
    // A plain pod of the same image outside any jail reaches its node's kubelet port…
    kubectl('run', podName, `--image=${process.env.CRA_KUBE_IMAGE}`, '--image-pull-policy=IfNotPresent', '--restart=Never', '--labels=test-owner=kube-suite', '--command', '--', '/usr/local/bin/cra-pod', 'idle');
    try {
      kubectl('wait', '--for=condition=Ready', `pod/${podName}`, '--timeout=60s');
      const hostIP = JSON.parse(kubectl('get', 'pod', podName, '-o', 'json')).status.hostIP;
      expect(kubectl('exec', podName, '--', 'bash', '-c', probe(hostIP, 10250)).trim()).toBe('reached');
      // …and the agent, in its session's pod, does not.
      const { out } = await implementorRuns([probe(hostIP, 10250), probe('1.1.1.1', 443)]);
      expect(out[0].trim()).toBe('blocked');
      expect(out[1].trim()).toBe('blocked');
    } finally {
      kubectl('delete', 'pod', podName, '--grace-period=0', '--force', '--wait=false');
    }
  });

  it("the agent's ordinary work works inside: git add -A && git commit, and the committed work comes back in the patch", { timeout: 180_000 }, async () => {
    await kubeSetup();
    const { out, result } = await agentRuns(h, 'implementor', [
      'printf "int main(){return 0;}\\n" > main.c && mkdir -p build && echo built > build/out.txt && git add -A && git commit -qm work && git log --oneline | head -1',
    ]);
    expect(out[0]).toContain('work');
    expect(result.patch).toContain('+++ b/main.c');
  });

  it('the Planner and the Reviewer cannot change their checkout', { timeout: 180_000 }, async () => {
    await kubeSetup();
    for (const role of ['planner', 'reviewer']) {
      const { out } = await agentRuns(h, role, ['touch /workspace/repo/x 2>&1; echo rc=$?; touch /tmp/ok && echo tmp-ok']);
      expect(out[0]).toMatch(/Read-only file system/);
      expect(out[0]).toContain('tmp-ok');
    }
  });
});

describe("the model API is no way around the pod's boundary (issue 36)", () => {
  it('requests the agent posts that ask the API to reach out (MCP servers, web fetch) are refused 400 by the engine\'s relay and never reach the API', { timeout: 180_000 }, async () => {
    await kubeSetup();
    const { out } = await implementorRuns([
      post(...REACHING_OUT['mcp_servers (the MCP connector)']),
      post(...REACHING_OUT['a web_fetch server tool']),
    ]);
    expect(out[0]).toMatch(/^HTTP\/1\.1 400 /);
    expect(out[1]).toMatch(/^HTTP\/1\.1 400 /);
    expect(reachingOut(h.api)).toEqual([]);
  });

  it("32 uploads held open from the pod grow the engine's memory by its session's share, not by what they send", { timeout: 240_000 }, async () => {
    await kubeSetup();
    const { value: { out }, grownMiB: grown } = await rssGrowthWhile(() => implementorRuns([`${uploads({ n: 32, declared: 30_000_000, sent: 29_000_000, holdS: 20 })}; sleep 16; echo held`]));
    expect(out[0]).toContain('held');
    console.log(`[measure] from a pod: engine RSS grew ${grown.toFixed(0)} MiB at its peak while the agent held 32 uploads of 29 MB`);
    expect(grown).toBeLessThan(200);
  });

  it("the CLI's own ripgrep and git are found through wrappers that take the commands' share (RLIMIT_NPROC) in the pod", { timeout: 180_000 }, async () => {
    await kubeSetup();
    const { out } = await implementorRuns([
      'echo "$PATH" | cut -d: -f1; echo "$USE_BUILTIN_RIPGREP"; grep -c "ulimit -u" /run/claude-runtime-adapter/bin/rg /run/claude-runtime-adapter/bin/git',
    ]);
    const [first, builtin, ...wrappers] = out[0].trim().split('\n');
    expect(first).toBe('/run/claude-runtime-adapter/bin');
    expect(builtin).toBe('0');
    expect(wrappers.sort()).toEqual(['/run/claude-runtime-adapter/bin/git:1', '/run/claude-runtime-adapter/bin/rg:1']);
  });
});
