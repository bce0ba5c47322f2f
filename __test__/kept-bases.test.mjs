// Issue 37: bases outlive the engine's process. At shutdown the tip's bases stay, marked kept,
// with a record of what they are; a restarted engine adopts them instead of checking out (and
// setting up) again. Everything else — a kept base of an old tip, a base a dead process was
// still making, a live engine's base — is swept or left to its owner, and a `.base-*`
// directory without this adapter's record is never touched (src/git/base.rs). Two real engine
// processes in sequence (a child Node process, then this one), real CLI, real git, real bwrap.
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, scenario } from './support/fake-api.mjs';
import { engineProcess, engineSessions, killAll } from './support/engine-process.mjs';
import { basesOf, engineState, logEntry, rejection, setup, SHARED_BASE, SWEPT } from './support/harness.mjs';
import { ROLES } from './support/roles.mjs';

const git = (cwd, ...args) => execFileSync('git', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] }).toString();
const ADOPTED = 'adopted the base a previous process kept for the tip';
const items = [{ id: '1', title: 'Item', status: 'open', linkedRevision: null }];
const childState = { workItems: { 1: items[0] }, revisions: {}, lastPlannedSHAs: {} };
const implementor = (branchName) => ({ role: 'implementor', workItemID: '1', branchName });
const planner = ROLES.planner.params();

let h;
const engines = [];
const after = [];
afterEach(async () => {
  killAll(engines);
  for (const f of after.splice(0)) await f();
  await h?.cleanup();
  h = undefined;
});

/** Whether a request is an Implementor's (its output schema has `outcome`). */
const isImplementor = (body) => JSON.stringify(body.tools?.find((t) => t.name === 'StructuredOutput')?.input_schema ?? {}).includes('"outcome"');
/** Implementors write work.txt and finish; Planners finish at once. */
const script = scenario.steps([
  (body) => (isImplementor(body) ? bash('echo work > work.txt') : ROLES.planner.done),
  (body) => (isImplementor(body) ? ROLES.implementor.done : ROLES.planner.done),
]);

/** A scratch directory outside the repository, removed after the test. */
function scratchDir() {
  const dir = join(tmpdir(), `cra-kept-${process.pid}-${randomUUID()}`);
  mkdirSync(dir, { recursive: true });
  after.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A setup command that counts its runs, installs a file, and while `hold` exists waits (its pid
 * in `pid`, so the test can end it) — a base made while it waits is a half-made one.
 */
function setupCommand() {
  const dir = scratchDir();
  const [counter, hold, pid] = ['runs', 'hold', 'pid'].map((n) => join(dir, n));
  after.push(() => {
    if (existsSync(pid)) {
      try {
        process.kill(Number(readFileSync(pid, 'utf8')), 'SIGKILL');
      } catch {}
    }
  });
  return {
    hold,
    runs: () => (existsSync(counter) ? readFileSync(counter, 'utf8').split('\n').filter(Boolean).length : 0),
    command: ['sh', '-c', `echo run >> ${counter}; if [ -e ${hold} ]; then echo $$ > ${pid}; exec sleep 60; fi; echo installed > install-state.txt`],
  };
}

const records = (root) => join(root, '.git', 'claude-runtime-adapter', 'clones');
/** The record dirs that hold the kept mark. */
const keptMarks = (root) => (existsSync(records(root)) ? readdirSync(records(root)).filter((id) => existsSync(join(records(root), id, 'kept'))) : []);
/** What a new checkout of a base would change: the base's inode, its index's and a tracked file's inode and mtime. */
function fingerprint(root, base) {
  const at = (p) => {
    const s = statSync(join(root, '.worktrees', base, p));
    return `${s.ino}:${s.mtimeMs}`;
  };
  return [at('.'), at('.git/index'), at('README.md')].join(' ');
}

describe.runIf(SHARED_BASE)("a restarted engine adopts the tip's bases", () => {
  it("the second engine's first Implementor and Planner on the same tip make no checkout and run no setup: the same directories, untouched, and their work is right", { timeout: 180_000 }, async () => {
    const setupCmd = setupCommand();
    h = await setup({ state: engineState({ workItems: items }), bodies: { 1: 'Body' }, config: { worktreeSetupCommand: setupCmd.command } });
    h.api.setScript(script);
    const root = h.repo.root;
    const first = await engineSessions(h, [implementor('wi-1'), planner], engines, { state: childState, bodies: { 1: 'Body' } });
    expect(first.results).toEqual([{ ok: true }, { ok: true }]);
    expect(setupCmd.runs()).toBe(1);
    // The Implementors' base (set up) and the Planners' (not), both kept with their mark.
    const bases = basesOf(root).sort();
    expect(bases).toHaveLength(2);
    expect(keptMarks(root)).toHaveLength(2);
    const before = bases.map((b) => fingerprint(root, b));

    const adapter = h.adapter();
    await logEntry(h.logger, SWEPT);
    const impl = await (await adapter.startAgent(implementor('wi-2'))).result;
    expect(impl.patch).toContain('+++ b/work.txt');
    expect(impl.patch).not.toContain('install-state.txt');
    await (await adapter.startAgent(planner)).result;

    expect(basesOf(root).sort()).toEqual(bases);
    expect(bases.map((b) => fingerprint(root, b))).toEqual(before);
    expect(setupCmd.runs()).toBe(1);
    expect(h.logger.entries.filter((e) => e.message === ADOPTED)).toHaveLength(2);
    // Adopted, they are this process's: no longer marked until its own shutdown keeps them.
    expect(keptMarks(root)).toEqual([]);
    await adapter.shutdown();
    expect(basesOf(root).sort()).toEqual(bases);
    expect(keptMarks(root)).toHaveLength(2);
  });

  it("a kept base of an old tip and a half-made base are swept, not adopted; a .base-* directory without the adapter's record is not touched", { timeout: 180_000 }, async () => {
    const setupCmd = setupCommand();
    h = await setup({ state: engineState({ workItems: items }), bodies: { 1: 'Body' }, config: { worktreeSetupCommand: setupCmd.command } });
    h.api.setScript(script);
    const root = h.repo.root;
    const first = await engineSessions(h, [implementor('wi-1')], engines, { state: childState, bodies: { 1: 'Body' } });
    expect(first.results).toEqual([{ ok: true }]);
    const [oldTip] = basesOf(root);
    expect(keptMarks(root)).toHaveLength(1);
    git(root, 'commit', '-q', '--allow-empty', '-m', 'upstream');

    // A directory named like a base that this adapter did not make.
    const foreign = `.base-${randomUUID()}`;
    mkdirSync(join(root, '.worktrees', foreign));
    writeFileSync(join(root, '.worktrees', foreign, 'mine.txt'), 'a person\'s file\n');

    // An engine killed while it makes the new tip's base (its setup still running): the same
    // key the next engine asks for, recorded, never completed.
    writeFileSync(setupCmd.hold, '');
    // Never resolves (its start waits on the setup); rejects once killed.
    engineProcess(h, implementor('wi-3'), engines).catch(() => {});
    const engine = engines.at(-1);
    for (let i = 0; i < 400 && setupCmd.runs() < 2; i++) await new Promise((r) => setTimeout(r, 50));
    expect(setupCmd.runs()).toBe(2);
    const halfMade = basesOf(root).filter((b) => b !== oldTip && b !== foreign);
    expect(halfMade).toHaveLength(1);
    engine.kill('SIGKILL');
    await new Promise((r) => (engine.exitCode !== null || engine.signalCode !== null ? r() : engine.on('exit', r)));
    rmSync(setupCmd.hold);

    const adapter = h.adapter();
    const swept = await logEntry(h.logger, SWEPT);
    // The old tip's base went in the sweep of the engine that was killed, or in this one.
    expect(swept.data.paths).toContain(join(root, '.worktrees', halfMade[0]));
    expect(basesOf(root)).toEqual([foreign]);
    expect(readFileSync(join(root, '.worktrees', foreign, 'mine.txt'), 'utf8')).toBe('a person\'s file\n');

    const impl = await (await adapter.startAgent(implementor('wi-4'))).result;
    expect(impl.patch).toContain('+++ b/work.txt');
    expect(h.logger.entries.filter((e) => e.message === ADOPTED)).toEqual([]);
    const now = basesOf(root).filter((b) => b !== foreign);
    expect(now).toHaveLength(1);
    expect([oldTip, ...halfMade]).not.toContain(now[0]);
    expect(setupCmd.runs()).toBe(3);
    await adapter.shutdown();
    expect(readFileSync(join(root, '.worktrees', foreign, 'mine.txt'), 'utf8')).toBe('a person\'s file\n');
  });

  it("a base kept by an engine that is still alive is its own: another engine makes its own and leaves that one", { timeout: 180_000 }, async () => {
    h = await setup({ state: engineState({ workItems: items }), bodies: { 1: 'Body' } });
    h.api.setScript(script);
    const root = h.repo.root;
    const first = await engineSessions(h, [implementor('wi-1')], engines, { state: childState, bodies: { 1: 'Body' }, exit: false });
    expect(first.results).toEqual([{ ok: true }]);
    const [theirs] = basesOf(root);
    const before = fingerprint(root, theirs);

    const adapter = h.adapter();
    await logEntry(h.logger, SWEPT);
    const impl = await (await adapter.startAgent(implementor('wi-2'))).result;
    expect(impl.patch).toContain('+++ b/work.txt');
    expect(h.logger.entries.filter((e) => e.message === ADOPTED)).toEqual([]);
    expect(basesOf(root)).toHaveLength(2);
    expect(basesOf(root)).toContain(theirs);
    expect(fingerprint(root, theirs)).toBe(before);
    await adapter.shutdown();
    expect(basesOf(root)).toContain(theirs);
  });
});

describe('shutdown({ keepBases })', () => {
  it('a keepBases that is not a boolean is refused by name, and the adapter is not shut down', async () => {
    h = await setup({ state: engineState({ workItems: items }), bodies: { 1: 'Body' } });
    h.api.setScript(script);
    const adapter = h.adapter();
    const err = await rejection(Promise.resolve().then(() => adapter.shutdown({ keepBases: 'no' })));
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    expect(err.message).toContain('options.keepBases must be a boolean');
    const impl = await (await adapter.startAgent(implementor('wi-1'))).result;
    expect(impl.patch).toContain('+++ b/work.txt');
    await adapter.shutdown({ keepBases: false });
    expect(basesOf(h.repo.root)).toEqual([]);
  });
});
