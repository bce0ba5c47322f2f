// Issue 48's scenario, shared by the local and the Kubernetes suites: an Implementor that commits
// one file, writes a second and is in its third step (a long command) when its engine goes; the
// re-dispatched session that continues it; what that continuation must show.
import { expect } from 'vitest';
import { assistantTurns, bash, reply, scenario, userText } from './fake-api.mjs';
import { implementorDone } from './roles.mjs';

/** The work item the scenario runs, whose body the continued prompt must carry again. */
export const BODY = 'Add one and two.';

/** The first run's three steps, then the answer a continued run gets (its fourth turn). */
export const steps = (marker) =>
  scenario.steps([
    bash('echo one > one.txt && git add -A && git commit -qm one && echo committed'),
    bash('echo two > two.txt && echo written'),
    bash(`echo step three && sleep ${marker}`),
    reply(implementorDone('finished after the restart')),
  ]);

/**
 * Session `handle` continued session `from`: it completes with both runs' files, says so in its
 * stream and stats, and none of its model requests (the API's main requests after the first
 * `asked`) starts over: each carries the three earlier turns, the first says the run was
 * interrupted and carries the task again. Returns its transcript.
 */
export async function expectContinued(h, handle, from, asked) {
  let streamed = '';
  for await (const chunk of handle.output) streamed += chunk;
  const result = await handle.result;
  expect(result.outcome).toBe('completed');
  expect(result.summary).toBe('finished after the restart');
  expect(result.patch).toContain('+++ b/one.txt');
  expect(result.patch).toContain('+++ b/two.txt');
  expect((await handle.stats).continuedFrom).toBe(from);
  expect(streamed).toContain(`continuing session ${from}`);
  const after = h.api.mainRequests().slice(asked).map((r) => r.body);
  expect(after.length).toBeGreaterThan(0);
  expect(after.map(assistantTurns).every((n) => n >= 3)).toBe(true);
  expect(userText(after[0])).toContain('Your session was interrupted');
  expect(userText(after[0])).toContain(BODY);
  return handle.logFilePath;
}
