//! A model request as the session's trace and the fleet's metrics see it ([`crate::otel`]): a
//! span from the request's arrival to the end of its answer (model, status, tokens, cost, the
//! relay's retries), and the GenAI request metrics; and, with `config.audit`, the request and
//! its answer in the session's audit record (digests of the bodies, the model, the usage).

use std::sync::Arc;
use std::time::Instant;

use http::Response;
use tracing::field::Empty;
use tracing::Span;

use crate::audit::{sha256_hex, AuditRecord, Digest};
use crate::otel::{self, metrics, SPANS};
use crate::server::Body;
use crate::spend::Usage;

/// One request's exchange with the model API, until its answer has been read.
pub(super) struct Exchange {
    /// `Span::none()` while traces are not exported.
    pub span: Span,
    started: Instant,
    audit: Option<Audited>,
}

/// What the audit record is told of the answer: its bytes and their digest, as they pass.
struct Audited {
    record: Arc<AuditRecord>,
    answer: Digest,
    bytes: u64,
}

impl Exchange {
    pub(super) fn begin(session: Option<&Span>, audit: Option<&Arc<AuditRecord>>) -> Exchange {
        let span = match session {
            Some(parent) if otel::tracing_on() => tracing::info_span!(
                target: SPANS,
                parent: parent,
                "chat",
                otel.kind = "client",
                otel.name = Empty,
                otel.status_code = Empty,
                gen_ai.operation.name = "chat",
                gen_ai.provider.name = "anthropic",
                gen_ai.response.model = Empty,
                gen_ai.usage.input_tokens = Empty,
                gen_ai.usage.output_tokens = Empty,
                gen_ai.usage.cache_read.input_tokens = Empty,
                gen_ai.usage.cache_creation.input_tokens = Empty,
                http.response.status_code = Empty,
                error.type = Empty,
                cra.retries = Empty,
                cra.cost.usd = Empty,
            ),
            _ => Span::none(),
        };
        Exchange {
            span,
            started: Instant::now(),
            audit: audit.map(|record| Audited {
                record: record.clone(),
                answer: Digest::default(),
                bytes: 0,
            }),
        }
    }

    /// The request as it is sent (once, however often the relay sends it again).
    pub(super) fn requested(&self, method: &str, path: &str, body: &[u8], model: Option<&str>) {
        let Some(a) = &self.audit else { return };
        a.record.append(
            "model_request",
            serde_json::json!({ "method": method, "path": path, "model": model, "bytes": body.len(), "sha256": sha256_hex(body) }),
        );
    }

    /// Bytes of the answer, as they pass to the CLI.
    pub(super) fn saw(&mut self, bytes: &[u8]) {
        if let Some(a) = &mut self.audit {
            a.answer.update(bytes);
            a.bytes += bytes.len() as u64;
        }
    }

    /// An answer that is no success (the API's error, or the relay's refusal): it ends here.
    pub(super) fn failed(self, response: Response<Body>) -> Response<Body> {
        let status = response.status().as_u16();
        let kind = status.to_string();
        self.span
            .record("http.response.status_code", i64::from(status));
        self.span.record("error.type", kind.as_str());
        self.span.record("otel.status_code", "ERROR");
        metrics::model_request(self.started.elapsed(), None, Some(&kind));
        if let Some(a) = self.audit {
            a.record.append(
                "model_answer",
                serde_json::json!({ "status": status, "error": true }),
            );
        }
        response
    }

    /// A successful answer has been read (or its reader went away): `usage` is what it used
    /// and its cost, when the relay found it.
    pub(super) fn answered(self, model: Option<&str>, usage: Option<(&Usage, f64)>) {
        let span = &self.span;
        span.record("http.response.status_code", 200i64);
        if let Some(model) = model {
            span.record("gen_ai.response.model", model);
            span.record("otel.name", format!("chat {model}").as_str());
        }
        if let Some((u, cost)) = usage {
            // As i64: the bridge exports a u64 as a string.
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            span.record("gen_ai.usage.input_tokens", n(u.input));
            span.record("gen_ai.usage.output_tokens", n(u.output));
            span.record("gen_ai.usage.cache_read.input_tokens", n(u.cache_read));
            span.record(
                "gen_ai.usage.cache_creation.input_tokens",
                n(u.cache_creation),
            );
            span.record("cra.cost.usd", cost);
            metrics::model_answer(model, u, cost);
        }
        metrics::model_request(self.started.elapsed(), model, None);
        if let Some(a) = self.audit {
            let usage = usage.map(|(u, cost)| {
                serde_json::json!({
                    "input": u.input, "output": u.output, "cacheRead": u.cache_read,
                    "cacheCreation": u.cache_creation, "costUsd": cost,
                })
            });
            // Bytes and digest only where the answer was read through (a metered session).
            let read = a.bytes > 0;
            let (bytes, digest) = (read.then_some(a.bytes), read.then(|| a.answer.finish()));
            a.record.append(
                "model_answer",
                serde_json::json!({ "status": 200, "model": model, "usage": usage, "bytes": bytes, "sha256": digest }),
            );
        }
    }
}
