//! What a model's tokens cost: the one table the budget prices every request by
//! (`maxBudgetUsd`, see `docs/budgets.md`), and the config's overrides of it (`modelPrices`).
//!
//! The table holds Anthropic's list prices per million tokens as of [`PRICES_AS_OF`] (their
//! sources, and that they were not read live from the pricing page, are in docs/budgets.md):
//! the standard rates (no batch
//! discount, which a session never gets). On top of a row's rates, as Anthropic bills them:
//! one-hour cache writes at 2× the input rate (5-minute ones at the row's cache-write rate);
//! a request of more than 200k input tokens (input, cache reads and writes together: only the
//! 1M-context models take one) at the long-context premium, its input-side rates doubled and
//! its output at 1.5×; each web search a server tool made at $10 per thousand. A provider's own
//! rates (Bedrock, Vertex AI, Foundry) may differ: `config.modelPrices` overrides any row.
//!
//! A model is matched by its id from `claude-` on (so `us.anthropic.claude-…-v1:0` on Bedrock
//! and `claude-…@20250929` on Vertex AI match as `claude-…`), the longest matching key first:
//! `claude-sonnet-4-5` prices `claude-sonnet-4-5-20250929`. A model that matches nothing (a
//! newer one, a gateway's alias) is priced at the most expensive row: a budget must not let an
//! unknown model spend more than it says, so it may count high, never low. The config's
//! `modelPrices['*']` prices such models instead.

use std::collections::BTreeMap;

use super::usage::Usage;

/// When the table was last checked against the published prices.
pub const PRICES_AS_OF: &str = "2026-11-26";

/// USD per million tokens of each kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_creation: f64,
}

impl ModelPrice {
    /// A price from its input and output rates, with the cache rates Anthropic derives from
    /// the input rate: reads at 0.1×, 5-minute writes at 1.25×.
    pub const fn from_rates(input: f64, output: f64) -> ModelPrice {
        ModelPrice {
            input,
            output,
            cache_read: input * 0.1,
            cache_creation: input * 1.25,
        }
    }

    /// What `usage` costs at this price, in USD (module docs: one-hour cache writes, the
    /// long-context premium, web searches).
    pub fn cost(&self, usage: &Usage) -> f64 {
        let all_input = usage.input + usage.cache_read + usage.cache_creation;
        let (input_side, output_side) = if all_input > LONG_CONTEXT_TOKENS {
            (2.0, 1.5)
        } else {
            (1.0, 1.0)
        };
        let one_hour = usage.cache_creation_1h.min(usage.cache_creation);
        let tokens = input_side
            * (usage.input as f64 * self.input
                + usage.cache_read as f64 * self.cache_read
                + (usage.cache_creation - one_hour) as f64 * self.cache_creation
                + one_hour as f64 * self.input * ONE_HOUR_WRITE)
            + output_side * usage.output as f64 * self.output;
        tokens / 1_000_000.0 + usage.web_searches as f64 * WEB_SEARCH_USD
    }
}

/// Past this many input tokens a request is billed at the long-context premium.
const LONG_CONTEXT_TOKENS: u64 = 200_000;
/// A one-hour cache write's rate, times the input rate.
const ONE_HOUR_WRITE: f64 = 2.0;
/// One web search of the server tool ($10 per thousand).
const WEB_SEARCH_USD: f64 = 0.01;

/// The list prices, by model id prefix. Kept in this one place; see the module's comment.
pub const TABLE: &[(&str, ModelPrice)] = &[
    ("claude-opus-4-6", ModelPrice::from_rates(5.0, 25.0)),
    ("claude-opus-4-5", ModelPrice::from_rates(5.0, 25.0)),
    ("claude-opus-4-1", ModelPrice::from_rates(15.0, 75.0)),
    ("claude-opus-4", ModelPrice::from_rates(15.0, 75.0)),
    ("claude-3-opus", ModelPrice::from_rates(15.0, 75.0)),
    ("claude-sonnet-4-6", ModelPrice::from_rates(3.0, 15.0)),
    ("claude-sonnet-4-5", ModelPrice::from_rates(3.0, 15.0)),
    ("claude-sonnet-4", ModelPrice::from_rates(3.0, 15.0)),
    ("claude-3-7-sonnet", ModelPrice::from_rates(3.0, 15.0)),
    ("claude-3-5-sonnet", ModelPrice::from_rates(3.0, 15.0)),
    ("claude-haiku-4-5", ModelPrice::from_rates(1.0, 5.0)),
    ("claude-3-5-haiku", ModelPrice::from_rates(0.8, 4.0)),
    // Published with rounded cache rates, not the ratios.
    (
        "claude-3-haiku",
        ModelPrice {
            input: 0.25,
            output: 1.25,
            cache_read: 0.03,
            cache_creation: 0.3,
        },
    ),
];

/// The key of `config.modelPrices` that prices the models no other key matches.
pub const ANY_MODEL: &str = "*";

/// The highest price per million tokens `config.modelPrices` takes (far above any model's).
pub const MAX_PRICE: f64 = 1_000_000.0;

/// The prices a session's spend is counted at: the table, overridden by `config.modelPrices`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    /// `config.modelPrices`: model id prefix (or [`ANY_MODEL`]) → price.
    overrides: BTreeMap<String, ModelPrice>,
}

impl Prices {
    /// The table with `overrides` (model id prefix or [`ANY_MODEL`] → price) over it; a key is
    /// matched whatever its case and surrounding spaces, as model ids are ([`Prices::of`]), and
    /// of two keys that are the same so, the later stands (as in the config's order).
    pub fn with_overrides(overrides: impl IntoIterator<Item = (String, ModelPrice)>) -> Prices {
        let overrides = overrides
            .into_iter()
            .map(|(key, price)| (key.trim().to_ascii_lowercase(), price))
            .collect();
        Prices { overrides }
    }

    /// The price of `model` (a response's or request's `model`; `None` when neither said).
    pub fn of(&self, model: Option<&str>) -> ModelPrice {
        let id = model.map(normalize);
        let longest = |rows: &mut dyn Iterator<Item = (&str, ModelPrice)>| {
            let id = id.as_deref()?;
            rows.filter(|(key, _)| *key != ANY_MODEL && id.starts_with(key))
                .max_by_key(|(key, _)| key.len())
                .map(|(_, price)| price)
        };
        longest(&mut self.overrides.iter().map(|(k, p)| (k.as_str(), *p)))
            .or_else(|| longest(&mut TABLE.iter().copied()))
            .or_else(|| self.overrides.get(ANY_MODEL).copied())
            .unwrap_or_else(most_expensive)
    }
}

/// The model id as the table spells it: from `claude-` on, without a Vertex AI `@version`.
fn normalize(model: &str) -> String {
    let lower = model.trim().to_ascii_lowercase();
    let from = lower
        .find("claude-")
        .map_or(lower.as_str(), |i| &lower[i..]);
    from.split('@').next().unwrap_or(from).to_string()
}

/// The table's highest rate of each kind (what an unknown model is counted at).
fn most_expensive() -> ModelPrice {
    TABLE.iter().fold(
        ModelPrice {
            input: 0.0,
            output: 0.0,
            cache_read: 0.0,
            cache_creation: 0.0,
        },
        |a, (_, p)| ModelPrice {
            input: a.input.max(p.input),
            output: a.output.max(p.output),
            cache_read: a.cache_read.max(p.cache_read),
            cache_creation: a.cache_creation.max(p.cache_creation),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spend::usage::tests::usage;

    #[test]
    fn each_kind_of_token_is_priced_at_its_own_rate() {
        let sonnet = Prices::default().of(Some("claude-sonnet-4-5-20250929"));
        // 100k tokens: below the long-context premium.
        let k100 = 100_000;
        assert!((sonnet.cost(&usage(k100, 0, 0, 0)) - 0.3).abs() < 1e-9);
        assert!((sonnet.cost(&usage(0, k100, 0, 0)) - 1.5).abs() < 1e-9);
        assert!((sonnet.cost(&usage(0, 0, k100, 0)) - 0.03).abs() < 1e-9);
        assert!((sonnet.cost(&usage(0, 0, 0, k100)) - 0.375).abs() < 1e-9);
        assert!((sonnet.cost(&usage(1000, 2000, 3000, 4000)) - 0.0489).abs() < 1e-9);
    }

    #[test]
    fn one_hour_cache_writes_the_long_context_premium_and_web_searches_are_counted() {
        let sonnet = Prices::default().of(Some("claude-sonnet-4-5"));
        // 100k cache writes, 60k of them for an hour: 40k at 1.25x and 60k at 2x the $3 rate.
        let one_hour = Usage {
            cache_creation: 100_000,
            cache_creation_1h: 60_000,
            ..Usage::default()
        };
        assert!((sonnet.cost(&one_hour) - (0.04 * 3.75 + 0.06 * 6.0)).abs() < 1e-9);
        // 250k input tokens: past 200k, input at 2x, output at 1.5x.
        let long = Usage {
            input: 250_000,
            output: 1_000,
            ..Usage::default()
        };
        assert!((sonnet.cost(&long) - (0.25 * 6.0 + 0.001 * 22.5)).abs() < 1e-9);
        let searched = Usage {
            web_searches: 3,
            ..Usage::default()
        };
        assert!((sonnet.cost(&searched) - 0.03).abs() < 1e-12);
    }

    #[test]
    fn the_longest_prefix_wins_and_provider_spellings_match() {
        let p = Prices::default();
        assert_eq!(p.of(Some("claude-opus-4-5-20251101")).input, 5.0);
        assert_eq!(p.of(Some("claude-opus-4-1-20250805")).input, 15.0);
        assert_eq!(p.of(Some("claude-opus-4-20250514")).input, 15.0);
        assert_eq!(p.of(Some("claude-haiku-4-5")).output, 5.0);
        assert_eq!(
            p.of(Some("us.anthropic.claude-3-5-haiku-20241022-v1:0"))
                .input,
            0.8
        );
        assert_eq!(p.of(Some("claude-sonnet-4-5@20250929")).input, 3.0);
        assert_eq!(p.of(Some("Claude-Sonnet-4-5")).input, 3.0);
    }

    #[test]
    fn an_unknown_or_unnamed_model_is_priced_at_the_most_expensive_rate() {
        let p = Prices::default();
        for model in [Some("claude-opus-5-5"), Some("my-gateway-alias"), None] {
            let price = p.of(model);
            assert_eq!((price.input, price.output), (15.0, 75.0), "{model:?}");
            assert_eq!(price.cache_creation, 18.75);
        }
    }

    #[test]
    fn config_overrides_win_over_the_table_and_star_prices_unknown_models() {
        let p = Prices::with_overrides(BTreeMap::from([
            (
                "claude-sonnet-4-5".to_string(),
                ModelPrice::from_rates(1.0, 2.0),
            ),
            (
                "claude-sonnet".to_string(),
                ModelPrice::from_rates(7.0, 7.0),
            ),
            (ANY_MODEL.to_string(), ModelPrice::from_rates(0.5, 0.5)),
        ]));
        assert_eq!(p.of(Some("claude-sonnet-4-5-20250929")).input, 1.0);
        // An override matching a shorter prefix still wins over the table's longer one.
        assert_eq!(p.of(Some("claude-sonnet-4-20250514")).input, 7.0);
        assert_eq!(p.of(Some("claude-haiku-4-5")).output, 5.0);
        assert_eq!(p.of(Some("claude-opus-5-5")).input, 0.5);
        assert_eq!(p.of(None).input, 0.5);
    }
}
