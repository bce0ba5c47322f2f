//! The JSON Schemas of the three roles' agent output (spec 000 "Agent Output Schemas"),
//! written by hand to match what zod's `toJSONSchema` makes of the spec's Zod schemas — minus
//! its `"$schema"` 2020-12 stamp, which the CLI refuses (lesson 11). They carry no `$schema`
//! key at all and are compiled as draft-07, the dialect the CLI accepts, so the validator
//! here and the CLI agree on what they mean.
//!
//! The implementor schema has no `patch`: the adapter extracts it after the run.

pub mod semantic;

use std::sync::LazyLock;

use jsonschema::{Draft, Validator};
use serde_json::Value;

use crate::domain::Role;

struct Compiled {
    schema: Value,
    validator: Validator,
}

fn compile(role: Role, text: &str) -> Compiled {
    // Both failures are build defects in an embedded file, not runtime conditions.
    let schema: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("embedded {} schema is not JSON: {e}", role.as_str()));
    let validator = jsonschema::options()
        .with_draft(Draft::Draft7)
        .build(&schema)
        .unwrap_or_else(|e| panic!("embedded {} schema does not compile: {e}", role.as_str()));
    Compiled { schema, validator }
}

static PLANNER: LazyLock<Compiled> =
    LazyLock::new(|| compile(Role::Planner, include_str!("planner.json")));
static IMPLEMENTOR: LazyLock<Compiled> =
    LazyLock::new(|| compile(Role::Implementor, include_str!("implementor.json")));
static REVIEWER: LazyLock<Compiled> =
    LazyLock::new(|| compile(Role::Reviewer, include_str!("reviewer.json")));

fn compiled(role: Role) -> &'static Compiled {
    match role {
        Role::Planner => &PLANNER,
        Role::Implementor => &IMPLEMENTOR,
        Role::Reviewer => &REVIEWER,
    }
}

/// The schema handed to the CLI (`--json-schema`) for `role`'s session.
pub fn output_schema(role: Role) -> &'static Value {
    &compiled(role).schema
}

/// Every violation of `role`'s schema, each as `<JSON pointer>: <message>` (the root is
/// written `/`), in the validator's order.
pub fn validate(role: Role, value: &Value) -> Result<(), Vec<String>> {
    let violations: Vec<String> = compiled(role)
        .validator
        .iter_errors(value)
        .map(|err| {
            let path = err.instance_path().to_string();
            let path = if path.is_empty() {
                "/".to_owned()
            } else {
                path
            };
            format!("{path}: {err}")
        })
        .collect();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}
