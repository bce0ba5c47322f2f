// The public TypeScript contract (index.d.ts) as the engine uses it: `types/usage*.ts` must compile
// with zero errors under --strict, and each `types/invalid-*.ts` must fail with exactly the error
// its `// @expect TSxxxx` header names. The files import the package by its name, so resolution
// goes through package.json `exports` → `types` like it does in the engine.
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { beforeAll, describe, expect, it } from 'vitest';
import { compileAsync } from './support/tsc-worker.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const typesDir = join(root, '__test__', 'types');
const dts = join(root, 'index.d.ts');

function tsconfigOptions() {
  const configPath = join(typesDir, 'tsconfig.json');
  const { config, error } = ts.readConfigFile(configPath, ts.sys.readFile);
  if (error) throw new Error(ts.flattenDiagnosticMessageText(error.messageText, '\n'));
  const parsed = ts.parseJsonConfigFileContent(config, ts.sys, typesDir, undefined, configPath);
  if (parsed.errors.length) throw new Error(parsed.errors.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')).join('\n'));
  return parsed.options;
}

const compile = compileAsync;
/** A type check takes up to ~40 s on a loaded 2-core machine. */
const COMPILE_TIMEOUT = 180_000;

function format(diagnostics) {
  return diagnostics
    .map((d) => {
      const where = d.fileName ? `${d.fileName.slice(root.length + 1)}:${d.line}` : '(global)';
      return `${where} TS${d.code}: ${d.text}`;
    })
    .join('\n');
}

const usageFiles = [join(typesDir, 'usage.ts'), join(typesDir, 'usage-validator.ts')];

describe('index.d.ts: valid usage compiles', () => {
  it('under the engine config (strict, NodeNext, @types/node, exactOptionalPropertyTypes, no skipLibCheck)', { timeout: COMPILE_TIMEOUT }, async () => {
    const { sourceFiles, diagnostics } = await compile(usageFiles, tsconfigOptions());
    expect(format(diagnostics)).toBe('');
    // Resolved through the package name to this index.d.ts.
    expect(sourceFiles.map((f) => resolve(f))).toContain(dts);
  });

  it('under bundler resolution with the DOM lib instead of @types/node', { timeout: COMPILE_TIMEOUT }, async () => {
    const options = { ...tsconfigOptions(), module: ts.ModuleKind.ESNext, moduleResolution: ts.ModuleResolutionKind.Bundler, lib: ['lib.es2022.d.ts', 'lib.dom.d.ts'], types: [] };
    expect(format((await compile(usageFiles, options)).diagnostics)).toBe('');
  });

  it('under legacy node10 resolution (package.json `types`)', { timeout: COMPILE_TIMEOUT }, async () => {
    // node10 knows no self-reference by package name: map the name to the package directory,
    // which node10 resolves through package.json `types`.
    const options = { ...tsconfigOptions(), module: ts.ModuleKind.CommonJS, moduleResolution: ts.ModuleResolutionKind.Node10, baseUrl: root, paths: { 'claude-runtime-adapter': ['.'] } };
    expect(format((await compile(usageFiles, options)).diagnostics)).toBe('');
  });
});

describe('index.d.ts: misuse does not compile', () => {
  const invalid = readdirSync(typesDir).filter((f) => /^invalid-.*\.ts$/.test(f)).sort();
  let diagnostics;
  beforeAll(async () => {
    ({ diagnostics } = await compile(invalid.map((f) => join(typesDir, f)), tsconfigOptions()));
  }, COMPILE_TIMEOUT);

  it('has cases', () => {
    expect(invalid.length).toBeGreaterThanOrEqual(10);
  });

  it('reports nothing outside the invalid files (index.d.ts itself is clean)', () => {
    const elsewhere = diagnostics.filter((d) => !d.fileName || !invalid.includes(d.fileName.split('/').pop()));
    expect(format(elsewhere)).toBe('');
  });

  it.each(invalid)('%s fails with the expected error', (name) => {
    const text = readFileSync(join(typesDir, name), 'utf8');
    const expected = [...text.matchAll(/@expect (TS\d+)/g)].map((m) => m[1]);
    expect(expected.length, `${name} needs a // @expect TSxxxx header`).toBeGreaterThan(0);
    const got = diagnostics.filter((d) => d.fileName?.endsWith(`/${name}`)).map((d) => `TS${d.code}`);
    expect(got, format(diagnostics.filter((d) => d.fileName?.endsWith(`/${name}`)))).toEqual(expected);
  });
});

describe('index.d.ts: no `any`', () => {
  it('has no `any` type anywhere (AST walk)', () => {
    const source = ts.createSourceFile(dts, readFileSync(dts, 'utf8'), ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
    const found = [];
    const visit = (node) => {
      if (node.kind === ts.SyntaxKind.AnyKeyword) found.push(`line ${source.getLineAndCharacterOfPosition(node.getStart()).line + 1}: ${node.parent.getText()}`);
      ts.forEachChild(node, visit);
    };
    visit(source);
    expect(found).toEqual([]);
  });

  it('has no `any` word outside comments either', () => {
    const code = readFileSync(dts, 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');
    expect(code.match(/\bany\b/g) ?? []).toEqual([]);
  });
});
