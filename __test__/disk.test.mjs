// What a session may write on the engine's disk (issue 52, `sandbox.limits.diskMiB` and
// `diskFloorMiB`), tried through the addon: the real CLI in its real sandbox, the agent's own
// Bash command writing far past the bound (scripted through the fake Messages API), and the
// host's free space sampled from outside with statfs while it writes.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, userText } from './support/fake-api.mjs';
import { engineState, rejection, setup } from './support/harness.mjs';
import { implementorDone } from './support/roles.mjs';

const MIB = 1024 * 1024;

let h;
const after = [];
afterEach(async () => {
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

const state = engineState({
  workItems: [
    { id: '1', title: 'Fill the disk', status: 'in-progress', linkedRevision: null },
    { id: '2', title: 'Write a little', status: 'in-progress', linkedRevision: null },
  ],
});
/** The work items' bodies tell the two sessions' requests apart. */
const bodies = { 1: 'FILLER-TASK', 2: 'CALM-TASK' };
const params = (id) => ({ role: 'implementor', workItemID: id, branchName: `wi-${id}` });

/** Free bytes of the filesystem holding `path`, as a non-root writer sees it. */
const free = (path) => {
  const s = statfsSync(path);
  return s.bavail * s.bsize;
};

/** Samples `free(path)` every 10 ms until `stop()`; `least` is the lowest seen. */
function sampleFree(path) {
  const s = { least: free(path) };
  const timer = setInterval(() => {
    s.least = Math.min(s.least, free(path));
  }, 10);
  s.stop = () => clearInterval(timer);
  return s;
}

/** Live processes whose command line carries `marker`. */
function running(marker) {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker) && readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] !== 'Z';
      } catch {
        return false;
      }
    });
}

/**
 * A tmpfs of `mib` MiB holding the test's repository, its checkouts and the adapter's temp dirs
 * (`TMPDIR`) from now to the test's end: its free space is the test's alone (the machine's disk
 * is shared with whatever else runs), sampled from outside as the engine's disk would be.
 */
function smallFilesystem(mib) {
  const mnt = `/var/tmp/cra-fs-${process.pid}-${Date.now() % 1e6}`;
  mkdirSync(mnt, { recursive: true });
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${mib}m`, 'tmpfs', mnt]);
  const tmp = process.env.TMPDIR;
  process.env.TMPDIR = mnt;
  after.push(() => {
    if (tmp === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = tmp;
    execFileSync('umount', ['-l', mnt]);
    rmSync(mnt, { recursive: true, force: true });
  });
  return mnt;
}

/** `count` files of `mib` MiB in `dir` (a shell expression), each named after `marker`. */
const writes = (dir, marker, count, mib, pause = 0) =>
  `for i in $(seq ${count}); do dd if=/dev/zero of="${dir}/${marker}-$i" bs=1M count=${mib} status=none || exit 1; ${pause ? `sleep ${pause};` : ''} done; echo "finished-$i"`;

describe('a disk bound per session (sandbox.limits.diskMiB)', () => {
  for (const [where, dir] of [
    ['its checkout', '.'],
    ["the CLI's config dir", '$CLAUDE_CONFIG_DIR'],
  ]) {
    it(`diskMiB: 128, the agent writes 512 MiB into ${where}: the host's free space never drops by more than the bound and 256 MiB, the session settles ERR_RESOURCE_LIMIT naming the limit and what it wrote, nothing of it is left running, and an Implementor beside it finishes`, { timeout: 60_000 }, async () => {
      const marker = `cra-writer-${process.pid}-${Date.now()}`;
      const filler = scenario.steps([bash(writes(dir, marker, 16, 32)), implementorDone()]);
      const calm = scenario.steps([bash('echo fine > calm.txt'), implementorDone('calm')]);
      smallFilesystem(768);
      h = await setup({
        script: (body) => (userText(body).includes('CALM-TASK') ? calm(body) : filler(body)),
        state,
        bodies,
        // The floor is another test's (the default's 2 GiB is more than this filesystem).
        config: { sandbox: { limits: { diskMiB: 128, diskFloorMiB: 0 } } },
      });
      const before = free(h.repo.root);
      const sampled = sampleFree(h.repo.root);
      after.push(() => sampled.stop());
      const adapter = h.adapter();
      const started = Date.now();
      const [fill, beside] = await Promise.all([adapter.startAgent(params('1')), adapter.startAgent(params('2'))]);
      const err = await rejection(fill.result);
      const settled = Date.now() - started;
      sampled.stop();
      if (process.env.CRA_DISK_FIGURES) console.log('FIGURES', where, err.message, `lost ${((before - sampled.least) / MIB).toFixed(0)} MiB`, `settled ${settled} ms`);
      expect(err.code).toBe('ERR_RESOURCE_LIMIT');
      expect(err.message).toMatch(/the session wrote \d+ MiB on disk, past sandbox\.limits\.diskMiB \(128 MiB\)/);
      expect(settled).toBeLessThan(30_000);
      // It stops some tens of MiB past the bound; a machine loaded many times over (load 18
      // on 2 cores) delays the watch's look, and a writer at 2 GB/s goes on meanwhile.
      expect(before - sampled.least).toBeLessThan(384 * MIB);
      expect(running(marker)).toEqual([]);
      const log = readFileSync(fill.logFilePath, 'utf8');
      expect(log).toContain('disk 128 MiB (RLIMIT_FSIZE per file');
      expect(log).toMatch(/\[limits\] the session wrote \d+ MiB on disk/);
      const result = await beside.result;
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('calm.txt');
      // The stopped session's checkout is gone with its files.
      expect(free(h.repo.root)).toBeGreaterThan(before - 128 * MIB);
    });
  }

  it('ordinary work under a generous bound is untouched: a command writing 128 MiB with diskMiB: 1024 gets its result and its patch', { timeout: 60_000 }, async () => {
    h = await setup({
      script: scenario.steps([bash('head -c 128M /dev/zero > data.bin && echo small > small.txt'), implementorDone()]),
      state,
      bodies,
      config: { sandbox: { limits: { diskMiB: 1024 } } },
    });
    const handle = await h.adapter().startAgent(params('1'));
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('small.txt');
  });
});

describe('a floor the engine\'s filesystem never goes under (sandbox.limits.diskFloorMiB)', () => {
  it('on a 512 MiB filesystem with a floor of 256 MiB: a session writing toward it is stopped before the filesystem fills, ERR_RESOURCE_LIMIT naming the floor; below the floor a new session is refused at startAgent before anything is provisioned', { timeout: 90_000 }, async () => {
    const mnt = smallFilesystem(512);
    const marker = `cra-floor-${process.pid}-${Date.now()}`;
    h = await setup({
      // 40 × 8 MiB, paced: more than the filesystem has above the floor.
      script: scenario.steps([bash(writes('.', marker, 40, 8, 0.05)), implementorDone()]),
      state,
      bodies,
      config: { sandbox: { limits: { diskFloorMiB: 256 } } },
    });
    expect(free(mnt)).toBeGreaterThan(400 * MIB);
    const sampled = sampleFree(mnt);
    after.push(() => sampled.stop());
    const adapter = h.adapter();
    const handle = await adapter.startAgent(params('1'));
    const err = await rejection(handle.result);
    sampled.stop();
    if (process.env.CRA_DISK_FIGURES) console.log('FIGURES floor', err.message, `least free ${(sampled.least / MIB).toFixed(0)} MiB`);
    expect(err.code).toBe('ERR_RESOURCE_LIMIT');
    expect(err.message).toMatch(/the engine's filesystem \(.*\) has \d+ MiB free, below its floor of 256 MiB \(sandbox\.limits\.diskFloorMiB\): of the sessions writing there, this one wrote the most \(\d+ MiB\) and was stopped/);
    // Stopped before the filesystem filled (the agent's writes would have taken it to 0).
    expect(sampled.least).toBeGreaterThan(64 * MIB);
    expect(readFileSync(handle.logFilePath, 'utf8')).not.toContain('finished-40');
    expect(running(marker)).toEqual([]);
    // Below the floor (a file of the host's takes it there), startAgent refuses at once.
    writeFileSync(join(mnt, 'host-file'), Buffer.alloc(free(mnt) - 128 * MIB));
    const worktrees = join(h.repo.root, '.worktrees');
    const before = existsSync(worktrees) ? readdirSync(worktrees) : [];
    const refused = await rejection(adapter.startAgent(params('2')));
    expect(refused.code).toBe('ERR_RESOURCE_LIMIT');
    expect(refused.message).toMatch(/has \d+ MiB free, below its floor of 256 MiB \(sandbox\.limits\.diskFloorMiB\): no session starts until more is free/);
    expect(existsSync(worktrees) ? readdirSync(worktrees) : []).toEqual(before);
  });
});
