//! "Result Assembly" and "Patch Extraction": how the session ended → the engine's `result`, and
//! the Implementor's patch, the run's durable artifact (also kept for failed runs).

use std::future::Future;

use serde_json::{json, Value};

use crate::claude::protocol::ResultMessage;
use crate::claude::session::{self, SessionEnd, StopReason};
use crate::domain::Role;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::schema;
use crate::schema::semantic::{self, Facts};
use crate::transcript::Transcript;

/// After a `result`: the follow-up turn asking the agent to fix its output, when the output
/// passed the schema but breaks the semantic rules. Other failures get no follow-up: the CLI
/// already retried schema failures, and errors end the session.
pub fn semantic_follow_up(role: Role, facts: &Facts, r: &ResultMessage) -> Option<String> {
    if r.subtype != "success" || r.is_error {
        return None;
    }
    let out = r.structured_output.as_ref()?;
    schema::validate(role, out).ok()?;
    semantic::check(facts, out)
        .err()
        .map(|v| semantic::follow_up_prompt(&v))
}

/// The result rules: `success` AND not `is_error` AND structured output present AND valid
/// (schema, then the semantic rules).
pub fn evaluate(role: Role, facts: &Facts, end: SessionEnd) -> Result<Value> {
    let exit = session::describe_exit(end.exit);
    let stderr = if end.stderr_tail.is_empty() {
        String::new()
    } else {
        format!("; stderr: {}", end.stderr_tail)
    };
    if let Some(reason) = end.stopped {
        return Err(match reason {
            StopReason::Cancelled => {
                AdapterError::new(ErrorCode::Cancelled, "the session was cancelled")
            }
            StopReason::Timeout => AdapterError::new(
                ErrorCode::Timeout,
                "the session exceeded maxAgentDuration and was stopped",
            ),
            // The lifecycle names the budget and the spend (`Session::over_budget`).
            StopReason::Budget => AdapterError::new(
                ErrorCode::Budget,
                "the session's model spend passed maxBudgetUsd and it was stopped",
            ),
            // The lifecycle names the limit and what was found (`Session::past_limits`).
            StopReason::Limit => {
                AdapterError::new(ErrorCode::ResourceLimit, "the session was stopped")
            }
        });
    }
    let Some(r) = end.result else {
        return Err(AdapterError::new(
            ErrorCode::AgentFailed,
            format!("the Claude Code CLI ended without a result ({exit}){stderr}"),
        ));
    };
    let errors = r.error_texts();
    if r.subtype == "error_max_structured_output_retries" {
        return Err(AdapterError::new(
            ErrorCode::OutputInvalid,
            format!("the agent could not produce structured output that satisfies the {} schema after the CLI's retries: {}", role.as_str(), errors.join("; ")),
        ));
    }
    if r.subtype != "success" || r.is_error {
        let text = r
            .result
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| format!("; result: {t}"))
            .unwrap_or_default();
        return Err(AdapterError::new(
            ErrorCode::AgentFailed,
            format!(
                "the agent failed: subtype {}{}, errors [{}] ({exit}){text}{stderr}",
                r.subtype,
                if r.is_error { ", is_error" } else { "" },
                errors.join("; ")
            ),
        ));
    }
    let Some(out) = r.structured_output else {
        // After a follow-up the agent may answer with text only: its output is then still the
        // one it was asked to correct, and the rules that one breaks are the reason it failed.
        let broken = end
            .sent_back
            .as_ref()
            .and_then(|o| semantic::check(facts, o).err());
        return Err(match broken {
            Some(violations) => AdapterError::new(
                ErrorCode::OutputInvalid,
                format!(
                    "the agent ended follow-up turn {} without new structured output; its last structured output breaks the {} output rules: {}",
                    end.follow_ups,
                    role.as_str(),
                    violations.join("; ")
                ),
            ),
            None => AdapterError::new(ErrorCode::OutputInvalid, "the agent finished without structured output (it never called the StructuredOutput tool)"),
        });
    };
    schema::validate(role, &out).map_err(|violations| {
        AdapterError::new(
            ErrorCode::OutputInvalid,
            format!(
                "the structured output fails the {} schema: {}",
                role.as_str(),
                violations.join("; ")
            ),
        )
    })?;
    semantic::check(facts, &out).map_err(|violations| {
        AdapterError::new(
            ErrorCode::OutputInvalid,
            format!(
                "the structured output breaks the {} output rules after {} follow-up turn(s): {}",
                role.as_str(),
                end.follow_ups,
                violations.join("; ")
            ),
        )
    })?;
    Ok(out)
}

/// The Implementor's validated output with its `patch` (before `summary`, as the contract
/// orders it): the patch for `completed` (read with `work`, whose failure is the result:
/// `ERR_EXTRACT`, or the stop; empty → `ERR_EMPTY_PATCH`), else `null`. The patch is also
/// written beside the transcript.
pub async fn with_patch(
    output: Value,
    work: impl Future<Output = Result<String>>,
    transcript: Option<&Transcript>,
    warn: impl Fn(&str, Value),
) -> Result<Value> {
    let completed = output.get("outcome").and_then(Value::as_str) == Some("completed");
    let patch = if completed {
        let patch = work.await?;
        if patch.is_empty() {
            return Err(AdapterError::new(
                ErrorCode::EmptyPatch,
                "the implementor reported outcome 'completed' but changed nothing relative to the base commit",
            ));
        }
        if let Some(t) = transcript {
            let path = t.path().with_extension("patch");
            if let Err(e) = std::fs::write(&path, &patch) {
                warn(
                    "could not write the patch next to the transcript",
                    json!({ "path": path.display().to_string(), "error": e.to_string() }),
                );
            }
        }
        Value::String(patch)
    } else {
        Value::Null
    };
    let Value::Object(map) = output else {
        return Ok(output);
    };
    let mut with_patch = serde_json::Map::new();
    for (k, v) in map {
        if k == "summary" {
            with_patch.insert("patch".into(), patch.clone());
        }
        with_patch.insert(k, v);
    }
    with_patch.entry("patch").or_insert(patch);
    Ok(Value::Object(with_patch))
}

/// The largest patch saved of a run that did not finish (beside the transcript, in the stats):
/// a session stopped at its disk bound may have written that much, and more would not fit a
/// JS string (V8 holds 512 MiB) nor be opened by a person. A larger one is saved bounded.
const MAX_SAVED_PATCH: usize = 256 << 20;

/// `patch` cut to at most `max` bytes at file sections (`diff --git` lines), in order, so what
/// is kept still applies; the paths of the sections left out.
fn bounded(patch: String, max: usize) -> (String, Vec<String>) {
    if patch.len() <= max {
        return (patch, Vec::new());
    }
    let mut starts: Vec<usize> = patch
        .match_indices("\ndiff --git ")
        .map(|(i, _)| i + 1)
        .collect();
    if patch.starts_with("diff --git ") {
        starts.insert(0, 0);
    }
    starts.push(patch.len());
    let mut kept = 0;
    let mut left_out = Vec::new();
    for w in starts.windows(2) {
        let section = &patch[w[0]..w[1]];
        if left_out.is_empty() && w[1] <= max {
            kept = w[1];
            continue;
        }
        let header = section.lines().next().unwrap_or_default();
        let path = header
            .strip_prefix("diff --git a/")
            .and_then(|rest| rest.split(" b/").next())
            .unwrap_or(header);
        left_out.push(path.to_string());
    }
    let mut patch = patch;
    patch.truncate(kept);
    (patch, left_out)
}

/// A run that ends without a patch in its result (failed, cancelled, timed out, blocked) may
/// still have changed files: returns them (read with `work`) as a patch (empty when there are
/// none or they cannot be read) and, with logging on, keeps them next to the transcript before
/// the worktree goes, so an operator can recover the agent's work.
pub async fn salvage_patch(
    work: impl Future<Output = Result<String>>,
    t: Option<&Transcript>,
    warn: impl Fn(&str, Value),
) -> String {
    let p = match work.await {
        Ok(p) => p,
        Err(e) => {
            warn(
                "could not read the worktree's changes before cleanup",
                json!({ "error": e.to_string() }),
            );
            return String::new();
        }
    };
    let (p, left_out) = bounded(p, MAX_SAVED_PATCH);
    if !left_out.is_empty() {
        let shown = left_out
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let said = format!(
            "the worktree's changes came to more than {} MiB: saved bounded, whole files only, \
             without {} file(s): {shown}{}",
            MAX_SAVED_PATCH >> 20,
            left_out.len(),
            if left_out.len() > 20 { ", …" } else { "" }
        );
        if let Some(t) = t {
            t.note("patch", &said);
        }
        warn(&said, json!({ "leftOut": left_out.len() }));
    }
    if let Some(t) = t.filter(|_| !p.is_empty()) {
        let path = t.path().with_extension("patch");
        match std::fs::write(&path, &p) {
            Ok(()) => t.note(
                "patch",
                &format!("the worktree's changes were saved to {}", path.display()),
            ),
            Err(e) => warn(
                "could not save the worktree's changes next to the transcript",
                json!({ "path": path.display().to_string(), "error": e.to_string() }),
            ),
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::RunStats;

    #[test]
    fn a_huge_patch_is_kept_bounded_at_whole_files_naming_those_left_out() {
        let section = |p: &str, n: usize| {
            format!(
                "diff --git a/{p} b/{p}\nnew file mode 100644\n{}",
                "+x\n".repeat(n)
            )
        };
        let patch = [
            section("a.txt", 10),
            section("big.bin", 1000),
            section("c.txt", 10),
        ]
        .concat();
        let (kept, left) = bounded(patch.clone(), patch.len());
        assert_eq!((kept.len(), left.len()), (patch.len(), 0));
        let (kept, left) = bounded(patch.clone(), 200);
        assert_eq!(kept, section("a.txt", 10));
        assert_eq!(left, ["big.bin", "c.txt"]);
        let (kept, left) = bounded(patch, 10);
        assert_eq!((kept.as_str(), left.len()), ("", 3));
    }

    fn planner_facts() -> Facts {
        Facts::Planner {
            work_items: ["7".to_string()].into(),
        }
    }

    fn end(structured_output: Option<Value>, sent_back: Option<Value>) -> SessionEnd {
        SessionEnd {
            result: Some(ResultMessage {
                subtype: "success".into(),
                structured_output,
                ..ResultMessage::default()
            }),
            exit: None,
            stderr_tail: String::new(),
            stopped: None,
            pid: 0,
            stats: RunStats::default(),
            follow_ups: u32::from(sent_back.is_some()),
            sent_back,
        }
    }

    #[test]
    fn text_only_after_a_follow_up_names_the_rules_the_last_output_breaks() {
        let bad = json!({"role": "planner", "create": [], "close": ["99"], "update": []});
        let err = evaluate(Role::Planner, &planner_facts(), end(None, Some(bad))).unwrap_err();
        assert_eq!(err.code, ErrorCode::OutputInvalid);
        assert!(
            err.message
                .contains("ended follow-up turn 1 without new structured output"),
            "{}",
            err.message
        );
        assert!(
            err.message
                .contains(r#"close[0] "99" is not a work item in the engine state"#),
            "{}",
            err.message
        );
    }

    #[test]
    fn no_structured_output_without_a_follow_up_says_it_was_never_given() {
        let err = evaluate(Role::Planner, &planner_facts(), end(None, None)).unwrap_err();
        assert_eq!(err.code, ErrorCode::OutputInvalid);
        assert!(
            err.message
                .contains("never called the StructuredOutput tool"),
            "{}",
            err.message
        );
    }
}
