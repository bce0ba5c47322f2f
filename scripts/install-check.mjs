#!/usr/bin/env node
// `npm run test:install`: the package as a user installs it. Packs the main package and this
// platform's binary package with `npm pack` (the main package's optionalDependencies completed
// by `napi prepublish` as the publish job does, here for this platform's target only), installs
// both tarballs into a fresh project in the temp dir, with no Rust toolchain on PATH and nothing
// of the checkout reachable by module resolution, and runs real sessions there: the demo's full
// cycle through `import` (ESM) and one session through `require` (CJS,
// scripts/install-session.cjs), both against the demo's scripted model server, both with the OS
// sandbox. Checks that the addon and the Claude Code CLI were loaded from the project's
// node_modules. Prints the tarballs' file lists and sizes and the time of each step.
//
//   node scripts/install-check.mjs [--binary <file.node>] [--keep]
//
// --binary  the addon to ship (default: claude-runtime-adapter.<platform>.node in the checkout,
//           what `npm run build` or `npm test`'s pre-step left there, or CI's downloaded artifact)
// --keep    keep the temp dir (path printed)
//
// Uses npm's cache: the CLI package fetched by the checkout's `npm install` is not fetched again.
import { execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
const t0 = performance.now();
const times = [];
const step = (name, fn) => {
  const start = performance.now();
  const out = fn();
  const ms = performance.now() - start;
  times.push([name, ms]);
  console.log(`install-check: ${name}: ${(ms / 1000).toFixed(1)} s`);
  return out;
};
let tmp = null;
const fail = (msg) => {
  console.error(`install-check: FAILED: ${msg}`);
  if (tmp) console.error(`install-check: the temp dir is kept for a look: ${tmp}`);
  process.exit(1);
};
const mib = (n) => (n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(2)} MiB`);

// ------------------------------------------------------------------------------ arguments

const argv = process.argv.slice(2);
let binaryArg = null;
let keep = false;
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--binary') binaryArg = argv[++i];
  else if (argv[i] === '--keep') keep = true;
  else fail(`unknown argument ${argv[i]} (flags: --binary <file.node>, --keep)`);
}

// ------------------------------------------------------------------------------ this platform

/** napi's platform-arch-abi of this machine: the name of its binary package (npm/<abi>). */
function hostAbi() {
  const { platform, arch } = process;
  if (platform === 'linux') {
    const glibc = process.report?.getReport?.().header?.glibcVersionRuntime;
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`;
  }
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}
const abi = hostAbi();
const subDir = join(root, 'npm', abi);
if (!existsSync(join(subDir, 'package.json'))) fail(`no binary package npm/${abi} for this platform`);
const sub = JSON.parse(readFileSync(join(subDir, 'package.json'), 'utf8'));
const nodeFile = `${pkg.napi.binaryName}.${abi}.node`;
const triple = pkg.napi.targets.find((t) => {
  const [arch, , os, env] = t.split('-');
  const a = { x86_64: 'x64', aarch64: 'arm64' }[arch];
  const o = { darwin: 'darwin', linux: 'linux', windows: 'win32' }[os];
  return `${o}-${a}${env ? `-${env}` : ''}` === abi;
});
if (!triple) fail(`no napi target for ${abi}`);
const binary = resolve(binaryArg ?? join(root, nodeFile));
if (!existsSync(binary)) fail(`${binary} does not exist: build it first (npm run build), or pass --binary <file.node>`);
console.log(`install-check: ${pkg.name}@${pkg.version} for ${abi} (${triple}), addon ${binary} (${mib(statSync(binary).size)})`);

tmp = mkdtempSync(join(tmpdir(), 'cra-install-'));
const stage = join(tmp, 'stage');
const tarballs = join(tmp, 'tarballs');
const project = join(tmp, 'project');
for (const d of [stage, tarballs, project]) mkdirSync(d, { recursive: true });

let ok = false;
try {
  // ---------------------------------------------------------------------------- pack
  // The publish job's steps on a copy: `napi artifacts` puts each downloaded .node into
  // npm/<abi>/, `napi prepublish` adds the binary packages to optionalDependencies, then
  // `npm publish` packs. Here only this platform's target is staged (the others' binaries are
  // built elsewhere) and `--skip-optional-publish` keeps prepublish from publishing anything.
  const packed = step('pack (napi prepublish + npm pack, 2 tarballs)', () => {
    for (const f of pkg.files) cpSync(join(root, f), join(stage, f));
    writeFileSync(join(stage, 'package.json'), `${JSON.stringify({ ...pkg, napi: { ...pkg.napi, targets: [triple] } }, null, 2)}\n`);
    mkdirSync(join(stage, 'npm'));
    cpSync(subDir, join(stage, 'npm', abi), { recursive: true });
    const shipped = join(stage, 'npm', abi, nodeFile);
    copyFileSync(binary, shipped);
    // A release build ships stripped (Cargo.toml's release profile: `strip = "symbols"`); a
    // debug build's copy is stripped the same way (`strip --strip-all`: its code as it is), so
    // the pack does not spend ~80 s compressing 340 MiB of debug info no user gets (55 MiB
    // left). Where strip is missing or fails (Windows), the copy ships whole.
    if (spawnSync('strip', ['--strip-all', shipped], { stdio: 'ignore' }).status === 0) {
      console.log(`install-check: shipping the addon stripped (${mib(statSync(shipped).size)})`);
    }
    // prepublish reads the head commit (for its GitHub release step, off here): a one-commit repo.
    const git = (...a) => execFileSync('git', ['-c', 'user.name=install-check', '-c', 'user.email=install-check@example.invalid', ...a], { cwd: stage, stdio: 'ignore' });
    git('init', '-q');
    git('commit', '-q', '--allow-empty', '-m', `v${pkg.version}`);
    execFileSync(process.execPath, [join(root, 'node_modules', '@napi-rs', 'cli', 'dist', 'cli.js'), 'prepublish', '-t', 'npm', '--skip-optional-publish'], { cwd: stage, stdio: ['ignore', 'ignore', 'inherit'] });
    rmSync(join(stage, '.git'), { recursive: true, force: true });
    const pack = (dir) => {
      const out = execFileSync(npm, ['pack', '--json', '--ignore-scripts', '--pack-destination', tarballs], { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], shell: process.platform === 'win32' });
      return JSON.parse(out.slice(out.indexOf('[')))[0];
    };
    return [pack(stage), pack(join(stage, 'npm', abi))];
  });

  const [mainPack, subPack] = packed;
  for (const p of packed) {
    console.log(`\n${p.filename}: ${mib(p.size)} packed, ${mib(p.unpackedSize)} unpacked, ${p.files.length} files`);
    for (const f of p.files) console.log(`  ${String(f.size).padStart(10)}  ${f.path}`);
  }
  console.log('');
  // What a user needs and nothing else: the loader, the ESM entry, the types, the audit record's
  // verifier (and npm's README, LICENSE, package.json); the binary package holds only the addon.
  const files = (p) => p.files.map((f) => f.path).sort().join(' ');
  const mainWant = ['LICENSE', 'README.md', 'bin/cra-verify-audit.mjs', 'index.d.ts', 'index.js', 'index.mjs', 'package.json'].join(' ');
  if (files(mainPack) !== mainWant) fail(`${mainPack.filename} holds ${files(mainPack)}; expected ${mainWant}`);
  const subWant = ['README.md', nodeFile, 'package.json'].sort().join(' ');
  if (files(subPack) !== subWant) fail(`${subPack.filename} holds ${files(subPack)}; expected ${subWant}`);

  // ---------------------------------------------------------------------------- the user's project
  // Nothing in it refers to the checkout: the demo and the scripted model server it uses are
  // copied in (same relative layout, so the demo runs unchanged), everything else comes from
  // the tarballs and the npm registry (through npm's cache).
  writeFileSync(join(project, 'package.json'), `${JSON.stringify({ name: 'cra-install-check', version: '1.0.0', private: true }, null, 2)}\n`);
  mkdirSync(join(project, 'scripts'));
  mkdirSync(join(project, '__test__', 'support'), { recursive: true });
  copyFileSync(join(root, 'scripts', 'demo.mjs'), join(project, 'scripts', 'demo.mjs'));
  for (const f of ['fake-api.mjs', 'cli-env.mjs']) copyFileSync(join(root, '__test__', 'support', f), join(project, '__test__', 'support', f));
  copyFileSync(join(root, 'scripts', 'install-session.cjs'), join(project, 'session.cjs'));

  // A user's environment: no Rust toolchain on PATH, no npm or Node settings inherited from
  // `npm run` in the checkout (npm_package_*, npm_config_*, INIT_CWD point into it).
  const RUST_BINS = ['cargo', 'rustc', 'rustup', 'cargo-zigbuild', 'zig'];
  const exe = process.platform === 'win32' ? '.exe' : '';
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(npm_|CARGO|RUSTUP|RUSTC|RUST_)/i.test(k) || ['INIT_CWD', 'NODE_PATH', 'NODE_OPTIONS', 'OLDPWD', 'PWD'].includes(k)) continue;
    env[k] = v;
  }
  const pathKey = Object.keys(env).find((k) => k.toUpperCase() === 'PATH') ?? 'PATH';
  const dirs = (env[pathKey] ?? '').split(delimiter).filter(Boolean);
  // Nor the checkout's node_modules/.bin, which `npm run` puts first. Node and npm themselves
  // stay reachable (they may share a directory with a toolchain).
  const insideCheckout = (d) => resolve(d) === root || resolve(d).startsWith(root + sep);
  const keptDirs = dirs.filter((d) => !insideCheckout(d) && !RUST_BINS.some((b) => existsSync(join(d, b + exe))));
  if (!keptDirs.some((d) => existsSync(join(d, `node${exe}`)))) keptDirs.push(dirname(process.execPath));
  env[pathKey] = keptDirs.join(delimiter);
  const found = RUST_BINS.filter((b) => keptDirs.some((d) => existsSync(join(d, b + exe))));
  if (found.length) fail(`${found.join(', ')} still on PATH`);
  if (keptDirs.some(insideCheckout)) fail('the checkout is still on PATH');
  console.log(`install-check: the project's PATH has no Rust toolchain and nothing of the checkout (dropped: ${[...new Set(dirs.filter((d) => !keptDirs.includes(d)))].join(', ') || 'none'})`);
  const inProject = (args, opts = {}) =>
    spawnSync(args[0], args.slice(1), { cwd: project, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], shell: process.platform === 'win32' && args[0] === npm, ...opts });

  step('npm install of the 2 tarballs (the CLI from the registry, via the cache)', () => {
    const r = inProject([npm, 'install', '--no-audit', '--no-fund', '--prefer-offline', join(tarballs, mainPack.filename), join(tarballs, subPack.filename)], { stdio: ['ignore', 'inherit', 'inherit'] });
    if (r.status !== 0) fail(`npm install exited ${r.status}`);
  });
  const nm = join(project, 'node_modules');
  const installed = JSON.parse(readFileSync(join(nm, pkg.name, 'package.json'), 'utf8'));
  if (installed.optionalDependencies?.[sub.name] !== pkg.version) fail(`the installed package.json lacks optionalDependencies["${sub.name}"] = "${pkg.version}"`);
  // The binary package satisfies the main package's optional dependency (npm ls: deduped, valid).
  const ls = JSON.parse(inProject([npm, 'ls', '--all', '--json']).stdout);
  const edge = ls.dependencies?.[pkg.name]?.dependencies?.[sub.name];
  if (!edge || edge.invalid || edge.missing || edge.version !== pkg.version) fail(`npm ls: ${pkg.name} → ${sub.name} does not resolve: ${JSON.stringify(edge)}`);
  const cliPkgs = readdirSync(join(nm, '@anthropic-ai')).filter((n) => n.startsWith('claude-agent-sdk-'));
  console.log(`install-check: installed ${pkg.name}, ${sub.name} (resolves its optional dependency), @anthropic-ai/${cliPkgs.join(', @anthropic-ai/')}`);
  for (const b of ['cargo', 'rustc']) if (inProject(['sh', '-c', `command -v ${b}`]).status === 0 && process.platform !== 'win32') fail(`${b} is reachable in the project`);
  // The verifier's bin is linked and loads the addon: a record that is not there is bad usage
  // (exit 2, naming it), not a crash.
  const verifier = inProject([npm, 'exec', '--no', '--', 'cra-verify-audit', join(project, 'no-such-record.jsonl')]);
  if (verifier.status !== 2 || !verifier.stderr.includes('cannot read the audit record')) fail(`cra-verify-audit exited ${verifier.status}: ${verifier.stderr}`);
  console.log('install-check: cra-verify-audit runs from the project (a missing record: exit 2, named)');

  // ---------------------------------------------------------------------------- sessions
  const sessionEnv = { ...env, IS_SANDBOX: '1', NO_COLOR: '1' };
  step('ESM: import by name, the demo (planner → implementor → reviewer, sandboxed)', () => {
    const r = inProject([process.execPath, join('scripts', 'demo.mjs')], { env: sessionEnv });
    const out = `${r.stdout}${r.stderr}`;
    if (r.status !== 0 || !out.includes('✓ demo completed')) {
      console.log(out);
      fail(`the demo exited ${r.status}`);
    }
    const where = inProject([process.execPath, '--input-type=module', '-e', `import 'claude-runtime-adapter'; import { readFileSync } from 'node:fs';
      console.log(JSON.stringify(readFileSync('/proc/self/maps', 'utf8').split('\\n').map((l) => l.split(/\\s+/).slice(5).join(' ')).filter((p) => p.endsWith('.node'))))`]);
    const addon = JSON.parse(where.stdout || '[]');
    if (addon.length === 0 || !addon.every((p) => p === join(project, 'node_modules', sub.name, nodeFile))) fail(`import loaded the addon from ${addon.join(', ') || '(nowhere)'} ${where.stderr}`);
    console.log(`  import 'claude-runtime-adapter' loads ${addon[0]}`);
    console.log(out.split('\n').filter((l) => /^(Offline|Verdict|Outcome|✓)/.test(l) || /^\s+(planner|implementor|reviewer|total)\s/.test(l)).map((l) => `  ${l}`).join('\n'));
  });
  step('CJS: require by name, one sandboxed session, where the addon and the CLI came from', () => {
    const r = inProject([process.execPath, 'session.cjs'], { env: { ...sessionEnv, CHECKOUT: root } });
    if (r.status !== 0) {
      console.log(r.stdout, r.stderr);
      fail(`session.cjs exited ${r.status}`);
    }
    const got = JSON.parse(r.stdout.trim().split('\n').pop());
    for (const [k, v] of Object.entries(got)) console.log(`  ${k}: ${Array.isArray(v) ? v.join(', ') : v}`);
    const under = (p) => typeof p === 'string' && p.startsWith(`${nm}/`);
    if (!under(got.resolved)) fail(`require.resolve('${pkg.name}') = ${got.resolved}, not in the project`);
    if (!got.addon.length || !got.addon.every(under) || !got.addon.some((p) => p.endsWith(`/${sub.name}/${nodeFile}`))) fail(`addon loaded from ${got.addon}`);
    if (!got.cli.some((p) => under(p) && p.includes('/@anthropic-ai/claude-agent-sdk-'))) fail(`the CLI ran from ${got.cli}, not the installed @anthropic-ai/claude-agent-sdk-<platform>`);
    if (got.fromCheckout.length) fail(`files of the checkout mapped: ${got.fromCheckout}`);
    if (got.outcome !== 'ok') fail(`session: ${got.outcome}`);
  });
  ok = true;
} finally {
  if (keep) console.log(`install-check: kept ${tmp}`);
  else rmSync(tmp, { recursive: true, force: true });
}
const total = performance.now() - t0;
console.log(`install-check: ${ok ? 'OK' : 'FAILED'} in ${(total / 1000).toFixed(1)} s (${times.map(([n, ms]) => `${n.split(' ')[0]} ${(ms / 1000).toFixed(1)} s`).join(', ')})`);
