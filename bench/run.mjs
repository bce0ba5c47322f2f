// `npm run bench`: runs every bench/*.mjs (except this file) one after the other, passing the
// command-line arguments through. Benches measure time and memory: never run two at once.
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { BENCH_DIR } from './support/common.mjs';

const only = process.argv.slice(2).filter((a) => !a.startsWith('--'));
const pass = process.argv.slice(2).filter((a) => a.startsWith('--'));
const benches = readdirSync(BENCH_DIR)
  .filter((f) => f.endsWith('.mjs') && f !== 'run.mjs')
  .filter((f) => !only.length || only.includes(f.replace(/\.mjs$/, '')))
  .sort();

let failed = 0;
for (const f of benches) {
  console.log(`\n=== bench/${f} ===`);
  const r = spawnSync(process.execPath, [join(BENCH_DIR, f), ...pass], { stdio: 'inherit' });
  if (r.status !== 0) {
    failed += 1;
    console.error(`bench/${f} failed (status ${r.status}, signal ${r.signal})`);
  }
}
process.exit(failed ? 1 : 0);
