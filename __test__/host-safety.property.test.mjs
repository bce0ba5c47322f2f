// Property: whatever shapes the engine passes to createClaudeAdapter, startAgent and
// previewPrompt, the host process never aborts and every failure is an Error whose code is in
// the API table (and leads its message). Runs the fuzzing in a child process (see
// support/fuzz-entry-points.mjs), so an abort would show as a signal instead of killing the runner.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterEach, expect, it } from 'vitest';
import { setup } from './support/harness.mjs';

const API_CODES = [
  'ERR_INVALID_PARAMS', 'ERR_DUPLICATE_SESSION', 'ERR_PROVISION', 'ERR_CONTEXT', 'ERR_AGENT_DEFINITION', 'ERR_CLI_NOT_FOUND',
  'ERR_SANDBOX_UNAVAILABLE', 'ERR_CANCELLED', 'ERR_TIMEOUT', 'ERR_AGENT_FAILED', 'ERR_OUTPUT_INVALID', 'ERR_EMPTY_PATCH', 'ERR_EXTRACT', 'ERR_RESOURCE_LIMIT', 'ERR_BUDGET', 'ERR_INTERNAL',
];
const ENTRY = fileURLToPath(new URL('./support/fuzz-entry-points.mjs', import.meta.url));

let h;
afterEach(async () => {
  await h?.cleanup();
  h = undefined;
});

it('random config and params shapes: zero aborts, every rejection carries a code from the API table', async () => {
  h = await setup({});
  const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 2 ** 31);
  const r = spawnSync(process.execPath, [ENTRY, h.repo.root, '300', String(seed)], { encoding: 'utf8', timeout: 120_000 });
  expect(r.signal, `seed ${seed}: ${r.stderr.slice(-2000)}`).toBe(null);
  expect(r.status, `seed ${seed}: ${r.stderr.slice(-2000)}`).toBe(0);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  expect(out.bad, `seed ${seed}`).toEqual([]);
  for (const code of [...Object.keys(out.threw), ...Object.keys(out.rejected)]) expect(API_CODES, `seed ${seed}`).toContain(code);
  // The generators reach both sides: bad shapes are refused, good ones get through validation.
  expect(out.threw.ERR_INVALID_PARAMS).toBeGreaterThan(0);
  expect(out.rejected.ERR_INVALID_PARAMS).toBeGreaterThan(0);
  expect(out.created).toBeGreaterThan(0);
}, 180_000);
