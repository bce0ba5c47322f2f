//! Diagnostics of the core modules (git retries, rollbacks, …) are `tracing` events; this layer
//! delivers each one to the `config.logger` of the adapter whose work emitted it. Every adapter
//! registers its logger and runs its work inside a span carrying its id; an event finds its
//! adapter by walking up its span scope. Events outside any adapter's work have no owner and are
//! dropped (a Rust host can still install its own subscriber before the first adapter exists).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once, RwLock};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::deps::{LogLevel, Logger};

static LOGGERS: RwLock<Option<HashMap<u64, Arc<dyn Logger>>>> = RwLock::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static INSTALL: Once = Once::new();

/// An adapter's registration; unregisters its logger when dropped.
pub struct LogRoute {
    id: u64,
    span: tracing::Span,
}

impl LogRoute {
    pub fn register(logger: Arc<dyn Logger>) -> LogRoute {
        INSTALL.call_once(|| {
            // Fails only if the host installed a global subscriber first; then that one wins.
            let _ = tracing::subscriber::set_global_default(
                tracing_subscriber::registry()
                    .with(crate::otel::Bridge)
                    .with(ToEngineLogger),
            );
        });
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LOGGERS
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(id, logger);
        let span = tracing::info_span!("claude_runtime_adapter", adapter_id = id);
        LogRoute { id, span }
    }

    /// The span that routes events to this adapter's logger: instrument its work with it.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }
}

impl Drop for LogRoute {
    fn drop(&mut self) {
        if let Some(map) = LOGGERS.write().unwrap_or_else(|e| e.into_inner()).as_mut() {
            map.remove(&self.id);
        }
    }
}

struct AdapterId(u64);

struct ToEngineLogger;

#[derive(Default)]
struct Fields {
    message: String,
    data: Map<String, Value>,
    adapter_id: Option<u64>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "adapter_id" {
            self.adapter_id = Some(value);
        }
        self.data.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.data.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.data.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_text(field, value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_text(field, format!("{value:?}"));
    }
}

impl Fields {
    fn record_text(&mut self, field: &Field, text: String) {
        if field.name() == "message" {
            self.message = text;
        } else {
            self.data.insert(field.name().into(), Value::String(text));
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ToEngineLogger {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(adapter), Some(span)) = (fields.adapter_id, ctx.span(id)) {
            span.extensions_mut().insert(AdapterId(adapter));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(adapter) = scope
            .from_root()
            .find_map(|s| s.extensions().get::<AdapterId>().map(|a| a.0))
        else {
            return;
        };
        let logger = LOGGERS
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|m| m.get(&adapter).cloned());
        let Some(logger) = logger else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = match *event.metadata().level() {
            Level::ERROR => LogLevel::Error,
            Level::WARN => LogLevel::Warn,
            Level::INFO => LogLevel::Info,
            _ => LogLevel::Debug,
        };
        logger.log(level, &fields.message, Value::Object(fields.data));
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time in epoch milliseconds.
pub fn iso8601(ms: u128) -> String {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm): no date crate needed for a timestamp.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tracing::Instrument;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(LogLevel, String, Value)>>);

    impl Logger for Recorder {
        fn log(&self, level: LogLevel, message: &str, data: Value) {
            self.0
                .lock()
                .unwrap()
                .push((level, message.to_string(), data));
        }
    }

    #[tokio::test]
    async fn events_inside_an_adapters_span_reach_only_its_logger() {
        let a = Arc::new(Recorder::default());
        let b = Arc::new(Recorder::default());
        let route_a = LogRoute::register(a.clone());
        let route_b = LogRoute::register(b.clone());
        async { tracing::warn!(path = "/x", "rollback failed") }
            .instrument(route_a.span())
            .await;
        tracing::warn!("nobody's event");
        let got = a.0.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, LogLevel::Warn);
        assert_eq!(got[0].1, "rollback failed");
        assert_eq!(got[0].2["path"], "/x");
        assert!(b.0.lock().unwrap().is_empty());
        drop(route_b);
    }
}
