// Locating the real Claude Code CLI and the environment it needs to run offline against the
// fake Messages API (see fake-api.mjs).
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
const PKG = '@anthropic-ai/claude-agent-sdk';

function isMusl() {
  if (process.platform !== 'linux') return false;
  const report = typeof process.report?.getReport === 'function' ? process.report.getReport() : null;
  return report != null && report.header?.glibcVersionRuntime === undefined;
}

/**
 * Path of the native `claude` binary from the platform package, resolved the way the official
 * SDK does (linux: glibc package first, musl first on musl systems). Throws when none is installed.
 */
export function claudeBinaryPath({ platform = process.platform, arch = process.arch } = {}) {
  const exe = platform === 'win32' ? '.exe' : '';
  const names =
    platform === 'linux'
      ? isMusl()
        ? [`${PKG}-linux-${arch}-musl`, `${PKG}-linux-${arch}`]
        : [`${PKG}-linux-${arch}`, `${PKG}-linux-${arch}-musl`]
      : [`${PKG}-${platform}-${arch}`];
  for (const name of names) {
    try {
      const p = require.resolve(`${name}/claude${exe}`);
      if (existsSync(p)) return p;
    } catch {
      // not installed
    }
  }
  throw new Error(`no Claude Code binary: none of ${names.join(', ')} is installed`);
}

/** The CLI version pinned by the installed platform package (from its package.json). */
export function claudePackageVersion() {
  const pj = require.resolve(`${PKG}-linux-x64/package.json`);
  return JSON.parse(readFileSync(pj, 'utf8')).version;
}

/**
 * Environment for running the CLI offline against `apiUrl`. The result is a complete env (the
 * SDK replaces the child's environment rather than merging): PATH/HOME/etc. from the parent,
 * minus NODE_OPTIONS/DEBUG and any ANTHROPIC_/CLAUDE_ variables of the parent, plus:
 *   ANTHROPIC_BASE_URL, a dummy ANTHROPIC_API_KEY, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1,
 *   CLAUDE_CONFIG_DIR = `configDir` (a scratch dir the caller owns and removes; created if missing), also HOME, IS_SANDBOX=1 (root + bypassPermissions),
 *   CLAUDE_CODE_MAX_RETRIES (default 0: API errors end the session at once instead of retrying
 *   with backoff; pass `maxRetries: null` to leave the CLI default).
 * `extra` is merged last.
 */
export function offlineCliEnv({ apiUrl, configDir, maxRetries = 0, extra = {} } = {}) {
  if (!apiUrl) throw new Error('offlineCliEnv: apiUrl is required');
  if (!configDir) throw new Error('offlineCliEnv: configDir is required (a scratch dir the caller removes)');
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'NODE_OPTIONS' || k === 'DEBUG' || k.startsWith('ANTHROPIC_') || k.startsWith('CLAUDE_') || k.startsWith('VITEST')) continue;
    env[k] = v;
  }
  mkdirSync(configDir, { recursive: true });
  Object.assign(env, {
    ANTHROPIC_BASE_URL: apiUrl,
    ANTHROPIC_API_KEY: 'sk-ant-fake-key-for-tests',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    CLAUDE_CONFIG_DIR: configDir,
    // The CLI runs Bash as a login shell: a scratch HOME keeps the machine's own profile
    // (e.g. pyenv's rehash, which waits on a lock file a killed shell can leave) out of tests.
    // CRA_TEST_REAL_HOME=1 runs the suite with the real HOME and its login profile instead.
    HOME: process.env.CRA_TEST_REAL_HOME === '1' ? process.env.HOME : configDir,
    IS_SANDBOX: '1',
  });
  if (maxRetries != null) env.CLAUDE_CODE_MAX_RETRIES = String(maxRetries);
  return Object.assign(env, extra);
}
