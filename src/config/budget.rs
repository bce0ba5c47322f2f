//! `maxBudgetUsd` and `modelPrices`: the budget every session gets unless its start params say
//! otherwise, and the overrides of the price table it is counted at. Only their reading as
//! config (each field checked and named in the one config error) is here; their bounds, their
//! rates' defaults and how a price key matches a model are [`crate::spend`]'s.

use serde_json::Value;

use super::{describe, BackendConfig, Problems, Reader, SandboxConfig};
use crate::spend::prices::MAX_PRICE;
use crate::spend::{ModelPrice, Prices, MAX_BUDGET_USD};

/// `config.maxBudgetUsd` (`None`: absent or `0`, no budget) and `config.modelPrices`.
pub(super) fn budget(
    r: &mut Reader<'_>,
    sandbox: Option<&SandboxConfig>,
    backend: &BackendConfig,
) -> (Option<f64>, Prices) {
    let usd = r.number("maxBudgetUsd", Some(0.0), 0.0, MAX_BUDGET_USD, false);
    let budget = (usd > 0.0).then_some(usd);
    if budget.is_some() && *backend == BackendConfig::Local {
        if let Some(why) = unmetered_locally(sandbox) {
            r.add("maxBudgetUsd", why);
        }
    }
    let prices = model_prices(r.obj.get("modelPrices"), r.problems);
    (budget, prices)
}

/// Why a local session with `sandbox` cannot be budgeted (`None`: it can). Only the relay
/// counts spend, and only the Linux sandbox puts it between the CLI and the API.
pub fn unmetered_locally(sandbox: Option<&SandboxConfig>) -> Option<&'static str> {
    if sandbox.is_none() {
        Some("needs the sandbox, whose model relay counts the spend: with sandbox: false the CLI calls the model API itself")
    } else if !cfg!(target_os = "linux") {
        Some("needs the Linux sandbox, whose model relay counts the spend: here the CLI calls the model API itself")
    } else {
        None
    }
}

/// `modelPrices`: `{ "<model id prefix>" | "*": { input, output, cacheRead?, cacheCreation? } }`,
/// USD per million tokens; the cache rates default to Anthropic's ratios of `input`.
fn model_prices(v: Option<&Value>, problems: &mut Problems) -> Prices {
    let obj = match v {
        None | Some(Value::Null) => return Prices::default(),
        Some(Value::Object(o)) => o,
        Some(other) => {
            problems.add(
                "modelPrices",
                format!("must be an object {{ \"<model id prefix>\": {{ input, output, cacheRead?, cacheCreation? }} }} (got {})", describe(Some(other))),
            );
            return Prices::default();
        }
    };
    let mut out = Vec::new();
    for (model, price) in obj {
        let field = format!("modelPrices[{model:?}]");
        if model.trim().is_empty() {
            problems.add(
                &field,
                "names no model (use \"*\" for the models no key matches)",
            );
            continue;
        }
        let Some(p) = price.as_object() else {
            problems.add(
                &field,
                "must be an object { input, output, cacheRead?, cacheCreation? } (USD per million tokens)",
            );
            continue;
        };
        for key in p.keys() {
            if !["input", "output", "cacheRead", "cacheCreation"].contains(&key.as_str()) {
                problems.add(
                    &format!("{field}.{key}"),
                    "is not a price (input, output, cacheRead, cacheCreation)",
                );
            }
        }
        let prefix = format!("{field}.");
        let mut r = Reader {
            obj: p,
            problems,
            prefix: &prefix,
        };
        let input = r.number("input", None, 0.0, MAX_PRICE, false);
        let output = r.number("output", None, 0.0, MAX_PRICE, false);
        let derived = ModelPrice::from_rates(input, output);
        let cache_read = r.number("cacheRead", Some(derived.cache_read), 0.0, MAX_PRICE, false);
        let cache_creation = r.number(
            "cacheCreation",
            Some(derived.cache_creation),
            0.0,
            MAX_PRICE,
            false,
        );
        out.push((
            model.clone(),
            ModelPrice {
                input,
                output,
                cache_read,
                cache_creation,
            },
        ));
    }
    Prices::with_overrides(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(config: Value) -> (Option<f64>, Prices, Vec<String>) {
        let mut problems = Problems::default();
        let obj = config.as_object().unwrap().clone();
        let sandbox = match obj.get("sandbox") {
            Some(Value::Bool(false)) => None,
            _ => Some(SandboxConfig::default()),
        };
        let mut r = Reader {
            obj: &obj,
            problems: &mut problems,
            prefix: "",
        };
        let (budget, prices) = budget(&mut r, sandbox.as_ref(), &BackendConfig::Local);
        (budget, prices, problems.0)
    }

    #[test]
    fn a_budget_is_a_number_of_dollars_and_zero_or_absent_means_none() {
        assert_eq!(parse(json!({})).0, None);
        assert_eq!(parse(json!({ "maxBudgetUsd": 0 })).0, None);
        let (budget, _, problems) = parse(json!({ "maxBudgetUsd": 2.5 }));
        assert_eq!((budget, problems.len()), (Some(2.5), 0));
    }

    #[test]
    fn a_bad_budget_is_named_with_its_range() {
        for bad in [
            json!(-1),
            json!("5"),
            json!("NaN"),
            json!("inf"),
            json!(1e7),
            json!(true),
        ] {
            let (_, _, problems) = parse(json!({ "maxBudgetUsd": bad }));
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
            assert!(
                problems[0].starts_with("config.maxBudgetUsd must be a number in [0, 1000000]"),
                "{problems:?}"
            );
        }
    }

    #[test]
    fn a_budget_without_the_sandbox_is_refused_since_nothing_would_count_it() {
        let (_, _, problems) = parse(json!({ "maxBudgetUsd": 1, "sandbox": false }));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("config.maxBudgetUsd needs the sandbox"),
            "{problems:?}"
        );
        // Without a budget, sandbox: false is fine.
        assert!(parse(json!({ "maxBudgetUsd": 0, "sandbox": false }))
            .2
            .is_empty());
    }

    #[test]
    fn model_prices_override_the_table_and_every_bad_one_is_named() {
        let (_, prices, problems) = parse(json!({ "modelPrices": {
            "claude-sonnet-4-5": { "input": 1, "output": 2 },
            "*": { "input": 4, "output": 8, "cacheRead": 0, "cacheCreation": 5 },
        }}));
        assert!(problems.is_empty(), "{problems:?}");
        let sonnet = prices.of(Some("claude-sonnet-4-5-20250929"));
        assert_eq!(
            (sonnet.input, sonnet.output, sonnet.cache_read),
            (1.0, 2.0, 0.1)
        );
        assert_eq!(sonnet.cache_creation, 1.25);
        let other = prices.of(Some("claude-opus-9"));
        assert_eq!((other.cache_read, other.cache_creation), (0.0, 5.0));

        let (_, _, problems) = parse(json!({ "modelPrices": {
            "a": { "input": -1, "output": 1 },
            "b": { "output": 1 },
            "c": { "input": 1, "output": 1, "cached": 2 },
            " ": { "input": 1, "output": 1 },
            "d": 5,
        }}));
        let all = problems.join("\n");
        for expected in [
            "config.modelPrices[\"a\"].input must be a number in [0, 1000000] (got -1)",
            "config.modelPrices[\"b\"].input must be a number in [0, 1000000] (got nothing)",
            "config.modelPrices[\"c\"].cached is not a price",
            "config.modelPrices[\" \"] names no model",
            "config.modelPrices[\"d\"] must be an object",
        ] {
            assert!(all.contains(expected), "{expected} in:\n{all}");
        }
        assert_eq!(
            parse(json!({ "modelPrices": [] })).2,
            vec!["config.modelPrices must be an object { \"<model id prefix>\": { input, output, cacheRead?, cacheCreation? } } (got [])"]
        );
    }
}
