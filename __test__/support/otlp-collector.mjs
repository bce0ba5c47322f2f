// A team's OpenTelemetry collector on 127.0.0.1, for the telemetry suites: it receives OTLP
// exports over HTTP (`http/protobuf` or `http/json`, node:http) or gRPC (HTTP/2 without TLS, node:http2),
// records each one's path and headers, and decodes its body with the generated code of the
// official opentelemetry-proto definitions (`@opentelemetry/otlp-transformer` ships it, built
// by protobufjs from those .proto files).
import { createRequire } from 'node:module';
import { createServer as createHttp } from 'node:http';
import { createServer as createH2, constants as h2 } from 'node:http2';

const require = createRequire(import.meta.url);
const proto = require('@opentelemetry/otlp-transformer/build/src/generated/root.js').opentelemetry.proto;

/** The request message of each signal's export, by OTLP/HTTP path and gRPC method. */
const REQUESTS = {
  metrics: proto.collector.metrics.v1.ExportMetricsServiceRequest,
  logs: proto.collector.logs.v1.ExportLogsServiceRequest,
  traces: proto.collector.trace.v1.ExportTraceServiceRequest,
};
const SIGNAL_OF = {
  '/v1/metrics': 'metrics',
  '/v1/logs': 'logs',
  '/v1/traces': 'traces',
  '/opentelemetry.proto.collector.metrics.v1.MetricsService/Export': 'metrics',
  '/opentelemetry.proto.collector.logs.v1.LogsService/Export': 'logs',
  '/opentelemetry.proto.collector.trace.v1.TraceService/Export': 'traces',
};

/** gRPC's length-prefixed messages of `body` (uncompressed), concatenated. */
function grpcMessages(body) {
  const parts = [];
  for (let at = 0; at + 5 <= body.length; ) {
    if (body[at] !== 0) throw new Error('a compressed gRPC message');
    const length = body.readUInt32BE(at + 1);
    parts.push(body.subarray(at + 5, at + 5 + length));
    at += 5 + length;
  }
  return Buffer.concat(parts);
}

/**
 * Starts the collector: `{ grpc }` for OTLP/gRPC. Resolves with `{ url, port, exports, of(signal),
 * metricNames(), logEvents(), close() }`; each export is `{ path, signal, headers, decoded }`
 * (`decoded`: the request as a plain object, or `error` when it did not decode).
 */
export async function startCollector({ grpc = false } = {}) {
  const exports = [];
  const record = (path, headers, body) => {
    const signal = SIGNAL_OF[path];
    const entry = { path, signal, headers, size: body.length };
    try {
      const bytes = grpc ? grpcMessages(body) : body;
      // OTLP/JSON (`http/json`) is the same messages in protobuf's JSON mapping.
      const json = String(headers['content-type']).startsWith('application/json');
      const message = json ? REQUESTS[signal].fromObject(JSON.parse(bytes.toString('utf8'))) : REQUESTS[signal].decode(bytes);
      entry.decoded = REQUESTS[signal].toObject(message, { longs: String, defaults: false });
    } catch (err) {
      entry.error = String(err);
    }
    exports.push(entry);
    return entry;
  };
  let server;
  if (grpc) {
    server = createH2();
    server.on('stream', (stream, headers) => {
      const chunks = [];
      stream.on('data', (c) => chunks.push(c));
      stream.on('end', () => {
        const entry = record(headers[h2.HTTP2_HEADER_PATH], headers, Buffer.concat(chunks));
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
        stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': entry.signal ? '0' : '12' }));
        // An empty Export*ServiceResponse: one message of length 0.
        stream.end(Buffer.alloc(5));
      });
      stream.on('error', () => {});
    });
  } else {
    server = createHttp((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        const entry = record(req.url, req.headers, Buffer.concat(chunks));
        const json = String(req.headers['content-type']).startsWith('application/json');
        res.writeHead(entry.signal && req.method === 'POST' ? 200 : 404, { 'content-type': json ? 'application/json' : 'application/x-protobuf' });
        res.end(json ? '{}' : '');
      });
    });
    // Longer than the forwarder pools its connections (as a real collector's keep-alive is).
    server.keepAliveTimeout = 120_000;
  }
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  const of = (signal) => exports.filter((e) => e.signal === signal);
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    exports,
    of,
    /** Names of every metric exported. */
    metricNames: () => of('metrics').flatMap((e) => (e.decoded?.resourceMetrics ?? []).flatMap((r) => (r.scopeMetrics ?? []).flatMap((s) => (s.metrics ?? []).map((m) => m.name)))),
    /** `event.name` of every log record exported (Claude Code's events). */
    logEvents: () =>
      of('logs').flatMap((e) =>
        (e.decoded?.resourceLogs ?? []).flatMap((r) =>
          (r.scopeLogs ?? []).flatMap((s) => (s.logRecords ?? []).map((l) => (l.attributes ?? []).find((a) => a.key === 'event.name')?.value?.stringValue ?? l.body?.stringValue)),
        ),
      ),
    /** The `service.name` of every export's resources. */
    serviceNames: () =>
      exports.flatMap((e) =>
        [...(e.decoded?.resourceMetrics ?? []), ...(e.decoded?.resourceLogs ?? [])].map((r) => (r.resource?.attributes ?? []).find((a) => a.key === 'service.name')?.value?.stringValue),
      ),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
        // An HTTP/2 server waits for its sessions; they go with the test.
        setTimeout(resolve, 1000).unref();
      }),
  };
}

/** The CLI's environment for telemetry to `collector` over `protocol`, exporting often. */
export const telemetryEnv = (collector, { protocol = 'http/protobuf', headers } = {}) => ({
  CLAUDE_CODE_ENABLE_TELEMETRY: '1',
  OTEL_METRICS_EXPORTER: 'otlp',
  OTEL_LOGS_EXPORTER: 'otlp',
  OTEL_EXPORTER_OTLP_PROTOCOL: protocol,
  OTEL_EXPORTER_OTLP_ENDPOINT: collector.url,
  // The CLI also exports at exit; these make the first exports come within a short session.
  OTEL_METRIC_EXPORT_INTERVAL: '1000',
  OTEL_LOGS_EXPORT_INTERVAL: '500',
  ...(headers ? { OTEL_EXPORTER_OTLP_HEADERS: headers } : {}),
});

// ---------------------------------------------------------------- reading what arrived

/** A trace or span id (protobufjs decodes bytes to a Buffer) in hex. */
const hex = (id) => (id ? Buffer.from(id).toString('hex') : '');
/** Every span `collector` received, flattened: `{ name, traceId, spanId, parentSpanId, start, end, attrs }`. */
export function spansOf(collector) {
  const out = [];
  for (const e of collector.of('traces')) {
    for (const rs of e.decoded?.resourceSpans ?? []) {
      const resource = attrsOf(rs.resource?.attributes);
      for (const ss of rs.scopeSpans ?? []) {
        for (const s of ss.spans ?? []) {
          out.push({
            name: s.name,
            traceId: hex(s.traceId),
            spanId: hex(s.spanId),
            parentSpanId: hex(s.parentSpanId),
            start: BigInt(s.startTimeUnixNano),
            end: BigInt(s.endTimeUnixNano),
            status: s.status ?? {},
            attrs: attrsOf(s.attributes),
            events: (s.events ?? []).map((ev) => ({ name: ev.name, attrs: attrsOf(ev.attributes) })),
            resource,
          });
        }
      }
    }
  }
  return out;
}
function attrsOf(list) {
  const value = (v) => v?.stringValue ?? (v?.intValue !== undefined ? Number(v.intValue) : v?.doubleValue ?? v?.boolValue);
  return Object.fromEntries((list ?? []).map((a) => [a.key, value(a.value)]));
}
/** The latest cumulative data points of metric `name` that `collector` received, each `{ attrs, value }` (sums) or `{ attrs, count, sum }` (histograms). */
export function metricPoints(collector, name) {
  let latest = [];
  for (const e of collector.of('metrics')) {
    for (const rm of e.decoded?.resourceMetrics ?? []) {
      for (const sm of rm.scopeMetrics ?? []) {
        for (const m of sm.metrics ?? []) {
          if (m.name !== name) continue;
          const dps = m.sum?.dataPoints ?? m.histogram?.dataPoints ?? [];
          latest = dps.map((p) => ({
            attrs: attrsOf(p.attributes),
            value: p.asInt !== undefined ? Number(p.asInt) : p.asDouble,
            count: p.count !== undefined ? Number(p.count) : undefined,
            sum: p.sum,
          }));
        }
      }
    }
  }
  return latest;
}

/**
 * The adapter's trace `traceId` of a session of `role` (docs/telemetry.md), as `collector` has
 * it: `{ root, steps, chats, tools }`; `steps` are the root's step spans by start time.
 */
export function sessionTrace(collector, traceId, role) {
  const trace = spansOf(collector).filter((s) => s.traceId === traceId);
  const root = trace.find((s) => s.name === `invoke_agent ${role}`);
  if (!root) throw new Error(`no session span of ${role} in trace ${traceId}: ${JSON.stringify(trace.map((s) => s.name))}`);
  const under = (op) => trace.filter((s) => s.attrs['gen_ai.operation.name'] === op);
  const steps = trace.filter((s) => s.parentSpanId === root.spanId && s.attrs['cra.step']).sort((a, b) => (a.start < b.start ? -1 : 1));
  return { root, steps, chats: under('chat'), tools: under('execute_tool') };
}
