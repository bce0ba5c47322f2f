//! Fans session events out to the output stream, the transcript and the logger.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::audit::{sha256_hex, AuditRecord};
use crate::claude::session::{Access, SessionEvent, SessionObserver};
use crate::deps::{HookDecision, LogLevel, Logger};
use crate::domain::Role;
use crate::otel::{metrics, ToolSpans};
use crate::output::OutputBuffer;
use crate::transcript::Transcript;

/// Fans session events out to the output stream, the transcript and the logger.
pub struct Observer {
    pub output: Arc<OutputBuffer>,
    pub transcript: Option<Arc<Transcript>>,
    pub logger: Arc<dyn Logger>,
    pub session_id: String,
    pub role: Role,
    /// The session's span: each tool call is a span under it.
    pub trace: tracing::Span,
    pub tools: ToolSpans,
    /// The session's audit record (`config.audit`).
    pub audit: Option<Arc<AuditRecord>>,
}

impl Observer {
    /// A log entry's data: the session's id and role, and `extra`.
    fn data(&self, extra: &[(&str, Value)]) -> Value {
        let mut d = json!({ "sessionID": self.session_id, "role": self.role.as_str() });
        for (k, v) in extra {
            d[*k] = v.clone();
        }
        d
    }

    /// The validator's decision in the engine's log: failures (the command was blocked
    /// because the hook failed) as errors, blocks as info, approvals as debug.
    fn log_hook(
        &self,
        mut d: Value,
        input: &Value,
        decision: &HookDecision,
        failure: Option<&str>,
    ) {
        d["command"] = input.get("command").cloned().unwrap_or(Value::Null);
        match (decision, failure) {
            (_, Some(f)) => {
                d["error"] = json!(f);
                self.logger.log(
                    LogLevel::Error,
                    "bash validator hook failed; command blocked",
                    d,
                );
            }
            (HookDecision::Block { reason }, None) => {
                d["reason"] = json!(reason);
                self.logger
                    .log(LogLevel::Info, "bash command blocked by validator", d);
            }
            (HookDecision::Approve, None) => {
                self.logger.log(LogLevel::Debug, "bash command approved", d)
            }
        }
    }
}

impl Observer {
    /// A hook's decision on a tool call, on its span and, when it refused, in the denials
    /// metric (`kind`: what was refused).
    fn decided(&self, tool_use_id: &str, decision: &HookDecision, kind: &'static str) {
        let blocked = match decision {
            HookDecision::Approve => None,
            HookDecision::Block { reason } => Some(reason.as_str()),
        };
        self.tools.decided(tool_use_id, blocked);
        if blocked.is_some() {
            metrics::denial(self.role.as_str(), kind);
        }
    }

    /// The adapter's answer to a file tool: blocks in the transcript and as warnings (an agent
    /// reaching outside its boundary is worth an operator's look), approvals at debug.
    fn file_access(
        &self,
        access: Access,
        tool_name: &str,
        path: Option<&str>,
        decision: &HookDecision,
    ) {
        let shown = path.unwrap_or("(no readable path)");
        let mut d = self.data(&[("tool", json!(tool_name)), ("path", json!(path))]);
        let (allowed, blocked) = match access {
            Access::Write => (
                "file write allowed",
                "file write blocked: outside the session's writable paths",
            ),
            Access::Read => ("file read allowed", "file read blocked: a credential store"),
        };
        match decision {
            HookDecision::Approve => self.logger.log(LogLevel::Debug, allowed, d),
            HookDecision::Block { reason } => {
                if let Some(t) = &self.transcript {
                    t.note(
                        "file-guard",
                        &format!("blocked {tool_name}: {shown} — {reason}"),
                    );
                }
                d["reason"] = json!(reason);
                self.logger.log(LogLevel::Warn, blocked, d);
            }
        }
    }
}

impl Observer {
    /// The event in the audit record: every tool call, its verdict and what it returned, the
    /// CLI's results, follow-ups and stops (text and the CLI's own lines are not the record's).
    fn audit(&self, event: &SessionEvent<'_>) {
        let Some(audit) = &self.audit else { return };
        let verdict = |d: &HookDecision| match d {
            HookDecision::Approve => (json!("allowed"), Value::Null),
            HookDecision::Block { reason } => (json!("blocked"), json!(reason)),
        };
        match event {
            SessionEvent::ToolUse { id, name, input } => audit.append(
                "tool_use",
                json!({ "id": id, "tool": name, "input": input }),
            ),
            SessionEvent::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => audit.append(
                "tool_result",
                json!({ "id": tool_use_id, "isError": is_error, "bytes": content.len(), "sha256": sha256_hex(content.as_bytes()) }),
            ),
            SessionEvent::Hook {
                tool_name,
                tool_use_id,
                input,
                decision,
                failure,
            } => {
                let (verdict, reason) = verdict(decision);
                audit.append(
                    "tool_verdict",
                    json!({ "id": tool_use_id, "tool": tool_name, "by": "bashValidatorHook", "command": input.get("command"), "verdict": verdict, "reason": reason, "hookFailure": failure }),
                )
            }
            SessionEvent::FileAccess {
                access,
                tool_name,
                tool_use_id,
                path,
                decision,
            } => {
                let (verdict, reason) = verdict(decision);
                let access = match access {
                    Access::Read => "read",
                    Access::Write => "write",
                };
                audit.append(
                    "tool_verdict",
                    json!({ "id": tool_use_id, "tool": tool_name, "by": "fileGuard", "access": access, "path": path, "verdict": verdict, "reason": reason }),
                )
            }
            SessionEvent::Result(r) => audit.append(
                "cli_result",
                json!({ "subtype": r.subtype, "isError": r.is_error, "turns": r.num_turns, "costUsd": r.total_cost_usd, "structuredOutput": r.structured_output }),
            ),
            SessionEvent::FollowUp(text) => audit.append("follow_up", json!({ "prompt": text })),
            SessionEvent::Stopping(reason) => {
                audit.append("stop", json!({ "reason": reason.as_str() }))
            }
            SessionEvent::Init(_) | SessionEvent::Text(_) | SessionEvent::UnreadableLine { .. } => {}
        }
    }
}

impl SessionObserver for Observer {
    fn on_event(&self, event: SessionEvent<'_>) {
        self.audit(&event);
        let t = self.transcript.as_deref();
        match event {
            SessionEvent::Init(v) => {
                if let Some(t) = t {
                    t.init(v);
                }
                let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
                let d = self.data(&[("model", field("model")), ("cwd", field("cwd"))]);
                self.logger
                    .log(LogLevel::Debug, "agent session initialized", d);
            }
            SessionEvent::Text(text) => {
                self.output.push(text);
                if let Some(t) = t {
                    t.text(text);
                }
            }
            SessionEvent::ToolUse { id, name, input } => {
                self.tools.called(&self.trace, id, name);
                if let Some(t) = t {
                    t.tool_use(id, name, input);
                }
            }
            SessionEvent::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                self.tools.returned(tool_use_id, is_error);
                if let Some(t) = t {
                    t.tool_result(tool_use_id, content, is_error);
                }
            }
            SessionEvent::Hook {
                tool_name,
                tool_use_id,
                input,
                decision,
                failure,
            } => {
                self.decided(tool_use_id, decision, "command");
                if let Some(t) = t {
                    t.hook(tool_name, input, decision, failure);
                }
                self.log_hook(self.data(&[]), input, decision, failure);
            }
            SessionEvent::FileAccess {
                access,
                tool_name,
                tool_use_id,
                path,
                decision,
            } => {
                let kind = match access {
                    Access::Read => "read",
                    Access::Write => "write",
                };
                self.decided(tool_use_id, decision, kind);
                self.file_access(access, tool_name, path, decision)
            }
            SessionEvent::Result(r) => {
                if let Some(t) = t {
                    t.result(r);
                }
            }
            SessionEvent::FollowUp(text) => {
                if let Some(t) = t {
                    t.note("follow-up", text);
                }
                let d = self.data(&[("prompt", json!(text))]);
                let m = "asking the agent to correct its structured output";
                self.logger.log(LogLevel::Info, m, d);
            }
            SessionEvent::UnreadableLine { error, bytes } => {
                if let Some(t) = t {
                    t.note(
                        "warning",
                        &format!("unreadable line from the CLI ({bytes} bytes): {error}"),
                    );
                }
                let d = self.data(&[("error", json!(error))]);
                let m = "unreadable line from the Claude Code CLI";
                self.logger.log(LogLevel::Warn, m, d);
            }
            SessionEvent::Stopping(reason) => {
                if let Some(t) = t {
                    t.note(
                        "stop",
                        &format!("stopping the session ({})", reason.as_str()),
                    );
                }
                self.logger.log(
                    LogLevel::Info,
                    &format!("stopping agent session ({})", reason.as_str()),
                    self.data(&[]),
                );
            }
        }
    }
}
