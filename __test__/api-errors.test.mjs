// Every error path of the API table that comes before an agent runs, triggered for real
// through the addon: bad config, bad params, agent definitions, context callbacks, the CLI.
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { scenario, structured } from './support/fake-api.mjs';
import { addon, engineState, rejection, setup, thrown } from './support/harness.mjs';

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

const plannerOk = scenario.steps([structured({ role: 'planner', create: [], close: [], update: [] })]);

describe('createClaudeAdapter checks its config (ERR_INVALID_PARAMS naming the field)', () => {
  const cases = [
    ['repoRoot relative', { repoRoot: 'relative/path' }, 'config.repoRoot'],
    ['repoRoot missing on disk', { repoRoot: '/nonexistent/repo/root' }, 'config.repoRoot'],
    ['repoRoot not a git repository', { repoRoot: '/tmp' }, 'not a git repository'],
    ['defaultBranch unknown', { defaultBranch: 'no-such-branch' }, 'config.defaultBranch'],
    ['contextPaths escaping the repo', { contextPaths: ['../outside.md'] }, 'config.contextPaths[0]'],
    ['contextPaths absolute', { contextPaths: ['/etc/passwd'] }, 'config.contextPaths[0]'],
    ['maxAgentDuration negative', { maxAgentDuration: -1 }, 'config.maxAgentDuration'],
    ['maxAgentDuration not a number', { maxAgentDuration: 'soon' }, 'config.maxAgentDuration'],
    ['logging missing', { logging: undefined }, 'config.logging'],
    ['bashValidatorHook not callable', { bashValidatorHook: 'yes' }, 'config.bashValidatorHook'],
    ['logger.info not callable', { logger: { debug() {}, info: 1, error() {} } }, 'config.logger.info'],
    ['logger.warn present but not callable', { logger: { debug() {}, info() {}, error() {}, warn: 'x' } }, 'config.logger.warn'],
    ['contextConcurrency zero', { contextConcurrency: 0 }, 'config.contextConcurrency'],
    ['worktreeSetupCommand empty', { worktreeSetupCommand: [] }, 'config.worktreeSetupCommand'],
    ['env with a non-string value', { env: { A: 1 } }, 'config.env.A'],
  ];
  for (const [name, override, field] of cases) {
    it(name, async () => {
      h = await setup({});
      const err = thrown(() => addon.createClaudeAdapter({ ...h.config, ...override }, h.deps));
      expect(err).toBeInstanceOf(Error);
      expect(err.code).toBe('ERR_INVALID_PARAMS');
      expect(err.message).toContain(field);
    });
  }

  it('a deps callback that is not callable', async () => {
    h = await setup({});
    const err = thrown(() => addon.createClaudeAdapter(h.config, { ...h.deps, getState: 5 }));
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    expect(err.message).toContain('deps.getState');
  });
});

describe('startAgent checks its params (ERR_INVALID_PARAMS naming the field)', () => {
  const cases = [
    ['an unknown role', { role: 'tester' }, 'params.role'],
    ['an empty workItemID', { role: 'implementor', workItemID: '', branchName: 'b' }, 'params.workItemID'],
    ['an empty revisionID', { role: 'reviewer', workItemID: '1', revisionID: '' }, 'params.revisionID'],
    ['specPaths that is not an array', { role: 'planner', specPaths: 'specs/a.md' }, 'params.specPaths'],
    ['a spec path outside repoRoot', { role: 'planner', specPaths: ['../../etc/passwd'] }, 'specPaths'],
    ['a branch name with ..', { role: 'implementor', workItemID: '1', branchName: 'a/../../b' }, 'branchName'],
    ['a branch name with a leading -', { role: 'implementor', workItemID: '1', branchName: '-rf' }, 'branchName'],
    ['a branch name with @{', { role: 'implementor', workItemID: '1', branchName: 'a@{1}' }, 'branchName'],
    ['a branch name with a control character', { role: 'implementor', workItemID: '1', branchName: 'a\u0007b' }, 'branchName'],
    ['a branch name ending in .lock', { role: 'implementor', workItemID: '1', branchName: 'feature.lock' }, 'branchName'],
    ['an absolute branch name', { role: 'implementor', workItemID: '1', branchName: '/tmp/x' }, 'branchName'],
    ['an empty sessionID', { role: 'planner', specPaths: [], sessionID: '' }, 'params.sessionID'],
    ['a blank sessionID', { role: 'planner', specPaths: [], sessionID: '   ' }, 'params.sessionID'],
    ['a sessionID that is not a string', { role: 'planner', specPaths: [], sessionID: 42 }, 'params.sessionID'],
    ['an empty model', { role: 'planner', specPaths: [], model: '' }, 'params.model'],
  ];
  for (const [name, params, field] of cases) {
    it(`rejects ${name}`, async () => {
      h = await setup({});
      const adapter = h.adapter();
      const err = await rejection(adapter.startAgent(params));
      expect(err.code).toBe('ERR_INVALID_PARAMS');
      expect(err.message).toContain(field);
      // previewPrompt validates the same way
      expect((await rejection(adapter.previewPrompt(params))).code).toBe('ERR_INVALID_PARAMS');
    });
  }
});

describe('agent definitions and project context (ERR_AGENT_DEFINITION)', () => {
  it('a missing agent definition file', async () => {
    h = await setup({ script: plannerOk, repo: { agents: { implementor: { description: 'x', tools: ['Bash'], prompt: 'p' } } } });
    const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_AGENT_DEFINITION');
    expect(err.message).toContain('planner.md');
  });

  it('malformed YAML frontmatter', async () => {
    h = await setup({ script: plannerOk });
    writeFileSync(join(h.repo.root, '.claude/agents/planner.md'), '---\ndescription: "unterminated\ntools: [Read\n---\nbody\n');
    const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_AGENT_DEFINITION');
  });

  it('a maxTurns that is not an integer', async () => {
    h = await setup({ script: plannerOk });
    writeFileSync(join(h.repo.root, '.claude/agents/planner.md'), '---\ndescription: p\nmaxTurns: lots\n---\nbody\n');
    const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_AGENT_DEFINITION');
    expect(err.message).toContain('maxTurns');
  });

  it('an unreadable context file', async () => {
    h = await setup({ script: plannerOk, config: { contextPaths: ['.claude/CLAUDE.md', 'docs/missing.md'] } });
    const err = await rejection(h.adapter().startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_AGENT_DEFINITION');
    expect(err.message).toContain('docs/missing.md');
  });

  it('context files are appended to the agent prompt the CLI receives', async () => {
    h = await setup({ script: plannerOk, repo: { claudeMd: '# Conventions\nUse tabs.\n' } });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    await handle.result;
    const system = JSON.stringify(h.api.mainBodies()[0].system);
    expect(system).toContain('You are the planner.\\n\\n# Conventions\\nUse tabs.');
  });
});

describe('context callbacks (ERR_CONTEXT with the original error as cause)', () => {
  const state = engineState({ workItems: [{ id: '1', title: 'One', status: 'open', linkedRevision: null }] });

  it('getState throwing synchronously', async () => {
    h = await setup({ state });
    const boom = new Error('state store offline');
    h.deps.getState = () => {
      throw boom;
    };
    const err = await rejection(h.adapter().previewPrompt({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.cause).toBe(boom);
    expect(err.message).toContain('getState');
  });

  it('getWorkItemBody rejecting, called with the provider as this', async () => {
    h = await setup({ state });
    const boom = new Error('GitHub 502');
    class Reader {
      constructor() {
        this.err = boom;
      }
      async getWorkItemBody() {
        throw this.err;
      }
    }
    h.deps.workItemReader = new Reader();
    const err = await rejection(h.adapter().previewPrompt({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.cause).toBe(boom);
    expect(err.message).toContain('getWorkItemBody');
  });

  it('a wrong shape names the callback and the field', async () => {
    h = await setup({ state: { workItems: new Map([['1', { id: '1', title: 7, status: 'open', linkedRevision: null }]]), revisions: {}, lastPlannedSHAs: {} } });
    const err = await rejection(h.adapter().previewPrompt({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.message).toContain('getState()');
    expect(err.message).toContain('workItems["1"].title must be a string');
  });

  it('revision files of the wrong shape', async () => {
    h = await setup({
      state: engineState({ workItems: [{ id: '1', title: 'One', status: 'open', linkedRevision: 'r' }], revisions: [{ id: 'r', title: 'R', pipeline: null }] }),
      bodies: { 1: 'b' },
      files: { r: [{ path: 'a', status: 'added' }, { path: 'b', status: 5, patch: null }] },
    });
    const err = await rejection(h.adapter().previewPrompt({ role: 'reviewer', workItemID: '1', revisionID: 'r' }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.message).toContain('getRevisionFiles');
    expect(err.message).toContain('[1].status');
  });

  it('a callback that never settles fails within the bound instead of hanging', async () => {
    process.env.CLAUDE_RUNTIME_ADAPTER_CONTEXT_TIMEOUT_MS = '200';
    try {
      h = await setup({ state });
      h.deps.workItemReader = { getWorkItemBody: () => new Promise(() => {}) };
      const adapter = h.adapter();
      const err = await rejection(adapter.previewPrompt({ role: 'planner', specPaths: [] }));
      expect(err.code).toBe('ERR_CONTEXT');
      expect(err.message).toContain('did not settle within 200 ms');
    } finally {
      delete process.env.CLAUDE_RUNTIME_ADAPTER_CONTEXT_TIMEOUT_MS;
    }
  });

  it('a missing spec file', async () => {
    h = await setup({ state, bodies: { 1: 'Body one' } });
    const err = await rejection(h.adapter().previewPrompt({ role: 'planner', specPaths: ['specs/none.md'] }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.message).toContain('specs/none.md');
  });

  it('an unknown last-planned blob SHA', async () => {
    h = await setup({ state: engineState({ lastPlannedSHAs: [['README.md', 'a'.repeat(40)]] }) });
    const err = await rejection(h.adapter().previewPrompt({ role: 'planner', specPaths: ['README.md'] }));
    expect(err.code).toBe('ERR_CONTEXT');
  });

  it('a work item that is not in state', async () => {
    h = await setup({ state });
    const err = await rejection(h.adapter().previewPrompt({ role: 'implementor', workItemID: '404', branchName: 'b' }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(err.message).toContain('404');
  });

  it('a context failure at startAgent removes the worktree it made', async () => {
    h = await setup({ state, bodies: {} });
    const err = await rejection(h.adapter().startAgent({ role: 'implementor', workItemID: '1', branchName: 'ctx-fail' }));
    expect(err.code).toBe('ERR_CONTEXT');
    expect(h.repo.git('worktree', 'list').trim().split('\n')).toHaveLength(1);
    expect(h.repo.git('branch', '--list', 'ctx-fail').trim()).toBe('');
  });

  it('plain objects work where the engine hands Maps', async () => {
    h = await setup({
      state: { workItems: { 1: { id: '1', title: 'One', status: 'open', linkedRevision: null } }, revisions: {}, lastPlannedSHAs: {} },
      bodies: { 1: 'Body one' },
    });
    const prompt = await h.adapter().previewPrompt({ role: 'planner', specPaths: [] });
    expect(prompt).toContain('### WorkItem #1 — One\nStatus: open\n\nBody one');
  });

  it('getState may return a promise of the state', async () => {
    h = await setup({ bodies: { 1: 'Body one' } });
    h.deps.getState = async () => state;
    const prompt = await h.adapter().previewPrompt({ role: 'planner', specPaths: [] });
    expect(prompt).toContain('WorkItem #1');
  });

  it('provider calls are bounded by contextConcurrency', async () => {
    const items = Array.from({ length: 200 }, (_, i) => ({ id: String(i), title: `T${i}`, status: 'open', linkedRevision: null }));
    h = await setup({ state: engineState({ workItems: items }), config: { contextConcurrency: 4 } });
    let inFlight = 0;
    let peak = 0;
    h.deps.workItemReader = {
      async getWorkItemBody(id) {
        inFlight += 1;
        peak = Math.max(peak, inFlight);
        await new Promise((r) => setTimeout(r, 2));
        inFlight -= 1;
        return `body ${id}`;
      },
    };
    const prompt = await h.adapter().previewPrompt({ role: 'planner', specPaths: [] });
    expect(peak).toBe(4);
    // state order, not completion order
    expect(prompt.indexOf('WorkItem #0 ')).toBeLessThan(prompt.indexOf('WorkItem #199 '));
  });
});

describe('the CLI', () => {
  it('none found is ERR_CLI_NOT_FOUND listing every place tried', async () => {
    // A copy of the addon in a directory with no node_modules above it, run by a child Node
    // with a PATH that has no `claude`: nothing is found anywhere.
    h = await setup({ script: plannerOk });
    const dir = mkdtempSync(join(tmpdir(), 'cra-lonely-'));
    try {
      for (const f of readdirSync(process.cwd()).filter((f) => f.endsWith('.node') || f === 'index.js')) copyFileSync(join(process.cwd(), f), join(dir, f));
      const script = `
        const { createClaudeAdapter } = require(${JSON.stringify(join(dir, 'index.js'))});
        const noop = () => {};
        const adapter = createClaudeAdapter({
          repoRoot: ${JSON.stringify(h.repo.root)}, defaultBranch: 'main', contextPaths: [], maxAgentDuration: 0,
          logging: { agentSessions: false, logsDir: '' }, bashValidatorHook: async () => undefined,
          logger: { debug: noop, info: noop, error: noop }, sandbox: false, // no bwrap on this PATH either
        }, { workItemReader: { getWorkItemBody: async () => '' }, revisionReader: { getRevisionFiles: async () => [] },
             getState: () => ({ workItems: {}, revisions: {}, lastPlannedSHAs: {} }), getReviewHistory: async () => ({ reviews: [], inlineComments: [] }) });
        adapter.startAgent({ role: 'planner', specPaths: [] }).then(
          () => { console.log(JSON.stringify({ resolved: true })); },
          (e) => { console.log(JSON.stringify({ code: e.code, message: e.message })); });`;
      // PATH holds git (the adapter needs it) and no `claude`.
      const bin = join(dir, 'bin');
      mkdirSync(bin);
      symlinkSync(execFileSync('sh', ['-c', 'command -v git']).toString().trim(), join(bin, 'git'));
      const out = execFileSync(process.execPath, ['-e', script], { cwd: dir, env: { PATH: bin, HOME: dir } }).toString();
      const err = JSON.parse(out);
      expect(err.code).toBe('ERR_CLI_NOT_FOUND');
      expect(err.message).toContain(join(dir, 'node_modules/@anthropic-ai/claude-agent-sdk-linux-x64/claude'));
      expect(err.message).toContain('`claude` on PATH');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the logger', () => {
  it('a logger that throws never breaks a session or crashes Node', async () => {
    h = await setup({ script: plannerOk });
    const throwing = () => {
      throw new Error('logger down');
    };
    const adapter = addon.createClaudeAdapter({ ...h.config, logger: { debug: throwing, info: throwing, warn: throwing, error: throwing } }, h.deps);
    const handle = await adapter.startAgent({ role: 'planner', specPaths: [] });
    expect(await handle.result).toEqual({ role: 'planner', create: [], close: [], update: [] });
  });

  it('logs session lifecycle with session id and role', async () => {
    h = await setup({ script: plannerOk });
    const handle = await h.adapter().startAgent({ role: 'planner', specPaths: [] });
    await handle.result;
    const done = h.logger.entries.find((e) => e.message === 'agent session completed');
    expect(done).toEqual({ level: 'info', message: 'agent session completed', data: { sessionID: handle.sessionID, role: 'planner', stats: await handle.stats } });
    expect(h.logger.entries.find((e) => e.message === 'starting agent session')?.data).toEqual({ sessionID: handle.sessionID, role: 'planner' });
  });
});

describe('the OS sandbox', () => {
  it('bubblewrap missing from the PATH the CLI gets is ERR_SANDBOX_UNAVAILABLE naming it and the install command', async () => {
    h = await setup({ script: plannerOk });
    const bin = join(h.scratch, 'bin');
    mkdirSync(bin);
    for (const tool of ['git', 'socat']) symlinkSync(execFileSync('sh', ['-c', `command -v ${tool}`]).toString().trim(), join(bin, tool));
    const adapter = addon.createClaudeAdapter({ ...h.config, env: { ...h.config.env, PATH: bin } }, h.deps);
    const err = await rejection(adapter.startAgent({ role: 'planner', specPaths: [] }));
    expect(err.code).toBe('ERR_SANDBOX_UNAVAILABLE');
    expect(err.message).toContain('bubblewrap (bwrap)');
    expect(err.message).toContain('apt-get install -y bubblewrap socat');
  });
});
