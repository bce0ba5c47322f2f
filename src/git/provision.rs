//! Provisioning an Implementor's checkout (spec "Worktree Management"): a private clone of the
//! repository at `<repoRoot>/.worktrees/<branch>` (`git clone --shared`: it borrows the
//! repository's objects through `objects/info/alternates`, so nothing is copied), on the branch
//! `<branch>` at the default branch's commit, then the `post-checkout` hook, the setup command
//! (e.g. `yarn install`), then a snapshot of the result so the patch holds only the agent's work
//! ([`super::patch`]).
//!
//! Why a clone and not `git worktree add`: a linked worktree commits into the repository's own
//! `.git` (objects, its branch's ref beside every other ref, `packed-refs`), so a sandbox that
//! lets the agent commit must open paths of `.git` that other sessions' git creates and removes
//! meanwhile. A clone keeps every write of the agent's git in its own directory: the sandbox
//! opens one directory read-write and the repository's object store read-only, and the
//! repository's working tree, refs, config and hooks are not writable at all (README,
//! "Security model", has the measurements).
//!
//! Only the claim — records in `<common>/claude-runtime-adapter/clones/<id>/` naming the path,
//! the session and this process as owner — runs under the per-repository lock; the clone, the
//! checkout, the hook and the setup command run outside it. The stop signal reaches every step;
//! a stopped or failed provision removes what it made before it returns. Whatever is already at
//! the path is handled by [`RepoGit::clear_path`].

use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::base::{layers_work, Preparation};
use super::command::{git_command, run, run_git};
use super::confine::Confiner;
use super::patch::Snapshot;
use super::prepare::{checkout_failed, prepare_checkout};
use super::record::CLI_CONFIG_DIR;
use super::record::{AdminRecord, SessionRecord};
use super::repo::{cancelled, provision_error, same_path, LiveCheckout, ProvisionGuard, RepoGit};
use super::worktree::{Worktree, WorktreeState};
use crate::error::{AdapterError, Result};
use crate::process::Owner;

/// Everything one provision needs.
#[derive(Debug, Clone)]
pub struct ProvisionRequest {
    /// The session's branch; the checkout is `<repoRoot>/.worktrees/<branch>`.
    pub branch: String,
    /// What the branch starts at (`config.defaultBranch`).
    pub default_branch: String,
    /// The setup command's argv (`config.worktreeSetupCommand`); None or empty: no setup.
    pub setup: Option<Vec<String>>,
    /// The setup command's whole environment.
    pub env: Vec<(String, String)>,
    /// Bound on the setup command, and on the `post-checkout` hook
    /// (`config.worktreeSetupTimeout`).
    pub setup_timeout: Duration,
    /// Who the checkout is for: recorded so a sweep can save the work if this process dies.
    pub session: SessionRecord,
    /// Bound on saving the work of a stale checkout in the way (`config.extractionTimeout`).
    pub extraction_timeout: Duration,
    /// A copy-on-write layer over the commit's shared base where one can be mounted
    /// ([`super::base`]; sandboxed sessions with `sharedBase`), else a full clone.
    pub layered: bool,
    /// `resumeInterrupted`: an interrupted session's checkout at the branch's path whose
    /// conversation was last written within this is continued ([`super::interrupted`]);
    /// None: never.
    pub continue_within: Option<Duration>,
    /// The model the session runs (None: the agent definition's): a continued conversation
    /// must have run the same one.
    pub model: Option<String>,
}

impl RepoGit {
    /// Provisions the checkout for `req` (see the module docs). `sandbox` says whether a layer
    /// can be mounted, and confines the adapter's git in the checkout and in a stale one in
    /// its way. `stop` firing at any point removes whatever was made and returns
    /// `ERR_CANCELLED`.
    pub async fn provision(
        &self,
        req: &ProvisionRequest,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Worktree> {
        check_branch_path(&req.branch)?;
        if stop.is_cancelled() {
            return Err(cancelled());
        }
        if req.layered && layers_work(&self.root, sandbox).await {
            return self.provision_layered(req, sandbox, stop).await;
        }
        let path = self.worktree_path(&req.branch);
        let base_commit = self.claim(req, &path, None, sandbox, stop).await?;
        // From here on any failure (or the future being dropped) removes what was made.
        let mut guard = ProvisionGuard::new(self, &path);
        match self.prepare(req, &path, &base_commit, stop).await {
            Ok(snapshot) => {
                let jail = self.extraction_jail(sandbox, &path).await?;
                let cli_config = self.record_dir(&path).await?.join(CLI_CONFIG_DIR);
                guard.disarm();
                Ok(Worktree {
                    path: path.clone(),
                    branch: req.branch.clone(),
                    base_commit,
                    snapshot,
                    jail,
                    layer: None,
                    cli_config,
                    continued: None,
                    state: Arc::new(WorktreeState::new(
                        LiveCheckout::new(self.arc(), path),
                        None,
                    )),
                })
            }
            Err(e) => {
                guard.rollback().await;
                Err(if stop.is_cancelled() { cancelled() } else { e })
            }
        }
    }

    /// The checkout as a layer over the commit's base ([`super::base`]): the base is made (or
    /// shared) first, then the path is claimed and the layer made.
    async fn provision_layered(
        &self,
        req: &ProvisionRequest,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Worktree> {
        let commit = self.resolve_commit(&req.default_branch).await?;
        let prep = Preparation {
            setup: req.setup.clone(),
            env: req.env.clone(),
            timeout: req.setup_timeout,
        };
        let mut base = self
            .base(
                &req.default_branch,
                &commit,
                Some(&prep),
                true,
                &req.session,
                stop,
            )
            .await?;
        self.verify_in_background(&base, sandbox).await;
        let path = self.worktree_path(&req.branch);
        if let Err(e) = self.claim(req, &path, Some(&commit), sandbox, stop).await {
            let _ = base.release().await;
            return Err(e);
        }
        let mut guard = ProvisionGuard::new(self, &path);
        let made = async {
            let (layer, snapshot) = self
                .make_layer(&base, &path, &req.branch, &req.session)
                .await?;
            let jail = self.extraction_jail(sandbox, &path).await?;
            let cli_config = self.record_dir(&path).await?.join(CLI_CONFIG_DIR);
            Ok::<_, AdapterError>((layer, snapshot, jail, cli_config))
        };
        let made = tokio::select! {
            m = made => m,
            _ = stop.cancelled() => Err(cancelled()),
        };
        match made {
            Ok((layer, snapshot, jail, cli_config)) => {
                guard.disarm();
                Ok(Worktree {
                    path: path.clone(),
                    branch: req.branch.clone(),
                    base_commit: commit,
                    snapshot,
                    jail,
                    layer: Some(layer),
                    cli_config,
                    continued: None,
                    state: Arc::new(WorktreeState::new(
                        LiveCheckout::new(self.arc(), path),
                        Some(base),
                    )),
                })
            }
            Err(e) => {
                guard.rollback().await;
                let _ = base.release().await;
                Err(e)
            }
        }
    }

    /// An Implementor's branch must be its own, checked before anything is made: spec 000
    /// force-resets it (`-B`) and deletes it on cleanup, so `branchName` naming `defaultBranch`
    /// or a branch checked out in the repository (its main checkout or a linked worktree) is a
    /// mistake of the engine, refused as `ERR_INVALID_PARAMS`. A worktree at the session's own
    /// path is no obstacle: that is a stale checkout [`RepoGit::clear_path`] replaces.
    pub async fn check_own_branch(&self, branch: &str, default_branch: &str) -> Result<()> {
        let default = default_branch
            .strip_prefix("refs/heads/")
            .unwrap_or(default_branch);
        if branch == default {
            return Err(AdapterError::invalid_params(format!(
                "branchName {branch:?} is the defaultBranch; an Implementor needs a branch of its \
                 own (it is created at defaultBranch and deleted after the session)"
            )));
        }
        let own = self.worktree_path(branch);
        let head = format!("refs/heads/{branch}");
        let worktrees = self.list_worktrees().await?;
        match worktrees
            .iter()
            .find(|w| w.head_ref.as_deref() == Some(head.as_str()) && !same_path(&w.path, &own))
        {
            Some(w) => Err(AdapterError::invalid_params(format!(
                "branchName {branch:?} is checked out in the repository at {}; an Implementor \
                 needs a branch of its own (it is created at defaultBranch and deleted after the \
                 session)",
                w.path.display()
            ))),
            None => Ok(()),
        }
    }

    /// Phase 1, under the lock: clear the path, record the claim. Returns the base commit
    /// (`commit` when given, else what the default branch is now).
    async fn claim(
        &self,
        req: &ProvisionRequest,
        path: &Path,
        commit: Option<&str>,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<String> {
        let _guard = tokio::select! {
            g = self.lock.lock() => g,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        self.ensure_excluded().await?;
        let base = match commit {
            Some(c) => c.to_string(),
            None => self.resolve_commit(&req.default_branch).await?,
        };
        self.clear_path(
            path,
            &req.branch,
            &base,
            req.extraction_timeout,
            sandbox,
            stop,
        )
        .await?;
        let mut record = AdminRecord::new(&req.session, &req.branch, &base);
        record.path = path.to_str().map(str::to_string);
        self.record_clone(path, &record).await?;
        Ok(base)
    }

    /// Whatever is at a session's path before it is provisioned: a stale checkout — this
    /// adapter's clone or worktree from a process that is gone, or a worktree another tool (the
    /// TypeScript adapter, the v1 agent manager) left — has its work saved, then is removed,
    /// with the session's branch when that worktree had it checked out (see
    /// [`RepoGit::drop_stale_branch`]). Refused, each naming the path and what to do: a
    /// checkout a live session uses, a worktree a person locked, work that cannot be saved,
    /// anything that is not a git worktree (never deleted).
    async fn clear_path(
        &self,
        path: &Path,
        branch: &str,
        base: &str,
        limit: Duration,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<()> {
        let at = path.display();
        if self.is_live(path) {
            return Err(provision_error(format!(
                "the worktree at {at} is in use by a running session of this process"
            )));
        }
        let listed = self.list_all().await?;
        let Some(stale) = listed.iter().find(|w| same_path(&w.path, path)) else {
            return match std::fs::symlink_metadata(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(provision_error(format!(
                    "{at} exists and is not a git worktree or a checkout this adapter made; it \
                     is left alone (move it away, or use another branch name)"
                ))),
            };
        };
        let ours = stale.locked.as_deref().map(Owner::parse);
        match ours {
            Some(Some(o)) if o != self.owner && o.is_alive() => Err(provision_error(format!(
                "the worktree at {at} is in use by live process {} on {}; wait for that session \
                 to end, or use another branch name",
                o.pid, o.host
            ))),
            Some(None) => Err(provision_error(format!(
                "the worktree at {at} is locked (`git worktree lock`, reason: {}); unlock it with \
                 `git worktree unlock {at}` once nobody uses it, or use another branch name",
                stale.locked.as_deref().unwrap_or_default().trim()
            ))),
            _ => {
                let swept = self
                    .retire(stale, Some(base), limit, sandbox, stop)
                    .await
                    .map_err(|e| {
                        provision_error(format!(
                        "a stale worktree is at {at} and its work could not be saved or it could \
                         not be removed ({}); it is left as it is: save what you need from it and \
                         remove it, or use another branch name",
                        e.message
                    ))
                    })?;
                if let Some(p) = &swept.patch {
                    tracing::warn!(worktree = %at, patch = %p.display(), "a stale worktree was in the way; its changes were saved before it was replaced");
                }
                let checked_out =
                    stale.head_ref.as_deref() == Some(&format!("refs/heads/{branch}"));
                if checked_out && swept.branch.is_none() && !stale.clone {
                    self.drop_stale_branch(branch, base, swept.patch.is_some())
                        .await;
                }
                Ok(())
            }
        }
    }

    /// The session's branch, left in the repository by the stale worktree just removed from the
    /// session's path (another tool's, made as spec 000 makes it: `git worktree add -B
    /// <branchName>`): spec 000 force-resets it and deletes it on cleanup, so it belongs to
    /// whoever runs that branchName now. Deleted when nothing of it is lost: it has no commit
    /// beyond `base`, or its commits are in the saved patch (measured from its merge base with
    /// `base`, which unrelated histories do not have). Otherwise, or if git refuses, it is
    /// kept and logged; the session does not need it either way (its branch is its clone's).
    async fn drop_stale_branch(&self, branch: &str, base: &str, saved: bool) {
        let head = format!("refs/heads/{branch}");
        let within_base = run_git(&self.root, &["merge-base", "--is-ancestor", &head, base])
            .await
            .is_ok();
        let in_patch = saved
            && run_git(&self.root, &["merge-base", &head, base])
                .await
                .is_ok();
        if !within_base && !in_patch {
            tracing::warn!(
                branch,
                "kept the branch of a stale worktree: its commits are not in the saved patch"
            );
            return;
        }
        match self.delete_branch(branch).await {
            Ok(()) => tracing::info!(
                branch,
                "deleted the branch of a stale worktree (its work is in the saved patch)"
            ),
            Err(e) => tracing::warn!(branch, error = %e, "kept the branch of a stale worktree"),
        }
    }

    /// Phase 2, outside the lock: clone, check out, run the hook and the setup, snapshot.
    /// Returns the snapshot tree.
    async fn prepare(
        &self,
        req: &ProvisionRequest,
        path: &Path,
        base: &str,
        stop: &CancellationToken,
    ) -> Result<Snapshot> {
        let checkout_failed = |e| checkout_failed(path, e);
        // Killed if the provision is stopped; the rollback then removes the clone.
        let steps = async {
            let clone: [&std::ffi::OsStr; 7] = [
                "clone".as_ref(),
                "--shared".as_ref(),
                "--no-checkout".as_ref(),
                "--quiet".as_ref(),
                "--".as_ref(),
                self.root.as_os_str(),
                path.as_os_str(),
            ];
            run_git(&self.root, &clone).await?;
            let branch_ref = format!("refs/heads/{}", req.branch);
            run_git(path, &["update-ref", "--no-deref", &branch_ref, base]).await?;
            run_git(path, &["symbolic-ref", "HEAD", &branch_ref]).await?;
            // The clone's own copy of the repository's current branch would only confuse the
            // agent's `git branch`; the repository's branches stay visible as `origin/*`.
            let heads = run_git(
                path,
                &["for-each-ref", "--format=%(refname)", "refs/heads/"],
            )
            .await?;
            for r in String::from_utf8_lossy(&heads.stdout).lines() {
                if r != branch_ref {
                    run_git(path, &["update-ref", "-d", r]).await?;
                }
            }
            let mut reset = git_command(
                path,
                &["reset", "--hard", "--no-recurse-submodules", "--quiet"],
            );
            reset.kill_on_drop(true);
            run(reset, "git reset --hard --no-recurse-submodules".into()).await
        };
        tokio::select! {
            r = steps => r.map_err(checkout_failed)?,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        let snapshot = prepare_checkout(
            self,
            path,
            base,
            req.setup.as_deref(),
            &req.env,
            req.setup_timeout,
            stop,
        )
        .await?;
        let record_dir = self.record_dir(path).await?;
        let mut record = AdminRecord::new(&req.session, &req.branch, base);
        record.path = path.to_str().map(str::to_string);
        record.snapshot_tree = Some(snapshot.tree.clone());
        record.snapshot_taken = Some(snapshot.taken);
        record
            .write(&record_dir)
            .map_err(|e| provision_error("cannot record the worktree's snapshot").with_cause(e))?;
        Ok(snapshot)
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
