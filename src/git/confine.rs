//! What git needs of the OS sandbox, which is the layer above it: git itself knows no
//! bubblewrap. Two things. The adapter's own git runs inside agents' clones — staging one for
//! its patch, saving a dead session's work — where the agent wrote the config, hooks and
//! attributes git would run (`core.fsmonitor`, filter drivers): confined, they reach nothing
//! but the clone ([`super::command::At`]). And a layered checkout ([`super::layer`]) exists
//! only where the sandbox mounts its overlay. So provisioning and the sweep are handed a
//! [`Confiner`] (the sandbox's is `crate::sandbox::GitJails`), which says whether it can do
//! either here and makes one [`Confinement`] per clone.

use std::ffi::{OsStr, OsString};
#[cfg(target_os = "linux")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::process::Command;

use super::layer::LayerMounts;

/// What the adapter's git must see of an agent's clone: the clone itself (writable), the
/// repository's object stores it borrows (readable), and, for a layered checkout, its layer.
#[derive(Debug, Clone)]
pub struct CloneMounts {
    pub clone: PathBuf,
    pub objects: Vec<PathBuf>,
    pub layer: Option<LayerMounts>,
}

/// The sandbox of the adapter's git in one clone.
pub trait Confinement: Send + Sync {
    /// The command that runs `program args` inside, with an environment of its own; the
    /// caller adds the working directory, stdio and git's own variables.
    fn command(&self, program: &OsStr, args: &[OsString]) -> Command;
}

/// The OS sandbox, as git asks it.
pub trait Confiner: Send + Sync {
    /// Whether git can be confined here at all.
    fn confines(&self) -> BoxFuture<'_, bool>;

    /// The confinement of git in a clone that sees `mounts` (asked once [`Confiner::confines`]
    /// said yes).
    fn confine(&self, mounts: &CloneMounts) -> Arc<dyn Confinement>;

    /// Whether a layer's overlay can be mounted for checkouts under `dir`; `Err` says why not.
    #[cfg(target_os = "linux")]
    fn layers_mountable<'a>(
        &'a self,
        dir: &'a Path,
    ) -> BoxFuture<'a, std::result::Result<(), String>>;
}
