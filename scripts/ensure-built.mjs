// The pre-step of `npm test`, `npm run demo` and `npm run bench`: install the npm packages when
// they are missing or older than package.json, then (re)build the addon. Both are quick no-ops
// when already done (cargo rebuilds only what changed). `--release` builds the optimized addon.
import { execFileSync } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { onPath } from './on-path.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

// Every agent session runs in Claude Code's OS sandbox, which on Linux needs bubblewrap and
// socat: say so now, with the one install line, rather than fail obscurely in the first test.
if (process.platform === 'linux') {
  const missing = [['bwrap', 'bubblewrap'], ['socat', 'socat']].filter(([bin]) => !onPath(bin)).map(([, pkg]) => pkg);
  if (missing.length > 0) {
    console.error(`\nThe OS sandbox for agent sessions needs ${missing.join(' and ')}. Install with:\n\n  sudo apt-get install -y bubblewrap socat\n`);
    process.exit(1);
  }
}
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: 'inherit' });
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

const marker = join(root, 'node_modules', '.package-lock.json');
const stale = !existsSync(marker) || statSync(marker).mtimeMs < statSync(join(root, 'package.json')).mtimeMs;
// `npm ci` where the lockfile is (a clone): installs exactly what it pins and never rewrites it, so
// the README's commands leave a newcomer's checkout clean; it fails when the two are out of sync.
const locked = existsSync(join(root, 'package-lock.json'));
if (stale) run(npm, [locked ? 'ci' : 'install', '--no-audit', '--no-fund']);

const release = process.argv.includes('--release');
const napi = join(root, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js');
run(process.execPath, [napi, 'build', '--platform', '--js', 'index.js', '--dts', 'index.d.ts', ...(release ? ['--release'] : [])]);
