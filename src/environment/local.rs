//! The local environment: an Implementor's private clone under `.worktrees/` (see
//! [`crate::git::provision`]) or, for a Planner or Reviewer, the repository itself; on Linux the
//! CLI runs inside one bubblewrap sandbox per session ([`crate::sandbox`]), elsewhere directly
//! (macOS: under Claude Code's own Seatbelt sandbox for its commands).

#[cfg(target_os = "linux")]
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{process, Backend, EnvRequest, Environment, Exec, ExecCommand};
use crate::config::SandboxConfig;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::{RepoGit, Worktree};
use crate::sandbox::{env_value, EgressSink, SessionSandbox};
#[cfg(target_os = "linux")]
use crate::sandbox::{find_on_path, SessionScope};

/// Makes [`LocalEnvironment`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalBackend;

impl Backend for LocalBackend {
    fn provision<'a>(
        &'a self,
        req: EnvRequest,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Box<dyn Environment>>> {
        Box::pin(async move {
            let checkout = match &req.checkout {
                Some(p) => Some(RepoGit::for_repo(&req.repo_root).provision(p, stop).await?),
                None => None,
            };
            let env: Box<dyn Environment> = Box::new(LocalEnvironment {
                workdir: checkout
                    .as_ref()
                    .map_or_else(|| req.repo_root.clone(), |w| w.path.clone()),
                repo_root: req.repo_root,
                checkout,
                sandbox: req.sandbox,
                env: req.env,
                egress: req.egress,
                running: None,
            });
            Ok(env)
        })
    }
}

// Only Linux builds its sandbox from the repository and the egress sink.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct LocalEnvironment {
    workdir: PathBuf,
    repo_root: PathBuf,
    checkout: Option<Worktree>,
    sandbox: Option<SandboxConfig>,
    /// The CLI's environment (its `TMPDIR` is the temp dir without the sandbox).
    env: Vec<(String, String)>,
    egress: Option<EgressSink>,
    /// The sandbox of the running CLI (its proxy and relay live as long as this does).
    running: Option<SessionSandbox>,
}

#[cfg(target_os = "linux")]
impl LocalEnvironment {
    /// What the session sees: its clone read-write and the object stores it borrows from, or
    /// the repository read-only (with its git dir, wherever that is); the CLI's directory.
    async fn scope(&self, program: &Path) -> SessionScope {
        let mut scope = SessionScope {
            cwd: self.workdir.clone(),
            ..SessionScope::default()
        };
        let repo = RepoGit::for_repo(&self.repo_root);
        let common = repo.common_dir().await.ok();
        match &self.checkout {
            Some(w) => {
                scope.writable.push(w.path.clone());
                if let Some(c) = &common {
                    scope.readable.extend(crate::git::repo::object_dirs(c));
                }
            }
            None => {
                scope.readable.push(self.repo_root.clone());
                scope
                    .readable
                    .extend(common.filter(|c| !c.starts_with(&self.repo_root)));
            }
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
        let scope = self.scope(&cmd.program).await;
        let sandbox = SessionSandbox::start(cfg, &scope, &cmd.env, self.egress.clone()).await?;
        let (argv, env) = sandbox.command(&cmd.program, &cmd.args);
        // The bubblewrap the availability check tried: the one on the CLI's PATH.
        let path = env_value(&cmd.env, "PATH").map(OsStr::new);
        let bwrap = find_on_path("bwrap", path).unwrap_or_else(|| PathBuf::from("bwrap"));
        let started = process::start(bwrap.as_os_str(), &argv, env, &self.workdir);
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
        self.checkout.is_some()
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
            process::start(cmd.program.as_os_str(), &cmd.args, &cmd.env, &self.workdir).map_err(
                |e| {
                    AdapterError::new(
                        ErrorCode::AgentFailed,
                        format!(
                            "could not start the Claude Code CLI {}: {e}",
                            cmd.program.display()
                        ),
                    )
                    .with_cause(e)
                },
            )
        })
    }

    fn extract_patch(&self) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            match &self.checkout {
                Some(w) => w.extract_patch().await,
                None => Ok(String::new()),
            }
        })
    }

    fn destroy(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // The CLI has exited: its proxy and relay go.
            self.running = None;
            match &self.checkout {
                Some(w) => w.cleanup().await,
                None => Ok(()),
            }
        })
    }
}
