//! What the JSON Schema cannot say about an agent's structured output (spec 004 field rules):
//! a PlannerResult's `tempID`s are unique, each `blockedBy` names a `tempID` of the same result
//! or an existing work item, `close` and `update[].workItemID` name existing work items; a
//! ReviewerResult comment's `path` is a file of the revision under review.
//!
//! Pure functions over output that already passed the schema. The facts they compare against
//! come from the data context assembly fetched for the prompt ([`Facts`]), so the check sees
//! what the agent was shown and costs no second round of engine callbacks.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::domain::{EngineState, RevisionFile};

/// What a role's output is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Facts {
    /// The ids of the work items in the engine state the planner was shown.
    Planner { work_items: HashSet<String> },
    /// Nothing to check beyond the schema (the patch is the adapter's, not the agent's).
    Implementor,
    /// The paths of the revision's files, in the provider's order.
    Reviewer { files: Vec<String> },
}

impl Facts {
    pub fn planner(state: &EngineState) -> Facts {
        // The state's keys are the ids the engine resolves; an item's own `id` is accepted too
        // in case a provider keys its map differently.
        let work_items = state
            .work_items
            .iter()
            .flat_map(|(key, item)| [key.clone(), item.id.clone()])
            .collect();
        Facts::Planner { work_items }
    }

    pub fn reviewer(files: &[RevisionFile]) -> Facts {
        Facts::Reviewer {
            files: files.iter().map(|f| f.path.clone()).collect(),
        }
    }
}

/// Every semantic violation of `output`, one line each, starting with its JSON path
/// (`create[2].blockedBy[0] "t9" names …`), in document order.
pub fn check(facts: &Facts, output: &Value) -> Result<(), Vec<String>> {
    let violations = match facts {
        Facts::Planner { work_items } => check_planner(work_items, output),
        Facts::Implementor => Vec::new(),
        Facts::Reviewer { files } => check_reviewer(files, output),
    };
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn check_planner(work_items: &HashSet<String>, output: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let create = array(output, "create");
    // First occurrence of each tempID, to name it in a duplicate's message.
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, item) in create.iter().enumerate() {
        let Some(temp) = item.get("tempID").and_then(Value::as_str) else {
            continue;
        };
        if let Some(j) = first.get(temp) {
            out.push(format!(
                "create[{i}].tempID {temp:?} repeats create[{j}].tempID; each tempID must be unique within the result"
            ));
        } else {
            first.insert(temp, i);
        }
    }
    for (i, item) in create.iter().enumerate() {
        for (j, dep) in array(item, "blockedBy").iter().enumerate() {
            let Some(dep) = dep.as_str() else { continue };
            if !first.contains_key(dep) && !work_items.contains(dep) {
                out.push(format!(
                    "create[{i}].blockedBy[{j}] {dep:?} names neither a tempID of this result nor a work item in the engine state"
                ));
            }
        }
    }
    for (i, id) in array(output, "close").iter().enumerate() {
        let Some(id) = id.as_str() else { continue };
        if !work_items.contains(id) {
            out.push(format!(
                "close[{i}] {id:?} is not a work item in the engine state"
            ));
        }
    }
    for (i, update) in array(output, "update").iter().enumerate() {
        let Some(id) = update.get("workItemID").and_then(Value::as_str) else {
            continue;
        };
        if !work_items.contains(id) {
            out.push(format!(
                "update[{i}].workItemID {id:?} is not a work item in the engine state"
            ));
        }
    }
    out
}

/// How many of the revision's paths a violation line lists before "…".
const LISTED_FILES: usize = 20;

fn check_reviewer(files: &[String], output: &Value) -> Vec<String> {
    let comments = output
        .get("review")
        .map_or(&[] as &[Value], |r| array(r, "comments"));
    let known: HashSet<&str> = files.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for (i, comment) in comments.iter().enumerate() {
        let Some(path) = comment.get("path").and_then(Value::as_str) else {
            continue;
        };
        if !known.contains(path) {
            out.push(format!(
                "review.comments[{i}].path {path:?} is not a file of the revision ({})",
                describe_files(files)
            ));
        }
    }
    out
}

fn describe_files(files: &[String]) -> String {
    if files.is_empty() {
        return "the revision has no files".to_owned();
    }
    let mut listed: Vec<String> = files
        .iter()
        .take(LISTED_FILES)
        .map(|f| format!("{f:?}"))
        .collect();
    if files.len() > LISTED_FILES {
        listed.push(format!("… {} more", files.len() - LISTED_FILES));
    }
    format!("its files: {}", listed.join(", "))
}

/// The follow-up user turn that asks the agent to correct its output.
pub fn follow_up_prompt(violations: &[String]) -> String {
    let mut text = String::from(
        "Your structured output was received, but it breaks these rules of the output contract:\n",
    );
    for v in violations {
        text.push_str("- ");
        text.push_str(v);
        text.push('\n');
    }
    text.push_str(
        "\nFix every one of them and call the StructuredOutput tool again with the complete corrected output. Change nothing else.",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::WorkItem;
    use serde_json::json;

    fn state(ids: &[&str]) -> EngineState {
        EngineState {
            work_items: ids
                .iter()
                .map(|id| {
                    (
                        id.to_string(),
                        WorkItem {
                            id: id.to_string(),
                            title: format!("item {id}"),
                            status: "pending".into(),
                            linked_revision: None,
                        },
                    )
                })
                .collect(),
            ..EngineState::default()
        }
    }

    fn item(temp: &str, blocked_by: &[&str]) -> Value {
        json!({"tempID": temp, "title": "t", "body": "b", "labels": [], "blockedBy": blocked_by})
    }

    fn planner(create: Vec<Value>, close: &[&str], update: &[&str]) -> Value {
        let update: Vec<Value> = update
            .iter()
            .map(|id| json!({"workItemID": id, "body": null, "labels": null}))
            .collect();
        json!({"role": "planner", "create": create, "close": close, "update": update})
    }

    #[test]
    fn a_consistent_planner_result_passes() {
        let facts = Facts::planner(&state(&["7", "8"]));
        let out = planner(
            vec![item("t1", &["7"]), item("t2", &["t1", "8"])],
            &["8"],
            &["7"],
        );
        assert_eq!(check(&facts, &out), Ok(()));
    }

    #[test]
    fn an_empty_planner_result_passes() {
        let facts = Facts::planner(&state(&[]));
        assert_eq!(check(&facts, &planner(vec![], &[], &[])), Ok(()));
    }

    #[test]
    fn a_repeated_temp_id_names_both_positions() {
        let facts = Facts::planner(&state(&[]));
        let out = planner(
            vec![item("t1", &[]), item("t2", &[]), item("t1", &[])],
            &[],
            &[],
        );
        assert_eq!(
            check(&facts, &out).unwrap_err(),
            ["create[2].tempID \"t1\" repeats create[0].tempID; each tempID must be unique within the result"]
        );
    }

    #[test]
    fn blocked_by_may_name_a_later_temp_id_but_not_an_unknown_one() {
        let facts = Facts::planner(&state(&["7"]));
        let out = planner(
            vec![item("t1", &["t2", "t9", "7"]), item("t2", &[])],
            &[],
            &[],
        );
        assert_eq!(
            check(&facts, &out).unwrap_err(),
            ["create[0].blockedBy[1] \"t9\" names neither a tempID of this result nor a work item in the engine state"]
        );
    }

    #[test]
    fn close_and_update_must_name_work_items_in_state() {
        let facts = Facts::planner(&state(&["7"]));
        let out = planner(vec![item("t1", &[])], &["7", "99"], &["t1", "7"]);
        assert_eq!(
            check(&facts, &out).unwrap_err(),
            [
                "close[1] \"99\" is not a work item in the engine state",
                "update[0].workItemID \"t1\" is not a work item in the engine state",
            ]
        );
    }

    #[test]
    fn every_violation_is_reported_in_document_order() {
        let facts = Facts::planner(&state(&[]));
        let out = planner(vec![item("a", &["x"]), item("a", &["y"])], &["z"], &["w"]);
        let v = check(&facts, &out).unwrap_err();
        let paths: Vec<&str> = v.iter().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "create[1].tempID",
                "create[0].blockedBy[0]",
                "create[1].blockedBy[0]",
                "close[0]",
                "update[0].workItemID"
            ]
        );
    }

    #[test]
    fn a_state_keyed_differently_from_item_ids_accepts_both() {
        let mut s = state(&["7"]);
        s.work_items[0].0 = "key-7".into();
        let facts = Facts::planner(&s);
        assert_eq!(
            check(&facts, &planner(vec![], &["key-7", "7"], &[])),
            Ok(())
        );
    }

    fn review(paths: &[&str]) -> Value {
        let comments: Vec<Value> = paths
            .iter()
            .map(|p| json!({"path": p, "line": null, "body": "b"}))
            .collect();
        json!({"role": "reviewer", "review": {"verdict": "needs-changes", "summary": "s", "comments": comments}})
    }

    fn files(paths: &[&str]) -> Vec<RevisionFile> {
        paths
            .iter()
            .map(|p| RevisionFile {
                path: p.to_string(),
                status: "modified".into(),
                patch: None,
            })
            .collect()
    }

    #[test]
    fn reviewer_comments_on_revision_files_pass() {
        let facts = Facts::reviewer(&files(&["src/a.ts", "src/b.ts"]));
        assert_eq!(check(&facts, &review(&["src/b.ts", "src/a.ts"])), Ok(()));
    }

    #[test]
    fn a_reviewer_comment_on_another_path_is_named_with_the_revision_files() {
        let facts = Facts::reviewer(&files(&["src/a.ts"]));
        assert_eq!(
            check(&facts, &review(&["src/a.ts", "./src/a.ts"])).unwrap_err(),
            ["review.comments[1].path \"./src/a.ts\" is not a file of the revision (its files: \"src/a.ts\")"]
        );
    }

    #[test]
    fn a_revision_with_no_files_rejects_every_comment() {
        let facts = Facts::reviewer(&[]);
        let v = check(&facts, &review(&["x"])).unwrap_err();
        assert!(v[0].ends_with("(the revision has no files)"), "{}", v[0]);
    }

    #[test]
    fn a_long_file_list_is_cut_short() {
        let many: Vec<String> = (0..25).map(|i| format!("f{i}")).collect();
        let facts = Facts::Reviewer { files: many };
        let v = check(&facts, &review(&["nope"])).unwrap_err();
        assert!(v[0].contains("\"f19\", … 5 more)"), "{}", v[0]);
        assert!(!v[0].contains("\"f20\""), "{}", v[0]);
    }

    #[test]
    fn implementor_output_has_no_semantic_rules() {
        assert_eq!(
            check(&Facts::Implementor, &json!({"outcome": "completed"})),
            Ok(())
        );
    }

    #[test]
    fn the_follow_up_lists_every_violation() {
        let p = follow_up_prompt(&["a bad".into(), "b bad".into()]);
        assert!(p.contains("- a bad\n- b bad\n"), "{p}");
        assert!(p.contains("StructuredOutput"), "{p}");
    }
}
