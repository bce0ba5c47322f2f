//! The `post-checkout` hook, run the way `git worktree add` runs it (git 2.30,
//! `builtin/worktree.c`), since provisioning checks files out itself (`--no-checkout`, then
//! `reset --hard`) and `git hook run` needs git 2.36:
//!
//! - found as `hooks/post-checkout` under `core.hooksPath` when set (a relative value is taken
//!   relative to the directory git ran in: the repository root) or else under the common git
//!   dir; ignored unless it is a file git could execute (git's `find_hook`: `access(X_OK)`);
//! - run with its absolute path and the arguments `<null oid> <new HEAD> 1`, in the new
//!   worktree, stdin closed, `GIT_DIR` and `GIT_WORK_TREE` removed from its environment;
//! - a failing hook fails the provision (git reports it with a non-zero exit; we then roll the
//!   worktree back rather than hand the agent a half-prepared checkout).
//!
//! Like the setup command it runs in its own process group, bounded by the setup time limit and
//! the stop signal ([`super::setup::run_bounded`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::command::{display_argv, run_git, SCRUBBED_ENV};
use super::setup::{run_bounded, RunError};

const NULL_OID: &str = "0000000000000000000000000000000000000000";

/// Runs the repository's `post-checkout` hook for a worktree just checked out at `head`; does
/// nothing when there is none. Whether there was one (it may have changed the files).
pub(crate) async fn post_checkout(
    root: &Path,
    common: &Path,
    worktree: &Path,
    head: &str,
    limit: Duration,
    stop: &CancellationToken,
) -> Result<bool, RunError> {
    let Some(hook) = find_hook(root, common, "post-checkout").await else {
        return Ok(false);
    };
    let args = [NULL_OID, head, "1"];
    let mut cmd = Command::new(&hook);
    cmd.args(args).current_dir(worktree);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let display = display_argv(&hook.to_string_lossy(), &args);
    run_bounded(cmd, display, limit, stop).await.map(|()| true)
}

async fn find_hook(root: &Path, common: &Path, name: &str) -> Option<PathBuf> {
    let dir = match run_git(root, &["config", "--path", "--get", "core.hooksPath"]).await {
        Ok(out) => {
            let configured = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
            root.join(configured)
        }
        Err(_) => common.join("hooks"),
    };
    let hook = dir.join(name);
    if is_executable(&hook) {
        Some(hook)
    } else {
        tracing::debug!(hook = %hook.display(), "no executable hook; skipped as git does");
        None
    }
}

#[cfg(unix)]
fn is_executable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if !p.is_file() {
        return false;
    }
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}

/// Git for Windows runs any hook file (through its shell for scripts).
#[cfg(not(unix))]
fn is_executable(p: &Path) -> bool {
    p.is_file()
}
