//! Whether a CLI run that ended is started again on its conversation (`--resume`), and how:
//! the decisions of [`super::Session::run_resuming`] that need nothing but what the session
//! knows, apart from the steps that wait (the pause, asking the environment whether it is lost).

use std::time::Duration;

use serde_json::Value;

use crate::claude::command;
use crate::claude::protocol::ResultMessage;
use crate::claude::session::SessionSpec;
use crate::error::{AdapterError, ErrorCode, Result};

/// A session's CLI is started again on its conversation at most this many times (each only
/// after it ended on an API failure within `apiOutageTolerance`): an API that cuts every
/// answer must not keep a session going for ever.
const MAX_RESUMES: u32 = 8;
/// The pause before the first resume, doubling with each (the relay holds the next request
/// through a failure it sees; this paces an API that cuts its answers).
const RESUME_PAUSE: Duration = Duration::from_millis(500);

/// What the resumed CLI is told, as the next user turn of its conversation.
const RESUME_PROMPT: &str = "The model API failed in the middle of your work, and your session has been resumed in the same checkout. Check what you already did, then continue the task where you left off and finish it as instructed.";

/// What becomes of a CLI run that ended.
#[derive(Debug, PartialEq)]
pub(super) enum Resume<T> {
    /// It is started again on its conversation, with this: the outage's reason (and, once
    /// made, the spec of the next run).
    Yes(T),
    /// Its end stands: it did not end on an API failure the session waits out (a result, a
    /// stop, a crash, an environment lost under it, a limit of the run's own, no turns left).
    No,
    /// It ended on an outage the session may no longer wait out: the session fails, naming
    /// this.
    Refused(String),
}

/// What a run's end is judged by, but for whether its environment was lost (which takes
/// asking it, and is asked only of a run that would otherwise be resumed).
pub(super) struct RunEnd<'a> {
    /// The run or the session was stopped (cancel, time limit, budget, a limit).
    pub stopped: bool,
    /// The run's `result`, when it gave one.
    pub result: Option<&'a ResultMessage>,
    /// The API outage under way (the session's `ApiOutage::ongoing`): its reason, how long
    /// it has lasted, and whether the session may still wait for it.
    pub outage: Option<(String, Duration, bool)>,
    /// `apiOutageTolerance` (zero: off).
    pub tolerance: Duration,
    /// How many times the conversation was resumed so far.
    pub resumes: u32,
}

/// Whether the run that `end` describes is resumed: only one that ended on an API outage
/// under way, within the tolerance, and fewer than [`MAX_RESUMES`] times before. A limit of
/// the run's own — its turns, its budget — is not an API failure, whatever the API did before.
pub(super) fn judge(end: RunEnd<'_>) -> Resume<String> {
    if end.stopped {
        return Resume::No;
    }
    if end
        .result
        .is_some_and(|r| !r.is_error || command::ended_at_own_limit(&r.subtype))
    {
        return Resume::No;
    }
    let Some((reason, lasted, may_wait)) = end.outage else {
        return Resume::No;
    };
    if end.tolerance.is_zero() {
        return Resume::No;
    }
    if !may_wait {
        return Resume::Refused(format!(
            "the model API was unavailable for {} s, past apiOutageTolerance ({} s): {reason}",
            lasted.as_secs(),
            end.tolerance.as_secs()
        ));
    }
    if end.resumes >= MAX_RESUMES {
        return Resume::Refused(format!(
            "the model API kept failing ({reason}); the conversation was resumed {MAX_RESUMES} times"
        ));
    }
    Resume::Yes(reason)
}

/// The spec of a resumed run: the first run's, on its conversation, told it was resumed, with
/// the `turns_used` of the runs so far taken off its `--max-turns` (none left: `None`, not
/// resumed).
pub(super) fn resumed_spec(first: &SessionSpec, turns_used: u64) -> Option<SessionSpec> {
    let args = command::resume_args(&first.args, turns_used)?;
    Some(SessionSpec {
        args,
        prompt: RESUME_PROMPT.to_string(),
        ..first.clone()
    })
}

/// The pause before `resume` (1 for the first): half a second, doubling with each, up to 16 s
/// from the sixth on.
pub(super) fn pause(resume: u32) -> Duration {
    RESUME_PAUSE * 2u32.pow((resume - 1).min(5))
}

/// The session's notice of `resume` (1 for the first), after an API failure (`reason`).
pub(super) fn notice(reason: &str, resume: u32) -> String {
    format!(
        "the Claude Code CLI ended on a model API failure ({reason}); continuing its conversation (resume {resume} of at most {MAX_RESUMES})"
    )
}

/// A session whose resume was `refused` ([`Resume::Refused`]) and that then failed as its
/// agent did (`ERR_AGENT_FAILED`) fails naming the outage first: that is why its agent failed.
/// Any other outcome stands (a result, a stop, the budget, a limit).
pub(super) fn failed_on_outage(refused: Option<&str>, outcome: Result<Value>) -> Result<Value> {
    match (refused, outcome) {
        (Some(why), Err(e)) if e.code == ErrorCode::AgentFailed => Err(AdapterError {
            message: format!("{why}; {}", e.message),
            ..e
        }),
        (_, outcome) => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVERLOADED: &str = "529 overloaded_error";

    /// A run that ended without a result, during an outage of 5 s the session may wait out
    /// (tolerance 60 s), never resumed before.
    fn cut() -> RunEnd<'static> {
        RunEnd {
            stopped: false,
            result: None,
            outage: Some((OVERLOADED.into(), Duration::from_secs(5), true)),
            tolerance: Duration::from_secs(60),
            resumes: 0,
        }
    }

    fn result(is_error: bool, subtype: &str) -> ResultMessage {
        ResultMessage {
            is_error,
            subtype: subtype.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_run_cut_by_an_outage_the_session_may_wait_out_is_resumed_for_its_reason() {
        assert_eq!(judge(cut()), Resume::Yes(OVERLOADED.into()));
        let failed = result(true, "error_during_execution");
        let end = RunEnd {
            result: Some(&failed),
            ..cut()
        };
        assert_eq!(judge(end), Resume::Yes(OVERLOADED.into()));
    }

    #[test]
    fn a_stop_a_result_a_limit_of_the_runs_own_or_no_outage_leaves_the_end_as_it_is() {
        let stopped = RunEnd {
            stopped: true,
            ..cut()
        };
        assert_eq!(judge(stopped), Resume::No);
        let done = result(false, "success");
        let own_limits = ["error_max_turns", "error_max_budget_usd"].map(|s| result(true, s));
        for r in std::iter::once(&done).chain(&own_limits) {
            let end = RunEnd {
                result: Some(r),
                ..cut()
            };
            assert_eq!(judge(end), Resume::No, "{}", r.subtype);
        }
        let calm = RunEnd {
            outage: None,
            ..cut()
        };
        assert_eq!(judge(calm), Resume::No);
        let off = RunEnd {
            tolerance: Duration::ZERO,
            ..cut()
        };
        assert_eq!(judge(off), Resume::No);
    }

    #[test]
    fn an_outage_past_the_tolerance_is_refused_naming_how_long_it_lasted_and_the_tolerance() {
        let past = RunEnd {
            outage: Some((OVERLOADED.into(), Duration::from_secs(61), false)),
            ..cut()
        };
        assert_eq!(
            judge(past),
            Resume::Refused(format!(
                "the model API was unavailable for 61 s, past apiOutageTolerance (60 s): {OVERLOADED}"
            ))
        );
    }

    #[test]
    fn the_resume_after_max_resumes_is_refused_naming_the_count() {
        let last = RunEnd {
            resumes: MAX_RESUMES - 1,
            ..cut()
        };
        assert_eq!(judge(last), Resume::Yes(OVERLOADED.into()));
        let one_more = RunEnd {
            resumes: MAX_RESUMES,
            ..cut()
        };
        assert_eq!(
            judge(one_more),
            Resume::Refused(format!(
                "the model API kept failing ({OVERLOADED}); the conversation was resumed 8 times"
            ))
        );
        assert_eq!(
            notice(OVERLOADED, MAX_RESUMES),
            format!("the Claude Code CLI ended on a model API failure ({OVERLOADED}); continuing its conversation (resume 8 of at most 8)")
        );
    }

    #[test]
    fn a_resumed_run_continues_the_conversation_with_the_turns_left_and_none_left_is_no_resume() {
        let first = SessionSpec {
            program: "claude".into(),
            args: ["--print", "--max-turns=10", "--session-id=c0ffee"]
                .map(String::from)
                .to_vec(),
            env: Vec::new(),
            cwd: "/work".into(),
            role: "implementor".into(),
            agent: serde_json::json!({}),
            schema: serde_json::json!({}),
            prompt: "the task".into(),
            hook_timeout: Duration::from_secs(5),
            write_scope: Default::default(),
            read_guard: Default::default(),
        };
        let resumed = resumed_spec(&first, 4).unwrap();
        assert_eq!(
            resumed.args,
            ["--print", "--max-turns=6", "--resume=c0ffee"]
        );
        assert_eq!(resumed.prompt, RESUME_PROMPT);
        assert_eq!(
            (resumed.cwd, resumed.role),
            (first.cwd.clone(), first.role.clone())
        );
        assert!(resumed_spec(&first, 10).is_none());
    }

    #[test]
    fn the_pause_before_a_resume_doubles_from_half_a_second_up_to_16_s() {
        let pauses: Vec<u64> = (1..=MAX_RESUMES)
            .map(|r| pause(r).as_millis() as u64)
            .collect();
        assert_eq!(
            pauses,
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 16_000, 16_000]
        );
    }

    #[test]
    fn an_agent_that_failed_after_a_refused_resume_fails_naming_the_outage_first() {
        let why = "the model API kept failing (529 overloaded_error); the conversation was resumed 8 times";
        let failed = || {
            Err(AdapterError::new(
                ErrorCode::AgentFailed,
                "the CLI exited with 1",
            ))
        };
        let e = failed_on_outage(Some(why), failed()).unwrap_err();
        assert_eq!(e.code, ErrorCode::AgentFailed);
        assert_eq!(e.message, format!("{why}; the CLI exited with 1"));
        assert_eq!(
            failed_on_outage(None, failed()).unwrap_err().message,
            "the CLI exited with 1"
        );
        let timed_out = AdapterError::new(ErrorCode::Timeout, "past maxAgentDuration");
        let e = failed_on_outage(Some(why), Err(timed_out)).unwrap_err();
        assert_eq!(e.message, "past maxAgentDuration");
        let done = serde_json::json!({ "outcome": "completed" });
        assert_eq!(failed_on_outage(Some(why), Ok(done.clone())).unwrap(), done);
    }
}
