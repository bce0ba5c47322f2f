//! A model request as the session's trace and the fleet's metrics see it ([`crate::otel`]): a
//! span from the request's arrival to the end of its answer (model, status, tokens, cost, the
//! relay's retries), and the GenAI request metrics.

use std::time::Instant;

use http::Response;
use tracing::field::Empty;
use tracing::Span;

use crate::otel::{self, metrics, SPANS};
use crate::sandbox::server::Body;
use crate::spend::Usage;

/// One request's exchange with the model API, until its answer has been read.
pub(super) struct Exchange {
    /// `Span::none()` while traces are not exported.
    pub span: Span,
    started: Instant,
}

impl Exchange {
    pub(super) fn begin(session: Option<&Span>) -> Exchange {
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
    }
}
