//! Removing checkouts this adapter made for sessions that are gone — and nothing else.
//!
//! A checkout is swept only if all hold:
//! - it is under `<repoRoot>/.worktrees/`;
//! - it carries this adapter's owner record ([`super::record`]): a clone's `locked` file in its
//!   record dir, or a linked worktree's lock reason (earlier versions made worktrees); unlocked
//!   worktrees and worktrees locked by a person or another tool are never swept (a session that
//!   needs their path handles them, see [`RepoGit::provision`]);
//! - its owner process is gone (pid and start time no longer match on this host), or it is this
//!   process and no session of this process holds it any more (leaked).
//!
//! Before it is removed its changes are saved as a patch, so a crash loses no work: the agent's
//! work as [`super::Worktree::extract_patch`] would have returned it (measured from the
//! post-setup snapshot in its session record, [`super::record`]; for a worktree without that
//! record, from its merge base with the default branch when known, else from HEAD). In an
//! agent's clone that git runs sandboxed whenever the sandbox the sweep is handed can confine
//! it here (bubblewrap runs), whatever this adapter's `sandbox` setting (the agent wrote its
//! config; [`RepoGit::extraction_jail`]).
//! Saving is bounded by `config.extractionTimeout` and by the stop signal (`shutdown()`, the
//! session that needs the path being cancelled): past either, the git it ran is killed and the
//! checkout kept. The patch goes
//! - beside the session's transcript (`<transcript>.patch`, as a session's own patch is named)
//!   when the session had logging on and no file of that name exists, else
//! - to `<git common dir>/claude-runtime-adapter/salvaged/<session id>-<unix ms>.patch`.
//!
//! A layered checkout ([`super::layer`]) is read through its overlay in the same jail, and
//! swept before the base it is over; a base goes only once no layer's record names it.
//!
//! If saving fails the checkout is kept (and the failure logged) for the next sweep. A session
//! that died before its agent started (no snapshot yet) has nothing to save. Once saved, the
//! session record notes where (`salvaged`), so a checkout whose removal then fails is removed
//! by a later sweep without its work being saved twice; removal itself first gives the owner
//! its permissions back on every directory inside (an agent's `chmod 000`,
//! [`super::layer::remove_tree`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::base::{claim_kept, is_base};
use super::command::{run_git, At};
use super::confine::Confiner;
use super::list::ListedWorktree;
use super::patch;
use super::record::{AdminRecord, KEPT_FILE};
use super::repo::{provision_error, remove_clone, RepoGit, WORKTREES_DIR};
use crate::clock::now_ms;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::process::Owner;

/// A worktree the sweep removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    pub path: PathBuf,
    /// The branch deleted with it (None when there was none to delete or deleting it failed).
    pub branch: Option<String>,
    /// Where its changes were saved; None when it had none.
    pub patch: Option<PathBuf>,
}

impl RepoGit {
    /// Sweeps stale checkouts (see the module docs), serialized with every other change this
    /// process makes to the repository. One that cannot be saved or removed is kept and
    /// logged; the others are still swept. Meant to run in the background: it holds the
    /// repository lock while it saves patches, each within `limit`; once `stop` fires the
    /// rest are left for a later sweep.
    pub async fn sweep_stale(
        &self,
        limit: Duration,
        interrupted: Option<Duration>,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Vec<Swept>> {
        let _guard = self.lock.lock().await;
        let dir = self.root.join(WORKTREES_DIR);
        let mut swept = Vec::new();
        let mut all = self.list_all().await?;
        // Layers first: their work is read through the base they are over, which goes after
        // them (and not while any layer's record still names it).
        all.sort_by_key(|w| w.layer.is_none());
        for wt in all {
            if stop.is_cancelled() {
                break;
            }
            if !self.is_stale(&wt, &dir) {
                continue;
            }
            // An interrupted session the engine may dispatch again ([`super::interrupted`]).
            if interrupted.is_some_and(|w| self.left_for_continuation(&wt, w)) {
                continue;
            }
            let is_base = is_base(&wt.path);
            if is_base && wt.admin.join(KEPT_FILE).exists() {
                // Kept by a process that is gone for the next one (`super::base`): left while
                // it is the tip's; else taken first, so no process adopts what this removes.
                if self.kept_for_tip(&wt.admin).await || !claim_kept(&wt.admin, &self.owner).await {
                    continue;
                }
            }
            if is_base && self.layers_on(&wt.path).await {
                continue;
            }
            match self.retire(&wt, None, limit, sandbox, stop).await {
                Ok(s) => swept.push(s),
                Err(e) => {
                    tracing::warn!(worktree = %wt.path.display(), error = %e, "kept a dead session's worktree: its changes could not be saved or it could not be removed");
                }
            }
        }
        Ok(swept)
    }

    fn is_stale(&self, wt: &ListedWorktree, dir: &Path) -> bool {
        let inside = wt
            .path
            .strip_prefix(dir)
            .is_ok_and(|rel| !rel.as_os_str().is_empty());
        if !inside || self.is_live(&wt.path) {
            return false;
        }
        match wt.locked.as_deref().and_then(Owner::parse) {
            Some(o) => o == self.owner || !o.is_alive(),
            None => false,
        }
    }

    /// Saves a stale checkout's changes, then removes it: a clone with its records; a worktree
    /// with its metadata, and its branch when this adapter made it. The caller holds the lock
    /// and has established that nobody uses it. `base`: what a worktree without our session
    /// record (another tool's) is measured from, through its merge base with it. Saving is
    /// bounded by `limit` and `stop` (see the module docs).
    pub(crate) async fn retire(
        &self,
        wt: &ListedWorktree,
        base: Option<&str>,
        limit: Duration,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Swept> {
        let record = AdminRecord::read(&wt.admin);
        let ours = wt.locked.as_deref().and_then(Owner::parse).is_some();
        let patch = match record.as_ref().and_then(|r| r.salvaged.as_deref()) {
            // An earlier sweep saved it and then failed to remove it; its owner is dead, so
            // nothing has changed since.
            Some(saved) => Some(PathBuf::from(saved)),
            None => {
                let patch = self
                    .salvage(wt, record.as_ref(), base, limit, sandbox, stop)
                    .await?;
                note_salvaged(&wt.admin, record.as_ref(), patch.as_deref());
                patch
            }
        };
        if wt.clone {
            remove_clone(&wt.path, &wt.admin).await?;
            return Ok(Swept {
                path: wt.path.clone(),
                branch: None,
                patch,
            });
        }
        self.remove_worktree_dir(&wt.path).await.map_err(|e| {
            provision_error(format!(
                "cannot remove stale worktree {}",
                wt.path.display()
            ))
            .with_cause(e)
        })?;
        // Another tool's branch is its own (its commits are in the saved patch as well).
        let branch = match &record {
            Some(r) if ours => Some(r.branch.clone()),
            _ if ours => wt
                .head_ref
                .as_deref()
                .and_then(|r| r.strip_prefix("refs/heads/"))
                .map(str::to_string),
            _ => None,
        };
        let mut deleted = None;
        if let Some(b) = branch {
            match self.delete_branch(&b).await {
                Ok(()) => deleted = Some(b),
                Err(e) => {
                    tracing::warn!(branch = %b, error = %e, "kept the branch of a swept worktree")
                }
            }
        }
        Ok(Swept {
            path: wt.path.clone(),
            branch: deleted,
            patch,
        })
    }

    /// Writes the stale checkout's work to a patch file (see the module docs); None when there
    /// is nothing to save.
    async fn salvage(
        &self,
        wt: &ListedWorktree,
        record: Option<&AdminRecord>,
        base: Option<&str>,
        limit: Duration,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Option<PathBuf>> {
        if !wt.path.exists() {
            return Ok(None);
        }
        let merge_base;
        let (base, since, taken) = match record {
            Some(r) => match r.snapshot_tree.as_deref() {
                Some(s) => (r.base_commit.as_str(), Some(s), r.snapshot_taken),
                None => return Ok(None),
            },
            None => {
                merge_base = self.merge_base_or_head(&wt.path, base).await;
                (merge_base.as_str(), None, None)
            }
        };
        let trust_before = patch::stat_trust_limit(taken);
        let jail = if wt.clone {
            self.extraction_jail(sandbox, &wt.path).await?
        } else {
            None
        };
        let at = At {
            dir: &wt.path,
            jail: jail.as_deref(),
        };
        // Dropping the extraction (past the limit, or stopped) kills the git it runs.
        let patch = tokio::select! {
            p = tokio::time::timeout(limit, patch::agent_patch(at, base, since, trust_before)) => {
                p.unwrap_or_else(|_| Err(patch::timed_out(&wt.path, limit)))?
            }
            _ = stop.cancelled() => return Err(AdapterError::new(
                ErrorCode::Cancelled,
                format!("stopped while saving the work of {}", wt.path.display()),
            )),
        };
        if patch.is_empty() {
            return Ok(None);
        }
        let common = self.git_dir().await?;
        let transcript = record.and_then(|r| r.transcript.as_deref()).map(Path::new);
        let label = match record {
            Some(r) if !r.session_id.is_empty() => r.session_id.clone(),
            _ => wt
                .path
                .file_name()
                .map_or("worktree".into(), |n| n.to_string_lossy().into_owned()),
        };
        write_salvaged(&patch, transcript, &common, &label)
            .map(Some)
            .map_err(|e| {
                provision_error(format!(
                    "cannot save the changes of stale worktree {}",
                    wt.path.display()
                ))
                .with_cause(e)
            })
    }

    /// Where another tool's worktree branched off `base` (so its commits are in the patch as
    /// well as its uncommitted changes); its HEAD when that cannot be told.
    async fn merge_base_or_head(&self, worktree: &Path, base: Option<&str>) -> String {
        let Some(base) = base else {
            return "HEAD".into();
        };
        match run_git(worktree, &["merge-base", "HEAD", base]).await {
            Ok(out) => {
                let oid = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if oid.is_empty() {
                    "HEAD".into()
                } else {
                    oid
                }
            }
            Err(_) => "HEAD".into(),
        }
    }
}

/// Notes in the checkout's session record (if it has one) where its work was saved, so that a
/// removal failing after it does not make the next sweep save the same work again. A record
/// that cannot be written is logged: the work is then saved once more, never lost.
fn note_salvaged(admin: &Path, record: Option<&AdminRecord>, patch: Option<&Path>) {
    let (Some(record), Some(patch)) = (record, patch.and_then(Path::to_str)) else {
        return;
    };
    let noted = AdminRecord {
        salvaged: Some(patch.to_string()),
        ..record.clone()
    };
    if let Err(e) = noted.write(admin) {
        tracing::warn!(record = %admin.display(), error = %e, "could not note in a swept checkout's record where its work was saved");
    }
}

/// Saves `patch`, session `label`'s work read out of something other than a checkout (a dead
/// engine's pod), where a dead checkout's goes when it has no transcript:
/// `<git common dir>/claude-runtime-adapter/salvaged/<label>-<unix ms>.patch`. (Only the
/// Kubernetes backend, built on Unix alone, has such work.)
#[cfg(unix)]
pub(crate) async fn save_salvaged(repo_root: &Path, patch: &str, label: &str) -> Result<PathBuf> {
    let common = RepoGit::for_repo(repo_root).git_dir().await?;
    write_salvaged(patch, None, &common, label).map_err(|e| {
        AdapterError::extract(format!(
            "cannot save the work of session {label} in {}",
            common.display()
        ))
        .with_cause(e)
    })
}

/// Where a salvaged patch goes: see the module docs. Never overwrites a file.
fn write_salvaged(
    patch: &str,
    transcript: Option<&Path>,
    common: &Path,
    label: &str,
) -> std::io::Result<PathBuf> {
    if let Some(t) = transcript {
        let beside = t.with_extension("patch");
        if write_new(&beside, patch).is_ok() {
            return Ok(beside);
        }
    }
    let dir = common.join("claude-runtime-adapter").join("salvaged");
    std::fs::create_dir_all(&dir)?;
    let ms = now_ms();
    let safe: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut path = dir.join(format!("{safe}-{ms}.patch"));
    if path.exists() {
        path = dir.join(format!("{safe}-{ms}-{}.patch", uuid::Uuid::new_v4()));
    }
    write_new(&path, patch)?;
    Ok(path)
}

/// Creates `path` (failing if it exists) with `content`; removes it again if writing fails.
fn write_new(path: &Path, content: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(content.as_bytes())
        .and_then(|()| f.sync_all())
        .inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })
}
