// Issue 19: every step after the agent is bounded, cancellable and jailed. The agent's own Bash
// (real CLI, real bubblewrap, scripted through the fake Messages API) wedges or booby-traps its
// clone, then says it is done: reading its work out of the clone must settle within its bound
// (`ERR_EXTRACT` naming why, the checkout kept with the work), obey cancelAgent, leave no process
// behind, open nothing of the host through the clone, and run none of the clone's programs on
// the host, not even when a `sandbox: false` adapter sweeps it later.
import { execFileSync, spawnSync } from 'node:child_process';
import { closeSync, constants, existsSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario, structured } from './support/fake-api.mjs';
import { engineProcess, killAll } from './support/engine-process.mjs';
import { addon, engineState, hostGitDir, logEntry, rejection, setup, SHARED_BASE, SWEPT, workOf } from './support/harness.mjs';

const state = engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] });
const params = { role: 'implementor', workItemID: '7', branchName: 'wi-7' };
const done = structured({ role: 'implementor', outcome: 'completed', summary: 'done' });
/** A dead session's clone swept by the next adapter at once, not left for a continuation. */
const SWEEP_AT_ONCE = { resumeInterrupted: 0 };

let h;
const engines = [];
afterEach(async () => {
  killAll(engines);
  await h?.cleanup();
  h = undefined;
});

/** A number no other process has on its command line: `sleep <marker>` is found by it. */
const uniqueMarker = () => `9${Date.now() % 1_000_000}.${process.pid % 1000}`;

/** Live processes whose command line contains `text` (not zombies, not this probe). */
function processesWith(text) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      if (!cmdline.includes(text)) continue;
      if (readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] === 'Z') continue;
      found.push(`${pid}: ${cmdline}`);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/** Live processes whose working directory is inside `dir` (git, bwrap, a filter, …). */
function processesIn(dir) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cwd = execFileSync('readlink', [`/proc/${pid}/cwd`]).toString().trim();
      if (cwd === dir || cwd.startsWith(`${dir}/`)) found.push(`${pid}: ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ')}`);
    } catch {
      // gone meanwhile, or not ours
    }
  }
  return found;
}

/**
 * The adapter's own git in `clone` (its argv names the clone and the neutralised hooks) is
 * running, wedged on the filter `sleep <marker>`. (The CLI's own `git status` inside a session's
 * sandbox may run the filter briefly before that, which is not the adapter's extraction.)
 */
const wedged = (clone, marker) =>
  processesWith(clone).some((p) => p.includes('core.hooksPath=/dev/null')) && processesWith(`sleep ${marker}`).length > 0;

const waitFor = async (cond, ms = 10_000) => {
  for (const end = Date.now() + ms; Date.now() < end && !cond(); ) await new Promise((r) => setTimeout(r, 25));
};

/** Every file under `dir` whose bytes contain `needle` (symlinks not followed). */
function filesContaining(dir, needle) {
  const out = [];
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile() && readFileSync(p).includes(needle)) out.push(p);
    }
  };
  walk(dir);
  return out;
}

async function implementor(commands, config = {}) {
  h = await setup({ script: scenario.steps([...commands.map((c) => bash(c)), done]), state, bodies: { 7: 'x' }, config });
  const adapter = h.adapter();
  const handle = await adapter.startAgent(params);
  return { adapter, handle, clone: join(h.repo.root, '.worktrees', 'wi-7') };
}

describe('reading the work out of a wedged checkout settles, with the work kept', () => {
  it('an index the agent replaced with a FIFO: ERR_EXTRACT naming it, at once; nothing left running; the checkout is kept with the work', async () => {
    const { handle, clone } = await implementor(['echo work > work.txt && g=$(git rev-parse --git-dir) && rm $g/index && mkfifo $g/index && echo wedged']);
    const t0 = Date.now();
    const err = await rejection(handle.result);
    expect(Date.now() - t0).toBeLessThan(20_000); // hang detection, not a timing assertion
    expect(err.code).toBe('ERR_EXTRACT');
    expect(err.message).toContain(`${hostGitDir(clone)}/index is a FIFO, not a regular file`);
    expect(err.message).toContain(`the checkout is kept as it is at ${clone}`);
    expect(readFileSync(join(workOf(clone), 'work.txt'), 'utf8')).toBe('work\n');
    expect(processesIn(clone)).toEqual([]);
    expect(h.logger.entries.some((e) => e.message.includes('the checkout is kept') && e.data.path === clone)).toBe(true);
  });

  it("the agent's core.fsmonitor that never returns is not run: the session completes with its patch, and no fsmonitor process ever starts", async () => {
    const marker = uniqueMarker();
    const { handle, clone } = await implementor([`git config core.fsmonitor "sleep ${marker};" && echo work > work.txt && echo planted`]);
    const result = await handle.result;
    expect(result.outcome).toBe('completed');
    expect(result.patch).toContain('+++ b/work.txt');
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(existsSync(clone)).toBe(false);
  });

  it('a clean filter that never returns: ERR_EXTRACT past extractionTimeout, naming it; the filter and its sandbox are killed; the checkout is kept', async () => {
    const marker = uniqueMarker();
    const { handle, clone } = await implementor(
      [`git config filter.w.clean "sleep ${marker}" && echo '*.txt filter=w' > .gitattributes && echo work > work.txt && echo planted`],
      { extractionTimeout: 2 },
    );
    const t0 = Date.now();
    const err = await rejection(handle.result);
    expect(Date.now() - t0).toBeLessThan(20_000); // hang detection, not a timing assertion
    expect(err.code).toBe('ERR_EXTRACT');
    expect(err.message).toContain('did not finish within 2 s (config.extractionTimeout)');
    expect(err.message).toContain(`the checkout is kept as it is at ${clone}`);
    await waitFor(() => processesWith(`sleep ${marker}`).length === 0 && processesIn(clone).length === 0);
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(processesIn(clone)).toEqual([]);
    expect(readFileSync(join(workOf(clone), 'work.txt'), 'utf8')).toBe('work\n');
  });

  it('cancelAgent while a clean filter wedges the extraction: ERR_CANCELLED within seconds, the signal aborted, nothing left running', async () => {
    const marker = uniqueMarker();
    const { adapter, handle, clone } = await implementor([
      `git config filter.w.clean "sleep ${marker}" && echo '*.txt filter=w' > .gitattributes && echo work > work.txt && echo planted`,
    ]);
    await waitFor(() => wedged(clone, marker), 30_000);
    expect(wedged(clone, marker)).toBe(true);
    const t0 = Date.now();
    adapter.cancelAgent(handle.sessionID);
    const err = await rejection(handle.result);
    expect(Date.now() - t0).toBeLessThan(10_000); // hang detection, not a timing assertion
    expect(err.code).toBe('ERR_CANCELLED');
    expect(handle.abortSignal.aborted).toBe(true);
    await waitFor(() => processesWith(`sleep ${marker}`).length === 0 && processesIn(clone).length === 0);
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(processesIn(clone)).toEqual([]);
    expect(readFileSync(join(workOf(clone), 'work.txt'), 'utf8')).toBe('work\n');
  });
});

describe('nothing the agent controls is opened on the host', () => {
  it("an index symlinked to a host secret: ERR_EXTRACT naming the symlink; the secret's content is nowhere in the checkout, the transcript or its patch", async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const secret = join(h.scratch, 'id_rsa');
    const content = `-----BEGIN SECRET ${uniqueMarker()}-----`;
    writeFileSync(secret, `${content}\n`.repeat(64));
    h.api.setScript(scenario.steps([bash(`echo work > work.txt && g=$(git rev-parse --git-dir) && rm $g/index && ln -s ${secret} $g/index && echo linked`), done]));
    const handle = await h.adapter().startAgent(params);
    const clone = join(h.repo.root, '.worktrees', 'wi-7');
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_EXTRACT');
    expect(err.message).toContain(`${hostGitDir(clone)}/index is a symbolic link, not a regular file`);
    for (const dir of new Set([clone, workOf(clone), hostGitDir(clone)])) expect(filesContaining(dir, content)).toEqual([]);
    expect(filesContaining(join(h.scratch, 'logs'), content)).toEqual([]);
    expect(readFileSync(secret, 'utf8')).toContain(content);
  });

  // Only a layered checkout has a host path the agent writes and the extraction's jail does not
  // show (its layer's upper/); a full clone's FIFO would wedge the jailed git, which the
  // extractionTimeout cases above cover.
  (SHARED_BASE ? it : it.skip)("a non-UTF-8 patch, the agent's alternates naming a store whose own alternates is a FIFO, on the host only: the session completes with its patch, within extractionTimeout", async () => {
    const { handle, clone } = await implementor(
      [
        "printf 'caf\\351\\n' > latin1.src && mkdir -p store/info && mkfifo store/info/alternates && g=$(git rev-parse --absolute-git-dir) && " +
          'echo "$(dirname $g)/upper/store" >> $g/objects/info/alternates && echo planted',
      ],
      { extractionTimeout: 10 },
    );
    try {
      const result = await handle.result;
      expect(result.outcome).toBe('completed');
      expect(result.patch).toContain('diff --git a/latin1.src b/latin1.src');
      expect(result.patch).toContain('GIT binary patch');
    } finally {
      // Whatever was left blocked opening the FIFO gets end of file, so a failure ends the run.
      try {
        closeSync(openSync(join(workOf(clone), 'store/info/alternates'), constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // nobody was waiting on it
      }
    }
  });
});

/**
 * An engine process runs a sandboxed Implementor whose agent runs `plant` in its clone (then
 * keeps a command running), and is SIGKILLed once the agent's `unsaved.txt` is written: its
 * clone is left for the next adapter's sweep. Returns the clone's path.
 */
async function crashedSession(plant) {
  const hold = `30.${Date.now() % 1000}`;
  h.api.setScript(scenario.steps([bash(`${plant} && echo "agent work" > unsaved.txt; sleep ${hold}`), { hang: true }]));
  const { engine } = await engineProcess(h, params, engines);
  const clone = join(h.repo.root, '.worktrees', 'wi-7');
  const planted = () => existsSync(join(clone, '.git')) && existsSync(join(workOf(clone), 'unsaved.txt')) && statSync(join(workOf(clone), 'unsaved.txt')).size > 0;
  await waitFor(planted, 30_000);
  expect(planted()).toBe(true);
  engine.kill('SIGKILL');
  await new Promise((r) => engine.on('exit', r));
  return clone;
}

describe('an index too big to be one is refused, not copied', () => {
  it('a sparse index of 600 MiB: ERR_EXTRACT naming its size; no copy of it is written', async () => {
    const { handle, clone } = await implementor(['echo work > work.txt && g=$(git rev-parse --git-dir) && rm $g/index && truncate -s 600M $g/index && echo sparse']);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_EXTRACT');
    expect(err.message).toContain(`${hostGitDir(clone)}/index is ${600 * 1024 * 1024} bytes, more than the ${512 * 1024 * 1024}`);
    expect(readdirSync(hostGitDir(clone)).filter((f) => f.startsWith('index.'))).toEqual([]);
  });
});

describe("the clone's programs never run on the host", () => {
  it('a crashed sandboxed session whose clone plants core.fsmonitor and a clean filter: a sandbox: false adapter sweeps it, saves the work, and neither runs on the host', async () => {
    h = await setup({ state, bodies: { 7: 'x' }, config: SWEEP_AT_ONCE });
    const pwned = join(h.scratch, 'pwned');
    const clone = await crashedSession(
      `git config core.fsmonitor "touch ${pwned}.fsmonitor; false" && git config filter.x.clean "sh -c 'touch ${pwned}.filter; cat'" && echo '*.txt filter=x' > .gitattributes`,
    );
    // What the agent planted really runs when git runs on the host in that clone.
    spawnSync('git', ['diff-files', '--quiet'], { cwd: clone, stdio: 'ignore' });
    expect(existsSync(`${pwned}.fsmonitor`)).toBe(true);
    rmSync(`${pwned}.fsmonitor`);

    addon.createClaudeAdapter({ ...h.config, sandbox: false }, h.deps);
    const swept = await logEntry(h.logger, SWEPT, 30_000);
    expect(existsSync(clone)).toBe(false);
    expect(swept.data.patches).toHaveLength(1);
    expect(readFileSync(swept.data.patches[0], 'utf8')).toContain('+++ b/unsaved.txt');
    expect(existsSync(`${pwned}.fsmonitor`)).toBe(false);
    expect(existsSync(`${pwned}.filter`)).toBe(false);
  });
});

describe('the sweep of a wedged clone is bounded and ends with shutdown()', () => {
  it('a clean filter that never returns: the sweep gives up past extractionTimeout, kills it, keeps the clone and says why', async () => {
    h = await setup({ state, bodies: { 7: 'x' }, config: SWEEP_AT_ONCE });
    const marker = uniqueMarker();
    const clone = await crashedSession(`git config filter.w.clean "sleep ${marker}" && echo '*.txt filter=w' > .gitattributes`);
    addon.createClaudeAdapter({ ...h.config, extractionTimeout: 2 }, h.deps);
    const swept = await logEntry(h.logger, SWEPT, 30_000);
    expect(swept.data.paths).toEqual([]);
    const kept = h.logger.entries.find((e) => e.message.includes("kept a dead session's worktree"));
    expect(kept?.data.worktree).toBe(clone);
    expect(kept?.data.error).toContain('did not finish within 2 s (config.extractionTimeout)');
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(processesIn(clone)).toEqual([]);
    expect(readFileSync(join(workOf(clone), 'unsaved.txt'), 'utf8')).toBe('agent work\n');
  });

  it('shutdown() while the sweep is wedged on a clean filter: the filter and its sandbox are killed at once; the clone is kept', async () => {
    h = await setup({ state, bodies: { 7: 'x' }, config: SWEEP_AT_ONCE });
    const marker = uniqueMarker();
    const clone = await crashedSession(`git config filter.w.clean "sleep ${marker}" && echo '*.txt filter=w' > .gitattributes`);
    const adapter = addon.createClaudeAdapter(h.config, h.deps);
    await waitFor(() => wedged(clone, marker), 30_000);
    expect(wedged(clone, marker)).toBe(true); // the sweep is wedged
    await adapter.shutdown();
    await logEntry(h.logger, SWEPT, 10_000);
    expect(processesWith(`sleep ${marker}`)).toEqual([]);
    expect(processesIn(clone)).toEqual([]);
    expect(readFileSync(join(workOf(clone), 'unsaved.txt'), 'utf8')).toBe('agent work\n');
  });
});
