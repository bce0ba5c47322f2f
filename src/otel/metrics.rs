//! The fleet's metrics, on OpenTelemetry instruments (names and attributes: docs/telemetry.md).
//! Each function is a no-op until [`install`] (nothing exported, nothing recorded).

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;

use crate::spend::Usage;

struct Instruments {
    started: Counter<u64>,
    ended: Counter<u64>,
    errors: Counter<u64>,
    to_handle: Histogram<f64>,
    to_result: Histogram<f64>,
    token_usage: Histogram<u64>,
    operation: Histogram<f64>,
    tokens: Counter<u64>,
    cost: Counter<f64>,
    denials: Counter<u64>,
}

static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// Seconds, from 10 ms to an hour: starts, model answers and whole sessions alike.
const SECONDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// The GenAI conventions' advice for token counts.
const TOKENS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

pub(super) fn install(provider: &SdkMeterProvider) {
    let m = provider.meter(super::SCOPE);
    let seconds = |name: &'static str, what: &'static str| {
        m.f64_histogram(name)
            .with_unit("s")
            .with_description(what)
            .with_boundaries(SECONDS.to_vec())
            .build()
    };
    let _ = INSTRUMENTS.set(Instruments {
        started: m
            .u64_counter("cra.sessions.started")
            .with_unit("{session}")
            .with_description("Sessions started (startAgent accepted), by role")
            .build(),
        ended: m
            .u64_counter("cra.sessions.ended")
            .with_unit("{session}")
            .with_description("Sessions whose result settled, by role and outcome")
            .build(),
        errors: m
            .u64_counter("cra.errors")
            .with_unit("{error}")
            .with_description("Sessions that ended in an error, by role and error code")
            .build(),
        to_handle: seconds(
            "cra.session.start.duration",
            "startAgent to the handle (provisioning, context, the CLI's start)",
        ),
        to_result: seconds(
            "cra.session.duration",
            "startAgent to the settled result, by role and outcome",
        ),
        token_usage: m
            .u64_histogram("gen_ai.client.token.usage")
            .with_unit("{token}")
            .with_description("Tokens per model request, by model and token type")
            .with_boundaries(TOKENS.to_vec())
            .build(),
        operation: seconds(
            "gen_ai.client.operation.duration",
            "Model request latency at the relay, to the answer's end",
        ),
        tokens: m
            .u64_counter("cra.model.tokens")
            .with_unit("{token}")
            .with_description(
                "Tokens used, by model and type (input, output, cache_read, cache_creation)",
            )
            .build(),
        cost: m
            .f64_counter("cra.model.cost")
            .with_unit("USD")
            .with_description("Model spend at list prices (the budget's price table), by model")
            .build(),
        denials: m
            .u64_counter("cra.sandbox.denials")
            .with_unit("{denial}")
            .with_description("What the sandbox refused an agent: network, command, write, read")
            .build(),
    });
}

fn role(role: &str) -> KeyValue {
    KeyValue::new("cra.role", role.to_string())
}

pub fn session_started(r: &str) {
    if let Some(i) = INSTRUMENTS.get() {
        i.started.add(1, &[role(r)]);
    }
}

/// The handle was returned `elapsed` after startAgent.
pub fn session_handed(r: &str, elapsed: Duration) {
    if let Some(i) = INSTRUMENTS.get() {
        i.to_handle.record(elapsed.as_secs_f64(), &[role(r)]);
    }
}

/// The session's result settled `elapsed` after startAgent; `error`: its code.
pub fn session_ended(r: &str, error: Option<&str>, elapsed: Duration) {
    if let Some(i) = INSTRUMENTS.get() {
        let outcome = KeyValue::new(
            "cra.outcome",
            if error.is_some() { "error" } else { "success" },
        );
        let mut attrs = vec![role(r), outcome];
        if let Some(code) = error {
            attrs.push(KeyValue::new("error.type", code.to_string()));
            i.errors
                .add(1, &[role(r), KeyValue::new("error.type", code.to_string())]);
        }
        i.ended.add(1, &attrs);
        i.to_result.record(elapsed.as_secs_f64(), &attrs);
    }
}

/// A start refused before it became a session (its params, a duplicate id): `code`.
pub fn refused(r: &str, code: &str) {
    if let Some(i) = INSTRUMENTS.get() {
        i.errors
            .add(1, &[role(r), KeyValue::new("error.type", code.to_string())]);
    }
}

/// One model answer the relay counted: `cost` in USD.
pub fn model_answer(model: Option<&str>, usage: &Usage, cost: f64) {
    if let Some(i) = INSTRUMENTS.get() {
        let model = KeyValue::new(
            "gen_ai.response.model",
            model.unwrap_or("unknown").to_string(),
        );
        let common = [
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", "anthropic"),
            model.clone(),
        ];
        for (kind, n) in [("input", usage.input), ("output", usage.output)] {
            let mut attrs = common.to_vec();
            attrs.push(KeyValue::new("gen_ai.token.type", kind));
            i.token_usage.record(n, &attrs);
        }
        for (kind, n) in [
            ("input", usage.input),
            ("output", usage.output),
            ("cache_read", usage.cache_read),
            ("cache_creation", usage.cache_creation),
        ] {
            i.tokens.add(
                n,
                &[model.clone(), KeyValue::new("gen_ai.token.type", kind)],
            );
        }
        i.cost.add(cost, &[model]);
    }
}

/// One model request's latency, to the end of its answer; `error`: its failure's kind.
pub fn model_request(elapsed: Duration, model: Option<&str>, error: Option<&str>) {
    if let Some(i) = INSTRUMENTS.get() {
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", "anthropic"),
        ];
        if let Some(m) = model {
            attrs.push(KeyValue::new("gen_ai.response.model", m.to_string()));
        }
        if let Some(e) = error {
            attrs.push(KeyValue::new("error.type", e.to_string()));
        }
        i.operation.record(elapsed.as_secs_f64(), &attrs);
    }
}

/// The sandbox refused the agent something: `kind` is network, command, write or read.
pub fn denial(r: &str, kind: &'static str) {
    if let Some(i) = INSTRUMENTS.get() {
        i.denials
            .add(1, &[role(r), KeyValue::new("cra.denial.kind", kind)]);
    }
}
