// The CJS half of `npm run test:install` (scripts/install-check.mjs copies it into the
// installed project): one Planner session through `require`, against the demo's scripted model
// server. While the CLI runs, it records where the addon (this process's mapped .node files)
// and the CLI (the session's process tree: executables and argv[0]) come from, and prints that
// as one JSON line.
'use strict';
const { execFileSync } = require('node:child_process');
const { mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const { createClaudeAdapter, createBashValidatorHook } = require('claude-runtime-adapter');

function tree(pid) {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    try {
      for (const t of readdirSync('/proc/' + out[i] + '/task')) {
        for (const c of readFileSync('/proc/' + out[i] + '/task/' + t + '/children', 'utf8').split(' ').filter(Boolean)) out.push(Number(c));
      }
    } catch {}
  }
  return out;
}
function cliPaths(pid) {
  const paths = new Set();
  for (const p of tree(pid)) {
    try { paths.add(readlinkSync('/proc/' + p + '/exe')); } catch {}
    try { paths.add(readFileSync('/proc/' + p + '/cmdline', 'utf8').split('\0')[0]); } catch {}
  }
  return [...paths];
}
const mapped = () => [...new Set(readFileSync('/proc/self/maps', 'utf8').split('\n').map((l) => l.split(/\s+/).slice(5).join(' ')).filter((p) => p.startsWith('/')))];

(async () => {
  const { startFakeApi, scenario, reply, text, toolUse, structured } = await import('./__test__/support/fake-api.mjs');
  const { offlineCliEnv } = await import('./__test__/support/cli-env.mjs');
  const scratch = mkdtempSync(join(tmpdir(), 'cra-install-session-'));
  const repo = join(scratch, 'repo');
  mkdirSync(join(repo, '.claude', 'agents'), { recursive: true });
  mkdirSync(join(repo, 'specs'));
  writeFileSync(join(repo, 'specs', 'hello.md'), '# Spec: hello\n\nA hello() function.\n');
  writeFileSync(join(repo, '.claude', 'agents', 'planner.md'), '---\nname: planner\ndescription: plans\ntools: Read, Glob, Grep\n---\n\nYou are the planner.\n');
  const git = (...a) => execFileSync('git', a, { cwd: repo, stdio: 'ignore' });
  git('init', '-q', '-b', 'main');
  git('-c', 'user.name=u', '-c', 'user.email=u@example.invalid', '-c', 'commit.gpgsign=false', 'add', '-A');
  git('-c', 'user.name=u', '-c', 'user.email=u@example.invalid', '-c', 'commit.gpgsign=false', 'commit', '-q', '-m', 'init');
  const server = await startFakeApi({
    script: scenario.steps([
      { ...reply(text('Looking at the specs.'), toolUse('Glob', { pattern: 'specs/*.md' })), delayMs: 1500 },
      reply(structured({ role: 'planner', create: [{ tempID: 'hello', title: 'Add hello()', body: 'As specified.', labels: [], blockedBy: [] }], close: [], update: [] })),
    ]),
  });
  const adapter = createClaudeAdapter(
    {
      repoRoot: repo, defaultBranch: 'main', contextPaths: [], maxAgentDuration: 120,
      logging: { agentSessions: false, logsDir: join(scratch, 'logs') },
      bashValidatorHook: createBashValidatorHook(),
      logger: { debug() {}, info() {}, warn() {}, error(m) { process.stderr.write(m + '\n'); } },
      env: offlineCliEnv({ apiUrl: server.url, configDir: join(scratch, 'config'), extra: { HOME: join(scratch, 'config') } }),
      worktreeSetupCommand: null,
    },
    {
      workItemReader: { getWorkItemBody: async () => '' },
      revisionReader: { getRevisionFiles: async () => [] },
      getState: () => ({ workItems: new Map(), revisions: new Map(), lastPlannedSHAs: new Map() }),
      getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
    },
  );
  const report = { resolved: require.resolve('claude-runtime-adapter'), addon: [], cli: [], fromCheckout: [], outcome: 'none' };
  try {
    const handle = await adapter.startAgent({ role: 'planner', specPaths: ['specs/hello.md'] });
    let done = false;
    const watch = (async () => {
      while (!done) {
        const s = adapter.sessions().find((x) => x.sessionID === handle.sessionID);
        if (s && s.pid) { report.cli = cliPaths(s.pid); if (report.cli.some((p) => p.includes('/claude-agent-sdk-'))) return; }
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const result = await handle.result;
    done = true;
    await watch;
    report.outcome = result.role === 'planner' && result.create.length === 1 ? 'ok' : 'unexpected result ' + JSON.stringify(result);
  } catch (err) {
    report.outcome = '[' + err.code + '] ' + err.message;
  } finally {
    await adapter.shutdown();
    await server.close();
    rmSync(scratch, { recursive: true, force: true });
  }
  const maps = mapped();
  report.addon = maps.filter((p) => p.endsWith('.node'));
  report.fromCheckout = maps.filter((p) => p.startsWith(process.env.CHECKOUT + '/'));
  console.log(JSON.stringify(report));
})().catch((err) => { console.error(err); process.exit(1); });
