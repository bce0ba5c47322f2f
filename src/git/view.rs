//! A Planner's or Reviewer's view of the repository: the tracked content and the history of the
//! default branch, and nothing else of the repository directory. The repository itself holds
//! what no agent should read — a token in `remote.origin.url`, the `http.<url>.extraheader` a CI
//! checkout writes, ignored `.env` files, every Implementor's clone under `.worktrees/` — and
//! its working tree may be on another branch or hold uncommitted changes.
//!
//! The view is a fresh repository at `<repoRoot>/.worktrees/.view-<uuid>` (a name no branch can
//! have: git refuses a ref component that starts with '.') that borrows the repository's
//! objects through `objects/info/alternates` — what `git clone --shared` does, without a remote:
//! its config is the handful of `core.*` keys `git init` writes, it has no ref but the default
//! branch (HEAD on it), and the default branch's commit checked out. Nothing of the
//! repository's config, hooks or refs is read to make it. The session's sandbox mounts it
//! read-only with the object stores it borrows from, and the agent works there: `git log`,
//! `show`, `grep`, `diff` work on the default branch's history.
//!
//! It is recorded, removed and swept exactly like an Implementor's clone ([`super::record`],
//! [`super::owner`], [`super::sweep`]): claimed under the repository lock with an owner record
//! in the git dir, live while a [`RepoView`] holds it, removed with its records when the last
//! session holding it ends (or its provision is stopped or fails), and swept if this process
//! dies. Its record has no snapshot, so a sweep has no work to save and only removes it.
//!
//! Cost: one checkout of the default branch's tree (no object is copied) — what an
//! Implementor's clone costs before its setup command and snapshot; `cargo bench --bench
//! worktree` prints both. Sandboxed sessions cannot change a view (it is mounted read-only), so
//! concurrent sessions on one commit share one, counted by its `Arc`: the sixteenth concurrent
//! Reviewer costs nothing. Nothing is kept once the last of them ends.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};

use tokio_util::sync::CancellationToken;

use super::command::{run_git, CommandError};
use super::provision::{cancelled, ProvisionGuard};
use super::record::{AdminRecord, SessionRecord};
use super::repo::{lock_std, provision_error, RepoGit, WORKTREES_DIR};
use super::worktree::WorktreeState;
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
    /// for every session, so concurrent sessions on one commit share one view; otherwise an
    /// agent could change what another reads, and each session gets its own.
    pub sandboxed: bool,
}

/// A session's share of a view of the repository. While any share exists the view is live in
/// this process (no sweep removes it); the last [`RepoView::cleanup`] removes it. A view whose
/// last share is dropped without cleanup is left to the next sweep.
pub struct RepoView {
    pub path: PathBuf,
    /// Hex oid of the default branch's commit the view holds.
    pub commit: String,
    share: StdMutex<Option<Arc<WorktreeState>>>,
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
    fn holding(dir: Arc<WorktreeState>, commit: String) -> RepoView {
        RepoView {
            path: dir.path.clone(),
            commit,
            share: StdMutex::new(Some(dir)),
        }
    }

    /// Gives up this session's share; the last one removes the view and its records.
    /// Idempotent. If removing fails, the view is no longer live and the next sweep removes it.
    pub async fn cleanup(&self) -> Result<()> {
        let share = lock_std(&self.share).take();
        match share.and_then(Arc::into_inner) {
            Some(last) => last.remove().await,
            None => Ok(()),
        }
    }
}

/// The view each (repository, default branch, commit) has for sandboxed sessions, if any is
/// alive. Its lock is held while one is made, so concurrent sessions wait for it and share it.
type Slot = Arc<tokio::sync::Mutex<Weak<WorktreeState>>>;

/// (repository root, default branch as configured, commit) → its slot.
type Slots = StdMutex<HashMap<(PathBuf, String, String), Slot>>;

fn shared_views() -> &'static Slots {
    static VIEWS: OnceLock<Slots> = OnceLock::new();
    VIEWS.get_or_init(Default::default)
}

impl RepoGit {
    /// A view for `req` (see the module docs): the live one of its commit when sessions are
    /// sandboxed and there is one, else a new one. `stop` firing at any point removes whatever
    /// was made and returns `ERR_CANCELLED`.
    pub async fn provision_view(
        &self,
        req: &ViewRequest,
        stop: &CancellationToken,
    ) -> Result<RepoView> {
        if stop.is_cancelled() {
            return Err(cancelled());
        }
        let commit = self.resolve_commit(&req.default_branch).await?;
        if !(req.sandboxed && cfg!(target_os = "linux")) {
            let dir = self.new_view(req, &commit, stop).await?;
            return Ok(RepoView::holding(Arc::new(dir), commit));
        }
        let slot = {
            let mut views = lock_std(shared_views());
            // Slots nobody waits on and whose view is gone.
            views.retain(|_, s| {
                Arc::strong_count(s) > 1 || s.try_lock().map_or(true, |w| w.strong_count() > 0)
            });
            let key = (
                self.root.clone(),
                req.default_branch.clone(),
                commit.clone(),
            );
            views.entry(key).or_default().clone()
        };
        let mut current = tokio::select! {
            c = slot.lock() => c,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        if let Some(dir) = current.upgrade() {
            return Ok(RepoView::holding(dir, commit));
        }
        let dir = Arc::new(self.new_view(req, &commit, stop).await?);
        *current = Arc::downgrade(&dir);
        Ok(RepoView::holding(dir, commit))
    }

    /// Claims, records and makes a new view of `commit`; removes what it made if it fails or
    /// is stopped.
    async fn new_view(
        &self,
        req: &ViewRequest,
        commit: &str,
        stop: &CancellationToken,
    ) -> Result<WorktreeState> {
        let path = self
            .root
            .join(WORKTREES_DIR)
            .join(format!(".view-{}", uuid::Uuid::new_v4()));
        {
            let _guard = tokio::select! {
                g = self.lock.lock() => g,
                _ = stop.cancelled() => return Err(cancelled()),
            };
            self.ensure_excluded().await?;
            let mut record = AdminRecord::new(&req.session, &req.default_branch, commit);
            record.path = path.to_str().map(str::to_string);
            self.record_clone(&path, &record).await?;
        }
        // From here on any failure (or the future being dropped) removes what was made.
        let mut guard = ProvisionGuard::new(self, &path);
        let branch = self.local_branch(&req.default_branch);
        let made = tokio::select! {
            r = self.make_view(&path, commit, branch.as_deref()) => r.map_err(|e| {
                provision_error(format!("cannot make the repository view at {}", path.display()))
                    .with_cause(e)
            }),
            _ = stop.cancelled() => Err(cancelled()),
        };
        if let Err(e) = made {
            guard.rollback().await;
            return Err(e);
        }
        guard.disarm();
        Ok(WorktreeState {
            repo: self.arc(),
            path,
            cleaned: AtomicBool::new(false),
        })
    }

    /// `rev` when it is a branch of the repository (the view then has that branch checked
    /// out, as the agent would expect); None for any other revision (a detached HEAD).
    fn local_branch(&self, rev: &str) -> Option<String> {
        let repo = git2::Repository::open(&self.root).ok()?;
        let name = format!("refs/heads/{rev}");
        repo.find_reference(&name).ok().map(|_| name)
    }

    /// A repository at `path` borrowing the repository's objects, its HEAD (on `branch` when
    /// given) at `commit`, checked out. Every git here dies with the future (a stop drops it).
    async fn make_view(
        &self,
        path: &Path,
        commit: &str,
        branch: Option<&str>,
    ) -> std::result::Result<(), CommandError> {
        self.init_borrowing(path).await?;
        match branch {
            Some(b) => {
                run_git(path, &["update-ref", b, commit]).await?;
                run_git(path, &["symbolic-ref", "HEAD", b]).await?;
            }
            None => {
                run_git(path, &["update-ref", "--no-deref", "HEAD", commit]).await?;
            }
        }
        run_git(
            path,
            &["reset", "--hard", "--no-recurse-submodules", "--quiet"],
        )
        .await?;
        Ok(())
    }
}
