#!/usr/bin/env node
// `npm run check:platforms -- [target…]` (.ci/run runs it): `cargo clippy --all-targets -- -D
// warnings` for targets only CI's macOS and Windows runners build, from this Linux host, so a
// Linux-only change cannot break their build unseen (the cfg'd code of those platforms is
// compiled and linted here). No target: all three (both macOS ones and Windows MSVC).
//
// Check only: nothing is linked, so no macOS SDK and no MSVC are needed. Every build script
// still runs, and the C in the dependency tree (ring, vendored libgit2, zlib) is compiled for
// the target, so zig is the C compiler:
//   macOS          cargo-zigbuild (`cargo-zigbuild clippy`), as build:cross uses it.
//   Windows MSVC   neither zig nor cargo-zigbuild targets MSVC: cc-rs gets `zig cc` against
//                  zig's MinGW headers and `zig lib` as archiver. The objects are never linked;
//                  they only let the build scripts finish so the crate itself is checked.
// Installs what is missing: the Rust targets and clippy (rustup), zig and cargo-zigbuild (pip,
// the versions CI pins). Its own target dir (target/platform-check, or CRA_PLATFORM_CHECK_DIR):
// the host's debug build is not touched.
import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ZIG_PIP } from './cross-build.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const targetDir = process.env.CRA_PLATFORM_CHECK_DIR || join(root, 'target', 'platform-check');
const MACOS = ['aarch64-apple-darwin', 'x86_64-apple-darwin'];
const WINDOWS = ['x86_64-pc-windows-msvc'];

const ok = (cmd, args) => spawnSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).status === 0;
const run = (cmd, args) => execFileSync(cmd, args, { stdio: 'inherit' });

/** zig as a command line: `zig` on PATH, else PyPI's `ziglang` module. */
function zigCommand() {
  if (ok('zig', ['version'])) return ['zig'];
  if (ok('python3', ['-m', 'ziglang', 'version'])) return ['python3', '-m', 'ziglang'];
  return null;
}

/** cargo-zigbuild on PATH or in one of pip's scripts dirs (system or --user, maybe not on PATH). */
function zigbuildCommand() {
  if (ok('cargo-zigbuild', ['--help'])) return 'cargo-zigbuild';
  const py = 'import os, sysconfig; print(sysconfig.get_path("scripts")); print(sysconfig.get_path("scripts", os.name + "_user"))';
  const dirs = spawnSync('python3', ['-c', py], { encoding: 'utf8' }).stdout?.trim().split('\n') ?? [];
  return dirs.map((d) => join(d, 'cargo-zigbuild')).find((f) => ok(f, ['--help'])) ?? null;
}

/** pip install of the pinned zig and cargo-zigbuild; where the system Python refuses (PEP 668,
 * Debian 12), into the user's site instead. */
function pipInstall() {
  const pip = (extra) => spawnSync('python3', ['-m', 'pip', 'install', '--quiet', ...extra, ...ZIG_PIP], { stdio: 'inherit' }).status === 0;
  if (!pip([]) && !pip(['--user', '--break-system-packages'])) throw new Error(`pip install ${ZIG_PIP.join(' ')} failed (needs python3 with pip)`);
}

function prepare(targets) {
  const installed = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' }).split('\n');
  const missing = targets.filter((t) => !installed.includes(t));
  if (missing.length) run('rustup', ['target', 'add', ...missing]);
  if (!ok('cargo', ['clippy', '--version'])) run('rustup', ['component', 'add', 'clippy']);
  if (!zigCommand() || !zigbuildCommand()) pipInstall();
  const zig = zigCommand();
  const zigbuild = zigbuildCommand();
  if (!zig || !zigbuild) throw new Error(`zig or cargo-zigbuild still missing after pip install ${ZIG_PIP.join(' ')}`);
  return { zig, zigbuild };
}

/** cc-rs's C compiler and archiver for an MSVC target: zig, see the header. */
function windowsToolEnv(target, zig) {
  const dir = join(targetDir, 'zig-msvc');
  mkdirSync(dir, { recursive: true });
  const quoted = zig.map((a) => `'${a}'`).join(' ');
  const arch = target.split('-')[0];
  // cc-rs passes the Rust target (--target=x86_64-pc-windows-msvc), which zig cannot parse.
  const cc = join(dir, 'cc');
  writeFileSync(cc, `#!/bin/sh\nfor a in "$@"; do shift; case "$a" in --target=*) ;; *) set -- "$@" "$a";; esac; done\nexec ${quoted} cc -target ${arch}-windows-gnu "$@"\n`);
  const lib = join(dir, 'lib');
  writeFileSync(lib, `#!/bin/sh\nexec ${quoted} lib "$@"\n`);
  for (const f of [cc, lib]) chmodSync(f, 0o755);
  const key = target.replaceAll('-', '_');
  return { [`CC_${key}`]: cc, [`AR_${key}`]: lib };
}

function main() {
  const targets = process.argv.slice(2);
  for (const t of targets) {
    if (![...MACOS, ...WINDOWS].includes(t)) {
      console.error(`check:platforms: unknown target ${t} (${[...MACOS, ...WINDOWS].join(', ')})`);
      process.exit(2);
    }
  }
  if (targets.length === 0) targets.push(...MACOS, ...WINDOWS);
  const { zig, zigbuild } = prepare(targets);
  const rows = [];
  for (const target of targets) {
    const t0 = performance.now();
    const windows = WINDOWS.includes(target);
    const [cmd, args, env] = windows
      ? ['cargo', ['clippy'], windowsToolEnv(target, zig)]
      : [zigbuild, ['clippy'], {}];
    args.push('--target', target, '--all-targets', '--', '-D', 'warnings');
    console.log(`\ncheck:platforms: ${target}: ${[cmd, ...args].join(' ')}`);
    const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env: { ...process.env, ...env, CARGO_TARGET_DIR: targetDir } });
    rows.push({ target, seconds: (performance.now() - t0) / 1000, ok: r.status === 0 });
  }
  console.log('\ncheck:platforms summary (cargo clippy --all-targets -- -D warnings)');
  for (const r of rows) console.log(`  ${r.target.padEnd(24)} ${r.seconds.toFixed(1).padStart(6)} s  ${r.ok ? 'clean' : 'FAILED'}`);
  process.exit(rows.every((r) => r.ok) ? 0 : 1);
}

main();
