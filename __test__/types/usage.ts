// Written the way the engine calls the adapter. Must compile with zero errors under --strict.
import {
  createClaudeAdapter,
  outputSchemas,
  type AgentResult,
  type AgentRunHandle,
  type AgentStartParams,
  type BashValidatorHook,
  type ClaudeAdapterConfig,
  type EngineState,
  type ImplementorResult,
  type Logger,
  type PlannerResult,
  type ReviewHistory,
  type ReviewerResult,
  type Revision,
  type RevisionFile,
  type RuntimeAdapter,
  type RuntimeAdapterDeps,
  type SessionInfo,
  type SessionStats,
  type WorkItem,
  type KubernetesBackend,
  verifyAuditRecord,
} from 'claude-runtime-adapter';

// --- engine-side providers (class instances: the adapter calls them as methods) ---
class GitHubWorkItemReader {
  constructor(private readonly bodies: Map<string, string>) {}
  async getWorkItemBody(id: string): Promise<string> {
    return this.bodies.get(id) ?? '';
  }
}
class GitHubRevisionReader {
  private readonly files = new Map<string, RevisionFile[]>();
  async getRevisionFiles(id: string): Promise<RevisionFile[]> {
    return this.files.get(id) ?? [{ path: 'src/a.ts', status: 'modified', patch: null }];
  }
}

const logger: Logger = {
  debug: (message, data) => console.debug(message, data),
  info: (message, data) => console.info(message, data),
  error: (message, data) => console.error(message, data),
  warn: (message) => console.warn(message),
};
// A logger without the optional `warn` is fine too.
const minimalLogger: Logger = { debug() {}, info() {}, error() {} };

// The engine's state: Maps.
const workItems = new Map<string, WorkItem>([
  ['w1', { id: 'w1', title: 'Add login', status: 'ready', linkedRevision: null }],
]);
const revisions = new Map<string, Revision>([
  ['r1', { id: 'r1', title: 'Add login', pipeline: { status: 'failure', url: null, reason: 'lint' } }],
  ['r2', { id: 'r2', title: 'Other', pipeline: null }],
]);
const state: EngineState = { workItems, revisions, lastPlannedSHAs: new Map([['specs/a.md', 'abc123']]) };
// Plain objects are accepted as well.
const plainState: EngineState = { workItems: { w1: workItems.get('w1')! }, revisions: {}, lastPlannedSHAs: {} };

const customHook: BashValidatorHook = async (event) => {
  const command = event.tool_input['command'];
  if (typeof command === 'string' && command.includes('rm -rf /')) return { decision: 'block', reason: 'no' };
  if (event.tool_name !== 'Bash') return undefined;
  return { decision: 'approve' };
};

const config: ClaudeAdapterConfig = {
  repoRoot: '/repo',
  defaultBranch: 'main',
  contextPaths: ['AGENTS.md', 'docs/architecture.md'],
  maxAgentDuration: 3600,
  logging: { agentSessions: true, logsDir: '/var/log/agents' },
  bashValidatorHook: customHook,
  logger,
  claudeExecutable: '/usr/local/bin/claude',
  env: { ANTHROPIC_API_KEY: 'k' },
  model: 'sonnet',
  worktreeSetupCommand: null,
  contextConcurrency: 8,
};

const deps: RuntimeAdapterDeps = {
  workItemReader: new GitHubWorkItemReader(new Map()),
  revisionReader: new GitHubRevisionReader(),
  getState: () => state,
  getReviewHistory: async (revisionID: string): Promise<ReviewHistory> => ({
    reviews: [{ author: 'alice', state: 'CHANGES_REQUESTED', body: `on ${revisionID}` }],
    inlineComments: [{ path: 'src/a.ts', line: 3, author: 'alice', body: 'nit' }, { path: 'b', line: null, author: 'bob', body: '' }],
  }),
};

const adapter: RuntimeAdapter = createClaudeAdapter(config, deps);
createClaudeAdapter(
  { repoRoot: '/r', defaultBranch: 'main', contextPaths: [], maxAgentDuration: 0, logging: { agentSessions: false, logsDir: '' }, bashValidatorHook: customHook, logger: minimalLogger, worktreeSetupCommand: ['yarn', 'install'] },
  { ...deps, getState: () => plainState },
);

// --- the engine's handling of results: narrow on `role` ---
function apply(result: AgentResult): string {
  switch (result.role) {
    case 'planner': {
      const r: PlannerResult = result;
      const titles: string[] = r.create.map((item) => `${item.tempID} ${item.title} ${item.labels.join(',')} ${item.blockedBy.length}`);
      const closed: string[] = r.close;
      const bodies: (string | null)[] = r.update.map((u) => u.body);
      const labels: (string[] | null)[] = r.update.map((u) => u.labels);
      return [...titles, ...closed, String(bodies.length + labels.length)].join('\n');
    }
    case 'implementor': {
      const r: ImplementorResult = result;
      const patch: string | null = r.patch;
      if (r.outcome === 'completed' && patch !== null) {
        const p: string = patch;
        return p;
      }
      const outcome: 'blocked' | 'validation-failure' | 'completed' = r.outcome;
      return `${outcome}: ${r.summary}`;
    }
    case 'reviewer': {
      const r: ReviewerResult = result;
      const verdict: 'approve' | 'needs-changes' = r.review.verdict;
      const lines: (number | null)[] = r.review.comments.map((c) => c.line);
      return `${verdict} ${r.review.summary} ${r.review.comments.map((c) => `${c.path}:${c.body}`).join()} ${lines.length}`;
    }
    default: {
      const never: never = result;
      return never;
    }
  }
}

async function run(params: AgentStartParams): Promise<string> {
  const handle: AgentRunHandle = await adapter.startAgent(params);
  const id: string = handle.sessionID;
  const logFile: string | null = handle.logFilePath;
  handle.abortSignal.addEventListener('abort', () => {
    const reason: unknown = handle.abortSignal.reason;
    logger.info('aborted', { id, reason, logFile });
  });
  let text = '';
  for await (const chunk of handle.output) {
    const s: string = chunk;
    text += s;
  }
  try {
    const result = await handle.result;
    return apply(result) + text;
  } catch (error) {
    if (handle.abortSignal.aborted && handle.abortSignal.reason === 'timeout') return 'timed out';
    throw error;
  }
}

export async function engineMain(): Promise<void> {
  await run({ role: 'planner', specPaths: ['specs/001.md'] });
  await run({ role: 'implementor', workItemID: 'w1', branchName: 'agent/w1' });
  await run({ role: 'reviewer', workItemID: 'w1', revisionID: 'r1', sessionID: '7b1f7c38-0000-4000-8000-000000000000' });

  const handle = await adapter.startAgent({ role: 'implementor', workItemID: 'w1', branchName: 'agent/w1', sessionID: 's-1' });
  adapter.cancelAgent(handle.sessionID);
  adapter.cancelAgent('unknown-id');
  const outcome = await handle.result.then(
    (r) => (r.role === 'implementor' ? r.outcome : r.role),
    (e: unknown) => (e instanceof Error ? e.message : String(e)),
  );
  logger.info(outcome);

  const prompt: string = await adapter.previewPrompt({ role: 'reviewer', workItemID: 'w1', revisionID: 'r1' });
  logger.debug(prompt);

  const schema: object = outputSchemas.planner;
  const schemas: object[] = [outputSchemas.implementor, outputSchemas.reviewer, schema];
  logger.debug('schemas', { count: schemas.length });

  const shutdown: Promise<void> = adapter.shutdown();
  await shutdown;
}

// --- issue 11: the engine's own run id, model per dispatch, stats, sessions(), graceful stop ---
const fullConfig: ClaudeAdapterConfig = {
  ...config,
  worktreeSetupTimeout: 600,
  extractionTimeout: 300,
  contextCallbackTimeout: 0.2,
  hookTimeout: 30,
  outputRetries: 2,
  sandbox: { allowedDomains: ['registry.npmjs.org'], allowWrite: ['/tmp/cache'], allowRead: ['/opt/shared-specs'], serverTools: ['web_search'] },
};
const unsandboxed: ClaudeAdapterConfig = { ...config, sandbox: false };
const defaultSandbox: ClaudeAdapterConfig = { ...config, sandbox: {} };
const limited: ClaudeAdapterConfig = { ...config, sandbox: { limits: { memoryMiB: 2048, processes: 0, tmpMiB: 256 } } };
// --- issue 35: a hard budget per session, and the price table's overrides ---
const budgeted: ClaudeAdapterConfig = {
  ...config,
  maxBudgetUsd: 5,
  modelPrices: { 'claude-sonnet-4-5': { input: 3, output: 15 }, '*': { input: 15, output: 75, cacheRead: 1.5, cacheCreation: 18.75 } },
};
const budgetedStart: AgentStartParams = { role: 'reviewer', workItemID: 'w1', revisionID: 'r1', maxBudgetUsd: 0.5 };
// --- issue 35: the engine's dispatch span continues into the session's trace ---
const tracedStart: AgentStartParams = { role: 'implementor', workItemID: 'w1', branchName: 'b', traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' };
function describeSpend(s: SessionStats): string {
  if (s.spend === null) return 'not counted';
  const usd: number = s.spend.usd;
  const budget: number | null = s.spend.budgetUsd;
  return `$${usd} of ${budget ?? 'no budget'} (${s.spend.requests} requests, ${s.spend.refused} refused)`;
}

function describeStats(s: SessionStats): string {
  const duration: number = s.durationMs;
  const turns: number | null = s.turns;
  const cost: number | null = s.costUsd;
  const model: string | null = s.model;
  const tokens = s.tokens === null ? 'n/a' : `${s.tokens.input}/${s.tokens.output}/${s.tokens.cacheRead}/${s.tokens.cacheCreation}`;
  const files: string[] = (s.changedFiles ?? []).map((f) => {
    const status: 'added' | 'modified' | 'deleted' | 'renamed' = f.status;
    return `${status} ${f.path} +${f.added} -${f.removed}`;
  });
  return `${duration} ${turns ?? '?'} ${cost ?? '?'} ${model ?? '?'} ${tokens} ${files.join(',')}`;
}

class MiniEngine {
  private readonly runs = new Map<string, AgentRunHandle>();
  private readonly errors = new Map<string, string>();
  constructor(private readonly adapter: RuntimeAdapter) {}

  async dispatch(params: AgentStartParams, model?: string): Promise<string> {
    const id: string = crypto.randomUUID(); // the engine's run id (global crypto: Node and DOM)
    // The one-field change: the engine's run id as params.sessionID (any non-empty string).
    const handle = await this.adapter.startAgent(model === undefined ? { ...params, sessionID: id } : { ...params, sessionID: id, model });
    const same: boolean = handle.sessionID === id;
    logger.debug('dispatched', { id, same });
    this.runs.set(id, handle);
    handle.result.catch((e: unknown) => this.errors.set(id, e instanceof Error ? e.message : String(e)));
    const stats: Promise<SessionStats> = handle.stats;
    void stats.then((s) => logger.info(`${describeStats(s)} ${describeSpend(s)}`));
    return id;
  }

  list(): string[] {
    const running: SessionInfo[] = this.adapter.sessions();
    return running.map((s) => {
      const pid: number | null = s.pid;
      const startedAt: number = s.startedAt;
      const workItem: string | null = s.workItemID;
      const branch: string | null = s.branchName;
      return `${s.sessionID} ${s.role} ${workItem ?? '-'} ${branch ?? '-'} ${startedAt} ${pid ?? '-'}`;
    });
  }

  async stop(): Promise<void> {
    for (const id of this.runs.keys()) this.adapter.cancelAgent(id);
    await this.adapter.shutdown({ graceMs: 5000 });
    await this.adapter.shutdown({});
    await this.adapter.shutdown({ graceMs: 0, keepBases: false });
  }
}

export async function engineIssue11(): Promise<void> {
  const engine = new MiniEngine(createClaudeAdapter(fullConfig, deps));
  await engine.dispatch({ role: 'planner', specPaths: ['specs/a.md'] }, 'claude-opus-4-1');
  await engine.dispatch({ role: 'implementor', workItemID: 'w1', branchName: 'agent/w1', model: 'sonnet' });
  await engine.dispatch({ role: 'reviewer', workItemID: 'w1', revisionID: 'r1', sessionID: 'engine-run-42' });
  logger.info(engine.list().join('\n'));
  await engine.stop();
  createClaudeAdapter(unsandboxed, deps);
  createClaudeAdapter(defaultSandbox, deps);
  createClaudeAdapter(limited, deps);
  const budgetedEngine = new MiniEngine(createClaudeAdapter(budgeted, deps));
  logger.info(await budgetedEngine.dispatch(budgetedStart));
  logger.info(await budgetedEngine.dispatch(tracedStart));
}

// Sessions on a cluster: in the team's own image with the adapter's runtime copied in, or in
// the image the repository's devcontainer.json names (only runtimeImage given).
const ciImage: KubernetesBackend = { namespace: 'agents', image: 'ghcr.io/acme/ci:1', runtimeImage: 'ghcr.io/acme/cra-session:1' };
const devcontainerImage: KubernetesBackend = { namespace: 'agents', runtimeImage: 'ghcr.io/acme/cra-session:1' };
// The runtime kept once per node instead of copied into each pod.
const cachedRuntime: KubernetesBackend = { ...ciImage, nodeCache: '/var/lib/claude-runtime-adapter' };
// An engine in the cluster: a rescheduled process takes over its predecessor's pods.
const inCluster: KubernetesBackend = { ...ciImage, engineId: 'decree-prod', engineLease: 30 };
export function onACluster(): void {
  createClaudeAdapter({ ...fullConfig, backend: { kubernetes: inCluster } }, deps);
  createClaudeAdapter({ ...fullConfig, backend: { kubernetes: ciImage } }, deps);
  createClaudeAdapter({ ...fullConfig, backend: { kubernetes: devcontainerImage } }, deps);
  createClaudeAdapter({ ...fullConfig, backend: { kubernetes: cachedRuntime } }, deps);
}

// --- issue 50: a record of each session, sealed with the engine's key, checked later ---
const audited: ClaudeAdapterConfig = { ...fullConfig, audit: { dir: '/var/lib/engine/audit', signingKey: '-----BEGIN PRIVATE KEY-----\n…' } };
export async function auditedRun(params: AgentStartParams, publicKey: string): Promise<boolean> {
  const handle = await createClaudeAdapter(audited, deps).startAgent(params);
  const result = await handle.result;
  const path: string | null = handle.auditRecordPath;
  if (path === null) return false;
  const v = await verifyAuditRecord(path, result.role === 'implementor' ? { publicKey, patch: result.patch ?? '' } : { publicKey });
  const firstBad: number | null = v.firstBad;
  const reason: string | null = v.reason;
  logger.info('audit record', { entries: v.entries, sealed: v.sealed, firstBad, reason });
  return v.ok;
}
