#!/usr/bin/env node
// `npm run demo`: one full Planner → Implementor → Reviewer cycle through the public API, on a
// throwaway git repository this script creates, with the real Claude Code CLI.
//
//   Offline (default): the "model" is a scripted fake of the Anthropic Messages API on
//   127.0.0.1 (__test__/support/fake-api.mjs) telling a small, fixed story.
//   ANTHROPIC_API_KEY set: the real API and whatever the real model decides (costs tokens).
//
// Flags: --keep     keep the throwaway repository, transcripts and scratch dirs (path printed)
//        --verbose  also print the adapter's info/debug log lines
//
// The "engine" here is a stand-in: an in-memory state store, provider objects for the work
// item bodies and revision files, and a logger. It turns the planner's output into work items
// and the implementor's patch into a revision, the way the real engine would.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
// By package name (Node resolves a package's own name through its `exports`): the same line runs
// in a user's project, where `npm run test:install` runs this demo against the installed package.
import api from 'claude-runtime-adapter';
import { offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { latestToolResultText, reply, scenario, startFakeApi, structured, systemText, text, toolUse, bash, userText } from '../__test__/support/fake-api.mjs';

const { createClaudeAdapter } = api;

const args = new Set(process.argv.slice(2));
for (const a of args) {
  if (!['--keep', '--verbose', '--help', '-h'].includes(a)) {
    console.error(`demo: unknown argument ${a} (flags: --keep, --verbose)`);
    process.exit(2);
  }
}
if (args.has('--help') || args.has('-h')) {
  console.log('usage: npm run demo [-- --keep] [-- --verbose]\n  --keep     keep the throwaway repository and transcripts\n  --verbose  print the adapter log');
  process.exit(0);
}
const KEEP = args.has('--keep');
const VERBOSE = args.has('--verbose');
const REAL_API = Boolean(process.env.ANTHROPIC_API_KEY);

// ---------------------------------------------------------------- printing

const color = process.stdout.isTTY && !process.env.NO_COLOR;
const paint = (code) => (s) => (color ? `\x1b[${code}m${s}\x1b[0m` : s);
const bold = paint('1');
const dim = paint('2');
const red = paint('31');
const green = paint('32');
const cyan = paint('36');
const yellow = paint('33');
const ROLE_COLOR = { planner: paint('35'), implementor: paint('34'), reviewer: paint('33') };
const say = (s = '') => process.stdout.write(`${s}\n`);
const prefixed = (role, s) => {
  const p = ROLE_COLOR[role](`[${role}]`);
  for (const line of String(s).replace(/\n+$/, '').split('\n')) say(`${p} ${line}`);
};
const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;
const header = (s) => say(`\n${bold(cyan(`━━ ${s} `.padEnd(72, '━')))}`);

function printPatch(patch) {
  for (const line of patch.replace(/\n$/, '').split('\n')) {
    if (line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff --git')) say(bold(line));
    else if (line.startsWith('+')) say(green(line));
    else if (line.startsWith('-')) say(red(line));
    else if (line.startsWith('@@')) say(cyan(line));
    else say(line);
  }
}

// ---------------------------------------------------------------- the throwaway repository

const SPEC_PATH = 'specs/slugify.md';

const agentFile = (name, description, tools, prompt) =>
  ['---', `name: ${name}`, `description: ${JSON.stringify(description)}`, `tools: ${tools.join(', ')}`, '---', '', prompt, ''].join('\n');

const REPO_FILES = {
  'README.md': '# tinytext\n\nSmall text utilities: ES modules, no dependencies.\n\n```js\nimport { wordCount } from \'./src/index.mjs\';\nwordCount(\'two words\'); // 2\n```\n',
  'src/index.mjs': "export { wordCount } from './wordcount.mjs';\n",
  'src/wordcount.mjs': "/** Number of whitespace-separated words in `text`. */\nexport function wordCount(text) {\n  return text.split(/\\s+/).filter(Boolean).length;\n}\n",
  [SPEC_PATH]: [
    '# Spec: slugify',
    '',
    'tinytext gets a `slugify(text)` function for building URL fragments.',
    '',
    '- The result is lower-case; ASCII letters and digits are kept.',
    '- Every other run of characters becomes a single `-`.',
    '- No leading or trailing `-`; an empty input gives an empty string.',
    '- It is exported from `src/index.mjs`, with a test in `test/`.',
    '- The README documents it with an example.',
    '',
  ].join('\n'),
  '.claude/CLAUDE.md': [
    '# tinytext',
    '',
    '- ES modules (`.mjs`), no dependencies, Node 20+.',
    '- One function per file in `src/`, re-exported from `src/index.mjs`.',
    '- Tests live in `test/<name>.test.mjs` and use `node:test`.',
    '- Commit messages: imperative mood, one line.',
    '',
  ].join('\n'),
  '.claude/agents/planner.md': agentFile(
    'planner',
    'Turns changed specs into work items',
    ['Read', 'Glob', 'Grep'],
    'You are the planner. Read the changed specs and the existing work items, and plan small, independently reviewable work items (title, body with acceptance criteria, labels, blockedBy by tempID). Do not write code. Return the plan as structured output.',
  ),
  '.claude/agents/implementor.md': agentFile(
    'implementor',
    'Implements one work item on its branch',
    ['Bash', 'Read', 'Edit', 'Write', 'Glob', 'Grep'],
    'You are the implementor. Implement exactly the work item you are given, in the current directory, following the project conventions. Keep changes small. Commit with git when a coherent part is done. Return the outcome and a one-paragraph summary as structured output.',
  ),
  '.claude/agents/reviewer.md': agentFile(
    'reviewer',
    'Reviews a revision against its work item',
    ['Read', 'Glob', 'Grep'],
    'You are the reviewer. Review the revision\'s changed files against the work item and the project conventions. Approve, or ask for changes with concrete comments (path, line, body). Return the review as structured output.',
  ),
};

const git = (cwd, ...a) => execFileSync('git', a, { cwd, stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8' });

function makeRepo(root) {
  mkdirSync(root, { recursive: true });
  git(root, 'init', '-q', '-b', 'main');
  git(root, 'config', 'user.name', 'Demo Agent');
  git(root, 'config', 'user.email', 'demo@example.invalid');
  git(root, 'config', 'commit.gpgsign', 'false');
  for (const [rel, content] of Object.entries(REPO_FILES)) {
    mkdirSync(dirname(join(root, rel)), { recursive: true });
    writeFileSync(join(root, rel), content);
  }
  git(root, 'add', '-A');
  git(root, 'commit', '-q', '-m', 'tinytext: wordCount, slugify spec, agent definitions');
}

// ---------------------------------------------------------------- the scripted model (offline)

const SLUGIFY_SRC = [
  '/** `text` as a URL fragment: lower-case ASCII letters and digits, other runs become `-`. */',
  'export function slugify(text) {',
  '  return String(text)',
  '    .toLowerCase()',
  "    .replace(/[^a-z0-9]+/g, '-')",
  "    .replace(/^-+|-+$/g, '');",
  '}',
  '',
].join('\n');

const SLUGIFY_TEST = [
  "import { test } from 'node:test';",
  "import assert from 'node:assert/strict';",
  "import { slugify } from '../src/index.mjs';",
  '',
  "test('slugify', () => {",
  "  assert.equal(slugify('Hello, World!'), 'hello-world');",
  "  assert.equal(slugify('  --Already--slugged--  '), 'already-slugged');",
  "  assert.equal(slugify(''), '');",
  '});',
  '',
].join('\n');

const PLAN = {
  role: 'planner',
  create: [
    {
      tempID: 'slugify-fn',
      title: 'Add slugify() and export it from src/index.mjs',
      body: [
        'Implement `slugify(text)` in `src/slugify.mjs` as specified in `specs/slugify.md`.',
        '',
        '- [ ] lower-case; ASCII letters and digits kept; other runs become one `-`',
        '- [ ] no leading/trailing `-`; empty input gives `""`',
        '- [ ] exported from `src/index.mjs`',
        '- [ ] `test/slugify.test.mjs` covers the rules',
      ].join('\n'),
      labels: ['feature'],
      blockedBy: [],
    },
    {
      tempID: 'slugify-docs',
      title: 'Document slugify() in the README',
      body: 'Add a `slugify` example to the README next to `wordCount`.',
      labels: ['docs'],
      blockedBy: ['slugify-fn'],
    },
  ],
  close: [],
  update: [],
};

/** First line of the latest tool result (what the last command printed, or why it was refused). */
const firstLine = (body) => (latestToolResultText(body) ?? '').trim().split('\n')[0].trim();

/** The session's working directory, as the CLI tells the model in its system prompt. */
const cwdOf = (body) => systemText(body).match(/Working directory: (\S+)/)?.[1] ?? '.';

const plannerScript = scenario.steps([
  (body) => {
    const specs = [...userText(body).matchAll(/^### (\S+) \((added|modified)\)/gm)].map((m) => m[1]);
    return reply(
      text(`Changed specs: ${specs.join(', ') || '(none)'}. Checking what already exists in src/.`),
      toolUse('Glob', { pattern: 'src/**/*.mjs' }),
    );
  },
  reply(
    text('slugify() does not exist yet. Two work items: the function with its export and test, then the README docs (blocked on the first).'),
    structured(PLAN),
  ),
]);

const implementorScript = scenario.steps([
  reply(text("Work item: add slugify(). Let me look at the layout first."), bash('ls -R src specs', 'List the sources')),
  bash('grep -rn "export" src', 'Find the exports'),
  (body) => reply(text('Writing src/slugify.mjs.'), toolUse('Write', { file_path: `${cwdOf(body)}/src/slugify.mjs`, content: SLUGIFY_SRC })),
  bash('git add src/slugify.mjs', 'Stage the new module'),
  bash('git commit -m "Add slugify"', 'Commit the function'),
  (body) => reply(text(`Committed: ${firstLine(body)}. Now the export in src/index.mjs.`), toolUse('Read', { file_path: `${cwdOf(body)}/src/index.mjs` })),
  (body) =>
    toolUse('Edit', {
      file_path: `${cwdOf(body)}/src/index.mjs`,
      old_string: "export { wordCount } from './wordcount.mjs';",
      new_string: "export { slugify } from './slugify.mjs';\nexport { wordCount } from './wordcount.mjs';",
    }),
  (body) => reply(text('And a test.'), toolUse('Write', { file_path: `${cwdOf(body)}/test/slugify.test.mjs`, content: SLUGIFY_TEST })),
  reply(text('Clearing any stale build output before finishing.'), bash('rm -rf build', 'Remove build output')),
  (body) =>
    reply(
      text(`The validator refused it (${firstLine(body).replace(/^.*hook error:\s*/, '')}). There is no build directory anyway; moving on.`),
      // Limited to the project's paths: inside the OS sandbox, git also lists the sandbox's mount
      // points (.bashrc, .mcp.json, …) as untracked; they exist only inside it, never in the patch.
      bash('git status --short -- src test', 'Show what is left uncommitted'),
    ),
  (body) => reply(
    text(`Done. slugify() is committed; still uncommitted (part of the patch all the same): ${(latestToolResultText(body) ?? '').trim().split('\n').map((l) => l.trim()).join(', ')}.`),
    structured({
      role: 'implementor',
      outcome: 'completed',
      summary: 'Added slugify() in src/slugify.mjs (committed), exported it from src/index.mjs and added test/slugify.test.mjs (uncommitted).',
    }),
  ),
]);

const reviewerScript = scenario.steps([
  (body) => {
    const files = [...userText(body).matchAll(/^#### (\S+) \((\w+)\)/gm)].map((m) => m[1]);
    return reply(text(`The revision changes ${files.length} file(s): ${files.join(', ')}. Checking them against the spec.`), toolUse('Grep', { pattern: 'slugify', path: 'specs' }));
  },
  (body) => {
    const files = new Set([...userText(body).matchAll(/^#### (\S+) \((\w+)\)/gm)].map((m) => m[1]));
    const comments = [];
    if (files.has('src/slugify.mjs'))
      comments.push({ path: 'src/slugify.mjs', line: 5, body: 'Nit: accented letters are dropped ("Café" → "caf"). Consider `normalize("NFKD")` first; fine for now, the spec says ASCII.' });
    if (files.has('test/slugify.test.mjs')) comments.push({ path: 'test/slugify.test.mjs', line: null, body: 'Good coverage of the edge cases in the spec.' });
    const complete = files.has('src/slugify.mjs') && files.has('src/index.mjs') && files.has('test/slugify.test.mjs');
    const review = complete
      ? { verdict: 'approve', summary: 'Implements the spec: function, export and test. One non-blocking nit.', comments }
      : { verdict: 'needs-changes', summary: `Incomplete: expected src/slugify.mjs, src/index.mjs and a test; got ${[...files].join(', ') || 'nothing'}.`, comments };
    return reply(text(complete ? 'Looks good.' : 'Something is missing.'), structured({ role: 'reviewer', review }));
  },
]);

/** One fake server for the whole demo: the agent definition names the role in the system prompt. */
function demoScript(body) {
  const sys = systemText(body);
  const role = ['planner', 'implementor', 'reviewer'].find((r) => sys.includes(`You are the ${r}.`));
  if (role === 'planner') return plannerScript(body);
  if (role === 'implementor') return implementorScript(body);
  if (role === 'reviewer') return reviewerScript(body);
  return reply(text('(the demo model does not know this agent)'));
}

// ---------------------------------------------------------------- the engine stand-in

class InMemoryStore {
  constructor() {
    this.workItems = new Map();
    this.revisions = new Map();
    this.lastPlannedSHAs = new Map();
    this.bodies = new Map();
    this.revisionFiles = new Map();
  }
  state() {
    return { workItems: this.workItems, revisions: this.revisions, lastPlannedSHAs: this.lastPlannedSHAs };
  }
}

class WorkItemReader {
  constructor(store) {
    this.store = store;
  }
  async getWorkItemBody(id) {
    if (!this.store.bodies.has(id)) throw new Error(`work item ${id} has no body`);
    return this.store.bodies.get(id);
  }
}

class RevisionReader {
  constructor(store) {
    this.store = store;
  }
  async getRevisionFiles(id) {
    return this.store.revisionFiles.get(id) ?? [];
  }
}

/** A `git diff` patch → RevisionFile entries (path, status, the hunks as the forge shows them). */
function revisionFilesFromPatch(patch) {
  const files = [];
  for (const section of patch.split(/^(?=diff --git )/m).filter((s) => s.startsWith('diff --git '))) {
    const head = section.slice(0, section.search(/^@@|^GIT binary patch/m) >>> 0);
    const path = (section.match(/^\+\+\+ b\/(.+)$/m) ?? section.match(/^rename to (.+)$/m) ?? section.match(/^--- a\/(.+)$/m) ?? section.match(/^diff --git a\/\S+ b\/(.+)$/m))[1];
    const status = /^new file mode/m.test(head) ? 'added' : /^deleted file mode/m.test(head) ? 'removed' : /^rename from/m.test(head) ? 'renamed' : 'modified';
    const at = section.search(/^@@/m);
    files.push({ path, status, patch: at >= 0 ? section.slice(at).replace(/\n$/, '') : null });
  }
  return files;
}

function makeLogger() {
  const line = (level, paint_) => (message, data) => {
    const extra = data && Object.keys(data).length ? ` ${JSON.stringify(data)}` : '';
    process.stderr.write(`${paint_(`[adapter ${level}]`)} ${message}${extra}\n`);
  };
  const quiet = () => {};
  return { debug: VERBOSE ? line('debug', dim) : quiet, info: VERBOSE ? line('info', dim) : quiet, warn: line('warn', yellow), error: line('error', red) };
}

// ---------------------------------------------------------------- the bash validator


// ---------------------------------------------------------------- cleanup checks

/** Live processes (not zombies) whose command line names one of `sessionIDs` or whose cwd is under `dir`. */
function leftoverProcesses(sessionIDs, dir) {
  if (process.platform !== 'linux' || !existsSync('/proc/self/stat')) return null;
  const found = [];
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    if (Number(pid) === process.pid) continue;
    try {
      const state = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.[0];
      if (state === 'Z') continue;
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      let cwd = '';
      try {
        cwd = readlinkSync(`/proc/${pid}/cwd`);
      } catch {
        // another user's process
      }
      if (sessionIDs.some((id) => cmd.includes(id)) || cwd === dir || cwd.startsWith(`${dir}/`)) found.push(`${pid} ${cmd.replaceAll('\0', ' ').slice(0, 100)}`);
    } catch {
      // exited while we looked
    }
  }
  return found;
}

// ---------------------------------------------------------------- the cycle

async function runPhase(adapter, title, params, phases) {
  header(title);
  const t0 = Date.now();
  const handle = await adapter.startAgent(params);
  say(dim(`session ${handle.sessionID}${handle.logFilePath ? `  transcript ${handle.logFilePath}` : ''}`));
  const pump = (async () => {
    for await (const chunk of handle.output) prefixed(params.role, chunk);
  })();
  const phase = { role: params.role, sessionID: handle.sessionID, logFilePath: handle.logFilePath, ms: null };
  phases.push(phase);
  let failed = true;
  try {
    const [result] = await Promise.all([handle.result, pump]);
    failed = false;
    return result;
  } finally {
    phase.ms = Date.now() - t0;
    say(dim(`${params.role} ${failed ? 'failed after' : 'finished in'} ${secs(phase.ms)}`));
  }
}

async function main() {
  const t0 = Date.now();
  const scratch = mkdtempSync(join(tmpdir(), 'cra-demo-'));
  const repoRoot = join(scratch, 'repo');
  const home = join(scratch, 'home');
  mkdirSync(home);
  makeRepo(repoRoot);

  let server = null;
  let adapter = null;
  const phases = [];
  let ok = false;
  try {
    let env;
    if (REAL_API) {
      say(yellow('ANTHROPIC_API_KEY is set: using the real Anthropic API (this spends tokens; the model decides what happens).'));
      env = { CLAUDE_CONFIG_DIR: join(scratch, 'claude-config'), CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', IS_SANDBOX: '1', HOME: home };
    } else {
      server = await startFakeApi({ script: demoScript });
      // The adapter merges `env` over process.env: drop this process's own Claude settings so
      // none of them (a base URL, an auth token, a provider switch) reaches the offline CLI.
      for (const k of Object.keys(process.env)) if (k.startsWith('ANTHROPIC_') || (k.startsWith('CLAUDE_') && k !== 'CLAUDE_CODE_ENTRYPOINT')) delete process.env[k];
      // A scratch HOME: the CLI runs Bash as a login shell, and this machine's profile has no business in the demo.
      env = offlineCliEnv({ apiUrl: server.url, configDir: join(scratch, 'claude-config'), extra: { HOME: home } });
      say(`Offline: the real Claude Code CLI against a scripted model server on ${server.url} ${dim('(set ANTHROPIC_API_KEY to use the real API)')}`);
    }
    say(`Throwaway repository: ${repoRoot}${KEEP ? '' : dim(' (removed at exit; --keep keeps it)')}`);

    const store = new InMemoryStore();
    const validate = api.createBashValidatorHook();
    let currentRole = null;
    adapter = createClaudeAdapter(
      {
        repoRoot,
        defaultBranch: 'main',
        contextPaths: ['.claude/CLAUDE.md'],
        maxAgentDuration: 120,
        logging: { agentSessions: true, logsDir: join(scratch, 'logs') },
        // The shared validator, wrapped only to show each Bash command and its verdict live.
        bashValidatorHook: async (event) => {
          const verdict = await validate(event);
          const role = currentRole ?? 'implementor';
          const cmd = String(event.tool_input?.command ?? '');
          if (verdict?.decision === 'block') prefixed(role, red(`✗ $ ${cmd}  — ${verdict.reason}`));
          else prefixed(role, dim(`$ ${cmd}`));
          return verdict;
        },
        logger: makeLogger(),
        env,
        // The demo repository has no package.json, so the default `yarn install` in each new
        // worktree has nothing to do (and yarn may not even be installed): skip the step.
        worktreeSetupCommand: null,
      },
      {
        workItemReader: new WorkItemReader(store),
        revisionReader: new RevisionReader(store),
        getState: () => store.state(),
        getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
      },
    );

    // 1. Planner -------------------------------------------------------------------------
    currentRole = 'planner';
    const plan = await runPhase(adapter, `1/3 Planner — spec ${SPEC_PATH}`, { role: 'planner', specPaths: [SPEC_PATH] }, phases);
    const idOf = new Map(plan.create.map((w, i) => [w.tempID, String(i + 1)]));
    for (const w of plan.create) {
      const id = idOf.get(w.tempID);
      store.workItems.set(id, { id, title: w.title, status: 'todo', linkedRevision: null });
      store.bodies.set(id, w.body);
    }
    store.lastPlannedSHAs.set(SPEC_PATH, git(repoRoot, 'rev-parse', `HEAD:${SPEC_PATH}`).trim());
    say(bold(`\nWork items planned: ${plan.create.length} (close ${plan.close.length}, update ${plan.update.length})`));
    for (const w of plan.create) {
      const blocked = w.blockedBy.length ? `  blocked by ${w.blockedBy.map((t) => `#${idOf.get(t) ?? t}`).join(', ')}` : '';
      say(`  #${idOf.get(w.tempID)} ${bold(w.title)}  ${dim(`[${w.labels.join(', ')}]`)}${blocked}`);
      for (const l of w.body.split('\n')) say(dim(`      ${l}`));
    }
    if (plan.create.length === 0) throw Object.assign(new Error('the planner created no work items'), { code: 'DEMO_NO_WORK' });

    // 2. Implementor ---------------------------------------------------------------------
    const itemID = idOf.get(plan.create[0].tempID);
    const item = store.workItems.get(itemID);
    item.status = 'in-progress';
    currentRole = 'implementor';
    const branchName = `wi-${itemID}`;
    const impl = await runPhase(adapter, `2/3 Implementor — work item #${itemID} on branch ${branchName}`, { role: 'implementor', workItemID: itemID, branchName }, phases);
    say(bold(`\nOutcome: ${impl.outcome}`) + ` — ${impl.summary}`);
    if (impl.outcome !== 'completed' || !impl.patch) throw Object.assign(new Error(`the implementor did not complete the work item (outcome ${impl.outcome})`), { code: 'DEMO_NOT_COMPLETED' });
    say(bold('\nPatch (diffstat):'));
    say(execFileSync('git', ['apply', '--stat', '-'], { cwd: repoRoot, input: impl.patch, encoding: 'utf8' }).replace(/\n$/, ''));
    say(bold('\nPatch:'));
    printPatch(impl.patch);

    // The engine would push the branch and open a revision; the stand-in records one.
    const revisionID = 'r1';
    store.revisions.set(revisionID, { id: revisionID, title: item.title, pipeline: null });
    store.revisionFiles.set(revisionID, revisionFilesFromPatch(impl.patch));
    item.linkedRevision = revisionID;
    item.status = 'in-review';

    // 3. Reviewer ------------------------------------------------------------------------
    currentRole = 'reviewer';
    const { review } = await runPhase(adapter, `3/3 Reviewer — revision ${revisionID} (${store.revisionFiles.get(revisionID).length} files)`, { role: 'reviewer', workItemID: itemID, revisionID }, phases);
    const verdict = review.verdict === 'approve' ? green('APPROVE') : yellow('NEEDS CHANGES');
    say(bold(`\nVerdict: ${verdict}`) + ` — ${review.summary}`);
    for (const c of review.comments) say(`  ${cyan(`${c.path}${c.line != null ? `:${c.line}` : ''}`)}  ${c.body}`);
    if (review.comments.length === 0) say(dim('  (no comments)'));
    ok = true;
  } catch (err) {
    const code = err?.code ? `[${err.code}] ` : '';
    say(red(bold(`\n✗ demo failed: ${code}${err?.message ?? err}`)));
    if (err?.cause?.message) say(red(`  cause: ${err.cause.message}`));
  } finally {
    if (adapter) await adapter.shutdown();
    if (server) await server.close();
  }

  // Summary -------------------------------------------------------------------------------
  header('Summary');
  for (const p of phases) say(`  ${p.role.padEnd(12)} ${p.ms == null ? '—' : secs(p.ms).padStart(7)}  ${p.logFilePath ?? dim('(no transcript)')}`);
  say(`  ${'total'.padEnd(12)} ${secs(Date.now() - t0).padStart(7)}`);

  const problems = [];
  const worktrees = git(repoRoot, 'worktree', 'list', '--porcelain').split('\n').filter((l) => l.startsWith('worktree '));
  if (worktrees.length !== 1) problems.push(`worktrees left: ${worktrees.slice(1).join(', ')}`);
  const branches = git(repoRoot, 'branch', '--format=%(refname:short)').split('\n').filter(Boolean);
  if (branches.join() !== 'main') problems.push(`branches left: ${branches.filter((b) => b !== 'main').join(', ')}`);
  const procs = leftoverProcesses(phases.map((p) => p.sessionID), scratch);
  if (procs?.length) problems.push(`processes left:\n    ${procs.join('\n    ')}`);
  if (problems.length) {
    say(red(`✗ ${problems.join('\n✗ ')}`));
    ok = false;
  } else {
    say(green(`✓ no worktree, no branch, ${procs ? 'no process' : 'no process check (not Linux)'} left`));
  }

  if (KEEP) say(`Kept: repository ${repoRoot}, transcripts ${join(scratch, 'logs')}`);
  else {
    rmSync(scratch, { recursive: true, force: true });
    say(dim('The repository and transcripts are removed; run with --keep to keep them.'));
  }
  say(ok ? green(bold('✓ demo completed')) : red(bold('✗ demo failed')));
  process.exitCode = ok ? 0 : 1;
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
