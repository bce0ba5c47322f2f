#!/usr/bin/env node
// Checks a session's audit record from a shell, as `verifyAuditRecord` does (docs/audit.md):
//   cra-verify-audit RECORD [--public-key KEY.pem] [--patch PATCH_FILE]
// Prints the verdict as JSON; exits 0 when it is ok, 1 when the record fails, 2 on bad usage
// (a missing file, a key that is not one: the message says which).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const { verifyAuditRecord } = createRequire(import.meta.url)('../index.js');
const USAGE = 'usage: cra-verify-audit RECORD [--public-key KEY.pem] [--patch PATCH_FILE]';

function parse(argv) {
  const opts = {};
  let record;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--public-key' || a === '--patch') {
      const file = argv[++i];
      if (!file) throw new Error(`${a} needs a file`);
      opts[a === '--patch' ? 'patch' : 'publicKey'] = readFileSync(file, 'utf8');
    } else if (a === '-h' || a === '--help') {
      console.log(USAGE);
      process.exit(0);
    } else if (record === undefined && !a.startsWith('--')) {
      record = a;
    } else {
      throw new Error(`unexpected argument ${JSON.stringify(a)}`);
    }
  }
  if (!record) throw new Error('no record given');
  return { record, opts };
}

try {
  const { record, opts } = parse(process.argv.slice(2));
  const verdict = await verifyAuditRecord(record, opts);
  console.log(JSON.stringify(verdict));
  process.exit(verdict.ok ? 0 : 1);
} catch (e) {
  console.error(`cra-verify-audit: ${e.message}\n${USAGE}`);
  process.exit(2);
}
