// A session whose scripted model runs commands with Bash (or any tool call), one per turn, then
// answers: how the boundary tests try the sandbox with the agent's own tools through the real CLI.
import { scenario, toolResults, toolUse } from './fake-api.mjs';
import { ROLES } from './roles.mjs';

/** The model asks for the sandbox to be lifted on every command: there is nothing to lift. */
export const unsandboxed = (command) => toolUse('Bash', { command, description: 'probe', dangerouslyDisableSandbox: true });

/**
 * One session of `role` on harness `h` whose model runs each of `commands` (a string is a Bash
 * command), then answers. Resolves with the result and, per command, `{ is_error, text }` as
 * the model saw it (`out`: the texts).
 */
export async function agentRuns(h, role, commands, { adapter = h.adapter(), branchName } = {}) {
  h.api.setScript(scenario.steps([...commands.map((c) => (typeof c === 'string' ? unsandboxed(c) : c)), ROLES[role].done]));
  const handle = await adapter.startAgent(ROLES[role].params(branchName));
  const result = await handle.result;
  const results = toolResults(h.api.mainBodies().at(-1));
  if (results.length !== commands.length) {
    throw new Error(`expected ${commands.length} tool results, got ${results.length}: ${JSON.stringify(result).slice(0, 2000)}`);
  }
  return { handle, result, results, out: results.map((r) => r.text) };
}
