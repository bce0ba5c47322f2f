//! Provisioning an Implementor worktree (spec "Worktree Management"):
//! `<repoRoot>/.worktrees/<branch>` on a branch force-reset to the default branch, the
//! `post-checkout` hook, the setup command (e.g. `yarn install`), then a snapshot of the result
//! so the patch holds only the agent's work ([`super::patch`]).
//!
//! `git worktree add` is split in two, exactly as git itself does it internally: the metadata
//! step (`worktree add --no-checkout --lock`: admin dir, branch, HEAD; then our session and owner
//! records) runs under the per-repository lock, while populating the files (`reset --hard`, then
//! the hook) and the setup command run outside it, so parallel provisions only queue for the
//! short metadata steps.
//!
//! The stop signal reaches every step: waiting for the lock, waiting out another git process's
//! lock file, the checkout, the hook and the setup command (whose whole process tree is killed,
//! see [`super::setup`]). A stopped provision removes what it made — worktree and branch —
//! before it returns `ERR_CANCELLED`. A worktree already at the path is replaced only if this
//! adapter made it for a session that is gone (its work saved first, as the sweep does);
//! anything else there is refused, never removed.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::command::{display_argv, git_command, is_lock_contention, run, run_git_retrying_until};
use super::hooks;
use super::list::{admin_dir_of, ListedWorktree};
use super::owner::Owner;
use super::patch;
use super::record::{AdminRecord, SessionRecord};
use super::repo::{lock_std, provision_error, same_path, RepoGit};
use super::setup::{run_bounded, seconds, RunError};
use super::worktree::{Worktree, WorktreeState};
use crate::error::{AdapterError, ErrorCode, Result};

/// Everything one provision needs.
#[derive(Debug, Clone)]
pub struct ProvisionRequest {
    /// The session's branch; the worktree is `<repoRoot>/.worktrees/<branch>`.
    pub branch: String,
    /// What the branch is force-reset to (`config.defaultBranch`).
    pub default_branch: String,
    /// The setup command's argv (`config.worktreeSetupCommand`); None or empty: no setup.
    pub setup: Option<Vec<String>>,
    /// The setup command's whole environment.
    pub env: Vec<(String, String)>,
    /// Bound on the setup command, and on the `post-checkout` hook
    /// (`config.worktreeSetupTimeout`).
    pub setup_timeout: Duration,
    /// Who the worktree is for: recorded so a sweep can save the work if this process dies.
    pub session: SessionRecord,
}

fn cancelled() -> AdapterError {
    AdapterError::new(
        ErrorCode::Cancelled,
        "the session was stopped while its worktree was being provisioned",
    )
}

impl RepoGit {
    /// Provisions the worktree for `req` (see the module docs). `stop` firing at any point
    /// removes whatever was made and returns `ERR_CANCELLED`.
    pub async fn provision(
        &self,
        req: &ProvisionRequest,
        stop: &CancellationToken,
    ) -> Result<Worktree> {
        check_branch_path(&req.branch)?;
        if stop.is_cancelled() {
            return Err(cancelled());
        }
        let path = self.worktree_path(&req.branch);
        let base_commit = self.add_worktree(req, &path, stop).await?;
        // From here on any failure (or the future being dropped) removes worktree and branch.
        let mut guard = ProvisionGuard {
            repo: Some(self.arc()),
            path: path.clone(),
            branch: req.branch.clone(),
        };
        match self.prepare(req, &path, &base_commit, stop).await {
            Ok(snapshot_tree) => {
                guard.disarm();
                Ok(Worktree {
                    path: path.clone(),
                    branch: req.branch.clone(),
                    base_commit,
                    snapshot_tree,
                    state: Arc::new(WorktreeState {
                        repo: self.arc(),
                        path,
                        branch: req.branch.clone(),
                        cleaned: AtomicBool::new(false),
                    }),
                })
            }
            Err(e) => {
                guard.rollback().await;
                Err(if stop.is_cancelled() { cancelled() } else { e })
            }
        }
    }

    /// Phase 1, under the lock: the metadata changes. Returns the base commit.
    async fn add_worktree(
        &self,
        req: &ProvisionRequest,
        path: &Path,
        stop: &CancellationToken,
    ) -> Result<String> {
        let _guard = tokio::select! {
            g = self.lock.lock() => g,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        self.ensure_excluded().await?;
        let base = self.resolve_commit(&req.default_branch).await?;
        let listed = self.list_worktrees().await?;
        if let Some(stale) = listed.iter().find(|w| same_path(&w.path, path)) {
            self.replace_stale(stale).await?;
        }
        check_branch_free(&listed, path, &req.branch)?;
        let branch = req.branch.as_str();
        let branch_existed = self.branch_exists(branch).await;
        let args: [&std::ffi::OsStr; 8] = [
            "worktree".as_ref(),
            "add".as_ref(),
            "--no-checkout".as_ref(),
            // The reason is written by `record_owner` (`--reason` needs git 2.35+).
            "--lock".as_ref(),
            "-B".as_ref(),
            branch.as_ref(),
            path.as_os_str(),
            base.as_ref(),
        ];
        if let Err(e) = run_git_retrying_until(&self.root, &args, Some(stop)).await {
            // git removes its own half-made worktree, but a branch it created before failing
            // (e.g. the path exists and is not empty) stays; a branch that existed before is
            // left alone (it was going to be reset anyway, but it is not ours to delete).
            if !branch_existed {
                let _ = self.delete_branch(branch).await;
            }
            if stop.is_cancelled() && is_lock_contention(&e) {
                return Err(cancelled());
            }
            return Err(
                provision_error(format!("git worktree add failed for branch '{branch}'"))
                    .with_cause(e),
            );
        }
        lock_std(&self.live).insert(path.to_path_buf());
        if let Err(e) = self.record_owner(path, req, &base) {
            let _ = self.remove_session_locked(path, branch).await;
            return Err(provision_error(format!(
                "cannot record the owner of the new worktree at {}",
                path.display()
            ))
            .with_cause(e));
        }
        Ok(base)
    }

    /// The session record first, then the owner record that makes the worktree ours (see
    /// [`super::record`]).
    fn record_owner(&self, path: &Path, req: &ProvisionRequest, base: &str) -> std::io::Result<()> {
        let admin = admin_dir_of(path)?;
        AdminRecord::new(&req.session, &req.branch, base).write(&admin)?;
        self.owner.write_lock(&admin)
    }

    /// A worktree already registered at our path: replaced only when it is ours and its
    /// session is gone (its work saved first); refused otherwise.
    async fn replace_stale(&self, stale: &ListedWorktree) -> Result<()> {
        let at = stale.path.display();
        if self.is_live(&stale.path) {
            return Err(provision_error(format!(
                "the worktree at {at} is in use by a running session of this process"
            )));
        }
        match stale.locked.as_deref().and_then(Owner::parse) {
            Some(o) if o != self.owner && o.is_alive() => Err(provision_error(format!(
                "the worktree at {at} is in use by live process {} on {}",
                o.pid, o.host
            ))),
            Some(_) => {
                let swept = self.retire(stale).await?;
                if let Some(p) = &swept.patch {
                    tracing::warn!(worktree = %at, patch = %p.display(), "a dead session's worktree was in the way; its changes were saved before it was replaced");
                }
                Ok(())
            }
            None => Err(provision_error(format!(
                "a worktree this adapter did not make is at {at}; it is left alone (remove it \
                 yourself or use another branch name)"
            ))),
        }
    }

    /// Phase 2, outside the lock: check out, run the hook and the setup, snapshot. Returns the
    /// snapshot tree.
    async fn prepare(
        &self,
        req: &ProvisionRequest,
        path: &Path,
        base: &str,
        stop: &CancellationToken,
    ) -> Result<String> {
        let checkout_failed = |e| {
            provision_error(format!(
                "cannot check out the worktree at {}",
                path.display()
            ))
            .with_cause(e)
        };
        // Killed if the provision is stopped; the rollback then removes the worktree.
        let mut reset = git_command(
            path,
            &["reset", "--hard", "--no-recurse-submodules", "--quiet"],
        );
        reset.kill_on_drop(true);
        tokio::select! {
            r = run(reset, "git reset --hard --no-recurse-submodules".into()) => r.map_err(checkout_failed)?,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        let common = self.common_dir().await.map_err(checkout_failed)?;
        hooks::post_checkout(&self.root, &common, path, base, req.setup_timeout, stop)
            .await
            .map_err(|e| bounded_error("post-checkout hook", path, req.setup_timeout, e))?;
        if let Some(argv) = req.setup.as_deref().filter(|a| !a.is_empty()) {
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .current_dir(path)
                .env_clear()
                .envs(req.env.iter().map(|(k, v)| (k, v)));
            let display = display_argv(&argv[0], &argv[1..]);
            run_bounded(cmd, display, req.setup_timeout, stop)
                .await
                .map_err(|e| bounded_error("setup command", path, req.setup_timeout, e))?;
        }
        let snapshot = tokio::select! {
            s = patch::snapshot(path) => s.map_err(|e| provision_error(format!("cannot snapshot the worktree after setup: {}", e.message)))?,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        let admin = admin_dir_of(path)
            .map_err(|e| provision_error("cannot find the worktree's admin dir").with_cause(e))?;
        let mut record = AdminRecord::new(&req.session, &req.branch, base);
        record.snapshot_tree = Some(snapshot.clone());
        record
            .write(&admin)
            .map_err(|e| provision_error("cannot record the worktree's snapshot").with_cause(e))?;
        Ok(snapshot)
    }
}

/// The provision error for a hook or setup command that failed, ran out of time, or was
/// stopped.
fn bounded_error(what: &str, dir: &Path, limit: Duration, e: RunError) -> AdapterError {
    match e {
        RunError::Cancelled => cancelled(),
        RunError::TimedOut { command, output } => {
            let mut message = format!(
                "{what} `{command}` did not finish within {} (config.worktreeSetupTimeout); it \
                 and every process it started were killed",
                seconds(limit)
            );
            push_tail(&mut message, &output);
            provision_error(message)
        }
        RunError::Failed(e) => {
            let mut message = format!(
                "{what} `{}` failed in {} ({})",
                e.command,
                dir.display(),
                e.status_text()
            );
            push_tail(&mut message, &e.output);
            provision_error(message).with_cause(e)
        }
    }
}

fn push_tail(message: &mut String, output: &str) {
    if !output.is_empty() {
        message.push_str("; output tail:\n");
        message.push_str(output);
    }
}

/// `git worktree add -B` would fail on a branch checked out elsewhere; say so plainly.
fn check_branch_free(listed: &[ListedWorktree], path: &Path, branch: &str) -> Result<()> {
    let want = format!("refs/heads/{branch}");
    match listed
        .iter()
        .find(|w| !same_path(&w.path, path) && w.head_ref.as_deref() == Some(&want))
    {
        Some(other) => Err(provision_error(format!(
            "branch '{branch}' is checked out in another worktree at {}; it cannot be \
             force-reset for a new session",
            other.path.display()
        ))),
        None => Ok(()),
    }
}

/// Rolls a half-provisioned worktree back: awaited on error paths, spawned if the provision
/// future is dropped.
struct ProvisionGuard {
    repo: Option<Arc<RepoGit>>,
    path: PathBuf,
    branch: String,
}

impl ProvisionGuard {
    fn disarm(&mut self) {
        self.repo = None;
    }

    async fn rollback(&mut self) {
        if let Some(repo) = self.repo.take() {
            if let Err(e) = repo.remove_session(&self.path, &self.branch).await {
                tracing::warn!(path = %self.path.display(), error = %e, "rolling back a failed provision failed");
            }
        }
    }
}

impl Drop for ProvisionGuard {
    fn drop(&mut self) {
        let Some(repo) = self.repo.take() else {
            return;
        };
        let (path, branch) = (
            std::mem::take(&mut self.path),
            std::mem::take(&mut self.branch),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = repo.remove_session(&path, &branch).await {
                        tracing::warn!(path = %path.display(), error = %e, "rolling back a dropped provision failed");
                    }
                });
            }
            // No runtime left: the worktree is no longer live, so the next sweep removes it.
            Err(_) => {
                lock_std(&repo.live).remove(&path);
            }
        }
    }
}

/// Branch names are validated elsewhere; this only guarantees the worktree path stays inside
/// `.worktrees/` whatever string arrives.
fn check_branch_path(branch: &str) -> Result<()> {
    let p = Path::new(branch);
    let ok = !branch.is_empty()
        && !branch.contains('\0')
        && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(AdapterError::invalid_params(format!(
            "branch name {branch:?} cannot be used as a worktree path"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_paths_cannot_escape_the_worktrees_dir() {
        assert!(check_branch_path("feature/x").is_ok());
        for bad in ["", "/etc", "../x", "a/../../b", "./a"] {
            assert!(check_branch_path(bad).is_err(), "{bad}");
        }
    }
}
