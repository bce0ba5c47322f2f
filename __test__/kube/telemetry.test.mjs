// Issue 35 on the Kubernetes backend: the CLI in its pod (no network) exports its telemetry to
// the forwarder's loopback port, tunnelled like the relay's to the engine, where the forwarder
// sends it to the team's collector (here on the engine's 127.0.0.1) with the collector's header
// added — which no process in the pod can read — and to nothing else.
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from '../support/agent-bash.mjs';
import { setup } from '../support/harness.mjs';
import { startCollector, telemetryEnv } from '../support/otlp-collector.mjs';
import { agentsWithTools } from '../support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE } from '../support/roles.mjs';
import { eventually, kubeBackend } from './support.mjs';

const SECRET = 'collector-token-7d31b09e44';
const HEADERS = `authorization=Bearer%20${SECRET}`;
const PORT = 3130;

let h;
let collector;
let other;
afterEach(async () => {
  await h?.cleanup();
  await collector?.close();
  await other?.close();
  h = collector = other = undefined;
});

async function kubeSetup(c, { protocol, config = {} } = {}) {
  h = await setup({
    repo: { agents: agentsWithTools(['Bash']) },
    state: ROLE_STATE,
    bodies: ROLE_BODIES,
    config: { backend: kubeBackend(), ...config },
  });
  Object.assign(h.config.env, telemetryEnv(c, { protocol, headers: HEADERS }));
  return h;
}

const EVERY_ENVIRON = 'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr "\\0" "\\n" < $f; echo; done 2>/dev/null';
/** `[c]ollector…`: the pattern does not match the command lines that carry it. */
const SECRET_PATTERN = `[${SECRET[0]}]${SECRET.slice(1)}`;

describe("the CLI's telemetry from a pod reaches the team's collector", () => {
  for (const protocol of ['http/protobuf', 'grpc']) {
    it(`over ${protocol}: metrics and logs arrive with the collector header, which no process in the pod can read`, { timeout: 240_000 }, async () => {
      collector = await startCollector({ grpc: protocol === 'grpc' });
      await kubeSetup(collector, { protocol });
      const { out, result } = await agentRuns(h, 'planner', [
        `${EVERY_ENVIRON} | grep -c '${SECRET_PATTERN}'; ${EVERY_ENVIRON} | grep -E '^OTEL_EXPORTER_OTLP_(ENDPOINT|HEADERS)' | sort -u; sleep 2`,
      ]);
      expect(result.role).toBe('planner');
      expect(out[0].trim().split('\n')).toEqual(['0', `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:${PORT}`]);
      await eventually(() => collector.of('metrics').length > 0 && collector.of('logs').length > 0, 30_000, 'metrics and logs exported');
      for (const e of collector.exports) {
        expect(e.error, e.path).toBeUndefined();
        expect(e.headers.authorization).toBe(`Bearer ${SECRET}`);
      }
      expect(collector.metricNames()).toContain('claude_code.session.count');
      // The pod's line in the transcript says so; the credential is never written.
      const logs = join(h.scratch, 'logs');
      const transcript = readdirSync(logs).filter((f) => f.endsWith('.log')).map((f) => readFileSync(join(logs, f), 'utf8')).join('\n');
      expect(transcript).toMatch(/Kubernetes pod .*; the CLI's telemetry forwarded to \S+ only;/);
      expect(transcript).not.toContain(SECRET);
    });
  }

  it('with sandbox: false in the pod (no jail, still no network) the exports arrive too', { timeout: 240_000 }, async () => {
    collector = await startCollector();
    await kubeSetup(collector, { config: { sandbox: false } });
    const { result } = await agentRuns(h, 'planner', ['sleep 2']);
    expect(result.role).toBe('planner');
    await eventually(() => collector.of('metrics').length > 0, 30_000, 'metrics exported');
  });

  it("the agent's own requests to the forwarder reach the collector or nothing: another host named in the URL, Host or CONNECT is not reached", { timeout: 240_000 }, async () => {
    collector = await startCollector();
    const seen = [];
    const server = createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      res.end('reached');
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    other = { close: () => new Promise((r) => server.close(r)) };
    const target = `127.0.0.1:${server.address().port}`;
    await kubeSetup(collector);
    const raw = (...head) => `exec 3<>/dev/tcp/127.0.0.1/${PORT} || exit 1; printf '${head.map((l) => `${l}\\r\\n`).join('')}\\r\\n' >&3; timeout 10 head -n 1 <&3`;
    const { out } = await agentRuns(h, 'planner', [
      raw(`POST http://${target}/v1/metrics HTTP/1.1`, `Host: ${target}`, 'Content-Length: 0'),
      raw(`CONNECT ${target} HTTP/1.1`, `Host: ${target}`),
      raw('GET / HTTP/1.1', `Host: ${target}`),
    ]);
    expect(out[0]).toMatch(/^HTTP\/1\.1 200 /);
    expect(out[1]).toMatch(/^HTTP\/1\.1 404 /);
    expect(out[2]).toMatch(/^HTTP\/1\.1 404 /);
    expect(seen).toEqual([]);
    expect(collector.exports.filter((e) => e.size === 0).map((e) => e.path)).toEqual(['/v1/metrics']);
  });
});
