//! The CLI's own telemetry (issue 35): with `CLAUDE_CODE_ENABLE_TELEMETRY` on, Claude Code
//! exports OpenTelemetry metrics, logs and traces over OTLP to the endpoint of its environment.
//! Inside the sandbox there is no network, so the CLI exports instead to a loopback port bridged
//! to this forwarder's unix socket, and the forwarder sends each export on to the collector the
//! engine configured — that endpoint only: its upstream is fixed when the session starts, and a
//! request that is not an OTLP export of a configured signal (`POST /v1/metrics`, or the gRPC
//! method `/opentelemetry.proto.collector.metrics.v1.MetricsService/Export`, …) is refused.
//! So the forwarder gives the agent's commands no path but to that collector.
//!
//! The collector's headers (`OTEL_EXPORTER_OTLP_HEADERS` and the per-signal ones, typically its
//! credential) are added here, outside: inside they are not in any environment, and they are
//! masked in what comes back, as the relay masks the model key. HTTP (`http/protobuf`,
//! `http/json`) and gRPC (HTTP/2 without TLS inside, trailers passed both ways) are served on
//! the one socket; https to the collector is verified as the relay's upstream is, plus the CA
//! files `OTEL_EXPORTER_OTLP_CERTIFICATE` names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use crate::error::{AdapterError, Result};
use crate::gateway::mask::{mask_headers, Masker};
use crate::https::{extra_roots, sources, BoxError, Connector};
use crate::process::env_value;
use crate::server::{
    full, strip_hop_by_hop, Body, Limits, Tracked, UnixServer, MAX_HEAD, STEP_TIMEOUT,
};

/// Connections at once: the CLI keeps one or two per signal (gRPC: one in all).
const MAX_CONNECTIONS: usize = 16;
/// A connection with nothing moving for this long is closed.
const IDLE: Duration = Duration::from_secs(300);
/// The largest export forwarded (bytes). The CLI's batches are a few KiB; an OpenTelemetry
/// Collector takes 4 MiB over gRPC and 20 MiB over HTTP by default.
pub const MAX_EXPORT: usize = 16 * 1024 * 1024;
/// How long the collector may take to answer an export (the CLI's exporter gives up at 10 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Header values shorter than this are not masked in answers: `x-team=abc` is no secret, and
/// masking three bytes in a protobuf answer would break it.
const MIN_MASKED: usize = 8;

/// The headers of the CLI's export request that are forwarded; the rest is dropped (the
/// collector's own headers are added outside).
const FORWARDED_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-length",
    "accept",
    "accept-encoding",
    "user-agent",
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "grpc-accept-encoding",
];

/// The OTLP signals Claude Code exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Metrics,
    Logs,
    Traces,
}

impl Signal {
    const ALL: [Signal; 3] = [Signal::Metrics, Signal::Logs, Signal::Traces];

    /// Its part of the per-signal variables' names (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    fn var(self) -> &'static str {
        match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
            Signal::Traces => "TRACES",
        }
    }

    /// The OTLP/HTTP path of its exports.
    fn http_path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
            Signal::Traces => "/v1/traces",
        }
    }

    /// The OTLP/gRPC method of its exports.
    fn grpc_path(self) -> &'static str {
        match self {
            Signal::Metrics => "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Signal::Logs => "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            Signal::Traces => "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        }
    }
}

/// Where one signal's exports go.
#[derive(Debug, Clone)]
pub struct SignalRoute {
    pub signal: Signal,
    pub grpc: bool,
    /// The collector's URL for this signal's exports (gRPC: its method's path on the endpoint).
    pub upstream: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl SignalRoute {
    /// The path the CLI inside posts this signal's exports to.
    fn path(&self) -> &'static str {
        match self.grpc {
            true => self.signal.grpc_path(),
            false => self.signal.http_path(),
        }
    }
}

/// What the forwarder of one session forwards: a route per signal with a configured endpoint.
#[derive(Debug, Clone)]
pub struct TelemetryPlan {
    pub routes: Vec<SignalRoute>,
    /// The collector's CA files (`OTEL_EXPORTER_OTLP_CERTIFICATE`, per signal too).
    roots: Vec<PathBuf>,
}

/// True when Claude Code reads `value` as on (its own rule: `1`, `true`, `yes`, `on`).
fn is_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// `OTEL_EXPORTER_OTLP_<SIGNAL>_<what>`, else `OTEL_EXPORTER_OTLP_<what>`, non-empty.
fn setting<'a>(env: &'a [(String, String)], signal: Signal, what: &str) -> Option<&'a str> {
    let specific = format!("OTEL_EXPORTER_OTLP_{}_{what}", signal.var());
    env_value(env, &specific)
        .or_else(|| env_value(env, &format!("OTEL_EXPORTER_OTLP_{what}")))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

impl TelemetryPlan {
    /// The forwarding the CLI's environment asks for: `None` when its telemetry is off
    /// (`CLAUDE_CODE_ENABLE_TELEMETRY`) or no OTLP endpoint is configured. An endpoint, protocol
    /// or header list the forwarder cannot use is an error naming the variable (never its value:
    /// a header list holds the collector's credential).
    pub fn of(env: &[(String, String)]) -> Result<Option<TelemetryPlan>> {
        if !is_on(env_value(env, "CLAUDE_CODE_ENABLE_TELEMETRY")) {
            return Ok(None);
        }
        let mut routes = Vec::new();
        let mut roots = Vec::new();
        for signal in Signal::ALL {
            let specific = format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.var());
            let (endpoint, var) = match env_value(env, &specific).map(str::trim) {
                Some(e) if !e.is_empty() => (e, specific),
                _ => match env_value(env, "OTEL_EXPORTER_OTLP_ENDPOINT").map(str::trim) {
                    Some(e) if !e.is_empty() => (e, "OTEL_EXPORTER_OTLP_ENDPOINT".to_string()),
                    // No endpoint for this signal: nothing is forwarded for it (OTel's
                    // default, localhost, would be the engine's host, which nobody named).
                    _ => continue,
                },
            };
            let grpc = match setting(env, signal, "PROTOCOL").unwrap_or("http/protobuf") {
                "grpc" => true,
                "http/protobuf" | "http/json" => false,
                _ => {
                    return Err(AdapterError::invalid_params(format!(
                        "the CLI's OTLP protocol for {} (OTEL_EXPORTER_OTLP_{}_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL) is not grpc, http/protobuf or http/json",
                        signal.var().to_ascii_lowercase(),
                        signal.var()
                    )))
                }
            };
            let generic = !var.contains(signal.var());
            let upstream = upstream_uri(endpoint, &var, signal, grpc, generic)?;
            let mut headers = parse_headers(env, "OTEL_EXPORTER_OTLP_HEADERS")?;
            for (name, value) in
                parse_headers(env, &format!("OTEL_EXPORTER_OTLP_{}_HEADERS", signal.var()))?
            {
                headers.retain(|(n, _)| *n != name);
                headers.push((name, value));
            }
            if setting(env, signal, "CLIENT_CERTIFICATE").is_some()
                || setting(env, signal, "CLIENT_KEY").is_some()
            {
                return Err(AdapterError::invalid_params(format!(
                    "the CLI's telemetry for {} names a client certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE/_CLIENT_KEY): the sandbox's telemetry forwarder does not present one yet; use a header for the collector's credential",
                    signal.var().to_ascii_lowercase()
                )));
            }
            roots.extend(setting(env, signal, "CERTIFICATE").map(PathBuf::from));
            routes.push(SignalRoute {
                signal,
                grpc,
                upstream,
                headers,
            });
        }
        roots.sort();
        roots.dedup();
        Ok((!routes.is_empty()).then_some(TelemetryPlan { routes, roots }))
    }

    /// Each collector's `scheme://authority`, for the transcript and the log.
    pub fn collectors(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .routes
            .iter()
            .map(|r| {
                format!(
                    "{}://{}",
                    r.upstream.scheme_str().unwrap_or("http"),
                    r.upstream.authority().map_or("", |a| a.as_str())
                )
            })
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The header values the forwarder adds (masked in answers, redacted in transcripts).
    pub fn secrets(&self) -> Vec<String> {
        self.routes
            .iter()
            .flat_map(|r| &r.headers)
            .filter_map(|(_, v)| v.to_str().ok())
            .filter(|v| v.len() >= MIN_MASKED)
            .map(str::to_string)
            .collect()
    }
}

/// The collector's URL for a signal: a per-signal endpoint as it is (OTLP/HTTP: the whole URL),
/// the generic one with the signal's path appended; for gRPC the endpoint's origin and the
/// method's path.
fn upstream_uri(
    endpoint: &str,
    var: &str,
    signal: Signal,
    grpc: bool,
    generic: bool,
) -> Result<Uri> {
    let unusable = |why: &str| {
        AdapterError::invalid_params(format!(
            "the CLI's telemetry endpoint {var} is not usable by the sandbox's telemetry forwarder: {why}"
        ))
    };
    let uri: Uri = endpoint
        .parse()
        .map_err(|_| unusable("not an http(s) URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(unusable("the scheme must be http or https"));
    }
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(unusable("no host"));
    };
    if authority.as_str().contains('@') {
        return Err(unusable(
            "credentials in the URL are not supported (use OTEL_EXPORTER_OTLP_HEADERS)",
        ));
    }
    let origin = format!("{}://{authority}", uri.scheme_str().unwrap_or("http"));
    let target = if grpc {
        signal.grpc_path().to_string()
    } else if generic {
        format!("{}{}", uri.path().trim_end_matches('/'), signal.http_path())
    } else {
        uri.path_and_query().map_or("/", |p| p.as_str()).to_string()
    };
    format!("{origin}{target}")
        .parse()
        .map_err(|_| unusable("not an http(s) URL"))
}

/// The headers of an OTLP headers variable: `name=value` pairs separated by commas, values
/// percent-encoded (the OpenTelemetry specification's format).
fn parse_headers(env: &[(String, String)], var: &str) -> Result<Vec<(HeaderName, HeaderValue)>> {
    let Some(list) = env_value(env, var) else {
        return Ok(Vec::new());
    };
    let bad = || {
        AdapterError::invalid_params(format!(
            "{var} is not a list of name=value pairs separated by commas"
        ))
    };
    let mut headers = Vec::new();
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(bad)?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
        let mut value =
            HeaderValue::from_bytes(&percent_decode(value.trim())).map_err(|_| bad())?;
        value.set_sensitive(true);
        headers.push((name, value));
    }
    Ok(headers)
}

/// The secrets an OTLP headers variable's value `list` holds, for redaction: each header's
/// value (decoded) and, for `Bearer <token>` and the like, the token alone.
pub fn header_secrets(list: &str) -> Vec<String> {
    list.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(_, v)| String::from_utf8_lossy(&percent_decode(v.trim())).into_owned())
        .flat_map(|v| {
            let token = v.rsplit(' ').next().map(str::to_string);
            std::iter::once(v).chain(token)
        })
        .collect()
}

/// `%XX` escapes decoded (a malformed one is kept as it is).
fn percent_decode(s: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(s).collect()
}

/// The CLI's environment inside, for a session whose telemetry is forwarded: every OTLP
/// endpoint (`url` is the forwarder's loopback port), header list, certificate and TLS setting
/// gone, and the one endpoint the forwarder set. The protocols, intervals and the rest stay.
pub fn forwarded_env(env: &mut Vec<(String, String)>, url: &str) {
    env.retain(|(k, _)| {
        let k = k.to_ascii_uppercase();
        !(k.starts_with("OTEL_EXPORTER_OTLP_")
            && [
                "ENDPOINT",
                "HEADERS",
                "CERTIFICATE",
                "CLIENT_KEY",
                "INSECURE",
            ]
            .iter()
            .any(|s| k.ends_with(s)))
    });
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), url.to_string()));
}

/// A running forwarder; dropping it stops the listener and every connection and removes its
/// socket.
pub struct TelemetryForwarder {
    _server: UnixServer,
}

struct Forwarder {
    routes: Vec<SignalRoute>,
    /// OTLP/HTTP to the collector (HTTP/1.1, or HTTP/2 where its TLS offers it).
    http: Client<Connector, Body>,
    /// OTLP/gRPC: HTTP/2 only (in clear to an http:// endpoint).
    grpc: Client<Connector, Body>,
    masks: Arc<Vec<Vec<u8>>>,
}

impl TelemetryForwarder {
    /// Listens on the unix socket `socket` (which must not exist yet) and forwards as `plan`
    /// says. Needs a tokio runtime.
    pub fn start(socket: &Path, plan: TelemetryPlan) -> Result<TelemetryForwarder> {
        let mut roots = extra_roots();
        roots.extend(plan.roots.iter().cloned());
        let client = |http2_only: bool| -> Result<Client<Connector, Body>> {
            Ok(Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .http2_only(http2_only)
                .build(Connector::new(&roots, true, STEP_TIMEOUT)?))
        };
        let masks = Arc::new(plan.secrets().into_iter().map(String::into_bytes).collect());
        let forwarder = Arc::new(Forwarder {
            http: client(false)?,
            grpc: client(true)?,
            routes: plan.routes,
            masks,
        });
        let limits = Limits {
            max_connections: MAX_CONNECTIONS,
            idle: Some(IDLE),
        };
        let server = UnixServer::start(
            socket,
            "the telemetry forwarder",
            limits,
            || tracing::warn!("telemetry forwarder: a connection over the cap was refused"),
            move |stream, conn| {
                let forwarder = forwarder.clone();
                async move {
                    let service = hyper::service::service_fn(move |req| {
                        let forwarder = forwarder.clone();
                        async move { Ok::<_, std::convert::Infallible>(forwarder.handle(req).await) }
                    });
                    let mut builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder
                        .http1()
                        .timer(TokioTimer::new())
                        .header_read_timeout(STEP_TIMEOUT)
                        .max_buf_size(MAX_HEAD.max(8192));
                    builder
                        .http2()
                        .timer(TokioTimer::new())
                        .max_concurrent_streams(32)
                        .max_header_list_size(MAX_HEAD as u32);
                    let io = TokioIo::new(Tracked::new(stream, None, conn));
                    let _ = builder.serve_connection(io, service).await;
                }
            },
        )?;
        Ok(TelemetryForwarder { _server: server })
    }
}

impl Forwarder {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let method = parts.method.clone();
        // The whole target in the log: an absolute URL or a CONNECT names the host it wanted.
        let target = &parts.uri;
        let Some(route) = self.routes.iter().find(|r| r.path() == path) else {
            tracing::warn!(
                "telemetry forwarder: refused {method} {target}: not an OTLP export of the CLI's configured telemetry"
            );
            return refusal(
                StatusCode::NOT_FOUND,
                &format!("{method} {path} is not an OTLP export the sandbox forwards"),
            );
        };
        if method != Method::POST || parts.uri.query().is_some() {
            tracing::warn!(
                "telemetry forwarder: refused {method} {target}: not a POST without a query"
            );
            return refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "OTLP exports are POSTs without a query",
            );
        }
        let declared: Option<usize> = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        if declared.is_some_and(|n| n > MAX_EXPORT) {
            tracing::warn!("telemetry forwarder: refused {path}: larger than {MAX_EXPORT} bytes");
            return refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("an export of more than {MAX_EXPORT} bytes is not forwarded"),
            );
        }
        let mut request = Request::new(
            Limited::new(body, MAX_EXPORT)
                .map_err(|e| -> BoxError { e })
                .boxed(),
        );
        *request.method_mut() = Method::POST;
        *request.uri_mut() = route.upstream.clone();
        if route.grpc {
            *request.version_mut() = Version::HTTP_2;
        }
        let headers = request.headers_mut();
        for (name, value) in &parts.headers {
            if FORWARDED_HEADERS.contains(&name.as_str()) {
                headers.append(name.clone(), value.clone());
            }
        }
        for (name, value) in &route.headers {
            headers.insert(name.clone(), value.clone());
        }
        let client = if route.grpc { &self.grpc } else { &self.http };
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, client.request(request)).await;
        match answer {
            Ok(Ok(response)) => self.masked(response),
            Ok(Err(e)) => {
                let origin = route.upstream.authority().map_or("", |a| a.as_str());
                let what = match e.is_connect() {
                    true => format!("cannot connect to the collector {origin}"),
                    false => format!("the export to the collector {origin} failed"),
                };
                let reason = std::iter::once(what)
                    .chain(sources(&e))
                    .collect::<Vec<_>>()
                    .join(": ");
                let reason = self.mask_text(&reason);
                tracing::warn!("telemetry forwarder: {reason}");
                self.failure(route, StatusCode::BAD_GATEWAY, &reason)
            }
            Err(_) => {
                let reason = format!(
                    "the collector did not answer within {} s",
                    ANSWER_TIMEOUT.as_secs()
                );
                tracing::warn!("telemetry forwarder: {reason}");
                self.failure(route, StatusCode::GATEWAY_TIMEOUT, &reason)
            }
        }
    }

    /// A failure as the CLI's exporter reads it: a gRPC status (UNAVAILABLE) for gRPC, an HTTP
    /// status otherwise.
    fn failure(&self, route: &SignalRoute, status: StatusCode, reason: &str) -> Response<Body> {
        if !route.grpc {
            return refusal(status, reason);
        }
        let mut response = Response::new(full(Bytes::new()));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static("14"));
        if let Ok(v) =
            HeaderValue::from_str(&reason.replace(|c: char| !c.is_ascii_graphic() && c != ' ', "_"))
        {
            headers.insert("grpc-message", v);
        }
        response
    }

    fn mask_text(&self, text: &str) -> String {
        String::from_utf8_lossy(&Masker::new(self.masks.clone()).push(text.as_bytes(), true))
            .into_owned()
    }

    /// The collector's answer with the forwarder's header values masked in its headers, body
    /// and trailers (a collector that quotes a rejected credential does not hand it inside).
    fn masked(&self, response: Response<Incoming>) -> Response<Body> {
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let masks = self.masks.clone();
        mask_headers(&mut parts.headers, &masks);
        let masker = Masker::new(masks.clone());
        // State: the body, its masker, and a frame to send after the one being returned.
        let frames =
            futures::stream::unfold(Some((body, masker, None::<Frame<Bytes>>)), move |state| {
                let masks = masks.clone();
                async move {
                    let (mut body, mut masker, next) = state?;
                    if let Some(frame) = next {
                        return Some((Ok(frame), Some((body, masker, None))));
                    }
                    loop {
                        match body.frame().await {
                            Some(Ok(frame)) => match frame.into_data() {
                                Ok(data) => {
                                    let out = masker.push(&data, false);
                                    if !out.is_empty() {
                                        return Some((
                                            Ok(Frame::data(Bytes::from(out))),
                                            Some((body, masker, None)),
                                        ));
                                    }
                                }
                                Err(frame) => {
                                    let Ok(mut trailers) = frame.into_trailers() else {
                                        continue;
                                    };
                                    mask_headers(&mut trailers, &masks);
                                    let tail = masker.push(&[], true);
                                    let trailers = Frame::trailers(trailers);
                                    if tail.is_empty() {
                                        return Some((Ok(trailers), Some((body, masker, None))));
                                    }
                                    return Some((
                                        Ok(Frame::data(Bytes::from(tail))),
                                        Some((body, masker, Some(trailers))),
                                    ));
                                }
                            },
                            Some(Err(e)) => return Some((Err(BoxError::from(e)), None)),
                            None => {
                                let tail = masker.push(&[], true);
                                return (!tail.is_empty())
                                    .then(|| (Ok(Frame::data(Bytes::from(tail))), None));
                            }
                        }
                    }
                }
            });
        Response::from_parts(parts, BodyExt::boxed(StreamBody::new(frames)))
    }
}

/// The forwarder's own answer.
fn refusal(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(full(format!(
        "claude-runtime-adapter telemetry forwarder: {message}\n"
    )));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::tests::env;

    fn route(plan: &TelemetryPlan, signal: Signal) -> &SignalRoute {
        plan.routes.iter().find(|r| r.signal == signal).unwrap()
    }

    #[test]
    fn no_forwarding_unless_telemetry_is_on_and_an_endpoint_is_configured() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert!(TelemetryPlan::of(&env(&[endpoint])).unwrap().is_none());
        assert!(
            TelemetryPlan::of(&env(&[("CLAUDE_CODE_ENABLE_TELEMETRY", "0"), endpoint]))
                .unwrap()
                .is_none()
        );
        assert!(
            TelemetryPlan::of(&env(&[("CLAUDE_CODE_ENABLE_TELEMETRY", "1")]))
                .unwrap()
                .is_none()
        );
        assert!(
            TelemetryPlan::of(&env(&[("CLAUDE_CODE_ENABLE_TELEMETRY", "true"), endpoint]))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn each_signal_goes_to_its_own_endpoint_or_the_generic_one_with_its_path() {
        let plan = TelemetryPlan::of(&env(&[
            ("CLAUDE_CODE_ENABLE_TELEMETRY", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel.example/base/"),
            (
                "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
                "http://logs.example:9000/ingest",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]))
        .unwrap()
        .unwrap();
        let metrics = route(&plan, Signal::Metrics);
        assert!(!metrics.grpc);
        assert_eq!(
            metrics.upstream.to_string(),
            "https://otel.example/base/v1/metrics"
        );
        assert_eq!(metrics.path(), "/v1/metrics");
        assert_eq!(
            route(&plan, Signal::Logs).upstream.to_string(),
            "http://logs.example:9000/ingest"
        );
        let traces = route(&plan, Signal::Traces);
        assert!(traces.grpc);
        assert_eq!(
            traces.upstream.to_string(),
            "https://otel.example/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        let mut collectors = plan.collectors();
        collectors.sort();
        assert_eq!(
            collectors,
            ["http://logs.example:9000", "https://otel.example"]
        );
    }

    #[test]
    fn headers_are_decoded_and_a_signals_own_override_the_generic_ones() {
        let plan = TelemetryPlan::of(&env(&[
            ("CLAUDE_CODE_ENABLE_TELEMETRY", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20generic-token-1, x-team=abc",
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
                "authorization=Bearer%20metrics-token-2",
            ),
        ]))
        .unwrap()
        .unwrap();
        let value = |s: Signal, n: &str| {
            route(&plan, s)
                .headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            value(Signal::Logs, "authorization").unwrap(),
            "Bearer generic-token-1"
        );
        assert_eq!(
            value(Signal::Metrics, "authorization").unwrap(),
            "Bearer metrics-token-2"
        );
        assert_eq!(value(Signal::Metrics, "x-team").unwrap(), "abc");
        // Short values are not masked; the tokens are.
        let secrets = plan.secrets();
        assert!(secrets.contains(&"Bearer metrics-token-2".to_string()));
        assert!(!secrets.contains(&"abc".to_string()));
    }

    #[test]
    fn unusable_settings_are_refused_naming_the_variable_never_its_value() {
        let on = ("CLAUDE_CODE_ENABLE_TELEMETRY", "1");
        for (bad, var) in [
            (
                env(&[
                    on,
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://u:s3cret-pass@h:1"),
                ]),
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                env(&[on, ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://h/s3cret-pass")]),
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                env(&[
                    on,
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:1"),
                    ("OTEL_EXPORTER_OTLP_HEADERS", "s3cret-pass"),
                ]),
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                env(&[
                    on,
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:1"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "s3cret-pass"),
                ]),
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                env(&[
                    on,
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h:1"),
                    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/keys/s3cret-pass.pem"),
                ]),
                "CLIENT_KEY",
            ),
        ] {
            let e = TelemetryPlan::of(&bad).unwrap_err();
            assert_eq!(e.code, crate::error::ErrorCode::InvalidParams);
            assert!(e.message.contains(var), "{}", e.message);
            assert!(!e.message.contains("s3cret"), "{}", e.message);
        }
    }

    #[test]
    fn inside_the_cli_exports_to_the_forwarder_and_holds_no_header_endpoint_or_certificate() {
        let mut inside = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:1/x"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=b"),
            ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "a=b"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem"),
            ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
        ]);
        forwarded_env(&mut inside, "http://127.0.0.1:3130");
        assert_eq!(
            inside,
            env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:3130"),
            ])
        );
    }

    /// A collector on 127.0.0.1 that records each request's head and answers with `answer`.
    #[cfg(unix)]
    async fn collector(
        answer: &'static str,
    ) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (head, _) = crate::server::test_io::read_head(&mut stream).await;
                tx.send(head).unwrap();
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (port, rx)
    }

    /// Sends `request` to the forwarder's socket; returns the whole answer.
    #[cfg(unix)]
    async fn send(socket: &Path, request: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut client = tokio::net::UnixStream::connect(socket).await.unwrap();
        client.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn an_export_goes_to_the_collector_with_its_header_added_and_the_credential_quoted_back_is_masked(
    ) {
        let (port, mut seen) = collector(
            "HTTP/1.1 401 Unauthorized\r\nx-echo: Bearer collector-token-1\r\nContent-Length: 41\r\nConnection: close\r\n\r\nrejected Bearer collector-token-1 (short)",
        )
        .await;
        let plan = TelemetryPlan::of(&env(&[
            ("CLAUDE_CODE_ENABLE_TELEMETRY", "1"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://127.0.0.1:{port}/otlp"),
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20collector-token-1",
            ),
        ]))
        .unwrap()
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("telemetry.sock");
        let _forwarder = TelemetryForwarder::start(&socket, plan).unwrap();
        let answer = send(
            &socket,
            "POST http://elsewhere.example/v1/logs HTTP/1.1\r\nHost: elsewhere.example\r\n\
             Authorization: Bearer agent-own\r\nx-agent: 1\r\nContent-Type: application/x-protobuf\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        let head = seen.recv().await.unwrap();
        assert!(
            head.starts_with("POST /otlp/v1/logs HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains(&format!("host: 127.0.0.1:{port}\r\n")),
            "{head}"
        );
        assert!(
            head.contains("authorization: Bearer collector-token-1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("content-type: application/x-protobuf\r\n"),
            "{head}"
        );
        assert!(
            !head.contains("agent-own") && !head.contains("x-agent"),
            "{head}"
        );
        assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
        assert!(!answer.contains("collector-token-1"), "{answer}");
        assert!(
            answer.contains("rejected ************************ (short)"),
            "{answer}"
        );

        let refused = send(
            &socket,
            "POST /v1/other HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(refused.starts_with("HTTP/1.1 404 "), "{refused}");
        assert!(seen.try_recv().is_err());
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_grpc_export_goes_over_http2_with_its_header_and_the_collectors_trailers_come_back_masked(
    ) {
        use http_body_util::Full;
        // A gRPC collector without TLS: records the request's headers, answers one empty
        // message and its status in trailers, quoting the credential in `grpc-message`.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let tx = tx.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    tx.send((parts.uri.path().to_string(), parts.headers, body))
                        .unwrap();
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", HeaderValue::from_static("16"));
                    trailers.insert(
                        "grpc-message",
                        HeaderValue::from_static("bad token Bearer collector-token-1"),
                    );
                    let frames = futures::stream::iter([
                        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(&[0; 5]))),
                        Ok(Frame::trailers(trailers)),
                    ]);
                    let mut response = Response::new(StreamBody::new(frames));
                    response
                        .headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let plan = TelemetryPlan::of(&env(&[
            ("CLAUDE_CODE_ENABLE_TELEMETRY", "1"),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                &format!("http://127.0.0.1:{port}"),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20collector-token-1",
            ),
        ]))
        .unwrap()
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("telemetry.sock");
        let _forwarder = TelemetryForwarder::start(&socket, plan).unwrap();
        // The CLI's side: HTTP/2 without TLS (prior knowledge) on the socket.
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let (mut client, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let path = Signal::Metrics.grpc_path();
        let request = Request::post(format!("http://127.0.0.1:3130{path}"))
            .header(CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header("authorization", "Bearer agent-own")
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1])))
            .unwrap();
        let response = client.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let answer = response.into_body().collect().await.unwrap();
        let trailers = answer
            .trailers()
            .cloned()
            .expect("the collector's trailers");
        assert_eq!(answer.to_bytes().as_ref(), &[0; 5]);
        assert_eq!(trailers.get("grpc-status").unwrap(), "16");
        let message = trailers.get("grpc-message").unwrap().to_str().unwrap();
        assert!(!message.contains("collector-token-1"), "{message}");
        assert!(message.starts_with("bad token ****"), "{message}");

        let (upstream_path, headers, body) = seen.recv().await.unwrap();
        assert_eq!(upstream_path, path);
        assert_eq!(
            headers.get("authorization").unwrap(),
            "Bearer collector-token-1"
        );
        assert_eq!(headers.get("te").unwrap(), "trailers");
        assert_eq!(body.as_ref(), &[0, 0, 0, 0, 2, 8, 1]);
    }

    #[test]
    fn percent_escapes_decode_and_malformed_ones_stay() {
        assert_eq!(percent_decode("Bearer%20x%2Cy"), b"Bearer x,y");
        assert_eq!(percent_decode("100%"), b"100%");
        assert_eq!(percent_decode("%zz%4"), b"%zz%4");
    }
}
