// Issue 37: the checkout's base kept once per node (backend.kubernetes.nodeCache). The first
// sandboxed pod on a node makes it (the commit checked out, the setup run, the snapshot taken)
// in the node's directory; later pods of the same commit, setup and image layer their checkout
// on it (an overlay mounted only inside the pod's jail) and receive no pack. Real cluster, real
// CLI, the fake API on the engine.
import { basename } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { setup } from '../support/harness.mjs';
import { scenario } from '../support/fake-api.mjs';
import { pooled, racyCases, RACY_CHANGE, RACY_REPO } from '../support/racy-edits.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from '../support/roles.mjs';
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
const readFromLayer = (logs) => logs.filter((m) => m.includes('staged from the layer'));
const wholeCheckout = (logs) => logs.filter((m) => m.includes('cra-pod candidates: the whole checkout is staged'));

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

  it("a setup runs once per node and commit: a later Implementor finds its output without running it, and its patch holds only its own work, byte for byte the local backend's; each end reads only what the layer changed", { timeout: 300_000 }, async () => {
    // The setup changes a tracked file and leaves untracked output: the snapshot holds both,
    // the base's index neither, and the patch neither (each end verified against the local one).
    const setupCommand = ['sh', '-c', 'echo ran >> setup-runs.txt; pwd > setup-cwd.txt; mkdir -p deps && echo dep > deps/lib.txt; echo setup >> README.md'];
    const work = ['cat setup-runs.txt setup-cwd.txt deps/lib.txt; echo work > work.txt'];
    await baseSetup({ local: true, config: { worktreeSetupCommand: setupCommand } });
    const local = await agentRuns(h, 'implementor', work);
    await h.cleanup();
    await baseSetup({ config: { worktreeSetupCommand: setupCommand } });
    const adapter = h.adapter();
    const runs = [];
    for (let i = 0; i < 2; i++) runs.push(await agentRuns(h, 'implementor', work, { adapter, branchName: `wi-setup-${i}` }));
    expect(local.result.patch).toContain('+work');
    for (const r of runs) {
      // Run once, where the checkout is: what it wrote names the checkout's own path.
      expect(r.out[0].trim().split('\n').slice(0, 3)).toEqual(['ran', '/workspace/repo', 'dep']);
      expect(r.result.patch).toBe(local.result.patch);
      expect(r.result.patch).not.toContain('setup-runs.txt');
      expect(r.result.patch).not.toContain('deps/lib.txt');
      expect(r.result.patch).not.toContain('README.md');
    }
    expect(layered(said()).map((m) => m.split(': ').at(-1))).toEqual(['made here', 'kept on the node']);
    expect(readFromLayer(said()), said().join('\n')).toHaveLength(2);
  });

  it("a setup that stages into the base's index leaves it unverified: each end stages the whole checkout, and the patch is the local backend's, byte for byte", { timeout: 300_000 }, async () => {
    // Its index is then not the commit's, nor the snapshot's: a path the agent does not touch
    // would end as the index has it, where the whole staging ends it as the snapshot has it.
    const setupCommand = ['sh', '-c', 'mkdir -p deps && echo dep > deps/lib.txt && git add deps/lib.txt && echo more >> deps/lib.txt'];
    const work = ['echo work > work.txt'];
    await baseSetup({ local: true, config: { worktreeSetupCommand: setupCommand } });
    const local = await agentRuns(h, 'implementor', work);
    await h.cleanup();
    await baseSetup({ config: { worktreeSetupCommand: setupCommand } });
    const adapter = h.adapter();
    for (let i = 0; i < 2; i++) {
      const r = await agentRuns(h, 'implementor', work, { adapter, branchName: `wi-staged-${i}` });
      expect(r.result.patch).toBe(local.result.patch);
    }
    expect(local.result.patch).toContain('+work');
    expect(local.result.patch).not.toContain('deps/lib.txt');
    expect(said().filter((m) => m.includes("the node's base is not verified"))).toHaveLength(1);
    expect(readFromLayer(said())).toEqual([]);
    expect(layered(said())).toHaveLength(2);
  });

  // The end of a session on the node's base reads only what its layer changed (cra-pod
  // candidates): every same-size edit case, on a base made in the second before (its entries
  // racily clean), as local patches byte for byte; the log says which end each took.
  for (const [name, calls, runs] of racyCases()) {
    const handled = !name.includes('assume-unchanged');
    it(`${name}: ${runs} of ${runs} Implementors on the node's base return the local backend's patch, byte for byte, ${handled ? 'their end reading only what the layer changed' : 'their end staging the whole checkout (git obeys the mark whatever the file holds)'}`, { timeout: 120_000 + runs * 15_000 }, async () => {
      await baseSetup({ local: true, repo: RACY_REPO });
      const local = await agentRuns(h, 'implementor', calls(`${h.repo.root}/.worktrees/racy-local`), { branchName: 'racy-local' });
      expect(local.result.patch).toContain(RACY_CHANGE);
      await h.cleanup();
      await baseSetup({ repo: RACY_REPO });
      h.api.setScript(scenario.steps([...calls('/workspace/repo'), ROLES.implementor.done]));
      const adapter = h.adapter();
      const differ = [];
      const run = async (i) => {
        try {
          const result = await (await adapter.startAgent(ROLES.implementor.params(`base-racy-${i}`))).result;
          if (result.patch !== local.result.patch) differ.push(`run ${i}: ${result.patch}`);
        } catch (e) {
          differ.push(`run ${i}: ${e.code} ${e.message}`);
        }
      };
      // The first makes the base; the others layer on it, 4 at a time.
      await run(0);
      await pooled(runs - 1, 4, (i) => run(i + 1));
      expect(differ).toEqual([]);
      expect(layered(said())).toHaveLength(runs);
      const ends = handled ? readFromLayer(said()) : wholeCheckout(said());
      expect(ends, said().join('\n')).toHaveLength(runs);
      expect(said().filter((m) => m.includes('staging the candidates failed'))).toEqual([]);
      expect(adapter.sessions()).toEqual([]);
    });
  }

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
