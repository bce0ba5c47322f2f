// Issue 38: the crate's modules keep their layers (ARCHITECTURE.md) and no files import each
// other round a circle — both checked by scripts/check-layers.py, here so that a change breaking
// either fails `npm test`. (The circle check was the shared tool ../shared/tools/import-circles.py,
// run only where that directory exists: a plain clone skipped it without a word. Issue 51.)
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const CHECK = join(root, 'scripts', 'check-layers.py');
const python = (script, src) => spawnSync('python3', [script, src], { encoding: 'utf8' });

const scratch = mkdtempSync(join(tmpdir(), 'cra-layers-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** A copy of src/ with each `[file, line]` of `edits` added (`file` relative to src/). */
function srcWith(...edits) {
  const copy = mkdtempSync(join(scratch, 'src-'));
  cpSync(join(root, 'src'), copy, { recursive: true });
  for (const [file, line] of edits) writeFileSync(join(copy, file), `${line}\n${readFileSync(join(copy, file), 'utf8')}`);
  return copy;
}

describe('the modules keep their layers', () => {
  it('no module imports from a layer above its own, and every file has a layer (scripts/check-layers.py)', () => {
    const r = python(CHECK, join(root, 'src'));
    expect(r.stdout + r.stderr).toContain('0 upward import(s), 0 unplaced file(s)');
    expect(r.status).toBe(0);
  });

  it('the check finds an upward import: git importing the lifecycle fails it, naming both', () => {
    const r = python(CHECK, srcWith(['git/patch.rs', 'use crate::lifecycle::SessionHost;']));
    expect(r.status).toBe(1);
    expect(r.stdout).toMatch(/git\/patch\.rs.*lifecycle/);
  });

  it("a test module's imports are not the file's (`#[cfg(test)]`, and a unix-only `#[cfg(all(test, unix))]`): neither an upward import nor a circle", () => {
    const r = python(CHECK, srcWith(['git/patch.rs', '#[cfg(all(test, unix))]\nmod upward {\n    use crate::lifecycle::SessionHost;\n}'], ['spend.rs', '#[cfg(test)]\nmod round {\n    use crate::stats::Stats;\n}']));
    expect(r.stdout).toContain('0 upward import(s), 0 unplaced file(s)');
    expect(r.stdout).toContain('0 import circle(s)');
    expect(r.status).toBe(0);
  });

  it('no files import each other, directly or round a longer circle (scripts/check-layers.py)', () => {
    const r = python(CHECK, join(root, 'src'));
    expect(r.stdout + r.stderr).toMatch(/^0 import circle\(s\) among \d+ files$/m);
    expect(r.stdout).not.toContain('circle of');
    expect(r.status).toBe(0);
  });

  it('the check finds two files importing each other (spend.rs importing stats.rs, which imports it), naming both and the way round', () => {
    const r = python(CHECK, srcWith(['spend.rs', 'use crate::stats::Stats;']));
    expect(r.status).toBe(1);
    expect(r.stdout).toContain('circle of 2: spend.rs, stats.rs (spend.rs -> stats.rs -> spend.rs)');
    expect(r.stdout).toContain('1 import circle(s)');
    // A circle within one layer: nothing goes up, the circle alone fails it.
    expect(r.stdout).toContain('0 upward import(s), 0 unplaced file(s)');
  });

  it('the check finds a longer circle (stats.rs → spend.rs → output.rs → stats.rs, through a `use` group), naming its three files', () => {
    const r = python(CHECK, srcWith(['spend.rs', 'use crate::{error::Result, output::{Output}};'], ['output.rs', 'use crate::stats::Stats;']));
    expect(r.status).toBe(1);
    expect(r.stdout).toContain('circle of 3: output.rs, spend.rs, stats.rs (output.rs -> stats.rs -> spend.rs -> output.rs)');
    expect(r.stdout).toContain('1 import circle(s)');
  });
});
