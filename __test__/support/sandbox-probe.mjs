// Runs the real Claude Code CLI once against the fake Messages API, whose model runs each
// given command with Bash (one per turn) and then answers; prints one JSON line:
//   { results: [{ is_error, text }], result: { subtype, is_error, structured_output } }
// Used by tests/sandbox_cli.rs to try the sandbox settings the Rust side builds.
//   node sandbox-probe.mjs <cwd> <cmd>...   env: PROBE_SETTINGS (the --settings=... arg or empty),
//   PROBE_ENV (JSON object: the CLI's complete environment is offlineCliEnv() plus these),
//   PROBE_DISABLE_SANDBOX=1 (the model asks for dangerouslyDisableSandbox on every command).
import { startFakeApi, reply, structured, toolUse, assistantTurns, toolResults } from './fake-api.mjs';
import { offlineCliEnv, claudeBinaryPath } from './cli-env.mjs';
import { spawnCli, cliArgs } from './cli-session.mjs';

const [cwd, ...cmds] = process.argv.slice(2);
const disable = process.env.PROBE_DISABLE_SANDBOX === '1';
const settings = process.env.PROBE_SETTINGS;
const extraEnv = JSON.parse(process.env.PROBE_ENV ?? '{}');
// offlineCliEnv copies this process's environment: the probe's own variables stay out of it.
for (const k of Object.keys(process.env)) if (k.startsWith('PROBE_')) delete process.env[k];
const api = await startFakeApi({
  script: (body) => {
    const n = assistantTurns(body);
    if (n >= cmds.length) return reply(structured({ ok: true }));
    return reply(toolUse('Bash', { command: cmds[n], description: 'probe', ...(disable ? { dangerouslyDisableSandbox: true } : {}) }));
  },
});
const env = offlineCliEnv({ apiUrl: api.url, extra: extraEnv });
const extra = settings ? [settings] : [];
const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] };
const s = spawnCli({
  bin: claudeBinaryPath(),
  cwd,
  env,
  args: cliArgs({ agent: 'probe', jsonSchema: schema, extra }),
  onControl: async (req) => (req.subtype === 'hook_callback' ? { continue: true } : {}),
});
let out;
try {
  await s.initialize({
    hooks: { PreToolUse: [{ matcher: 'Bash', hookCallbackIds: ['hook_0'] }] },
    jsonSchema: schema,
    systemPrompt: [''],
    agents: { probe: { description: 'probe', prompt: 'probe', tools: ['Bash', 'StructuredOutput'] } },
  });
  s.sendUser('go');
  const r = await s.result({ timeoutMs: 120_000 });
  const last = api.mainBodies().at(-1);
  out = {
    results: (last ? toolResults(last) : []).map(({ is_error, text }) => ({ is_error, text })),
    result: { subtype: r.subtype, is_error: r.is_error, structured_output: r.structured_output ?? null },
  };
} catch (e) {
  out = { error: String(e?.message ?? e), stderr: s.stderr.slice(-4000) };
}
await s.close();
await api.close();
process.stdout.write(JSON.stringify(out) + '\n');
