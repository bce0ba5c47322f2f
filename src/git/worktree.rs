//! A provisioned checkout (the Implementor's private clone) as a session holds it: where it is,
//! what its patch is measured against, and its cleanup (spec "Worktree Management", Cleanup).
//! While a [`Worktree`] value exists the checkout is live in this process, so no sweep or
//! provision removes it.

use std::path::PathBuf;
use std::sync::Arc;

use super::base::BaseShare;
use super::command::At;
use super::confine::Confinement;
use super::layer::Layer;
use super::patch::{self, Snapshot};
use super::repo::LiveCheckout;
use crate::error::Result;

/// The interrupted session a checkout was taken over from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// The interrupted session's id (the engine's).
    pub from_session: String,
    /// Its transcript, when it had one.
    pub transcript: Option<String>,
    /// The CLI conversation the new run resumes.
    pub cli_session: String,
    /// The conversation's last write, Unix ms: when the interrupted run last did something.
    pub interrupted_ms: u64,
    /// The agent time the runs before used (first start to last write).
    pub used: std::time::Duration,
    /// The model turns in the conversation (distinct assistant messages).
    pub turns: u64,
}

/// A provisioned worktree. Clones share state; once the last clone is dropped without
/// [`Worktree::cleanup`], the worktree is no longer live and the next sweep saves its changes
/// and removes it.
#[derive(Clone)]
pub struct Worktree {
    pub path: PathBuf,
    pub branch: String,
    /// Hex oid the default branch resolved to when the worktree was created: the patch base.
    pub base_commit: String,
    /// The tree the worktree held after the setup step (what the agent started from), and when.
    pub snapshot: Snapshot,
    /// The sandbox the adapter's git runs in here (`None` where there is none to be had:
    /// [`super::RepoGit::extraction_jail`]).
    pub(crate) jail: Option<Arc<dyn Confinement>>,
    /// A layered checkout's parts (`None`: a full clone), see [`super::layer`].
    pub layer: Option<Layer>,
    /// The CLI's config dir for the session (its conversation), in the checkout's record dir:
    /// it lives as long as the checkout ([`super::interrupted`]).
    pub cli_config: PathBuf,
    /// The interrupted session this checkout was taken over from, if it was.
    pub continued: Option<Continuation>,
    pub(crate) state: Arc<WorktreeState>,
}

impl std::fmt::Debug for Worktree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worktree")
            .field("path", &self.path)
            .field("branch", &self.branch)
            .field("base_commit", &self.base_commit)
            .field("snapshot", &self.snapshot)
            .finish()
    }
}

pub(crate) struct WorktreeState {
    checkout: LiveCheckout,
    /// The base a layered checkout is over: held while the checkout exists.
    base: tokio::sync::Mutex<Option<BaseShare>>,
    /// The base a continued layered checkout is over, which no process holds: removed after
    /// the checkout when nothing else names it ([`super::interrupted`]).
    orphan_base: Option<PathBuf>,
}

impl Worktree {
    /// The agent's work (spec "Patch Extraction"): for every path the agent changed since the
    /// post-setup snapshot, the change from the base commit to the file now — commits, staged
    /// and unstaged edits, untracked non-ignored files, deletions, renames, modes, binaries.
    /// Applies with `git apply --index` on the base commit; empty when the agent changed
    /// nothing. Failures carry `ERR_AGENT_FAILED` with git's error as cause. See
    /// [`super::patch`].
    pub async fn extract_patch(&self) -> Result<String> {
        // On a layer over a verified base, only what the layer changed is read
        // ([`super::layer_patch`]); anything it cannot prove the same takes the full path.
        if let Ok(Some(p)) = self.extract_patch_from_layer().await {
            return Ok(p);
        }
        self.extract_patch_walking_the_tree().await
    }

    /// The patch read from the layer alone ([`super::layer_patch`]); None where that is not
    /// provably the full path's (a full clone, a base not verified yet or not verifiable,
    /// anything the layer changed that it does not handle). For tests and benches, which
    /// compare it with [`Worktree::extract_patch_walking_the_tree`].
    #[doc(hidden)]
    pub async fn extract_patch_from_layer(&self) -> Result<Option<String>> {
        let (Some(layer), Some(jail)) = (&self.layer, self.jail.as_deref()) else {
            return Ok(None);
        };
        let verified = {
            let base = self.state.base.lock().await;
            base.as_ref()
                .and_then(|b| b.verification().get().cloned().flatten())
        };
        let Some(verified) = verified else {
            return Ok(None);
        };
        let at = At {
            dir: &self.path,
            jail: Some(jail),
        };
        super::layer_patch::patch_from_layer(
            at,
            layer,
            &verified,
            &self.base_commit,
            &self.snapshot,
            patch::stat_trust_limit(Some(self.snapshot.taken)),
        )
        .await
    }

    /// Waits (up to `limit`) until the base of a layered checkout is verified for extraction
    /// from its layer, and says whether it holds. For tests and benches.
    #[doc(hidden)]
    pub async fn layer_verified(&self, limit: std::time::Duration) -> bool {
        let Some(cell) = self
            .state
            .base
            .lock()
            .await
            .as_ref()
            .map(|b| b.verification().clone())
        else {
            return false;
        };
        let until = std::time::Instant::now() + limit;
        while !cell.initialized() && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        cell.get().is_some_and(Option::is_some)
    }

    /// The patch as the full staging of the checkout makes it ([`super::patch`]): every file
    /// read. What [`Worktree::extract_patch`] falls back to.
    #[doc(hidden)]
    pub async fn extract_patch_walking_the_tree(&self) -> Result<String> {
        let at = At {
            dir: &self.path,
            jail: self.jail.as_deref(),
        };
        patch::agent_patch(
            at,
            &self.base_commit,
            Some(&self.snapshot.tree),
            patch::stat_trust_limit(Some(self.snapshot.taken)),
        )
        .await
    }

    /// Records the agent the session started in this checkout (the CLI's conversation id and
    /// model), so an interrupted session can be continued ([`super::interrupted`]); a
    /// continued checkout's record has it already. `None`: the session ended, and its record
    /// no longer names an agent to continue. True when the record names one.
    pub async fn record_agent(&self, agent: Option<(&str, Option<&str>)>) -> bool {
        let Some(admin) = self.cli_config.parent().map(std::path::Path::to_path_buf) else {
            return false;
        };
        let agent = agent.map(|(id, model)| (id.to_string(), model.map(str::to_string)));
        tokio::task::spawn_blocking(move || {
            let agent = agent.as_ref().map(|(id, m)| (id.as_str(), m.as_deref()));
            super::record::record_agent(&admin, agent)
        })
        .await
        .unwrap_or(false)
    }

    /// Removes the clone (its branch lives only there) and its owner and session records.
    /// Idempotent: once it has succeeded, later calls do
    /// nothing. A failed attempt can be retried.
    pub async fn cleanup(&self) -> Result<()> {
        self.state.remove().await
    }
}

impl WorktreeState {
    /// The state of `checkout`, holding `base` (a layered checkout's) until it is removed.
    pub(crate) fn new(checkout: LiveCheckout, base: Option<BaseShare>) -> WorktreeState {
        WorktreeState {
            checkout,
            base: tokio::sync::Mutex::new(base),
            orphan_base: None,
        }
    }

    /// The state of a continued checkout, over `orphan_base` when layered.
    pub(crate) fn adopted(checkout: LiveCheckout, orphan_base: Option<PathBuf>) -> WorktreeState {
        WorktreeState {
            checkout,
            base: tokio::sync::Mutex::new(None),
            orphan_base,
        }
    }

    /// Removes the clone (or layer) and its records, once (see [`Worktree::cleanup`]), then
    /// lets go of its base.
    async fn remove(&self) -> Result<()> {
        self.checkout.remove().await?;
        if let Some(orphan) = &self.orphan_base {
            self.checkout.repo.remove_orphan_base(orphan).await;
        }
        let base = self.base.lock().await.take();
        match base {
            Some(mut b) => b.release().await,
            None => Ok(()),
        }
    }
}
