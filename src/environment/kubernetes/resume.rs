//! Continuing an interrupted Implementor in its pod (`resumeInterrupted`), as
//! [`crate::git::interrupted`] does with a local checkout: the engine that ran it died (or let
//! it go at `shutdown()`), the work item is dispatched again on the same branch, and the new
//! session takes over the pod — its checkout as the agent left it, and its CLI conversation,
//! which the pod keeps in `{STATE}/claude-config` — instead of saving the work as a patch and
//! paying for every step again.
//!
//! - **What the pod records** ([`AgentRecord`], [`ANNOTATION_AGENT`], with the branch as
//!   [`LABEL_BRANCH`]): once its CLI started, the session id, branch, conversation id, model
//!   and the CLI's start; removed once the session ended for good. Nothing of it is secret,
//!   and the pod's processes cannot read or write it (no service-account token).
//! - **Taking it over** ([`super::KubernetesBackend`]'s provision): among the pods the sweep
//!   would take (a dead engine's of this host, the identity's with `engineId`, or one let go),
//!   the one recording this repository and branch is made the new session's on the version
//!   listed (`Cluster::take_over`), so of two engines exactly one takes it. Then it must be
//!   continuable: the same model; a conversation in the pod that is a regular file (no link
//!   followed), of at most [`MAX_CONVERSATION`] bytes, every complete line JSON, last written
//!   within the bound — all read as data, in the pod, by a command outside the jail; and the
//!   pod must live (`activeDeadlineSeconds`) long enough for the agent time left plus the
//!   extraction. Otherwise its work is saved as the sweep saves it, the pod deleted, and the
//!   session starts afresh with a warning saying why.
//! - **Clocks**: the interruption's age is the pod's clock against the pod's clock (`date`
//!   against the conversation's mtime); the time used is the engine's clock against the
//!   engine's (the CLI's start, less that age). The pod's end compares the engine's clock with
//!   the pod's start as the cluster recorded it, which a minute's margin covers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cluster::{
    label_value, Cluster, Orphan, Pod, ANNOTATION_AGENT, ANNOTATION_LEFT, LABEL_BRANCH,
};
use super::history::{self, HistoryServer};
use super::image::ImageFacts;
use super::layout::{HOME, SOCKETS, STATE, WORKDIR};
use super::node_base::{Found, Holder};
use super::steps::{sh_quote, Steps, STEP_TIMEOUT};
use super::sweep::{self, save_work};
use super::work::WorkRecord;
use super::{
    engine_dirs, make_dirs, session_env, sockets_and_files, with_identity, KubernetesBackend,
    KubernetesEnvironment,
};
use crate::clock::now_ms;
use crate::environment::remote::{RemoteCommand, RemoteShell};
use crate::environment::{EnvRequest, Workspace};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::interrupted::turns_in;
use crate::git::worktree::Continuation;
use crate::git::ProvisionRequest;
use crate::process::Owner;
use crate::sandbox::Egress;

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
/// (`read`) at most [`MAX_CONVERSATION`] bytes of it; exit 3 when there is no such regular file.
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
        "f=$(find {STATE}/claude-config/projects {HOME}/.claude/projects -mindepth 2 -maxdepth 2 \
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

/// An interrupted session's pod the new one may take: a dead engine's (or one let go) with
/// its agent recorded, still running, its work unsaved.
struct Interrupted {
    orphan: Orphan,
    agent: AgentRecord,
    work: WorkRecord,
}

impl KubernetesBackend {
    /// The interrupted session on `req`'s branch continued in its pod (the module docs).
    /// `None`: there is none, another process took it, or it cannot be continued, in which
    /// case its work was saved, its pod deleted and why logged (a pod whose work could not be
    /// read is left for the next sweep). The new session then starts afresh.
    pub(super) async fn continue_interrupted(
        &self,
        cluster: &Cluster,
        req: &EnvRequest,
    ) -> Option<KubernetesEnvironment> {
        let Workspace::Checkout(p) = &req.workspace else {
            return None;
        };
        let within = p.continue_within?;
        self.await_identity(cluster, p).await;
        for found in self.interrupted(cluster, req, p).await {
            match cluster.take_over(&found.orphan, &req.session_id).await {
                Ok(true) => return self.continue_in(found, req, p, within).await,
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(pod = %found.orphan.pod.name, error = %e.message, "could not take over an interrupted session's pod; it is left for the sweep");
                }
            }
        }
        None
    }

    /// With `engineId`, a predecessor's pods are this process's to take only once it holds the
    /// identity, which the sweep at `createClaudeAdapter` may still be waiting for (a
    /// predecessor on another host is waited out: [`super::lease`]). An engine coming back
    /// dispatches its interrupted work items at once, so a dispatch on a branch one of the
    /// identity's other pods ran waits for the identity (bounded: two Lease durations and ten
    /// seconds; past that, the session starts afresh and the pod is the sweep's).
    async fn await_identity(&self, cluster: &Cluster, p: &ProvisionRequest) {
        let Some(id) = &self.config.engine_id else {
            return;
        };
        if *self.identity_held.borrow() {
            return;
        }
        let theirs = cluster.orphans(Some(id)).await.unwrap_or_default();
        let ran_here = theirs.iter().any(|o| {
            let agent = o.agent.as_deref().map(serde_json::from_str::<AgentRecord>);
            matches!(agent, Some(Ok(a)) if a.branch == p.branch)
        });
        if !ran_here {
            return;
        }
        tracing::info!(engine = %id, branch = %p.branch, "a session of this engineId's predecessor ran on this branch: waiting for the identity before continuing it");
        let bound = 2 * self.config.engine_lease + Duration::from_secs(10);
        let mut held = self.identity_held.subscribe();
        if tokio::time::timeout(bound, held.wait_for(|h| *h))
            .await
            .is_err()
        {
            tracing::warn!(engine = %id, branch = %p.branch, "the engineId was not held within {} s: the session starts afresh, and its predecessor's pod is the sweep's", bound.as_secs());
        }
    }

    /// The pods of interrupted sessions of `req`'s repository on `p`'s branch.
    async fn interrupted(
        &self,
        cluster: &Cluster,
        req: &EnvRequest,
        p: &ProvisionRequest,
    ) -> Vec<Interrupted> {
        let mut orphans = match cluster.orphans(None).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e.message, "the pods of interrupted sessions could not be listed; the session starts afresh (a continuable one is saved by the sweep)");
                return Vec::new();
            }
        };
        if let Some(id) = self.held_identity() {
            orphans.extend(cluster.orphans(Some(id)).await.unwrap_or_default());
        }
        let mut seen = std::collections::HashSet::new();
        orphans
            .into_iter()
            .filter(|o| o.running && o.salvaged.is_none() && seen.insert(o.pod.name.clone()))
            .filter_map(|orphan| {
                let agent: AgentRecord = serde_json::from_str(orphan.agent.as_deref()?).ok()?;
                let work: WorkRecord = serde_json::from_str(orphan.work.as_deref()?).ok()?;
                (agent.branch == p.branch && work.repository == req.repo_root).then_some(
                    Interrupted {
                        orphan,
                        agent,
                        work,
                    },
                )
            })
            .collect()
    }

    /// The taken-over pod `found` continued, or its work saved and the pod deleted.
    async fn continue_in(
        &self,
        found: Interrupted,
        req: &EnvRequest,
        p: &ProvisionRequest,
        within: Duration,
    ) -> Option<KubernetesEnvironment> {
        let pod = Arc::new(found.orphan.pod.clone());
        let (shell, image) = match sweep::open(&pod).await {
            Ok(opened) => opened,
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e.message, "the interrupted session's pod does not answer: it is left for the sweep, and the session starts afresh");
                let _ = pod
                    .annotate(ANNOTATION_LEFT, Some(&Owner::current().to_record()))
                    .await;
                return None;
            }
        };
        let from = &found.agent.session_id;
        let read_env = super::image::pod_env(&[], &[], &image);
        let checked = async {
            if req.sandbox.is_some() != found.work.sandboxed {
                return Err("it ran with another sandbox setting".to_string());
            }
            let conversation =
                conversation(&shell, &read_env, &found.agent.cli_session, true).await?;
            let c = continuation(&found.agent, &conversation, within, p.model.as_deref())?;
            self.times.room(found.orphan.ends_ms(), c.used)?;
            Ok(c)
        };
        let why = match checked.await {
            Ok(c) => match resume_in(pod.clone(), shell, image, req, found.work.clone(), c).await {
                Ok(env) => return Some(env),
                Err((shell, e)) => (shell, e),
            },
            Err(why) => (shell, why),
        };
        let (shell, why) = why;
        tracing::warn!(pod = %pod.name, session = %from, branch = %p.branch, "the interrupted session {from} cannot be continued in its pod {}: {why}; its work is saved and the session starts afresh", pod.name);
        let saved = save_work(&shell, &read_env, &pod, &found.work, from).await;
        sweep::close(&pod, shell).await;
        match saved {
            Ok(_) => {
                if let Err(e) = pod.delete().await {
                    tracing::warn!(pod = %pod.name, error = %e.message, "could not delete a pod");
                }
            }
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e.message, "the interrupted session's work could not be read out of its pod; the pod is left for the sweep");
                let _ = record_agent(&pod, None).await;
                let _ = pod
                    .annotate(ANNOTATION_LEFT, Some(&Owner::current().to_record()))
                    .await;
            }
        }
        None
    }
}

/// The pod of a continuable session made the new session's: what `prepare` makes per session
/// made again — the egress (relay, proxy, forwarder) and its sockets, the agent's scripts,
/// the git config, the history server and, on a layer, the hold on the node's base — over a
/// new stream. The checkout, its snapshot and the conversation are the pod's already. On a
/// failure the shell comes back, for the work to be saved over it.
async fn resume_in(
    pod: Arc<Pod>,
    shell: RemoteShell,
    image: ImageFacts,
    req: &EnvRequest,
    work: WorkRecord,
    continued: Continuation,
) -> std::result::Result<KubernetesEnvironment, (RemoteShell, String)> {
    let made = async {
        let egress = Egress::start(
            req.sandbox.as_ref(),
            &req.env,
            req.egress.clone(),
            Some(&req.repo_root),
            req.api.clone(),
        )
        .await?;
        make_dirs(&shell, &image.path).await?;
        let dirs = engine_dirs(
            &req.env,
            &req.repo_root,
            std::env::var_os("HOME"),
            std::env::current_dir().ok(),
        );
        let env = session_env(egress.env(), &dirs, &image, req.sandbox.as_ref());
        let step = Steps {
            shell: &shell,
            env: &env,
        };
        let gitconfig = with_identity(egress.git_config());
        step.write_file(&format!("{STATE}/gitconfig"), gitconfig.as_bytes(), "0644")
            .await?;
        let held = match &work.node_base {
            Some(key) => match Holder::find(&step, key).await? {
                (mut holder, Found::Hit { .. }) => {
                    holder.hold_mount(&step).await;
                    Some(holder)
                }
                (_, Found::Miss { .. }) => {
                    return Err(AdapterError::new(
                        ErrorCode::Provision,
                        "the node's base its checkout is layered on is gone",
                    ))
                }
            },
            None => None,
        };
        sockets_and_files(&step, &egress, work.sandboxed).await?;
        let history =
            HistoryServer::start(&req.repo_root, req.workspace.default_branch(), &work.base)
                .await?;
        shell
            .listen(&format!("{SOCKETS}/{}", history::SOCKET), history.socket())
            .await?;
        Ok::<_, AdapterError>((egress, env, held, history))
    };
    let (egress, env, held, history) = match made.await {
        Ok(made) => made,
        Err(e) => return Err((shell, e.message)),
    };
    let agent = match &req.workspace {
        Workspace::Checkout(p) => Some((p.session.clone(), p.branch.clone())),
        Workspace::View(_) => None,
    };
    tracing::info!(pod = %pod.name, from = %continued.from_session, "the interrupted session continues in its pod");
    Ok(KubernetesEnvironment {
        sandboxed: work.sandboxed,
        pod,
        shell: Some(shell),
        egress: Some(egress),
        env,
        workdir: PathBuf::from(WORKDIR),
        work: Some(work),
        agent,
        recorded: Default::default(),
        continued: Some(continued),
        _history: history,
        _node_base: held.map(std::sync::Mutex::new),
    })
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
