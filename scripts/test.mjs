#!/usr/bin/env node
// `npm test`: the Rust workspace's tests (scripts/cargo-test.mjs --workspace) and the JS suites
// (`vitest run`), every one of both, failing when either fails.
//
// The Rust tests are compiled first (`--no-run`: both cores), then run beside vitest rather
// than before it: their longest binaries (the racy-edit and layer suites) mostly wait for the
// start of a wall-clock second, 20 times a case, so on their own they left the CPU half idle
// for ~170 s that the JS suites now use. Their output is prefixed `[cargo] `, line by line, so
// it stays readable beside vitest's. Arguments are passed to vitest (a file or `-t` filter); the
// Rust tests always run whole, as they did.
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cargoTest = (extra) => [join(root, 'scripts', 'cargo-test.mjs'), '--workspace', ...extra];

const built = spawnSync(process.execPath, cargoTest(['--no-run']), { stdio: 'inherit', cwd: root });
if (built.status !== 0) process.exit(built.status ?? 1);

const children = [];
/** Runs a command to its end: resolves with its exit status (a signal counts as 1). */
function run(cmd, args, prefix) {
  const child = spawn(cmd, args, { cwd: root, stdio: prefix ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
  children.push(child);
  if (prefix) {
    for (const [from, to] of [[child.stdout, process.stdout], [child.stderr, process.stderr]]) {
      createInterface({ input: from, crlfDelay: Infinity }).on('line', (l) => to.write(`${prefix}${l}\n`));
    }
  }
  return new Promise((resolve) => {
    child.on('error', (e) => {
      console.error(`test: ${cmd} could not start: ${e.message}`);
      resolve(1);
    });
    child.on('close', (code) => resolve(code ?? 1));
  });
}

// Interrupted: both suites end with this process, not after it.
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    for (const c of children) c.kill(sig);
    process.exit(130);
  });
}

const [cargo, vitest] = await Promise.all([
  run(process.execPath, cargoTest([]), '[cargo] '),
  run(process.execPath, [join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run', ...process.argv.slice(2)]),
]);
if (cargo !== 0) console.error(`test: the Rust tests failed (exit ${cargo}); their lines are marked [cargo]`);
if (vitest !== 0) console.error(`test: vitest failed (exit ${vitest})`);
process.exit(cargo || vitest);
