//! Mount points Claude Code's sandbox creates on the host (observed on 2.1.330) and leaves
//! behind: empty files and directories in the session's cwd, the repository's git dir and the
//! worktree's admin dir. They are not the engine's: the ones a session's sandbox created are
//! removed after its CLI has exited, and only while still empty. A concurrent session in the
//! same repository may still use them as mount points, so the lifecycle calls
//! [`Leftovers::remove`] only when no other sandboxed session runs in that repository.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::settings::SessionScope;

const IN_CWD: &[&str] = &[".claude/.cc-writes", ".claude"];

/// What the CLI's sandbox plants in a session's working directory while a Bash command runs
/// (observed on 2.1.330: empty files and directories, the mount points of paths it keeps
/// read-only). It removes them when the command ends; a CLI killed mid-command (a crashed
/// engine) leaves them, and they must not pass for the agent's work in a salvaged patch.
pub const WORKDIR_MOUNT_POINTS: &[&str] = &[
    ".bash_profile",
    ".bashrc",
    ".profile",
    ".zprofile",
    ".zshrc",
    ".gitconfig",
    ".gitmodules",
    ".ripgreprc",
    ".mcp.json",
    ".idea",
    ".vscode",
    ".claude",
];
const IN_GIT_DIR: &[&str] = &[
    "config.worktree",
    "glab-cli",
    "remotes",
    "info/.claude-sandbox-noreplace",
    "objects/info/.claude-sandbox-noreplace",
    "objects/info/alternates",
    "objects/info/commit-graphs/.claude-sandbox-noreplace",
    "objects/info/commit-graphs",
    // Made by a Planner's or Reviewer's sandbox in a repository with no linked worktree; git
    // itself removes it with the last worktree, so an empty one is never the engine's.
    "worktrees",
];
const IN_ADMIN_DIR: &[&str] = &["config.worktree", "glab-cli"];

/// Per repository (keyed by its git dir): how many sessions of this process have a sandbox
/// that may be using mount points there, and every mount point any of them saw absent. The
/// leftovers are removed once the last of them has ended (a session that ends first must not
/// pull a mount point from under one still running, nor leave it behind for good).
#[derive(Default)]
struct Live {
    sessions: usize,
    leftovers: Leftovers,
}

fn lock_live() -> std::sync::MutexGuard<'static, HashMap<PathBuf, Live>> {
    static LIVE: OnceLock<Mutex<HashMap<PathBuf, Live>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A session's use of the sandbox in one repository: counted while it lives.
#[derive(Debug)]
pub struct SandboxUse {
    key: PathBuf,
}

impl SandboxUse {
    /// Before the CLI starts: records the absent mount points and counts the session.
    pub fn begin(scope: &SessionScope) -> SandboxUse {
        let seen = Leftovers::record(scope);
        let key = seen.git_dir.clone().unwrap_or_else(|| scope.cwd.clone());
        let mut live = lock_live();
        let entry = live.entry(key.clone()).or_default();
        entry.sessions += 1;
        for p in seen.absent_before {
            if !entry.leftovers.absent_before.contains(&p) {
                entry.leftovers.absent_before.push(p);
            }
        }
        SandboxUse { key }
    }

    /// After the CLI has exited: the last session of the repository removes the leftovers.
    /// Returns what was removed.
    pub fn end(self) -> Vec<PathBuf> {
        let done = {
            let mut live = lock_live();
            let last = live.get_mut(&self.key).is_none_or(|e| {
                e.sessions = e.sessions.saturating_sub(1);
                e.sessions == 0
            });
            if last {
                live.remove(&self.key)
            } else {
                None
            }
        };
        done.map(|l| l.leftovers.remove()).unwrap_or_default()
    }
}

/// The sandbox's mount points that did not exist before the session.
#[derive(Debug, Clone, Default)]
pub struct Leftovers {
    absent_before: Vec<PathBuf>,
    git_dir: Option<PathBuf>,
}

impl Leftovers {
    /// Records which of them are absent now (call before the CLI starts).
    pub fn record(scope: &SessionScope) -> Leftovers {
        let mut all: Vec<PathBuf> = IN_CWD.iter().map(|p| scope.cwd.join(p)).collect();
        let git_dir = scope
            .git
            .as_ref()
            .map(|g| g.common_dir.clone())
            .or_else(|| {
                git2::Repository::open(&scope.cwd)
                    .ok()
                    .map(|r| r.commondir().to_path_buf())
            });
        if let Some(dir) = &git_dir {
            all.extend(IN_GIT_DIR.iter().map(|p| dir.join(p)));
        }
        if let Some(g) = &scope.git {
            all.extend(IN_ADMIN_DIR.iter().map(|p| g.admin_dir.join(p)));
        }
        all.retain(|p| p.symlink_metadata().is_err());
        Leftovers {
            absent_before: all,
            git_dir,
        }
    }

    /// Removes those that exist now and are empty (an empty file, or an empty directory), in
    /// list order so that a directory's own leftovers go first; returns what was removed.
    pub fn remove(&self) -> Vec<PathBuf> {
        self.absent_before
            .iter()
            .filter(|p| remove_if_empty(p))
            .cloned()
            .collect()
    }
}

fn remove_if_empty(p: &Path) -> bool {
    match p.symlink_metadata() {
        Ok(m) if m.is_file() && m.len() == 0 => std::fs::remove_file(p).is_ok(),
        // `remove_dir` refuses a directory that is not empty.
        Ok(m) if m.is_dir() => std::fs::remove_dir(p).is_ok(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_and_empty_mount_points_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let cwd = tmp.path().to_path_buf();
        git2::Repository::init(&cwd).unwrap();
        std::fs::write(cwd.join(".git/remotes"), "").unwrap(); // the engine's, before
        let scope = SessionScope {
            cwd: cwd.clone(),
            git: None,
        };
        let rec = Leftovers::record(&scope);
        // What the sandbox makes, and a file the engine puts in .claude meanwhile.
        std::fs::create_dir_all(cwd.join(".claude/.cc-writes")).unwrap();
        std::fs::write(cwd.join(".claude/mine.json"), "{}").unwrap();
        std::fs::write(cwd.join(".git/objects/info/alternates"), "").unwrap();
        std::fs::write(cwd.join(".git/config.worktree"), "[x]\n").unwrap();
        std::fs::create_dir_all(cwd.join(".git/worktrees")).unwrap();
        let removed = rec.remove();
        assert!(removed.contains(&cwd.join(".git/worktrees")));
        assert!(removed.contains(&cwd.join(".claude/.cc-writes")));
        assert!(removed.contains(&cwd.join(".git/objects/info/alternates")));
        assert!(
            cwd.join(".claude/mine.json").exists(),
            "a non-empty .claude stays"
        );
        assert!(
            cwd.join(".git/config.worktree").exists(),
            "content is never removed"
        );
        assert!(
            cwd.join(".git/remotes").exists(),
            "what existed before stays"
        );
    }
}
