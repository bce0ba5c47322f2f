// What one session may use of the host (issue 19, `sandbox.limits`), tried through the addon:
// the real CLI in its real bubblewrap sandbox, and the limits probed by the agent's own Bash
// commands (scripted through the fake Messages API) — bounded probes only: a few thousand
// sleeping processes against a lower limit, a write past a small tmpfs, a memory hog that stops
// at 1.5 GiB against a limit far below it. This host has a writable cgroup v1 hierarchy; the
// rlimit fallback is forced by pointing the engine at a cgroup root without cgroups.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-limits-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { bash, scenario } from './support/fake-api.mjs';
import { agentRuns } from './support/agent-bash.mjs';
import { engineProcess } from './support/engine-process.mjs';
import { rejection, setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
const after = [];
/** Engine processes a test spawned: killed after it whatever happened. */
const engines = [];
afterEach(async () => {
  for (const e of engines.splice(0)) e.kill('SIGKILL');
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

async function limitsSetup(limits) {
  h = await setup({
    repo: { agents: agentsWithTools(['Bash', 'Read', 'Write']) },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { sandbox: { limits } },
  });
  return h;
}

/** A Planner whose model runs each command with Bash, then answers; what each printed. */
async function run(commands) {
  const r = await agentRuns(h, 'planner', commands);
  return { ...r, transcript: readFileSync(r.handle.logFilePath, 'utf8') };
}

/**
 * Host directories of `cgroupLines` (a /proc/<pid>/cgroup): v1 `N:pids:/path` and
 * `N:memory:/path` under their hierarchies, v2 `0::/path` under the unified root.
 */
function cgroupPaths(cgroupLines) {
  const out = [];
  for (const line of cgroupLines.trim().split('\n')) {
    const [, controllers, path] = line.match(/^\d+:([^:]*):(.*)$/) ?? [];
    const list = (controllers ?? '').split(',');
    const base = controllers === '' ? '/sys/fs/cgroup' : ['pids', 'memory'].find((c) => list.includes(c));
    if (base) out.push(join(base === '/sys/fs/cgroup' ? base : `/sys/fs/cgroup/${base}`, path));
  }
  return out;
}

/** The session cgroups that engine process `pid` has now (made beside or below its own). */
function sessionCgroups(pid) {
  const found = new Set();
  for (const own of cgroupPaths(readFileSync(`/proc/${pid}/cgroup`, 'utf8'))) {
    for (const dir of [own, dirname(own)]) {
      if (!existsSync(dir)) continue;
      for (const e of readdirSync(dir)) if (e.startsWith(`claude-runtime-adapter-${pid}-`)) found.add(join(dir, e));
    }
  }
  return [...found];
}

// Forks up to 3,000 sleeping children (each exits within 20 s, and all are killed at the
// end): prints how many started and the errno of the first fork refused.
const FORKS = `python3 -c '
import os, signal, time
kids, err = [], 0
for i in range(3000):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
print(len(kids), err)
'`;

// Grows by 16 MiB steps up to 1.5 GiB (touched, so resident), then holds it for 10 s.
const HOG = `python3 -c '
import time
x = []
for i in range(96):
    x.append(b"x" * (16 << 20))
time.sleep(10)
print("survived")
'`;

describe('sandbox.limits, enforced by the kernel', () => {
  it('processes: thousands of sleeping processes against processes: 200 — forks beyond it fail with EAGAIN, the session goes on and settles; the transcript names the cgroup and the limit hit; the cgroup is gone after', async () => {
    await limitsSetup({ processes: 200 });
    const { result, out, transcript } = await run([FORKS, 'echo still-here', 'cat /proc/self/cgroup']);
    const [started, errno] = out[0].trim().split(' ').map(Number);
    expect(errno, out[0]).toBe(11); // EAGAIN
    expect(started).toBeGreaterThan(50); // the CLI and its bridges count too
    expect(started).toBeLessThan(200);
    expect(out[1]).toBe('still-here');
    expect(result.create).toEqual([]);
    expect(transcript).toMatch(/\[sandbox\] .*limits by cgroup v[12] .*200 tasks/);
    expect(transcript).toMatch(/\[limits\] the session reached its process limit \(sandbox\.limits\.processes = 200\): \d+ fork\(s\) refused/);
    // The agent's command ran in the session's cgroup (every controller of it), gone now.
    const inside = cgroupPaths(out[2]).filter((p) => p.includes(`/claude-runtime-adapter-${process.pid}-`));
    expect(inside.length, out[2]).toBeGreaterThan(0);
    expect(inside.filter(existsSync)).toEqual([]);
    expect(sessionCgroups(process.pid)).toEqual([]);
  });

  it('tmpfs: a write past tmpMiB: 8 fails with ENOSPC on /tmp, HOME and /dev/shm; /dev takes no files; the session goes on and settles', async () => {
    await limitsSetup({ tmpMiB: 8 });
    // The CLI keeps a command's output in /tmp: while a tmpfs is full, the report waits in
    // another one.
    const write = (dir, report) =>
      `{ head -c 20M /dev/zero > ${dir}/big; echo "rc=$?"; stat -c %s ${dir}/big; } > ${report}/report 2>&1; rm ${dir}/big; cat ${report}/report; echo ok > ${dir}/small && cat ${dir}/small`;
    const { result, out } = await run([write('/tmp', '/dev/shm'), write('"$HOME"', '/dev/shm'), write('/dev/shm', '/tmp'), 'touch /dev/x 2>&1; echo "rc=$?"']);
    for (const o of out.slice(0, 3)) {
      expect(o).toContain('No space left on device');
      const [, rc, size, ok] = o.match(/rc=(\d+)\n(\d+)\n(ok)$/) ?? [];
      expect(rc, o).toBe('1');
      expect(Number(size)).toBeLessThanOrEqual(8 * 1024 * 1024);
      expect(ok).toBe('ok');
    }
    expect(out[3]).toMatch(/Read-only file system\nrc=1$/);
    expect(result.create).toEqual([]);
  });

  it('memory: a hog against memoryMiB: 768 is killed, the session ends with ERR_RESOURCE_LIMIT naming the limit, the host is unharmed and nothing is left', async () => {
    await limitsSetup({ memoryMiB: 768 });
    h.api.setScript(scenario.steps([bash(`${HOG}; echo "rc=$?"`), bash('echo after'), ROLES.planner.done]));
    const handle = await h.adapter().startAgent(ROLES.planner.params());
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_RESOURCE_LIMIT');
    expect(err.message).toMatch(/^\[ERR_RESOURCE_LIMIT\] the session reached its memory limit \(sandbox\.limits\.memoryMiB = 768\)/);
    const transcript = readFileSync(handle.logFilePath, 'utf8');
    expect(transcript).toMatch(/\[limits\] the session reached its memory limit/);
    expect(transcript).toMatch(/\[sandbox\] .*memory 768 MiB/);
    expect(sessionCgroups(process.pid)).toEqual([]);
    const failed = h.logger.entries.find((e) => e.message === 'agent session failed');
    expect(failed.data.code).toBe('ERR_RESOURCE_LIMIT');
  });

  it('no usable cgroup (the engine pointed at a cgroup root without one): rlimits apply — an allocation past memoryMiB fails in the process while the session goes on — and the transcript and a logger warning say so', async () => {
    const root = mkdtempSync(join(process.env.TMPDIR, 'no-cgroups-'));
    process.env.CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT = root;
    after.push(() => {
      delete process.env.CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT;
      rmSync(root, { recursive: true, force: true });
    });
    await limitsSetup({ memoryMiB: 1024, processes: 200 });
    // RLIMIT_NPROC counts every task of the user id and does not bind uid 0 at all (the kernel
    // exempts root): only a non-root engine can see its forks refused.
    const root0 = process.getuid() === 0;
    const { result, out, transcript } = await run([
      'grep -E "^Max (data size|processes)" /proc/self/limits',
      `${HOG}; echo "rc=$?"`,
      root0 ? 'echo 0 11' : FORKS,
      'echo still-here',
    ]);
    expect(out[0]).toMatch(/^Max data size +1073741824 +1073741824 +bytes/m);
    expect(out[0]).toMatch(/^Max processes +\d+ +\d+ +processes/m);
    expect(out[1]).toMatch(/MemoryError[^]*rc=1$/);
    const [started, errno] = out[2].trim().split(' ').map(Number);
    expect(errno, out[2]).toBe(11);
    expect(started).toBeLessThan(3000);
    expect(out[3]).toBe('still-here');
    expect(result.create).toEqual([]);
    expect(transcript).toMatch(/\[sandbox\] .*limits by rlimits \(no usable cgroup\): memory 1024 MiB per process \(RLIMIT_DATA\), 200 tasks more for the user id \(RLIMIT_NPROC\); 1024 MiB per tmpfs/);
    const warning = h.logger.entries.find((e) => /no usable cgroup/.test(e.message));
    expect(warning.level).toBe('warn');
  });

  it('an engine killed mid-session leaves an empty cgroup (its sandbox died with it), which the next session removes', async () => {
    await limitsSetup({ processes: 200 });
    h.api.setScript(scenario.steps([bash(`echo waiting; sleep 30.${Date.now() % 1000}`), { hang: true }]));
    const { engine, log } = await engineProcess(h, { role: 'planner', specPaths: [] }, engines);
    expect(readFileSync(log, 'utf8')).toMatch(/\[sandbox\] .*limits by cgroup v[12] /);
    const cgroups = sessionCgroups(engine.pid);
    expect(cgroups.length).toBeGreaterThan(0);
    // A removed cgroup holds no process. (Any adapter's next session removes a dead engine's
    // leftovers, so another test file's session running meanwhile may remove them first.)
    const procs = () => cgroups.filter(existsSync).flatMap((c) => readFileSync(join(c, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean));
    const cmdline = (pid) => (existsSync(`/proc/${pid}/cmdline`) ? readFileSync(`/proc/${pid}/cmdline`, 'utf8') : '');
    // The agent's command is running (bwrap, its bridges, the CLI, sh, sleep).
    for (let i = 0; i < 400 && !procs().some((p) => cmdline(p).startsWith('sleep')); i++) await new Promise((r) => setTimeout(r, 25));
    expect(procs().some((p) => cmdline(p).startsWith('sleep'))).toBe(true);
    engine.kill('SIGKILL');
    await new Promise((r) => engine.on('exit', r));
    for (let i = 0; i < 200 && procs().length > 0; i++) await new Promise((r) => setTimeout(r, 25));
    expect(procs()).toEqual([]);

    h.api.setScript(scenario.steps([ROLES.planner.done]));
    await (await h.adapter().startAgent(ROLES.planner.params())).result;
    expect(cgroups.filter(existsSync)).toEqual([]);
  });
});
