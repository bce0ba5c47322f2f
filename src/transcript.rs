//! The human-readable session log (spec: Agent Session Logging):
//! `{logsDir}/{epochMillis}-{role}[-{workItemID}].log`. Each entry is written straight to the
//! file (no user-space buffer), so a crash leaves a readable partial log. The footer is written
//! only once the outcome is known — after validation — so a log never claims success for a run
//! that failed. A log that cannot be written never affects the session: the first failure is
//! reported to the caller's warn hook and logging stops.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::claude::protocol::ResultMessage;
use crate::deps::HookDecision;
use crate::domain::StartParams;

pub struct Transcript {
    path: PathBuf,
    file: Mutex<Option<File>>,
    on_error: Box<dyn Fn(&str) + Send + Sync>,
}

pub fn epoch_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time in epoch milliseconds.
pub fn iso8601(ms: u128) -> String {
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm): no date crate needed for a timestamp.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// `{ms}-{role}[-{workItemID}]-{sessionID}.log`: the session id makes the name unique even
/// for two sessions of one role started in the same millisecond (their logs and patch files
/// would otherwise truncate each other). Ids are sanitized and capped (they come from the engine).
pub fn log_file_name(started_ms: u128, params: &StartParams, session_id: &str) -> String {
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
        started_ms: u128,
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
        header += &format!("Started: {}\n\n", iso8601(started_ms));
        t.write(&header);
        t
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, text: &str) {
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
        let ts = iso8601(epoch_millis());
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
        let ts = iso8601(epoch_millis());
        self.write(&format!("[{ts}] [assistant]\n{}", indent(text)));
    }

    pub fn tool_use(&self, name: &str, input: &Value) {
        match input.get("command").and_then(Value::as_str) {
            Some(cmd) if name == "Bash" => self.entry("tool_use", &format!("{name}: {cmd}")),
            _ => self.entry("tool_use", name),
        }
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
        let ts = iso8601(epoch_millis());
        self.write(&format!(
            "\n=== Session {outcome} ===\nReason: {reason}\nEnded: {ts}\n"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
