// Benchmark: what Claude Code's OS sandbox costs a session, with and without it, same run.
//
//   node bench/sandbox.mjs [--n=5] [--commands=1000] [--per-turn=10]
//
//   1. start → result   a session whose model runs one `true` and answers (median over n; one
//                       warm-up each), sandboxed vs not
//   2. commands         <commands> trivial Bash commands (`true`) in one session, <per-turn> tool
//                       calls per model turn, total wall time and per command, sandboxed vs not
// The sandboxed runs get the settings the adapter gives an agent session (sandbox on, no
// unsandboxed fallback, network through a local proxy on httpProxyPort/socksProxyPort, the
// model key withheld from commands). The CLI is driven directly over stream-json (same
// protocol as the adapter) against the fake Messages API, so the figures isolate the sandbox.
import { createServer } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bash, reply, structured, assistantTurns, startFakeApi } from '../__test__/support/fake-api.mjs';
import { claudeBinaryPath, claudePackageVersion, offlineCliEnv } from '../__test__/support/cli-env.mjs';
import { spawnCli, cliArgs } from '../__test__/support/cli-session.mjs';
import { fmtMs, machine, median, printTable, ratio, saveResults } from './support/common.mjs';

const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? Number(a.slice(name.length + 3)) : dflt;
};
const N = arg('n', 5);
const COMMANDS = arg('commands', 1000);
const PER_TURN = arg('per-turn', 10);
const SCHEMA = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] };

/** A proxy that refuses everything (the trivial commands never use the network). */
async function refusingProxy() {
  const srv = createServer((_, res) => res.writeHead(403).end());
  srv.on('connect', (_, sock) => sock.end('HTTP/1.1 403 Forbidden\r\n\r\n'));
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return srv;
}

const settingsFor = (port) =>
  JSON.stringify({
    sandbox: {
      enabled: true,
      failIfUnavailable: true,
      allowUnsandboxedCommands: false,
      network: { allowedDomains: [], httpProxyPort: port, socksProxyPort: port },
      credentials: { envVars: [{ name: 'ANTHROPIC_API_KEY', mode: 'deny' }] },
    },
  });

/** One session running `commands` `true`s, `perTurn` per model turn; ms start → result. */
async function session(api, { sandbox, commands, perTurn }) {
  const turns = Math.ceil(commands / perTurn);
  api.setScript((body) => {
    const t = assistantTurns(body);
    if (t >= turns) return reply(structured({ ok: true }));
    const k = Math.min(perTurn, commands - t * perTurn);
    return reply(...Array.from({ length: k }, () => bash('true')));
  });
  const cwd = mkdtempSync(join(tmpdir(), 'bench-sandbox-'));
  const env = offlineCliEnv({ apiUrl: api.url });
  const extra = sandbox ? [`--settings=${sandbox}`] : [];
  const t0 = performance.now();
  const s = spawnCli({
    bin: claudeBinaryPath(),
    cwd,
    env,
    args: cliArgs({ agent: 'bench', jsonSchema: SCHEMA, maxTurns: turns + 5, extra }),
    onControl: async (req) => (req.subtype === 'hook_callback' ? { continue: true } : {}),
  });
  try {
    await s.initialize({
      hooks: { PreToolUse: [{ matcher: 'Bash', hookCallbackIds: ['hook_0'] }] },
      jsonSchema: SCHEMA,
      systemPrompt: [''],
      agents: { bench: { description: 'bench', prompt: 'bench', tools: ['Bash', 'StructuredOutput'] } },
    });
    s.sendUser('go');
    const r = await s.result({ timeoutMs: 1_800_000 });
    if (r.structured_output?.ok !== true) throw new Error(`session failed: ${JSON.stringify(r).slice(0, 500)}`);
    return performance.now() - t0;
  } finally {
    await s.close();
    rmSync(cwd, { recursive: true, force: true });
  }
}

const api = await startFakeApi({ keepBodies: false });
const proxy = await refusingProxy();
const sandbox = settingsFor(proxy.address().port);
const results = { machine: machine(), cli: claudePackageVersion(), n: N, commands: COMMANDS, perTurn: PER_TURN };
try {
  const latency = { off: [], on: [] };
  for (const s of [null, sandbox]) await session(api, { sandbox: s, commands: 1, perTurn: 1 }); // warm-up
  // Interleaved so that machine noise hits both modes alike.
  for (let i = 0; i < N; i++) {
    latency.off.push(await session(api, { sandbox: null, commands: 1, perTurn: 1 }));
    latency.on.push(await session(api, { sandbox, commands: 1, perTurn: 1 }));
  }
  const bulk = {
    off: await session(api, { sandbox: null, commands: COMMANDS, perTurn: PER_TURN }),
    on: await session(api, { sandbox, commands: COMMANDS, perTurn: PER_TURN }),
  };
  Object.assign(results, { latency, bulk });
  const lo = median(latency.off);
  const ln = median(latency.on);
  printTable(
    ['measure', 'no sandbox', 'sandbox', 'ratio (sandbox / none)'],
    [
      [`start → result, one Bash command (median of ${N})`, fmtMs(lo), fmtMs(ln), ratio(ln, lo)],
      [`${COMMANDS} trivial Bash commands, one session (total)`, fmtMs(bulk.off), fmtMs(bulk.on), ratio(bulk.on, bulk.off)],
      ['  per command', fmtMs(bulk.off / COMMANDS), fmtMs(bulk.on / COMMANDS), ratio(bulk.on, bulk.off)],
    ],
  );
  saveResults('sandbox', results);
} finally {
  proxy.close();
  await api.close();
}
