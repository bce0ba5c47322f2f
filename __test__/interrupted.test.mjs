// Issue 48: an engine restart costs no agent's work. An engine process runs an Implementor (real
// CLI, real bubblewrap, the fake Messages API scripting it) that commits one file, writes a
// second, and is in its third step (a long command) when the engine is SIGKILLed. A new engine
// dispatches the same work item on the same branch with a new session id: it continues the
// interrupted session in its checkout, on its CLI conversation — the API is never asked for step
// one again — and its patch holds both files. With resumeInterrupted: 0, or a conversation the
// agent broke, the old path runs: the work saved as a patch, a fresh start.
import { existsSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { assistantTurns, bash, reply, scenario } from './support/fake-api.mjs';
import { BODY, expectContinued, steps } from './support/interrupted.mjs';
import { engineProcess, killAll } from './support/engine-process.mjs';
import { implementorDone } from './support/roles.mjs';
import { addon, engineState, rejection, setup, sleepMarker, SWEPT, workOf } from './support/harness.mjs';

const state = engineState({ workItems: [{ id: '7', title: 'Seven', status: 'open', linkedRevision: null }] });
const LOOPS = Number(process.env.CRA_TEST_INTERRUPTED_LOOPS ?? 1);

let h;
const engines = [];
afterEach(async () => {
  killAll(engines);
  await h?.cleanup();
  h = undefined;
});

/** Whether `cond` held within `ms`: true once it held (not asked again, since what it saw may
 * be gone a moment later: a process of the agent's command that exits, a swept checkout). */
const waitFor = async (cond, ms) => {
  for (const end = Date.now() + ms; Date.now() < end; ) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return Boolean(cond());
};

/** Live processes whose command line contains `text` (not zombies). */
function processesWith(text) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      if (!readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').includes(text)) continue;
      if (readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] === 'Z') continue;
      found.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/**
 * An engine process runs session `first` on wi-7 and is SIGKILLed in its third step (its agent's
 * `sleep` running). Returns the old transcript and how many main requests the API had seen.
 */
async function interrupted(first, config = {}) {
  const marker = sleepMarker(300);
  h.api.setScript(steps(marker));
  const old = { ...h, config: { ...h.config, ...config } };
  const { engine, log } = await engineProcess(old, { role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: first }, engines);
  const reached = await waitFor(() => h.api.mainRequests().length >= 3 && processesWith(`sleep ${marker}`).length > 0, 90_000);
  expect(reached).toBe(true);
  engine.kill('SIGKILL');
  await new Promise((r) => (engine.exitCode !== null || engine.signalCode ? r() : engine.on('exit', r)));
  // The sandbox dies with its engine: nothing of the first run keeps working.
  expect(await waitFor(() => processesWith(`sleep ${marker}`).length === 0, 10_000)).toBe(true);
  return { log, asked: h.api.mainRequests().length };
}

/** Where a dead session's work is saved: beside its transcript. */
const savedPatch = (transcript) => transcript.replace(/\.log$/, '.patch');

/**
 * The work item dispatched again (session `second-run`) where the interrupted one must not be
 * continued: it completes from step one (its first request has no earlier turn). `asked`: the
 * API's main requests before it. Returns its adapter.
 */
async function startedAfresh(asked) {
  h.api.setScript(scenario.steps([bash('echo fresh > fresh.txt && echo made'), reply(implementorDone())]));
  const adapter = h.adapter();
  const handle = await adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'second-run' });
  expect((await handle.result).outcome).toBe('completed');
  expect((await handle.stats).continuedFrom).toBeNull();
  expect(assistantTurns(h.api.mainRequests()[asked].body)).toBe(0);
  return adapter;
}

const checkout = () => join(h.repo.root, '.worktrees', 'wi-7');

/** The CLI conversation file of the interrupted checkout (in its record dir). */
function conversationFile() {
  const clones = join(h.repo.root, '.git', 'claude-runtime-adapter', 'clones');
  for (const id of readdirSync(clones)) {
    const projects = join(clones, id, 'cli', 'projects');
    if (!existsSync(projects)) continue;
    for (const p of readdirSync(projects)) {
      const f = readdirSync(join(projects, p)).find((n) => n.endsWith('.jsonl'));
      if (f) return join(projects, p, f);
    }
  }
  return null;
}

describe('an Implementor interrupted by its engine is continued by the next dispatch (resumeInterrupted)', () => {
  for (let loop = 0; loop < LOOPS; loop++) {
    it(`engine SIGKILLed in step three (after a commit and an uncommitted write): the re-dispatched session continues in the same checkout on the same conversation, never asks for step one again, and its patch holds both files${LOOPS > 1 ? ` (run ${loop + 1})` : ''}`, async () => {
      h = await setup({ state, bodies: { 7: BODY } });
      const { log, asked } = await interrupted('first-run');
      const adapter = h.adapter();
      const handle = await adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'second-run' });
      // Every request of the new session carries the three earlier turns: none starts over.
      const logFile = await expectContinued(h, handle, 'first-run', asked);
      // The transcript names the interrupted run's; the checkout and its records are gone.
      const transcript = readFileSync(logFile, 'utf8');
      expect(transcript).toContain('continuing session first-run');
      expect(transcript).toContain(log);
      expect(existsSync(checkout())).toBe(false);
      expect(existsSync(savedPatch(log))).toBe(false);
      await adapter.shutdown();
    }, 240_000);
  }

  it("shutdown() (a deploy's SIGTERM) during step three: the session settles ERR_CANCELLED with its work saved, its checkout is left, and the next adapter's dispatch continues it", async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const marker = sleepMarker(300);
    h.api.setScript(steps(marker));
    const first = h.adapter();
    const handle = await first.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'first-run' });
    expect(await waitFor(() => h.api.mainRequests().length >= 3 && processesWith(`sleep ${marker}`).length > 0, 90_000)).toBe(true);
    const asked = h.api.mainRequests().length;
    await first.shutdown({ graceMs: 0 });
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_CANCELLED');
    expect(readFileSync(savedPatch(handle.logFilePath), 'utf8')).toContain('+++ b/two.txt');
    expect(readFileSync(handle.logFilePath, 'utf8')).toContain('left for the next session on its branch to continue');
    expect(existsSync(checkout())).toBe(true);
    const next = h.adapter();
    const continued = await next.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'second-run' });
    const result = await continued.result;
    expect(result.patch).toContain('+++ b/one.txt');
    expect(result.patch).toContain('+++ b/two.txt');
    expect((await continued.stats).continuedFrom).toBe('first-run');
    expect(h.api.mainRequests().slice(asked).every((r) => assistantTurns(r.body) >= 3)).toBe(true);
    expect(existsSync(checkout())).toBe(false);
    await next.shutdown();
  }, 240_000);

  it('resumeInterrupted: 0 is the old path: the interrupted work saved as a patch, the new session starting from step one', async () => {
    h = await setup({ state, bodies: { 7: 'x' }, config: { resumeInterrupted: 0 } });
    const { log, asked } = await interrupted('first-run');
    const adapter = await startedAfresh(asked);
    const saved = readFileSync(savedPatch(log), 'utf8');
    expect(saved).toContain('+++ b/one.txt');
    expect(saved).toContain('+++ b/two.txt');
    await adapter.shutdown();
  }, 240_000);

  it('a conversation the agent replaced by a link to a host file is not followed: a warning says why, the work is saved as a patch, the session starts afresh, and the file never reaches the API', async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const { log, asked } = await interrupted('first-run');
    const secret = join(h.scratch, 'host-secret.jsonl');
    writeFileSync(secret, '{"type":"user","message":{"role":"user","content":"HOST-SECRET-48"}}\n');
    const conversation = conversationFile();
    rmSync(conversation);
    symlinkSync(secret, conversation);
    const adapter = await startedAfresh(asked);
    expect(JSON.stringify(h.api.mainRequests().slice(asked).map((r) => r.body))).not.toContain('HOST-SECRET-48');
    const warned = h.logger.entries.find((e) => e.level === 'warn' && /cannot be continued: its conversation .* is missing or not a plain file/.test(e.message));
    expect(warned).toBeTruthy();
    expect(readFileSync(savedPatch(log), 'utf8')).toContain('+++ b/two.txt');
    await adapter.shutdown();
  }, 240_000);

  it('a conversation filled with junk: not continued (a warning names the bad line), the work saved, a fresh start', async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const { log, asked } = await interrupted('first-run');
    writeFileSync(conversationFile(), '{"type":"user"}\nthis is not json\n');
    const adapter = await startedAfresh(asked);
    expect(h.logger.entries.some((e) => e.level === 'warn' && e.message.includes('line 2 of the conversation is not JSON'))).toBe(true);
    expect(readFileSync(savedPatch(log), 'utf8')).toContain('+++ b/one.txt');
    await adapter.shutdown();
  }, 240_000);

  it("two engines alive: the second one's dispatch on the branch never takes the first one's live session", async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const marker = sleepMarker(300);
    h.api.setScript(steps(marker));
    await engineProcess(h, { role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'first-run' }, engines);
    expect(await waitFor(() => processesWith(`sleep ${marker}`).length > 0, 90_000)).toBe(true);
    const adapter = h.adapter();
    const err = await rejection(adapter.startAgent({ role: 'implementor', workItemID: '7', branchName: 'wi-7', sessionID: 'second-run' }));
    expect(err.code).toBe('ERR_PROVISION');
    // The first engine's agent still runs in its checkout, its files where it left them.
    expect(processesWith(`sleep ${marker}`).length).toBeGreaterThan(0);
    expect(readFileSync(join(workOf(checkout()), 'two.txt'), 'utf8')).toBe('two\n');
    await adapter.shutdown();
  }, 240_000);

  it('interrupted and never dispatched again: left for the bound, then swept by the running adapter with its work saved', async () => {
    h = await setup({ state, bodies: { 7: 'x' } });
    const { log } = await interrupted('first-run');
    const adapter = addon.createClaudeAdapter({ ...h.config, resumeInterrupted: 4 }, h.deps);
    const swept = () => h.logger.entries.find((e) => e.message === SWEPT && e.data.paths.length > 0);
    // Left by the first sweep, which runs at once.
    expect(await waitFor(() => h.logger.entries.some((e) => e.message === SWEPT), 10_000)).toBe(true);
    expect(swept()).toBeUndefined();
    expect(existsSync(checkout())).toBe(true);
    expect(await waitFor(swept, 20_000)).toBeTruthy();
    expect(existsSync(checkout())).toBe(false);
    expect(readFileSync(swept().data.patches[0], 'utf8')).toContain('+++ b/two.txt');
    await adapter.shutdown();
  }, 240_000);
});
