//! Continuing an interrupted Implementor in its pod (`resumeInterrupted`), as
//! [`crate::git::interrupted`] does with a local checkout: the engine that ran it died (or let
//! it go at `shutdown()`), the work item is dispatched again on the same branch, and the new
//! session takes over the pod — its checkout as the agent left it, and its CLI conversation,
//! which the pod keeps in `{STATE}/claude-config` — instead of saving the work as a patch and
//! paying for every step again.
//!
//! - **What the pod records** ([`AgentRecord`], [`super::cluster::ANNOTATION_AGENT`], with the
//!   branch as [`super::cluster::LABEL_BRANCH`]): once its CLI started, the session id, branch, conversation id, model
//!   and the CLI's start; removed once the session ended for good. Nothing of it is secret,
//!   and the pod's processes cannot read or write it (no service-account token).
//! - **Taking it over** ([`super::KubernetesBackend`]'s provision): among the pods the sweep
//!   would take (a dead engine's of this host, the identity's with `engineId`, or one let go),
//!   the one recording this repository and branch is made the new session's on the version
//!   listed (`Cluster::take_over`), so of two engines exactly one takes it. Then it must be
//!   continuable: the same model; a conversation in the pod that is a regular file (no link
//!   followed), of at most [`super::interruption::MAX_CONVERSATION`] bytes, every complete line JSON, last written
//!   within the bound — all read as data, in the pod, by a command outside the jail; and the
//!   pod must live (`activeDeadlineSeconds`) long enough for the agent time left plus the
//!   extraction. Otherwise its work is saved as the sweep saves it, the pod deleted, and the
//!   session starts afresh with a warning saying why.
//! - **What is made again** ([`resume_in`]): what `prepare` makes per session — the egress and
//!   its sockets, the agent's scripts, the git config, the history server and, on a layer, the
//!   hold on the node's base (its key is in the work record) — over a new stream.
//! - **Let go at `shutdown()`**: a session the engine stops there leaves its pod annotated
//!   [`ANNOTATION_LEFT`] instead of deleting it, and the next dispatch (or, past the bound, the
//!   sweep) takes it although its owner lives on.
//! - **With `engineId`**, an engine that comes back elsewhere waits for its identity before it
//!   looks ([`Ctx::await_identity`]).
//! - **Clocks**: the interruption's age is the pod's clock against the pod's clock (`date`
//!   against the conversation's mtime); the time used is the engine's clock against the
//!   engine's (the CLI's start, less that age). The pod's end compares the engine's clock with
//!   the pod's start as the cluster recorded it, which a minute's margin covers.

use std::sync::Arc;
use std::time::Duration;

use super::cluster::{Cluster, Orphan, Pod, ANNOTATION_LEFT};
use super::history::{self, HistoryServer};
use super::image::ImageFacts;
use super::interruption::{continuation, conversation, record_agent, AgentRecord, Times};
use super::layout::{SOCKETS, STATE};
use super::node_base::{Found, Holder};
use super::session_setup::{dirs_and_env, sockets_and_files, with_identity};
use super::steps::Steps;
use super::sweep::{self, save_work};
use super::work::WorkRecord;
use crate::environment::remote::RemoteShell;
use crate::environment::{EnvRequest, Workspace};
use crate::error::{AdapterError, ErrorCode};
use crate::git::worktree::Continuation;
use crate::git::ProvisionRequest;
use crate::process::Owner;
use crate::sandbox::Egress;

/// An interrupted session's pod the new one may take: a dead engine's (or one let go) with
/// its agent recorded, still running, its work unsaved.
struct Interrupted {
    orphan: Orphan,
    agent: AgentRecord,
    work: WorkRecord,
}

/// What a continuation needs of the backend.
pub(super) struct Ctx<'a> {
    /// `engineId` and `engineLease`.
    pub engine_id: Option<&'a str>,
    pub engine_lease: Duration,
    /// True while this process holds the identity.
    pub identity_held: &'a tokio::sync::watch::Sender<bool>,
    pub times: &'a Times,
}

/// A pod taken over for a continuation, with what was made for the new session in it: the
/// session's environment is made of these.
pub(super) struct Resumed {
    pub pod: Arc<Pod>,
    pub shell: RemoteShell,
    pub egress: Egress,
    pub env: Vec<(String, String)>,
    pub work: WorkRecord,
    pub continued: Continuation,
    pub history: HistoryServer,
    pub held: Option<Holder>,
}

impl Ctx<'_> {
    /// The interrupted session on `req`'s branch continued in its pod (the module docs).
    /// `None`: there is none, another process took it, or it cannot be continued, in which
    /// case its work was saved, its pod deleted and why logged (a pod whose work could not be
    /// read is left for the next sweep). The new session then starts afresh.
    pub(super) async fn continue_interrupted(
        &self,
        cluster: &Cluster,
        req: &EnvRequest,
    ) -> Option<Resumed> {
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
        let Some(id) = self.engine_id else {
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
        let bound = 2 * self.engine_lease + Duration::from_secs(10);
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
        let held = *self.identity_held.borrow();
        if let Some(id) = self.engine_id.filter(|_| held) {
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
    ) -> Option<Resumed> {
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
                Ok(resumed) => return Some(resumed),
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
) -> std::result::Result<Resumed, (RemoteShell, String)> {
    let made = async {
        let egress = Egress::start(
            req.sandbox.as_ref(),
            &req.env,
            req.egress.clone(),
            Some(&req.repo_root),
            req.api.clone(),
        )
        .await?;
        let env = dirs_and_env(&shell, &image, req, &egress).await?;
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
    tracing::info!(pod = %pod.name, from = %continued.from_session, "the interrupted session continues in its pod");
    Ok(Resumed {
        pod,
        shell,
        egress,
        env,
        work,
        continued,
        history,
        held,
    })
}
