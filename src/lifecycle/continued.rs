//! A session that continues an interrupted one ([`crate::git::interrupted`]): what the engine,
//! the transcript and the record are told, what the resumed CLI is told, and how much of the
//! time limit the runs before used.

use std::time::Duration;

use serde_json::json;

use super::Session;
use crate::claude::command;
use crate::claude::session::StopReason;
use crate::clock::now_ms;
use crate::deps::LogLevel;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::worktree::Continuation;

/// What the continued CLI is told before the task, as the next user turn of its conversation.
const CONTINUE_PROMPT: &str = "Your session was interrupted (the engine running it stopped) and has now been resumed in the same checkout, with your commits and uncommitted files as you left them. A command that was running when it stopped did not finish. Check what you already did, then continue the task where you left off and finish it as instructed. The task, as it stands now:";

/// The continued CLI's prompt: the interruption said, then the task as assembled now (the
/// work item may have changed).
pub(super) fn prompt(task: &str) -> String {
    format!("{CONTINUE_PROMPT}\n\n{task}")
}

/// The continued CLI's argv, from the `args` a fresh run would get: on the interrupted
/// conversation, with the turns its runs used taken off `--max-turns`. None left is
/// `ERR_AGENT_FAILED` naming the interrupted session and its turns.
pub(super) fn args(args: &[String], c: &Continuation) -> Result<Vec<String>> {
    command::resume_args(args, c.turns).ok_or_else(|| {
        AdapterError::new(
            ErrorCode::AgentFailed,
            format!(
                "the interrupted session {} had used all of its maxTurns ({} turns)",
                c.from_session, c.turns
            ),
        )
    })
}

impl Session {
    /// Takes over the interrupted session the environment continued, if it did: the CLI's
    /// conversation id becomes its, the engine, the transcript and the record are told, and
    /// the time limit counts what the runs before used.
    pub(super) fn take_continuation(&mut self) {
        let Some(c) = self
            .environment
            .as_deref()
            .and_then(|e| e.continued())
            .cloned()
        else {
            return;
        };
        self.cli_id = c.cli_session.clone();
        let ago = Duration::from_millis(now_ms().saturating_sub(c.interrupted_ms)).as_secs();
        let text = format!(
            "continuing session {} (interrupted {ago} s ago, after {} model turns and {} s of agent time) in its checkout, on its conversation",
            c.from_session,
            c.turns,
            c.used.as_secs()
        );
        self.output
            .push(&format!("\n[claude-runtime-adapter] {text}\n"));
        if let Some(t) = &self.transcript {
            let linked = c
                .transcript
                .as_deref()
                .map_or_else(String::new, |p| format!("; its transcript: {p}"));
            t.note("continued", &format!("{text}{linked}"));
        }
        if let Some(record) = self.audit.get() {
            record.append(
                "continued",
                json!({ "from": c.from_session, "cliSession": c.cli_session, "turns": c.turns,
                        "usedMs": c.used.as_millis() as u64, "interruptedMs": c.interrupted_ms }),
            );
        }
        self.log(
            LogLevel::Info,
            &text,
            json!({ "continuedFrom": c.from_session, "turns": c.turns, "usedMs": c.used.as_millis() as u64 }),
        );
        if let Some(limit) = self.host.config.max_agent_duration {
            let rest = limit.saturating_sub(c.used);
            let timer = self.stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(rest) => timer.stop(StopReason::Timeout),
                    _ = timer.stopped() => {}
                }
            });
        }
        self.continued = Some(c);
    }
}

impl Session {
    /// Whether the checkout is left for the next engine process to continue: the session was
    /// stopped by `shutdown()` (a deploy's SIGTERM) before its agent ended, and its record
    /// names the agent. Said in the transcript and the log; its work was saved beside the
    /// transcript as for any stopped session.
    pub(super) fn left_for_next(&self, outcome: &crate::error::Result<serde_json::Value>) -> bool {
        let stopped = matches!(outcome, Err(e) if e.code == crate::error::ErrorCode::Cancelled);
        if !(self.continuable && stopped && self.stop.by_shutdown()) {
            return false;
        }
        let path = self.workdir().display().to_string();
        let text = format!(
            "the adapter was shut down during the session: its checkout {path} and conversation are left for the next session on its branch to continue (resumeInterrupted)"
        );
        if let Some(t) = &self.transcript {
            t.note("continuable", &text);
        }
        self.log(LogLevel::Info, &text, json!({ "path": path }));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continued_run_gets_the_turns_its_interrupted_runs_left_and_none_left_fails_naming_them() {
        let fresh = ["--print", "--max-turns=10", "--session-id=c0ffee"].map(String::from);
        let mut c = Continuation {
            from_session: "s-1".into(),
            transcript: None,
            cli_session: "c0ffee".into(),
            interrupted_ms: 0,
            used: Duration::from_secs(60),
            turns: 3,
        };
        assert_eq!(
            args(&fresh, &c).unwrap(),
            ["--print", "--max-turns=7", "--resume=c0ffee"]
        );
        c.turns = 10;
        let e = args(&fresh, &c).unwrap_err();
        assert_eq!(e.code, ErrorCode::AgentFailed);
        assert_eq!(
            e.message,
            "the interrupted session s-1 had used all of its maxTurns (10 turns)"
        );
    }
}
