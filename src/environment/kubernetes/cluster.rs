//! The cluster half of the Kubernetes backend: a client from the config, a session's pod (its
//! spec by the image contract and the owner rule, created and waited for until Running), an
//! exec stream into it, why it went away, its deletion, and the sweep of a dead engine's pods.
//! Only the core v1 Pod and Namespace APIs, so a 1.20 API server serves it as well as a current
//! one.
//!
//! Every call to the API server is bounded (connect 10 s, a request 30 s), so an unreachable or
//! stuck API server is a clear `ERR_PROVISION` naming its URL, never a hang; only an exec
//! stream, which lives as long as its session, has no read bound.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerState, ContainerStateTerminated, HostPathVolumeSource,
    Namespace, Pod as KubePod, PodSecurityContext, PodSpec, ResourceRequirements, SecurityContext,
    Toleration as KubeToleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status as ExecStatus};
use kube::api::{Api, AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::config::kubernetes::{is_label_value, MANAGED_BY};
use crate::config::KubernetesConfig;
use crate::domain::Role;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::process::Owner;

/// The value of [`MANAGED_BY`] on every pod the adapter makes: what a sweep lists by.
pub const MANAGER: &str = "claude-runtime-adapter";
pub const LABEL_SESSION: &str = "claude-runtime-adapter/session";
pub const LABEL_ROLE: &str = "claude-runtime-adapter/role";
pub const LABEL_HOST: &str = "claude-runtime-adapter/host";
/// `engineId`: the identity of the engine that made the pod (`super::lease`).
pub const LABEL_ENGINE: &str = "claude-runtime-adapter/engine";
/// On a pod started before any session asked for it (`warmPods`): it has no session label,
/// role or session id until one claims it ([`Cluster::claim`]).
pub const LABEL_WARM: &str = "claude-runtime-adapter/warm";
/// [`Owner::to_record`] of the engine process that made the pod (the sweep's liveness check).
pub const ANNOTATION_OWNER: &str = "claude-runtime-adapter/owner";
/// The session id exactly (its label is sanitised to a label value).
pub const ANNOTATION_SESSION_ID: &str = "claude-runtime-adapter/session-id";
/// What reading an Implementor's work out of its pod needs (`super::work::WorkRecord`),
/// written once its snapshot is taken: the sweep reads a dead engine's pod's work by it.
pub const ANNOTATION_WORK: &str = "claude-runtime-adapter/work";
/// Where a sweep saved a dead engine's pod's work, so that a deletion failing after it does not
/// save the same work twice.
pub const ANNOTATION_SALVAGED: &str = "claude-runtime-adapter/salvaged";
/// [`Owner::to_record`] of the process whose sweep is reading the pod's work out: another
/// sweep (a second adapter started at once) leaves it while that process lives.
pub const ANNOTATION_SWEEPER: &str = "claude-runtime-adapter/sweeper";
/// What continuing an Implementor's session in its pod needs (`super::resume::AgentRecord`),
/// written once its CLI started (`resumeInterrupted`), removed once it ended for good.
pub const ANNOTATION_AGENT: &str = "claude-runtime-adapter/agent";
/// Set when the engine let the pod go at `shutdown()` for the next session on its branch to
/// continue (`super::resume`): listed as a dead engine's although its process may live on.
pub const ANNOTATION_LEFT: &str = "claude-runtime-adapter/left";
/// The branch of an Implementor whose session can be continued ([`ANNOTATION_AGENT`]), as a
/// label value: what the next dispatch on that branch finds the pod by.
pub const LABEL_BRANCH: &str = "claude-runtime-adapter/branch";

/// Where the session image keeps the adapter's runtime (pod agent, jail, bubblewrap and socat
/// with their own loader and libraries, the CLI), and where a pod of another image gets a copy
/// of it: everything the adapter runs in a pod comes from here, so it works in any image.
pub const RUNTIME_DIR: &str = "/opt/claude-runtime-adapter";
/// The image contract: the container's pid 1.
pub const POD_COMMAND: [&str; 2] = ["/opt/claude-runtime-adapter/bin/cra-pod", "idle"];
/// The pod's session container.
pub const CONTAINER: &str = "session";
/// The init container that copies the runtime into a pod of a user's image.
pub const RUNTIME_CONTAINER: &str = "runtime";
/// Where the init container sees the runtime volume it fills, and the copy's directory there.
const RUNTIME_COPY: &str = "/cra-runtime-copy";
const RUNTIME_SUBDIR: &str = "runtime";
/// `nodeCache`'s volume, where the init container sees it (writable), and where the session
/// container does (read-only, under `/opt`, which the sandbox shows: the runtime's symlinks
/// lead there).
const NODE_CACHE: &str = "node-cache";
const NODE_CACHE_INIT: &str = "/cra-node-cache";
const NODE_CACHE_SEEN: &str = "/opt/claude-runtime-adapter-node";
/// Where a session container sees `nodeCache` writable, for the checkouts' bases
/// ([`PodRequest::node_bases`]): under `/workspace`, whose other entries than the checkout the
/// jail never shows, so that a base's setup can run jailed there.
pub const NODE_BASES_MOUNT: &str = "/workspace/.node";
/// The init container's script with a node cache: one copy of the runtime per node and
/// version, symlinks into it per pod, its own copy where the cache cannot be used.
const RUNTIME_INIT: &str = include_str!("../../../image/runtime-init");
/// The pod's own directories, each an `emptyDir` (a user's image has none of them, and its
/// root may not be writable by the session's user): the checkout, the adapter's state and
/// sockets, the agent's home.
const POD_DIRS: [(&str, &str); 3] = [
    ("workspace", "/workspace"),
    ("state", "/var/lib/cra"),
    ("home", "/home/agent"),
];

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one ordinary request (create, get, list, delete, the start of an exec).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The waits before a request that failed in transport is sent again ([`bounded`]).
const TRANSPORT_RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(3),
];
const POLL: Duration = Duration::from_millis(200);
/// Bound on one try to start the pod's stream before its status says it runs.
const EARLY_EXEC: Duration = Duration::from_secs(3);
/// Bound on waiting for a running pod's status to name its image.
const IMAGE_ID_WAIT: Duration = Duration::from_secs(10);
/// Bound on a deleted pod disappearing (grace 0: the API server removes it at once; the
/// bound covers an API server that is slow to say so).
const DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// Stdio buffers of an exec stream: room for a frame of the pod protocol at a time.
const EXEC_BUFFER: usize = 64 * 1024;

/// Waiting reasons that never turn into Running by themselves (`restartPolicy: Never`): the
/// start fails at once instead of at the timeout.
const FATAL_WAITING: &[&str] = &[
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

fn provision(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// `e` and its sources, `: `-joined (the kube error's own text names the layer, the sources
/// the cause: a refused connection, a TLS failure).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// A connection to the cluster of a `backend.kubernetes` config.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    namespace: String,
    /// The API server's URL, for messages.
    url: String,
    config: KubernetesConfig,
    notes: RuntimeNotes,
}

/// The note a pod's runtime init container leaves (`nodeCache`), for the log.
#[derive(Clone)]
struct RuntimeNotes {
    node_cache: Option<String>,
    /// Set once a pod could not use `nodeCache`: the warning is the operator's to act on, once.
    warned: Arc<AtomicBool>,
}

/// What a session's pod is made for.
#[derive(Debug, Clone)]
pub struct PodRequest {
    /// The session's id (any string: its label is sanitised, its annotation exact).
    pub session_id: String,
    pub role: Role,
    /// The pod's `activeDeadlineSeconds` (rounded up): the cluster's own end of a session
    /// whose engine is gone (`maxAgentDuration`); `None` = none.
    pub active_deadline: Option<Duration>,
    /// Recorded on the pod for the sweep; [`Owner::current`] unless a test stands in another.
    pub owner: Owner,
    /// The container's command; `None` = the image contract's [`POD_COMMAND`] (tests run a
    /// plain image with their own).
    pub command: Option<Vec<String>>,
    /// The image the session runs in; `None` = `backend.kubernetes.image`, else its
    /// `runtimeImage`. Any image but the runtime image gets the runtime copied in.
    pub image: Option<String>,
    /// `nodeCache` mounted writable at [`NODE_BASES_MOUNT`], for the checkout's base kept once
    /// per node: only for a session in the pod's jail, which never shows it (image/cra-jail).
    pub node_bases: bool,
    /// A pod for no session yet (`super::warm`): labelled [`LABEL_WARM`], named `cra-warm-…`,
    /// without the session's labels and annotation, which [`Cluster::claim`] gives it.
    pub warm: bool,
}

impl PodRequest {
    pub fn new(session_id: impl Into<String>, role: Role) -> PodRequest {
        PodRequest {
            session_id: session_id.into(),
            role,
            active_deadline: None,
            owner: Owner::current(),
            command: None,
            image: None,
            node_bases: false,
            warm: false,
        }
    }
}

/// A session's pod, Running.
#[derive(Clone)]
pub struct Pod {
    api: Api<KubePod>,
    pub name: String,
    pub node: String,
    /// The image its session runs in.
    pub image: String,
    /// That image's id as the node resolved it ([`Pod::image_id`]).
    image_id: Arc<tokio::sync::OnceCell<String>>,
    /// What the runtime's init container did, logged once its status says.
    notes: RuntimeNotes,
    /// The API server's URL, for messages.
    url: String,
    /// `resources.limits.memory`, named when the pod was killed for memory.
    memory_limit: Option<String>,
    /// `resources.limits.ephemeral-storage`, named when the kubelet evicted the pod past it.
    storage_limit: Option<String>,
    /// The limit is `sandbox.limits.diskMiB`'s (the engine gave none of its own).
    storage_from_disk_mib: bool,
    active_deadline: Option<i64>,
}

/// Whether an eviction's message is the kubelet's for a pod or container past its own
/// `ephemeral-storage` limit (pkg/kubelet/eviction: "Pod ephemeral local storage usage exceeds
/// the total limit of containers …", "Container … exceeded its local ephemeral storage limit
/// …"), not for a node short of disk ("The node was low on resource: ephemeral-storage").
fn past_storage_limit(message: &str) -> bool {
    message.contains("ephemeral local storage usage exceeds")
        || message.contains("exceeded its local ephemeral storage limit")
}

/// How an exec's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEnd {
    /// It exited with this code.
    Exited(i32),
    /// The API server ended the stream with this failure (the container is gone, the
    /// command could not start).
    Failed(String),
    /// The stream broke without a status (the pod was deleted, the connection lost): ask
    /// [`Pod::why_gone`].
    Broken,
}

/// A process started in the pod with its stdio attached. The stream lives as long as
/// `status` (dropping it ends the stream). The 1.20 API server speaks the v4 protocol, which
/// cannot half-close stdin: shutting `stdin` down closes the whole stream there, so a process
/// must learn its input ended from the input itself.
pub struct PodExec {
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub status: Pin<Box<dyn Future<Output = ExecEnd> + Send>>,
}

/// A label value standing for `s`: `s` itself when it is one, else its allowed characters
/// plus a hash of the whole (so two different ids never share a label by sanitising).
pub fn label_value(s: &str) -> String {
    if !s.is_empty() && is_label_value(s) {
        return s.to_string();
    }
    let hash = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, s.as_bytes())
        .simple()
        .to_string();
    let kept: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(40)
        .collect();
    let kept = kept.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    match kept.is_empty() {
        true => hash[..20].to_string(),
        false => format!("{kept}-{}", &hash[..20]),
    }
}

/// How the API server answered (or did not).
pub(super) enum Failure {
    /// It answered with this status.
    Api(Box<kube::core::Status>),
    /// It could not be reached (or did not answer within the bound): the text says why.
    Unreachable(String),
}

/// kube's own client, but with `TCP_NODELAY` on its connections. A session's exec stream
/// carries many small frames each way (a hook's answer, a tunnelled connection's few bytes
/// and its end), and without it Nagle's algorithm holds a small write back until the previous
/// one is acknowledged: measured through the local test cluster, one proxied connection took
/// 41 ms instead of 1. (A kubeconfig's proxy keeps kube's own stack.)
fn client_for(config: Config) -> std::result::Result<Client, kube::Error> {
    use kube::client::ConfigExt;
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(Client::new(service, config.default_namespace))
}

impl Cluster {
    /// A client for `config`'s cluster: its kubeconfig file and context when given, else
    /// `KUBECONFIG`, `~/.kube/config`, the in-cluster service account. Reads files only; the
    /// API server is first contacted by a request ([`Cluster::preflight`]).
    pub async fn connect(config: &KubernetesConfig) -> Result<Cluster> {
        let options = KubeConfigOptions {
            context: config.context.clone(),
            ..Default::default()
        };
        let mut kube_config = match (&config.kubeconfig, &config.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path).map_err(|e| {
                    provision(format!(
                        "the kubeconfig {} (backend.kubernetes.kubeconfig) cannot be read: {}",
                        path.display(),
                        chain(&e)
                    ))
                })?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| kubeconfig_error(Some(path), config, &e))?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| kubeconfig_error(None, config, &e))?,
            (None, None) => Config::infer().await.map_err(|e| {
                provision(format!(
                    "no Kubernetes cluster configured: no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster ({}); set backend.kubernetes.kubeconfig",
                    chain(&e)
                ))
            })?,
        };
        kube_config.connect_timeout = Some(CONNECT_TIMEOUT);
        let url = kube_config.cluster_url.to_string();
        let client = client_for(kube_config).map_err(|e| {
            provision(format!(
                "cannot make a client for the Kubernetes API server at {url}: {}",
                chain(&e)
            ))
        })?;
        Ok(Cluster {
            client,
            namespace: config.namespace.clone(),
            url,
            config: config.clone(),
            notes: RuntimeNotes {
                node_cache: config.node_cache.clone(),
                warned: Arc::default(),
            },
        })
    }

    /// The namespace exists (a cheap GET, once before the first session).
    pub async fn preflight(&self) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        match bounded(|| namespaces.get(&self.namespace)).await {
            Ok(_) => Ok(()),
            Err(Failure::Api(s)) if s.is_not_found() => Err(self.no_namespace()),
            // Credentials limited to the namespace may not read the Namespace object; listing
            // pods there, which the adapter needs anyway, then shows the API server answers.
            Err(Failure::Api(s)) if s.is_forbidden() => {
                let (pods, params) = (self.pods(), ListParams::default().limit(1));
                bounded(|| pods.list(&params)).await.map(drop).map_err(|f| {
                    self.failed(&format!("list pods in namespace {}", self.namespace), f)
                })
            }
            Err(f) => Err(self.failed(&format!("read namespace {}", self.namespace), f)),
        }
    }

    fn pods(&self) -> Api<KubePod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The namespace's Leases (the engine's identity: `super::lease`).
    pub(super) fn leases(&self) -> Api<k8s_openapi::api::coordination::v1::Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The API server's URL, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn no_namespace(&self) -> AdapterError {
        provision(format!(
            "namespace {} (backend.kubernetes.namespace) does not exist on the cluster at {}",
            self.namespace, self.url
        ))
    }

    fn failed(&self, what: &str, f: Failure) -> AdapterError {
        failure(&self.url, what, f)
    }

    /// The pod spec for `req` (the image contract, the owner rule, the config's scheduling
    /// and resources).
    fn pod_spec(&self, name: &str, req: &PodRequest) -> KubePod {
        let c = &self.config;
        let image = self.image_of(req);
        let mut volumes = Volumes::pod_dirs();
        if let Some(path) = c.node_cache.as_ref().filter(|_| req.node_bases) {
            volumes.node_bases(path);
        }
        // Another image than the runtime's: an init container of the runtime image copies the
        // runtime into a volume the session container sees, read-only, where the runtime image
        // has it (the way CI runners on Kubernetes bring their tools into a user's image).
        let init = (image != c.runtime_image).then(|| vec![runtime_container(c, &mut volumes)]);
        let command = req
            .command
            .clone()
            .unwrap_or_else(|| POD_COMMAND.iter().map(|s| s.to_string()).collect());
        let session = Container {
            name: CONTAINER.into(),
            image: Some(image),
            image_pull_policy: Some(c.image_pull_policy.as_str().into()),
            command: Some(command),
            resources: resources(c),
            security_context: Some(unprivileged()),
            volume_mounts: Some(volumes.mounts),
            ..Default::default()
        };
        KubePod {
            metadata: self.metadata(name, req),
            spec: Some(PodSpec {
                init_containers: init,
                containers: vec![session],
                volumes: Some(volumes.volumes),
                security_context: Some(PodSecurityContext {
                    run_as_user: Some(1000),
                    run_as_group: Some(1000),
                    run_as_non_root: Some(true),
                    ..Default::default()
                }),
                automount_service_account_token: Some(false),
                enable_service_links: Some(false),
                restart_policy: Some("Never".into()),
                termination_grace_period_seconds: Some(1),
                active_deadline_seconds: req.active_deadline.map(deadline_seconds),
                node_selector: (!c.node_selector.is_empty()).then(|| c.node_selector.clone()),
                tolerations: tolerations(c),
                runtime_class_name: c.runtime_class_name.clone(),
                service_account_name: c.service_account_name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pod's name, namespace, labels and annotations: the config's, then the adapter's —
    /// who made the pod (the sweep's owner rule) and, unless it is a warm pod no session has
    /// claimed yet, whose session it is.
    fn metadata(&self, name: &str, req: &PodRequest) -> ObjectMeta {
        let c = &self.config;
        let mut labels = c.labels.clone();
        labels.insert(MANAGED_BY.into(), MANAGER.into());
        labels.insert(LABEL_HOST.into(), label_value(&req.owner.host));
        if let Some(id) = &c.engine_id {
            labels.insert(LABEL_ENGINE.into(), id.clone());
        }
        let mut annotations = c.annotations.clone();
        annotations.insert(ANNOTATION_OWNER.into(), req.owner.to_record());
        if req.warm {
            labels.insert(LABEL_WARM.into(), "true".into());
        } else {
            labels.insert(LABEL_SESSION.into(), label_value(&req.session_id));
            labels.insert(LABEL_ROLE.into(), req.role.as_str().into());
            annotations.insert(ANNOTATION_SESSION_ID.into(), req.session_id.clone());
        }
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        }
    }

    /// The image `req`'s session runs in.
    pub fn image_of(&self, req: &PodRequest) -> String {
        let c = &self.config;
        req.image
            .clone()
            .or_else(|| c.image.clone())
            .unwrap_or_else(|| c.runtime_image.clone())
    }

    /// Creates the pod for `req` and waits until its container runs (bounded by
    /// `podStartTimeout`, obeying `stop`). On any failure, and on `stop`, the pod is deleted
    /// before this returns: nothing is left behind.
    pub async fn create_pod(&self, req: PodRequest, stop: &CancellationToken) -> Result<Pod> {
        self.start_pod(req, stop, None).await.map(|(pod, _)| pod)
    }

    /// [`Cluster::create_pod`], with `argv` started in the pod's container as soon as it runs
    /// ([`Pod::exec`]): tried while the pod's status still says it is starting (the kubelet
    /// reports a started container a poll of its own later — measured here 0–0.9 s — and a
    /// session's preparation need not wait for that), else once the status says it runs.
    pub async fn start_pod_with(
        &self,
        req: PodRequest,
        stop: &CancellationToken,
        argv: &[String],
    ) -> Result<(Pod, PodExec)> {
        let (pod, stream) = self.start_pod(req, stop, Some(argv)).await?;
        let stream = match stream {
            Some(stream) => stream,
            None => match pod.exec(argv).await {
                Ok(stream) => stream,
                Err(e) => {
                    let _ = pod.delete().await;
                    return Err(e);
                }
            },
        };
        Ok((pod, stream))
    }

    async fn start_pod(
        &self,
        req: PodRequest,
        stop: &CancellationToken,
        early: Option<&[String]>,
    ) -> Result<(Pod, Option<PodExec>)> {
        let name = format!(
            "cra-{}-{}",
            if req.warm { "warm" } else { req.role.as_str() },
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let spec = self.pod_spec(&name, &req);
        let image = self.image_of(&req);
        let pod = self.pod_named(
            name.clone(),
            String::new(),
            image.clone(),
            req.active_deadline.map(deadline_seconds),
        );
        let params = PostParams::default();
        let mut sent = 0;
        let create = bounded(|| {
            sent += 1;
            pod.api.create(&params, &spec)
        });
        let created = tokio::select! {
            r = create => r,
            _ = stop.cancelled() => {
                let _ = pod.delete().await;
                return Err(cancelled(&name));
            }
        };
        match created {
            Ok(_) => {}
            // Sent again after a transport failure: the first one had made it (the name is
            // this call's own, a fresh uuid).
            Err(Failure::Api(s)) if s.code == 409 && sent > 1 => {}
            Err(Failure::Api(s)) if s.is_not_found() => return Err(self.no_namespace()),
            // Refused: nothing was made.
            Err(f @ Failure::Api(_)) => {
                return Err(self.failed(&format!("create pod {name}"), f));
            }
            // The request may have reached the API server before the connection failed.
            Err(f) => {
                let _ = pod.delete().await;
                return Err(self.failed(&format!("create pod {name}"), f));
            }
        }
        let started = tokio::select! {
            r = self.wait_running(&pod, early) => r,
            _ = stop.cancelled() => Err(cancelled(&name)),
        };
        match started {
            Ok(ready) => {
                if let Some(id) = ready.image_id {
                    let _ = pod.image_id.set(id);
                }
                Ok((
                    Pod {
                        node: ready.node,
                        ..pod
                    },
                    ready.stream,
                ))
            }
            Err(e) => {
                let _ = pod.delete().await;
                Err(e)
            }
        }
    }

    /// A warm pod ([`PodRequest::warm`], Running, started `since`) made `req`'s: the session's
    /// labels and id, its `activeDeadlineSeconds` counted from the pod's start (which the API
    /// server lets only decrease: the warm pod's was longer), then `argv` started in it. On
    /// a failure, and on `stop`, the pod is deleted (nothing of another session was in it).
    pub async fn claim(
        &self,
        warm: Pod,
        since: Instant,
        req: &PodRequest,
        stop: &CancellationToken,
        argv: &[String],
    ) -> Result<(Pod, PodExec)> {
        let deadline = req
            .active_deadline
            .map(|d| deadline_seconds(since.elapsed() + d));
        let mut patch = serde_json::json!({
            "metadata": {
                "labels": {
                    LABEL_WARM: null,
                    LABEL_SESSION: label_value(&req.session_id),
                    LABEL_ROLE: req.role.as_str(),
                },
                "annotations": { ANNOTATION_SESSION_ID: req.session_id },
            },
        });
        if let Some(seconds) = deadline {
            patch["spec"] = serde_json::json!({ "activeDeadlineSeconds": seconds });
        }
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        let claimed = async {
            bounded(|| warm.api.patch(&warm.name, &params, &patch))
                .await
                .map_err(|f| self.failed(&format!("claim warm pod {}", warm.name), f))?;
            warm.exec(argv).await
        };
        let claimed = tokio::select! {
            r = claimed => r,
            _ = stop.cancelled() => Err(cancelled(&warm.name)),
        };
        match claimed {
            Ok(stream) => Ok((
                Pod {
                    active_deadline: deadline,
                    ..warm
                },
                stream,
            )),
            Err(e) => {
                let _ = warm.delete().await;
                Err(e)
            }
        }
    }

    /// Polls the pod until its container runs: its node then, the session container's image
    /// id where its status names one, and `early` started in it if that came first.
    async fn wait_running(&self, pod: &Pod, early: Option<&[String]>) -> Result<Ready> {
        let timeout = self.config.pod_start_timeout;
        let deadline = Instant::now() + timeout;
        let (api, name, image) = (&pod.api, &pod.name, &pod.image);
        loop {
            let last;
            match bounded(|| api.get(name)).await {
                Ok(p) => match start_state(&p, image, &self.config.runtime_image) {
                    Start::Running(node) => {
                        self.notes.log(&p, name, &node);
                        return Ok(Ready {
                            node,
                            image_id: image_id_of(&p),
                            stream: None,
                        });
                    }
                    Start::Failed(why) => {
                        return Err(provision(format!("pod {name} cannot start: {why}")))
                    }
                    Start::Pending(why) => {
                        last = why;
                        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                        if let (Some(argv), Some(node)) = (early, node) {
                            // A container not started yet refuses the exec at once.
                            let attempt = tokio::time::timeout(EARLY_EXEC, pod.exec(argv)).await;
                            if let Ok(Ok(stream)) = attempt {
                                // The image id and the runtime's note come with a later
                                // status ([`Pod::image_id`]).
                                return Ok(Ready {
                                    node,
                                    image_id: None,
                                    stream: Some(stream),
                                });
                            }
                        }
                    }
                },
                Err(Failure::Api(s)) if s.is_not_found() => {
                    return Err(provision(format!(
                        "pod {name} was deleted (from outside the adapter) while it was starting"
                    )))
                }
                // A passing failure of the API server is waited out like a slow start.
                Err(f) => last = failure(&self.url, &format!("read pod {name}"), f).message,
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(provision(format!(
                    "pod {name} was not running within {} s (backend.kubernetes.podStartTimeout): {last}",
                    timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep(POLL.min(deadline - now)).await;
        }
    }

    /// The pods of this host's engines that are no longer alive ([`Owner`]'s own check, the
    /// same rule as the local sweep) and those an engine let go ([`ANNOTATION_LEFT`]), less those another live process's sweep is reading
    /// ([`ANNOTATION_SWEEPER`]). Pods of live engines and of other hosts are never listed
    /// (theirs end by `activeDeadlineSeconds` or their own engine's sweep).
    ///
    /// With `engine` (an identity whose Lease this process holds: `super::lease`), the
    /// identity's pods of every other process instead, on any host: only live processes of
    /// this host are told apart (any other holder of the identity is gone).
    pub async fn orphans(&self, engine: Option<&str>) -> Result<Vec<Orphan>> {
        let me = Owner::current();
        let host = me.host.clone();
        let selector = match engine {
            None => format!("{MANAGED_BY}={MANAGER},{LABEL_HOST}={}", label_value(&host)),
            Some(id) => format!("{MANAGED_BY}={MANAGER},{LABEL_ENGINE}={id}"),
        };
        let gone = |o: &Owner| match engine {
            None => o.host == host && !o.is_alive(),
            Some(_) => *o != me && (o.host != host || !o.is_alive()),
        };
        let api = self.pods();
        let params = ListParams::default().labels(&selector);
        let list = bounded(|| api.list(&params)).await.map_err(|f| {
            self.failed(
                &format!("list the adapter's pods in namespace {}", self.namespace),
                f,
            )
        })?;
        let owner_of = |p: &KubePod, key: &str| {
            let record = p.metadata.annotations.as_ref()?.get(key)?;
            Owner::parse(record)
        };
        let left = |p: &KubePod| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(ANNOTATION_LEFT))
        };
        Ok(list
            .items
            .into_iter()
            .filter(|p| left(p) || owner_of(p, ANNOTATION_OWNER).is_some_and(|o| gone(&o)))
            .filter(|p| !owner_of(p, ANNOTATION_SWEEPER).is_some_and(|o| o.is_alive()))
            .filter_map(|p| self.orphan(p))
            .collect())
    }

    /// The handle of pod `name` (on `node`, of `image`), the config's limits named.
    fn pod_named(
        &self,
        name: String,
        node: String,
        image: String,
        active_deadline: Option<i64>,
    ) -> Pod {
        Pod {
            api: self.pods(),
            name,
            node,
            image,
            image_id: Arc::default(),
            notes: self.notes.clone(),
            url: self.url.clone(),
            memory_limit: self.config.limits.get("memory").cloned(),
            storage_limit: self.config.limits.get("ephemeral-storage").cloned(),
            storage_from_disk_mib: self.config.storage_from_disk_mib,
            active_deadline,
        }
    }

    fn orphan(&self, p: KubePod) -> Option<Orphan> {
        let name = p.metadata.name.clone()?;
        let annotation = |key: &str| p.metadata.annotations.as_ref()?.get(key).cloned();
        let spec = p.spec.as_ref();
        let container = spec.and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER));
        let pod = self.pod_named(
            name,
            spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            container.and_then(|c| c.image.clone()).unwrap_or_default(),
            spec.and_then(|s| s.active_deadline_seconds),
        );
        let status = p.status.as_ref();
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        let started_ms = status
            .and_then(|s| s.start_time.as_ref())
            .and_then(|t| u64::try_from(t.0.as_millisecond()).ok());
        Some(Orphan {
            session_id: annotation(ANNOTATION_SESSION_ID),
            work: annotation(ANNOTATION_WORK),
            agent: annotation(ANNOTATION_AGENT),
            started_ms,
            salvaged: annotation(ANNOTATION_SALVAGED),
            running,
            resource_version: p.metadata.resource_version.clone(),
            pod,
        })
    }

    /// Marks `orphan` as this process's to read ([`ANNOTATION_SWEEPER`]), on the version the
    /// list saw: `false` when it changed since (another sweep marked it first).
    pub async fn claim_orphan(&self, orphan: &Orphan) -> Result<bool> {
        let annotations = serde_json::json!({ ANNOTATION_SWEEPER: Owner::current().to_record() });
        self.patch_listed(
            orphan,
            serde_json::Value::Null,
            annotations,
            "mark pod {} as swept",
        )
        .await
    }

    /// Makes `orphan` session `session_id`'s, of this process (its owner, host and identity
    /// labels, no sweeper, no longer let go), on the version the list saw: `false` when it
    /// changed since (another process took or marked it first).
    pub async fn take_over(&self, orphan: &Orphan, session_id: &str) -> Result<bool> {
        let me = Owner::current();
        let mut labels = serde_json::json!({
            LABEL_SESSION: label_value(session_id),
            LABEL_HOST: label_value(&me.host),
        });
        if let Some(id) = &self.config.engine_id {
            labels[LABEL_ENGINE] = id.clone().into();
        }
        let annotations = serde_json::json!({
            ANNOTATION_OWNER: me.to_record(),
            ANNOTATION_SESSION_ID: session_id,
            ANNOTATION_SWEEPER: null,
            ANNOTATION_LEFT: null,
        });
        self.patch_listed(orphan, labels, annotations, "take over pod {}")
            .await
    }

    /// Merges `labels` and `annotations` into `orphan`'s on the version the list saw: `false`
    /// when it changed since, or the pod is gone. `what` names the change, `{}` the pod.
    async fn patch_listed(
        &self,
        orphan: &Orphan,
        labels: serde_json::Value,
        annotations: serde_json::Value,
        what: &str,
    ) -> Result<bool> {
        let mut metadata = serde_json::json!({
            "resourceVersion": orphan.resource_version,
            "annotations": annotations,
        });
        if !labels.is_null() {
            metadata["labels"] = labels;
        }
        let patch = serde_json::json!({ "metadata": metadata });
        let (api, name) = (&orphan.pod.api, &orphan.pod.name);
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        match bounded(|| api.patch(name, &params, &patch)).await {
            Ok(_) => Ok(true),
            Err(Failure::Api(s)) if s.code == 409 || s.is_not_found() => Ok(false),
            Err(f) => Err(self.failed(&what.replace("{}", name), f)),
        }
    }
}

/// A pod of a dead engine of this host ([`Cluster::orphans`]).
pub struct Orphan {
    pub pod: Pod,
    pub session_id: Option<String>,
    /// [`ANNOTATION_WORK`]: an Implementor's, once its snapshot was taken.
    pub work: Option<String>,
    /// [`ANNOTATION_SALVAGED`].
    pub salvaged: Option<String>,
    /// [`ANNOTATION_AGENT`]: an Implementor's whose session may be continued.
    pub agent: Option<String>,
    /// When the pod started (its status, Unix ms): its `activeDeadlineSeconds` counts from then.
    pub started_ms: Option<u64>,
    /// Its container still runs (the pod's phase): only then can its work be read.
    pub running: bool,
    resource_version: Option<String>,
}

impl Orphan {
    /// When the cluster ends the pod (`activeDeadlineSeconds` from its start), Unix ms; `None`
    /// when it does not.
    pub fn ends_ms(&self) -> Option<u64> {
        let seconds = u64::try_from(self.pod.active_deadline?).ok()?;
        Some(self.started_ms? + seconds * 1000)
    }
}

fn kubeconfig_error(
    path: Option<&Path>,
    config: &KubernetesConfig,
    e: &kube::config::KubeconfigError,
) -> AdapterError {
    let file = path.map_or_else(
        || "the kubeconfig (KUBECONFIG or ~/.kube/config)".to_string(),
        |p| format!("the kubeconfig {}", p.display()),
    );
    let what = match (&config.context, e) {
        (Some(ctx), kube::config::KubeconfigError::LoadContext(_)) => {
            format!("{file} has no context {ctx:?} (backend.kubernetes.context)")
        }
        _ => format!("{file} cannot be used"),
    };
    provision(format!("{what}: {}", chain(e)))
}

fn cancelled(name: &str) -> AdapterError {
    AdapterError::new(
        ErrorCode::Cancelled,
        format!("the session was stopped while its pod {name} was starting"),
    )
}

fn grace_zero() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    }
}

/// A pod's volumes and what its session container mounts of them, as the steps of
/// [`Cluster::pod_spec`] add them (the order is the spec's).
struct Volumes {
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
}

impl Volumes {
    /// The pod's own directories ([`POD_DIRS`]), each an empty volume mounted writable.
    fn pod_dirs() -> Volumes {
        Volumes {
            volumes: POD_DIRS
                .iter()
                .map(|(name, _)| Volume {
                    name: (*name).into(),
                    empty_dir: Some(Default::default()),
                    ..Default::default()
                })
                .collect(),
            mounts: POD_DIRS
                .iter()
                .map(|(name, path)| mount(name, path, false))
                .collect(),
        }
    }

    /// `nodeCache`'s volume, once however many mounts use it.
    fn node_cache(&mut self, path: &str) {
        // DirectoryOrCreate: a node without it gets it (the kubelet's, root's), and the pod
        // then says the cache is not writable and does without it.
        if !self.volumes.iter().any(|v| v.name == NODE_CACHE) {
            self.volumes.push(Volume {
                name: NODE_CACHE.into(),
                host_path: Some(HostPathVolumeSource {
                    path: path.into(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Default::default()
            });
        }
    }

    /// `nodeCache` writable at [`NODE_BASES_MOUNT`], for the checkouts' bases
    /// ([`PodRequest::node_bases`]).
    fn node_bases(&mut self, path: &str) {
        self.node_cache(path);
        self.mounts.push(mount(NODE_CACHE, NODE_BASES_MOUNT, false));
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// Every container's: no privilege escalation, no capabilities.
fn unprivileged() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The session container's `resources` from the config's `requests` and `limits` (none when
/// neither is given).
fn resources(c: &KubernetesConfig) -> Option<ResourceRequirements> {
    let quantities = |m: &BTreeMap<String, String>| {
        (!m.is_empty()).then(|| {
            m.iter()
                .map(|(k, v)| (k.clone(), Quantity(v.clone())))
                .collect::<BTreeMap<_, _>>()
        })
    };
    (!c.requests.is_empty() || !c.limits.is_empty()).then(|| ResourceRequirements {
        requests: quantities(&c.requests),
        limits: quantities(&c.limits),
        ..Default::default()
    })
}

/// The config's `tolerations` as the pod spec takes them (none when there are none).
fn tolerations(c: &KubernetesConfig) -> Option<Vec<KubeToleration>> {
    (!c.tolerations.is_empty()).then(|| {
        c.tolerations
            .iter()
            .map(|t| KubeToleration {
                key: t.key.clone(),
                operator: t.operator.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                toleration_seconds: t.toleration_seconds,
            })
            .collect()
    })
}

/// The init container that brings the runtime into a pod of another image than the runtime's,
/// with the volumes it needs added to `volumes`: the runtime's volume, which the session
/// container mounts where the runtime image has the runtime, and with `nodeCache` the node's
/// copy, which that volume's links lead to (`image/runtime-init`).
fn runtime_container(c: &KubernetesConfig, volumes: &mut Volumes) -> Container {
    volumes.volumes.push(Volume {
        name: RUNTIME_CONTAINER.into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    });
    volumes.mounts.push(VolumeMount {
        sub_path: Some(RUNTIME_SUBDIR.into()),
        ..mount(RUNTIME_CONTAINER, RUNTIME_DIR, true)
    });
    let mut init_mounts = vec![mount(RUNTIME_CONTAINER, RUNTIME_COPY, false)];
    let command = match &c.node_cache {
        // Not `-a`: the session's user cannot give the copies the image's owner (root), nor
        // change the volume's own root: the copy is a new directory in it.
        None => vec![
            "cp".into(),
            "-dR".into(),
            "--preserve=mode".into(),
            RUNTIME_DIR.into(),
            format!("{RUNTIME_COPY}/{RUNTIME_SUBDIR}"),
        ],
        Some(path) => {
            volumes.node_cache(path);
            volumes
                .mounts
                .push(mount(NODE_CACHE, NODE_CACHE_SEEN, true));
            init_mounts.push(mount(NODE_CACHE, NODE_CACHE_INIT, false));
            vec![
                "/bin/sh".into(),
                "-c".into(),
                RUNTIME_INIT.into(),
                "runtime-init".into(),
                NODE_CACHE_SEEN.into(),
            ]
        }
    };
    Container {
        name: RUNTIME_CONTAINER.into(),
        image: Some(c.runtime_image.clone()),
        image_pull_policy: Some(c.image_pull_policy.as_str().into()),
        command: Some(command),
        volume_mounts: Some(init_mounts),
        // Its output is the failure's message.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(unprivileged()),
        ..Default::default()
    }
}

fn deadline_seconds(d: Duration) -> i64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).clamp(1, i64::MAX as u64) as i64
}

/// One idempotent request (a read, a delete, a patch, a create of a name of its own),
/// each attempt bounded by [`REQUEST_TIMEOUT`]. A transport failure — the API server closed a
/// pooled connection as the request went out, a reset — is tried again after
/// [`TRANSPORT_RETRIES`]' waits: CI saw a pod's create fail once with "connection closed
/// before message completed" under load, a session lost to a request that would have worked.
/// An answer (any status) and a timeout are never tried again here.
pub(super) async fn bounded<T, Fut>(
    mut request: impl FnMut() -> Fut,
) -> std::result::Result<T, Failure>
where
    Fut: Future<Output = kube::Result<T>>,
{
    let mut waits = TRANSPORT_RETRIES.iter();
    loop {
        match tokio::time::timeout(REQUEST_TIMEOUT, request()).await {
            Ok(Err(e @ (kube::Error::Service(_) | kube::Error::HyperError(_)))) => {
                match waits.next() {
                    Some(wait) => {
                        tracing::debug!(error = %chain(&e), "a Kubernetes API request failed in transport; trying it again");
                        tokio::time::sleep(*wait).await;
                    }
                    None => return Err(Failure::Unreachable(chain(&e))),
                }
            }
            r => return once(r),
        }
    }
}

/// One request that must not be sent twice (an exec starts a process), bounded by
/// [`REQUEST_TIMEOUT`].
async fn bounded_once<T>(
    request: impl Future<Output = kube::Result<T>>,
) -> std::result::Result<T, Failure> {
    once(tokio::time::timeout(REQUEST_TIMEOUT, request).await)
}

fn once<T>(
    r: std::result::Result<kube::Result<T>, tokio::time::error::Elapsed>,
) -> std::result::Result<T, Failure> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) => Err(Failure::Api(s)),
        Ok(Err(e)) => Err(Failure::Unreachable(chain(&e))),
        Err(_) => Err(Failure::Unreachable(format!(
            "no answer within {} s",
            REQUEST_TIMEOUT.as_secs()
        ))),
    }
}

pub(super) fn failure(url: &str, what: &str, f: Failure) -> AdapterError {
    match f {
        Failure::Unreachable(why) => provision(format!(
            "the Kubernetes API server at {url} is unreachable (trying to {what}): {why}"
        )),
        Failure::Api(s) => provision(format!(
            "the Kubernetes API server at {url} refused to {what}: {} ({} {})",
            s.message, s.code, s.reason
        )),
    }
}

enum Start {
    Running(String),
    Pending(String),
    Failed(String),
}

/// The state of the init container that brings the runtime into a pod of another image.
fn runtime_init_state(pod: &KubePod) -> Option<&ContainerState> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == RUNTIME_CONTAINER)?
        .state
        .as_ref()
}

impl RuntimeNotes {
    /// What the init container did with `nodeCache` (its termination message, image/runtime-init):
    /// reused or filled the node's copy, or copied the runtime into the pod, with why, warned
    /// once per adapter since only the operator can fix the node's directory.
    fn log(&self, pod: &KubePod, name: &str, node: &str) {
        let Some(cache) = &self.node_cache else {
            return;
        };
        // A pod of the runtime's own image has no init container, and nothing to say.
        let Some(init) = runtime_init_state(pod) else {
            return;
        };
        let message = init
            .terminated
            .as_ref()
            .and_then(|t| t.message.clone())
            .unwrap_or_default();
        let message = message.lines().next().unwrap_or_default().trim();
        match message.strip_prefix("copied: ") {
            Some(why) if !self.warned.swap(true, Ordering::Relaxed) => tracing::warn!(
                pod = %name,
                node = %node,
                "the runtime was copied into the pod, not kept once on node {node}: the node \
                 cache {cache} (backend.kubernetes.nodeCache) cannot be used there: {why}"
            ),
            Some(why) => {
                tracing::debug!(pod = %name, node = %node, "the runtime copied into the pod: {why}")
            }
            None => {
                tracing::debug!(pod = %name, node = %node, "the runtime from the node cache {cache}: {message}")
            }
        }
    }
}

/// What [`Cluster::wait_running`] found.
struct Ready {
    node: String,
    image_id: Option<String>,
    stream: Option<PodExec>,
}

/// The session container's image id, where the pod's status names it.
fn image_id_of(pod: &KubePod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
        .map(|c| c.image_id.clone())
        .filter(|id| !id.is_empty())
}

/// Where a starting pod is: running, still on its way (why), or never going to run (why).
fn start_state(pod: &KubePod, image: &str, runtime_image: &str) -> Start {
    let status = pod.status.clone().unwrap_or_default();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    // The runtime's copy comes first: its failure is the runtime image's, named as such.
    let init = runtime_init_state(pod).cloned().unwrap_or_default();
    if let Some(t) = init.terminated.as_ref().filter(|t| t.exit_code != 0) {
        return Start::Failed(format!(
            "copying the adapter's runtime from {runtime_image} (backend.kubernetes.runtimeImage) \
             failed: {}",
            terminated(t)
        ));
    }
    if let Some(w) = &init.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if FATAL_WAITING.contains(&reason.as_str()) {
            return Start::Failed(format!(
                "the runtime image {runtime_image} (backend.kubernetes.runtimeImage) cannot run \
                 on node {node}: {reason}: {}",
                w.message.clone().unwrap_or_default()
            ));
        }
    }
    let container = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER));
    let state = container.and_then(|c| c.state.clone()).unwrap_or_default();
    // An image named as the runtime's that has no runtime: say which setting fixes it.
    let no_runtime = |what: &str| {
        if image == runtime_image && what.contains(RUNTIME_DIR) {
            format!(
                "; the image {image} has no {RUNTIME_DIR}: it is not the adapter's session \
                 image, so set backend.kubernetes.runtimeImage to the session image"
            )
        } else {
            String::new()
        }
    };
    if let Some(t) = &state.terminated {
        let why = terminated(t);
        return Start::Failed(format!(
            "its container terminated before it ran: {why}{}",
            no_runtime(&why)
        ));
    }
    if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
        return Start::Failed(format!(
            "it ended ({}): {} {}",
            status.phase.unwrap_or_default(),
            status.reason.unwrap_or_default(),
            status.message.unwrap_or_default()
        ));
    }
    if state.running.is_some() && status.phase.as_deref() == Some("Running") {
        return Start::Running(node);
    }
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        let message = w.message.clone().unwrap_or_default();
        if FATAL_WAITING.contains(&reason.as_str()) {
            return Start::Failed(match reason.as_str() {
                "CreateContainerConfigError" | "CreateContainerError" | "RunContainerError" => {
                    format!(
                        "its container cannot be created on node {node}: {reason}: {message}{}",
                        no_runtime(&message)
                    )
                }
                _ => format!(
                    "the image {image} is not available on node {node}: {reason}: {message}"
                ),
            });
        }
        if !reason.is_empty() {
            return Start::Pending(format!("{reason} {message}").trim().to_string());
        }
    }
    let unscheduled = status.conditions.as_ref().and_then(|cs| {
        cs.iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    });
    if let Some(c) = unscheduled {
        return Start::Pending(format!(
            "not scheduled: {}: {}",
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default()
        ));
    }
    Start::Pending(format!(
        "phase {}",
        status.phase.unwrap_or_else(|| "unknown".into())
    ))
}

fn terminated(t: &ContainerStateTerminated) -> String {
    format!(
        "{} (exit code {}{}){}",
        t.reason.as_deref().unwrap_or("terminated"),
        t.exit_code,
        t.signal
            .map(|s| format!(", signal {s}"))
            .unwrap_or_default(),
        t.message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    )
}

impl Pod {
    /// The session container's image id as the node resolved it (its digest): what the pod's
    /// files come from, whatever its tag names later. Its status may name it after the stream
    /// opened ([`Cluster::start_pod_with`]): then it is waited for, bounded; the image's
    /// reference where none comes. The runtime's note is logged when that status is read.
    pub async fn image_id(&self) -> String {
        self.image_id
            .get_or_init(|| async {
                let deadline = Instant::now() + IMAGE_ID_WAIT;
                loop {
                    if let Ok(p) = bounded(|| self.api.get(&self.name)).await {
                        // With the runtime's init container's end, which its note reads.
                        let init_done =
                            runtime_init_state(&p).is_none_or(|s| s.terminated.is_some());
                        if let Some(id) = image_id_of(&p).filter(|_| init_done) {
                            self.notes.log(&p, &self.name, &self.node);
                            return id;
                        }
                    }
                    if Instant::now() >= deadline {
                        return self.image.clone();
                    }
                    tokio::time::sleep(POLL).await;
                }
            })
            .await
            .clone()
    }

    /// Starts `argv` in the pod's container with stdin, stdout and stderr attached.
    pub async fn exec(&self, argv: &[String]) -> Result<PodExec> {
        let params = AttachParams {
            container: Some(CONTAINER.into()),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
            max_stdin_buf_size: Some(EXEC_BUFFER),
            max_stdout_buf_size: Some(EXEC_BUFFER),
            max_stderr_buf_size: Some(EXEC_BUFFER),
        };
        let what = format!("exec in pod {}", self.name);
        let mut process = bounded_once(self.api.exec(&self.name, argv.to_vec(), &params))
            .await
            .map_err(|f| match f {
                Failure::Api(s) if s.is_not_found() => AdapterError::new(
                    ErrorCode::AgentFailed,
                    format!("pod {} is gone: {}", self.name, s.message),
                ),
                f => failure(&self.url, &what, f),
            })?;
        let missing = || {
            AdapterError::new(
                ErrorCode::Internal,
                format!("{what}: a stdio stream is missing"),
            )
        };
        let stdin = process.stdin().ok_or_else(missing)?;
        let stdout = process.stdout().ok_or_else(missing)?;
        let stderr = process.stderr().ok_or_else(missing)?;
        let status = process.take_status().ok_or_else(missing)?;
        Ok(PodExec {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            status: Box::pin(async move {
                // The stream's task belongs to `process`: it runs while this future lives.
                let end = exec_end(status.await);
                drop(process);
                end
            }),
        })
    }

    /// Why the pod stopped serving (after an exec stream broke): `None` when it still runs.
    /// Killed for memory = `ERR_RESOURCE_LIMIT`, past `activeDeadlineSeconds` =
    /// `ERR_TIMEOUT`, deleted, evicted, its node lost or its container ended =
    /// `ERR_AGENT_FAILED`, each with the cause.
    pub async fn why_gone(&self) -> Option<AdapterError> {
        let failed = |m: String| Some(AdapterError::new(ErrorCode::AgentFailed, m));
        let pod = match bounded(|| self.api.get(&self.name)).await {
            Ok(pod) => pod,
            Err(Failure::Api(s)) if s.is_not_found() => {
                return failed(format!(
                    "pod {} was deleted (from outside the adapter)",
                    self.name
                ))
            }
            Err(f) => {
                return failed(format!(
                    "pod {} cannot be reached: {}",
                    self.name,
                    failure(&self.url, &format!("read pod {}", self.name), f).message
                ))
            }
        };
        let status = pod.status.clone().unwrap_or_default();
        let terminated = status
            .container_statuses
            .as_ref()
            .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
            .and_then(|c| c.state.as_ref()?.terminated.clone());
        if terminated.as_ref().and_then(|t| t.reason.as_deref()) == Some("OOMKilled") {
            return Some(self.killed_for_memory());
        }
        let (reason, message) = (
            status.reason.clone().unwrap_or_default(),
            status.message.clone().unwrap_or_default(),
        );
        if reason == "DeadlineExceeded" {
            return Some(AdapterError::new(
                ErrorCode::Timeout,
                format!(
                    "pod {} ran past its activeDeadlineSeconds ({} s): {message}",
                    self.name,
                    self.active_deadline.unwrap_or_default()
                ),
            ));
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return failed(format!(
                "pod {} was deleted (from outside the adapter)",
                self.name
            ));
        }
        if reason == "Evicted" && past_storage_limit(&message) {
            return Some(self.evicted_for_storage(&message));
        }
        if !reason.is_empty() {
            // Evicted (node pressure), NodeLost, and what else the cluster names.
            return failed(format!("pod {} ended: {reason}: {message}", self.name));
        }
        if status.phase.as_deref() == Some("Unknown") {
            return failed(format!(
                "pod {} is unreachable: its node {} is lost (phase Unknown)",
                self.name, self.node
            ));
        }
        if let Some(t) = terminated {
            return failed(format!(
                "pod {}'s container ended: {}",
                self.name,
                self::terminated(&t)
            ));
        }
        if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
            return failed(format!(
                "pod {} ended (phase {})",
                self.name,
                status.phase.unwrap_or_default()
            ));
        }
        None
    }

    /// `ERR_RESOURCE_LIMIT` naming the pod's memory limit: the error of a pod killed for
    /// memory (`cra-pod idle` ends the pod when any process of it is).
    fn killed_for_memory(&self) -> AdapterError {
        AdapterError::new(
            ErrorCode::ResourceLimit,
            format!(
                "pod {} was killed for memory: past its limit of {} (backend.kubernetes.resources.limits.memory)",
                self.name,
                self.memory_limit.as_deref().unwrap_or("the node's memory (no limit set)")
            ),
        )
    }

    /// `ERR_RESOURCE_LIMIT` naming the pod's ephemeral-storage limit, worded as a local
    /// session's disk bound is (what the session wrote, the limit and its field): the kubelet
    /// evicted the pod because its files (the checkout, HOME, what its container wrote, the runtime's copy
    /// in a user's image) passed the limit the session was given. A node short of disk is not
    /// the session's limit and stays `ERR_AGENT_FAILED` with the kubelet's words.
    fn evicted_for_storage(&self, kubelet: &str) -> AdapterError {
        AdapterError::new(
            ErrorCode::ResourceLimit,
            format!(
                "the session wrote past its disk limit: pod {} was evicted for disk: its files passed its ephemeral-storage limit of {} ({}); the kubelet: {}",
                self.name,
                self.storage_limit.as_deref().unwrap_or("(none set here)"),
                if self.storage_from_disk_mib {
                    "sandbox.limits.diskMiB"
                } else {
                    "backend.kubernetes.resources.limits.ephemeral-storage"
                },
                kubelet.trim()
            ),
        )
    }

    /// Sets (or, `None`, removes) annotation `key` on the pod.
    pub async fn annotate(&self, key: &str, value: Option<&str>) -> Result<()> {
        self.mark(serde_json::json!({ "annotations": { key: value } }))
            .await
    }

    /// Merges `metadata` (labels, annotations; a `null` removes one) into the pod's.
    pub async fn mark(&self, metadata: serde_json::Value) -> Result<()> {
        let patch = serde_json::json!({ "metadata": metadata });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
        bounded(|| self.api.patch(&self.name, &params, &patch))
            .await
            .map(drop)
            .map_err(|f| failure(&self.url, &format!("annotate pod {}", self.name), f))
    }

    /// Deletes the pod (grace 0) and waits until it is gone (bounded); already gone is
    /// success.
    pub async fn delete(&self) -> Result<()> {
        let (what, grace) = (format!("delete pod {}", self.name), grace_zero());
        match bounded(|| self.api.delete(&self.name, &grace)).await {
            Ok(_) => {}
            Err(Failure::Api(s)) if s.is_not_found() => return Ok(()),
            Err(f) => return Err(failure(&self.url, &what, f)),
        }
        let deadline = Instant::now() + DELETE_TIMEOUT;
        loop {
            match bounded(|| self.api.get(&self.name)).await {
                Err(Failure::Api(s)) if s.is_not_found() => return Ok(()),
                Err(Failure::Unreachable(why)) if Instant::now() >= deadline => {
                    return Err(failure(&self.url, &what, Failure::Unreachable(why)))
                }
                _ if Instant::now() >= deadline => {
                    return Err(provision(format!(
                        "pod {} was still there {} s after its deletion",
                        self.name,
                        DELETE_TIMEOUT.as_secs()
                    )))
                }
                _ => tokio::time::sleep(POLL).await,
            }
        }
    }
}

/// The exec's end from the status the API server sent (`None`: the stream ended without one).
fn exec_end(status: Option<ExecStatus>) -> ExecEnd {
    let Some(s) = status else {
        return ExecEnd::Broken;
    };
    if s.status.as_deref() == Some("Success") {
        return ExecEnd::Exited(0);
    }
    let reason = s.reason.unwrap_or_default();
    let code = (reason == "NonZeroExitCode")
        .then(|| {
            s.details?
                .causes?
                .into_iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))?
                .message?
                .parse()
                .ok()
        })
        .flatten();
    match code {
        Some(code) => ExecEnd::Exited(code),
        None => ExecEnd::Failed(format!("{} ({reason})", s.message.unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_stand_for_any_string_and_never_collide_by_sanitising() {
        assert_eq!(label_value("host-1.example"), "host-1.example");
        for s in ["", "a b", "-x-", "é", &"a".repeat(64), "a/b", "a b"] {
            let v = label_value(s);
            assert!(is_label_value(&v) && !v.is_empty(), "{s:?} -> {v:?}");
        }
        assert_ne!(label_value("a b"), label_value("a/b"));
        assert_ne!(label_value("a b"), label_value("ab"));
        assert!(label_value("sess ion").starts_with("session-"));
    }

    #[test]
    fn only_an_eviction_past_the_pods_own_storage_limit_is_the_sessions_limit() {
        assert!(past_storage_limit(
            "Pod ephemeral local storage usage exceeds the total limit of containers 200Mi. "
        ));
        assert!(past_storage_limit(
            "Container session exceeded its local ephemeral storage limit \"200Mi\". "
        ));
        assert!(!past_storage_limit(
            "The node was low on resource: ephemeral-storage. Container session was using 10Gi, which exceeds its request of 0. "
        ));
        assert!(!past_storage_limit(
            "The node was low on resource: memory. "
        ));
    }

    fn transport_failure() -> kube::Error {
        kube::Error::Service("connection closed before message completed".into())
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_failed_in_transport_is_sent_again_and_an_answer_never_is() {
        let mut sent = 0;
        let r = bounded(|| {
            sent += 1;
            let n = sent;
            async move {
                if n < 3 {
                    Err(transport_failure())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert!(matches!(r, Ok(3)), "the third attempt answered");

        let mut sent = 0;
        let r: std::result::Result<(), Failure> = bounded(|| {
            sent += 1;
            async {
                Err(kube::Error::Api(Box::new(
                    kube::core::Status::failure("exists", "AlreadyExists").with_code(409),
                )))
            }
        })
        .await;
        assert!(matches!(r, Err(Failure::Api(s)) if s.code == 409));
        assert_eq!(sent, 1, "an answer is never sent again");

        let mut sent = 0;
        let r: std::result::Result<(), Failure> = bounded(|| {
            sent += 1;
            async { Err(transport_failure()) }
        })
        .await;
        assert!(
            matches!(&r, Err(Failure::Unreachable(why)) if why.contains("connection closed")),
            "the last transport failure is named"
        );
        assert_eq!(sent, 1 + TRANSPORT_RETRIES.len());

        let mut sent = 0;
        let r: std::result::Result<(), Failure> = bounded(|| {
            sent += 1;
            std::future::pending()
        })
        .await;
        assert!(matches!(&r, Err(Failure::Unreachable(why)) if why.contains("no answer within")));
        assert_eq!(
            sent, 1,
            "a request that timed out may still be working: not sent again"
        );
    }

    #[test]
    fn deadlines_round_up_to_whole_seconds() {
        assert_eq!(deadline_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(deadline_seconds(Duration::from_secs(7)), 7);
        assert_eq!(deadline_seconds(Duration::from_millis(1)), 1);
        assert_eq!(deadline_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn exec_status_gives_the_exit_code() {
        let s: ExecStatus = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "NonZeroExitCode", "message": "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3",
            "details": { "causes": [{ "reason": "ExitCode", "message": "3" }] }
        }))
        .unwrap();
        assert_eq!(exec_end(Some(s)), ExecEnd::Exited(3));
        let ok: ExecStatus =
            serde_json::from_value(serde_json::json!({ "status": "Success" })).unwrap();
        assert_eq!(exec_end(Some(ok)), ExecEnd::Exited(0));
        assert_eq!(exec_end(None), ExecEnd::Broken);
        let other: ExecStatus = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "InternalError", "message": "container not found"
        }))
        .unwrap();
        assert_eq!(
            exec_end(Some(other)),
            ExecEnd::Failed("container not found (InternalError)".into())
        );
    }

    /// A cluster that is never reached: `pod_spec` reads only its config and namespace.
    fn offline(config: KubernetesConfig) -> Cluster {
        let refuse = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("offline"))
        });
        Cluster {
            client: Client::new(refuse, config.namespace.clone()),
            namespace: config.namespace.clone(),
            url: "https://offline.invalid".into(),
            notes: RuntimeNotes {
                node_cache: config.node_cache.clone(),
                warned: Arc::default(),
            },
            config,
        }
    }

    /// `backend.kubernetes` of the runtime image alone, with `extra`'s fields.
    fn config(extra: serde_json::Value) -> KubernetesConfig {
        let mut k =
            serde_json::json!({ "namespace": "agents", "runtimeImage": "example.com/cra:1" });
        k.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        crate::config::kubernetes::from_json(&k)
    }

    /// An Implementor's request from a fixed engine process (the owner is on the pod).
    fn request() -> PodRequest {
        PodRequest {
            owner: Owner {
                pid: 4242,
                start_time: 99,
                host: "engine host".into(),
            },
            ..PodRequest::new("session/1", Role::Implementor)
        }
    }

    /// The pod spec, serialized, as the golden file `tests/golden/pod_spec/{name}.json` has it
    /// (written anew with `UPDATE_GOLDEN=1`; then read the diff). The init container's script
    /// stands there as `<image/runtime-init>`: a change to the script is not one to the spec.
    fn pinned(name: &str, config: KubernetesConfig, req: &PodRequest) {
        let pod = offline(config).pod_spec("cra-pod-1", req);
        let mut pod = serde_json::to_value(&pod).unwrap();
        if let Some(command) = pod.pointer_mut("/spec/initContainers/0/command/2") {
            if command == RUNTIME_INIT {
                *command = "<image/runtime-init>".into();
            }
        }
        let actual = serde_json::to_string_pretty(&pod).unwrap() + "\n";
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/pod_spec")
            .join(format!("{name}.json"));
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &actual).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
        if expected != actual {
            let diff = similar::TextDiff::from_lines(expected.as_str(), actual.as_str())
                .unified_diff()
                .header("golden", "actual")
                .to_string();
            panic!("the pod spec differs from {}:\n{diff}", path.display());
        }
    }

    /// Every branch `pod_spec` takes, each against the bytes it made before it was split into
    /// its steps: a session's or a warm pod, resources and scheduling, the runtime's image or a
    /// user's (copied in, or linked from `nodeCache`), a sandboxed session's node bases, and
    /// `nodeCache` without them (`sandbox: false`).
    #[tokio::test]
    async fn the_pod_spec_of_each_kind_of_session_is_byte_identical_to_its_golden_file() {
        pinned("session", config(serde_json::json!({})), &request());

        let mut warm = PodRequest {
            warm: true,
            active_deadline: Some(Duration::from_millis(3_600_500)),
            ..request()
        };
        warm.role = Role::Planner;
        pinned("warm", config(serde_json::json!({})), &warm);

        let scheduled = config(serde_json::json!({
            "imagePullPolicy": "Always",
            "resources": {
                "requests": { "cpu": "500m" },
                "limits": { "memory": "2Gi", "ephemeral-storage": "200Mi" },
            },
            "nodeSelector": { "pool": "agents" },
            "tolerations": [{
                "key": "dedicated", "operator": "Equal", "value": "agents",
                "effect": "NoExecute", "tolerationSeconds": 30,
            }],
            "runtimeClassName": "gvisor",
            "serviceAccountName": "agent",
            "labels": { "team": "core" },
            "annotations": { "note": "a b" },
        }));
        let command = PodRequest {
            command: Some(vec!["sleep".into(), "infinity".into()]),
            ..request()
        };
        pinned("scheduled_and_limited", scheduled, &command);

        let configured_image = config(serde_json::json!({ "image": "example.com/user:2" }));
        pinned("user_image", configured_image, &request());

        let user_image = PodRequest {
            image: Some("example.com/devcontainer:3".into()),
            ..request()
        };
        let cached = config(serde_json::json!({ "nodeCache": "/var/cache/cra" }));
        pinned("user_image_node_cache", cached.clone(), &user_image);

        let node_bases = PodRequest {
            node_bases: true,
            ..request()
        };
        pinned("node_bases", cached.clone(), &node_bases);
        pinned(
            "user_image_node_cache_node_bases",
            cached.clone(),
            &PodRequest {
                node_bases: true,
                ..user_image
            },
        );
        // Without node bases (`sandbox: false`), a pod of the runtime's image has no use for
        // `nodeCache`: the same spec as without one.
        pinned("session", cached, &request());
    }
}
