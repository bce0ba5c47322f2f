//! The local environment: an Implementor's private clone under `.worktrees/` (see
//! [`crate::git::provision`]) or, for a Planner or Reviewer, a read-only view of the default
//! branch (see [`crate::git::view`]; with `sandbox: false` too: it costs one checkout and keeps
//! the repository's config and ignored files out of the agent's way); on Linux the
//! CLI runs inside one bubblewrap sandbox per session ([`crate::sandbox`]), elsewhere directly
//! (macOS: under Claude Code's own Seatbelt sandbox for its commands).

#[cfg(target_os = "linux")]
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{process, Backend, EnvRequest, Environment, Exec, ExecCommand, Workspace};
use crate::config::SandboxConfig;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::gateway::ApiHooks;
use crate::git::interrupted::conversation_in;
#[cfg(target_os = "linux")]
use crate::git::list::object_dirs;
use crate::git::worktree::Continuation;
use crate::git::{RepoGit, RepoView, Worktree};
use crate::process::env_value;
#[cfg(target_os = "linux")]
use crate::sandbox::{find_on_path, SessionScope};
use crate::sandbox::{EgressSink, GitJails, SessionSandbox};
use crate::scratch::ScratchDir;

/// Makes [`LocalEnvironment`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalBackend;

impl Backend for LocalBackend {
    fn preflight(&self, env: &[(String, String)], sandbox: Option<&SandboxConfig>) -> Result<()> {
        if sandbox.is_none() {
            return Ok(());
        }
        let path = env_value(env, "PATH").map(std::ffi::OsStr::new);
        crate::sandbox::check_available(path)
    }

    /// Only the Linux sandbox puts the relay between the CLI and the API: with `sandbox:
    /// false`, and on macOS (Claude Code's own sandbox), the CLI calls the API itself.
    fn meters_model_requests(&self, sandbox: Option<&SandboxConfig>) -> bool {
        cfg!(target_os = "linux") && sandbox.is_some()
    }

    fn on_engine_disk(&self) -> bool {
        true
    }

    /// The user's login shell `PATH` a sandboxed session starts with: a profile can take a
    /// third of a second, which a restarted engine's first session would otherwise wait for.
    fn warm_up<'a>(
        &'a self,
        env: &'a [(String, String)],
        sandbox: Option<&'a SandboxConfig>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if sandbox.is_some() {
                crate::sandbox::warm_up(env).await;
            }
        })
    }

    fn provision<'a>(
        &'a self,
        req: EnvRequest,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Box<dyn Environment>>> {
        Box::pin(async move {
            let repo = RepoGit::for_repo(&req.repo_root);
            let workspace = match &req.workspace {
                Workspace::Checkout(p) => {
                    Made::Checkout(repo.provision_or_continue(p, &GitJails, stop).await?)
                }
                Workspace::View(v) => Made::View(repo.provision_view(v, stop).await?),
            };
            let env: Box<dyn Environment> = Box::new(LocalEnvironment {
                workdir: match &workspace {
                    Made::Checkout(w) => w.path.clone(),
                    Made::View(v) => v.path.clone(),
                },
                repo_root: req.repo_root,
                workspace,
                sandbox: req.sandbox,
                env: req.env,
                egress: req.egress,
                api: req.api,
                cli_config: None,
                running: None,
            });
            Ok(env)
        })
    }
}

/// Where the CLI's config dir is (only the Linux sandbox gives the CLI one).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
enum CliConfig {
    Checkout(PathBuf),
    Temp(ScratchDir),
}

impl CliConfig {
    fn path(&self) -> &Path {
        match self {
            CliConfig::Checkout(p) => p,
            CliConfig::Temp(d) => d.path(),
        }
    }
}

/// What was provisioned for the agent to work in.
enum Made {
    Checkout(Worktree),
    View(RepoView),
}

// Only Linux builds its sandbox from the repository and the egress sink.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct LocalEnvironment {
    workdir: PathBuf,
    repo_root: PathBuf,
    workspace: Made,
    sandbox: Option<SandboxConfig>,
    /// The CLI's environment (its `TMPDIR` is the temp dir without the sandbox).
    env: Vec<(String, String)>,
    egress: Option<EgressSink>,
    api: ApiHooks,
    /// The CLI's config dir, made at its first run and kept until the environment is destroyed:
    /// a CLI that ended on an API failure is resumed from the conversation in it. A checkout's
    /// is in its record dir (it outlives this process for a continuation); a view's is a temp
    /// dir.
    cli_config: Option<CliConfig>,
    /// The sandbox of the running CLI (its proxy and relay live as long as this does).
    running: Option<SessionSandbox>,
}

#[cfg(target_os = "linux")]
impl LocalEnvironment {
    /// What the session sees: its clone read-write, or its view of the repository read-only,
    /// and the object stores either borrows from (never the repository directory itself: its
    /// config, ignored files and other sessions' clones stay out); the CLI's directory.
    async fn scope(&self, program: &Path) -> SessionScope {
        let mut scope = SessionScope {
            cwd: self.workdir.clone(),
            ..SessionScope::default()
        };
        match &self.workspace {
            Made::Checkout(w) => {
                scope.writable.push(w.path.clone());
                scope.layer = w.layer.as_ref().map(|l| l.mounts(&w.path));
            }
            Made::View(v) => scope.readable.push(v.path.clone()),
        }
        let repo = RepoGit::for_repo(&self.repo_root);
        if let Ok(common) = repo.common_dir().await {
            scope.readable.extend(object_dirs(&common));
        }
        if let Some(dir) = program.parent() {
            scope.readable.push(dir.to_path_buf());
        }
        scope
    }

    async fn exec_sandboxed(&mut self, cfg: &SandboxConfig, mut cmd: ExecCommand) -> Result<Exec> {
        // The CLI's own directory is mounted: follow a symlink (`node_modules/.bin/claude`) to
        // where the binary and its files really are.
        if let Ok(real) = cmd.program.canonicalize() {
            cmd.program = real;
        }
        let mut scope = self.scope(&cmd.program).await;
        if self.cli_config.is_none() {
            let made = match &self.workspace {
                Made::Checkout(w) => {
                    private_dir(&w.cli_config).map(|()| CliConfig::Checkout(w.cli_config.clone()))
                }
                Made::View(_) => ScratchDir::create("cliconfig").map(CliConfig::Temp),
            };
            self.cli_config = Some(made.map_err(|e| {
                AdapterError::new(
                    ErrorCode::SandboxUnavailable,
                    "cannot create the session's directory for the CLI's config",
                )
                .with_cause(e)
            })?);
        }
        scope.cli_config = self.cli_config.as_ref().map(|d| d.path().to_path_buf());
        let sandbox =
            SessionSandbox::start(cfg, &scope, &cmd.env, self.egress.clone(), self.api.clone())
                .await?;
        let (argv, env) = sandbox.command(&cmd.program, &cmd.args);
        // The bubblewrap the availability check tried: the one on the CLI's PATH.
        let path = env_value(&cmd.env, "PATH").map(OsStr::new);
        let bwrap = find_on_path("bwrap", path).unwrap_or_else(|| PathBuf::from("bwrap"));
        let first: process::PreExec = Box::new(sandbox.pre_exec()?);
        let started = process::start(bwrap.as_os_str(), &argv, env, &self.workdir, Some(first));
        self.running = Some(sandbox);
        started.map_err(|e| {
            AdapterError::new(
                ErrorCode::SandboxUnavailable,
                format!("could not start bubblewrap for the session: {e}"),
            )
            .with_cause(e)
        })
    }
}

impl Environment for LocalEnvironment {
    fn workdir(&self) -> &Path {
        &self.workdir
    }

    fn has_checkout(&self) -> bool {
        matches!(self.workspace, Made::Checkout(_))
    }

    fn temp_dir(&self) -> PathBuf {
        // Inside the bubblewrap sandbox it is the session's private /tmp.
        if cfg!(target_os = "linux") && self.sandbox.is_some() {
            return PathBuf::from("/tmp");
        }
        env_value(&self.env, "TMPDIR")
            .filter(|v| !v.is_empty())
            .map_or_else(std::env::temp_dir, PathBuf::from)
    }

    fn describe(&self) -> String {
        match &self.running {
            Some(s) => s.describe(),
            None => "no OS sandbox".into(),
        }
    }

    fn limits_are_fallback(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self
            .running
            .as_ref()
            .is_some_and(SessionSandbox::limits_are_fallback);
        #[cfg(not(target_os = "linux"))]
        false
    }

    fn limits_unenforced(&self) -> Option<String> {
        self.running
            .as_ref()
            .and_then(SessionSandbox::limits_unenforced)
    }

    fn limit_hit(&self) -> Option<String> {
        self.running.as_ref().and_then(SessionSandbox::limit_hit)
    }

    fn commands_limited(&self) -> Option<String> {
        self.running.as_ref().and_then(SessionSandbox::commands_hit)
    }

    fn disk_paths(&self) -> Vec<PathBuf> {
        let mut paths = match &self.workspace {
            Made::Checkout(w) => match &w.layer {
                Some(layer) => layer.written(),
                None => vec![w.path.clone()],
            },
            // A view is read-only; the agent writes its private /tmp (a tmpfs of `tmpMiB`).
            Made::View(_) => Vec::new(),
        };
        paths.extend(self.cli_config.as_ref().map(|d| d.path().to_path_buf()));
        paths
    }

    fn exec(&mut self, cmd: ExecCommand) -> BoxFuture<'_, Result<Exec>> {
        Box::pin(async move {
            #[cfg(target_os = "linux")]
            if let Some(cfg) = self.sandbox.clone() {
                return self.exec_sandboxed(&cfg, cmd).await;
            }
            #[cfg(target_os = "macos")]
            let mut cmd = cmd;
            #[cfg(target_os = "macos")]
            if let Some(cfg) = &self.sandbox {
                cmd.args
                    .push(crate::sandbox::seatbelt_settings(cfg, &cmd.env));
            }
            process::start(
                cmd.program.as_os_str(),
                &cmd.args,
                &cmd.env,
                &self.workdir,
                None,
            )
            .map_err(|e| {
                AdapterError::new(
                    ErrorCode::AgentFailed,
                    format!(
                        "could not start the Claude Code CLI {}: {e}",
                        cmd.program.display()
                    ),
                )
                .with_cause(e)
            })
        })
    }

    fn extract_patch(&self) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            match &self.workspace {
                Made::Checkout(w) => w.extract_patch().await,
                Made::View(_) => Ok(String::new()),
            }
        })
    }

    fn conversation<'a>(&'a self, cli_session: &'a str) -> BoxFuture<'a, Option<Vec<u8>>> {
        Box::pin(async move {
            let dir = self.cli_config.as_ref()?.path().to_path_buf();
            let id = cli_session.to_string();
            tokio::task::spawn_blocking(move || conversation_in(&dir, &id))
                .await
                .ok()
                .flatten()
        })
    }

    fn continued(&self) -> Option<&Continuation> {
        match &self.workspace {
            Made::Checkout(w) => w.continued.as_ref(),
            Made::View(_) => None,
        }
    }

    fn record_agent<'a>(
        &'a self,
        agent: Option<(&'a str, Option<&'a str>)>,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            // Only a sandboxed CLI keeps its conversation in the checkout's record dir.
            match (&self.workspace, &self.cli_config) {
                (Made::Checkout(w), Some(CliConfig::Checkout(_))) => w.record_agent(agent).await,
                _ => false,
            }
        })
    }

    fn destroy(&mut self, keep_checkout: bool) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // The CLI has exited: its proxy and relay go, and its config dir (a conversation
            // worth keeping was copied out before).
            self.running = None;
            self.cli_config = None;
            if keep_checkout && matches!(self.workspace, Made::Checkout(_)) {
                // Kept, not removed: released (no longer live in this process, so a sweep may
                // save and remove it) when this environment is dropped.
                return Ok(());
            }
            match &self.workspace {
                Made::Checkout(w) => w.cleanup().await,
                Made::View(v) => v.cleanup().await,
            }
        })
    }
}

/// Makes `dir` (mode 0700) unless it is there.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
