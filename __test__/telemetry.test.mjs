// Issue 35: the CLI's own telemetry with the sandbox on. The real CLI, sandboxed, exports OTLP
// to a loopback port of its sandbox; the adapter's forwarder sends it on to the team's collector
// (here on 127.0.0.1, decoding with the official protobuf definitions), adding the collector's
// header outside — and to nothing else, whatever the agent's commands send it.
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { agentRuns } from './support/agent-bash.mjs';
import { rejection, setup } from './support/harness.mjs';
import { startCollector, telemetryEnv } from './support/otlp-collector.mjs';
import { agentsWithTools } from './support/repo.mjs';
import { ROLE_BODIES, ROLE_STATE, ROLES } from './support/roles.mjs';

const SECRET = 'collector-token-5f2a9c41e7';
const HEADERS = `authorization=Bearer%20${SECRET},x-team=platform`;
/** The forwarder's loopback port inside the sandbox. */
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

/** A harness whose CLI has telemetry on, exporting to `collector`. */
const withTelemetry = async (c, options = {}) => {
  const s = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) }, ...options });
  Object.assign(s.config.env, telemetryEnv(c, { headers: HEADERS, ...options.telemetry }));
  return s;
};

/** Resolves once `pred()` holds; fails after `ms`. */
async function eventually(pred, ms, what) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The session's transcript (one session per harness). */
const transcript = (s) => {
  const dir = join(s.scratch, 'logs');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.log'))
    .map((f) => readFileSync(join(dir, f), 'utf8'))
    .join('\n');
};

/** Every environment and command line inside, one variable or argument a line. */
const EVERY_ENVIRON = 'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr "\\0" "\\n" < $f; echo; done 2>/dev/null';

/** Bash that sends `head` (lines, `\r\n` added) and an empty body to the forwarder inside and
 * prints the answer's status line. */
const raw = (...head) =>
  `exec 3<>/dev/tcp/127.0.0.1/${PORT} || exit 1; printf '${head.map((l) => `${l}\\r\\n`).join('')}\\r\\n' >&3; timeout 10 head -n 1 <&3`;

describe("the CLI's telemetry reaches the team's collector with the sandbox on", () => {
  it('over OTLP/HTTP: metrics and logs arrive, decoded by the official protobuf definitions, with the collector header the adapter adds outside; inside no environment holds the header, the CLI exports to the forwarder', { timeout: 90_000 }, async () => {
    collector = await startCollector();
    h = await withTelemetry(collector);
    // From the host while the session runs: the telemetry bridge's cgroups (with a session
    // cgroup it must stay in the CLI's part, like the other bridges, not the commands').
    const bridgeCgroups = new Set();
    const sampler = setInterval(() => {
      for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
        try {
          // The bridge and its connections are socat. Not bwrap, whose arguments carry the
          // bridge script, nor the script's shell and what it forks before an exec (its waits,
          // which the placer may move to the commands' part): CI once sampled one there.
          const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
          if (!/(^|\/)socat$/.test(argv[0]) || !argv.some((a) => a.startsWith(`TCP-LISTEN:${PORT},`))) continue;
          const lines = readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n').filter(Boolean);
          for (const line of lines) bridgeCgroups.add(line);
        } catch {
          // gone meanwhile
        }
      }
    }, 100);
    const { out, result } = await agentRuns(h, 'planner', [
      // `[c]ollector…`: the pattern does not match the command lines that carry it.
      `${EVERY_ENVIRON} | grep -c '[${SECRET[0]}]${SECRET.slice(1)}'; ${EVERY_ENVIRON} | grep -E '^OTEL_EXPORTER_OTLP_(ENDPOINT|HEADERS)' | sort -u; sleep 2`,
    ]);
    clearInterval(sampler);
    expect(result.role).toBe('planner');
    expect(bridgeCgroups.size).toBeGreaterThan(0);
    for (const line of bridgeCgroups) {
      expect(line).not.toMatch(/\/tools$/);
      if (line.includes('/claude-runtime-adapter-')) expect(line).toMatch(/\/cli$/);
    }
    // No process inside has the collector's credential, nor any headers variable; the CLI's
    // endpoint is the forwarder's port.
    expect(out[0].trim().split('\n')).toEqual(['0', `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:${PORT}`]);
    await eventually(() => collector.of('metrics').length > 0 && collector.of('logs').length > 0, 15_000, 'metrics and logs exported');
    for (const e of collector.exports) {
      expect(e.path).toMatch(/^\/v1\/(metrics|logs)$/);
      expect(e.error, e.path).toBeUndefined();
      expect(e.headers['content-type']).toBe('application/x-protobuf');
      expect(e.headers.authorization).toBe(`Bearer ${SECRET}`);
      expect(e.headers['x-team']).toBe('platform');
    }
    expect(collector.serviceNames().every((n) => n === 'claude-code')).toBe(true);
    expect(collector.metricNames()).toContain('claude_code.session.count');
    expect(collector.logEvents().length).toBeGreaterThan(0);
    // The transcript says that telemetry is forwarded (the endpoint, a value only config.env
    // sets, is redacted like every such value) and never the credential.
    const log = transcript(h);
    expect(log).toMatch(/\[sandbox\] .*; the CLI's telemetry forwarded to \S+ only;/);
    expect(log).not.toContain(SECRET);
    expect(h.logger.entries.some((e) => e.level === 'info' && e.message.startsWith("the CLI's telemetry is forwarded to "))).toBe(true);
  });

  it('over OTLP/HTTP with JSON bodies (http/json) as well: metrics and logs arrive with the collector header', { timeout: 90_000 }, async () => {
    collector = await startCollector();
    h = await withTelemetry(collector, { telemetry: { protocol: 'http/json' } });
    const { result } = await agentRuns(h, 'planner', ['sleep 2']);
    expect(result.role).toBe('planner');
    await eventually(() => collector.of('metrics').length > 0 && collector.of('logs').length > 0, 15_000, 'metrics and logs exported as JSON');
    for (const e of collector.exports) {
      expect(e.error, e.path).toBeUndefined();
      expect(e.headers['content-type']).toMatch(/^application\/json/);
      expect(e.headers.authorization).toBe(`Bearer ${SECRET}`);
    }
    expect(collector.metricNames()).toContain('claude_code.session.count');
  });

  it('over OTLP/gRPC (HTTP/2) as well: metrics and logs arrive through the same forwarder with the collector header', { timeout: 90_000 }, async () => {
    collector = await startCollector({ grpc: true });
    h = await withTelemetry(collector, { telemetry: { protocol: 'grpc' } });
    const { result } = await agentRuns(h, 'planner', ['sleep 2']);
    expect(result.role).toBe('planner');
    await eventually(() => collector.of('metrics').length > 0 && collector.of('logs').length > 0, 15_000, 'metrics and logs exported over gRPC');
    for (const e of collector.exports) {
      expect(e.path).toMatch(/^\/opentelemetry\.proto\.collector\.(metrics|logs)\.v1\.(Metrics|Logs)Service\/Export$/);
      expect(e.error, e.path).toBeUndefined();
      expect(e.headers['content-type']).toBe('application/grpc');
      expect(e.headers.authorization).toBe(`Bearer ${SECRET}`);
    }
    expect(collector.metricNames()).toContain('claude_code.session.count');
  });
});

describe('the forwarder is a path to the collector only', () => {
  it("the agent's own requests to the forwarder reach the collector or nothing: an absolute URL, a Host or a CONNECT naming another host go nowhere else, other methods and paths are refused", { timeout: 90_000 }, async () => {
    collector = await startCollector();
    // Another host the agent would like to reach (here another port on the engine's loopback).
    const seen = [];
    const server = createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      res.end('reached');
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    other = { close: () => new Promise((r) => server.close(r)) };
    const target = `127.0.0.1:${server.address().port}`;
    h = await withTelemetry(collector);
    const { out } = await agentRuns(h, 'planner', [
      raw(`POST http://${target}/v1/metrics HTTP/1.1`, `Host: ${target}`, 'Content-Type: application/x-protobuf', 'Content-Length: 0'),
      raw('POST /v1/logs HTTP/1.1', `Host: ${target}`, 'Content-Type: application/x-protobuf', 'Content-Length: 0'),
      raw(`CONNECT ${target} HTTP/1.1`, `Host: ${target}`),
      raw('GET /v1/metrics HTTP/1.1', `Host: ${target}`),
      raw('POST /index.html HTTP/1.1', `Host: ${target}`, 'Content-Length: 0'),
      raw('POST /v1/metrics HTTP/1.1', 'Host: x', 'Content-Length: 99999999'),
    ]);
    expect(out[0]).toMatch(/^HTTP\/1\.1 200 /);
    expect(out[1]).toMatch(/^HTTP\/1\.1 200 /);
    expect(out[2]).toMatch(/^HTTP\/1\.1 404 /);
    expect(out[3]).toMatch(/^HTTP\/1\.1 405 /);
    expect(out[4]).toMatch(/^HTTP\/1\.1 404 /);
    expect(out[5]).toMatch(/^HTTP\/1\.1 413 /);
    expect(seen).toEqual([]);
    // Each refusal is logged for the operator.
    const refused = h.logger.entries.map((e) => e.message).filter((m) => m.startsWith('telemetry forwarder: refused'));
    expect(refused).toEqual([
      `telemetry forwarder: refused CONNECT ${target}: not an OTLP export of the CLI's configured telemetry`,
      'telemetry forwarder: refused GET /v1/metrics: not a POST without a query',
      'telemetry forwarder: refused POST /index.html: not an OTLP export of the CLI\'s configured telemetry',
      `telemetry forwarder: refused /v1/metrics: larger than ${16 * 2 ** 20} bytes`,
    ]);
    // What the agent sent went to the collector: it can send data there (the README says so).
    const agents = collector.exports.filter((e) => e.size === 0);
    expect(agents.map((e) => e.path).sort()).toEqual(['/v1/logs', '/v1/metrics']);
    expect(agents.every((e) => e.headers.host === `127.0.0.1:${collector.port}`)).toBe(true);
  });

  it('with telemetry off there is no forwarder: nothing listens on its port inside', async () => {
    h = await setup({ state: ROLE_STATE, bodies: ROLE_BODIES, repo: { agents: agentsWithTools(['Bash']) } });
    const { out } = await agentRuns(h, 'planner', [`(exec 3<>/dev/tcp/127.0.0.1/${PORT}) 2>/dev/null && echo open || echo closed`]);
    expect(out[0].trim()).toBe('closed');
    expect(transcript(h)).not.toContain('telemetry');
  });

  it('an endpoint the forwarder cannot use fails the session before the CLI starts, naming the variable and not its value', async () => {
    collector = await startCollector();
    h = await withTelemetry(collector);
    h.config.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://user:${SECRET}@127.0.0.1:${collector.port}`;
    const err = await rejection((async () => (await h.adapter().startAgent(ROLES.planner.params())).result)());
    expect(err.code).toBe('ERR_INVALID_PARAMS');
    expect(err.message).toContain('OTEL_EXPORTER_OTLP_ENDPOINT');
    expect(err.message).not.toContain(SECRET);
    expect(h.api.mainRequests()).toHaveLength(0);
  });
});
