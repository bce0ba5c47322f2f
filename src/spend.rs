//! A session's model spend: what the relay counted of every response's `usage` (the main loop,
//! subagents and the CLI's side requests alike: they all pass the session's one relay), priced
//! by [`prices`], against the session's `maxBudgetUsd`.
//!
//! All of the budget is here: the meter and its reservations (this file), the price table and
//! its overrides ([`prices`]), and the reading of a response's usage ([`usage`]). Two callers
//! only plumb it: the config reads `maxBudgetUsd` and `modelPrices` into these types with its
//! own field checks (`config/budget.rs`), and the model gateway passes each response through
//! the reader and refuses requests the meter has no room for (`gateway/metering.rs`).
//!
//! One [`SpendMeter`] per session, shared (`Arc`) by the relay, which records each response
//! and refuses requests once the budget is spent, and the lifecycle, which stops the session
//! when the budget is crossed ([`SpendMeter::crossed`]) and reads the totals for the stats.
//!
//! **A bound, under concurrency too.** A request's cost is known only once it is answered, so
//! before it is sent the relay reserves its worst case ([`SpendMeter::worst_case`]: its input
//! counted high, its `max_tokens` at the output price) and the reservation is settled when its
//! answer is counted ([`Hold`]). A request is sent only while the spend, the reservations of the
//! requests in flight and its own worst case fit the budget; one that does not fit waits for
//! those in flight to settle (parallel subagents), and is refused once nothing is in flight
//! and it still does not fit — the budget is then spent, and the session ends `ERR_BUDGET`
//! without passing it.

pub mod prices;
pub mod usage;

use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use prices::{ModelPrice, Prices};
pub use usage::{Usage, UsageReader};

/// The largest `maxBudgetUsd` taken (config and params): far above any session's spend, and a
/// number every check and message handles exactly.
pub const MAX_BUDGET_USD: f64 = 1_000_000.0;

/// The spend part of `SessionStats` (`stats.spend`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpendStats {
    /// USD counted so far.
    pub usd: f64,
    /// Model responses counted (those that reported usage).
    pub requests: u64,
    /// Requests refused because the budget was spent.
    pub refused: u64,
    /// The session's `maxBudgetUsd` (`None`: no budget).
    pub budget_usd: Option<f64>,
}

#[derive(Debug, Default)]
struct Totals {
    usd: f64,
    requests: u64,
    refused: u64,
    /// The worst cases reserved by the requests in flight, and how many they are.
    held: f64,
    in_flight: u32,
    /// The worst case of the request refused for want of room, for the message.
    refused_worst: Option<f64>,
}

/// A request's reservation of its worst case ([`SpendMeter::admit`]): released when dropped,
/// which the relay does once the answer's usage is counted (or the request failed).
#[derive(Debug, Clone)]
pub struct Hold {
    /// Released when the last clone goes (the response's extensions need `Clone`).
    _held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    meter: Arc<SpendMeter>,
    usd: f64,
}

impl Drop for Held {
    fn drop(&mut self) {
        {
            let mut t = self.meter.lock();
            t.held = (t.held - self.usd).max(0.0);
            t.in_flight = t.in_flight.saturating_sub(1);
        }
        self.meter.settled.notify_waiters();
    }
}

/// A request's input tokens counted high: Claude's tokenizer makes a token of about 3.5 bytes
/// of English or code; 2 leaves room for what tokenizes worse (a request's size is mostly its
/// conversation's text).
const BYTES_PER_TOKEN_LOW: u64 = 2;

/// The output a request may ask for when it names no `max_tokens` (the API requires one; the
/// largest any model takes).
const MAX_OUTPUT_TOKENS: u64 = 128_000;

/// One session's spend and budget.
#[derive(Debug)]
pub struct SpendMeter {
    budget: Option<f64>,
    prices: Prices,
    totals: Mutex<Totals>,
    /// Cancelled once the spend has passed the budget, or no further request fits it.
    crossed: CancellationToken,
    /// Woken when a reservation settles.
    settled: tokio::sync::Notify,
}

impl SpendMeter {
    /// A meter counting at `prices`; `budget` in USD (`None`: count only).
    pub fn new(budget: Option<f64>, prices: Prices) -> Arc<SpendMeter> {
        Arc::new(SpendMeter {
            budget,
            prices,
            totals: Mutex::new(Totals::default()),
            crossed: CancellationToken::new(),
            settled: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most a request of `model` with a body of `body_bytes` asking for `max_tokens` can
    /// cost (module docs).
    pub fn worst_case(
        &self,
        model: Option<&str>,
        body_bytes: usize,
        max_tokens: Option<u64>,
    ) -> f64 {
        self.prices.of(model).cost(&Usage {
            input: body_bytes as u64 / BYTES_PER_TOKEN_LOW,
            output: max_tokens.unwrap_or(MAX_OUTPUT_TOKENS),
            ..Usage::default()
        })
    }

    /// Reserves `worst` USD for a request about to be sent (module docs): at once when it fits
    /// beside the spend and the requests in flight, after those settle when it fits then;
    /// `None` (refused) when the budget is spent or nothing in flight leaves room for it. Without
    /// a budget every request is admitted.
    pub async fn admit(self: &Arc<Self>, worst: f64) -> Option<Hold> {
        let hold = || Hold {
            _held: Arc::new(Held {
                meter: self.clone(),
                usd: worst,
            }),
        };
        let Some(budget) = self.budget else {
            self.lock().in_flight += 1;
            return Some(Hold {
                _held: Arc::new(Held {
                    meter: self.clone(),
                    usd: 0.0,
                }),
            });
        };
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let mut t = self.lock();
                if t.usd > budget {
                    return None;
                }
                if t.usd + t.held + worst <= budget {
                    t.held += worst;
                    t.in_flight += 1;
                    return Some(hold());
                }
                if t.in_flight == 0 {
                    // Nothing in flight will leave more room: no further request fits.
                    t.refused_worst = Some(worst);
                    drop(t);
                    self.crossed.cancel();
                    return None;
                }
            }
            settled.await;
        }
    }

    pub fn budget(&self) -> Option<f64> {
        self.budget
    }

    /// Counts one response of `model` that used `usage`; returns its cost.
    pub fn record(&self, model: Option<&str>, usage: &Usage) -> f64 {
        let cost = self.prices.of(model).cost(usage);
        let usd = {
            let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            t.usd += cost;
            t.requests += 1;
            t.usd
        };
        if self.budget.is_some_and(|b| usd > b) {
            self.crossed.cancel();
        }
        cost
    }

    /// Counts a request refused for the budget.
    pub fn refuse(&self) {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refused += 1;
    }

    /// True once the spend has passed the budget, or no further request fits it.
    pub fn exceeded(&self) -> bool {
        self.crossed.is_cancelled()
    }

    /// Resolves once the spend has passed the budget (never without a budget).
    pub async fn crossed(&self) {
        self.crossed.cancelled().await
    }

    pub fn stats(&self) -> SpendStats {
        let t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        SpendStats {
            usd: t.usd,
            requests: t.requests,
            refused: t.refused,
            budget_usd: self.budget,
        }
    }

    /// "$0.0123 of maxBudgetUsd $0.01 (4 model requests)": the spend in words, for the
    /// ERR_BUDGET message and the relay's refusal.
    pub fn describe(&self) -> String {
        let s = self.stats();
        let budget = s
            .budget_usd
            .map_or_else(|| "no budget".to_string(), |b| format!("maxBudgetUsd ${b}"));
        let next = self.lock().refused_worst.map_or_else(String::new, |w| {
            format!(
                "; the next request's worst case (${}) does not fit what is left",
                dollars(w)
            )
        });
        format!(
            "${} of {budget} ({} model request{}){next}",
            dollars(s.usd),
            s.requests,
            if s.requests == 1 { "" } else { "s" }
        )
    }
}

/// Dollars to 4 decimal places (a hundredth of a cent: below that no request costs).
fn dollars(usd: f64) -> String {
    format!("{usd:.4}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: u64) -> Usage {
        Usage {
            input,
            ..Usage::default()
        }
    }

    #[tokio::test]
    async fn the_request_that_passes_the_budget_crosses_it_and_one_reaching_it_does_not() {
        // Sonnet input: $3 per million tokens, so 100k tokens cost $0.30.
        let meter = SpendMeter::new(Some(0.6), Prices::default());
        let sonnet = Some("claude-sonnet-4-5");
        meter.record(sonnet, &tokens(100_000));
        meter.record(sonnet, &tokens(100_000));
        assert!(!meter.exceeded(), "exactly the budget is not past it");
        meter.record(sonnet, &tokens(1));
        assert!(meter.exceeded());
        tokio::time::timeout(std::time::Duration::from_secs(1), meter.crossed())
            .await
            .expect("crossed resolves once passed");
        let s = meter.stats();
        assert_eq!(s.requests, 3);
        assert!((s.usd - 0.600003).abs() < 1e-9, "{}", s.usd);
        assert_eq!(s.budget_usd, Some(0.6));
        assert_eq!(
            meter.describe(),
            "$0.6000 of maxBudgetUsd $0.6 (3 model requests)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn parallel_requests_never_pass_the_budget_one_waits_for_room_and_is_refused_when_none_is_left(
    ) {
        let meter = SpendMeter::new(Some(1.0), Prices::default());
        let sonnet = Some("claude-sonnet-4-5");
        // 32,000 output tokens at $15 per million: $0.48 each, worst case.
        let worst = meter.worst_case(sonnet, 0, Some(32_000));
        assert!((worst - 0.48).abs() < 1e-9, "{worst}");
        let first = meter.admit(worst).await.expect("fits");
        let second = meter.admit(worst).await.expect("fits beside the first");
        // A third does not fit beside the two in flight: it waits for them.
        let third = tokio::spawn({
            let meter = meter.clone();
            async move { meter.admit(worst).await.is_some() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert!(!third.is_finished(), "waits while the two are in flight");
        // Each answer costs $0.30 (20,000 output tokens); both settle.
        let answer = Usage {
            output: 20_000,
            ..Usage::default()
        };
        meter.record(sonnet, &answer);
        drop(first);
        meter.record(sonnet, &answer);
        drop(second);
        // $0.60 spent + $0.48 > $1: nothing in flight will make room, so it is refused and the
        // budget counts as spent.
        assert!(!third.await.unwrap());
        assert!(meter.exceeded());
        assert!(meter.stats().usd <= 1.0);
        assert!(meter
            .describe()
            .contains("the next request's worst case ($0.4800) does not fit what is left"));
    }

    #[tokio::test]
    async fn a_request_that_fits_after_another_settles_is_sent_then() {
        let meter = SpendMeter::new(Some(1.0), Prices::default());
        let first = meter.admit(0.6).await.expect("fits");
        let waiting = tokio::spawn({
            let meter = meter.clone();
            async move { meter.admit(0.6).await.is_some() }
        });
        // The first's answer cost little: room for the second once it settles.
        meter.record(Some("claude-sonnet-4-5"), &tokens(10_000));
        drop(first);
        assert!(waiting.await.unwrap());
        assert!(!meter.exceeded());
    }

    #[test]
    fn without_a_budget_the_meter_only_counts() {
        let meter = SpendMeter::new(None, Prices::default());
        meter.record(Some("claude-opus-4-1"), &tokens(100_000));
        assert!(!meter.exceeded());
        assert!((meter.stats().usd - 1.5).abs() < 1e-9);
        meter.refuse();
        assert_eq!(meter.stats().refused, 1);
    }
}
