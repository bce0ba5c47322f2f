//! Pods started before a session asks for one (`backend.kubernetes.warmPods`).
//!
//! A pod's creation, scheduling and container start is most of what a session's start in a pod
//! costs over a local one (0.8–1.1 s on the test cluster, before any image pull), and nothing
//! in it is the session's: the spec is the config's and the image's, the session's own
//! labels, id and deadline can be given later ([`Cluster::claim`]), and everything else
//! reaches the pod over its stream. So the pool keeps up to `warmPods` pods Running, each of
//! them fresh (no session ever ran in it) and used by one session only; a session that takes
//! one starts a replacement. A session the pool cannot serve (empty, or another image) starts
//! its own pod as before, and the pool's next pods are of that session's kind (the adapter
//! serves one repository: its sessions' pods are alike).
//!
//! What is kept is bounded and never left behind: the pool's pods are this process's (the
//! owner annotation: a dead engine's are swept by the next one, `Cluster::sweep`); with a
//! `maxAgentDuration`, a warm pod's own `activeDeadlineSeconds` is [`IDLE_LIFE`] more, and one
//! idle longer than [`IDLE_USE`] is deleted rather than used; `shutdown()` deletes them all
//! ([`WarmPool::close`]). A warm pod that fails to start is not retried before [`RETRY_AFTER`]:
//! a cluster that refuses pods (a quota, an image it cannot pull) is not asked again and
//! again, and its sessions get its reason from their own pod.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::cluster::{Cluster, Pod, PodExec, PodRequest};
use crate::domain::Role;
use crate::error::Result;
use crate::process::Owner;

/// How long a warm pod may wait for its session beyond the session's own deadline.
const IDLE_LIFE: Duration = Duration::from_secs(3600);
/// A warm pod idle longer is not used (its deadline is near); deleted instead.
const IDLE_USE: Duration = Duration::from_secs(3300);
/// No new warm pod is started within this of one that failed to start.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What a pod is made as, beyond the config: the pool's pods serve requests of one kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Kind {
    /// [`PodRequest::image`].
    pub image: Option<String>,
    /// [`PodRequest::node_bases`].
    pub node_bases: bool,
}

impl Kind {
    /// `req`'s kind, when a warm pod may serve it: the process's own, the image contract's
    /// command (tests run plain images with their own).
    pub fn of(req: &PodRequest) -> Option<Kind> {
        (req.command.is_none() && req.owner == Owner::current()).then(|| Kind {
            image: req.image.clone(),
            node_bases: req.node_bases,
        })
    }
}

/// The warm pods of one backend (module docs).
pub(super) struct WarmPool {
    size: usize,
    /// The sessions' `activeDeadlineSeconds` (`maxAgentDuration`).
    deadline: Option<Duration>,
    state: Mutex<State>,
    /// Ends the pods still starting; set by [`WarmPool::close`].
    closed: CancellationToken,
}

#[derive(Default)]
struct State {
    kind: Option<Kind>,
    /// Running and unclaimed, with when each was asked for.
    ready: Vec<(Pod, Instant)>,
    starting: usize,
    /// The tasks starting pods (finished ones are dropped as new ones start).
    tasks: Vec<tokio::task::JoinHandle<()>>,
    failed_at: Option<Instant>,
}

impl WarmPool {
    pub fn new(size: usize, deadline: Option<Duration>) -> WarmPool {
        WarmPool {
            size,
            deadline,
            state: Mutex::default(),
            closed: CancellationToken::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding these short critical sections cannot leave them inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a warm pod of `req`'s kind is there now (it may be taken by another session
    /// before this one asks).
    pub fn has(&self, req: &PodRequest) -> bool {
        let state = self.state();
        Kind::of(req).is_some_and(|k| state.kind.as_ref() == Some(&k)) && !state.ready.is_empty()
    }

    /// A warm pod made `req`'s, its stream running `argv`: `None` when the pool has none of
    /// `req`'s kind (or claiming it failed: the pod is gone, and the session starts its own).
    /// Either way the pool is topped up with pods of `req`'s kind. A `stop` while claiming is
    /// the error [`Cluster::claim`] gives (the pod deleted).
    pub async fn take(
        self: &Arc<Self>,
        cluster: &Arc<Cluster>,
        req: &PodRequest,
        stop: &CancellationToken,
        argv: &[String],
    ) -> Option<Result<(Pod, PodExec)>> {
        let kind = Kind::of(req)?;
        if self.size == 0 {
            return None;
        }
        let taken = {
            let mut state = self.state();
            let mut stale = Vec::new();
            let mut taken = None;
            if state.kind.as_ref() == Some(&kind) {
                while let Some((pod, since)) = state.ready.pop() {
                    if since.elapsed() < IDLE_USE {
                        taken = Some((pod, since));
                        break;
                    }
                    stale.push(pod);
                }
            }
            state.delete(stale);
            taken
        };
        self.fill(cluster, kind);
        let (pod, since) = taken?;
        let name = pod.name.clone();
        match cluster.claim(pod, since, req, stop, argv).await {
            Ok(claimed) => {
                tracing::debug!(pod = %name, waited_ms = since.elapsed().as_millis() as u64, "the session took a warm pod");
                Some(Ok(claimed))
            }
            Err(e) if stop.is_cancelled() => Some(Err(e)),
            Err(e) => {
                tracing::debug!(pod = %name, error = %e.message, "a warm pod could not be claimed; the session starts its own");
                None
            }
        }
    }

    /// Starts pods of `kind` until the pool holds `size` (a pool of another kind is emptied
    /// first), in the background.
    pub fn fill(self: &Arc<Self>, cluster: &Arc<Cluster>, kind: Kind) {
        let mut state = self.state();
        if self.closed.is_cancelled() || state.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER)
        {
            return;
        }
        if state.kind.as_ref() != Some(&kind) {
            let other = state.ready.drain(..).map(|(p, _)| p).collect();
            state.delete(other);
            state.kind = Some(kind.clone());
        }
        let missing = self.size.saturating_sub(state.ready.len() + state.starting);
        state.starting += missing;
        state.tasks.retain(|t| !t.is_finished());
        for _ in 0..missing {
            let (pool, cluster, kind) = (self.clone(), cluster.clone(), kind.clone());
            let task = tokio::spawn(
                async move {
                    let since = Instant::now();
                    let mut req = PodRequest::new("", Role::Implementor);
                    req.warm = true;
                    req.image = kind.image.clone();
                    req.node_bases = kind.node_bases;
                    req.active_deadline = pool.deadline.map(|d| d + IDLE_LIFE);
                    let started = cluster.create_pod(req, &pool.closed).await;
                    if let Some(unused) = pool.started(started, since, &kind) {
                        delete(unused).await;
                    }
                }
                .in_current_span(),
            );
            state.tasks.push(task);
        }
    }

    /// Keeps a pod that `started`, unless the pool closed or serves another kind meanwhile:
    /// then it is returned, to be deleted.
    fn started(&self, started: Result<Pod>, since: Instant, kind: &Kind) -> Option<Pod> {
        let mut state = self.state();
        state.starting -= 1;
        match started {
            Ok(pod) if !self.closed.is_cancelled() && state.kind.as_ref() == Some(kind) => {
                tracing::debug!(pod = %pod.name, "a warm pod is ready");
                state.ready.push((pod, since));
                None
            }
            Ok(pod) => Some(pod),
            Err(e) => {
                state.failed_at = Some(Instant::now());
                if !self.closed.is_cancelled() {
                    tracing::warn!(error = %e.message, "a warm pod (backend.kubernetes.warmPods) could not be started; sessions start their own pods");
                }
                None
            }
        }
    }

    /// Deletes every warm pod, and ends those still starting, which delete theirs
    /// ([`Cluster::create_pod`]'s stop): no pod of the pool is left once this returns.
    pub async fn close(&self) {
        self.closed.cancel();
        let tasks = std::mem::take(&mut self.state().tasks);
        futures::future::join_all(tasks).await;
        let ready: Vec<Pod> = self.state().ready.drain(..).map(|(p, _)| p).collect();
        futures::future::join_all(ready.into_iter().map(delete)).await;
    }
}

impl State {
    /// Deletes `pods` in the background ([`WarmPool::close`] waits for it).
    fn delete(&mut self, pods: Vec<Pod>) {
        self.tasks
            .extend(pods.into_iter().map(|p| tokio::spawn(delete(p))));
    }
}

async fn delete(pod: Pod) {
    if let Err(e) = pod.delete().await {
        tracing::warn!(pod = %pod.name, error = %e.message, "could not delete a warm pod");
    }
}
