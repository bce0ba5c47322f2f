// What the two registry-free image builds share (scripts/session-image.mjs, the session image;
// scripts/test-images.mjs, the images the Kubernetes tests run sessions in): Debian bookworm
// by mmdebstrap without manuals, docs or translations, steps whose output goes to stderr (stdout
// carries only the build's result), content hashes for the tags and stamps, mmdebstrap installed
// on a fresh machine.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const SUITE = 'bookworm';
// Nothing in a session reads manuals, docs or translations: ~40 MB less. Licences stay.
export const DPKG_EXCLUDES = [
  'path-exclude=/usr/share/man/*',
  'path-exclude=/usr/share/info/*',
  'path-exclude=/usr/share/doc/*',
  'path-include=/usr/share/doc/*/copyright',
  'path-exclude=/usr/share/locale/*',
  'path-exclude=/usr/share/lintian/*',
];

export const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');
export const fileHash = (path) => sha256(readFileSync(path));
/** This module's own hash: an input of every image built with it. */
export const toolsHash = () => fileHash(fileURLToPath(import.meta.url));
export const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`;
export const secs = (since) => `${((performance.now() - since) / 1000).toFixed(1)} s`;

/** Logging, failing and running steps for the script `name`. */
export function builder(name) {
  const log = (msg) => process.stderr.write(`${name}: ${msg}\n`);
  const fail = (msg) => {
    log(`error: ${msg}`);
    process.exit(1);
  };
  // A step's command, its output on stderr.
  const run = (cmd, args, opts = {}) => {
    try {
      execFileSync(cmd, args, { stdio: ['ignore', process.stderr, 'inherit'], ...opts });
    } catch (e) {
      fail(`${cmd} ${args.join(' ')} failed: ${e.status != null ? `exit ${e.status}` : e.message}`);
    }
  };
  const ensureMmdebstrap = () => {
    if (existsSync('/usr/bin/mmdebstrap')) return;
    const t = performance.now();
    log('installing mmdebstrap (apt-get update && apt-get install -y mmdebstrap)');
    // A fresh machine's package lists may be empty or stale: update them first.
    run('apt-get', ['update']);
    run('apt-get', ['install', '-y', 'mmdebstrap']);
    log(`apt-get install mmdebstrap: ${secs(t)}`);
  };
  const needRoot = () => {
    if (process.getuid?.() !== 0) fail('run as root (mmdebstrap must keep the owners of the rootfs files)');
  };
  return { log, fail, run, ensureMmdebstrap, needRoot };
}
