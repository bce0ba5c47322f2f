// One place that wires the real addon to a temp git repository, the fake Messages API and the
// real Claude Code CLI, the way the engine wires it: config, deps from providers, a logger.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import * as addon from '../../index.js';
import { offlineCliEnv } from './cli-env.mjs';
import { startFakeApi } from './fake-api.mjs';
import { makeTempRepo } from './repo.mjs';

/** A logger that records every call: `entries` is `[{ level, message, data }]`. */
export function recordingLogger() {
  const entries = [];
  const at = (level) => (message, data) => entries.push({ level, message, data });
  return { entries, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

/** An engine provider object: its methods use `this`, like the engine's class instances. */
export class WorkItemProvider {
  constructor(bodies) {
    this.bodies = bodies;
    this.calls = 0;
  }
  async getWorkItemBody(id) {
    this.calls += 1;
    if (!(id in this.bodies)) throw new Error(`no body for ${id}`);
    return this.bodies[id];
  }
}

export class RevisionProvider {
  constructor(files) {
    this.files = files;
  }
  async getRevisionFiles(id) {
    return this.files[id] ?? [];
  }
}

export function engineState({ workItems = [], revisions = [], lastPlannedSHAs = [] } = {}) {
  return {
    workItems: new Map(workItems.map((w) => [w.id, w])),
    revisions: new Map(revisions.map((r) => [r.id, r])),
    lastPlannedSHAs: new Map(lastPlannedSHAs),
  };
}

/**
 * Start a fake API and a temp repo, and build config + deps for `createClaudeAdapter`.
 * `script` scripts the model (`sideScript` its requests that offer no tools); `state`, `bodies`, `files`, `history` feed the deps.
 */
export async function setup({
  script,
  sideScript,
  repo = {},
  state = engineState(),
  bodies = {},
  files = {},
  history = { reviews: [], inlineComments: [] },
  config = {},
  hook = async () => ({ decision: 'approve' }),
} = {}) {
  const api = await startFakeApi({ script, sideScript });
  const r = makeTempRepo(repo);
  const scratch = mkdtempSync(join(tmpdir(), 'cra-scratch-'));
  const logger = recordingLogger();
  const env = offlineCliEnv({ apiUrl: api.url, configDir: join(scratch, 'claude-config') });
  const hookCalls = [];
  const fullConfig = {
    repoRoot: r.root,
    defaultBranch: 'main',
    contextPaths: ['.claude/CLAUDE.md'],
    maxAgentDuration: 0,
    logging: { agentSessions: true, logsDir: join(scratch, 'logs') },
    bashValidatorHook: async (event) => {
      hookCalls.push(event);
      return hook(event);
    },
    logger,
    env,
    worktreeSetupCommand: null,
    sharedBase: SHARED_BASE,
    ...config,
  };
  const deps = {
    workItemReader: new WorkItemProvider(bodies),
    revisionReader: new RevisionProvider(files),
    getState: () => state,
    getReviewHistory: async () => history,
  };
  return {
    api,
    repo: r,
    scratch,
    logger,
    hookCalls,
    config: fullConfig,
    deps,
    adapter: () => addon.createClaudeAdapter(fullConfig, deps),
    async cleanup() {
      await api.close();
      r.cleanup();
      rmSync(scratch, { recursive: true, force: true });
    },
  };
}

/** Resolves with the first log entry whose message matches (the background sweep says when it is done). */
export async function logEntry(logger, message, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = logger.entries.find((e) => (message instanceof RegExp ? message.test(e.message) : e.message === message));
    if (found) return found;
    if (Date.now() > deadline) throw new Error(`no log entry ${message} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export const SWEPT = 'swept worktrees left by processes that are gone';
export const TEMP_SWEPT = 'removed temp directories of adapters whose process is gone';

/** Everything the output iterable yields, joined. */
export async function collect(output) {
  let text = '';
  for await (const chunk of output) text += chunk;
  return text;
}

/** The error a function throws (fails if it returns). */
export function thrown(fn) {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected a throw');
}

/** The error a promise rejects with (fails if it resolves). */
export async function rejection(promise) {
  try {
    const value = await promise;
    throw new Error(`expected a rejection, got ${JSON.stringify(value)?.slice(0, 500)}`);
  } catch (err) {
    return err;
  }
}

/**
 * Host pids of the live processes whose environment carries `FAKE_CLI_MARKER=<marker>`: a fake
 * CLI and what it started, found from outside its sandbox (inside, it sees its own pid
 * namespace's numbers), with their command lines.
 */
export function markedProcesses(marker) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      if (!readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(`FAKE_CLI_MARKER=${marker}`)) continue;
      if (readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] === 'Z') continue;
      found.push({ pid: Number(pid), cmdline: readFileSync(`/proc/${pid}/cmdline`, 'utf8') });
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/**
 * The argument of a `sleep` that marks one test's command among every process of the machine
 * (the other fork's tests run theirs at the same time): `seconds` then a fixed width of this
 * process's pid and the time, so no marker is a substring of another.
 */
export const sleepMarker = (seconds) => `${seconds}.${String(process.pid).padStart(7, '0')}${String(Date.now() % 100000).padStart(5, '0')}`;

export { addon };

const VIEW_NAME = /^\.base-[0-9a-f-]{36}$/;

/** Whether `path` is a Planner's or Reviewer's view of `root` (src/git/view.rs): its cwd. */
export const isViewOf = (root, path) => dirname(path) === join(root, '.worktrees') && VIEW_NAME.test(basename(path));

/** The one view of `root` while a single Planner or Reviewer session runs (its cwd). */
export function viewOf(root) {
  const views = readdirSync(join(root, '.worktrees')).filter((n) => VIEW_NAME.test(n));
  if (views.length !== 1) throw new Error(`expected one view under ${root}/.worktrees, found ${views.length}`);
  return join(root, '.worktrees', views[0]);
}

/**
 * The git dir of an Implementor's checkout as the host sees it: a layered checkout's `.git` is a
 * file naming its layer's `git/` (src/git/layer.rs), a full clone's is a directory.
 */
export function hostGitDir(checkout) {
  const dotGit = join(checkout, '.git');
  if (!statSync(dotGit).isFile()) return dotGit;
  return readFileSync(dotGit, 'utf8').trim().replace(/^gitdir: /, '');
}

/**
 * Where the files an agent wrote in its checkout are on the host: a layered checkout's in its
 * layer's `upper/` (its checkout exists only inside its sandbox), a full clone's in the clone.
 */
export function workOf(checkout) {
  const gitDir = hostGitDir(checkout);
  const layer = dirname(gitDir);
  return basename(gitDir) === 'git' && basename(layer).startsWith('.layer-') ? join(layer, 'upper') : checkout;
}

/** Whether the adapter makes Implementors' checkouts as layers (the default) or full clones (`CRA_TEST_SHARED_BASE=0`). */
export const SHARED_BASE = process.env.CRA_TEST_SHARED_BASE !== '0';

/** The bases (`.worktrees/.base-*`, src/git/base.rs) of `root`. */
export const basesOf = (root) => (existsSync(join(root, '.worktrees')) ? readdirSync(join(root, '.worktrees')).filter((n) => VIEW_NAME.test(n)) : []);
