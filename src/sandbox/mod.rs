//! Every agent session's commands run inside Claude Code's own OS sandbox (bubblewrap + socat
//! on Linux, Seatbelt on macOS), configured per session through the CLI's `--settings`: the
//! second layer under the Bash validator. See `settings` for what is writable, `proxy` for the
//! network, `branches` for the branches an agent leaves behind.
//!
//! Lifecycle use: [`check_available`] before provisioning (fails closed, nothing created);
//! [`SessionSandbox::start`] when assembling the CLI command (owns the egress proxy: dropping it
//! stops the proxy); [`BranchSnapshot`] around an Implementor session; [`Leftovers`] for the
//! mount points the CLI's sandbox leaves in the repository. [`WriteScope`] is the same boundary
//! for the CLI's own file tools, which the OS sandbox does not confine, and [`ReadGuard`] keeps
//! their reads out of the credential stores as `denyRead` keeps Bash out.

mod available;
mod branches;
mod leftovers;
mod proxy;
mod read_guard;
mod relay;
mod settings;
mod write_scope;

use serde_json::Value;

use crate::config::SandboxConfig;
use crate::error::Result;

pub use available::{check_available, INSTALL_HINT};
pub use branches::BranchSnapshot;
pub use leftovers::{Leftovers, SandboxUse, WORKDIR_MOUNT_POINTS};
pub use proxy::{DomainAllowlist, EgressAttempt, EgressProxy, EgressSink};
pub use read_guard::ReadGuard;
pub use relay::{placeholder, ModelRelay};
pub use settings::{is_credential_var, SessionScope, WorktreeGit, HOME_CREDENTIALS};
pub use write_scope::WriteScope;

impl WorktreeGit {
    /// The git dirs of the worktree at `worktree` (checked out on `branch`).
    pub fn discover(worktree: &std::path::Path, branch: &str) -> Result<WorktreeGit> {
        let repo = git2::Repository::open(worktree).map_err(|e| {
            crate::error::AdapterError::new(
                crate::error::ErrorCode::Provision,
                format!("cannot open the worktree {}", worktree.display()),
            )
            .with_cause(e)
        })?;
        Ok(WorktreeGit {
            common_dir: repo.commondir().to_path_buf(),
            admin_dir: repo.path().to_path_buf(),
            branch: branch.to_string(),
        })
    }
}

/// One session's sandbox: its settings and its egress proxy.
pub struct SessionSandbox {
    settings: Value,
    /// Held for its `Drop`: the session's egress proxy runs exactly as long as its sandbox.
    _proxy: EgressProxy,
}

impl SessionSandbox {
    /// Starts the session's egress proxy and builds its settings. `cli_env` is the environment
    /// the CLI will get (its credential variables are withheld from agent commands, its `HOME`
    /// locates the credential stores that are made unreadable).
    pub async fn start(
        cfg: &SandboxConfig,
        scope: &SessionScope,
        cli_env: &[(String, String)],
        sink: Option<EgressSink>,
    ) -> Result<SessionSandbox> {
        // Interim until the CLI runs inside its own network namespace: a socket path per
        // session, and settings that no longer name a proxy port.
        let socket =
            std::env::temp_dir().join(format!("cra-egress-{}.sock", uuid::Uuid::new_v4().simple()));
        let proxy =
            EgressProxy::start(DomainAllowlist::new(&cfg.allowed_domains), sink, &socket).await?;
        let settings = settings::build(cfg, scope, cli_env, 0);
        Ok(SessionSandbox {
            settings,
            _proxy: proxy,
        })
    }

    /// The settings JSON (what the transcript records).
    pub fn settings(&self) -> &Value {
        &self.settings
    }

    /// The CLI argument that applies them.
    pub fn settings_arg(&self) -> String {
        format!("--settings={}", self.settings)
    }
}
