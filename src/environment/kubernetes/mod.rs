//! The Kubernetes environment: one pod per session, the same four steps as the local one.
//!
//! - **provision**: a pod of the session image ([`cluster`]), one exec stream into it running
//!   `cra-pod mux`, over which [`RemoteShell`] multiplexes everything else: processes with their
//!   stdio, and the pod's unix sockets tunnelled to the session's [`Egress`] (model relay,
//!   egress proxy, and the telemetry forwarder when the CLI's telemetry is on) on the engine.
//!   The pod needs no network, and the key and the allowlist stay here. The repository goes in
//!   as a pack of `defaultBranch`'s commit alone, streamed into the pod while its sockets and
//!   scripts are set up, and checked out there on the Implementor's branch (no remote, no URL,
//!   no engine path); the setup command runs, and the checkout is snapshotted as locally (with
//!   no setup and no attributes, the commit's tree is the snapshot: [`work`]).
//! - **exec**: the CLI runs in the pod under `cra-jail` (bubblewrap: its own network namespace,
//!   the checkout read-write or read-only, nothing else of the pod), behind the same socat
//!   bridges as the local sandbox.
//! - **extract**: a script in the jail stages the checkout into a temporary index, commits the
//!   snapshot and final trees, and streams them back as a bundle; the engine fetches that into
//!   a scratch repository borrowing the repository's objects and computes the patch with the
//!   local backend's own `patch_of_trees` — the same bytes by construction ([`work`]).
//! - **destroy**: `Bye` over the stream, then the pod is deleted and waited for.

pub mod cluster;
mod devcontainer;
pub mod history;
mod image;
mod interruption;
mod layout;
mod lease;
mod node_base;
mod resume;
mod session_setup;
mod steps;
mod sweep;
mod warm;
mod work;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::cluster::{Cluster, Pod, PodExec, PodRequest, ANNOTATION_LEFT};
use self::image::inspect_image;
use self::interruption::AgentRecord;
pub use self::interruption::Times;
use self::layout::{CLI, MUX, SOCKETS, STATE, WORKDIR};
use self::lease::EngineLease;
use self::node_base::{bind_base, use_layer, Found, Holder, LayerError};
use self::session_setup::{dirs_and_env, open_shell, sockets_and_files, with_identity};
use self::steps::{confined, PodSnapshot, Steps};
use self::warm::{Kind, WarmPool};
use self::work::{send_repository, CheckoutAs, Pack};
use super::remote::{RemoteCommand, RemoteShell};
use super::{Backend, EnvRequest, Environment, Exec, ExecCommand, Workspace};
use crate::config::{KubernetesConfig, SandboxConfig};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::record::SessionRecord;
use crate::git::worktree::Continuation;
use crate::process::Owner;
use crate::sandbox::{bridged_argv, Egress};

/// How long a pod whose stream broke is given to show why in its status.
const LOST_WAIT: Duration = Duration::from_secs(15);

/// Makes [`KubernetesEnvironment`]s; connects to the cluster on first use.
pub struct KubernetesBackend {
    config: Arc<KubernetesConfig>,
    cluster: tokio::sync::OnceCell<Arc<Cluster>>,
    /// The cluster-side backstop (`activeDeadlineSeconds`): the whole life a session may have.
    deadline: Option<Duration>,
    /// `warmPods`.
    pool: Arc<WarmPool>,
    /// The engine's identity (`engineId`, [`lease`]) once held, and the task renewing it.
    holding: std::sync::Mutex<Option<(tokio::task::AbortHandle, Arc<EngineLease>)>>,
    /// `resumeInterrupted`: how long a dead engine's Implementor pod waits for the next
    /// dispatch on its branch ([`resume`]).
    resume_within: Option<Duration>,
    /// What decides whether a continuation fits in its pod's life.
    times: Times,
    /// The sweep due when the earliest kept pod's wait ends.
    resweep: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// True once this process holds the identity (`engineId`): a dispatch continuing one of its
    /// predecessor's sessions waits for it ([`resume`]).
    identity_held: tokio::sync::watch::Sender<bool>,
}

impl Drop for KubernetesBackend {
    fn drop(&mut self) {
        self.stop_holding();
        self.stop_resweep();
    }
}

impl KubernetesBackend {
    /// `deadline`: the pods' `activeDeadlineSeconds`; `resume_within`: `resumeInterrupted`.
    pub fn new(
        config: KubernetesConfig,
        deadline: Option<Duration>,
        resume_within: Option<Duration>,
        times: Times,
    ) -> KubernetesBackend {
        KubernetesBackend {
            pool: Arc::new(WarmPool::new(config.warm_pods, deadline)),
            config: Arc::new(config),
            cluster: tokio::sync::OnceCell::new(),
            deadline,
            holding: std::sync::Mutex::default(),
            resume_within,
            times,
            resweep: std::sync::Mutex::default(),
            identity_held: tokio::sync::watch::Sender::new(false),
        }
    }

    fn stop_resweep(&self) {
        let task = self
            .resweep
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }

    /// How long a dead engine's Implementor pod waits for a continuation (`resumeInterrupted`).
    fn keep(&self) -> Option<sweep::Keep<'_>> {
        self.resume_within.map(|within| sweep::Keep {
            within,
            times: &self.times,
        })
    }

    /// The identity this process holds (`engineId`), if it does.
    fn held_identity(&self) -> Option<&str> {
        let held = *self.identity_held.borrow();
        self.config.engine_id.as_deref().filter(|_| held)
    }

    /// The cluster client (a failed connection is not remembered: the next session retries).
    pub async fn cluster(&self) -> Result<Arc<Cluster>> {
        self.cluster
            .get_or_try_init(|| async { Cluster::connect(&self.config).await.map(Arc::new) })
            .await
            .cloned()
    }

    /// Stops renewing the engine's identity; the Lease as it was left.
    fn stop_holding(&self) -> Option<Arc<EngineLease>> {
        let (task, lease) = self
            .holding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        task.abort();
        self.identity_held.send_replace(false);
        Some(lease)
    }

    /// The checkout's base kept once per node: only behind the pod's jail, which never shows
    /// the node's directory to the agent.
    fn node_bases(&self, sandbox: Option<&SandboxConfig>) -> bool {
        self.config.node_cache.is_some() && sandbox.is_some()
    }

    /// Sweeps again when the earliest kept pod's wait ends (`next`, Unix ms; a second past
    /// it), and so on while pods are kept: an interrupted session nobody dispatched again is
    /// saved then.
    fn sweep_at(&self, next: Option<u64>, cluster: Arc<Cluster>) {
        self.stop_resweep();
        let (Some(mut next), Some(within)) = (next, self.resume_within) else {
            return;
        };
        let identity = self.held_identity().map(str::to_string);
        let times = self.times.clone();
        let task = async move {
            let keep = sweep::Keep {
                within,
                times: &times,
            };
            loop {
                let wait = next.saturating_sub(crate::clock::now_ms()) + 1000;
                tokio::time::sleep(Duration::from_millis(wait)).await;
                match sweep_all(&cluster, identity.as_deref(), Some(&keep)).await {
                    Ok(swept) => match swept.next {
                        Some(n) => next = n,
                        None => return,
                    },
                    Err(e) => {
                        tracing::warn!(error = %e.message, "sweep: the cluster could not be swept; trying again in a minute");
                        next = crate::clock::now_ms() + 60_000;
                    }
                }
            }
        };
        let task = tokio::spawn(task.in_current_span()).abort_handle();
        *self.resweep.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }
}

/// One sweep of the host's dead engines' pods and, with the `identity` this process holds, the
/// identity's ([`sweep`]).
async fn sweep_all(
    cluster: &Cluster,
    identity: Option<&str>,
    keep: Option<&sweep::Keep<'_>>,
) -> Result<sweep::Swept> {
    let mut swept = sweep::sweep(cluster, None, keep).await?;
    if let Some(id) = identity {
        swept.merge(sweep::sweep(cluster, Some(id), keep).await?);
    }
    Ok(swept)
}

impl Backend for KubernetesBackend {
    fn preflight(&self, _env: &[(String, String)], _sandbox: Option<&SandboxConfig>) -> Result<()> {
        // The pod's own jail is tried while provisioning (it can only be tried in a pod).
        Ok(())
    }

    /// A pod has no network but the engine's egress, with or without its jail: the CLI's
    /// model requests always pass the relay.
    fn meters_model_requests(&self, _sandbox: Option<&SandboxConfig>) -> bool {
        true
    }

    fn cli_program(&self) -> Option<PathBuf> {
        Some(PathBuf::from(CLI))
    }

    /// Starts the warm pods (`warmPods`) of the sessions' usual kind: the configured image
    /// (a repository's devcontainer image is learnt from its first session).
    fn warm_up<'a>(
        &'a self,
        _env: &'a [(String, String)],
        sandbox: Option<&'a SandboxConfig>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.config.warm_pods == 0 {
                return;
            }
            match self.cluster().await {
                Ok(cluster) => self.pool.fill(
                    &cluster,
                    Kind {
                        image: None,
                        node_bases: self.node_bases(sandbox),
                    },
                ),
                Err(e) => {
                    tracing::warn!(error = %e.message, "no warm pods (backend.kubernetes.warmPods): the cluster cannot be reached; each session will try")
                }
            }
        })
    }

    /// The warm pods go, and the engine's identity is given up: a successor (a deploy's new
    /// process) takes it at once instead of waiting out the Lease.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.pool.close().await;
            // The kept pods are the next process's to continue or sweep, as a local sweep ends
            // at shutdown().
            self.stop_resweep();
            if let Some(lease) = self.stop_holding() {
                lease.release().await;
            }
        })
    }

    /// The host's dead engines' pods; with `engineId`, once this process holds the identity
    /// (waiting out a predecessor on another host: [`lease`]), the identity's other processes'
    /// pods too. The identity is then renewed while the backend lives.
    fn sweep(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move {
            let cluster = self.cluster().await?;
            if let Some(id) = &self.config.engine_id {
                let lease = Arc::new(EngineLease::new(&cluster, id, self.config.engine_lease));
                // The host's own first: its dead engines' pods need no Lease.
                let host = sweep_all(&cluster, None, self.keep().as_ref()).await?;
                let held = lease.acquire().await?;
                let hold = {
                    let lease = lease.clone();
                    async move { lease.hold(held).await }
                };
                let task = tokio::spawn(hold.in_current_span()).abort_handle();
                let before = self
                    .holding
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .replace((task, lease));
                if let Some((before, _)) = before {
                    before.abort();
                }
                self.identity_held.send_replace(true);
                let mut swept = sweep::sweep(&cluster, Some(id), self.keep().as_ref()).await?;
                swept.merge(host);
                self.sweep_at(swept.next, cluster);
                return Ok(swept.deleted);
            }
            let swept = sweep_all(&cluster, None, self.keep().as_ref()).await?;
            self.sweep_at(swept.next, cluster);
            Ok(swept.deleted)
        })
    }

    fn provision<'a>(
        &'a self,
        req: EnvRequest,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Box<dyn Environment>>> {
        Box::pin(async move {
            let cluster = self.cluster().await?;
            let ctx = resume::Ctx {
                engine_id: self.config.engine_id.as_deref(),
                engine_lease: self.config.engine_lease,
                identity_held: &self.identity_held,
                times: &self.times,
            };
            let continued = tokio::select! {
                c = ctx.continue_interrupted(&cluster, &req) => c,
                () = stop.cancelled() => return Err(stopped()),
            };
            if let Some(resumed) = continued {
                let env = KubernetesEnvironment::resumed(resumed, &req);
                return Ok(Box::new(env) as Box<dyn Environment>);
            }
            let mut request = PodRequest::new(req.session_id.clone(), req.role);
            request.active_deadline = self.deadline;
            let node_bases = self.node_bases(req.sandbox.as_ref());
            request.node_bases = node_bases;
            let default_branch = req.workspace.default_branch().to_string();
            if self.config.image.is_none() {
                if let Some(image) = devcontainer::image_at(&req.repo_root, &default_branch).await?
                {
                    tracing::info!(
                        session = %req.session_id,
                        image = %image,
                        "the session runs in the image the repository's {} names",
                        devcontainer::PATH
                    );
                    request.image = Some(image);
                }
            }
            // What needs no pod is made while the pod starts: the repository's pack (unless a
            // warm pod is there to take: then it is packed only if the pod has no base to
            // layer on) and the session's egress (relay, proxy, forwarder).
            let warm = self.pool.has(&request);
            let early = async {
                tokio::select! {
                    r = async {
                        tokio::try_join!(
                            async {
                                let pack = Pack::of(&req.repo_root, &default_branch).await?;
                                if !(warm && node_bases) {
                                    pack.start();
                                }
                                Ok(pack)
                            },
                            Egress::start(
                                req.sandbox.as_ref(),
                                &req.env,
                                req.egress.clone(),
                                Some(&req.repo_root),
                                req.api.clone(),
                            ),
                        )
                    } => r,
                    () = stop.cancelled() => Err(stopped()),
                }
            };
            let mux: Vec<String> = MUX.iter().map(|s| s.to_string()).collect();
            let start = async {
                match self.pool.take(&cluster, &request, stop, &mux).await {
                    Some(claimed) => claimed,
                    None => cluster.start_pod_with(request, stop, &mux).await,
                }
            };
            let (started, early) = tokio::join!(start, early);
            let (pod, stream) = started?;
            let pod = Arc::new(pod);
            let made = match early {
                Ok((pack, egress)) => tokio::select! {
                    r = prepare(pod.clone(), stream, req, pack, egress, node_bases) => r,
                    () = stop.cancelled() => Err(stopped()),
                },
                Err(e) => Err(e),
            };
            match made {
                Ok(env) => Ok(Box::new(env) as Box<dyn Environment>),
                Err(e) => {
                    let e = match pod.why_gone().await {
                        Some(lost) => lost.with_shared_cause(Arc::new(e)),
                        None => e,
                    };
                    if let Err(d) = pod.delete().await {
                        tracing::warn!(pod = %pod.name, error = %d, "could not delete a pod");
                    }
                    Err(e)
                }
            }
        })
    }
}

fn stopped() -> AdapterError {
    AdapterError::new(
        ErrorCode::Cancelled,
        "the session was stopped while its pod was being prepared",
    )
}

/// Everything between a running pod (its stream, `cra-pod mux`, open) and a session ready for
/// its CLI, with what was made while it started: the shell over the stream, the pod's
/// directories and environment, the git config and the node's base, then the checkout (a
/// layer on the node's base, or made in the pod) beside the sockets, history server and probe.
async fn prepare(
    pod: Arc<Pod>,
    exec: PodExec,
    req: EnvRequest,
    pack: Pack,
    egress: Egress,
    node_bases: bool,
) -> Result<KubernetesEnvironment> {
    // Where a pod's start goes, for the log (a slow start is otherwise one number).
    let mut phases = Phases::default();
    let shell = open_shell(&pod, exec).await?;
    let image = inspect_image(&shell, &pod.image).await?;
    phases.mark("stream and image probe");
    let env = dirs_and_env(&shell, &image, &req, &egress).await?;
    let step = Steps {
        shell: &shell,
        env: &env,
    };
    let sandboxed = req.sandbox.is_some();
    let in_pod = InPod::of(&step, &pack, &req.workspace, sandboxed);
    let gitconfig = with_identity(egress.git_config());
    // The image as named: its id may come later (the base records it, checked below).
    let key = node_bases.then(|| {
        let setup = in_pod.setup.map(|(s, _)| s);
        node_base::key(&pack.base, setup, &pod.image, &gitconfig)
    });
    let node = git_config_and_base(&step, &pod, &gitconfig, key.clone()).await?;
    phases.mark("git config and the node's base");
    // The repository travels while the sockets, the agent's scripts, the history server and the
    // jail's probe are set up: every step is a round trip through the API server, and the pack
    // is the longest. A base on the node needs no pack, and its layer's step is the jail's probe.
    let probe = sandboxed && !matches!(node, Some((_, Found::Hit { .. })));
    let beside = async {
        sockets_and_files(&step, &egress, sandboxed).await?;
        let history =
            history::HistoryServer::start(&req.repo_root, in_pod.default_branch, &pack.base)
                .await?;
        shell
            .listen(&format!("{SOCKETS}/{}", history::SOCKET), history.socket())
            .await?;
        if probe {
            step.jail_works().await?;
        }
        Ok::<_, AdapterError>(history)
    };
    let made = match node {
        Some((holder, found)) => {
            on_node_base(&pod, &in_pod, holder, found, beside, &mut phases).await?
        }
        None => {
            let (received, history) = tokio::try_join!(in_pod.send(), beside)?;
            phases.mark("repository, sockets, history server and jail probe");
            Made {
                snapshot: in_pod.finish(received, &mut phases).await?,
                history,
                held: None,
                layered_end: false,
            }
        }
    };
    let snapshot = made.snapshot.filter(|_| in_pod.checkout_as.is_some());
    let agent = agent_of(&req);
    let work = snapshot.map(|s| work::WorkRecord {
        repository: req.repo_root,
        base: pack.base.clone(),
        snapshot: s.commit,
        trust_before: s.trust_before,
        sandboxed,
        layered_end: made.layered_end,
        node_base: key.filter(|_| made.held.is_some()),
    });
    if let Some(record) = &work {
        // Before the agent starts: a pod whose engine dies later is read by this (the sweep).
        sweep::record_work(&pod, record).await?;
    }
    let pack_kib = pack.kib();
    drop(pack);
    tracing::debug!(pod = %pod.name, pack_kib, "the pod was prepared in {phases}");
    Ok(KubernetesEnvironment {
        pod,
        shell: Some(shell),
        egress: Some(egress),
        env,
        workdir: PathBuf::from(WORKDIR),
        work,
        agent,
        recorded: AtomicBool::default(),
        continued: None,
        sandboxed,
        _history: made.history,
        _node_base: made.held.map(std::sync::Mutex::new),
    })
}

/// The session's git config written in the pod (git reads it — core.autocrlf, core.eol — when
/// the repository is checked out) and meanwhile, given the checkout's `key` (node bases), the
/// node asked for its base: `None` without node bases, or where the node cannot keep one (said
/// once).
async fn git_config_and_base(
    step: &Steps<'_>,
    pod: &Pod,
    gitconfig: &str,
    key: Option<String>,
) -> Result<Option<(Holder, Found)>> {
    let find = async {
        let key = key?;
        Some(Holder::find(step, &key).await)
    };
    let config_file = format!("{STATE}/gitconfig");
    let (written, found) = tokio::join!(
        step.write_file(&config_file, gitconfig.as_bytes(), "0644"),
        find
    );
    written?;
    Ok(match found {
        Some(Ok(found)) => Some(found),
        Some(Err(e)) => {
            node_base::without_base(&pod.name, &pod.node, &e.message);
            None
        }
        None => None,
    })
}

/// The checkout, with the history server that `beside` started while it was made.
struct Made {
    snapshot: Option<PodSnapshot>,
    history: history::HistoryServer,
    /// The node's base the checkout is layered on, held while the session lives.
    held: Option<Holder>,
    /// The checkout is a layer on a base verified for it.
    layered_end: bool,
}

/// The checkout as a layer on the node's base: the base the node has (`Hit`), or one made here
/// and published (`Miss`) while `beside` runs. Where the layer is refused (the base is not this
/// pod's image's, the pod cannot mount it) the checkout is made in the pod after all.
async fn on_node_base(
    pod: &Pod,
    in_pod: &InPod<'_>,
    mut holder: Holder,
    found: Found,
    beside: impl Future<Output = Result<history::HistoryServer>>,
    phases: &mut Phases,
) -> Result<Made> {
    let step = in_pod.step;
    let branch = in_pod.checkout_as.map(|c| c.branch);
    let (layered, base, how, history) = match found {
        Found::Hit {
            tree,
            snapshot,
            verified,
            image_id,
        } => {
            let (layered, history) = tokio::join!(use_layer(step, &tree, branch), beside);
            let base = node_base::Published {
                tree,
                snapshot,
                verified,
                image_id,
            };
            (layered, base, "kept on the node", history?)
        }
        Found::Miss { tree: made_in } => {
            let (base, history) =
                make_base(pod, in_pod, &mut holder, &made_in, beside, phases).await?;
            let how = match base.tree == made_in {
                true => "made here",
                false => "another pod's, made at the same time",
            };
            (
                use_layer(step, &base.tree, branch).await,
                base,
                how,
                history,
            )
        }
    };
    phases.mark("the layer on the node's base");
    let image_id = pod.image_id().await;
    let layered = match layered {
        Ok(()) => match another_image(&base.image_id, &image_id) {
            Some(why) => {
                holder.unpublish().await;
                node_base::drop_layer(step).await;
                Err(LayerError::Refused(why))
            }
            None => Ok(()),
        },
        layered => layered,
    };
    match layered {
        Ok(()) => {
            holder.hold_mount(step).await;
            layered_on(pod, &base.tree, how);
            Ok(Made {
                snapshot: Some(base.snapshot),
                history,
                held: Some(holder),
                layered_end: base.verified,
            })
        }
        Err(LayerError::Failed(e)) => Err(e),
        Err(LayerError::Refused(why)) => {
            node_base::without_base(&pod.name, &pod.node, &why);
            let received = in_pod.send().await?;
            let snapshot = in_pod.finish(received, phases).await?;
            Ok(Made {
                snapshot,
                history,
                held: None,
                layered_end: false,
            })
        }
    }
}

/// The node's base made here, in the node's `made_in`: the repository checked out there (on the
/// default branch) while `beside` runs, set up and snapshotted, and published — or, where
/// another pod published that base first, the other pod's.
async fn make_base(
    pod: &Pod,
    in_pod: &InPod<'_>,
    holder: &mut Holder,
    made_in: &str,
    beside: impl Future<Output = Result<history::HistoryServer>>,
    phases: &mut Phases,
) -> Result<(node_base::Published, history::HistoryServer)> {
    let step = in_pod.step;
    let as_base = CheckoutAs {
        branch: in_pod.default_branch,
        snapshot_if_plain: in_pod.setup.is_none(),
    };
    let (received, history) = tokio::try_join!(
        send_repository(
            step,
            in_pod.pack,
            in_pod.default_branch,
            made_in,
            Some(as_base)
        ),
        beside,
    )?;
    phases.mark("repository, sockets, history server and jail probe");
    bind_base(step, made_in).await?;
    // A plain snapshot is the commit's tree, every file checked out as the commit holds it:
    // verified by construction.
    let (made, verified) = match received.snapshot {
        Some(s) => (s, true),
        None => {
            let s = in_pod.setup_and_snapshot(phases).await?;
            let verified = step.verify_base(&s, &pod.name).await;
            phases.mark("the base's verification");
            (s, verified)
        }
    };
    let image_id = pod.image_id().await;
    let base = holder.publish(&made, verified, &image_id).await?;
    Ok((base, history))
}

/// Why a base made in image `base_image` is not this pod's, which runs `pod_image` (a tag that
/// moved): today's path for this pod, and the node's list no longer names it. `None`: the same.
fn another_image(base_image: &str, pod_image: &str) -> Option<String> {
    (base_image != pod_image).then(|| {
        format!(
            "the base of this commit on the node was made in image {base_image}, and \
             this pod runs {pod_image} (its tag moved): the next pod makes a new one"
        )
    })
}

fn layered_on(pod: &Pod, tree: &str, how: &str) {
    tracing::debug!(pod = %pod.name, node = %pod.node, "the checkout layered on the node's base {tree}: {how}");
}

/// The checkout made in the pod itself, at [`WORKDIR`] (no base on the node) or as the node's
/// base (`node_base`).
struct InPod<'a> {
    step: &'a Steps<'a>,
    pack: &'a Pack,
    default_branch: &'a str,
    checkout_as: Option<CheckoutAs<'a>>,
    /// The setup command and its time limit.
    setup: Option<(&'a [String], Duration)>,
    sandboxed: bool,
}

impl<'a> InPod<'a> {
    /// The checkout `workspace` asks for: the Implementor's, on its branch, with its setup (an
    /// empty command is none), or the view's, on the default branch alone.
    fn of(
        step: &'a Steps<'a>,
        pack: &'a Pack,
        workspace: &'a Workspace,
        sandboxed: bool,
    ) -> InPod<'a> {
        let checkout = match workspace {
            Workspace::Checkout(p) => Some(p),
            Workspace::View(_) => None,
        };
        let setup = checkout.and_then(|p| p.setup.as_ref().filter(|s| !s.is_empty()));
        InPod {
            step,
            pack,
            default_branch: workspace.default_branch(),
            checkout_as: checkout.map(|p| CheckoutAs {
                branch: &p.branch,
                snapshot_if_plain: setup.is_none(),
            }),
            setup: setup
                .zip(checkout)
                .map(|(s, p)| (s.as_slice(), p.setup_timeout)),
            sandboxed,
        }
    }

    /// The repository into [`WORKDIR`].
    async fn send(&self) -> Result<work::Received> {
        send_repository(
            self.step,
            self.pack,
            self.default_branch,
            WORKDIR,
            self.checkout_as,
        )
        .await
    }

    /// The Implementor's setup and snapshot, unless the receiving step took the snapshot.
    async fn finish(
        &self,
        received: work::Received,
        phases: &mut Phases,
    ) -> Result<Option<PodSnapshot>> {
        match (&self.checkout_as, received.snapshot) {
            (Some(_), None) => self.setup_and_snapshot(phases).await.map(Some),
            (_, snapshot) => Ok(snapshot),
        }
    }

    /// The setup, if any, then the snapshot, in the jail at [`WORKDIR`].
    async fn setup_and_snapshot(&self, phases: &mut Phases) -> Result<PodSnapshot> {
        if let Some((setup, limit)) = self.setup {
            self.step.setup(setup, self.sandboxed, limit).await?;
            phases.mark("setup");
        }
        let snapshot = self.step.snapshot(&self.pack.base, self.sandboxed).await?;
        phases.mark("snapshot");
        Ok(snapshot)
    }
}

/// The durations of a pod's preparation, phase by phase, from the first mark's start.
struct Phases {
    last: std::time::Instant,
    done: Vec<(String, Duration)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }
}

impl Phases {
    fn mark(&mut self, what: &str) {
        let now = std::time::Instant::now();
        self.done.push((what.to_string(), now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: Duration = self.done.iter().map(|(_, d)| *d).sum();
        write!(f, "{} ms:", total.as_millis())?;
        for (what, d) in &self.done {
            write!(f, " {what} {} ms;", d.as_millis())?;
        }
        Ok(())
    }
}

/// Whose session and which branch an Implementor's pod records once its CLI started, with
/// `resumeInterrupted` on ([`resume`]).
fn agent_of(req: &EnvRequest) -> Option<(SessionRecord, String)> {
    match &req.workspace {
        Workspace::Checkout(p) if p.continue_within.is_some() => {
            Some((p.session.clone(), p.branch.clone()))
        }
        _ => None,
    }
}

/// One session's pod.
pub struct KubernetesEnvironment {
    pod: Arc<Pod>,
    shell: Option<RemoteShell>,
    egress: Option<Egress>,
    env: Vec<(String, String)>,
    workdir: PathBuf,
    /// The Implementor's work: where it is and how it is read (None: a read-only session), as
    /// recorded on the pod.
    work: Option<work::WorkRecord>,
    /// Whose session and which branch the pod records once its CLI started, for a
    /// continuation ([`resume`]; `resumeInterrupted` on, an Implementor's).
    agent: Option<(SessionRecord, String)>,
    /// The pod records its agent ([`Environment::record_agent`]).
    recorded: AtomicBool,
    /// The interrupted session this one continues in its pod.
    continued: Option<Continuation>,
    sandboxed: bool,
    /// Serves the pod's `git fetch --unshallow` while the session lives.
    _history: history::HistoryServer,
    /// Holds the node's base the checkout is layered on, while the session lives (in a
    /// mutex only to be `Sync`: nothing uses it).
    _node_base: Option<std::sync::Mutex<Holder>>,
}

impl KubernetesEnvironment {
    /// The environment of a session continuing an interrupted one in its pod.
    fn resumed(r: resume::Resumed, req: &EnvRequest) -> KubernetesEnvironment {
        KubernetesEnvironment {
            sandboxed: r.work.sandboxed,
            pod: r.pod,
            shell: Some(r.shell),
            egress: Some(r.egress),
            env: r.env,
            workdir: PathBuf::from(WORKDIR),
            work: Some(r.work),
            agent: agent_of(req),
            recorded: AtomicBool::default(),
            continued: Some(r.continued),
            _history: r.history,
            _node_base: r.held.map(std::sync::Mutex::new),
        }
    }

    /// The pod still runs commands (bounded).
    async fn answers(&self, shell: &RemoteShell) -> Result<()> {
        let alive = RemoteCommand {
            argv: vec!["true".into()],
            env: self.env.clone(),
            cwd: "/".into(),
        };
        match tokio::time::timeout(Duration::from_secs(5), shell.run(alive, &[], 0)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(AdapterError::new(
                ErrorCode::AgentFailed,
                "the pod did not answer within 5 s",
            )),
        }
    }

    fn shell(&self) -> Result<&RemoteShell> {
        self.shell
            .as_ref()
            .ok_or_else(|| AdapterError::new(ErrorCode::Internal, "the pod's stream is closed"))
    }
}

impl Environment for KubernetesEnvironment {
    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn has_checkout(&self) -> bool {
        self.work.is_some()
    }

    fn temp_dir(&self) -> PathBuf {
        PathBuf::from("/tmp")
    }

    fn describe(&self) -> String {
        let collectors = self
            .egress
            .as_ref()
            .map_or(&[][..], |g| g.telemetry_collectors());
        let telemetry = match collectors.is_empty() {
            true => String::new(),
            false => format!(
                "; the CLI's telemetry forwarded to {} only",
                collectors.join(", ")
            ),
        };
        format!(
            "Kubernetes pod {} of image {} on node {}; {}; network only through the egress \
             proxy, over the pod's exec stream{telemetry}; the pod's resources are its limits",
            self.pod.name,
            self.pod.image,
            self.pod.node,
            if self.sandboxed {
                "bubblewrap in the pod"
            } else {
                "no OS sandbox in the pod"
            }
        )
    }

    fn limits_are_fallback(&self) -> bool {
        false
    }

    fn keeps_unreadable_work(&self) -> bool {
        false
    }

    fn limit_hit(&self) -> Option<String> {
        None
    }

    fn lost(&self) -> BoxFuture<'_, Option<AdapterError>> {
        // A process killed for memory ends the whole pod (`cra-pod idle`), so the pod's own
        // status says it — once the kubelet has noticed, a second or two after the stream
        // broke: a broken stream waits (bounded) for the pod's status to say why.
        Box::pin(async move {
            // The agent may have ended as the pod went, before its stream broke: a command
            // the pod no longer answers tells.
            let broke = match &self.shell {
                Some(shell) => match shell.closed().now_or_never() {
                    Some(e) => Some(e),
                    None => self.answers(shell).await.err(),
                },
                None => None,
            };
            let Some(broke) = broke else {
                return self.pod.why_gone().await;
            };
            let deadline = tokio::time::Instant::now() + LOST_WAIT;
            loop {
                if let Some(gone) = self.pod.why_gone().await {
                    return Some(gone);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Some(AdapterError::new(
                        ErrorCode::AgentFailed,
                        format!(
                            "the stream to pod {} broke ({}) while the pod still shows as running",
                            self.pod.name, broke.message
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    }

    fn exec(&mut self, cmd: ExecCommand) -> BoxFuture<'_, Result<Exec>> {
        Box::pin(async move {
            let mode = if self.work.is_some() { "rw" } else { "ro" };
            let cli = std::iter::once("sh".to_string())
                .chain(
                    bridged_argv(std::ffi::OsStr::new(CLI), &cmd.args)
                        .into_iter()
                        .map(|a| a.to_string_lossy().into_owned()),
                )
                .collect();
            let argv = confined(self.sandboxed.then_some(mode), cli);
            let mut env = self.env.clone();
            if !self.sandboxed {
                // Without the jail the sockets are where the pod agent made them.
                env.push(("CRA_SOCKET_DIR".into(), SOCKETS.into()));
            }
            self.shell()?
                .spawn(RemoteCommand {
                    argv,
                    env,
                    cwd: WORKDIR.into(),
                })
                .await
        })
    }

    fn conversation<'a>(&'a self, cli_session: &'a str) -> BoxFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            // In the pod, which outlives each CLI run there (a resume reads it).
            let shell = self.shell().ok()?;
            let read = interruption::conversation(shell, &self.env, cli_session, true).await;
            read.ok().map(|c| c.bytes).filter(|b| !b.is_empty())
        })
    }

    fn continued(&self) -> Option<&Continuation> {
        self.continued.as_ref()
    }

    fn record_agent<'a>(
        &'a self,
        agent: Option<(&'a str, Option<&'a str>)>,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let Some((session, branch)) = &self.agent else {
                return false;
            };
            // A continued session's time counts from its first run's start.
            let used = self
                .continued
                .as_ref()
                .map_or(0, |c| c.used.as_millis() as u64);
            let record = agent.map(|(cli_session, model)| AgentRecord {
                session_id: session.session_id.clone(),
                transcript: session.transcript.as_ref().map(|t| t.display().to_string()),
                branch: branch.clone(),
                cli_session: cli_session.to_string(),
                model: model.map(str::to_string),
                started_ms: crate::clock::now_ms().saturating_sub(used),
            });
            match interruption::record_agent(&self.pod, record.as_ref()).await {
                Ok(()) => {
                    self.recorded.store(record.is_some(), Ordering::SeqCst);
                    record.is_some()
                }
                Err(e) => {
                    tracing::warn!(pod = %self.pod.name, error = %e.message, "could not record on the pod what continuing its session needs; it will not be continued");
                    false
                }
            }
        })
    }

    fn extract_patch(&self) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            match &self.work {
                Some(record) => {
                    let at = work::WorkAt {
                        shell: self.shell()?,
                        env: &self.env,
                        record,
                        pod: &self.pod.name,
                    };
                    work::read_work(&at).await
                }
                None => Ok(String::new()),
            }
        })
    }

    fn destroy(&mut self, keep_checkout: bool) -> BoxFuture<'_, Result<()>> {
        // A pod is not kept for a later sweep the way a local checkout is: what could be read
        // was read, and the pod goes — but for a session left for the next engine process to
        // continue (`shutdown()`, its agent recorded), whose pod is let go for it instead.
        Box::pin(async move {
            if let Some(shell) = self.shell.take() {
                if let Err(e) = shell.shutdown().await {
                    tracing::debug!(pod = %self.pod.name, error = %e, "the pod's stream ended before Bye");
                }
            }
            self.egress = None;
            if keep_checkout && self.recorded.load(Ordering::SeqCst) {
                let me = Owner::current().to_record();
                return self.pod.annotate(ANNOTATION_LEFT, Some(&me)).await;
            }
            self.pod.delete().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_made_in_another_image_than_the_pods_is_refused_naming_both() {
        assert_eq!(another_image("sha256:a", "sha256:a"), None);
        let why = another_image("sha256:a", "sha256:b").unwrap();
        assert!(
            why.contains("made in image sha256:a") && why.contains("this pod runs sha256:b"),
            "{why}"
        );
    }
}
