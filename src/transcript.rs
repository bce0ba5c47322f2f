//! The human-readable session log (spec: Agent Session Logging):
//! `{logsDir}/{epochMillis}-{role}[-{workItemID}].log`. Each entry is written straight to the
//! file (no user-space buffer), so a crash leaves a readable partial log. The footer is written
//! only once the outcome is known — after validation — so a log never claims success for a run
//! that failed. A log that cannot be written never affects the session: the first failure is
//! reported to the caller's warn hook and logging stops.
//!
//! Besides the spec's entries it records each tool call's result as the model saw it (bounded),
//! since a failed run cannot be understood without what its commands printed. Secrets the adapter
//! knows of are never written: see [`secrets_in`].

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::claude::command;
use crate::claude::protocol::ResultMessage;
use crate::clock::now_ms;
use crate::deps::HookDecision;
use crate::domain::StartParams;
use crate::logging::iso8601;
use crate::sandbox::{is_credential_var, telemetry};

/// Bytes of a tool result written to the transcript; its total size is written too. Enough for
/// a command's error or a test failure's summary, while a `cat` of a large file stays small.
const TOOL_RESULT_SHOWN: usize = 4 * 1024;
/// Shorter values are not treated as secrets: redacting `1`, `true` or `prod` everywhere would
/// mangle the log, and no real key or token is that short.
const MIN_SECRET_LEN: usize = 8;
/// What a secret is replaced with.
const REDACTED: &str = "[REDACTED]";

pub struct Transcript {
    path: PathBuf,
    file: Mutex<Option<File>>,
    on_error: Box<dyn Fn(&str) + Send + Sync>,
    /// Values never written (longest first), known once the CLI's environment is.
    secrets: OnceLock<Vec<String>>,
    /// Tool names by tool-use id, so a result names the tool that produced it.
    tools: Mutex<HashMap<String, String>>,
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// The values of the CLI's environment the transcript must not write: every variable that
/// carries a credential by its name (the model key and auth token, `*_TOKEN`, `*_SECRET`, … —
/// the values the sandbox withholds from agent commands), and every variable that is not one
/// of the engine's allowlisted ones, which only `config.env` can add. Values shorter than
/// [`MIN_SECRET_LEN`] are left out. Longest first, so a secret containing another is replaced
/// whole.
pub fn secrets_in(env: &[(String, String)]) -> Vec<String> {
    let mut secrets: Vec<String> = env
        .iter()
        .filter(|(k, v)| {
            v.len() >= MIN_SECRET_LEN && (is_credential_var(k) || !command::env_allowed(k))
        })
        .map(|(_, v)| v.clone())
        .collect();
    // A header list's values are each a secret too (the collector's token alone may be quoted).
    secrets.extend(
        env.iter()
            .filter(|(k, _)| k.to_ascii_uppercase().ends_with("_HEADERS"))
            .flat_map(|(_, v)| telemetry::header_secrets(v))
            .filter(|v| v.len() >= MIN_SECRET_LEN),
    );
    secrets.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// `text` with every occurrence of each secret replaced by [`REDACTED`].
pub fn redact(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_string(), |t, s| t.replace(s.as_str(), REDACTED))
}

/// At most the first `limit` bytes of `text`, cut back to a character boundary.
fn bounded(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A tool result's entry: `{tool}: ok|error, {size} bytes[ (first {n} shown)]`, then the
/// (bounded) text indented on the lines below. `size` is what the model got, before redaction.
fn tool_result_entry(tool: &str, content: &str, size: usize, is_error: bool) -> String {
    let shown = bounded(content, TOOL_RESULT_SHOWN);
    let status = if is_error { "error" } else { "ok" };
    let mut head = format!("{tool}: {status}, {size} bytes");
    if shown.len() < content.len() {
        head += &format!(" (first {} shown)", shown.len());
    }
    format!("{head}\n{}", indent(shown))
}

/// What a tool was called with, as a person reads it: the command of a Bash call, the file a
/// Read, Write or Edit touched, the pattern of a Grep or Glob and where it searched, the URL of
/// a fetch. A tool without such a summary (MCP tools, ones a newer CLI adds) shows its input as
/// JSON. Contents (what a Write wrote, an Edit's strings) are left out: the file is what a
/// reader looks for, and the tool result below says what happened.
fn tool_call(name: &str, input: &Value) -> String {
    let s = |k: &str| {
        input
            .get(k)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let n = |k: &str| input.get(k).and_then(Value::as_u64);
    let items = |k: &str| input.get(k).and_then(Value::as_array).map(Vec::len);
    let within = |pattern: &str| match s("path") {
        Some(p) => format!("{name} {pattern} in {p}"),
        None => format!("{name} {pattern}"),
    };
    let summary = match name {
        // As it always was: `Bash: <command>`.
        "Bash" => s("command").map(|c| format!("Bash: {c}")),
        "Read" => s("file_path").map(|p| {
            let range = match (n("offset"), n("limit")) {
                (Some(o), Some(l)) => format!(" (from line {o}, {l} lines)"),
                (Some(o), None) => format!(" (from line {o})"),
                (None, Some(l)) => format!(" ({l} lines)"),
                (None, None) => String::new(),
            };
            format!("Read {p}{range}")
        }),
        "Write" => s("file_path").map(|p| {
            let len = s("content").map_or(0, str::len);
            format!("Write {p} ({len} bytes)")
        }),
        "Edit" => s("file_path").map(|p| {
            let all = input.get("replace_all").and_then(Value::as_bool) == Some(true);
            format!("Edit {p}{}", if all { " (every occurrence)" } else { "" })
        }),
        "MultiEdit" => {
            s("file_path").map(|p| format!("MultiEdit {p} ({} edits)", items("edits").unwrap_or(0)))
        }
        "NotebookEdit" => s("notebook_path").map(|p| format!("NotebookEdit {p}")),
        "Grep" => s("pattern").map(|pattern| {
            let mut line = within(pattern);
            for key in ["glob", "type", "output_mode"] {
                if let Some(v) = s(key) {
                    line += &format!(" {key}={v}");
                }
            }
            line
        }),
        "Glob" => s("pattern").map(within),
        "LS" => s("path").map(|p| format!("LS {p}")),
        "WebFetch" => s("url").map(|u| format!("WebFetch {u}")),
        "WebSearch" => s("query").map(|q| format!("WebSearch {q}")),
        "Task" | "Agent" => s("description").map(|d| format!("{name} {d}")),
        "TodoWrite" => items("todos").map(|k| format!("TodoWrite ({k} items)")),
        _ => None,
    };
    summary.unwrap_or_else(|| match input {
        Value::Object(o) if o.is_empty() => name.to_string(),
        Value::Null => name.to_string(),
        other => format!("{name} {other}"),
    })
}

/// A tool call's line bounded like a tool result ([`TOOL_RESULT_SHOWN`] bytes), saying so
/// when it was cut.
fn bounded_line(text: &str) -> String {
    let shown = bounded(text, TOOL_RESULT_SHOWN);
    if shown.len() == text.len() {
        return text.to_string();
    }
    format!(
        "{shown} … (first {} of {} bytes shown)",
        shown.len(),
        text.len()
    )
}

/// `{ms}-{role}[-{workItemID}]-{sessionID}.log`: the session id makes the name unique even
/// for two sessions of one role started in the same millisecond (their logs and patch files
/// would otherwise truncate each other). Ids are sanitized and capped (they come from the engine).
pub fn log_file_name(started_ms: u64, params: &StartParams, session_id: &str) -> String {
    let role = params.role().as_str();
    let sid: String = sanitize(session_id).chars().take(64).collect();
    match params.work_item_id() {
        Some(id) => {
            let wi: String = sanitize(id).chars().take(64).collect();
            format!("{started_ms}-{role}-{wi}-{sid}.log")
        }
        None => format!("{started_ms}-{role}-{sid}.log"),
    }
}

/// Work item ids come from the engine; keep them from reaching outside the logs directory.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Transcript {
    pub fn create(
        logs_dir: &Path,
        started_ms: u64,
        params: &StartParams,
        session_id: &str,
        on_error: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Transcript {
        let path = logs_dir.join(log_file_name(started_ms, params, session_id));
        let file = std::fs::create_dir_all(logs_dir).and_then(|_| File::create(&path));
        let t = Transcript {
            path: path.clone(),
            file: Mutex::new(None),
            on_error,
            secrets: OnceLock::new(),
            tools: Mutex::new(HashMap::new()),
        };
        match file {
            Ok(f) => *t.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
            Err(e) => (t.on_error)(&format!(
                "cannot create session log {}: {e}",
                path.display()
            )),
        }
        let mut header = format!(
            "=== Agent Session: {} ===\nSession ID: {session_id}\n",
            params.role().as_str()
        );
        match params {
            StartParams::Planner { spec_paths } => {
                header += &format!("Spec Paths: {}\n", spec_paths.join(", "))
            }
            StartParams::Implementor {
                work_item_id,
                branch_name,
            } => header += &format!("Work Item: {work_item_id}\nBranch: {branch_name}\n"),
            StartParams::Reviewer {
                work_item_id,
                revision_id,
            } => header += &format!("Work Item: {work_item_id}\nRevision: {revision_id}\n"),
        }
        header += &format!("Started: {}\n\n", iso8601(started_ms.into()));
        t.write(&header);
        t
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// From now on, `secrets` are replaced by [`REDACTED`] in everything written. Set once,
    /// before the CLI starts (later calls are ignored: a session runs one CLI).
    pub fn redact(&self, secrets: Vec<String>) {
        let _ = self.secrets.set(secrets);
    }

    fn write(&self, text: &str) {
        let redacted;
        let text = match self.secrets.get() {
            Some(secrets) if !secrets.is_empty() => {
                redacted = redact(text, secrets);
                redacted.as_str()
            }
            _ => text,
        };
        let mut guard = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = guard.as_mut() {
            if let Err(e) = f.write_all(text.as_bytes()) {
                *guard = None;
                drop(guard);
                (self.on_error)(&format!(
                    "cannot write session log {}: {e}; logging stopped for this session",
                    self.path.display()
                ));
            }
        }
    }

    fn entry(&self, kind: &str, text: &str) {
        let ts = iso8601(now_ms().into());
        self.write(&format!("[{ts}] [{kind}] {text}\n"));
    }

    pub fn init(&self, msg: &Value) {
        let s = |k: &str| {
            msg.get(k)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let tools = msg
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| {
                t.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        self.entry(
            "system",
            &format!("init model={} cwd={} tools=[{tools}]", s("model"), s("cwd")),
        );
    }

    pub fn text(&self, text: &str) {
        let ts = iso8601(now_ms().into());
        self.write(&format!("[{ts}] [assistant]\n{}", indent(text)));
    }

    pub fn tool_use(&self, id: &str, name: &str, input: &Value) {
        self.tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), name.to_string());
        let call = tool_call(name, input);
        // Redacted before bounding, so a secret across the cut is not half written.
        let call = match self.secrets.get() {
            Some(secrets) => redact(&call, secrets),
            None => call,
        };
        self.entry("tool_use", &bounded_line(&call));
    }

    /// What a tool call returned to the model (or its error), bounded to
    /// [`TOOL_RESULT_SHOWN`] bytes, after the secrets are redacted.
    pub fn tool_result(&self, tool_use_id: &str, content: &str, is_error: bool) {
        let name = self
            .tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tool_use_id);
        let tool = name.unwrap_or_else(|| format!("tool {tool_use_id}"));
        // Redacted before bounding, so a secret across the cut is not half written.
        let redacted = match self.secrets.get() {
            Some(secrets) => redact(content, secrets),
            None => content.to_string(),
        };
        let ts = iso8601(now_ms().into());
        let entry = tool_result_entry(&tool, &redacted, content.len(), is_error);
        self.write(&format!("[{ts}] [tool_result] {entry}"));
    }

    pub fn hook(
        &self,
        tool_name: &str,
        input: &Value,
        decision: &HookDecision,
        failure: Option<&str>,
    ) {
        let cmd = input.get("command").and_then(Value::as_str).unwrap_or("");
        let text = match (decision, failure) {
            (HookDecision::Approve, _) => format!("approved {tool_name}: {cmd}"),
            (HookDecision::Block { reason }, Some(f)) => {
                format!("blocked {tool_name} (validator failed: {f}): {cmd} — {reason}")
            }
            (HookDecision::Block { reason }, None) => {
                format!("blocked {tool_name}: {cmd} — {reason}")
            }
        };
        self.entry("hook", &text);
    }

    pub fn result(&self, r: &ResultMessage) {
        let tokens = r
            .usage
            .as_ref()
            .map(|u| {
                let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
                format!(
                    " tokens(in={} out={})",
                    n("input_tokens"),
                    n("output_tokens")
                )
            })
            .unwrap_or_default();
        self.entry(
            "result",
            &format!(
                "subtype={} is_error={} duration_ms={} cost_usd={} turns={}{tokens}",
                r.subtype,
                r.is_error,
                r.duration_ms
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "?".into()),
                r.total_cost_usd
                    .map(|c| format!("{c:.6}"))
                    .unwrap_or_else(|| "?".into()),
                r.num_turns
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "?".into()),
            ),
        );
    }

    pub fn note(&self, kind: &str, text: &str) {
        self.entry(kind, text);
    }

    /// The last entry: `completed`, `failed` or `cancelled`, and why.
    pub fn footer(&self, outcome: &str, reason: &str) {
        let ts = iso8601(now_ms().into());
        self.write(&format!(
            "\n=== Session {outcome} ===\nReason: {reason}\nEnded: {ts}\n"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::tests::env;
    use serde_json::json;

    #[test]
    fn iso8601_formats_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn log_name_has_role_sanitized_work_item_and_session_id() {
        let p = StartParams::Implementor {
            work_item_id: "../x/1".into(),
            branch_name: "b".into(),
        };
        assert_eq!(log_file_name(5, &p, "s/1"), "5-implementor-.._x_1-s_1.log");
        let p = StartParams::Planner { spec_paths: vec![] };
        assert_eq!(log_file_name(5, &p, "abc"), "5-planner-abc.log");
    }

    #[test]
    fn secrets_are_credential_variables_and_config_only_variables_of_eight_bytes_or_more() {
        let secrets = secrets_in(&env(&[
            ("ANTHROPIC_API_KEY", "sk-ant-api-key-1"),
            ("ANTHROPIC_AUTH_TOKEN", "auth-token-22"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "oauth-token-333"),
            ("DEPLOY_PASSWORD", "hunter22"),
            // Not a credential by name, but not the engine's either: only config.env sets it.
            ("DATABASE_URL", "postgres://u:p@db/x"),
            // Too short to count, however named.
            ("GITHUB_TOKEN", "abc"),
            ("FLAG", "1"),
            // The engine's allowlisted, ordinary variables are not secrets.
            ("PATH", "/usr/local/bin:/usr/bin"),
            ("HOME", "/home/engine-user"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:4000"),
            ("CLAUDE_CONFIG_DIR", "/tmp/claude-config"),
        ]));
        assert_eq!(
            secrets,
            [
                "postgres://u:p@db/x",
                "sk-ant-api-key-1",
                "oauth-token-333",
                "auth-token-22",
                "hunter22"
            ]
        );
        assert_eq!(MIN_SECRET_LEN, "hunter22".len());
    }

    #[test]
    fn an_otlp_header_lists_values_and_its_bearer_token_are_secrets_each() {
        let secrets = secrets_in(&env(&[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20collector-token-1,x-team=abc,x-api=key-12345678",
        )]));
        for s in [
            "Bearer collector-token-1",
            "collector-token-1",
            "key-12345678",
        ] {
            assert!(secrets.contains(&s.to_string()), "{s} in {secrets:?}");
        }
        assert!(!secrets.contains(&"abc".to_string()));
    }

    #[test]
    fn redaction_replaces_every_occurrence_and_a_longer_secret_whole() {
        let secrets = secrets_in(&env(&[
            ("A_TOKEN", "abcdefgh"),
            ("B_TOKEN", "abcdefgh-ijk"),
        ]));
        assert_eq!(
            redact("x abcdefgh-ijk y abcdefgh abcdefgh", &secrets),
            "x [REDACTED] y [REDACTED] [REDACTED]"
        );
        assert_eq!(redact("nothing here", &secrets), "nothing here");
        assert_eq!(redact("abcdefgh", &[]), "abcdefgh");
    }

    #[test]
    fn bounding_cuts_at_a_character_boundary() {
        assert_eq!(bounded("hello", 10), "hello");
        assert_eq!(bounded("hello", 5), "hello");
        assert_eq!(bounded("hello", 3), "hel");
        // 'é' is two bytes: a cut inside it keeps the whole characters before it.
        assert_eq!(bounded("aé", 2), "a");
        assert_eq!(bounded("", 0), "");
    }

    #[test]
    fn a_tool_result_entry_names_tool_status_and_size_and_bounds_the_text() {
        assert_eq!(
            tool_result_entry("Bash", "one\ntwo\n", 8, false),
            "Bash: ok, 8 bytes\n    one\n    two\n"
        );
        assert_eq!(
            tool_result_entry("Bash", "Exit code 3", 11, true),
            "Bash: error, 11 bytes\n    Exit code 3\n"
        );
        let big = "x".repeat(TOOL_RESULT_SHOWN + 100);
        let entry = tool_result_entry("Read", &big, big.len(), false);
        assert!(entry.starts_with(&format!(
            "Read: ok, {} bytes (first {TOOL_RESULT_SHOWN} shown)\n",
            big.len()
        )));
        assert_eq!(entry.matches('x').count(), TOOL_RESULT_SHOWN);
    }

    #[test]
    fn a_tool_call_shows_the_file_pattern_or_url_it_was_called_with() {
        let cases = [
            ("Bash", json!({"command": "git status"}), "Bash: git status"),
            (
                "Read",
                json!({"file_path": "/r/src/a.rs"}),
                "Read /r/src/a.rs",
            ),
            (
                "Read",
                json!({"file_path": "/r/a.rs", "offset": 10, "limit": 5}),
                "Read /r/a.rs (from line 10, 5 lines)",
            ),
            (
                "Write",
                json!({"file_path": "/r/new.txt", "content": "hello\n"}),
                "Write /r/new.txt (6 bytes)",
            ),
            (
                "Edit",
                json!({"file_path": "/r/a.rs", "old_string": "a", "new_string": "b"}),
                "Edit /r/a.rs",
            ),
            (
                "MultiEdit",
                json!({"file_path": "/r/a.rs", "edits": [{}, {}]}),
                "MultiEdit /r/a.rs (2 edits)",
            ),
            (
                "Grep",
                json!({"pattern": "fn main", "path": "/r/src", "glob": "*.rs"}),
                "Grep fn main in /r/src glob=*.rs",
            ),
            ("Grep", json!({"pattern": "TODO"}), "Grep TODO"),
            (
                "Glob",
                json!({"pattern": "**/*.md", "path": "/r"}),
                "Glob **/*.md in /r",
            ),
            (
                "NotebookEdit",
                json!({"notebook_path": "/r/n.ipynb"}),
                "NotebookEdit /r/n.ipynb",
            ),
            (
                "WebFetch",
                json!({"url": "https://example.com/x", "prompt": "p"}),
                "WebFetch https://example.com/x",
            ),
            (
                "TodoWrite",
                json!({"todos": [{}, {}, {}]}),
                "TodoWrite (3 items)",
            ),
            (
                "mcp__db__query",
                json!({"sql": "select 1"}),
                r#"mcp__db__query {"sql":"select 1"}"#,
            ),
            ("ExitPlanMode", json!({}), "ExitPlanMode"),
            // A call without the field its summary needs still shows what it was given.
            ("Read", json!({"path": "/r/x"}), r#"Read {"path":"/r/x"}"#),
        ];
        for (name, input, line) in cases {
            assert_eq!(tool_call(name, &input), line, "{name} {input}");
        }
    }

    #[test]
    fn a_long_tool_call_is_bounded_like_a_result_and_says_so() {
        assert_eq!(bounded_line("Read /r/a"), "Read /r/a");
        let long = format!("Grep {}", "y".repeat(TOOL_RESULT_SHOWN));
        let line = bounded_line(&long);
        assert_eq!(
            line,
            format!(
                "{} … (first {TOOL_RESULT_SHOWN} of {} bytes shown)",
                &long[..TOOL_RESULT_SHOWN],
                long.len()
            )
        );
    }

    #[test]
    fn a_transcript_redacts_secrets_in_every_entry_once_it_knows_them() {
        let dir = std::env::temp_dir().join(format!("transcript-test-{}", std::process::id()));
        let p = StartParams::Planner { spec_paths: vec![] };
        let t = Transcript::create(&dir, 1, &p, "redact", Box::new(|_| {}));
        t.redact(secrets_in(&env(&[("API_TOKEN", "s3cr3t-value")])));
        t.tool_use("t1", "Bash", &json!({"command": "echo s3cr3t-value"}));
        t.tool_use(
            "t2",
            "Read",
            &json!({"file_path": "/keys/s3cr3t-value.pem"}),
        );
        // The cut falls inside the secret: it is redacted whole first, never half written.
        let grep = format!("{}s3cr3t-value", "x".repeat(TOOL_RESULT_SHOWN - 8));
        t.tool_use("t3", "Grep", &json!({ "pattern": grep }));
        t.tool_result("t1", "s3cr3t-value\n", false);
        t.tool_result("t9", "boom", true);
        let log = std::fs::read_to_string(t.path()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!log.contains("s3cr3t-value"), "{log}");
        assert!(log.contains("[tool_use] Bash: echo [REDACTED]\n"), "{log}");
        assert!(
            log.contains("[tool_use] Read /keys/[REDACTED].pem\n"),
            "{log}"
        );
        assert!(!log.contains("s3cr3t"), "{log}");
        assert!(
            log.contains("[tool_result] Bash: ok, 13 bytes\n    [REDACTED]\n"),
            "{log}"
        );
        assert!(
            log.contains("[tool_result] tool t9: error, 4 bytes\n    boom\n"),
            "{log}"
        );
    }
}
