// The registry-free build of the session image (the same image as image/Dockerfile): a Debian
// bookworm rootfs made by mmdebstrap from the Debian archive, plus the adapter's runtime in
// /opt/claude-runtime-adapter (the CLI from node_modules, the static cra-pod binary,
// image/cra-jail, and bubblewrap and socat with their own loader: image/make-runtime), written as a one-layer docker-archive tar by
// ../shared/kube/mkimage.py (for `import-image`, `ctr images import`, `podman load`).
//
//   node scripts/session-image.mjs [--out FILE.tar] [--cra-pod PATH] [--mkimage PATH]
//                                  [--mirror URL] [--force]
//
// Prints the image reference (and nothing else) on stdout; progress and timings on stderr.
// The tag is a hash of every input, and a stamp next to the tar holds it: when nothing changed
// (packages, CLI version, cra-pod, cra-jail, this script, mkimage.py) the build is skipped.
// Needs root (mmdebstrap's root mode keeps the files' owners, which the image needs) and
// installs mmdebstrap with apt-get when missing.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, openSync, readFileSync, readSync, closeSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { builder, DPKG_EXCLUDES, fileHash, mib, secs, sha256, SUITE, toolsHash } from './image-build.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const { log, fail, run, ensureMmdebstrap, needRoot } = builder('session-image');

// The image contract's packages (docs/kubernetes.md, Images; image/Dockerfile installs the same list).
const PACKAGES = [
  'git', 'bash', 'coreutils', 'ca-certificates', 'bubblewrap', 'socat', 'findutils', 'grep',
  'sed', 'procps', 'util-linux',
];
const CLI_PACKAGE = '@anthropic-ai/claude-agent-sdk-linux-x64';
const MUSL_TARGET = 'x86_64-unknown-linux-musl';
const CRA_POD_DEFAULT = join(root, 'target', MUSL_TARGET, 'release', 'cra-pod');

const { values: opt } = parseArgs({
  options: {
    out: { type: 'string', default: join(root, 'target', 'session-image', 'session.tar') },
    'cra-pod': { type: 'string', default: process.env.CRA_POD_BIN },
    mkimage: { type: 'string', default: join(root, '..', 'shared', 'kube', 'mkimage.py') },
    mirror: { type: 'string', default: 'http://deb.debian.org/debian' },
    force: { type: 'boolean', default: false },
  },
});

const t0 = performance.now();

needRoot();

// The CLI: exactly the version package.json pins.
const pinned = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).optionalDependencies?.[CLI_PACKAGE];
const cliDir = join(root, 'node_modules', ...CLI_PACKAGE.split('/'));
const cliBin = join(cliDir, 'claude');
if (!existsSync(cliBin)) fail(`${cliBin} is missing: run npm install first`);
const cliVersion = JSON.parse(readFileSync(join(cliDir, 'package.json'), 'utf8')).version;
if (cliVersion !== pinned) fail(`node_modules has ${CLI_PACKAGE} ${cliVersion}, package.json pins ${pinned}: run npm install`);

// cra-pod: the given binary as is, or the workspace's, built (cargo: a no-op when up to date).
let craPod = opt['cra-pod'] && resolve(opt['cra-pod']);
if (!craPod) {
  // A fresh machine has only the host's Rust target: add the static one cra-pod is built for.
  const installed = execFileSync('rustup', ['target', 'list', '--installed'], { encoding: 'utf8' }).split('\n');
  if (!installed.includes(MUSL_TARGET)) {
    const t = performance.now();
    log(`installing the Rust target ${MUSL_TARGET} (rustup target add)`);
    run('rustup', ['target', 'add', MUSL_TARGET]);
    log(`rustup target add ${MUSL_TARGET}: ${secs(t)}`);
  }
  const t = performance.now();
  run('cargo', ['build', '-p', 'cra-pod', '--release', '--target', MUSL_TARGET], { cwd: root });
  craPod = CRA_POD_DEFAULT;
  log(`cargo build -p cra-pod: ${secs(t)}`);
}
if (!existsSync(craPod)) fail(`cra-pod binary ${craPod} does not exist`);
if (!isStaticElf(craPod)) fail(`${craPod} is not a static executable (build it for x86_64-unknown-linux-musl)`);

const jailScript = join(root, 'image', 'cra-jail');
const runtimeScript = join(root, 'image', 'make-runtime');
const historyScript = join(root, 'image', 'git-history');
const mkimage = resolve(opt.mkimage);
if (!existsSync(mkimage)) fail(`mkimage.py not found at ${mkimage} (pass --mkimage PATH)`);

// The inputs: the tag and the stamp both come from them.
const inputs = {
  suite: SUITE,
  packages: PACKAGES,
  dpkg: DPKG_EXCLUDES,
  mirror: opt.mirror,
  cli: cliVersion,
  craPod: fileHash(craPod),
  craJail: fileHash(jailScript),
  makeRuntime: fileHash(runtimeScript),
  gitHistory: fileHash(historyScript),
  script: fileHash(fileURLToPath(import.meta.url)),
  tools: toolsHash(),
  mkimage: fileHash(mkimage),
};
const digest = sha256(JSON.stringify(inputs)).slice(0, 12);
const ref = `local/claude-runtime-adapter-session:${cliVersion}-${digest}`;
const out = resolve(opt.out);
const stampFile = `${out}.stamp`;
const stamp = JSON.stringify({ ref, inputs }, null, 2);

if (!opt.force && existsSync(out) && existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp) {
  log(`up to date: ${out} (${mib(statSync(out).size)}), checked in ${secs(t0)}`);
  process.stdout.write(`${ref}\n`);
  process.exit(0);
}

mkdirSync(dirname(out), { recursive: true });
const rootfs = `${out}.rootfs`;
rmSync(rootfs, { recursive: true, force: true });
rmSync(stampFile, { force: true });

ensureMmdebstrap();

// Everything that goes in beyond the packages is done by mmdebstrap's hooks, in the rootfs
// (`$1`), before it is finished: the binaries, the user and the directories of the contract.
const RT = '/opt/claude-runtime-adapter';
const hooks = [
  `mkdir -p "$1${RT}/bin" "$1${RT}/libexec" "$1${RT}/history"`,
  `upload ${historyScript} ${RT}/history/git`,
  `upload ${cliBin} ${RT}/libexec/claude`,
  `upload ${craPod} ${RT}/bin/cra-pod`,
  `upload ${jailScript} ${RT}/bin/cra-jail`,
  `upload ${runtimeScript} /tmp/make-runtime`,
  `chroot "$1" sh /tmp/make-runtime`,
  'rm -f "$1/tmp/make-runtime"',
  'chroot "$1" groupadd --gid 1000 agent',
  'chroot "$1" useradd --uid 1000 --gid 1000 --home-dir /home/agent --create-home --shell /bin/bash agent',
  'install -d -o 1000 -g 1000 -m 0755 "$1/workspace" "$1/var/lib/cra"',
  'install -d -o 1000 -g 1000 -m 0700 "$1/var/lib/cra/sockets"',
];
let t = performance.now();
run('mmdebstrap', [
  '--mode=root',
  '--variant=minbase',
  `--include=${PACKAGES.join(',')}`,
  ...DPKG_EXCLUDES.map((o) => `--dpkgopt=${o}`),
  ...hooks.map((h) => `--customize-hook=${h}`),
  SUITE,
  rootfs,
  opt.mirror,
]);
const rootfsBytes = Number(execFileSync('du', ['-sb', rootfs], { encoding: 'utf8' }).split('\t')[0]);
log(`mmdebstrap (rootfs ${mib(rootfsBytes)}): ${secs(t)}`);

t = performance.now();
const tmpOut = `${out}.partial`;
run('python3', [mkimage, rootfs, ref, tmpOut, `${RT}/bin/cra-pod`, 'idle']);
renameSync(tmpOut, out);
rmSync(rootfs, { recursive: true, force: true });
writeFileSync(stampFile, stamp);
log(`mkimage (tar ${mib(statSync(out).size)}): ${secs(t)}`);
log(`built ${ref} -> ${out} in ${secs(t0)}`);
process.stdout.write(`${ref}\n`);

// A 64-bit little-endian ELF executable with no program interpreter (PT_INTERP): it runs in
// any image, whatever libc the image has or lacks.
function isStaticElf(path) {
  const fd = openSync(path, 'r');
  try {
    const h = Buffer.alloc(64);
    readSync(fd, h, 0, 64, 0);
    if (h.readUInt32BE(0) !== 0x7f454c46 || h[4] !== 2 || h[5] !== 1) return false;
    const phoff = Number(h.readBigUInt64LE(32));
    const phentsize = h.readUInt16LE(54);
    const phnum = h.readUInt16LE(56);
    const ph = Buffer.alloc(phentsize * phnum);
    readSync(fd, ph, 0, ph.length, phoff);
    for (let i = 0; i < phnum; i++) if (ph.readUInt32LE(i * phentsize) === 3) return false;
    return true;
  } finally {
    closeSync(fd);
  }
}
