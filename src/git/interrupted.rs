//! Continuing an Implementor whose engine went away mid-session (a deploy, a crash, an OOM
//! kill): the engine dispatches the work item again on the same branch, and the new session
//! takes over the interrupted one's checkout — its commits and uncommitted files as the agent
//! left them — and its CLI conversation, instead of saving the work as a patch nothing applies
//! and paying for every step again.
//!
//! **What makes a checkout continuable** ([`RepoGit::continue_interrupted`]): it is a clone
//! this adapter recorded at the branch's path; its owner process is gone (or is this one, which
//! no longer holds it: a session it let go at `shutdown()`); its session record names the agent
//! that ran ([`AgentRecord`], written once the CLI started, only with `resumeInterrupted`); its
//! model is the one asked for now; the conversation is in the checkout's own CLI config dir
//! (`<record dir>/cli`, [`CLI_CONFIG_DIR`]), a regular file (no link followed) of at most
//! [`MAX_CONVERSATION`] bytes whose every line is JSON, last written within the bound; its git
//! dir's HEAD still names the branch; it was set up (a snapshot) and never salvaged. Anything
//! else and the checkout is handled as before (its work saved, then removed) with the reason
//! logged. All of it is read as data: the conversation and HEAD were the agent's to write.
//!
//! **The record dir holds the conversation** (not a temp dir named for the process, which the
//! next process sweeps): it lives as long as the checkout, outside the checkout's content, and
//! goes with its records.
//!
//! **The sweep leaves them** ([`RepoGit::interrupted_until`]): a dead session's checkout with a
//! continuable conversation stays until the bound has passed since the conversation's last
//! write; then a sweep saves its work and removes it as any other.
//!
//! A continued layered checkout holds no share of the base it is over (the process that made
//! that base is gone, and it is not this process's to share); its removal removes that base too
//! once nothing else holds or names it ([`RepoGit::remove_orphan_base`]).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clock::{now_ms, unix_ms};

use super::confine::Confiner;
use super::layer::Layer;
use super::list::ListedWorktree;
use super::patch::Snapshot;
use super::provision::ProvisionRequest;
use super::record::{write_owner, AdminRecord, CLI_CONFIG_DIR, KEPT_FILE};
use super::repo::cancelled;
use super::repo::{lock_std, provision_error, same_path, LiveCheckout, RepoGit};
use super::worktree::{Continuation, Worktree, WorktreeState};
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::process::Owner;

/// The largest conversation read (kept beside a transcript, or continued).
pub const MAX_CONVERSATION: u64 = 256 << 20;

/// What [`RepoGit::continue_interrupted`] found at the branch's path.
enum Found {
    /// The interrupted checkout, now this session's.
    Continued(Box<Worktree>),
    /// An interrupted checkout that cannot be continued, and why: the usual path saves its
    /// work and starts afresh.
    NotContinuable(String),
    /// Nothing interrupted there.
    Nothing,
}

/// Opens `path` for reading without following a link (nor blocking on a FIFO); a regular file
/// only.
#[cfg(unix)]
fn open_plain(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

#[cfg(not(unix))]
fn open_plain(path: &Path) -> Option<std::fs::File> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.is_file()
        .then(|| std::fs::File::open(path).ok())
        .flatten()
}

/// The conversation file `<name>` under `projects/<any>/` of the CLI config dir `dir`, opened
/// without following a link anywhere on the way: the directory was the sandbox's to write.
fn conversation_file(dir: &Path, name: &str) -> Option<std::fs::File> {
    let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    let projects = dir.join("projects");
    if !real_dir(&projects) {
        return None;
    }
    std::fs::read_dir(&projects)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| real_dir(p))
        .find_map(|p| open_plain(&p.join(name)))
}

/// The conversation `<cli_session>.jsonl` of the CLI config dir `dir`, at most
/// [`MAX_CONVERSATION`] bytes of it.
pub fn conversation_in(dir: &Path, cli_session: &str) -> Option<Vec<u8>> {
    let file = conversation_file(dir, &format!("{cli_session}.jsonl"))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONVERSATION).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The model turns in a conversation (distinct assistant message ids), when every complete
/// line is JSON; a last line cut by the kill is no line yet (the CLI skips it too).
pub fn turns_in(bytes: &[u8]) -> std::result::Result<u64, String> {
    let mut ids = std::collections::HashSet::new();
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => &bytes[..end],
        None => return Err("the conversation has no complete entry".into()),
    };
    for (i, line) in complete.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| format!("line {} of the conversation is not JSON ({e})", i + 1))?;
        if entry.get("type").and_then(|t| t.as_str()) == Some("assistant") {
            let id = entry
                .pointer("/message/id")
                .and_then(|v| v.as_str())
                .unwrap_or_default();
            ids.insert(id.to_string());
        }
    }
    Ok(ids.len() as u64)
}

/// What the interrupted checkout whose record dir is `admin` holds for a continuation within
/// `within` of its conversation's last write.
fn inspect(
    admin: &Path,
    record: &AdminRecord,
    within: Duration,
) -> std::result::Result<Continuation, String> {
    let Some(agent) = &record.agent else {
        return Err("its agent never started".into());
    };
    let dir = admin.join(CLI_CONFIG_DIR);
    let name = format!("{}.jsonl", agent.cli_session);
    let file = conversation_file(&dir, &name)
        .ok_or_else(|| format!("its conversation {name} is missing or not a plain file"))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if meta.len() > MAX_CONVERSATION {
        return Err(format!(
            "its conversation is {} bytes, more than the {MAX_CONVERSATION} read",
            meta.len()
        ));
    }
    let written = meta.modified().map(unix_ms).unwrap_or(0);
    let age = Duration::from_millis(now_ms().saturating_sub(written));
    if age > within {
        return Err(format!(
            "it was interrupted {} s ago, more than resumeInterrupted ({} s)",
            age.as_secs(),
            within.as_secs()
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONVERSATION)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("its conversation cannot be read: {e}"))?;
    let turns = turns_in(&bytes)?;
    Ok(Continuation {
        from_session: record.session_id.clone(),
        transcript: record.transcript.clone(),
        cli_session: agent.cli_session.clone(),
        interrupted_ms: written,
        used: Duration::from_millis(written.saturating_sub(agent.started_ms)),
        turns,
    })
}

/// Whether the git dir `git_dir`'s HEAD names `branch` (read as data: at most 4 KiB, no link).
fn head_is(git_dir: &Path, branch: &str) -> bool {
    let Some(file) = open_plain(&git_dir.join("HEAD")) else {
        return false;
    };
    let mut head = String::new();
    if file.take(4096).read_to_string(&mut head).is_err() {
        return false;
    }
    head.trim_end() == format!("ref: refs/heads/{branch}")
}

/// Takes the record dir `admin` for `me` when its owner is gone or is `me` (and the caller
/// established `me` no longer holds it): under the record dir's lock, as [`super::base`]'s
/// kept bases are taken, so of two processes exactly one takes it.
fn take(admin: &Path, me: &Owner) -> bool {
    let Ok(dir) = std::fs::File::open(admin) else {
        return false;
    };
    if dir.lock().is_err() {
        return false;
    }
    let owner = std::fs::read_to_string(admin.join("locked"))
        .ok()
        .and_then(|r| Owner::parse(&r));
    owner.is_some_and(|o| o == *me || !o.is_alive()) && write_owner(me, admin).is_ok()
}

impl RepoGit {
    /// [`RepoGit::provision`], unless an interrupted session's checkout at the branch's path
    /// can be continued for `req` (`req.continue_within`): then that checkout, taken over. One
    /// that cannot is said at `warn` with why, and provisioning goes on as ever (its work saved
    /// as a patch, a fresh checkout).
    pub async fn provision_or_continue(
        &self,
        req: &ProvisionRequest,
        sandbox: &dyn Confiner,
        stop: &CancellationToken,
    ) -> Result<Worktree> {
        // Nothing at the branch's path (the common case): nothing to continue, and no lock.
        let within = req
            .continue_within
            .filter(|_| std::fs::symlink_metadata(self.worktree_path(&req.branch)).is_ok());
        if let Some(within) = within {
            if stop.is_cancelled() {
                return Err(cancelled());
            }
            let found = {
                let _guard = tokio::select! {
                    g = self.lock.lock() => g,
                    _ = stop.cancelled() => return Err(cancelled()),
                };
                self.continue_interrupted(req, within, sandbox).await?
            };
            match found {
                Found::Continued(w) => return Ok(*w),
                Found::NotContinuable(why) => tracing::warn!(
                    branch = %req.branch,
                    "the interrupted session on branch {} is not continued: {why}; its work is saved as a patch and the session starts afresh",
                    req.branch
                ),
                Found::Nothing => {}
            }
        }
        self.provision(req, sandbox, stop).await
    }

    /// With the repository lock held (a claim's): the interrupted checkout at the branch's
    /// path taken over for `req`'s session (module docs), or why not, or nothing there.
    async fn continue_interrupted(
        &self,
        req: &ProvisionRequest,
        within: Duration,
        sandbox: &dyn Confiner,
    ) -> Result<Found> {
        let path = self.worktree_path(&req.branch);
        if self.is_live(&path) {
            return Ok(Found::Nothing);
        }
        let listed = self.list_all().await?;
        let Some(wt) = listed.iter().find(|w| w.clone && same_path(&w.path, &path)) else {
            return Ok(Found::Nothing);
        };
        let owner = wt.locked.as_deref().and_then(Owner::parse);
        if !owner.is_some_and(|o| o == self.owner || !o.is_alive()) {
            return Ok(Found::Nothing);
        }
        let Some(record) = AdminRecord::read(&wt.admin) else {
            return Ok(Found::Nothing);
        };
        let Some(agent) = record.agent.clone() else {
            return Ok(Found::Nothing);
        };
        let admin = wt.admin.clone();
        let checked = (|| {
            if record.salvaged.is_some() {
                return Err("its work was already saved by a sweep".to_string());
            }
            if record.branch != req.branch {
                return Err(format!("it is on branch {:?}", record.branch));
            }
            if agent.model != req.model {
                return Err(format!(
                    "it ran model {:?}, this session asks for {:?}",
                    agent.model, req.model
                ));
            }
            let snapshot = match (&record.snapshot_tree, record.snapshot_taken) {
                (Some(tree), Some(taken)) => Snapshot {
                    tree: tree.clone(),
                    taken,
                },
                _ => return Err("it was never set up".into()),
            };
            let layer = record.layer.as_ref().map(Layer::from_record);
            let git_dir = layer
                .as_ref()
                .map_or_else(|| path.join(".git"), Layer::git_dir);
            if !head_is(&git_dir, &req.branch) {
                return Err(format!(
                    "its HEAD no longer names refs/heads/{}",
                    req.branch
                ));
            }
            if let Some(l) = &layer {
                if !l.dir.is_dir() || !l.base.join(".git").is_dir() {
                    return Err("its layer or the base under it is gone".into());
                }
            }
            let continuation = inspect(&admin, &record, within)?;
            Ok((snapshot, layer, continuation))
        })();
        let (snapshot, layer, continuation) = match checked {
            Ok(c) => c,
            Err(why) => return Ok(Found::NotContinuable(why)),
        };
        let me = self.owner.clone();
        let taken = {
            let admin = admin.clone();
            tokio::task::spawn_blocking(move || take(&admin, &me))
                .await
                .unwrap_or(false)
        };
        if !taken {
            return Ok(Found::Nothing);
        }
        lock_std(&self.live).insert(path.clone());
        let state = Arc::new(WorktreeState::adopted(
            LiveCheckout::new(self.arc(), path.clone()),
            layer.as_ref().map(|l| l.base.clone()),
        ));
        let mut record = record;
        record.session_id = req.session.session_id.clone();
        record.transcript = req
            .session
            .transcript
            .as_deref()
            .and_then(Path::to_str)
            .map(str::to_string);
        if let Some(a) = record.agent.as_mut() {
            a.sessions.push(continuation.from_session.clone());
        }
        record.write(&admin).map_err(|e| {
            provision_error(format!(
                "cannot record the session continuing the checkout at {}",
                path.display()
            ))
            .with_cause(e)
        })?;
        let jail = self.extraction_jail(sandbox, &path).await?;
        Ok(Found::Continued(Box::new(Worktree {
            path,
            branch: req.branch.clone(),
            base_commit: record.base_commit.clone(),
            snapshot,
            jail,
            layer,
            cli_config: admin.join(CLI_CONFIG_DIR),
            continued: Some(continuation),
            state,
        })))
    }

    /// Whether the dead session's checkout `wt` is left by a sweep for a continuation within
    /// `within` (module docs); one whose agent ran but that cannot be continued is logged with
    /// why, since its work is then saved instead.
    pub(crate) fn left_for_continuation(&self, wt: &ListedWorktree, within: Duration) -> bool {
        let Some(record) =
            AdminRecord::read(&wt.admin).filter(|r| wt.clone && r.salvaged.is_none())
        else {
            return false;
        };
        match record
            .agent
            .as_ref()
            .map(|_| inspect(&wt.admin, &record, within))
        {
            Some(Ok(_)) => true,
            Some(Err(why)) => {
                tracing::warn!(
                    branch = %record.branch,
                    "the interrupted session on branch {} cannot be continued: {why}; its work is saved as a patch",
                    record.branch
                );
                false
            }
            None => false,
        }
    }

    /// When the first checkout a sweep left for a continuation within `within` stops being
    /// continuable (a sweep then saves and removes it); None when none is left.
    pub async fn interrupted_until(&self, within: Duration) -> Option<SystemTime> {
        let common = self.common_dir().await.ok()?;
        super::list::clones(&common)
            .ok()?
            .iter()
            .filter(|c| {
                let owner = c.locked.as_deref().and_then(Owner::parse);
                !self.is_live(&c.path) && owner.is_some_and(|o| o == self.owner || !o.is_alive())
            })
            .filter_map(|c| {
                let r = AdminRecord::read(&c.admin).filter(|r| r.salvaged.is_none())?;
                let c = inspect(&c.admin, &r, within).ok()?;
                Some(UNIX_EPOCH + Duration::from_millis(c.interrupted_ms) + within)
            })
            .min()
    }

    /// Removes the base at `base` that a continued checkout was over, once nothing names it
    /// and its owner is gone (a base of this process, or kept for the next one, is left to
    /// its own rules, [`super::base`]).
    pub(crate) async fn remove_orphan_base(&self, base: &Path) {
        if self.is_live(base) || self.layers_on(base).await {
            return;
        }
        let Ok(admin) = self.record_dir(base).await else {
            return;
        };
        if admin.join(KEPT_FILE).exists() {
            return;
        }
        let me = self.owner.clone();
        let claimed = {
            let admin = admin.clone();
            tokio::task::spawn_blocking(move || {
                let gone = std::fs::read_to_string(admin.join("locked"))
                    .ok()
                    .and_then(|r| Owner::parse(&r))
                    .is_some_and(|o| !o.is_alive());
                gone && take(&admin, &me)
            })
            .await
            .unwrap_or(false)
        };
        if claimed {
            if let Err(e) = self.remove_session(base).await {
                tracing::warn!(base = %base.display(), error = %e, "could not remove the base of a continued checkout");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_distinct_assistant_messages_and_a_cut_last_line_is_no_line() {
        let conv = b"{\"type\":\"user\"}\n{\"type\":\"assistant\",\"message\":{\"id\":\"a\"}}\n{\"type\":\"assistant\",\"message\":{\"id\":\"a\"}}\n{\"type\":\"assistant\",\"message\":{\"id\":\"b\"}}\n{\"type\":\"assis";
        assert_eq!(turns_in(conv), Ok(2));
        assert!(turns_in(b"{\"type\":\"user\"}\nnot json\n")
            .unwrap_err()
            .contains("line 2"));
        assert!(turns_in(b"{\"type\":").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_conversation_behind_a_link_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("secret");
        std::fs::write(&outside, "{\"secret\":1}\n").unwrap();
        let project = dir.path().join("cli/projects/p");
        std::fs::create_dir_all(&project).unwrap();
        std::os::unix::fs::symlink(&outside, project.join("s.jsonl")).unwrap();
        assert_eq!(conversation_in(&dir.path().join("cli"), "s"), None);
        std::fs::remove_file(project.join("s.jsonl")).unwrap();
        std::fs::write(project.join("s.jsonl"), "{}\n").unwrap();
        assert_eq!(
            conversation_in(&dir.path().join("cli"), "s").as_deref(),
            Some(&b"{}\n"[..])
        );
        // A link on the way: the projects dir itself.
        std::fs::remove_dir_all(dir.path().join("cli/projects")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("cli/projects")).unwrap();
        assert_eq!(conversation_in(&dir.path().join("cli"), "s"), None);
    }
}
