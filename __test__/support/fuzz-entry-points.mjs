// Child process of the property-based test (host-safety.property.test.mjs): throws random config
// and params shapes at createClaudeAdapter, startAgent and previewPrompt, and prints one JSON
// line summarising every outcome. Run as a child so an abort of the host would show as a signal.
//   node fuzz-entry-points.mjs <repoRoot> <runs> <seed>
import fc from 'fast-check';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { createClaudeAdapter } = require('../../index.js');
const [repoRoot, runs, seed] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];

const noop = () => {};
const validConfig = {
  repoRoot,
  defaultBranch: 'main',
  contextPaths: [],
  maxAgentDuration: 5,
  logging: { agentSessions: false, logsDir: '' },
  bashValidatorHook: async () => ({ decision: 'approve' }),
  logger: { debug: noop, info: noop, error: noop, warn: noop },
  // Nothing may run an agent here: a valid start ends at ERR_CLI_NOT_FOUND.
  claudeExecutable: '/nonexistent/claude-for-fuzzing',
  worktreeSetupCommand: null,
};
const deps = {
  workItemReader: { getWorkItemBody: async (id) => `body ${id}` },
  revisionReader: { getRevisionFiles: async () => [] },
  getState: () => ({ workItems: {}, revisions: {}, lastPlannedSHAs: {} }),
  getReviewHistory: async () => ({ reviews: [], inlineComments: [] }),
};

const outcomes = { threw: {}, rejected: {}, created: 0, resolved: 0, bad: [] };
const note = (kind, err, input) => {
  const code = err?.code ?? 'NO_CODE';
  outcomes[kind][code] = (outcomes[kind][code] ?? 0) + 1;
  if (!(err instanceof Error) || !String(err.message).startsWith(`[${code}]`)) outcomes.bad.push({ kind, code, message: String(err?.message ?? err), input: String(input).slice(0, 200) });
};

const number = fc.oneof(fc.double(), fc.integer(), fc.constantFrom(Number.NaN, Infinity, -Infinity, 1e20, -0, 2 ** 53, 0));
const value = fc.oneof(number, fc.string(), fc.boolean(), fc.constant(null), fc.constant(undefined), fc.array(fc.string()), fc.object(), fc.func(fc.anything()));
const configField = fc.constantFrom(...Object.keys(validConfig), 'env', 'model', 'sandbox', 'worktreeSetupTimeout', 'extractionTimeout', 'contextConcurrency', 'contextCallbackTimeout', 'hookTimeout', 'outputRetries', 'backend');
// `sandbox` as an object of random fields too, not only as a random value.
const paths = fc.oneof(value, fc.array(fc.oneof(fc.string(), fc.constantFrom('/', '/tmp', 'relative', '', '/no/such/dir'))));
const sandboxShape = fc.record({ allowedDomains: paths, allowWrite: paths, allowRead: paths }, { requiredKeys: [] });
// `backend.kubernetes` as an object of near-valid and random fields (names, quantities,
// tolerations, label keys), so the validators see strings close to the rules' edges.
const near = (...good) => fc.oneof(value, fc.constantFrom(...good, '', 'Bad_Name', '-x', 'a'.repeat(64), 'x/y/z', 'claude-runtime-adapter/owner'));
const stringMap = fc.oneof(value, fc.dictionary(near('a', 'example.com/a'), near('v', '')));
const quantities = fc.oneof(value, fc.dictionary(fc.constantFrom('cpu', 'memory', 'ephemeral-storage', 'gpu'), fc.oneof(value, fc.constantFrom('1', '500m', '2Gi', '1E', '1e400', '9'.repeat(400), '-1', '1Kb'))));
const toleration = fc.oneof(value, fc.record({ key: near('k'), operator: near('Exists', 'Equal'), value: near('v'), effect: near('NoSchedule', 'NoExecute'), tolerationSeconds: number }, { requiredKeys: [] }));
const kubeShape = fc.record({
  namespace: near('agents'), image: near('local/busybox:1'), imagePullPolicy: near('Never', 'Always'),
  kubeconfig: near('/nonexistent/kubeconfig'), context: near('ctx'),
  resources: fc.oneof(value, fc.record({ requests: quantities, limits: quantities }, { requiredKeys: [] })),
  nodeSelector: stringMap, tolerations: fc.oneof(value, fc.array(toleration, { maxLength: 3 })),
  runtimeClassName: near('gvisor'), serviceAccountName: near('sa'), labels: stringMap, annotations: stringMap, podStartTimeout: number, warmPods: number, engineId: near('engine-1'), engineLease: number,
}, { requiredKeys: [] });
const backendShape = fc.oneof(value, fc.constant('local'), kubeShape.map((kubernetes) => ({ kubernetes })));
const configPair = fc.oneof(fc.tuple(configField, value), fc.tuple(fc.constant('sandbox'), sandboxShape), fc.tuple(fc.constant('backend'), backendShape));
const config = fc.oneof(
  fc.anything(),
  fc.array(configPair, { maxLength: 4 }).map((pairs) => ({ ...validConfig, ...Object.fromEntries(pairs) })),
);
const paramsField = fc.constantFrom('role', 'specPaths', 'workItemID', 'branchName', 'revisionID', 'sessionID', 'model');
const role = fc.constantFrom('planner', 'implementor', 'reviewer', 'other', '', undefined);
const params = fc.oneof(
  fc.anything(),
  fc.tuple(role, fc.array(fc.tuple(paramsField, fc.oneof(value, fc.string({ maxLength: 12 }))), { maxLength: 4 })).map(([r, pairs]) => ({ role: r, ...Object.fromEntries(pairs) })),
);

let adapter;
try {
  adapter = createClaudeAdapter(validConfig, deps);
} catch (e) {
  console.log(JSON.stringify({ setupFailed: String(e) }));
  process.exit(2);
}

await fc.assert(
  fc.asyncProperty(config, params, async (c, p) => {
    try {
      const a = createClaudeAdapter(c, deps);
      outcomes.created += 1;
      await a.shutdown();
    } catch (e) {
      note('threw', e, JSON.stringify(c));
    }
    for (const call of [() => adapter.startAgent(p), () => adapter.previewPrompt(p)]) {
      try {
        const r = await call();
        outcomes.resolved += 1;
        if (r?.result) await r.result.catch(noop);
      } catch (e) {
        note('rejected', e, JSON.stringify(p));
      }
    }
  }),
  { numRuns: runs, seed },
);
await adapter.shutdown();
console.log(JSON.stringify(outcomes));
