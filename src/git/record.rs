//! What a later sweep needs to save a dead session's work: the session record, kept as
//! `claude-runtime-adapter.json` in the clone's record dir
//! (`<common>/claude-runtime-adapter/clones/<id>/`, beside the `locked` owner record; for
//! worktrees earlier versions made, in the worktree's admin dir).
//!
//! ```json
//! { "sessionId": "…", "branch": "feat/x", "baseCommit": "<hex>",
//!   "transcript": "/logs/….log" | null, "snapshotTree": "<hex>" | null,
//!   "snapshotTaken": <unix seconds> | null, "path": "<clone>",
//!   "layer": { "base": "<base dir>", "dir": "<layer dir>" } | absent }
//! ```
//!
//! Written when the path is claimed and before the owner record (so every clone that
//! carries our owner record has one), and again with `snapshotTree` once the setup step is done:
//! a record without a snapshot means the session died before its agent ran, so there is no
//! agent work to save. A transcript path that is not UTF-8 is stored as null (the salvaged patch
//! then goes to the git dir).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

const FILE: &str = "claude-runtime-adapter.json";

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
