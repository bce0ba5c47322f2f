#!/usr/bin/env node
// `npm test`: the Rust workspace's tests (scripts/cargo-test.mjs --workspace) and the JS suites
// (`vitest run`), every one of both, failing when either fails.
//
// vitest starts at once (it needs only the addon, built by the pre-step); beside it the Rust
// tests are compiled on idle CPU (`chrt --idle 0` where there is one: SCHED_IDLE, so the
// compile takes only the time the sessions vitest times leave free), then run. Compiled first,
// on both cores, they held vitest back ~150 s of a fresh clone's run, while vitest's sessions
// wait much of theirs (a 60 s API outage, the start of a wall-clock second in the racy cases).
// The Rust tests' longest binaries (the racy-edit and layer suites) wait the same way, so they
// run beside vitest too, at normal priority. Their output is prefixed `[cargo] `, line by line,
// so it stays readable beside vitest's. Arguments are passed to vitest (a file or `-t` filter);
// the Rust tests always run whole, as they did.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { onPath } from './on-path.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cargoTest = (extra) => [join(root, 'scripts', 'cargo-test.mjs'), '--workspace', ...extra];

const children = [];
/** Runs a command to its end: resolves with its exit status (a signal counts as 1). */
function run(cmd, args, prefix) {
  // Each in a process group of its own (not on Windows), so an interrupt reaches all of it:
  // vitest's forks and cargo's test binaries, not only the process this one started.
  const child = spawn(cmd, args, { cwd: root, stdio: prefix ? ['ignore', 'pipe', 'pipe'] : 'inherit', detached: process.platform !== 'win32' });
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
    for (const c of children) {
      try {
        process.kill(process.platform === 'win32' ? c.pid : -c.pid, sig);
      } catch {
        // Already ended.
      }
    }
    process.exit(130);
  });
}

const idle = process.platform === 'linux' && onPath('chrt') ? ['chrt', '--idle', '0'] : [];
async function rust() {
  const start = Date.now();
  const [cmd, ...args] = [...idle, process.execPath, ...cargoTest(['--no-run'])];
  const built = await run(cmd, args, '[cargo] ');
  console.error(`test: the Rust tests compiled${idle.length ? ' on idle CPU' : ''} in ${Math.round((Date.now() - start) / 1000)} s (exit ${built})`);
  return built !== 0 ? built : run(process.execPath, cargoTest([]), '[cargo] ');
}

const [cargo, vitest] = await Promise.all([
  rust(),
  run(process.execPath, [join(root, 'node_modules', 'vitest', 'vitest.mjs'), 'run', ...process.argv.slice(2)]),
]);
if (cargo !== 0) console.error(`test: the Rust tests failed (exit ${cargo}); their lines are marked [cargo]`);
if (vitest !== 0) console.error(`test: vitest failed (exit ${vitest})`);
process.exit(cargo || vitest);
