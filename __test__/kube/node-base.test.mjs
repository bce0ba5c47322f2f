// Issue 37: the checkout's base kept once per node (backend.kubernetes.nodeCache). The first
// sandboxed pod on a node makes it (the commit checked out, the setup run, the snapshot taken)
// in the node's directory; later pods of the same commit, setup and image layer their checkout
// on it (an overlay mounted only inside the pod's jail) and receive no pack. Real cluster, real
// CLI, the fake API on the engine.
import { basename } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { setup } from '../support/harness.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE } from '../support/roles.mjs';
import { adapterPods, EDGE_FILES, EDGE_WORK, kubeBackend, kubectl, onNode } from './support.mjs';

const AGENTS = agentsWithTools(['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep']);
const node = JSON.parse(kubectl('get', 'nodes', '-o', 'json')).items[0].metadata.name;
const pinned = { nodeSelector: { 'kubernetes.io/hostname': node } };

let h;
let dir;
let n = 0;
beforeAll(() => {
  dir = `/var/tmp/cra-node-base-${process.pid}`;
  onNode(node, dir, `mkdir -p /host/${basename(dir)} && chown 1000:1000 /host/${basename(dir)}`);
}, 120_000);
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});
afterAll(() => onNode(node, dir, `rm -rf /host/${basename(dir)}`), 120_000);

/** A harness on the cluster with `nodeCache` (its own directory per test: `fresh`), or local. */
async function baseSetup({ local = false, fresh = true, config = {}, repo = {} } = {}) {
  const cache = fresh ? `${dir}/t${++n}` : `${dir}/t${n}`;
  if (!local && fresh) onNode(node, dir, `mkdir -p /host/${basename(dir)}/t${n} && chown 1000:1000 /host/${basename(dir)}/t${n}`);
  h = await setup({
    repo: { agents: AGENTS, ...repo },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { ...(local ? {} : { backend: kubeBackend({ nodeCache: cache, ...pinned }) }), ...config },
  });
  return cache;
}

const said = () => h.logger.entries.map((e) => e.message);
const layered = (logs) => logs.filter((m) => m.includes("the checkout layered on the node's base"));

describe("the checkout's base kept once per node (backend.kubernetes.nodeCache)", () => {
  it("the first Implementor on a node makes the base, the next ones layer on it; every patch is the local backend's, byte for byte", { timeout: 400_000 }, async () => {
    await baseSetup({ local: true, repo: { files: EDGE_FILES } });
    const local = await agentRuns(h, 'implementor', EDGE_WORK);
    await h.cleanup();
    const cache = await baseSetup({ repo: { files: EDGE_FILES } });
    const adapter = h.adapter();
    const runs = [];
    for (let i = 0; i < 3; i++) runs.push(await agentRuns(h, 'implementor', EDGE_WORK, { adapter, branchName: `wi-base-${i}` }));
    expect(local.result.patch).toContain('+edited-while-assumed');
    for (const r of runs) {
      expect(r.out[0]).toBe(local.out[0]);
      expect(r.result.patch).toBe(local.result.patch);
    }
    const notes = layered(said());
    expect(notes, said().join('\n')).toHaveLength(3);
    expect(notes[0]).toMatch(/: made here$/);
    expect(notes[1]).toMatch(/: kept on the node$/);
    expect(notes[2]).toMatch(/: kept on the node$/);
    // The later pods received no pack: their preparation names no repository step.
    const prepared = said().filter((m) => m.includes('the pod was prepared in'));
    expect(prepared.filter((m) => m.includes('repository'))).toHaveLength(1);
    // On the node: one base, published under its key.
    const listed = onNode(node, dir, `ls -A /host/${basename(dir)}/${basename(cache)}/bases`).trim().split('\n');
    expect(listed.filter((e) => e.startsWith('.b-')), `the node's bases: ${JSON.stringify(listed)}`).toHaveLength(1);
    expect(listed.filter((e) => /^[0-9a-f]{32}$/.test(e)), `the node's bases: ${JSON.stringify(listed)}`).toHaveLength(1);
    expect(adapterPods()).toEqual([]);
  });

  it("the agent sees neither the node's bases nor their directory, and what it writes or deletes stays in its own layer: the next session's checkout is the commit's", { timeout: 300_000 }, async () => {
    await baseSetup();
    const adapter = h.adapter();
    const probe = [
      'ls -A /workspace; ls -A /workspace/.node 2>&1; ls -A /workspace/.layer 2>&1; true',
      'rm README.md && echo planted > planted.txt && git add -A && git commit -qm vandal && echo committed',
    ];
    const first = await agentRuns(h, 'implementor', probe, { adapter, branchName: 'vandal' });
    const [ls, ...denied] = first.out[0].trim().split('\n');
    // The checkout alone: not the node's directory, not the pod's layer.
    expect(ls).toBe('repo');
    expect(denied.join('\n')).toMatch(/\.node.*No such file or directory[^]*\.layer.*No such file or directory/);
    expect(first.out[1].trim()).toBe('committed');
    expect(first.result.patch).toContain('deleted file mode');
    const second = await agentRuns(h, 'planner', ['ls; git log --oneline | wc -l; git branch --list vandal | wc -l'], { adapter });
    const lines = second.out[0].trim().split('\n');
    expect(lines).toContain('README.md');
    expect(lines).not.toContain('planted.txt');
    expect(lines.slice(-2)).toEqual(['1', '0']);
    expect(layered(said()).at(-1)).toMatch(/: kept on the node$/);
  });

  it('a setup runs once per node and commit: a later Implementor finds its output without running it, and its patch holds only its own work', { timeout: 300_000 }, async () => {
    await baseSetup({ config: { worktreeSetupCommand: ['sh', '-c', 'echo ran >> setup-runs.txt; pwd > setup-cwd.txt; mkdir -p deps && echo dep > deps/lib.txt'] } });
    const adapter = h.adapter();
    const runs = [];
    for (let i = 0; i < 2; i++) runs.push(await agentRuns(h, 'implementor', [`cat setup-runs.txt setup-cwd.txt deps/lib.txt; echo work-${i} > work.txt`], { adapter, branchName: `wi-setup-${i}` }));
    for (const [i, r] of runs.entries()) {
      // Run once, where the checkout is: what it wrote names the checkout's own path.
      expect(r.out[0].trim().split('\n')).toEqual(['ran', '/workspace/repo', 'dep']);
      expect(r.result.patch).toContain(`+work-${i}`);
      expect(r.result.patch).not.toContain('setup-runs.txt');
      expect(r.result.patch).not.toContain('deps/lib.txt');
    }
    expect(layered(said()).map((m) => m.split(': ').at(-1))).toEqual(['made here', 'kept on the node']);
  });

  it("a node directory the pod's user cannot write is no failure: the checkout is made in the pod as without one, and the log says why, once", { timeout: 300_000 }, async () => {
    // Not made beforehand: the kubelet makes it, root's.
    h = await setup({
      repo: { agents: AGENTS },
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      config: { backend: kubeBackend({ nodeCache: `${dir}/root-owned`, ...pinned }) },
    });
    const adapter = h.adapter();
    for (let i = 0; i < 2; i++) {
      const r = await agentRuns(h, 'implementor', [`echo w > w${i}.txt`], { adapter, branchName: `wi-ro-${i}` });
      expect(r.result.patch).toContain(`+++ b/w${i}.txt`);
    }
    const warned = h.logger.entries.filter((e) => e.level === 'warn' && e.message.includes('not kept once on node'));
    expect(warned).toHaveLength(1);
    expect(warned[0].message).toContain('backend.kubernetes.nodeCache');
    expect(warned[0].message).toContain('the node cache is not writable by uid 1000');
    expect(layered(said())).toEqual([]);
  });
});
