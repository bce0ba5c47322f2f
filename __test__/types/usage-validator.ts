// The shared bash rule set, as the engine wires it. Compiled only once index.d.ts declares
// createBashValidatorHook / validateBashCommand (see types.test.mjs).
import {
  createBashValidatorHook,
  createClaudeAdapter,
  validateBashCommand,
  type BashValidatorHook,
  type BashValidatorHookResponse,
  type RuntimeAdapterDeps,
} from 'claude-runtime-adapter';

declare const deps: RuntimeAdapterDeps;

const hook: BashValidatorHook = createBashValidatorHook();
export const adapter = createClaudeAdapter(
  {
    repoRoot: '/repo',
    defaultBranch: 'main',
    contextPaths: [],
    maxAgentDuration: 0,
    logging: { agentSessions: false, logsDir: '/tmp' },
    bashValidatorHook: createBashValidatorHook(),
    logger: { debug() {}, info() {}, error() {} },
  },
  deps,
);

export async function check(command: string): Promise<string> {
  const verdict = validateBashCommand(command);
  if (!verdict.allowed) {
    const reason: string = verdict.reason;
    return reason;
  }
  const allowed: true = verdict.allowed;
  const response: BashValidatorHookResponse = await hook({ tool_name: 'Bash', tool_input: { command } });
  if (response === undefined) return `undecided ${allowed}`;
  return response.decision === 'block' ? response.reason : response.decision;
}
