// The registry-free build of the images the Kubernetes tests run sessions in besides the
// session image: images as a team brings them, with no bubblewrap, socat or Claude CLI, each a
// Debian bookworm rootfs made by mmdebstrap from the Debian archive and written as a one-layer
// docker-archive tar by ../shared/kube/mkimage.py (for `import-image`, `ctr images import`).
//
//   toolchain  minbase + git, ca-certificates, nodejs, npm, yarnpkg (and /usr/bin/yarn,
//              the name a team's image has), python3, gcc, libc6-dev, make
//   minimal    minbase + git: the least an image the adapter accepts has
//   nogit      minbase alone: the adapter must refuse an image without git
//   musl       musl's loader (/lib/ld-musl-x86_64.so.1) and busybox-static (sh, coreutils),
//              nothing of glibc: an image whose libc is not glibc (and without git)
//
//   node scripts/test-images.mjs [--out-dir DIR] [--mkimage PATH] [--mirror URL] [--force]
//                                [--only NAME,...]
//
// Prints one line per image on stdout, `NAME REF TARPATH`, and nothing else; progress and
// timings on stderr. Each tag is a hash of that image's inputs, and a stamp next to its tar
// holds them: an image whose inputs did not change (packages, hooks, check, this script,
// mkimage.py) is not rebuilt, so a second run takes seconds. Before a tar is written the rootfs
// is checked: the image's own check runs in it (chroot) and nothing named bwrap, socat or
// claude may be in it. Needs root (mmdebstrap's root mode keeps the files' owners) and
// installs mmdebstrap with apt-get when missing.
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { builder, DPKG_EXCLUDES, fileHash, mib, secs, sha256, SUITE, toolsHash } from './image-build.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { log, fail, run, ensureMmdebstrap, needRoot } = builder('test-images');

// The PATH the checks run with: mkimage.py's image PATH (what a session in the image gets).
const CHECK_PATH = '/bin:/usr/bin:/sbin:/usr/sbin';
// What none of these images may have: the adapter's tests use them as images without the
// session image's tools. Looked for by name anywhere in the rootfs.
const FORBIDDEN = ['bwrap', 'socat', 'claude'];
const BIN_DIRS = ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'usr/local/bin', 'usr/local/sbin'];
const GLIBC_LOADER = 'lib64/ld-linux-x86-64.so.2';
const MUSL_LOADER = 'lib/ld-musl-x86_64.so.1';

// check: a shell script run in the finished rootfs (chroot) that fails unless the image has what
// it should; its output (versions) goes to the log. git: whether the image must have git.
const IMAGES = {
  toolchain: {
    variant: 'minbase',
    packages: ['git', 'ca-certificates', 'nodejs', 'npm', 'yarnpkg', 'python3', 'gcc', 'libc6-dev', 'make'],
    // Debian names yarn `yarnpkg`; a team's image (and its scripts) call it `yarn`. In /usr/bin:
    // mkimage.py's image PATH has no /usr/local/bin.
    hooks: ['ln -s yarnpkg "$1/usr/bin/yarn"'],
    check: 'set -e; git --version; echo "node $(node --version)"; echo "npm $(npm --version)"; '
      + 'echo "yarn $(yarn --version)"; python3 --version; cc --version | head -n 1; make --version | head -n 1',
    git: true,
  },
  minimal: {
    variant: 'minbase',
    packages: ['git'],
    hooks: [],
    check: 'set -e; git --version',
    git: true,
  },
  nogit: {
    variant: 'minbase',
    packages: [],
    hooks: [],
    check: 'set -e; if command -v git; then echo "git is present" >&2; exit 1; fi; echo "no git"; ls --version | head -n 1',
    git: false,
  },
  // Debian has no musl-based system, but its musl package brings the loader and libc
  // (/lib/ld-musl-x86_64.so.1 -> /usr/lib/x86_64-linux-musl/libc.so) and busybox-static is a
  // static sh and coreutils: the extract variant unpacks just these two, without dpkg or glibc.
  musl: {
    variant: 'extract',
    packages: ['musl', 'busybox-static'],
    // The extract variant installs nothing (no applet links, no /tmp, no passwd) and runs no
    // customize hooks: its hooks are extract hooks.
    hookKind: 'extract',
    hooks: [
      'install -d -m 0755 "$1/sbin" "$1/usr/bin" "$1/usr/sbin"',
      'chroot "$1" /bin/busybox --install -s',
      'install -d -m 1777 "$1/tmp"',
      'install -d -m 0700 "$1/root"',
      'printf "root:x:0:0:root:/root:/bin/sh\\n" >"$1/etc/passwd"',
      'printf "root:x:0:\\n" >"$1/etc/group"',
    ],
    // Run with no argument the loader prints its version and usage, and exits 1.
    check: 'set -e; if command -v git; then echo "git is present" >&2; exit 1; fi; echo "no git"; '
      + `{ /${MUSL_LOADER} 2>&1 || true; } | head -n 2 | tr "\\n" " " | grep "musl libc"; `
      + 'busybox | head -n 1',
    git: false,
    musl: true,
  },
};

const { values: opt } = parseArgs({
  options: {
    'out-dir': { type: 'string', default: join(root, 'target', 'test-images') },
    mkimage: { type: 'string', default: join(root, '..', 'shared', 'kube', 'mkimage.py') },
    mirror: { type: 'string', default: 'http://deb.debian.org/debian' },
    force: { type: 'boolean', default: false },
    only: { type: 'string' },
  },
});

const names = opt.only ? opt.only.split(',').map((n) => n.trim()).filter(Boolean) : Object.keys(IMAGES);
for (const n of names) if (!IMAGES[n]) fail(`unknown image ${n} (known: ${Object.keys(IMAGES).join(', ')})`);

const t0 = performance.now();
const exists = (path) => {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
};

needRoot();

const mkimage = resolve(opt.mkimage);
if (!existsSync(mkimage)) fail(`mkimage.py not found at ${mkimage} (pass --mkimage PATH)`);
const outDir = resolve(opt['out-dir']);
mkdirSync(outDir, { recursive: true });
const scriptHash = fileHash(fileURLToPath(import.meta.url));
const mkimageHash = fileHash(mkimage);

const lines = [];
for (const name of names) lines.push(build(name, IMAGES[name]));
log(`${names.length} image(s) in ${secs(t0)}`);
process.stdout.write(lines.join(''));

// Builds the image NAME (unless its stamp says it is up to date); its stdout line.
function build(name, image) {
  const t1 = performance.now();
  const inputs = {
    name,
    suite: SUITE,
    variant: image.variant,
    packages: image.packages,
    hookKind: image.hookKind ?? 'customize',
    hooks: image.hooks,
    check: image.check,
    dpkg: DPKG_EXCLUDES,
    mirror: opt.mirror,
    script: scriptHash,
    tools: toolsHash(),
    mkimage: mkimageHash,
  };
  const ref = `local/cra-test-${name}:${sha256(JSON.stringify(inputs)).slice(0, 12)}`;
  const out = join(outDir, `${name}.tar`);
  const line = `${name} ${ref} ${out}\n`;
  const stampFile = `${out}.stamp`;
  const stamp = JSON.stringify({ ref, inputs }, null, 2);

  if (!opt.force && existsSync(out) && existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp) {
    log(`${name}: up to date: ${out} (${mib(statSync(out).size)}), checked in ${secs(t1)}`);
    return line;
  }

  const rootfs = `${out}.rootfs`;
  rmSync(rootfs, { recursive: true, force: true });
  rmSync(stampFile, { force: true });
  ensureMmdebstrap();

  let t = performance.now();
  run('mmdebstrap', [
    '--mode=root',
    `--variant=${image.variant}`,
    ...(image.packages.length ? [`--include=${image.packages.join(',')}`] : []),
    ...DPKG_EXCLUDES.map((o) => `--dpkgopt=${o}`),
    ...image.hooks.map((h) => `--${image.hookKind ?? 'customize'}-hook=${h}`),
    SUITE,
    rootfs,
    opt.mirror,
  ]);
  const rootfsBytes = Number(execFileSync('du', ['-sb', rootfs], { encoding: 'utf8' }).split('\t')[0]);
  log(`${name}: mmdebstrap (rootfs ${mib(rootfsBytes)}): ${secs(t)}`);

  verify(name, image, rootfs);

  t = performance.now();
  const tmpOut = `${out}.partial`;
  run('python3', [mkimage, rootfs, ref, tmpOut]);
  renameSync(tmpOut, out);
  rmSync(rootfs, { recursive: true, force: true });
  writeFileSync(stampFile, stamp);
  log(`${name}: mkimage (tar ${mib(statSync(out).size)}): ${secs(t)}`);
  log(`${name}: built ${ref} -> ${out} in ${secs(t1)}`);
  return line;
}

// Fails unless the rootfs is what the tests take it for: none of the session image's tools,
// git exactly where expected, the libc expected, and the image's own check passing.
function verify(name, image, rootfs) {
  const found = execFileSync(
    'find', [rootfs, '(', ...FORBIDDEN.flatMap((n, i) => (i ? ['-o', '-name', n] : ['-name', n])), ')', '-print'],
    { encoding: 'utf8' },
  ).trim();
  if (found) fail(`${name}: the rootfs has what none of these images may have:\n${found}`);
  const status = join(rootfs, 'var/lib/dpkg/status');
  if (existsSync(status)) {
    const pkgs = readFileSync(status, 'utf8').match(/^Package: (bubblewrap|socat)$/gm);
    if (pkgs) fail(`${name}: dpkg has ${pkgs.join(', ')} installed`);
  }
  const gits = BIN_DIRS.map((d) => join(d, 'git')).filter((p) => exists(join(rootfs, p)));
  if (image.git && !gits.length) fail(`${name}: git is missing`);
  if (!image.git && gits.length) fail(`${name}: has ${gits.map((p) => `/${p}`).join(', ')} but must have no git`);
  if (image.musl) {
    if (!existsSync(join(rootfs, MUSL_LOADER))) fail(`${name}: /${MUSL_LOADER} is missing`);
    const glibc = execFileSync('find', [rootfs, '(', '-name', 'ld-linux*', '-o', '-name', 'libc.so.6', ')', '-print'], { encoding: 'utf8' }).trim();
    if (glibc || exists(join(rootfs, GLIBC_LOADER))) fail(`${name}: glibc is in the rootfs:\n${glibc || `/${GLIBC_LOADER}`}`);
  }
  let output;
  try {
    output = execFileSync('chroot', [rootfs, '/bin/sh', '-c', image.check], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { PATH: CHECK_PATH, HOME: '/root', LANG: 'C.UTF-8' },
    });
  } catch (e) {
    fail(`${name}: the check failed (${e.status != null ? `exit ${e.status}` : e.message}):\n${e.stdout ?? ''}`);
  }
  log(`${name}: check: ${output.trim().split('\n').join('; ')}`);
}


