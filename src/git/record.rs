//! The records that say a checkout is ours, whose it is, and how to save its work.
//!
//! **The owner record** ([`write_owner`], an [`Owner`] as text) is a `locked` file: in a clone's
//! record dir (`<common>/claude-runtime-adapter/clones/<id>/locked`, written when the path is
//! claimed, under the repository lock), or, for a worktree an earlier version of the adapter
//! made, the worktree's git lock reason (`<common>/worktrees/<id>/locked`, the file `git
//! worktree lock --reason` writes). Either lives outside the checkout's content, where no
//! session's sandbox can write. A lock reason that is not this record (a person's `git worktree
//! lock`, git's own placeholder) is never taken for ours: a checkout is never swept by mistake,
//! at worst kept.
//!
//! **The session record** is what a later sweep needs to save a dead session's work, kept as
//! `claude-runtime-adapter.json` in the clone's record dir, beside the owner record (for
//! worktrees earlier versions made, in the worktree's admin dir).
//!
//! ```json
//! { "sessionId": "…", "branch": "feat/x", "baseCommit": "<hex>",
//!   "transcript": "/logs/….log" | null, "snapshotTree": "<hex>" | null,
//!   "snapshotTaken": <unix seconds> | null, "path": "<clone>",
//!   "layer": { "base": "<base dir>", "dir": "<layer dir>" } | absent,
//!   "salvaged": "<patch file>" | absent,
//!   "base": { "repository": "<root>", "defaultBranch": "main", "setup": "<digest>" | null,
//!             "snapshotTree": "<hex>" | null, "snapshotTaken": <unix seconds> | null } | absent,
//!   "agent": { "cliSession": "<uuid>", "model": "…" | null, "startedMs": <unix ms>,
//!              "sessions": ["<earlier session id>", …] } | absent }
//! ```
//!
//! Written when the path is claimed and before the owner record (so every clone that
//! carries our owner record has one), and again with `snapshotTree` once the setup step is done:
//! a record without a snapshot means the session died before its agent ran, so there is no
//! agent work to save. A transcript path that is not UTF-8 is stored as null (the salvaged patch
//! then goes to the git dir).
//!
//! A base's record ([`super::base`]) gets `base` once the base is complete (checked out, set
//! up, snapshotted): what it is a checkout of, exactly as a later process asks for one. Its
//! snapshot lives there, not in `snapshotTree`, which would tell a sweep to save agent work.
//! **The kept mark** ([`KEPT_FILE`], empty) beside it says its process left it for the next
//! one at `shutdown()`; a base without both is never adopted, only swept.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::process::Owner;

const FILE: &str = "claude-runtime-adapter.json";

/// A checkout's CLI config dir (its conversation), in its record dir: it lives as long as the
/// checkout ([`super::interrupted`]).
pub const CLI_CONFIG_DIR: &str = "cli";

/// The kept mark of a base left for the next process (module docs), in its record dir.
pub(crate) const KEPT_FILE: &str = "kept";

/// Writes `owner` as the owner record in `admin` (write to a temporary file, then rename:
/// readers see the old record or the new one).
pub(crate) fn write_owner(owner: &Owner, admin: &Path) -> std::io::Result<()> {
    let tmp = admin.join(format!("locked.tmp-{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, format!("{}\n", owner.to_record()))?;
    std::fs::rename(&tmp, admin.join("locked")).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The session a worktree is provisioned for, as the caller knows it at provision time.
#[derive(Debug, Clone, Default)]
pub struct SessionRecord {
    pub session_id: String,
    /// The session's transcript, when logging is on: a dead session's patch is saved beside it.
    pub transcript: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdminRecord {
    pub session_id: String,
    pub branch: String,
    pub base_commit: String,
    pub transcript: Option<String>,
    pub snapshot_tree: Option<String>,
    /// When the snapshot was taken (Unix seconds): what the index's stat data is trusted for
    /// when the work is saved (`super::patch::stat_trust_limit`). Absent in records of older
    /// versions: then no stat data is trusted.
    #[serde(default)]
    pub snapshot_taken: Option<u64>,
    /// The clone's path (records of clones live apart from them; worktrees' records do not
    /// need it).
    #[serde(default)]
    pub path: Option<String>,
    /// For a layered checkout ([`super::base`]): the base it is a layer over and the layer's
    /// own directory (its writes and its git dir).
    #[serde(default)]
    pub layer: Option<LayerRecord>,
    /// Where a sweep saved the work of the dead session (`super::sweep`): a later sweep that
    /// finds the checkout still there (its removal failed) removes it without saving the same
    /// work again.
    #[serde(default)]
    pub salvaged: Option<String>,
    /// For a complete base: what it is a checkout of (module docs).
    #[serde(default)]
    pub base: Option<BaseRecord>,
    /// Set once the session's agent started: what a later session on the same branch needs to
    /// continue it if this one is interrupted ([`super::interrupted`]).
    #[serde(default)]
    pub agent: Option<AgentRecord>,
}

/// The agent a checkout's session started (module docs; [`super::interrupted`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    /// The CLI's conversation id (`--session-id`), in the checkout's `cli/` config dir.
    pub cli_session: String,
    /// The model it ran (None: the agent definition's).
    pub model: Option<String>,
    /// When the first run of this conversation started (Unix ms): with the conversation's
    /// last write, the agent time it used.
    pub started_ms: u64,
    /// The sessions this checkout was continued for before, oldest first.
    #[serde(default)]
    pub sessions: Vec<String>,
}

/// What a complete base is a checkout of (with `baseCommit`: its key, [`super::base`]), and
/// the snapshot its layers' patches are measured from (an Implementor's base).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BaseRecord {
    pub repository: String,
    pub default_branch: String,
    /// The digest of the setup command and its environment; None: a view's base.
    pub setup: Option<String>,
    pub snapshot_tree: Option<String>,
    pub snapshot_taken: Option<u64>,
}

/// Where a layered checkout's parts are (see [`super::base`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LayerRecord {
    pub base: String,
    pub dir: String,
}

impl AdminRecord {
    pub fn new(session: &SessionRecord, branch: &str, base_commit: &str) -> AdminRecord {
        AdminRecord {
            session_id: session.session_id.clone(),
            branch: branch.to_string(),
            base_commit: base_commit.to_string(),
            transcript: session
                .transcript
                .as_deref()
                .and_then(Path::to_str)
                .map(str::to_string),
            snapshot_tree: None,
            snapshot_taken: None,
            path: None,
            layer: None,
            salvaged: None,
            base: None,
            agent: None,
        }
    }

    /// Writes the record into `admin` atomically (temporary file, then rename).
    pub fn write(&self, admin: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let tmp = admin.join(format!("{FILE}.tmp-{}", uuid::Uuid::new_v4()));
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, admin.join(FILE)).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    /// The record in `admin`, if there is a readable one (worktrees made by an older adapter
    /// version have none).
    pub fn read(admin: &Path) -> Option<AdminRecord> {
        let bytes = std::fs::read(admin.join(FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The agent of a fresh session's checkout, recorded once its CLI started (module docs);
/// true when the record has it. `None`: the session ended (its checkout, should its removal
/// fail or its work be unreadable, is no interrupted session's to continue).
pub(crate) fn record_agent(admin: &Path, agent: Option<(&str, Option<&str>)>) -> bool {
    let Some(mut record) = AdminRecord::read(admin) else {
        return false;
    };
    match agent {
        Some(_) if record.agent.is_some() => return true,
        None if record.agent.is_none() => return false,
        _ => {}
    }
    record.agent = agent.map(|(cli_session, model)| AgentRecord {
        cli_session: cli_session.to_string(),
        model: model.map(str::to_string),
        started_ms: now_ms(),
        sessions: Vec::new(),
    });
    match record.write(admin) {
        Ok(()) => record.agent.is_some(),
        Err(e) => {
            tracing::warn!(error = %e, "could not record the session's agent: an interruption cannot be continued");
            false
        }
    }
}
