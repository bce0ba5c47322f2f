// @expect TS2345 — config.logger is required.
import { createClaudeAdapter, type BashValidatorHook, type RuntimeAdapterDeps } from 'claude-runtime-adapter';
declare const deps: RuntimeAdapterDeps;
declare const hook: BashValidatorHook;
createClaudeAdapter(
  { repoRoot: '/r', defaultBranch: 'main', contextPaths: [], maxAgentDuration: 0, logging: { agentSessions: false, logsDir: '' }, bashValidatorHook: hook },
  deps,
);
