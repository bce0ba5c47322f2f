// What one session may use of the host (issue 19, `sandbox.limits`), tried through the addon:
// the real CLI in its real bubblewrap sandbox, and the limits probed by the agent's own Bash
// commands (scripted through the fake Messages API) — bounded probes only: a few thousand
// sleeping processes against a lower limit, a write past a small tmpfs, a memory hog that stops
// at 1.5 GiB against a limit far below it. This host has a writable cgroup v1 hierarchy; the
// rlimit fallback is forced by pointing the engine at a cgroup root without cgroups.
// Issue 26: the agent's commands run under a share of those limits of their own, so that one
// busy command (forks, memory) fails as it would in a person's shell while the CLI keeps its
// headroom and the session goes on to its result; only the CLI itself out of memory ends it.
// Issue 36: nothing inside can put another process (the CLI) under that share, and what the CLI
// starts itself (its ripgrep) is under it too.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';

process.env.TMPDIR = '/var/tmp/cra-limits-tests';
mkdirSync(process.env.TMPDIR, { recursive: true });
import { bash, scenario, toolResults, toolUse } from './support/fake-api.mjs';
import { agentRuns } from './support/agent-bash.mjs';
import { engineProcess, killAll } from './support/engine-process.mjs';
import { addon, rejection, setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

let h;
const after = [];
/** Engine processes a test spawned: killed after it whatever happened. */
const engines = [];
afterEach(async () => {
  killAll(engines);
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

// Forks up to `n` sleeping children (each exits within 20 s, and all are killed at the end):
// prints how many started and the errno of the first fork refused (0: none was).
const forks = (n) => `python3 -c '
import os, signal, time
kids, err = [], 0
for i in range(${n}):
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
const FORKS = forks(3000);

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
  it('processes: thousands of sleeping processes against processes: 200 — the command\'s forks beyond its share (136) fail with EAGAIN, the next command runs, the session settles; the transcript names the cgroup and the commands\' limit; the cgroup is gone after', async () => {
    await limitsSetup({ processes: 200 });
    const { result, out, transcript } = await run([FORKS, 'echo still-here', 'cat /proc/self/cgroup']);
    const [started, errno] = out[0].trim().split(' ').map(Number);
    expect(errno, out[0]).toBe(11); // EAGAIN
    expect(started).toBeGreaterThan(50);
    expect(started).toBeLessThan(136);
    expect(out[1]).toBe('still-here');
    expect(result.create).toEqual([]);
    expect(transcript).toMatch(/\[sandbox\] .*limits by cgroup v[12] .*200 tasks \(the agent's commands: memory \d+ MiB, 136 tasks\)/);
    expect(transcript).toMatch(/\[limits\] the agent's commands reached their process limit \(136 of sandbox\.limits\.processes = 200, the rest kept for the CLI\): \d+ fork\(s\) refused/);
    expect(transcript).not.toMatch(/the session reached its process limit/);
    // The agent's command ran in the commands' cgroup of the session (every controller), gone now.
    const inside = cgroupPaths(out[2]).filter((p) => p.includes(`/claude-runtime-adapter-${process.pid}-`));
    expect(inside.length, out[2]).toBeGreaterThan(0);
    for (const p of inside) expect(p).toMatch(/\/tools$/);
    expect(inside.filter(existsSync)).toEqual([]);
    expect(sessionCgroups(process.pid)).toEqual([]);
  });

  it('6,000 background sleeps under the default limits (1,024 tasks): the command reports its refused fork, the next command runs while they still sleep, the session resolves with its result', async () => {
    await limitsSetup({});
    const spawnAll = "sh -c 'i=0; while [ $i -lt 6000 ]; do sleep 60 & i=$((i+1)); done; echo all-started' 2>&1; echo rc=$?";
    // While the sleeps hold the commands' share (768 of 1,024 tasks) a command that forks fails
    // the same way; one of shell builtins runs, and the CLI answers.
    const { result, out, transcript } = await run([spawnAll, 'echo still-here']);
    expect(out[0]).toMatch(/Cannot fork/);
    expect(out[0]).not.toMatch(/all-started/);
    expect(out[1]).toBe('still-here');
    expect(result.create).toEqual([]);
    expect(transcript).toMatch(/\[limits\] the agent's commands reached their process limit \(768 of sandbox\.limits\.processes = 1024/);
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

  it('memory: a hog in one command against memoryMiB: 768 is killed (its share: 384 MiB), the next command runs, the session resolves; the transcript says so; nothing is left', async () => {
    await limitsSetup({ memoryMiB: 768 });
    const { result, out, transcript } = await run([`${HOG}; echo "rc=$?"`, 'echo after']);
    expect(out[0]).toMatch(/Killed[^]*rc=137$/);
    expect(out[0]).not.toMatch(/^survived$/m);
    expect(out[1]).toBe('after');
    expect(result.create).toEqual([]);
    expect(transcript).toMatch(/\[sandbox\] .*memory 768 MiB.*\(the agent's commands: memory 384 MiB/);
    expect(transcript).toMatch(/\[limits\] the kernel killed 1 process\(es\) of the agent's commands for memory \(their share: 384 MiB of sandbox\.limits\.memoryMiB = 768\); the session went on/);
    expect(sessionCgroups(process.pid)).toEqual([]);
  });

  it('memory: the CLI itself past the session\'s memoryMiB: 768 ends the session with ERR_RESOURCE_LIMIT naming the limit, and nothing is left (a CLI that grows: the fake CLI)', async () => {
    await limitsSetup({ memoryMiB: 768 });
    const fakeCli = fileURLToPath(new URL('./support/fake-cli.mjs', import.meta.url));
    const adapter = addon.createClaudeAdapter({ ...h.config, claudeExecutable: fakeCli, env: { ...h.config.env, FAKE_CLI_MODE: 'memory-hog' } }, h.deps);
    const handle = await adapter.startAgent(ROLES.planner.params());
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_RESOURCE_LIMIT');
    expect(err.message).toMatch(/^\[ERR_RESOURCE_LIMIT\] the session reached its memory limit \(sandbox\.limits\.memoryMiB = 768\)/);
    expect(readFileSync(handle.logFilePath, 'utf8')).toMatch(/\[limits\] the session reached its memory limit/);
    expect(sessionCgroups(process.pid)).toEqual([]);
    const failed = h.logger.entries.find((e) => e.message === 'agent session failed');
    expect(failed.data.code).toBe('ERR_RESOURCE_LIMIT');
  });

  // RLIMIT_NPROC does not bind a process whose real user is the host's root (fork(2) exempts
  // it, in the sandbox's user namespace too): an engine running as root (as CI's does) has no
  // process limit at all without a cgroup, and the adapter must say so rather than name one.
  // Which half runs follows the engine's user (root in a user namespace of its own, as in a
  // rootless container, is held to RLIMIT_NPROC like any user); the kernel's side of it is
  // checked either way by the Rust test `rlimit_nproc_stops_a_fork_exactly_when_nproc_binds_says_it_does`.
  const asRoot = process.getuid() === 0 && /^\s*0\s+0\s+\d+/m.test(readFileSync('/proc/self/uid_map', 'utf8'));
  it(`no usable cgroup (the engine pointed at a cgroup root without one): rlimits apply — an allocation past memoryMiB fails in the process while the session goes on — and ${asRoot ? "as root (this engine) no process limit does: 400 forks of a command go through where the session's limit is 200, and the transcript and a logger warning say that no process limit applies" : "the commands' forks stop at their share of processes (RLIMIT_NPROC in the sandbox's user namespace), and the transcript and a logger warning say so"}`, async () => {
    const root = mkdtempSync(join(process.env.TMPDIR, 'no-cgroups-'));
    process.env.CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT = root;
    after.push(() => {
      delete process.env.CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT;
      rmSync(root, { recursive: true, force: true });
    });
    await limitsSetup({ memoryMiB: 1024, processes: 200 });
    const { result, out, transcript } = await run([
      'grep -E "^Max (data size|processes)" /proc/self/limits',
      `${HOG}; echo "rc=$?"`,
      // As root: twice the session's whole limit, bounded (3,000 would be too, but 400 say it).
      asRoot ? forks(400) : FORKS,
      'echo still-here',
    ]);
    expect(out[0]).toMatch(/^Max data size +1073741824 +1073741824 +bytes/m);
    // The commands' share of 200 is set either way (the sandbox's user namespace counts its own
    // tasks, root's too); only for a user other than root does the kernel hold to it.
    expect(out[0]).toMatch(/^Max processes +136 +136 +processes/m);
    expect(out[1]).toMatch(/MemoryError[^]*rc=1$/);
    const [started, errno] = out[2].trim().split(' ').map(Number);
    expect(out[3]).toBe('still-here');
    expect(result.create).toEqual([]);
    const warning = h.logger.entries.find((e) => /no usable cgroup/.test(e.message));
    expect(warning.level).toBe('warn');
    if (asRoot) {
      // Not one fork refused, past the commands' 136 and the session's 200.
      expect([started, errno], out[2]).toEqual([400, 0]);
      expect(transcript).toMatch(/\[sandbox\] .*limits by rlimits \(no usable cgroup\): memory 1024 MiB per process \(RLIMIT_DATA\), no process limit \(the engine runs as root, which RLIMIT_NPROC does not bind: 200 tasks asked\); 1024 MiB per tmpfs/);
      expect(transcript).not.toMatch(/tasks more for the user id/);
      expect(transcript).toMatch(/\[limits\] no process limit applies \(sandbox\.limits\.processes = 200\), to the session or to the agent's commands: there is no usable cgroup and the engine runs as root, which the kernel exempts from RLIMIT_NPROC/);
      expect(warning.message).toMatch(/its memory limit is an rlimit \(per process\), and no process limit applies \(sandbox\.limits\.processes = 200\).*runs as root/);
    } else {
      expect(errno, out[2]).toBe(11);
      expect(started).toBeLessThan(136);
      expect(transcript).toMatch(/\[sandbox\] .*limits by rlimits \(no usable cgroup\): memory 1024 MiB per process \(RLIMIT_DATA\), 200 tasks more for the user id \(RLIMIT_NPROC\) \(the agent's commands: 136 tasks in the sandbox, RLIMIT_NPROC\); 1024 MiB per tmpfs/);
      expect(transcript).not.toMatch(/no process limit/);
      expect(warning.message).toMatch(/its memory and process limits are rlimits/);
    }
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
    const procs = () => cgroups.flatMap((c) => [c, join(c, 'cli'), join(c, 'tools')]).flatMap(pidsIn);
    const cmdline = (pid) => (existsSync(`/proc/${pid}/cmdline`) ? readFileSync(`/proc/${pid}/cmdline`, 'utf8') : '');
    // The agent's command is running (bwrap, its bridges, the CLI, sh, sleep). Bounded well
    // inside the test's minute: CI runs this file beside an image build, where the sandboxed
    // CLI took over 10 s to reach its first command.
    const sleeping = await until(() => procs().some((p) => cmdline(p).startsWith('sleep')), 40_000);
    expect(sleeping, `no sleep in the session's cgroups; its log:\n${readFileSync(log, 'utf8').slice(-3000)}`).toBe(true);
    engine.kill('SIGKILL');
    await new Promise((r) => engine.on('exit', r));
    await until(() => procs().length === 0, 10_000);
    expect(procs()).toEqual([]);

    h.api.setScript(scenario.steps([ROLES.planner.done]));
    await (await h.adapter().startAgent(ROLES.planner.params())).result;
    expect(cgroups.filter(existsSync)).toEqual([]);
  }, 90_000);
});

/**
 * The pids in cgroup `dir`; none when it is gone. Another test file's session may remove a dead
 * engine's cgroup between any look and the read (CI saw ENOENT after an existsSync).
 */
function pidsIn(dir) {
  try {
    return readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean);
  } catch (e) {
    if (e.code === 'ENOENT' || e.code === 'ENODEV') return [];
    throw e;
  }
}

/** Polls `check` every 25 ms, up to `ms`; its last value. */
async function until(check, ms = 15000) {
  let v;
  for (let t = 0; t < ms && !(v = check()); t += 25) await new Promise((r) => setTimeout(r, 25));
  return v;
}

const cmdlineOf = (pid) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  } catch {
    return [];
  }
};

/**
 * The processes of this engine's session now, from the host: per part (`cli`, `tools`) of every
 * hierarchy, its pids.
 */
function sessionParts() {
  const parts = [];
  for (const dir of sessionCgroups(process.pid)) {
    for (const part of ['cli', 'tools']) {
      if (existsSync(join(dir, part))) parts.push({ dir, part, pids: pidsIn(join(dir, part)) });
    }
  }
  return parts;
}

/** The parts (`cli` / `tools`, one per hierarchy) the first process matching `is` is in. */
function partsOf(is) {
  const parts = sessionParts();
  const pid = parts.flatMap((p) => p.pids).find((p) => is(cmdlineOf(p)));
  return pid && { pid, parts: parts.filter((p) => p.pids.includes(pid)).map((p) => p.part) };
}

const isCli = (argv) => /\/claude$/.test(argv[0] ?? '') && argv.includes('--output-format');

describe("the commands' share is the engine's to give (issue 36)", () => {
  // The CLI's pid inside, written everywhere a command may write in the socket directory and
  // the cgroup filesystem (on the host's cgroup.procs a write moves the pid named, as it is in
  // the writer's namespace); a bridge's too.
  const ATTACK = [
    'cli=; for p in /proc/[0-9]*; do case $(tr "\\0" "\\n" < $p/cmdline 2>/dev/null | head -n 1) in */claude) cli=${p#/proc/}; break ;; esac; done',
    'bridge=$(pgrep -o socat)',
    'echo "cli=$cli bridge=$bridge"',
    'for f in /run/claude-runtime-adapter/* /sys/fs/cgroup/*/*/tools/cgroup.procs /sys/fs/cgroup/*/tools/cgroup.procs /sys/fs/cgroup/*/*/*/*/tools/cgroup.procs; do for pid in $cli $bridge; do echo "$pid" 2>/dev/null > "$f" && echo "wrote $pid to $f"; done; done',
    'sleep 0.3; grep -E "pids|^0::" /proc/$cli/cgroup',
  ].join('\n');

  it("a command that writes the CLI's pid (and a bridge's) into everything it can write leaves them in the CLI's part; the next command runs in the commands' part, as the host's cgroup files show", async () => {
    await limitsSetup({ processes: 200 });
    const done = run([ATTACK, 'sleep 3; echo slept']);
    // The attack's output reached the model: the next command (sleep 3) is running now.
    const attacked = await until(() => toolResults(h.api.mainBodies().at(-1)).length >= 1);
    expect(attacked).toBe(true);
    await new Promise((r) => setTimeout(r, 300));
    const cli = partsOf(isCli);
    const bridges = sessionParts()
      .flatMap((p) => p.pids)
      .filter((p) => cmdlineOf(p)[0] === 'socat');
    const sleeping = partsOf((argv) => argv[0] === 'sleep' && argv[1] === '3');
    const { out, result } = await done;
    expect(out[0], out[0]).toMatch(/^cli=\d+ bridge=\d+$/m);
    expect(out[0], out[0]).toMatch(/^wrote \d+ to \/run\/claude-runtime-adapter\//m);
    // From the host: the CLI and the bridges in the CLI's part of every hierarchy, the
    // command in the commands' part.
    expect(cli?.parts, out[0]).toEqual(expect.arrayContaining(['cli']));
    expect(cli.parts, out[0]).not.toContain('tools');
    expect(bridges.length).toBeGreaterThanOrEqual(2);
    for (const b of bridges) for (const p of sessionParts()) if (p.pids.includes(b)) expect(p.part, out[0]).toBe('cli');
    expect(sleeping?.parts.length).toBeGreaterThan(0);
    expect(new Set(sleeping.parts)).toEqual(new Set(['tools']));
    expect(out[1]).toBe('slept');
    expect(result.create).toEqual([]);
  });

  it("ripgrep that the CLI runs itself (its Grep tool) is in the commands' part: the host's cgroup files show it there while it searches", async () => {
    // A tree big enough for ripgrep to be seen at work (about 100 MB of text).
    const dir = mkdtempSync(join(process.env.TMPDIR, 'grep-tree-'));
    after.push(() => rmSync(dir, { recursive: true, force: true }));
    const line = `${'lorem ipsum dolor sit amet '.repeat(8)}\n`;
    const body = line.repeat(Math.ceil((256 * 1024) / line.length));
    for (let i = 0; i < 400; i++) writeFileSync(join(dir, `f${i}.txt`), body);
    h = await setup({
      repo: { agents: agentsWithTools(['Grep', 'Read']) },
      state: ROLE_STATE,
      bodies: ROLE_BODIES,
      config: { sandbox: { limits: { processes: 200 }, allowRead: [dir] } },
    });
    // Without Bash the CLI keeps its Grep tool (with Bash it offers rg in the shell instead).
    const done = agentRuns(h, 'planner', [toolUse('Grep', { pattern: '\\w{2,100}[0-9]', path: dir, output_mode: 'count' })]);
    const seen = [];
    let settled = false;
    done.finally(() => (settled = true)).catch(() => {});
    while (!settled) {
      const rg = partsOf((argv) => argv[0] === 'rg');
      if (rg) seen.push(rg.parts);
      await new Promise((r) => setTimeout(r, 5));
    }
    const { results } = await done;
    expect(results[0].is_error, results[0].text).toBe(false);
    expect(seen.length, 'ripgrep was not seen at work').toBeGreaterThan(0);
    for (const parts of seen) expect(new Set(parts)).toEqual(new Set(['tools']));
  });
});
