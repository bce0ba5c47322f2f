//! A session's model spend: what the relay counted of every response's `usage` (the main loop,
//! subagents and the CLI's side requests alike: they all pass the session's one relay), priced
//! by [`prices`], against the session's `maxBudgetUsd`.
//!
//! One [`SpendMeter`] per session, shared (`Arc`) by the relay, which records each response
//! and refuses requests once the budget is spent, and the lifecycle, which stops the session
//! when the budget is crossed ([`SpendMeter::crossed`]) and reads the totals for the stats.
//! The request that crosses the budget is not refused — its cost is known only once it is
//! answered — so a session ends a little past its budget, by at most that request (and any
//! sent alongside it).

pub mod prices;

use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use prices::{ModelPrice, Prices, Usage};

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
}

/// One session's spend and budget.
#[derive(Debug)]
pub struct SpendMeter {
    budget: Option<f64>,
    prices: Prices,
    totals: Mutex<Totals>,
    /// Cancelled once the spend has passed the budget.
    crossed: CancellationToken,
}

impl SpendMeter {
    /// A meter counting at `prices`; `budget` in USD (`None`: count only).
    pub fn new(budget: Option<f64>, prices: Prices) -> Arc<SpendMeter> {
        Arc::new(SpendMeter {
            budget,
            prices,
            totals: Mutex::new(Totals::default()),
            crossed: CancellationToken::new(),
        })
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

    /// True once the spend has passed the budget.
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
        format!(
            "${} of {budget} ({} model request{})",
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

    #[test]
    fn without_a_budget_the_meter_only_counts() {
        let meter = SpendMeter::new(None, Prices::default());
        meter.record(Some("claude-opus-4-1"), &tokens(10_000_000));
        assert!(!meter.exceeded());
        assert_eq!(meter.stats().usd, 150.0);
        meter.refuse();
        assert_eq!(meter.stats().refused, 1);
    }
}
