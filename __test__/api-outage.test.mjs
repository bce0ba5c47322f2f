// Issue 34: no agent's work lost to the API. The real CLI (its own retries off, as in every
// test: CLAUDE_CODE_MAX_RETRIES=0) behind the real relay, against a fake API that goes down in
// the middle of an Implementor's work. The relay holds a request whose answer was a retryable
// failure; where the CLI saw the failure anyway (an answer cut after it began), the adapter
// resumes the CLI's conversation in the same checkout.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { apiError, assistantTurns, bash, latestToolResultText, reply, scenario, userText } from './support/fake-api.mjs';
import { collect, engineState, markedProcesses, rejection, setup } from './support/harness.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { implementorDone, implementorParams, implementorState } from './support/roles.mjs';

/** How long the API is down in these tests (the issue's 60 s; shorter by hand with the variable). */
const OUTAGE_MS = Number(process.env.CRA_TEST_OUTAGE_MS ?? 60_000);

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/** A fake API that is down (`down` reply) from the first request after the agent's work step
 * until `ms` later; `work` is the Bash the agent runs first. */
function outageScript({ work, ms = OUTAGE_MS, down = apiError(529, 'Overloaded') }) {
  const outage = { start: null, downReplies: 0 };
  const script = scenario.steps([
    reply(bash(work)),
    () => {
      outage.start ??= Date.now();
      if (Date.now() - outage.start < ms) {
        outage.downReplies += 1;
        return typeof down === 'function' ? down(outage) : down;
      }
      return implementorDone('finished after the outage');
    },
  ]);
  return { script, outage };
}

const config = (extra = {}) => ({ sandbox: {}, ...extra });

function patchFiles(patch) {
  return [...patch.matchAll(/^diff --git a\/(\S+)/gm)].map((m) => m[1]);
}

function expectNothingLeft(root, marker) {
  const worktrees = join(root, '.worktrees');
  const left = existsSync(worktrees) ? readdirSync(worktrees).filter((n) => n.includes('wi-7')) : [];
  expect(left).toEqual([]);
  const branches = execFileSync('git', ['branch', '--list', 'wi-7'], { cwd: root, encoding: 'utf8' });
  expect(branches.trim()).toBe('');
  if (marker) expect(markedProcesses(marker)).toEqual([]);
}

/** One adapter's Implementors on `items` (work item `id` adds `w<id>.txt`), the fake API's
 * replies by `script` (each request's work item is in its first user turn). */
function fleetSetup(items, script) {
  return setup({
    state: engineState({ workItems: items.map((id) => ({ id, title: `Item ${id}`, status: 'in-progress', linkedRevision: null })) }),
    bodies: Object.fromEntries(items.map((id) => [id, `Add w${id}.txt.`])),
    script,
    repo: { agents: agentsWithTools(['Bash']) },
    config: config(),
  });
}

describe('a session survives an API outage', () => {
  it.concurrent.each([
    ['after the Implementor committed its work', 'echo committed > a.txt && git add -A && git commit -qm a && echo ok'],
    ['with only uncommitted work in the checkout', 'echo uncommitted > b.txt && echo ok'],
  ])(`an outage of ${OUTAGE_MS / 1000} s %s: the relay holds the request, the session completes with the work in its patch and the API sees the conversation go on`, { timeout: OUTAGE_MS + 120_000 }, async (_, work) => {
    const { script, outage } = outageScript({ work });
    const hh = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    try {
      const started = Date.now();
      const handle = await hh.adapter().startAgent(implementorParams);
      const [result, stats, out] = await Promise.all([handle.result, handle.stats, collect(handle.output)]);
      expect(result.outcome).toBe('completed');
      expect(patchFiles(result.patch)).toEqual([work.includes('a.txt') ? 'a.txt' : 'b.txt']);
      expect(Date.now() - started).toBeGreaterThanOrEqual(OUTAGE_MS - 1000);
      expect(outage.downReplies).toBeGreaterThan(1);
      // One conversation: the request after the outage carries the earlier turns (the work step's
      // tool result), and the CLI never saw the failure (no resume was needed).
      const last = hh.api.mainBodies().at(-1);
      expect(latestToolResultText(last)).toContain('ok');
      expect(stats.api.resumes).toBe(0);
      expect(stats.api.retries).toBe(outage.downReplies);
      expect(stats.api.waitedMs).toBeGreaterThanOrEqual(OUTAGE_MS - 2500);
      expect(out).toMatch(/\[claude-runtime-adapter\] the model API failed \(529[^)]*\); the request is held/);
      expect(out).toMatch(/\[claude-runtime-adapter\] the model API answers again/);
      console.log(`[measure] ${OUTAGE_MS / 1000} s outage ${work.includes('git commit') ? 'after a commit' : 'with uncommitted work'}: ${outage.downReplies} failed answers, session ${((Date.now() - started) / 1000).toFixed(1)} s, waited ${stats.api.waitedMs} ms`);
    } finally {
      await hh.cleanup();
    }
  });

  it.concurrent(`an answer cut half-way, then the API down for ${OUTAGE_MS / 1000} s: the CLI asks again by itself and the relay holds that request through the outage — the session completes with the work, no resume, every later failure a held retry, the whole outage counted as waited`, { timeout: OUTAGE_MS + 120_000 }, async () => {
    const { script, outage } = outageScript({
      work: 'echo half > g.txt && git add -A && git commit -qm g && echo ok',
      // The first answer after the work is cut after it began (the CLI sees that); then 529s.
      down: (o) => (o.downReplies === 1 ? { cutMidway: true } : apiError(529, 'Overloaded')),
    });
    const hh = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    try {
      const handle = await hh.adapter().startAgent(implementorParams);
      const [result, stats, out] = await Promise.all([handle.result, handle.stats, collect(handle.output)]);
      expect(result.outcome).toBe('completed');
      expect(patchFiles(result.patch)).toEqual(['g.txt']);
      expect(outage.downReplies).toBeGreaterThan(1);
      // One conversation: the request after the outage carries the work step.
      expect(JSON.stringify(hh.api.mainBodies().at(-1).messages)).toContain('echo half > g.txt');
      // The CLI takes the cut stream up itself (it sends the request again), so it never ends on
      // the failure: no resume. The relay cannot hide the cut (the answer had begun), so the
      // cut is no retry of its own; each 529 after it is held and sent again.
      expect(stats.api.resumes).toBe(0);
      expect(stats.api.retries).toBe(outage.downReplies - 1);
      // The outage began at the cut (or at the first 529 a moment after): the whole of it was waited.
      expect(stats.api.waitedMs).toBeGreaterThanOrEqual(OUTAGE_MS - 2500);
      expect(out).toMatch(/\[claude-runtime-adapter\] the model API failed \(529[^)]*\); the request is held/);
      expect(out).toMatch(/\[claude-runtime-adapter\] the model API answers again, after \d+ s \(529/);
      expect(out).not.toMatch(/continuing its conversation/);
      const transcript = readFileSync(handle.logFilePath, 'utf8');
      expect(transcript).not.toMatch(/continuing its conversation/);
      expect(transcript).toMatch(/the model API failed \(529[^)]*\); the request is held/);
      expect(transcript).toMatch(/the model API answers again/);
      // The stats line of the transcript says the same as the stats.
      expect(transcript).toMatch(/"api":\{"retries":(\d+),"resumes":0,"waitedMs":\d+\}/);
      expect(Number(transcript.match(/"api":\{"retries":(\d+)/)[1])).toBe(stats.api.retries);
      console.log(`[measure] cut half-way then down: ${outage.downReplies} failed answers (the cut one first), resumes ${stats.api.resumes}, held retries ${stats.api.retries}, waited ${stats.api.waitedMs} ms`);
    } finally {
      await hh.cleanup();
    }
  });

  it.concurrent(`a connection the API cut without an answer, then the API down for ${OUTAGE_MS / 1000} s: the CLI ends on the failure, the adapter resumes its conversation in the same checkout and it completes with the work`, { timeout: OUTAGE_MS + 120_000 }, async () => {
    const { script, outage } = outageScript({
      work: 'echo kept > c.txt && git add -A && git commit -qm c && echo ok',
      // The request is read whole and the connection dropped: it may have been acted on, so
      // the relay does not send it again (the CLI sees a 502); then 529s.
      down: (o) => (o.downReplies === 1 ? { cut: true } : apiError(529, 'Overloaded')),
    });
    const hh = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    try {
      const handle = await hh.adapter().startAgent(implementorParams);
      const [result, stats, out] = await Promise.all([handle.result, handle.stats, collect(handle.output)]);
      expect(result.outcome).toBe('completed');
      expect(patchFiles(result.patch)).toEqual(['c.txt']);
      expect(stats.api.resumes).toBe(1);
      expect(out).toMatch(/ended on a model API failure \([^)]*\); continuing its conversation/);
      // The resumed CLI sent the earlier turns, then the resume's own turn.
      const resumed = JSON.stringify(hh.api.mainBodies().at(-1).messages);
      expect(resumed).toContain('echo kept > c.txt');
      expect(resumed).toContain('has been resumed');
      // The transcript holds both runs as one session.
      const transcript = readFileSync(handle.logFilePath, 'utf8');
      expect(transcript).toMatch(/continuing its conversation/);
      expect(transcript).toMatch(/finished after the outage/);
      expect(outage.downReplies).toBeGreaterThan(1);
      // logging.agentSessions: the conversation is kept beside the transcript for a resume by hand.
      const conversation = readFileSync(handle.logFilePath.replace(/\.[^./]+$/, '.conversation.jsonl'), 'utf8');
      expect(conversation).toContain('echo kept > c.txt');
      expect(conversation).toContain('has been resumed');
    } finally {
      await hh.cleanup();
    }
  });

  it.concurrent(`an overload reported inside the stream (HTTP 200, message_start, then an overloaded_error event) for ${OUTAGE_MS / 1000} s: the relay holds it as it holds a 529, and the session completes with the work`, { timeout: OUTAGE_MS + 120_000 }, async () => {
    const { script, outage } = outageScript({
      work: 'echo streamed > s.txt && git add -A && git commit -qm s && echo ok',
      down: { streamError: { type: 'overloaded_error', message: 'Overloaded' } },
    });
    const hh = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    try {
      const handle = await hh.adapter().startAgent(implementorParams);
      const [result, stats, out] = await Promise.all([handle.result, handle.stats, collect(handle.output)]);
      expect(result.outcome).toBe('completed');
      expect(patchFiles(result.patch)).toEqual(['s.txt']);
      expect(outage.downReplies).toBeGreaterThan(1);
      // Held and sent again by the relay: the CLI never saw one of them.
      expect(stats.api.retries).toBe(outage.downReplies);
      expect(stats.api.resumes).toBe(0);
      expect(out).toMatch(/the model API failed \(200 then overloaded_error: Overloaded\); the request is held/);
      expect(latestToolResultText(hh.api.mainBodies().at(-1))).toContain('ok');
    } finally {
      await hh.cleanup();
    }
  });

  it.concurrent(`an overloaded_error after the answer began to stream, then the API down for ${OUTAGE_MS / 1000} s: that answer is not sent again (it began, it may be billed), the rest is held, and the session completes with the work in one conversation`, { timeout: OUTAGE_MS + 120_000 }, async () => {
    const { script, outage } = outageScript({
      work: 'echo begun > t.txt && git add -A && git commit -qm t && echo ok',
      down: (o) => (o.downReplies === 1 ? { content: [{ type: 'text', text: 'Let me fin' }], streamError: { type: 'overloaded_error', message: 'Overloaded' } } : apiError(529, 'Overloaded')),
    });
    const hh = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    try {
      const handle = await hh.adapter().startAgent(implementorParams);
      const [result, stats] = await Promise.all([handle.result, handle.stats]);
      expect(result.outcome).toBe('completed');
      expect(patchFiles(result.patch)).toEqual(['t.txt']);
      expect(outage.downReplies).toBeGreaterThan(2);
      // The begun answer reached the CLI and was not sent again; every 529 after it was held.
      expect(stats.api.retries).toBe(outage.downReplies - 1);
      // The CLI takes a stream error up itself (it asks again); else the adapter resumes it.
      expect(stats.api.resumes).toBeLessThanOrEqual(1);
      expect(JSON.stringify(hh.api.mainBodies().at(-1).messages)).toContain('echo begun > t.txt');
      expect(readFileSync(handle.logFilePath, 'utf8')).toMatch(/\[assistant\]\n    Let me fin/);
    } finally {
      await hh.cleanup();
    }
  });

  it('a 529, then one request that does not answer for 20 s: three sessions started beside it take their normal time (the hung probe holds the fleet for its bound only), and the hung one goes on and completes', { timeout: 120_000 }, async () => {
    const items = ['1', '2', '3', '4'];
    const seen = { failed: 0, hung: 0 };
    const script = (body) => {
      const item = /Work Item #(\d+)/.exec(userText(body))?.[1];
      if (assistantTurns(body) === 0) return reply(bash(`echo ${item} > w${item}.txt && echo ok`));
      if (item !== '1') return implementorDone();
      if (seen.failed++ === 0) return apiError(529, 'Overloaded');
      seen.hung += 1;
      return { ...reply(implementorDone('answered after 20 s')), delayMs: 20_000 };
    };
    h = await fleetSetup(items, script);
    const adapter = h.adapter();
    const start = (id) => adapter.startAgent({ role: 'implementor', workItemID: id, branchName: `wi-${id}` });
    const hung = await start('1');
    // Its retry is the fleet's one probe, and it hangs.
    for (let i = 0; i < 200 && seen.hung === 0; i++) await new Promise((r) => setTimeout(r, 50));
    expect(seen.hung).toBe(1);
    const started = Date.now();
    const beside = await Promise.all(['2', '3', '4'].map(async (id) => {
      const handle = await start(id);
      const result = await handle.result;
      return { result, ms: Date.now() - started };
    }));
    for (const { result, ms } of beside) {
      expect(result.outcome).toBe('completed');
      // Their own time plus at most the probe's bound (5 s), not the 20 s of the hung request.
      expect(ms).toBeLessThan(14_000);
    }
    const result = await hung.result;
    expect(result.outcome).toBe('completed');
    expect(result.summary).toBe('answered after 20 s');
    expect(Date.now() - started).toBeGreaterThanOrEqual(19_000);
    console.log(`[measure] beside a hung request: ${beside.map((b) => `${(b.ms / 1000).toFixed(1)} s`).join(', ')}; the hung one ${((Date.now() - started) / 1000).toFixed(1)} s`);
  });

  it('two models, one overloaded for 20 s: the sessions of the other keep their normal pace (the pace is per model), and the overloaded one completes after', { timeout: 120_000 }, async () => {
    const items = ['1', '2', '3', '4'];
    const OVERLOADED = 'claude-opus-4-5';
    let since = null;
    const script = (body) => {
      const item = /Work Item #(\d+)/.exec(userText(body))?.[1];
      if (assistantTurns(body) === 0) return reply(bash(`echo ${item} > w${item}.txt && echo ok`));
      if (body.model?.startsWith(OVERLOADED)) {
        since ??= Date.now();
        if (Date.now() - since < 20_000) return apiError(529, 'Overloaded');
      }
      return implementorDone();
    };
    h = await fleetSetup(items, script);
    const adapter = h.adapter();
    const start = (id, model) => adapter.startAgent({ role: 'implementor', workItemID: id, branchName: `wi-${id}`, model });
    const overloaded = await start('1', OVERLOADED);
    for (let i = 0; i < 200 && since === null; i++) await new Promise((r) => setTimeout(r, 50));
    expect(since).not.toBeNull();
    const started = Date.now();
    const others = await Promise.all(['2', '3', '4'].map(async (id) => {
      const result = await (await start(id, 'claude-sonnet-4-5')).result;
      return { result, ms: Date.now() - started };
    }));
    for (const { result, ms } of others) {
      expect(result.outcome).toBe('completed');
      // Their own few seconds: no probe of the overloaded model's pace stands in their way.
      expect(ms).toBeLessThan(15_000);
    }
    expect((await overloaded.result).outcome).toBe('completed');
    expect(Date.now() - since).toBeGreaterThanOrEqual(19_000);
    console.log(`[measure] beside another model overloaded: ${others.map((o) => `${(o.ms / 1000).toFixed(1)} s`).join(', ')}`);
  });

  it('a CLI that ends on its turn limit after an earlier cut is not resumed again, and the resumed run had only the turns left', { timeout: 120_000 }, async () => {
    const { script: outage, outage: seen } = outageScript({
      work: 'echo t > t.txt && echo ok',
      ms: 3000,
      down: (o) => (o.downReplies === 1 ? { cut: true } : apiError(529, 'Overloaded')),
    });
    // After the outage the agent never finishes: it loops until its turn limit.
    const script = (body) => (seen.start !== null && Date.now() - seen.start >= 3000 ? reply(bash('true')) : outage(body));
    const agents = agentsWithTools(['Bash']);
    agents.implementor.maxTurns = 5;
    h = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents }, config: config() });
    const handle = await h.adapter().startAgent(implementorParams);
    const err = await rejection(handle.result);
    const stats = await handle.stats;
    expect(stats.api.resumes).toBe(1);
    // The resumed run's turns: its requests after the resume prompt, at most the 5 less what the
    // first run used (its work step). Counted by turn, not by request: a request the relay held
    // through the outage's last 529s reaches the API again as the same turn.
    const resumed = h.api.mainBodies().filter((b) => userText(b).includes('has been resumed'));
    const turns = new Set(resumed.map(assistantTurns));
    expect(turns.size).toBeGreaterThanOrEqual(1);
    expect(turns.size).toBeLessThanOrEqual(4);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).not.toMatch(/resumed \d+ times/);
  });

  it('a request the API answers 500 every time while it answers the others: that session fails within a few tries naming the status, not after the tolerance, and the sessions beside it complete', { timeout: 120_000 }, async () => {
    const items = ['1', '2', '3'];
    const seen = { failed: 0 };
    const script = (body) => {
      const item = /Work Item #(\d+)/.exec(userText(body))?.[1];
      const turn = assistantTurns(body);
      if (item === '1') {
        if (turn === 0) return reply(bash('echo one > w1.txt && echo ok'));
        seen.failed += 1;
        return apiError(500, 'Internal server error');
      }
      // The others keep the API answering: a few short steps each.
      return turn < 8 ? reply(bash(`sleep 0.5; echo ${item}-${turn} >> w${item}.txt`)) : implementorDone();
    };
    h = await fleetSetup(items, script);
    const adapter = h.adapter();
    const started = Date.now();
    const handles = await Promise.all(items.map((id) => adapter.startAgent({ role: 'implementor', workItemID: id, branchName: `wi-${id}` })));
    const [failed, ...others] = await Promise.allSettled(handles.map((x) => x.result));
    expect(failed.status).toBe('rejected');
    expect(failed.reason.code).toBe('ERR_AGENT_FAILED');
    expect(failed.reason.message).toMatch(/500/);
    expect(seen.failed).toBeLessThanOrEqual(8);
    expect(Date.now() - started).toBeLessThan(60_000);
    for (const o of others) expect(o.status === 'fulfilled' && o.value.outcome, JSON.stringify(o.reason ?? '')).toBe('completed');
    const out = await collect(handles[0].output);
    expect(out).toMatch(/the request's failure, not an outage/);
    console.log(`[measure] a request always answered 500: ${seen.failed} tries, session failed after ${((Date.now() - started) / 1000).toFixed(1)} s`);
  });

  it('an outage longer than apiOutageTolerance: ERR_AGENT_FAILED naming the outage, the work saved beside the transcript, nothing left running', { timeout: 120_000 }, async () => {
    const marker = `cra-outage-${process.pid}-${Date.now()}`;
    const { script } = outageScript({ work: `echo lost? > d.txt && git add -A && git commit -qm d && echo ${marker}`, ms: 3_600_000 });
    h = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config({ apiOutageTolerance: 5 }) });
    const started = Date.now();
    const handle = await h.adapter().startAgent(implementorParams);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(err.message).toMatch(/the model API was unavailable for \d+ s, past apiOutageTolerance \(5 s\): 529/);
    expect(Date.now() - started).toBeGreaterThanOrEqual(5000);
    expect(readFileSync(handle.logFilePath.replace(/\.[^./]+$/, '.patch'), 'utf8')).toContain('+lost?');
    expectNothingLeft(h.repo.root, marker);
  });

  it('a cancel while the relay holds a request settles at once, with nothing left', { timeout: 60_000 }, async () => {
    const { script, outage } = outageScript({ work: 'echo wip > e.txt && echo ok', ms: 3_600_000 });
    h = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config() });
    const adapter = h.adapter();
    const handle = await adapter.startAgent(implementorParams);
    while (outage.downReplies < 2) await new Promise((r) => setTimeout(r, 100));
    const asked = Date.now();
    await adapter.cancelAgent(handle.sessionID);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_CANCELLED');
    expect(Date.now() - asked).toBeLessThan(5000);
    expectNothingLeft(h.repo.root);
  });

  it('with apiOutageTolerance 0 nothing is held: the first failure ends the session as before', { timeout: 60_000 }, async () => {
    const { script, outage } = outageScript({ work: 'echo x > f.txt && echo ok', ms: 3_600_000 });
    h = await setup({ state: implementorState, bodies: { 7: 'Add a file.' }, script, repo: { agents: agentsWithTools(['Bash']) }, config: config({ apiOutageTolerance: 0 }) });
    const handle = await h.adapter().startAgent(implementorParams);
    const err = await rejection(handle.result);
    expect(err.code).toBe('ERR_AGENT_FAILED');
    expect(outage.downReplies).toBe(1);
  });
});

describe("the CLI's own request timeout", () => {
  it('is raised to the tolerance plus 10 minutes only where the relay holds requests: sandboxed, not with sandbox false (a hung request would wait 40 minutes for nothing)', { timeout: 60_000 }, async () => {
    const seen = {};
    for (const [name, sandbox] of [['sandboxed', {}], ['unsandboxed', false]]) {
      const hh = await setup({
        state: implementorState,
        bodies: { 7: 'Add a file.' },
        script: scenario.steps([reply(bash('echo "timeout=${API_TIMEOUT_MS:-unset}" | tee t.txt')), implementorDone()]),
        repo: { agents: agentsWithTools(['Bash']) },
        config: { sandbox, apiOutageTolerance: 1800 },
      });
      try {
        const handle = await hh.adapter().startAgent(implementorParams);
        await handle.result;
        seen[name] = latestToolResultText(hh.api.mainBodies().at(-1)).trim();
      } finally {
        await hh.cleanup();
      }
    }
    expect(seen).toEqual({ sandboxed: `timeout=${(1800 + 600) * 1000}`, unsandboxed: 'timeout=unset' });
  });
});

describe("the CLI's conversation is kept outside the sandbox", () => {
  it('a conversation file the agent replaced by a link to a host file is not copied beside the transcript', { timeout: 60_000 }, async () => {
    const link = 'for f in "$CLAUDE_CONFIG_DIR"/projects/*/*.jsonl; do rm -f "$f"; ln -s /etc/passwd "$f"; done; ls -l "$CLAUDE_CONFIG_DIR"/projects/*/ | grep -c passwd';
    h = await setup({
      state: implementorState,
      bodies: { 7: 'Add a file.' },
      script: scenario.steps([reply(bash(link)), implementorDone()]),
      repo: { agents: agentsWithTools(['Bash']) },
      config: config({ worktreeSetupCommand: null }),
    });
    const handle = await h.adapter().startAgent(implementorParams);
    await rejection(handle.result);
    expect(latestToolResultText(h.api.mainBodies().at(-1))).toMatch(/^1/);
    const kept = handle.logFilePath.replace(/\.[^./]+$/, '.conversation.jsonl');
    expect(existsSync(kept)).toBe(false);
  });
});
