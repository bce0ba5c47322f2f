//! The data the adapter exchanges with the engine (specs 002 and 004): start params, the
//! engine state it reads, provider data, and review history. Napi-free; the binding converts.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Planner,
    Implementor,
    Reviewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Planner => "planner",
            Role::Implementor => "implementor",
            Role::Reviewer => "reviewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "planner" => Some(Role::Planner),
            "implementor" => Some(Role::Implementor),
            "reviewer" => Some(Role::Reviewer),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartParams {
    Planner {
        spec_paths: Vec<String>,
    },
    Implementor {
        work_item_id: String,
        branch_name: String,
    },
    Reviewer {
        work_item_id: String,
        revision_id: String,
    },
}

impl StartParams {
    pub fn role(&self) -> Role {
        match self {
            StartParams::Planner { .. } => Role::Planner,
            StartParams::Implementor { .. } => Role::Implementor,
            StartParams::Reviewer { .. } => Role::Reviewer,
        }
    }

    pub fn work_item_id(&self) -> Option<&str> {
        match self {
            StartParams::Planner { .. } => None,
            StartParams::Implementor { work_item_id, .. }
            | StartParams::Reviewer { work_item_id, .. } => Some(work_item_id),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkItem {
    pub id: String,
    pub title: String,
    pub status: String,
    pub linked_revision: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PipelineStatus {
    Pending,
    Success,
    Failure,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    pub status: PipelineStatus,
    pub url: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    pub id: String,
    pub title: String,
    pub pipeline: Option<Pipeline>,
}

/// What the adapter reads of the engine's state. Entries keep the order the engine gave
/// (a JS `Map`'s insertion order or an object's key order), so prompts are stable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineState {
    pub work_items: Vec<(String, WorkItem)>,
    pub revisions: Vec<(String, Revision)>,
    pub last_planned_shas: Vec<(String, String)>,
}

impl EngineState {
    pub fn work_item(&self, id: &str) -> Option<&WorkItem> {
        self.work_items
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, v)| v)
    }

    pub fn revision(&self, id: &str) -> Option<&Revision> {
        self.revisions.iter().find(|(k, _)| k == id).map(|(_, v)| v)
    }

    pub fn last_planned_sha(&self, path: &str) -> Option<&str> {
        self.last_planned_shas
            .iter()
            .find(|(k, _)| k == path)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionFile {
    pub path: String,
    pub status: String,
    pub patch: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewSubmission {
    pub author: String,
    pub state: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewInlineComment {
    pub path: String,
    pub line: Option<i64>,
    pub author: String,
    pub body: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewHistory {
    pub reviews: Vec<ReviewSubmission>,
    pub inline_comments: Vec<ReviewInlineComment>,
}

/// Reading the engine's data from JSON (what the binding makes of JS values), with errors that
/// name the field: `workItems["42"].title must be a string`. Keyed collections arrive either as
/// objects or as `[key, value]` pairs (a JS `Map`).
pub mod from_json {
    use super::*;
    use serde_json::Value;

    type Res<T> = std::result::Result<T, String>;

    fn string(v: &Value, path: &str) -> Res<String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{path} must be a string"))
    }

    fn opt_string(v: Option<&Value>, path: &str) -> Res<Option<String>> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{path} must be a string or null")),
        }
    }

    fn field<'a>(obj: &'a Value, key: &str, path: &str) -> Res<&'a Value> {
        match obj {
            Value::Object(m) => m.get(key).ok_or_else(|| format!("{path}.{key} is missing")),
            _ => Err(format!("{path} must be an object")),
        }
    }

    fn keyed<'a>(v: &'a Value, path: &str) -> Res<Vec<(String, &'a Value)>> {
        match v {
            Value::Object(m) => Ok(m.iter().map(|(k, v)| (k.clone(), v)).collect()),
            Value::Array(pairs) => pairs
                .iter()
                .enumerate()
                .map(|(i, p)| match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), v]) => Ok((k.clone(), v)),
                    _ => Err(format!("{path} (a Map) entry {i} must have a string key")),
                })
                .collect(),
            _ => Err(format!("{path} must be a Map or an object")),
        }
    }

    pub fn work_item(v: &Value, path: &str) -> Res<WorkItem> {
        Ok(WorkItem {
            id: string(field(v, "id", path)?, &format!("{path}.id"))?,
            title: string(field(v, "title", path)?, &format!("{path}.title"))?,
            status: string(field(v, "status", path)?, &format!("{path}.status"))?,
            linked_revision: opt_string(
                v.get("linkedRevision"),
                &format!("{path}.linkedRevision"),
            )?,
        })
    }

    pub fn revision(v: &Value, path: &str) -> Res<Revision> {
        let pipeline = match v.get("pipeline") {
            None | Some(Value::Null) => None,
            Some(p) => {
                let pp = format!("{path}.pipeline");
                let status = match field(p, "status", &pp)?.as_str() {
                    Some("pending") => PipelineStatus::Pending,
                    Some("success") => PipelineStatus::Success,
                    Some("failure") => PipelineStatus::Failure,
                    _ => {
                        return Err(format!(
                            "{pp}.status must be 'pending', 'success' or 'failure'"
                        ))
                    }
                };
                Some(Pipeline {
                    status,
                    url: opt_string(p.get("url"), &format!("{pp}.url"))?,
                    reason: opt_string(p.get("reason"), &format!("{pp}.reason"))?,
                })
            }
        };
        Ok(Revision {
            id: string(field(v, "id", path)?, &format!("{path}.id"))?,
            title: string(field(v, "title", path)?, &format!("{path}.title"))?,
            pipeline,
        })
    }

    pub fn engine_state(v: &Value) -> Res<EngineState> {
        if !v.is_object() {
            return Err("the state must be an object".into());
        }
        let items = keyed(field(v, "workItems", "state")?, "workItems")?;
        let revisions = keyed(field(v, "revisions", "state")?, "revisions")?;
        let shas = keyed(field(v, "lastPlannedSHAs", "state")?, "lastPlannedSHAs")?;
        Ok(EngineState {
            work_items: items
                .into_iter()
                .map(|(k, v)| work_item(v, &format!("workItems[{k:?}]")).map(|w| (k, w)))
                .collect::<Res<_>>()?,
            revisions: revisions
                .into_iter()
                .map(|(k, v)| revision(v, &format!("revisions[{k:?}]")).map(|r| (k, r)))
                .collect::<Res<_>>()?,
            last_planned_shas: shas
                .into_iter()
                .map(|(k, v)| string(v, &format!("lastPlannedSHAs[{k:?}]")).map(|s| (k, s)))
                .collect::<Res<_>>()?,
        })
    }

    pub fn revision_files(v: &Value) -> Res<Vec<RevisionFile>> {
        let arr = v
            .as_array()
            .ok_or("the result must be an array of RevisionFile")?;
        arr.iter()
            .enumerate()
            .map(|(i, f)| {
                let p = format!("[{i}]");
                Ok(RevisionFile {
                    path: string(field(f, "path", &p)?, &format!("{p}.path"))?,
                    status: string(field(f, "status", &p)?, &format!("{p}.status"))?,
                    patch: opt_string(f.get("patch"), &format!("{p}.patch"))?,
                })
            })
            .collect()
    }

    pub fn review_history(v: &Value) -> Res<ReviewHistory> {
        let reviews = field(v, "reviews", "result")?
            .as_array()
            .ok_or("result.reviews must be an array")?;
        let comments = field(v, "inlineComments", "result")?
            .as_array()
            .ok_or("result.inlineComments must be an array")?;
        Ok(ReviewHistory {
            reviews: reviews
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let p = format!("reviews[{i}]");
                    Ok(ReviewSubmission {
                        author: string(field(r, "author", &p)?, &format!("{p}.author"))?,
                        state: string(field(r, "state", &p)?, &format!("{p}.state"))?,
                        body: string(field(r, "body", &p)?, &format!("{p}.body"))?,
                    })
                })
                .collect::<Res<_>>()?,
            inline_comments: comments
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let p = format!("inlineComments[{i}]");
                    let line = match c.get("line") {
                        None | Some(Value::Null) => None,
                        Some(Value::Number(n)) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                            n.as_f64().map(|f| f as i64)
                        }
                        Some(_) => return Err(format!("{p}.line must be an integer or null")),
                    };
                    Ok(ReviewInlineComment {
                        path: string(field(c, "path", &p)?, &format!("{p}.path"))?,
                        line,
                        author: string(field(c, "author", &p)?, &format!("{p}.author"))?,
                        body: string(field(c, "body", &p)?, &format!("{p}.body"))?,
                    })
                })
                .collect::<Res<_>>()?,
        })
    }
}

/// What a start request carries beside the role's params.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    /// The engine's own id for the session (any non-empty string).
    pub session_id: Option<String>,
    /// Model for this dispatch; wins over `config.model` and the agent definition's.
    pub model: Option<String>,
    /// `maxBudgetUsd` for this session, in USD; wins over `config.maxBudgetUsd` (`Some(0.0)`:
    /// no budget for this one).
    pub max_budget_usd: Option<f64>,
    /// The engine's W3C `traceparent`: the session's trace continues the engine's (checked
    /// with [`crate::otel::parse_traceparent`]).
    pub traceparent: Option<String>,
}

impl StartParams {
    /// Start params as the engine passes them, checked per role. Errors name the field.
    pub fn from_json(
        v: &serde_json::Value,
    ) -> std::result::Result<(StartParams, StartOptions), String> {
        use serde_json::Value;
        let obj = v.as_object().ok_or("params must be an object")?;
        let s = |key: &str| -> std::result::Result<String, String> {
            match obj.get(key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(Value::String(_)) => Err(format!("params.{key} must not be empty")),
                None | Some(Value::Null) => Err(format!("params.{key} is required")),
                Some(_) => Err(format!("params.{key} must be a string")),
            }
        };
        let optional = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(v)) if !v.trim().is_empty() => Ok(Some(v.clone())),
            Some(_) => Err(format!(
                "params.{key} must be a non-empty string when given"
            )),
        };
        let options = StartOptions {
            session_id: optional("sessionID")?,
            model: optional("model")?,
            max_budget_usd: budget_param(obj.get("maxBudgetUsd"))?,
            traceparent: optional("traceparent")?,
        };
        if let Some(tp) = &options.traceparent {
            crate::otel::parse_traceparent(tp)?;
        }
        let params = match obj.get("role").and_then(Value::as_str) {
            Some("planner") => {
                let paths = match obj.get("specPaths") {
                    Some(Value::Array(a)) => a
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            p.as_str()
                                .map(str::to_string)
                                .ok_or(format!("params.specPaths[{i}] must be a string"))
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                    _ => return Err("params.specPaths must be an array of paths".into()),
                };
                StartParams::Planner { spec_paths: paths }
            }
            Some("implementor") => StartParams::Implementor {
                work_item_id: s("workItemID")?,
                branch_name: s("branchName")?,
            },
            Some("reviewer") => StartParams::Reviewer {
                work_item_id: s("workItemID")?,
                revision_id: s("revisionID")?,
            },
            other => {
                return Err(format!(
                    "params.role must be 'planner', 'implementor' or 'reviewer' (got {})",
                    other
                        .map(|r| format!("{r:?}"))
                        .unwrap_or_else(|| "no role".into())
                ))
            }
        };
        Ok((params, options))
    }
}

/// `params.maxBudgetUsd`: absent, or USD in `[0, MAX_BUDGET_USD]` (NaN and ±Infinity arrive as
/// their names, see `binding::js`, and are refused with the rest).
fn budget_param(v: Option<&serde_json::Value>) -> std::result::Result<Option<f64>, String> {
    use crate::spend::MAX_BUDGET_USD;
    use serde_json::Value;
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n))
            if n.as_f64()
                .is_some_and(|n| (0.0..=MAX_BUDGET_USD).contains(&n)) =>
        {
            Ok(n.as_f64())
        }
        Some(other) => {
            let got = match other {
                Value::String(s) if matches!(s.as_str(), "NaN" | "inf" | "-inf") => {
                    s.replace("inf", "Infinity")
                }
                other => other.to_string(),
            };
            Err(format!(
                "params.maxBudgetUsd must be a number in [0, {MAX_BUDGET_USD}] (0: no budget) (got {got})"
            ))
        }
    }
}
