//! The agent output schemas: equivalent to the spec's Zod schemas, accepted by the CLI (no
//! 2020-12 `$schema`, lesson 11), and every violation reported with its JSON path.

use claude_runtime_adapter::domain::Role;
use claude_runtime_adapter::schema::{output_schema, validate};
use serde_json::{json, Value};

const ROLES: [Role; 3] = [Role::Planner, Role::Implementor, Role::Reviewer];

fn violations(role: Role, value: Value) -> Vec<String> {
    validate(role, &value).expect_err("expected violations")
}

fn valid_reviewer() -> Value {
    json!({
        "role": "reviewer",
        "review": {
            "verdict": "needs-changes",
            "summary": "One problem.",
            "comments": [
                { "path": "src/a.rs", "line": 3, "body": "x" },
                { "path": "src/b.rs", "line": null, "body": "file-level" },
                { "path": "src/c.rs", "line": 4.0, "body": "a number, not only an integer" }
            ]
        }
    })
}

#[test]
fn schemas_carry_no_2020_12_schema_key() {
    for role in ROLES {
        let text = output_schema(role).to_string();
        assert!(!text.contains("2020-12"), "{text}");
        assert!(output_schema(role).get("$schema").is_none());
    }
}

#[test]
fn every_object_requires_all_its_properties_and_allows_no_others() {
    fn check(v: &Value) {
        if let Some(props) = v.get("properties").and_then(Value::as_object) {
            let mut required: Vec<&str> = v["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            let mut keys: Vec<&str> = props.keys().map(String::as_str).collect();
            required.sort();
            keys.sort();
            assert_eq!(required, keys);
            assert_eq!(v["additionalProperties"], json!(false));
            props.values().for_each(check);
        }
        if let Some(items) = v.get("items") {
            check(items);
        }
    }
    ROLES.iter().for_each(|r| check(output_schema(*r)));
}

#[test]
fn valid_outputs_of_each_role_pass() {
    validate(
        Role::Planner,
        &json!({
            "role": "planner",
            "create": [{ "tempID": "t1", "title": "T", "body": "B", "labels": ["x"], "blockedBy": ["t0", "42"] }],
            "close": ["7"],
            "update": [
                { "workItemID": "8", "body": null, "labels": null },
                { "workItemID": "9", "body": "new", "labels": [] }
            ]
        }),
    )
    .unwrap();
    validate(
        Role::Implementor,
        &json!({ "role": "implementor", "outcome": "validation-failure", "summary": "s" }),
    )
    .unwrap();
    validate(Role::Reviewer, &valid_reviewer()).unwrap();
}

#[test]
fn implementor_output_may_not_carry_a_patch() {
    let v = violations(
        Role::Implementor,
        json!({ "role": "implementor", "outcome": "completed", "summary": "s", "patch": "diff" }),
    );
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("/: ") && v[0].contains("patch"), "{v:?}");
}

#[test]
fn wrong_role_literal_is_reported_at_its_path() {
    let v = violations(
        Role::Implementor,
        json!({ "role": "reviewer", "outcome": "completed", "summary": "s" }),
    );
    assert_eq!(v, vec![r#"/role: "implementor" was expected"#]);
}

#[test]
fn enum_violation_is_reported_at_its_path() {
    let mut out = valid_reviewer();
    out["review"]["verdict"] = json!("maybe");
    let v = violations(Role::Reviewer, out);
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("/review/verdict: "), "{v:?}");
}

#[test]
fn type_violation_in_a_nested_array_is_reported_with_its_index() {
    let mut out = valid_reviewer();
    out["review"]["comments"][0]["line"] = json!("x");
    let v = violations(Role::Reviewer, out);
    assert_eq!(
        v,
        vec![r#"/review/comments/0/line: "x" is not of types "null", "number""#]
    );
}

#[test]
fn missing_property_is_reported_at_its_parent() {
    let v = violations(
        Role::Planner,
        json!({ "role": "planner", "create": [], "close": [] }),
    );
    assert_eq!(v, vec![r#"/: "update" is a required property"#]);
}

#[test]
fn every_violation_is_listed() {
    let v = violations(
        Role::Planner,
        json!({
            "role": "planner",
            "create": [{ "tempID": 1, "title": "T", "body": "B", "labels": "x", "blockedBy": [] }],
            "close": [7],
            "update": [{ "workItemID": "8", "body": null }],
            "extra": true
        }),
    );
    let paths: Vec<&str> = v.iter().map(|s| s.split(": ").next().unwrap()).collect();
    for expected in [
        "/",
        "/create/0/tempID",
        "/create/0/labels",
        "/close/0",
        "/update/0",
    ] {
        assert!(paths.contains(&expected), "{expected} missing from {v:#?}");
    }
    assert_eq!(v.len(), 5, "{v:#?}");
}
