// Issue 38: the crate's modules keep their layers (ARCHITECTURE.md) and no files import each
// other round a circle — checked by scripts/check-layers.py (the layer table) and by the shared
// tool ../shared/tools/import-circles.py, here so that a change breaking either fails `npm test`.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const CIRCLES = join(root, '..', 'shared', 'tools', 'import-circles.py');
const python = (script, src) => spawnSync('python3', [script, src], { encoding: 'utf8' });

const scratch = mkdtempSync(join(tmpdir(), 'cra-layers-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** A copy of src/ with `line` added to the file `file` (relative to src/). */
function srcWith(file, line) {
  const copy = mkdtempSync(join(scratch, 'src-'));
  cpSync(join(root, 'src'), copy, { recursive: true });
  writeFileSync(join(copy, file), `${line}\n${readFileSync(join(copy, file), 'utf8')}`);
  return copy;
}

describe('the modules keep their layers', () => {
  it('no module imports from a layer above its own, and every file has a layer (scripts/check-layers.py)', () => {
    const r = python(join(root, 'scripts', 'check-layers.py'), join(root, 'src'));
    expect(r.stdout + r.stderr).toContain('0 upward import(s), 0 unplaced file(s)');
    expect(r.status).toBe(0);
  });

  it('the check finds an upward import: git importing the lifecycle fails it, naming both', () => {
    const r = python(join(root, 'scripts', 'check-layers.py'), srcWith('git/patch.rs', 'use crate::lifecycle::SessionHost;'));
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(/git\/patch\.rs.*lifecycle/);
  });

  it.runIf(existsSync(CIRCLES))('no files import each other round a circle (../shared/tools/import-circles.py)', () => {
    const r = python(CIRCLES, join(root, 'src'));
    expect(r.stdout).toContain('0 import circle(s)');
    expect(r.status).toBe(0);
  });
});
