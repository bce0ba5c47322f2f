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
// `--stand-in-c` (what .ci/run passes): that C is not compiled. A stand-in compiler and archiver
// (standInC below) write the empty objects and archives the build scripts name, and cargo runs
// for every target, without zig. The Rust is checked as before. In a cold check, libgit2's build
// script alone was 151 of 404 unit-seconds, and the Windows target took 129 s instead of 248 s
// (246 against 472 CPU-seconds; docs/contributing.md). The C itself is compiled for these
// targets where it is built for real: on the GitHub workflow's macOS and Windows runners.
// Installs what is missing: the Rust targets and clippy (rustup), zig and cargo-zigbuild (pip,
// the versions CI pins; not with --stand-in-c). Its own target dir (target/platform-check, or
// CRA_PLATFORM_CHECK_DIR): the host's debug build is not touched.
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

function prepare(targets, standIn) {
  const installed = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' }).split('\n');
  const missing = targets.filter((t) => !installed.includes(t));
  if (missing.length) run('rustup', ['target', 'add', ...missing]);
  if (!ok('cargo', ['clippy', '--version'])) run('rustup', ['component', 'add', 'clippy']);
  if (standIn) return {};
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

/**
 * cc-rs's C compiler and archiver for `target` with --stand-in-c: one script that compiles and
 * archives nothing. cc-rs asks it the compiler's family (`-E` of a probe file: it answers clang's
 * marker; `-?`, cl's help: refused, so no cl flags), then writes what each command names as its
 * output (`-o FILE`, an archive's `-out:FILE` or `ar cq FILE`), empty: the build scripts' own
 * checks find their files, and a check links nothing. macOS's cc-rs asks xcrun for the SDK
 * unless SDKROOT names one: a path that is never read.
 */
function standInC(target) {
  const dir = join(targetDir, 'stand-in-c');
  mkdirSync(dir, { recursive: true });
  const cc = join(dir, 'cc');
  writeFileSync(cc, `#!/bin/sh
case " $* " in
  *" -? "*) exit 1 ;;
  *" -E "*) echo '"clang"'; exit 0 ;;
esac
prev=
for a in "$@"; do
  case $prev in -o | cq | crs | rcs) : >"$a" ;; esac
  case $a in -out:*) : >"\${a#-out:}" ;; esac
  prev=$a
done
`);
  chmodSync(cc, 0o755);
  const key = target.replaceAll('-', '_');
  return { [`CC_${key}`]: cc, [`AR_${key}`]: cc, ...(MACOS.includes(target) ? { SDKROOT: join(dir, 'no-sdk') } : {}) };
}

function main() {
  const args = process.argv.slice(2);
  const standIn = args.includes('--stand-in-c');
  const targets = args.filter((a) => a !== '--stand-in-c');
  for (const t of targets) {
    if (![...MACOS, ...WINDOWS].includes(t)) {
      console.error(`check:platforms: unknown target ${t} (${[...MACOS, ...WINDOWS].join(', ')})`);
      process.exit(2);
    }
  }
  if (targets.length === 0) targets.push(...MACOS, ...WINDOWS);
  const { zig, zigbuild } = prepare(targets, standIn);
  const rows = [];
  for (const target of targets) {
    const t0 = performance.now();
    const windows = WINDOWS.includes(target);
    const [cmd, clippy, env] = standIn
      ? ['cargo', ['clippy'], standInC(target)]
      : windows
        ? ['cargo', ['clippy'], windowsToolEnv(target, zig)]
        : [zigbuild, ['clippy'], {}];
    clippy.push('--target', target, '--all-targets', '--', '-D', 'warnings');
    console.log(`\ncheck:platforms: ${target}: ${[cmd, ...clippy].join(' ')}${standIn ? ' (the C not compiled: --stand-in-c)' : ''}`);
    const r = spawnSync(cmd, clippy, { cwd: root, stdio: 'inherit', env: { ...process.env, ...env, CARGO_TARGET_DIR: targetDir } });
    rows.push({ target, seconds: (performance.now() - t0) / 1000, ok: r.status === 0 });
  }
  console.log('\ncheck:platforms summary (cargo clippy --all-targets -- -D warnings)');
  for (const r of rows) console.log(`  ${r.target.padEnd(24)} ${r.seconds.toFixed(1).padStart(6)} s  ${r.ok ? 'clean' : 'FAILED'}`);
  process.exit(rows.every((r) => r.ok) ? 0 : 1);
}

main();
