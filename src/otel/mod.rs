//! The adapter's own OpenTelemetry: a trace per session and the fleet's metrics, exported over
//! OTLP to the collector the engine's process names with the standard `OTEL_*` variables.
//!
//! **Configured once per process**, by the first `createClaudeAdapter` that finds an OTLP
//! endpoint in the environment ([`configure_from_env`]); later adapters export through the same
//! pipeline (a process has one set of `OTEL_*` variables). Nothing set: no exporter, no thread,
//! no span recorded (the spans below are not even created, [`tracing_on`]).
//!
//! **Traces** come through the `tracing` bridge (`tracing-opentelemetry`): the lifecycle's step
//! spans, the relay's model requests and the protocol's tool calls are `tracing` spans of the
//! target [`SPANS`], and this crate's own events inside them become their span events. A
//! session's span is a root (or the child of the engine's `traceparent`), so one session is
//! one trace. Spans of other targets (the dependencies') and the adapter's log-routing span
//! are never exported. The bridge is installed in the subscriber [`crate::logging`] installs;
//! a Rust host that installed its own global subscriber first gets no traces (metrics still).
//!
//! **Metrics** ([`metrics`]) are recorded on OpenTelemetry instruments directly; where the
//! OpenTelemetry GenAI semantic conventions name one, it is used.
//!
//! `shutdown()` flushes what is pending ([`flush`]); the pipeline itself lives as long as the
//! process (another adapter may still be exporting).

mod client;
pub mod metrics;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::Context as OtelContext;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::span::{Attributes, Id, Record};
use tracing::Event;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::Registry;

/// The `tracing` target of every span that is exported.
pub const SPANS: &str = "claude_runtime_adapter::trace";
/// Events of this crate (their targets are its module paths) become span events.
const OWN_EVENTS: &str = "claude_runtime_adapter";
/// The instrumentation scope's name.
const SCOPE: &str = "claude-runtime-adapter";
/// How long `shutdown()` waits for the pending exports at most.
pub const FLUSH_BOUND: Duration = Duration::from_secs(15);

struct Pipeline {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

static PIPELINE: OnceLock<Pipeline> = OnceLock::new();
static LAYER: OnceLock<OpenTelemetryLayer<Registry, SdkTracer>> = OnceLock::new();
static TRACING: AtomicBool = AtomicBool::new(false);
/// Serialises the first configuration (two adapters created at once build one pipeline).
static CONFIGURING: Mutex<()> = Mutex::new(());

/// Whether session traces are exported: callers skip creating spans otherwise.
pub fn tracing_on() -> bool {
    TRACING.load(Ordering::Relaxed)
}

/// A signal of the OTLP exporter: its name in the `OTEL_*` variables.
#[derive(Clone, Copy)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
        }
    }
}

/// Where the `OTEL_*` variables are read: the process's environment ([`process_var`]), or in
/// the tests a table of their own (so that no test changes the environment of the process,
/// which other tests running meanwhile read).
type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A variable of the process's environment.
fn process_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A variable of `vars`; a blank value is as good as none.
fn var_in(vars: Vars, name: &str) -> Option<String> {
    vars(name).filter(|v| !v.trim().is_empty())
}

/// A variable of the process's environment; a blank value is as good as none.
fn env(name: &str) -> Option<String> {
    var_in(&process_var, name)
}

/// Whether `signal` is to be exported, by the standard variables in `vars`: `OTEL_SDK_DISABLED=true` or
/// `OTEL_<SIGNAL>_EXPORTER=none` turn it off; `=otlp` or an OTLP endpoint (the general one or
/// the signal's) turn it on. Unlike an application's SDK, nothing is exported when nothing is
/// set: a library does not send data to localhost:4318 unasked. `Err`: what is not supported.
fn wanted(signal: Signal, vars: Vars) -> Result<bool, String> {
    let env = |name: &str| var_in(vars, name);
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let exporter_var = format!("OTEL_{}_EXPORTER", signal.name());
    let endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|| env(&format!("OTEL_EXPORTER_OTLP_{}_ENDPOINT", signal.name())));
    let on = match env(&exporter_var).map(|v| v.trim().to_ascii_lowercase()) {
        None => endpoint.is_some(),
        Some(v) if v == "none" => false,
        Some(v) if v.split(',').any(|e| e.trim() == "otlp") => true,
        Some(v) => {
            return Err(format!(
                "{exporter_var}={v:?}: the adapter exports OTLP only"
            ))
        }
    };
    if !on {
        return Ok(false);
    }
    protocol(signal, vars).map(|_| true)
}

/// The OTLP protocol of `signal` in `vars`: the signal's variable, else the general one, else
/// http/protobuf (the OTLP default; set here, as the crate's default follows its features).
fn protocol(signal: Signal, vars: Vars) -> Result<Protocol, String> {
    let env = |name: &str| var_in(vars, name);
    let signal_var = format!("OTEL_EXPORTER_OTLP_{}_PROTOCOL", signal.name());
    let (var, value) = match env(&signal_var) {
        Some(v) => (signal_var, v),
        None => match env("OTEL_EXPORTER_OTLP_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_PROTOCOL".to_string(), v),
            None => return Ok(Protocol::HttpBinary),
        },
    };
    match value.trim() {
        "http/protobuf" => Ok(Protocol::HttpBinary),
        "http/json" => Ok(Protocol::HttpJson),
        other => Err(format!(
            "{var}={other:?}: the adapter's own telemetry is exported over OTLP/HTTP \
             (http/protobuf or http/json); point it at the collector's HTTP port (4318)"
        )),
    }
}

/// The export timeout of `signal` in the standard variables (milliseconds), else 10 s.
fn export_timeout(signal: Signal) -> Duration {
    env(&format!("OTEL_EXPORTER_OTLP_{}_TIMEOUT", signal.name()))
        .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| (1..=600_000).contains(ms))
        .map(Duration::from_millis)
        .unwrap_or(Duration::from_secs(10))
}

/// The resource: what the SDK reads of `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
/// with the service named `claude-runtime-adapter` when neither names it.
fn resource() -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SCOPE).build()
    }
}

/// What [`configure_from_env`] did, for the engine's log.
#[derive(Debug, PartialEq)]
pub enum Configured {
    /// No `OTEL_*` variable asks for an export (or this process already decided).
    Nothing,
    /// Exporting: which signals.
    Exporting { traces: bool, metrics: bool },
    /// A variable the adapter cannot honour; that signal is not exported.
    Refused(String),
}

/// Reads the `OTEL_*` variables of the engine's process and starts exporting what they ask
/// for, once per process: the first call that finds something to export builds the pipeline,
/// every later call returns [`Configured::Nothing`].
pub fn configure_from_env() -> Configured {
    let _first = CONFIGURING.lock().unwrap_or_else(|e| e.into_inner());
    if PIPELINE.get().is_some() {
        return Configured::Nothing;
    }
    let mut refused = Vec::new();
    let mut want = |s: Signal| match wanted(s, &process_var) {
        Ok(on) => on,
        Err(why) => {
            refused.push(why);
            false
        }
    };
    let (traces, metrics) = (want(Signal::Traces), want(Signal::Metrics));
    if !traces && !metrics {
        return match refused.is_empty() {
            true => Configured::Nothing,
            false => Configured::Refused(refused.join("; ")),
        };
    }
    let resource = resource();
    let tracer = traces
        .then(|| span_exporter().map(|e| (e, resource.clone())))
        .and_then(|r| r.map_err(|e| refused.push(format!("traces: {e}"))).ok())
        .map(|(exporter, resource)| {
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build()
        });
    let meter = metrics
        .then(metric_exporter)
        .and_then(|r| r.map_err(|e| refused.push(format!("metrics: {e}"))).ok())
        .map(|exporter| {
            SdkMeterProvider::builder()
                .with_periodic_exporter(exporter)
                .with_resource(resource)
                .build()
        });
    if let Some(provider) = &tracer {
        let tracer = provider.tracer(SCOPE);
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false);
        let _ = LAYER.set(layer);
        TRACING.store(true, Ordering::Relaxed);
    }
    if let Some(provider) = &meter {
        metrics::install(provider);
    }
    let configured = Configured::Exporting {
        traces: tracer.is_some(),
        metrics: meter.is_some(),
    };
    let _ = PIPELINE.set(Pipeline { tracer, meter });
    match refused.is_empty() {
        true => configured,
        false => Configured::Refused(refused.join("; ")),
    }
}

fn span_exporter() -> Result<opentelemetry_otlp::SpanExporter, String> {
    let builder = opentelemetry_otlp::SpanExporter::builder().with_http();
    over_http(builder, Signal::Traces)?
        .build()
        .map_err(|e| e.to_string())
}

fn metric_exporter() -> Result<opentelemetry_otlp::MetricExporter, String> {
    let builder = opentelemetry_otlp::MetricExporter::builder().with_http();
    over_http(builder, Signal::Metrics)?
        .build()
        .map_err(|e| e.to_string())
}

/// An OTLP/HTTP exporter of `signal` through the adapter's client, with its protocol and
/// timeout from the standard variables.
fn over_http<B: WithHttpConfig + WithExportConfig>(
    builder: B,
    signal: Signal,
) -> Result<B, String> {
    let timeout = export_timeout(signal);
    let client = client::ExportClient::new(timeout).map_err(|e| e.message)?;
    Ok(builder
        .with_http_client(client)
        .with_protocol(protocol(signal, &process_var)?)
        .with_timeout(timeout))
}

/// Exports what is pending (spans of ended sessions, the metrics so far); blocking, bounded by
/// the exporters' timeouts. Nothing to do when nothing is exported.
pub fn flush() {
    let Some(pipeline) = PIPELINE.get() else {
        return;
    };
    if let Some(t) = &pipeline.tracer {
        if let Err(e) = t.force_flush() {
            tracing::warn!("OpenTelemetry: flushing the traces failed: {e}");
        }
    }
    if let Some(m) = &pipeline.meter {
        if let Err(e) = m.force_flush() {
            tracing::warn!("OpenTelemetry: flushing the metrics failed: {e}");
        }
    }
}

/// A W3C `traceparent` header value (`00-<32 hex>-<16 hex>-<2 hex>`), checked: lowercase hex,
/// neither id all zeros, version not `ff`. Later versions may append fields (`-…`); only
/// version 00 must be exactly four.
pub fn parse_traceparent(value: &str) -> Result<SpanContext, String> {
    let bad = |why: &str| {
        format!("params.traceparent must be a W3C traceparent (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>): {why}")
    };
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let parts: Vec<&str> = value.trim().split('-').collect();
    if parts.len() < 4 {
        return Err(bad("it has fewer than four fields"));
    }
    let (version, trace, parent, flags) = (parts[0], parts[1], parts[2], parts[3]);
    if !hex(version, 2) || version == "ff" {
        return Err(bad("the version is not two lowercase hex digits below ff"));
    }
    if version == "00" && parts.len() != 4 {
        return Err(bad("version 00 has exactly four fields"));
    }
    if !hex(trace, 32) || trace.bytes().all(|b| b == b'0') {
        return Err(bad(
            "the trace id is not 32 lowercase hex digits, not all zero",
        ));
    }
    if !hex(parent, 16) || parent.bytes().all(|b| b == b'0') {
        return Err(bad(
            "the parent id is not 16 lowercase hex digits, not all zero",
        ));
    }
    if !hex(flags, 2) {
        return Err(bad("the flags are not two lowercase hex digits"));
    }
    let (Ok(trace), Ok(parent), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(parent),
        u8::from_str_radix(flags, 16),
    ) else {
        return Err(bad("unreadable"));
    };
    Ok(SpanContext::new(
        trace,
        parent,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// Makes `span` (a session's, just created) the child of the engine's span `parent`, so the
/// engine's dispatch and the session are one trace.
pub fn set_remote_parent(span: &tracing::Span, parent: SpanContext) {
    if tracing_on() {
        let _ = span.set_parent(OtelContext::new().with_remote_span_context(parent));
    }
}

/// The open spans of a session's tool calls, by `tool_use` id: one span from the model's call
/// to its result, carrying the tool's name and what the adapter's hooks decided.
#[derive(Default)]
pub struct ToolSpans {
    open: Mutex<HashMap<String, tracing::Span>>,
}

/// More open calls than this are not followed (a CLI that never answers its calls must not
/// grow the map without bound).
const MAX_OPEN_TOOLS: usize = 1024;

impl ToolSpans {
    /// The model called `name` (id `id`) inside `parent`.
    pub fn called(&self, parent: &tracing::Span, id: &str, name: &str) {
        if !tracing_on() {
            return;
        }
        let span = tracing::info_span!(
            target: SPANS,
            parent: parent,
            "execute_tool",
            otel.name = format!("execute_tool {name}"),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = name,
            gen_ai.tool.call.id = id,
            cra.tool.decision = tracing::field::Empty,
            cra.tool.reason = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() < MAX_OPEN_TOOLS {
            open.insert(id.to_string(), span);
        }
    }

    /// The adapter's hook decided on call `id`: `blocked` with its reason, or allowed.
    pub fn decided(&self, id: &str, blocked: Option<&str>) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(span) = open.get(id) {
            span.record(
                "cra.tool.decision",
                if blocked.is_some() {
                    "blocked"
                } else {
                    "allowed"
                },
            );
            if let Some(reason) = blocked {
                span.record("cra.tool.reason", reason);
            }
        }
    }

    /// Call `id` returned to the model: its span ends.
    pub fn returned(&self, id: &str, is_error: bool) {
        let span = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let (Some(span), true) = (span, is_error) {
            span.record("error.type", "tool_error");
            span.record("otel.status_code", "ERROR");
        }
    }
}

/// The bridge between `tracing` and the exporter: forwards this crate's exported spans
/// ([`SPANS`]) and its events to `tracing-opentelemetry`'s layer once exporting is configured;
/// a no-op until then. The layer is built after the subscriber is installed (the first adapter
/// may come before the variables are set), hence the indirection.
pub struct Bridge;

fn layer() -> Option<&'static OpenTelemetryLayer<Registry, SdkTracer>> {
    LAYER.get()
}

impl Layer<Registry> for Bridge {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, Registry>) {
        if let Some(l) = layer().filter(|_| attrs.metadata().target() == SPANS) {
            l.on_new_span(attrs, id, ctx)
        }
    }

    // The rest act only on spans the layer saw created (it keeps its data in their
    // extensions), so every span may pass.
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, Registry>) {
        if let Some(l) = layer() {
            l.on_record(id, values, ctx)
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, Registry>) {
        if let Some(l) = layer() {
            l.on_follows_from(id, follows, ctx)
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, Registry>) {
        if let Some(l) = layer().filter(|_| event.metadata().target().starts_with(OWN_EVENTS)) {
            l.on_event(event, ctx)
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, Registry>) {
        if let Some(l) = layer() {
            l.on_enter(id, ctx)
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, Registry>) {
        if let Some(l) = layer() {
            l.on_exit(id, ctx)
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, Registry>) {
        if let Some(l) = layer() {
            l.on_close(id, ctx)
        }
    }

    // `set_parent` finds the layer's context accessor through the subscriber's downcast.
    unsafe fn downcast_raw(&self, id: TypeId) -> Option<*const ()> {
        if id == TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: the layer lives in a static, so what it hands out lives as long.
        layer().and_then(|l| unsafe { l.downcast_raw(id) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_w3c_traceparent_is_read_and_malformed_ones_are_refused_naming_why() {
        let ok =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(
            ok.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap()
        );
        assert_eq!(ok.span_id(), SpanId::from_hex("00f067aa0ba902b7").unwrap());
        assert!(ok.is_sampled() && ok.is_remote());
        assert!(
            !parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .unwrap()
                .is_sampled()
        );
        for (bad, why) in [
            ("", "fewer than four"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "fewer than four",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "trace id",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "trace id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "parent id",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "flags",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "exactly four",
            ),
        ] {
            let e = parse_traceparent(bad).unwrap_err();
            assert!(
                e.contains("params.traceparent") && e.contains(why),
                "{bad}: {e}"
            );
        }
        // A later version may carry more fields.
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_ok()
        );
    }

    #[test]
    fn nothing_is_exported_unless_an_endpoint_or_the_exporter_asks_and_grpc_is_refused_by_name() {
        // Each case is a table of its own, read through the lookup `wanted` is given: the
        // process's environment is neither read nor changed (other tests read it meanwhile).
        let wanted_with = |pairs: &[(&str, &str)], signal: Signal| {
            let table: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            wanted(signal, &|name: &str| table.get(name).cloned())
        };
        let both = |pairs: &[(&str, &str)]| {
            (
                wanted_with(pairs, Signal::Traces),
                wanted_with(pairs, Signal::Metrics),
            )
        };
        assert_eq!(both(&[]), (Ok(false), Ok(false)));
        assert_eq!(
            both(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4318/v1/traces",
            )]),
            (Ok(true), Ok(false))
        );
        assert_eq!(
            both(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_METRICS_EXPORTER", "none"),
            ]),
            (Ok(true), Ok(false))
        );
        assert_eq!(
            wanted_with(
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "true"),
                ],
                Signal::Traces
            ),
            Ok(false)
        );
        // A blank value is as good as none.
        assert_eq!(
            wanted_with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")], Signal::Traces),
            Ok(false)
        );
        assert_eq!(
            wanted_with(&[("OTEL_TRACES_EXPORTER", "otlp")], Signal::Traces),
            Ok(true)
        );
        assert!(
            wanted_with(&[("OTEL_TRACES_EXPORTER", "zipkin")], Signal::Traces)
                .unwrap_err()
                .contains("OTEL_TRACES_EXPORTER")
        );
        let e = wanted_with(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            Signal::Metrics,
        )
        .unwrap_err();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("4318"),
            "{e}"
        );
        assert_eq!(
            wanted_with(
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ],
                Signal::Metrics
            ),
            Ok(true)
        );
    }
}
