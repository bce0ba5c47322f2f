// maxBudgetUsd through the real CLI: the relay counts every response's usage (the subagent's
// requests too) at the price table, refuses requests once the budget is spent, and the session
// ends ERR_BUDGET naming the budget and the spend; a budget never reached changes nothing.
import { existsSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { bash, reply, scenario, text, toolUse, userText } from './support/fake-api.mjs';
import { ROLES, implementorDone, implementorParams, implementorState } from './support/roles.mjs';
import { addon, rejection, setup, thrown } from './support/harness.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

/** Every reply costs exactly $0.30 at the table's Sonnet 4.5 rate ($15 per million output tokens). */
const MODEL = 'claude-sonnet-4-5';
const USAGE = { input_tokens: 0, output_tokens: 20_000, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 };
const COST = 0.3;
/** A request's worst case as the relay reserves it: its max_tokens at $15, its bytes / 2 as input at $3, per million. */
const worstCase = (r) => (r.body.max_tokens * 15 + (Buffer.byteLength(JSON.stringify(r.body)) / 2) * 3) / 1e6;
const costing = (r) => ({ ...r, usage: USAGE });

/** The subagent's prompt carries this, so its requests can be told from the main loop's. */
const SUB = 'SUBAGENT-TASK-MARK';
const isSubagent = (body) => userText(body).includes(SUB);
/** The CLI's subagent tool (its name in CLI 2.1.x). */
const AGENT_TOOL = 'Task';

const agents = {
  implementor: { description: 'Implements', tools: ['Bash', 'Read', AGENT_TOOL], prompt: 'You are the implementor.' },
};

describe('a hard budget (maxBudgetUsd)', () => {
  it("a session in a loop ends ERR_BUDGET before any request whose worst case would pass it, its subagent requests counted, its work saved; the spend never passes the budget", async () => {
    const main = scenario.steps([
      // The first turn hands a task to a subagent, whose answer costs as much as a turn.
      costing(reply(toolUse(AGENT_TOOL, { description: 'sub task', prompt: `Do it. ${SUB}`, subagent_type: 'general-purpose' }))),
      costing(reply(bash('echo work > work.txt'))),
      // Then it loops for ever.
      costing(reply(bash('true'))),
    ]);
    h = await setup({
      script: (body) => (isSubagent(body) ? costing(reply(text('sub done'))) : main(body)),
      repo: { agents },
      state: implementorState,
      bodies: { 7: 'x' },
      // The params' budget wins over the config's.
      config: { maxBudgetUsd: 100 },
    });
    const BUDGET = 2;
    const handle = await h.adapter().startAgent({ ...implementorParams, model: MODEL, maxBudgetUsd: BUDGET });
    const err = await rejection(handle.result);
    const stats = await handle.stats;
    const sent = h.api.requests.filter((r) => r.path === '/v1/messages');
    const subagent = sent.filter((r) => isSubagent(r.body));
    expect(subagent.length, JSON.stringify(sent.map((r) => r.reply))).toBeGreaterThanOrEqual(1);
    // $0.30 each; each was sent only while $1 held the spend and its worst case, so the one
    // after the last sent would have passed it (were the subagent's not counted, one more
    // would have been sent).
    expect(sent.length * COST).toBeLessThanOrEqual(BUDGET);
    expect(sent.length).toBe(Math.floor((BUDGET - worstCase(sent.at(-1))) / COST) + 1);
    expect(err.code).toBe('ERR_BUDGET');
    expect(err.message).toMatch(/^\[ERR_BUDGET\] /);
    expect(err.message).toContain(`$${(sent.length * COST).toFixed(4)} of maxBudgetUsd $${BUDGET} (${sent.length} model requests); the next request's worst case`);
    expect(handle.abortSignal.aborted).toBe(false);
    expect(stats.spend).toMatchObject({ requests: sent.length, budgetUsd: BUDGET });
    expect(stats.spend.usd).toBeCloseTo(sent.length * COST, 9);
    expect(stats.spend.usd).toBeLessThanOrEqual(BUDGET);
    // What the Implementor's checkout held is saved as for any failed run.
    const saved = handle.logFilePath.replace(/\.log$/, '.patch');
    expect(existsSync(saved)).toBe(true);
    expect(readFileSync(saved, 'utf8')).toContain('work.txt');
    const log = readFileSync(handle.logFilePath, 'utf8');
    expect(log).toContain('[budget]');
    expect(h.logger.entries.find((e) => e.message === 'agent session failed')?.data?.code).toBe('ERR_BUDGET');
  });

  it('four subagents in parallel against a budget: their requests wait for room or are refused, and the spend never passes it', async () => {
    const task = (i) => toolUse(AGENT_TOOL, { description: `sub task ${i}`, prompt: `Do part ${i}. ${SUB}`, subagent_type: 'general-purpose' });
    // The CLI runs the four in the background and its main loop goes on beside them: its next
    // request waits out a command long enough for the subagents' to come first (it spending
    // the room before the second subagent's was what failed this test on a loaded machine).
    const main = scenario.steps([costing(reply(task(1), task(2), task(3), task(4))), costing(reply(bash('sleep 10')))]);
    h = await setup({
      // Each subagent's answer takes a moment, so the four are in flight together.
      script: (body) => (isSubagent(body) ? { ...costing(reply(text('sub done'))), delayMs: 400 } : main(body)),
      repo: { agents },
      state: implementorState,
      bodies: { 7: 'x' },
    });
    const handle = await h.adapter().startAgent({ ...implementorParams, model: MODEL, maxBudgetUsd: 1.5 });
    const err = await rejection(handle.result);
    const stats = await handle.stats;
    const sent = h.api.requests.filter((r) => r.path === '/v1/messages');
    expect(sent.filter((r) => isSubagent(r.body)).length).toBeGreaterThanOrEqual(2);
    expect(err.code).toBe('ERR_BUDGET');
    expect(stats.spend.requests).toBe(sent.length);
    expect(stats.spend.usd).toBeLessThanOrEqual(1.5);
    expect(stats.spend.refused).toBeGreaterThanOrEqual(1);
  });

  it('a budget never reached changes nothing: the same result, every request sent, the spend in the stats', async () => {
    h = await setup({
      script: scenario.steps([costing(reply(bash('echo ok > ok.txt'))), costing(reply(implementorDone('fine')))]),
      state: implementorState,
      bodies: { 7: 'x' },
      // The config's budget would be crossed at the 2nd request; the params' is not.
      config: { maxBudgetUsd: 0.5 },
    });
    const adapter = h.adapter();
    const handle = await adapter.startAgent({ ...implementorParams, model: MODEL, maxBudgetUsd: 1000 });
    const result = await handle.result;
    expect(result).toMatchObject({ role: 'implementor', outcome: 'completed', summary: 'fine' });
    expect(result.patch).toContain('ok.txt');
    const stats = await handle.stats;
    const sent = h.api.requests.filter((r) => r.path === '/v1/messages');
    expect(sent.length).toBe(2);
    expect(stats.spend).toMatchObject({ requests: 2, refused: 0, budgetUsd: 1000 });
    expect(stats.spend.usd).toBeCloseTo(2 * COST, 9);
  });

  it('a session without a budget still has its spend in its stats', async () => {
    h = await setup({ script: scenario.steps([costing(reply(ROLES.planner.done))]) });
    const handle = await h.adapter().startAgent({ ...ROLES.planner.params(), model: MODEL });
    await handle.result;
    const stats = await handle.stats;
    expect(stats.spend).toMatchObject({ requests: 1, refused: 0, budgetUsd: null });
    expect(stats.spend.usd).toBeCloseTo(COST, 9);
  });

  it('modelPrices overrides the table', async () => {
    h = await setup({
      script: scenario.steps([costing(reply(ROLES.planner.done))]),
      config: { modelPrices: { [MODEL]: { input: 0, output: 50 } } },
    });
    const handle = await h.adapter().startAgent({ ...ROLES.planner.params(), model: MODEL });
    await handle.result;
    expect((await handle.stats).spend.usd).toBeCloseTo(1.0, 9);
  });
});

describe('budget fields are checked (ERR_INVALID_PARAMS naming the field)', () => {
  const configCases = [
    ['negative', { maxBudgetUsd: -1 }, 'config.maxBudgetUsd must be a number in [0, 1000000] (got -1)'],
    ['NaN', { maxBudgetUsd: NaN }, 'config.maxBudgetUsd must be a number in [0, 1000000] (got NaN)'],
    ['Infinity', { maxBudgetUsd: Infinity }, 'config.maxBudgetUsd must be a number in [0, 1000000] (got Infinity)'],
    ['a string', { maxBudgetUsd: '5' }, 'config.maxBudgetUsd must be a number'],
    ['too large', { maxBudgetUsd: 2e6 }, 'config.maxBudgetUsd must be a number in [0, 1000000]'],
    ['with sandbox: false, which has no relay to count it', { maxBudgetUsd: 1, sandbox: false }, 'config.maxBudgetUsd needs the sandbox'],
    ['modelPrices not an object', { modelPrices: 3 }, 'config.modelPrices must be an object'],
    ['a price out of range', { modelPrices: { 'claude-x': { input: -2, output: 1 } } }, 'config.modelPrices["claude-x"].input must be a number in [0, 1000000] (got -2)'],
    ['a price missing', { modelPrices: { 'claude-x': { input: 2 } } }, 'config.modelPrices["claude-x"].output must be a number'],
  ];
  for (const [name, override, message] of configCases) {
    it(`createClaudeAdapter refuses maxBudgetUsd/modelPrices ${name}`, async () => {
      h = await setup({});
      const err = thrown(() => addon.createClaudeAdapter({ ...h.config, ...override }, h.deps));
      expect(err.code).toBe('ERR_INVALID_PARAMS');
      expect(err.message).toContain(message);
    });
  }

  const paramCases = [
    ['negative', -0.5, 'params.maxBudgetUsd must be a number in [0, 1000000] (0: no budget) (got -0.5)'],
    ['NaN', NaN, '(got NaN)'],
    ['a string', '1', 'params.maxBudgetUsd must be a number'],
    ['too large', 1e9, 'params.maxBudgetUsd must be a number in [0, 1000000]'],
  ];
  for (const [name, value, message] of paramCases) {
    it(`startAgent refuses params.maxBudgetUsd ${name}`, async () => {
      h = await setup({});
      const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [], maxBudgetUsd: value }));
      expect(err.code).toBe('ERR_INVALID_PARAMS');
      expect(err.message).toContain(message);
    });
  }

  it('startAgent refuses a budget for a session no relay would count (sandbox: false), and takes 0 (none) there', async () => {
    h = await setup({ script: scenario.steps([ROLES.planner.done]), config: { sandbox: false } });
    const adapter = h.adapter();
    const err = await rejection(adapter.startAgent({ ...ROLES.planner.params(), maxBudgetUsd: 1 }));
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    expect(err.message).toContain('params.maxBudgetUsd needs the sandbox');
    expect(h.api.requests.length).toBe(0);
    const handle = await adapter.startAgent({ ...ROLES.planner.params(), maxBudgetUsd: 0 });
    await handle.result;
    expect((await handle.stats).spend).toBe(null);
  });
});
