// The package as a user gets it: `import` and `require` by package name, the published file
// list, the per-platform npm packages of the addon and the pinned Claude Code CLI packages.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, mkdirSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';

// The values index.d.ts declares (`export declare function|const|class`).
const declared = [...readFileSync(join(root, 'index.d.ts'), 'utf8').matchAll(/^export declare (?:function|const|class) (\w+)/gm)].map((m) => m[1]).sort();

describe('loading by package name', () => {
  let dir;
  beforeAll(() => {
    // A consumer project whose node_modules/claude-runtime-adapter is this checkout, so Node
    // resolves the name through package.json `exports` exactly as for an installed copy.
    dir = mkdtempSync(join(tmpdir(), 'cra-consumer-'));
    mkdirSync(join(dir, 'node_modules'));
    symlinkSync(root, join(dir, 'node_modules', 'claude-runtime-adapter'), process.platform === 'win32' ? 'junction' : 'dir');
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const node = (args) => JSON.parse(execFileSync(process.execPath, args, { cwd: dir, encoding: 'utf8' }));
  const describeExports = `
    const out = {};
    for (const [k, v] of Object.entries(m)) out[k] = v === null ? 'null' : typeof v;
    console.log(JSON.stringify(out));`;

  it('ESM: named imports work, outputSchemas included', () => {
    const got = node(['--input-type=module', '-e', `
      import { createClaudeAdapter, outputSchemas, RuntimeAdapter } from 'claude-runtime-adapter';
      import adapterDefault from 'claude-runtime-adapter';
      import * as m from 'claude-runtime-adapter';
      if (typeof createClaudeAdapter !== 'function') throw new Error('createClaudeAdapter');
      if (typeof RuntimeAdapter !== 'function') throw new Error('RuntimeAdapter');
      for (const role of ['planner', 'implementor', 'reviewer']) if (typeof outputSchemas[role] !== 'object') throw new Error(role);
      if (adapterDefault.createClaudeAdapter !== createClaudeAdapter) throw new Error('default export');
      ${describeExports}`]);
    for (const name of declared) expect(got[name], name).not.toBe('undefined');
  });

  it('CJS: require works and exposes every declared value', () => {
    const got = node(['-e', `
      const m = require('claude-runtime-adapter');
      ${describeExports}`]);
    for (const name of declared) expect(got[name], name).not.toBe('undefined');
    expect(got.createClaudeAdapter).toBe('function');
    expect(got.outputSchemas).toBe('object');
  });

  it('ESM and CJS see the same objects (one native module)', () => {
    const same = node(['--input-type=module', '-e', `
      import { createRequire } from 'node:module';
      import * as esm from 'claude-runtime-adapter';
      const cjs = createRequire(import.meta.url)('claude-runtime-adapter');
      const names = Object.keys(cjs);
      console.log(JSON.stringify(names.filter((n) => esm[n] !== cjs[n])));`]);
    expect(same).toEqual([]);
  });

  it('index.mjs re-exports everything index.d.ts declares and everything the binding has', async () => {
    const src = readFileSync(join(root, 'index.mjs'), 'utf8');
    const listed = src.match(/export const \{([^}]*)\}/)[1].split(',').map((s) => s.trim()).filter(Boolean);
    for (const name of declared) expect(listed, `index.mjs misses ${name}`).toContain(name);
    const cjsKeys = node(['-e', `console.log(JSON.stringify(Object.keys(require('claude-runtime-adapter'))))`]);
    for (const name of cjsKeys) expect(listed, `index.mjs misses ${name}`).toContain(name);
  });

  it('package.json is importable through exports', () => {
    const version = node(['-e', `console.log(JSON.stringify(require('claude-runtime-adapter/package.json').version))`]);
    expect(version).toBe(pkg.version);
  });
});

describe('published files', () => {
  it('npm pack contains exactly the loader, the ESM entry, the types, the audit verifier bin, README, LICENSE and package.json', () => {
    const out = execFileSync(npm, ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8', shell: process.platform === 'win32' });
    const files = JSON.parse(out.slice(out.indexOf('[')))[0].files.map((f) => f.path).sort();
    // No src/, no tests, no .node: the addon ships in claude-runtime-adapter-<platform>.
    expect(files).toEqual(['LICENSE', 'README.md', 'bin/cra-verify-audit.mjs', 'index.d.ts', 'index.js', 'index.mjs', 'package.json']);
  });

  it('exports, main and types point at shipped files', () => {
    expect(pkg.main).toBe('index.js');
    expect(pkg.types).toBe('index.d.ts');
    expect(pkg.exports['.']).toEqual({ types: './index.d.ts', import: './index.mjs', require: './index.js', default: './index.js' });
    expect(Object.keys(pkg.exports['.'])[0]).toBe('types'); // `types` must come first
    expect(pkg.engines.node).toBe('>= 20');
  });
});

// napi target → [platformArchABI of the addon package, os, cpu, libc, Claude Code CLI package suffix]
const TARGETS = {
  'x86_64-unknown-linux-gnu': ['linux-x64-gnu', 'linux', 'x64', 'glibc', 'linux-x64'],
  'aarch64-unknown-linux-gnu': ['linux-arm64-gnu', 'linux', 'arm64', 'glibc', 'linux-arm64'],
  'x86_64-unknown-linux-musl': ['linux-x64-musl', 'linux', 'x64', 'musl', 'linux-x64-musl'],
  'aarch64-unknown-linux-musl': ['linux-arm64-musl', 'linux', 'arm64', 'musl', 'linux-arm64-musl'],
  'x86_64-apple-darwin': ['darwin-x64', 'darwin', 'x64', undefined, 'darwin-x64'],
  'aarch64-apple-darwin': ['darwin-arm64', 'darwin', 'arm64', undefined, 'darwin-arm64'],
  'x86_64-pc-windows-msvc': ['win32-x64-msvc', 'win32', 'x64', undefined, 'win32-x64'],
};

describe('platform packages', () => {
  it('napi.targets are the supported targets', () => {
    expect([...pkg.napi.targets].sort()).toEqual(Object.keys(TARGETS).sort());
    expect(pkg.napi.packageName).toBe(pkg.name);
  });

  it('npm/<platform> holds one package per target (napi create-npm-dirs), loadable by index.js', () => {
    const loader = readFileSync(join(root, 'index.js'), 'utf8');
    expect(readdirSync(join(root, 'npm')).sort()).toEqual(Object.values(TARGETS).map((t) => t[0]).sort());
    for (const [abi, os, cpu, libc] of Object.values(TARGETS)) {
      const sub = JSON.parse(readFileSync(join(root, 'npm', abi, 'package.json'), 'utf8'));
      const file = `${pkg.napi.binaryName}.${abi}.node`;
      expect(sub.name).toBe(`${pkg.name}-${abi}`);
      expect(sub.version, `npm/${abi}: run \`napi version\` after bumping`).toBe(pkg.version);
      expect(sub.main).toBe(file);
      expect(sub.files).toEqual([file]);
      expect(sub.os).toEqual([os]);
      expect(sub.cpu).toEqual([cpu]);
      expect(sub.libc).toEqual(libc ? [libc] : undefined);
      expect(loader).toContain(`require('${sub.name}')`);
      expect(loader).toContain(`require('./${file}')`);
    }
  });

  it('optionalDependencies pin the Claude Code CLI of every supported platform to the SDK version', () => {
    const version = pkg.devDependencies['@anthropic-ai/claude-agent-sdk'];
    expect(version).toMatch(/^\d+\.\d+\.\d+$/);
    const expected = Object.fromEntries(Object.values(TARGETS).map((t) => [`@anthropic-ai/claude-agent-sdk-${t[4]}`, version]));
    // The addon's own platform packages are added by `napi prepublish` at publish time.
    expect(pkg.optionalDependencies).toEqual(expected);
  });
});
