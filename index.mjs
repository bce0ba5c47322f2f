// ESM entry point. The generated loader `index.js` is CommonJS, and Node's CJS → ESM named-export
// detection (cjs-module-lexer) does not see every export of it (`outputSchemas` is set by the
// native module, not by a `module.exports.x =` line), so the names are re-exported explicitly.
// __test__/package.test.mjs checks this list against index.d.ts and against the loaded binding.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const binding = require('./index.js');

export const {
  createClaudeAdapter,
  createBashValidatorHook,
  validateBashCommand,
  verifyAuditRecord,
  outputSchemas,
  RuntimeAdapter,
  OutputStream,
  __napiBindingTarget,
} = binding;

export default binding;
