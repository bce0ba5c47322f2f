// Loads one built addon (.node) in the Node that runs this file and exercises it without the CLI:
// the exports, the native Bash validator, config validation (an ERR_INVALID_PARAMS error object
// crossing the boundary), and an adapter on a real git repository (libgit2, compiled from C for
// this target) assembling a Planner prompt through JS callbacks (threadsafe functions, tokio).
// `npm run build:cross` runs it for every target this machine can execute: the host's natively,
// aarch64 glibc under qemu-user with an arm64 Node from the npm registry.
//
//   node scripts/load-check.cjs <file.node>      prints one JSON line; exit 0 when all held
'use strict';
const { execFileSync } = require('node:child_process');
const { mkdirSync, mkdtempSync, rmSync, writeFileSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join, resolve } = require('node:path');

(async () => {
  const m = require(resolve(process.argv[2]));
  const report = { arch: process.arch, node: process.version, exports: Object.keys(m).sort() };
  for (const name of ['createClaudeAdapter', 'createBashValidatorHook', 'validateBashCommand', 'RuntimeAdapter', 'outputSchemas']) {
    if (!(name in m)) throw new Error(`export ${name} missing`);
  }
  if (m.validateBashCommand('ls -la').allowed !== true || m.validateBashCommand('rm -rf /').allowed !== false) throw new Error('validator verdicts wrong');
  try {
    m.createClaudeAdapter({}, {});
    throw new Error('invalid config accepted');
  } catch (err) {
    if (err.code !== 'ERR_INVALID_PARAMS') throw err;
  }
  const dir = mkdtempSync(join(tmpdir(), 'cra-load-check-'));
  try {
    const repo = join(dir, 'repo');
    mkdirSync(join(repo, '.claude', 'agents'), { recursive: true });
    mkdirSync(join(repo, 'specs'));
    writeFileSync(join(repo, 'specs', 'a.md'), '# Spec A\n\nSomething to plan.\n');
    writeFileSync(join(repo, '.claude', 'agents', 'planner.md'), '---\nname: planner\ndescription: plans\ntools: Read\n---\n\nYou are the planner.\n');
    const git = (...a) => execFileSync('git', ['-c', 'user.name=u', '-c', 'user.email=u@example.invalid', '-c', 'commit.gpgsign=false', ...a], { cwd: repo, stdio: 'ignore' });
    git('init', '-q', '-b', 'main');
    git('add', '-A');
    git('commit', '-q', '-m', 'init');
    let stateCalls = 0;
    const adapter = m.createClaudeAdapter(
      {
        repoRoot: repo, defaultBranch: 'main', contextPaths: [], maxAgentDuration: 60,
        logging: { agentSessions: false, logsDir: join(dir, 'logs') },
        bashValidatorHook: m.createBashValidatorHook(),
        logger: { debug() {}, info() {}, warn() {}, error() {} },
        worktreeSetupCommand: null, sandbox: false,
      },
      {
        workItemReader: { getWorkItemBody: async () => '' },
        revisionReader: { getRevisionFiles: async () => [] },
        getState: () => {
          stateCalls++;
          return { workItems: new Map(), revisions: new Map(), lastPlannedSHAs: new Map() };
        },
        getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
      },
    );
    const prompt = await adapter.previewPrompt({ role: 'planner', specPaths: ['specs/a.md'] });
    if (!prompt.includes('Something to plan.')) throw new Error('the planner prompt lacks the spec');
    if (stateCalls === 0) throw new Error('getState was never called');
    await adapter.shutdown();
    report.plannerPromptChars = prompt.length;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  report.ok = true;
  console.log(JSON.stringify(report));
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
