//! Where a session runs: one small interface — provision → exec (streamed stdio, exit status,
//! kill) → extract patch → destroy — so the lifecycle, the CLI protocol and the binding do not
//! know whether the agent runs in a local clone under bubblewrap ([`local`], the first
//! implementation) or somewhere else (a Kubernetes pod: the pod is provisioned, the CLI is
//! exec'd in it with its stdio attached, the patch is read by a command in the pod, the pod is
//! deleted — the same four steps).
//!
//! Paths the lifecycle gets back ([`Environment::workdir`]) are the ones the agent sees, which
//! the file-tool hooks compare against; the local environment mounts everything at its host
//! path, so the two coincide.

#[cfg(unix)]
pub mod kubernetes;
pub mod local;
pub mod process;
#[cfg(unix)]
pub mod remote;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use crate::config::SandboxConfig;
use crate::error::Result;
use crate::gateway::ApiHooks;
use crate::git::worktree::Continuation;
use crate::git::{ProvisionRequest, ViewRequest};
use crate::sandbox::EgressSink;

pub use local::LocalBackend;

/// What a session asks of its environment.
pub struct EnvRequest {
    /// The session's id and role (a remote environment labels what it makes with them).
    pub session_id: String,
    pub role: crate::domain::Role,
    /// The engine's repository.
    pub repo_root: PathBuf,
    /// What the agent works in.
    pub workspace: Workspace,
    /// The OS sandbox (`None` = `sandbox: false`).
    pub sandbox: Option<SandboxConfig>,
    /// The CLI's environment as the adapter built it (credentials included: the environment
    /// decides what of it reaches the processes it runs).
    pub env: Vec<(String, String)>,
    /// Where network attempts from inside are reported.
    pub egress: Option<EgressSink>,
    /// What the session's model relay does beyond forwarding (outages, the fleet's pace).
    pub api: ApiHooks,
}

/// What the agent works in.
pub enum Workspace {
    /// An Implementor's own writable checkout on its branch.
    Checkout(ProvisionRequest),
    /// A Planner's or Reviewer's read-only view of the default branch
    /// ([`crate::git::view`]): not the repository directory, which holds credentials.
    View(ViewRequest),
}

impl Workspace {
    /// The branch whose commit the checkout or view holds.
    pub fn default_branch(&self) -> &str {
        match self {
            Workspace::Checkout(p) => &p.default_branch,
            Workspace::View(v) => &v.default_branch,
        }
    }
}

/// A process to run in the environment.
pub struct ExecCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Its environment, before the environment's own changes (proxy, credential placeholder).
    pub env: Vec<(String, String)>,
}

/// A running process: its pipes and its control.
pub struct Exec {
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub control: Box<dyn ExecControl>,
}

/// Stopping and reaping a running process and everything it started.
pub trait ExecControl: Send + Sync {
    /// The host pid, where there is one (for `sessions()`).
    fn pid(&self) -> Option<u32>;
    /// Ask it to end (SIGTERM); it may take a moment.
    fn terminate(&self);
    /// Kill it and everything it started; returns once nothing is left.
    fn kill_all(&mut self) -> BoxFuture<'_, ()>;
    /// Its exit status once it has exited (`None` if that cannot be known).
    fn wait(&mut self) -> BoxFuture<'_, Option<ExitStatus>>;
}

/// Makes environments.
pub trait Backend: Send + Sync {
    /// What must hold before anything is provisioned: a session that cannot be confined
    /// provisions nothing. `env` is the CLI's environment.
    fn preflight(&self, env: &[(String, String)], sandbox: Option<&SandboxConfig>) -> Result<()>;

    /// True when every model request of a session with `sandbox` passes the engine's relay,
    /// which counts its spend (`ApiHooks::spend` of [`EnvRequest::api`]): what a budget needs.
    fn meters_model_requests(&self, sandbox: Option<&SandboxConfig>) -> bool;

    /// The CLI inside the environment when it is not the engine's own (a session image's);
    /// `None`: the engine's CLI, found by `claudeExecutable` and the search roots.
    fn cli_program(&self) -> Option<PathBuf> {
        None
    }

    /// Reads, once for the process, what every session's start would otherwise wait for
    /// (`env`: the CLI's environment). Run in the background when the adapter is made.
    fn warm_up<'a>(
        &'a self,
        _env: &'a [(String, String)],
        _sandbox: Option<&'a SandboxConfig>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// What the backend keeps for later sessions goes (`shutdown()`, once its sessions
    /// ended): the Kubernetes backend's warm pods.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Removes what this backend made for sessions whose engine process is gone (its own
    /// records only); returns what it removed. The local backend's clones are swept by the
    /// repository's sweep ([`crate::git::sweep`]) instead.
    fn sweep(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// True when the session's files are on the engine's own disk, which the floor
    /// (`sandbox.limits.diskFloorMiB`, [`crate::disk`]) keeps from filling: a new session is
    /// refused below it. A pod's are on its node, bounded by its `ephemeral-storage`.
    fn on_engine_disk(&self) -> bool {
        false
    }

    /// Everything the session needs before its CLI starts. `stop` reaches every step; a
    /// failed or stopped provision leaves nothing behind.
    fn provision<'a>(
        &'a self,
        req: EnvRequest,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Box<dyn Environment>>>;
}

/// One session's environment.
pub trait Environment: Send + Sync {
    /// Where the agent works (its checkout, or its view of the repository).
    fn workdir(&self) -> &Path;
    /// True when the agent has a checkout of its own whose patch is its work.
    fn has_checkout(&self) -> bool;
    /// The temp dir processes inside see (the Planner's and Reviewer's file tools may write it).
    fn temp_dir(&self) -> PathBuf;
    /// A one-line description for the transcript (what the sandbox holds, which mechanism
    /// enforces its limits).
    fn describe(&self) -> String;
    /// True when the session's limits could only be set as rlimits (no usable cgroup).
    fn limits_are_fallback(&self) -> bool;
    /// What of the configured limits the kernel does not enforce at all (rlimits only and an
    /// engine running as root: no process limit), in words naming the config field.
    fn limits_unenforced(&self) -> Option<String> {
        None
    }
    /// The kernel limit the session ran into (memory, processes), in words naming the config
    /// field; asked after the agent ended, before [`Environment::destroy`].
    fn limit_hit(&self) -> Option<String>;
    /// What the session writes on the engine's disk, measured for its disk bound and the
    /// floor ([`crate::disk`]): the Implementor's own writes (a layer's `upper` and git dir,
    /// not the shared base; or its full clone) and the CLI's config dir. Asked once the CLI
    /// has started. Empty where the session's files are not on the engine's disk.
    fn disk_paths(&self) -> Vec<PathBuf> {
        Vec::new()
    }
    /// The limits of the agent's commands they ran into while the session went on (forks
    /// refused, a process killed for memory), in words; asked when [`Environment::limit_hit`]
    /// is.
    fn commands_limited(&self) -> Option<String> {
        None
    }
    /// True when a checkout whose work could not be read is left in place (for an operator or
    /// the next sweep) by [`Environment::destroy`]`(true)`; a pod cannot be.
    fn keeps_unreadable_work(&self) -> bool {
        true
    }
    /// Why the environment itself ended under the agent (a pod deleted, evicted or
    /// OOM-killed), asked when the agent failed; `None` when it did not.
    fn lost(&self) -> BoxFuture<'_, Option<crate::error::AdapterError>> {
        Box::pin(async { None })
    }
    /// Starts `cmd` inside.
    fn exec(&mut self, cmd: ExecCommand) -> BoxFuture<'_, Result<Exec>>;
    /// The CLI's conversation `cli_session` (what `claude --resume` reads), asked once the CLI
    /// has ended, before [`Environment::destroy`]; `None` where it is not kept.
    fn conversation<'a>(&'a self, _cli_session: &'a str) -> BoxFuture<'a, Option<Vec<u8>>> {
        Box::pin(async { None })
    }
    /// The interrupted session whose checkout (and conversation) this one took over
    /// ([`crate::git::interrupted`]); `None` for a fresh one.
    fn continued(&self) -> Option<&Continuation> {
        None
    }
    /// Records, once the CLI started, what continuing this session after an interruption
    /// needs (its conversation id and model); `None` once it ended for good. True when the
    /// record names the agent, false where nothing can be continued.
    fn record_agent<'a>(
        &'a self,
        _agent: Option<(&'a str, Option<&'a str>)>,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async { false })
    }
    /// The agent's work as a patch (empty without a checkout or without changes). Unbounded:
    /// the lifecycle bounds it, and dropping the future ends whatever it runs.
    fn extract_patch(&self) -> BoxFuture<'_, Result<String>>;
    /// Removes everything provisioned. Idempotent. `keep_checkout`: the agent's work could not
    /// be read out of its checkout, which is then left where it is (no longer held by this
    /// session) for an operator or the next sweep, instead of being removed with its work.
    fn destroy(&mut self, keep_checkout: bool) -> BoxFuture<'_, Result<()>>;
}
