//! The CLI's stream-json protocol: one JSON object per line in both directions. Readers are
//! lenient (unknown message types pass through as `Other`) because the protocol is not formally
//! versioned; writers produce exactly what the official SDK sends.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::stats::RunStats;

/// One line the CLI wrote, classified.
#[derive(Debug)]
pub enum Inbound {
    /// The answer to one of our control requests (`initialize`, `interrupt`).
    ControlResponse {
        request_id: String,
        outcome: std::result::Result<Value, String>,
    },
    /// A request from the CLI to us (`hook_callback`, …).
    ControlRequest {
        request_id: String,
        request: Value,
    },
    /// `system` with subtype `init`: session id, cwd, tools, model.
    SystemInit(Value),
    System(Value),
    /// One assistant content block (the CLI sends one message per block).
    Assistant(Value),
    User(Value),
    Result(Box<ResultMessage>),
    Other(Value),
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct ResultMessage {
    #[serde(default)]
    pub subtype: String,
    #[serde(default)]
    pub is_error: bool,
    #[serde(default)]
    pub structured_output: Option<Value>,
    #[serde(default)]
    pub errors: Vec<Value>,
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub num_turns: Option<u64>,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub total_cost_usd: Option<f64>,
    #[serde(default)]
    pub usage: Option<Value>,
    /// Cumulative per-model token and cost totals of the whole session.
    #[serde(default, rename = "modelUsage")]
    pub model_usage: Option<Value>,
    #[serde(default)]
    pub stop_reason: Option<String>,
}

impl ResultMessage {
    /// Adds this result's accounting (turns, cost, tokens) to `stats`.
    pub fn add_to(&self, stats: &mut RunStats) {
        stats.add_result(
            self.num_turns,
            self.total_cost_usd,
            self.usage.as_ref(),
            self.model_usage.as_ref(),
        );
    }

    /// `errors[]` as text (entries are strings in practice; anything else is shown as JSON).
    pub fn error_texts(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect()
    }
}

pub fn parse_line(line: &[u8]) -> std::result::Result<Inbound, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
    Ok(match kind {
        "control_response" => {
            let response = value.get("response").cloned().unwrap_or(Value::Null);
            let request_id = str_field(&response, "request_id");
            let outcome = if response.get("subtype").and_then(Value::as_str) == Some("success") {
                Ok(response.get("response").cloned().unwrap_or(Value::Null))
            } else {
                Err(response
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("control request failed")
                    .to_string())
            };
            Inbound::ControlResponse {
                request_id,
                outcome,
            }
        }
        "control_request" => Inbound::ControlRequest {
            request_id: str_field(&value, "request_id"),
            request: value.get("request").cloned().unwrap_or(Value::Null),
        },
        "system" if value.get("subtype").and_then(Value::as_str) == Some("init") => {
            Inbound::SystemInit(value)
        }
        "system" => Inbound::System(value),
        // The CLI reports API errors as a synthetic assistant message too; that is not the
        // agent's text (the error itself arrives in the result).
        "assistant" if value.get("is_api_error_message").and_then(Value::as_bool) == Some(true) => {
            Inbound::Other(value)
        }
        "assistant" => Inbound::Assistant(value),
        "user" => Inbound::User(value),
        "result" => match serde_json::from_value::<ResultMessage>(value.clone()) {
            Ok(r) => Inbound::Result(Box::new(r)),
            Err(_) => Inbound::Other(value),
        },
        _ => Inbound::Other(value),
    })
}

fn str_field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A content block of an assistant message, as far as the adapter cares.
pub enum Block<'a> {
    Text(&'a str),
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    Other,
}

/// The content blocks of an `assistant` or `user` message (none when it has no array).
fn content_blocks(message: &Value) -> &[Value] {
    message
        .pointer("/message/content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

pub fn assistant_blocks(message: &Value) -> Vec<Block<'_>> {
    content_blocks(message)
        .iter()
        .map(|b| match b.get("type").and_then(Value::as_str) {
            Some("text") => Block::Text(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => Block::ToolUse {
                id: b.get("id").and_then(Value::as_str).unwrap_or(""),
                name: b.get("name").and_then(Value::as_str).unwrap_or(""),
                input: b.get("input").unwrap_or(&Value::Null),
            },
            _ => Block::Other,
        })
        .collect()
}

/// A tool call's result, as the model got it in a `user` message.
#[derive(Debug, PartialEq)]
pub struct ToolResult<'a> {
    pub tool_use_id: &'a str,
    /// Its text; blocks that are not text (an image, …) as `[type]`.
    pub content: String,
    pub is_error: bool,
}

/// The `tool_result` blocks of a `user` message (the CLI sends one per tool call; its own
/// `tool_use_result` summary is not what the model saw, so it is not used).
pub fn tool_results(message: &Value) -> Vec<ToolResult<'_>> {
    content_blocks(message)
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        .map(|b| ToolResult {
            tool_use_id: b.get("tool_use_id").and_then(Value::as_str).unwrap_or(""),
            content: tool_result_text(b.get("content").unwrap_or(&Value::Null)),
            is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
        })
        .collect()
}

/// A `tool_result`'s content is a string or a list of blocks.
fn tool_result_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                Some(other) => format!("[{other}]"),
                None => b.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub const BASH_HOOK_ID: &str = "hook_0";
/// The PreToolUse hook of the CLI's file-writing tools, answered by the adapter itself.
pub const FILE_HOOK_ID: &str = "hook_1";
/// The CLI's tools that write files from its own process (outside the OS sandbox), and the
/// input field naming the file each writes (verified on the pinned 2.1.330).
const FILE_TOOLS: &[(&str, &str)] = &[
    ("Write", "file_path"),
    ("Edit", "file_path"),
    ("MultiEdit", "file_path"),
    ("NotebookEdit", "notebook_path"),
];
/// Their matcher: the CLI reads a `|`-separated list of names as exact tool names.
const FILE_TOOLS_MATCHER: &str = "Write|Edit|MultiEdit|NotebookEdit";

/// The file a file-writing tool call would write, or why it cannot be told (an unknown tool,
/// a missing or non-string path): the caller blocks then.
pub fn file_tool_target<'a>(
    tool_name: &str,
    tool_input: &'a Value,
) -> std::result::Result<&'a str, String> {
    let Some((_, field)) = FILE_TOOLS.iter().find(|(name, _)| *name == tool_name) else {
        return Err(format!(
            "{tool_name:?} is not a file tool the adapter knows"
        ));
    };
    match tool_input.get(field) {
        Some(Value::String(path)) => Ok(path),
        Some(other) => Err(format!("its {field} is not a string: {other}")),
        None => Err(format!("its input has no {field}")),
    }
}

/// The PreToolUse hook of the CLI's file-reading tools, answered by the adapter itself.
pub const READ_HOOK_ID: &str = "hook_2";
/// The CLI's tools that read files from its own process, the input field naming what each
/// reads, and whether that is a tree it searches rather than one file (verified on the pinned
/// 2.1.330: Glob's and Grep's `path` is optional and defaults to the cwd; the CLI has no
/// NotebookRead tool, Read reads notebooks).
const READ_TOOLS: &[(&str, &str, bool)] = &[
    ("Read", "file_path", false),
    ("Glob", "path", true),
    ("Grep", "path", true),
];
const READ_TOOLS_MATCHER: &str = "Read|Glob|Grep";

/// What a file-reading tool call would read; relative paths are against the session's cwd.
#[derive(Debug, PartialEq)]
pub enum ReadTarget {
    File(PathBuf),
    /// The trees it searches (first the one its input names, or the cwd).
    Search(Vec<PathBuf>),
}

/// What a file-reading tool call would read, or why it cannot be told (the caller blocks then).
/// A Glob pattern's literal leading directories count as a searched tree: the CLI searches
/// there instead of `path` when the pattern is absolute.
pub fn read_tool_target(
    tool_name: &str,
    tool_input: &Value,
) -> std::result::Result<ReadTarget, String> {
    let Some(&(_, field, search)) = READ_TOOLS.iter().find(|(name, ..)| *name == tool_name) else {
        return Err(format!(
            "{tool_name:?} is not a read tool the adapter knows"
        ));
    };
    let named = match tool_input.get(field) {
        Some(Value::String(path)) => path.as_str(),
        None if search => ".",
        Some(other) => return Err(format!("its {field} is not a string: {other}")),
        None => return Err(format!("its input has no {field}")),
    };
    if !search {
        return Ok(ReadTarget::File(PathBuf::from(named)));
    }
    let root = PathBuf::from(named);
    let mut trees = vec![root.clone()];
    if tool_name == "Glob" {
        let Some(pattern) = tool_input.get("pattern").and_then(Value::as_str) else {
            return Err("its pattern is not a string".to_string());
        };
        let base = glob_base(pattern);
        if !base.is_empty() {
            trees.push(root.join(base));
        }
    }
    Ok(ReadTarget::Search(trees))
}

/// The directories a glob pattern names literally: up to the last `/` before its first
/// wildcard, as the CLI splits an absolute pattern into a search dir and a relative pattern.
fn glob_base(pattern: &str) -> &str {
    let literal = &pattern[..pattern.find(['*', '?', '[', '{']).unwrap_or(pattern.len())];
    match literal.rfind('/') {
        Some(0) => "/",
        Some(i) => &pattern[..i],
        None => "",
    }
}

/// The `initialize` control request: the PreToolUse hooks (Bash → the engine's validator; the
/// file-writing tools → the adapter's write scope; the file-reading tools → its read guard),
/// each registered with `onFailure: "block"`
/// (without it an error answer fails OPEN), the schema, a minimal base system prompt, and the
/// inline agent definition.
pub fn initialize(request_id: &str, role: &str, agent: &Value, schema: &Value) -> Value {
    json!({
        "type": "control_request",
        "request_id": request_id,
        "request": {
            "subtype": "initialize",
            "hooks": {
                "PreToolUse": [{
                    "matcher": "Bash",
                    "hookCallbackIds": [BASH_HOOK_ID],
                    "onFailure": "block",
                }, {
                    "matcher": FILE_TOOLS_MATCHER,
                    "hookCallbackIds": [FILE_HOOK_ID],
                    "onFailure": "block",
                }, {
                    "matcher": READ_TOOLS_MATCHER,
                    "hookCallbackIds": [READ_HOOK_ID],
                    "onFailure": "block",
                }]
            },
            "jsonSchema": schema,
            "systemPrompt": [""],
            "agents": { role: agent },
        }
    })
}

pub fn user_message(prompt: &str) -> Value {
    json!({
        "type": "user",
        "session_id": "",
        "message": {"role": "user", "content": [{"type": "text", "text": prompt}]},
        "parent_tool_use_id": null,
    })
}

pub fn interrupt(request_id: &str) -> Value {
    json!({"type": "control_request", "request_id": request_id, "request": {"subtype": "interrupt"}})
}

pub fn success_response(request_id: &str, response: Value) -> Value {
    json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": response}
    })
}

pub fn error_response(request_id: &str, error: &str) -> Value {
    json!({
        "type": "control_response",
        "response": {"subtype": "error", "request_id": request_id, "error": error}
    })
}

/// Hook answer that lets the command run.
pub fn hook_allow() -> Value {
    json!({"continue": true})
}

/// Hook answer that blocks the command, in the current documented `hookSpecificOutput` form.
pub fn hook_deny(reason: &str) -> Value {
    json!({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_response_success_and_error_are_told_apart() {
        let ok = parse_line(br#"{"type":"control_response","response":{"subtype":"success","request_id":"r1","response":{"pid":1}}}"#).unwrap();
        assert!(
            matches!(ok, Inbound::ControlResponse { ref request_id, outcome: Ok(_) } if request_id == "r1")
        );
        let err = parse_line(br#"{"type":"control_response","response":{"subtype":"error","request_id":"r2","error":"bad"}}"#).unwrap();
        assert!(matches!(err, Inbound::ControlResponse { outcome: Err(ref e), .. } if e == "bad"));
    }

    #[test]
    fn result_keeps_structured_output_and_errors() {
        let r = parse_line(br#"{"type":"result","subtype":"error_max_turns","is_error":true,"errors":["too many"],"structured_output":{"a":1}}"#).unwrap();
        let Inbound::Result(r) = r else {
            panic!("not a result")
        };
        assert_eq!(r.subtype, "error_max_turns");
        assert_eq!(r.error_texts(), vec!["too many".to_string()]);
        assert_eq!(r.structured_output, Some(json!({"a": 1})));
    }

    #[test]
    fn result_accounting_reaches_the_stats() {
        let line = br#"{"type":"result","subtype":"success","num_turns":2,"total_cost_usd":0.25,"usage":{"input_tokens":9},"modelUsage":{"m":{"inputTokens":100,"outputTokens":7}}}"#;
        let Inbound::Result(r) = parse_line(line).unwrap() else {
            panic!("not a result")
        };
        let mut stats = RunStats::default();
        r.add_to(&mut stats);
        let s = stats.finish(0, None);
        assert_eq!((s.turns, s.cost_usd), (Some(2), Some(0.25)));
        assert_eq!(s.tokens.map(|t| (t.input, t.output)), Some((100, 7)));
        assert_eq!(s.model.as_deref(), Some("m"));
    }

    #[test]
    fn synthetic_api_error_messages_are_not_assistant_text() {
        let m = parse_line(br#"{"type":"assistant","is_api_error_message":true,"message":{"model":"<synthetic>","content":[{"type":"text","text":"API Error: 500"}]}}"#).unwrap();
        assert!(matches!(m, Inbound::Other(_)));
    }

    #[test]
    fn file_tools_name_their_target_and_anything_odd_is_refused() {
        let w = json!({"file_path": "/a/b.txt", "content": "x"});
        assert_eq!(file_tool_target("Write", &w), Ok("/a/b.txt"));
        assert_eq!(file_tool_target("Edit", &w), Ok("/a/b.txt"));
        assert_eq!(file_tool_target("MultiEdit", &w), Ok("/a/b.txt"));
        let nb = json!({"notebook_path": "/n.ipynb", "new_source": ""});
        assert_eq!(file_tool_target("NotebookEdit", &nb), Ok("/n.ipynb"));
        assert!(file_tool_target("NotebookEdit", &w).is_err());
        assert!(file_tool_target("Write", &json!({"file_path": 7})).is_err());
        assert!(file_tool_target("Write", &Value::Null).is_err());
        assert!(file_tool_target("Bash", &json!({"command": "ls"})).is_err());
    }

    #[test]
    fn every_file_tool_is_in_the_matcher_and_both_hooks_block_on_failure() {
        let init = initialize("r", "implementor", &json!({}), &json!({}));
        let hooks = init.pointer("/request/hooks/PreToolUse").unwrap();
        let file = hooks
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["hookCallbackIds"][0] == FILE_HOOK_ID)
            .unwrap();
        let names: Vec<&str> = file["matcher"].as_str().unwrap().split('|').collect();
        assert_eq!(
            names,
            FILE_TOOLS.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        );
        assert!(hooks
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["onFailure"] == "block"));
        let read = hooks
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["hookCallbackIds"][0] == READ_HOOK_ID)
            .unwrap();
        let names: Vec<&str> = read["matcher"].as_str().unwrap().split('|').collect();
        assert_eq!(
            names,
            READ_TOOLS.iter().map(|(n, ..)| *n).collect::<Vec<_>>()
        );
    }

    #[test]
    fn read_tools_name_the_file_or_the_trees_they_search() {
        let p = |s: &str| PathBuf::from(s);
        let read = json!({"file_path": "/h/.ssh/id_rsa"});
        assert_eq!(
            read_tool_target("Read", &read),
            Ok(ReadTarget::File(p("/h/.ssh/id_rsa")))
        );
        let grep = json!({"pattern": "SECRET", "path": "/h", "glob": "*"});
        assert_eq!(
            read_tool_target("Grep", &grep),
            Ok(ReadTarget::Search(vec![p("/h")]))
        );
        // No path: the cwd.
        assert_eq!(
            read_tool_target("Grep", &json!({"pattern": "x"})),
            Ok(ReadTarget::Search(vec![p(".")]))
        );
        assert_eq!(
            read_tool_target("Glob", &json!({"pattern": "**/*.rs"})),
            Ok(ReadTarget::Search(vec![p(".")]))
        );
        // An absolute pattern searches its own leading directories.
        assert_eq!(
            read_tool_target("Glob", &json!({"pattern": "/h/.ssh/*", "path": "/r"})),
            Ok(ReadTarget::Search(vec![p("/r"), p("/h/.ssh")]))
        );
        assert_eq!(
            read_tool_target("Glob", &json!({"pattern": "/*/x"})),
            Ok(ReadTarget::Search(vec![p("."), p("/")]))
        );
        assert_eq!(
            read_tool_target("Glob", &json!({"pattern": "../../.ssh/id_*"})),
            Ok(ReadTarget::Search(vec![p("."), p("./../../.ssh")]))
        );
    }

    #[test]
    fn read_tools_with_odd_input_are_refused() {
        assert!(read_tool_target("Read", &json!({"path": "/a"})).is_err());
        assert!(read_tool_target("Read", &json!({"file_path": 7})).is_err());
        assert!(read_tool_target("Grep", &json!({"pattern": "x", "path": null})).is_err());
        assert!(read_tool_target("Glob", &json!({"path": "/a"})).is_err());
        assert!(read_tool_target("Write", &json!({"file_path": "/a"})).is_err());
        assert!(read_tool_target("Read", &Value::Null).is_err());
    }

    #[test]
    fn tool_results_keep_their_id_text_and_error_flag() {
        let m = json!({"type":"user","message":{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"t1","content":"out\n","is_error":false},
            {"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"a"},{"type":"image","source":{}},{"type":"text","text":"b"}],"is_error":true},
            {"type":"tool_result","tool_use_id":"t3"},
            {"type":"text","text":"not a result"}
        ]},"tool_use_result":{"stdout":"ignored"}});
        let r = tool_results(&m);
        let expect = |id, content: &str, is_error| ToolResult {
            tool_use_id: id,
            content: content.to_string(),
            is_error,
        };
        assert_eq!(
            r,
            vec![
                expect("t1", "out\n", false),
                expect("t2", "a\n[image]\nb", true),
                expect("t3", "", false),
            ]
        );
        assert!(tool_results(&json!({"type":"user","message":{"content":"plain"}})).is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(parse_line(b"not json").is_err());
    }

    #[test]
    fn only_text_blocks_are_text() {
        let m = json!({"type":"assistant","message":{"content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}},{"type":"thinking","thinking":"x"}]}});
        let blocks = assistant_blocks(&m);
        assert!(matches!(blocks[0], Block::Text("hi")));
        assert!(matches!(
            blocks[1],
            Block::ToolUse {
                id: "t1",
                name: "Bash",
                ..
            }
        ));
        assert!(matches!(blocks[2], Block::Other));
    }
}
