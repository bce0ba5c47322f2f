#!/usr/bin/env node
// `cargo test` for the host target named explicitly (`--target <host triple>`), with the given
// arguments. `napi build` always names its target and builds into target/<triple>/; a plain
// `cargo test` builds into target/debug/ and so compiled every dependency a second time
// (3 m 44 s of a fresh clone's `npm test`). Named the same, the tests reuse what the addon's
// build (the pre-step of `npm test` and `npm run demo`) compiled.
import { execFileSync, spawnSync } from 'node:child_process';

const host = execFileSync('rustc', ['-vV'], { encoding: 'utf8' }).match(/^host: (\S+)$/m)?.[1];
if (!host) throw new Error('cargo-test: `rustc -vV` named no host triple');
const r = spawnSync('cargo', ['test', '--target', host, ...process.argv.slice(2)], { stdio: 'inherit' });
process.exit(r.status ?? 1);
