//! What an interrupted Implementor's pod holds for a continuation ([`super::resume`]) and the
//! sweep ([`super::sweep`]) reads: the agent record on the pod ([`AgentRecord`]), the CLI's
//! conversation in the pod read as data ([`conversation`]), whether it can be continued
//! ([`continuation`]), and whether a continuation fits in the pod's life ([`Times`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cluster::{label_value, Pod, ANNOTATION_AGENT, LABEL_BRANCH};
use super::layout::{HOME, STATE};
use super::steps::{sh_quote, STEP_TIMEOUT};
use crate::clock::now_ms;
use crate::environment::remote::{RemoteCommand, RemoteShell};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::interrupted::turns_in;
use crate::git::worktree::Continuation;

/// The largest conversation read out of a pod (kept beside a transcript, or continued).
pub(super) const MAX_CONVERSATION: usize = 64 << 20;

/// What continuing a pod's session needs ([`ANNOTATION_AGENT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AgentRecord {
    pub session_id: String,
    /// Its transcript, when it had one (the continued one names it).
    pub transcript: Option<String>,
    pub branch: String,
    /// The CLI's conversation.
    pub cli_session: String,
    pub model: Option<String>,
    /// When its CLI started, Unix ms of the engine's clock.
    pub started_ms: u64,
}

/// Records `agent` on `pod` (or, `None`, removes the record and the branch label).
pub(super) async fn record_agent(pod: &Pod, agent: Option<&AgentRecord>) -> Result<()> {
    let json = agent
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| AdapterError::new(ErrorCode::Internal, e.to_string()))?;
    pod.mark(serde_json::json!({
        "labels": { LABEL_BRANCH: agent.map(|a| label_value(&a.branch)) },
        "annotations": { ANNOTATION_AGENT: json },
    }))
    .await
}

/// The conversation of a pod's CLI as the pod holds it.
pub(super) struct Conversation {
    /// Since its last write, by the pod's clock.
    pub age: Duration,
    /// Its size.
    pub size: u64,
    /// At most [`MAX_CONVERSATION`] bytes of it (empty unless asked for).
    pub bytes: Vec<u8>,
}

/// The script printing the pod's clock, the conversation `cli_session`'s mtime and size, then
/// (`read`) at most [`MAX_CONVERSATION`] bytes of it; exit 3 when there is no such regular file,
/// 4 when the image lacks `find` or `head` (not among the tools every image must have).
/// The jail binds the pod's `{STATE}/claude-config` at `~/.claude` (image/cra-jail); without the
/// jail the CLI writes `~/.claude` itself. `find -type f` follows no link the agent planted (the
/// pod holds nothing of the engine either way).
fn conversation_sh(cli_session: &str, read: bool) -> String {
    let name = sh_quote(&format!("{cli_session}.jsonl"));
    let content = match read {
        true => format!(" && head -c {MAX_CONVERSATION} \"$f\""),
        false => String::new(),
    };
    format!(
        "command -v find >/dev/null && command -v head >/dev/null || exit 4; \
         f=$(find {STATE}/claude-config/projects {HOME}/.claude/projects -mindepth 2 -maxdepth 2 \
         -type f -name {name} 2>/dev/null | head -n 1); [ -n \"$f\" ] || exit 3; \
         date +%s && stat -c '%Y %s' \"$f\"{content}"
    )
}

/// Reads the conversation `cli_session` in the pod over `shell` (bounded); why not, in words.
pub(super) async fn conversation(
    shell: &RemoteShell,
    env: &[(String, String)],
    cli_session: &str,
    read: bool,
) -> std::result::Result<Conversation, String> {
    let cmd = RemoteCommand {
        argv: vec!["sh".into(), "-c".into(), conversation_sh(cli_session, read)],
        env: env.to_vec(),
        cwd: "/".into(),
    };
    let run = shell.run(cmd, &[], MAX_CONVERSATION + 64);
    let out = match tokio::time::timeout(STEP_TIMEOUT, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("its pod did not answer ({})", e.message)),
        Err(_) => {
            return Err(format!(
                "its pod did not answer within {} s",
                STEP_TIMEOUT.as_secs()
            ))
        }
    };
    if out.status.code() == Some(4) {
        return Err("its image has no find or head to read its conversation with".into());
    }
    if out.status.code() == Some(3) {
        return Err(format!(
            "its conversation {cli_session}.jsonl is missing or not a plain file"
        ));
    }
    if !out.status.success() {
        return Err(format!(
            "its conversation could not be read ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_conversation(&out.stdout)
}

/// [`conversation_sh`]'s output.
fn parse_conversation(out: &[u8]) -> std::result::Result<Conversation, String> {
    let bad = || "its pod's answer about the conversation is not understood".to_string();
    let mut parts = out.splitn(3, |b| *b == b'\n');
    let mut line = || std::str::from_utf8(parts.next()?).ok().map(str::to_string);
    let (now, stat) = (line().ok_or_else(bad)?, line().ok_or_else(bad)?);
    let bytes = parts.next().unwrap_or_default().to_vec();
    let now: u64 = now.trim().parse().map_err(|_| bad())?;
    let mut stat = stat.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(mtime)), Some(Ok(size))) = (stat.next(), stat.next()) else {
        return Err(bad());
    };
    Ok(Conversation {
        age: Duration::from_secs(now.saturating_sub(mtime)),
        size,
        bytes,
    })
}

/// The pod's session as the new one continues it, or why it cannot be: `model` is the one
/// asked for now, `within` the bound.
pub(super) fn continuation(
    agent: &AgentRecord,
    conversation: &Conversation,
    within: Duration,
    model: Option<&str>,
) -> std::result::Result<Continuation, String> {
    if agent.model.as_deref() != model {
        return Err(format!(
            "it ran model {}, this session asks for {}",
            agent.model.as_deref().unwrap_or("(the definition's)"),
            model.unwrap_or("(the definition's)")
        ));
    }
    interrupted_within(conversation, within)?;
    if conversation.size > MAX_CONVERSATION as u64 {
        return Err(format!(
            "its conversation is {} bytes, more than the {MAX_CONVERSATION} read",
            conversation.size
        ));
    }
    let turns = turns_in(&conversation.bytes)?;
    let interrupted_ms = now_ms().saturating_sub(conversation.age.as_millis() as u64);
    Ok(Continuation {
        from_session: agent.session_id.clone(),
        transcript: agent.transcript.clone(),
        cli_session: agent.cli_session.clone(),
        interrupted_ms,
        used: Duration::from_millis(interrupted_ms.saturating_sub(agent.started_ms)),
        turns,
    })
}

/// Whether the conversation was last written within the bound.
pub(super) fn interrupted_within(
    conversation: &Conversation,
    within: Duration,
) -> std::result::Result<(), String> {
    match conversation.age > within {
        true => Err(format!(
            "it was interrupted {} s ago, more than resumeInterrupted ({} s)",
            conversation.age.as_secs(),
            within.as_secs()
        )),
        false => Ok(()),
    }
}

/// What decides whether a continuation fits in its pod's life: `maxAgentDuration` (`None`:
/// none, and the pods have no deadline either) and `extractionTimeout`.
#[derive(Debug, Clone)]
pub struct Times {
    pub agent: Option<Duration>,
    pub extraction: Duration,
}

impl Times {
    /// Whether a pod the cluster ends at `ends_ms` (Unix ms; `None`: never) lives long enough
    /// for a continuation of a session that used `used`.
    pub(super) fn room(
        &self,
        ends_ms: Option<u64>,
        used: Duration,
    ) -> std::result::Result<(), String> {
        let (Some(ends_ms), Some(agent)) = (ends_ms, self.agent) else {
            return Ok(());
        };
        let needed = agent.saturating_sub(used) + self.extraction + Duration::from_secs(60);
        let left = Duration::from_millis(ends_ms.saturating_sub(now_ms()));
        match left >= needed {
            true => Ok(()),
            false => Err(format!(
                "its pod ends in {} s (activeDeadlineSeconds), less than the {} s the rest of \
                 maxAgentDuration and the extraction need",
                left.as_secs(),
                needed.as_secs()
            )),
        }
    }

    /// Until when (Unix ms) a pod of a session that used `used`, interrupted `age` ago, may
    /// wait for its continuation within `within`: the bound, and the last moment a
    /// continuation still fits in the pod's life ([`Times::room`]).
    pub(super) fn keep_until(
        &self,
        ends_ms: Option<u64>,
        used: Duration,
        age: Duration,
        within: Duration,
    ) -> u64 {
        let now = now_ms();
        let bound = now + within.saturating_sub(age).as_millis() as u64;
        let fits = match (ends_ms, self.agent) {
            (Some(ends), Some(agent)) => {
                let needed = agent.saturating_sub(used) + self.extraction + Duration::from_secs(60);
                ends.saturating_sub(needed.as_millis() as u64)
            }
            _ => u64::MAX,
        };
        bound.min(fits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(model: Option<&str>) -> AgentRecord {
        AgentRecord {
            session_id: "first-run".into(),
            transcript: Some("/logs/first-run.log".into()),
            branch: "wi-7".into(),
            cli_session: "c1".into(),
            model: model.map(str::to_string),
            started_ms: now_ms() - 100_000,
        }
    }

    const TURNS: &[u8] = b"{\"type\":\"user\"}\n{\"type\":\"assistant\",\"message\":{\"id\":\"m1\"}}\n{\"type\":\"assistant\",\"message\":{\"id\":\"m2\"}}\n{\"type\":\"assist";

    #[test]
    fn the_pods_answer_reads_as_clock_mtime_size_then_the_bytes_and_anything_else_is_refused() {
        let c = parse_conversation(b"1000\n990 12\nline one\nline two\n").unwrap();
        assert_eq!((c.age, c.size), (Duration::from_secs(10), 12));
        assert_eq!(c.bytes, b"line one\nline two\n");
        // An mtime in the pod's future is no age, not a wrapped one.
        assert_eq!(
            parse_conversation(b"1000\n2000 1\n").unwrap().age,
            Duration::ZERO
        );
        for junk in [
            &b""[..],
            b"1000\n",
            b"x\n990 12\n",
            b"1000\n990\n",
            b"1000\nnine 1\n",
        ] {
            assert!(parse_conversation(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_continuation_counts_the_turns_and_the_time_used_and_refuses_another_model_age_size_or_junk(
    ) {
        let conv = |age, size: usize, bytes: &[u8]| Conversation {
            age: Duration::from_secs(age),
            size: size as u64,
            bytes: bytes.to_vec(),
        };
        let within = Duration::from_secs(600);
        let c = continuation(&agent(None), &conv(40, TURNS.len(), TURNS), within, None).unwrap();
        assert_eq!((c.turns, c.cli_session.as_str()), (2, "c1"));
        assert_eq!(c.from_session, "first-run");
        // Started 100 s ago, last written 40 s ago: 60 s used.
        assert!((59..=61).contains(&c.used.as_secs()), "{:?}", c.used);
        let refused = |a: &AgentRecord, c: &Conversation, model| {
            continuation(a, c, within, model).unwrap_err()
        };
        let why = refused(&agent(Some("opus")), &conv(1, 10, TURNS), Some("sonnet"));
        assert!(
            why.contains("model opus") && why.contains("asks for sonnet"),
            "{why}"
        );
        let why = refused(&agent(None), &conv(601, 10, TURNS), None);
        assert!(
            why.contains("601 s ago, more than resumeInterrupted (600 s)"),
            "{why}"
        );
        let why = refused(&agent(None), &conv(1, MAX_CONVERSATION + 1, TURNS), None);
        assert!(why.contains("more than the"), "{why}");
        let why = refused(
            &agent(None),
            &conv(1, 20, b"{\"type\":\"user\"}\nthis is not json\n"),
            None,
        );
        assert!(
            why.contains("line 2 of the conversation is not JSON"),
            "{why}"
        );
    }

    #[test]
    fn a_pod_is_continued_only_where_it_lives_long_enough_for_the_rest_and_kept_until_then() {
        let times = Times {
            agent: Some(Duration::from_secs(1000)),
            extraction: Duration::from_secs(100),
        };
        let used = Duration::from_secs(400);
        // Needs 600 + 100 + 60 s.
        assert!(times.room(Some(now_ms() + 800_000), used).is_ok());
        let why = times.room(Some(now_ms() + 700_000), used).unwrap_err();
        assert!(why.contains("less than the 760 s"), "{why}");
        assert!(times.room(None, used).is_ok(), "a pod with no deadline");
        let unbounded = Times {
            agent: None,
            extraction: Duration::from_secs(100),
        };
        assert!(unbounded.room(Some(now_ms()), used).is_ok());
        let now = now_ms();
        let ends = now + 800_000;
        let until = times.keep_until(
            Some(ends),
            used,
            Duration::from_secs(10),
            Duration::from_secs(3600),
        );
        assert_eq!(until, ends - 760_000, "the pod's end decides");
        let until = times.keep_until(
            Some(ends),
            used,
            Duration::from_secs(10),
            Duration::from_secs(20),
        );
        assert!(
            (now + 9_000..=now + 11_000).contains(&until),
            "the bound decides"
        );
    }
}
