//! The jails the adapter's own git runs in inside agents' clones ([`GitJails`], what git asks
//! of the sandbox: [`crate::git::confine`]). The agent wrote the clone's config, hooks and
//! attributes, which git runs when the adapter stages the clone for its patch or saves a dead
//! session's work; in a bubblewrap jail of the clone alone they reach nothing else. Wherever
//! bubblewrap runs, whatever `config.sandbox` says: a clone made by a sandboxed session may be
//! swept by a `sandbox: false` adapter.

use std::ffi::{OsStr, OsString};
#[cfg(target_os = "linux")]
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::process::Command;

use super::jail::{probe, Jail, JailPlan};
use crate::git::confine::{CloneMounts, Confinement, Confiner};

/// The size of each tmpfs (`/tmp`, `/dev/shm`) of the jail the adapter's git runs in: git
/// itself writes nothing there; a filter or attribute driver the agent planted could, and a
/// tmpfs of no size is half the host's RAM.
const EXTRACTION_TMPFS_BYTES: u64 = 64 << 20;

/// The sandbox's answer to git ([`Confiner`]): bubblewrap, where it runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct GitJails;

impl Confiner for GitJails {
    fn confines(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { cfg!(target_os = "linux") && bwrap_runs().await })
    }

    /// The clone writable, the repository's object stores readable, a layered checkout's
    /// layer mounted, nothing else of the host.
    fn confine(&self, mounts: &CloneMounts) -> Arc<dyn Confinement> {
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut plan = JailPlan {
            cwd: mounts.clone.clone(),
            writable: vec![mounts.clone.clone()],
            readable: mounts.objects.clone(),
            tmpfs_size: Some(EXTRACTION_TMPFS_BYTES),
            ..JailPlan::default()
        };
        // A layered checkout exists only as its overlay, mounted for this jail alone.
        #[cfg(target_os = "linux")]
        if let Some(layer) = &mounts.layer {
            plan.mount_layer(layer);
        }
        Arc::new(Jail::new(&plan))
    }

    #[cfg(target_os = "linux")]
    fn layers_mountable<'a>(
        &'a self,
        dir: &'a Path,
    ) -> BoxFuture<'a, std::result::Result<(), String>> {
        let dir = dir.to_path_buf();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || super::overlay::available(&dir))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        })
    }
}

/// git inside the jail, with only a system `PATH` and a throwaway `HOME`.
impl Confinement for Jail {
    fn command(&self, program: &OsStr, args: &[OsString]) -> Command {
        let mut cmd = Command::new("bwrap");
        cmd.args(self.argv(program, args))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/tmp");
        // A layered checkout exists only where its overlay is mounted (checked mountable when
        // the layer was made, so this fails only for paths that changed since: then git does
        // not start and the caller sees why).
        #[cfg(target_os = "linux")]
        match self.pre_exec() {
            Ok(Some(mount)) => {
                // SAFETY: the overlay's pre-exec makes system calls only.
                unsafe {
                    cmd.pre_exec(mount);
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot mount a layered checkout");
                // SAFETY: returns an error without allocating.
                unsafe {
                    cmd.pre_exec(|| Err(std::io::Error::from_raw_os_error(libc::EINVAL)));
                }
            }
        }
        cmd
    }
}

/// Whether the `bwrap` the adapter's git is started with (the first on this process's `PATH`)
/// runs here (tried once per process, see [`probe`]).
async fn bwrap_runs() -> bool {
    let Some(bwrap) = super::find_on_path("bwrap", std::env::var_os("PATH").as_deref()) else {
        return false;
    };
    tokio::task::spawn_blocking(move || probe(&bwrap).is_ok())
        .await
        .unwrap_or(false)
}
