//! A Planner's or Reviewer's view of the repository: the tracked content and the history of the
//! default branch, and nothing else of the repository directory. The repository itself holds
//! what no agent should read — a token in `remote.origin.url`, the `http.<url>.extraheader` a CI
//! checkout writes, ignored `.env` files, every Implementor's clone under `.worktrees/` — and
//! its working tree may be on another branch or hold uncommitted changes.
//!
//! The view is the base of the default branch's commit ([`super::base`]): a fresh repository
//! at `<repoRoot>/.worktrees/.base-<uuid>` (a name no branch can have: git refuses a ref
//! component that starts with '.') that borrows the repository's objects through
//! `objects/info/alternates` — what `git clone --shared` does, without a remote: its config is
//! the handful of `core.*` keys `git init` writes, it has no ref but the default branch (HEAD
//! on it), and the default branch's commit checked out. Nothing of the repository's config,
//! hooks or refs is read to make it. The session's sandbox mounts it read-only with the object
//! stores it borrows from, and the agent works there: `git log`, `show`, `grep`, `diff` work on
//! the default branch's history.
//!
//! It is recorded, removed and swept exactly like an Implementor's clone ([`super::record`],
//! [`super::sweep`]); its record has no snapshot, so a sweep has no work to
//! save and only removes it. Sandboxed sessions cannot change a view (it is mounted
//! read-only), so every one on a commit reads the same one, kept while that commit is the tip:
//! a later Planner or Reviewer costs no checkout at all.

use std::path::PathBuf;
use std::sync::Mutex as StdMutex;

use tokio_util::sync::CancellationToken;

use super::base::BaseShare;
use super::record::SessionRecord;
use super::repo::{cancelled, lock_std, RepoGit};
use crate::error::Result;

/// What a view is made of.
#[derive(Debug, Clone)]
pub struct ViewRequest {
    /// The branch (or any revision) whose content and history the view holds
    /// (`config.defaultBranch`).
    pub default_branch: String,
    /// Who the view is for (its record names the session that made it).
    pub session: SessionRecord,
    /// Whether sessions run sandboxed (`config.sandbox`). In bubblewrap the view is read-only
    /// for every session, so concurrent sessions on one commit share one, the base of that
    /// commit ([`super::base`]); otherwise an agent could change what another reads, and each
    /// session gets its own.
    pub sandboxed: bool,
}

/// A session's share of a view of the repository. While any share exists the view is live in
/// this process (no sweep removes it); see [`super::base`] for when it goes.
pub struct RepoView {
    pub path: PathBuf,
    /// Hex oid of the default branch's commit the view holds.
    pub commit: String,
    share: StdMutex<Option<BaseShare>>,
}

impl std::fmt::Debug for RepoView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoView")
            .field("path", &self.path)
            .field("commit", &self.commit)
            .finish()
    }
}

impl RepoView {
    /// Gives up this session's share (see [`super::base`] for what then happens to the view).
    /// Idempotent.
    pub async fn cleanup(&self) -> Result<()> {
        let share = lock_std(&self.share).take();
        match share {
            Some(mut s) => s.release().await,
            None => Ok(()),
        }
    }
}

impl RepoGit {
    /// A view for `req` (see the module docs): the base of its commit when sessions are
    /// sandboxed, else a private one. `stop` firing at any point removes whatever was made and
    /// returns `ERR_CANCELLED`.
    pub async fn provision_view(
        &self,
        req: &ViewRequest,
        stop: &CancellationToken,
    ) -> Result<RepoView> {
        if stop.is_cancelled() {
            return Err(cancelled());
        }
        let commit = self.resolve_commit(&req.default_branch).await?;
        let shared = req.sandboxed && cfg!(target_os = "linux");
        let share = self
            .base(
                &req.default_branch,
                &commit,
                None,
                shared,
                &req.session,
                stop,
            )
            .await?;
        Ok(RepoView {
            path: share.path().to_path_buf(),
            commit,
            share: StdMutex::new(Some(share)),
        })
    }
}
