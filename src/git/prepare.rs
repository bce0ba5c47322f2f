//! Making a fresh checkout ready for an agent, the same for a session's full clone
//! ([`super::provision`]) and for a shared base ([`super::base`]): the repository's identity
//! for commits, the `post-checkout` hook ([`super::hooks`]), the setup command
//! ([`super::setup`]), then the snapshot its patches are measured from ([`super::patch`]).
//! The hook and the setup run bounded by the setup time limit and the stop signal; their
//! failures are provision errors naming the step and the tail of its output.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::command::{display_argv, run_git, At, CommandError};
use super::hooks;
use super::patch::{self, Snapshot};
use super::repo::{cancelled, provision_error, RepoGit};
use super::setup::{run_bounded, seconds, RunError};
use crate::error::{AdapterError, Result};

/// A fresh checkout of `commit` at `path` (a clone, or a base) made ready for an agent: the
/// repository's identity for commits, the `post-checkout` hook, the setup command, then the
/// snapshot its patches are measured from.
pub(crate) async fn prepare_checkout(
    repo: &RepoGit,
    path: &Path,
    commit: &str,
    setup: Option<&[String]>,
    env: &[(String, String)],
    timeout: Duration,
    stop: &CancellationToken,
) -> Result<Snapshot> {
    let checkout_failed = |e| checkout_failed(path, e);
    // Commits made in the checkout carry the identity the repository's own commits would
    // (a repository-local `user.*` is not cloned; the global one stays readable).
    for key in ["user.name", "user.email"] {
        if let Ok(v) = run_git(&repo.root, &["config", "--get", key]).await {
            let v = String::from_utf8_lossy(&v.stdout).trim().to_string();
            run_git(path, &["config", key, &v])
                .await
                .map_err(checkout_failed)?;
        }
    }
    let common = repo.common_dir().await.map_err(checkout_failed)?;
    let hooked = hooks::post_checkout(&repo.root, &common, path, commit, timeout, stop)
        .await
        .map_err(|e| bounded_error("post-checkout hook", path, timeout, e))?;
    let setup = setup.filter(|a| !a.is_empty());
    if !hooked && setup.is_none() && files_are_commit(path, commit).await {
        // Nothing but git wrote the files, and git wrote them unchanged: `git add -A` of them
        // (a stat of every file, a hash of the racily clean ones) would give the commit's tree.
        let tree = run_git(
            path,
            &["rev-parse", "--verify", &format!("{commit}^{{tree}}")],
        )
        .await
        .map_err(checkout_failed)?;
        return Ok(Snapshot {
            tree: String::from_utf8_lossy(&tree.stdout).trim().to_string(),
            taken: patch::unix_now(),
        });
    }
    if let Some(argv) = setup {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(path)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)));
        let display = display_argv(&argv[0], &argv[1..]);
        run_bounded(cmd, display, timeout, stop)
            .await
            .map_err(|e| bounded_error("setup command", path, timeout, e))?;
    }
    tokio::select! {
        // Before the agent ran, the checkout's config is what clone and setup made of it.
        s = patch::snapshot(At { dir: path, jail: None }) => s.map_err(|e| provision_error(format!("cannot snapshot the worktree after setup: {}", e.message))),
        _ = stop.cancelled() => Err(cancelled()),
    }
}

/// Whether git checked out every file of `commit` at `path` byte for byte as the commit holds
/// it, so the checkout's snapshot is the commit's tree: no attributes anywhere git reads them
/// (no `.gitattributes` in the tree, none in the checkout's `info/`, no global or system
/// attributes file) and no `core.autocrlf` (which converts without attributes). Without
/// attributes there is no filter, `text`/`eol`, `ident` or `working-tree-encoding`.
/// Anything unclear: false (the snapshot is then taken).
async fn files_are_commit(path: &Path, commit: &str) -> bool {
    let config = |key: &'static str| async move {
        run_git(path, &["config", "--path", "--get", key])
            .await
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if config("core.attributesFile").await.is_some()
        || config("core.autocrlf")
            .await
            .is_some_and(|v| !matches!(v.as_str(), "false" | "0" | "no" | "off" | ""))
    {
        return false;
    }
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| home.map(|h| h.join(".config")));
    let global = xdg.map(|x| x.join("git/attributes"));
    let files = [
        Some(path.join(".git/info/attributes")),
        global,
        Some("/etc/gitattributes".into()),
    ];
    if files.iter().flatten().any(|f| f.exists()) {
        return false;
    }
    let (path, commit) = (path.to_path_buf(), commit.to_string());
    tokio::task::spawn_blocking(move || {
        let Ok(repo) = git2::Repository::open(&path) else {
            return false;
        };
        let tree = repo
            .revparse_single(&format!("{commit}^{{tree}}"))
            .and_then(|o| o.peel_to_tree());
        let Ok(tree) = tree else { return false };
        let mut attributes = false;
        let walked = tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
            if entry.name_bytes() == b".gitattributes" {
                attributes = true;
                return git2::TreeWalkResult::Abort;
            }
            git2::TreeWalkResult::Ok
        });
        walked.is_ok() && !attributes
    })
    .await
    .unwrap_or(false)
}

/// The provision error for a git step of making the checkout at `path` that failed.
pub(crate) fn checkout_failed(path: &Path, e: CommandError) -> AdapterError {
    provision_error(format!(
        "cannot check out the worktree at {}",
        path.display()
    ))
    .with_cause(e)
}

/// The provision error for a hook or setup command that failed, ran out of time, or was
/// stopped.
fn bounded_error(what: &str, dir: &Path, limit: Duration, e: RunError) -> AdapterError {
    match e {
        RunError::Cancelled => cancelled(),
        RunError::TimedOut { command, output } => {
            let mut message = format!(
                "{what} `{command}` did not finish within {} (config.worktreeSetupTimeout); it \
                 and every process it started were killed",
                seconds(limit)
            );
            push_tail(&mut message, &output);
            provision_error(message)
        }
        RunError::Failed(e) => {
            let mut message = format!(
                "{what} `{}` failed in {} ({})",
                e.command,
                dir.display(),
                e.status_text()
            );
            push_tail(&mut message, &e.output);
            provision_error(message).with_cause(e)
        }
    }
}

fn push_tail(message: &mut String, output: &str) {
    if !output.is_empty() {
        message.push_str("; output tail:\n");
        message.push_str(output);
    }
}
