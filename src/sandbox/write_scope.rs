//! Where a session's file tools may write. The CLI's own file tools (Write, Edit, MultiEdit,
//! NotebookEdit) run inside the CLI's process, under `bypassPermissions`. Inside the session
//! sandbox the kernel already refuses what is outside it, with "Read-only file system"; the
//! session still answers their PreToolUse hook with [`WriteScope::check`], to tell the model
//! which paths it may write and why, and because with `sandbox: false` this hook is the only
//! boundary the file tools meet.
//!
//! A scope is a set of rules, each a directory tree that is writable or not; the most specific
//! tree containing the target decides (a denied tree wins a tie), and a path under no tree is
//! not writable. That expresses "the worktree, but not the rest of the repository it lives in,
//! nor its `.git` file" and "the temp dir, but not a repository that lives in it".
//!
//! The target is made absolute against the session's cwd, normalized lexically (`..`), and its
//! longest existing ancestor has its symlinks resolved (the whole path when it exists), so
//! neither `..` nor a symlink inside a writable tree can reach outside it. A dangling symlink
//! (its target would be created wherever it points) or a path that cannot be examined is
//! refused. Rule trees are resolved the same way when the scope is built.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct WriteScope {
    /// (resolved tree, writable).
    rules: Vec<(PathBuf, bool)>,
}

impl WriteScope {
    /// `tree` and everything below it are writable (unless a more specific rule denies).
    pub fn allow(mut self, tree: &Path) -> Self {
        self.rules.push((resolve_rule(tree), true));
        self
    }

    /// `tree` and everything below it are not writable (unless a more specific rule allows).
    pub fn deny(mut self, tree: &Path) -> Self {
        self.rules.push((resolve_rule(tree), false));
        self
    }

    /// The writable trees, for messages.
    pub fn writable(&self) -> Vec<&Path> {
        self.rules
            .iter()
            .filter(|(_, w)| *w)
            .map(|(p, _)| p.as_path())
            .collect()
    }

    /// `Ok` when `target` (absolute, or relative to `cwd`) may be written; otherwise why not.
    pub fn check(&self, cwd: &Path, target: &str) -> Result<(), String> {
        let resolved = resolve_target(cwd, Path::new(target))?;
        let decisive = self
            .rules
            .iter()
            .filter(|(tree, _)| resolved.starts_with(tree))
            .max_by_key(|(tree, writable)| (tree.components().count(), !writable));
        match decisive {
            Some((_, true)) => Ok(()),
            Some((tree, false)) => Err(format!(
                "{} is inside {}, which this session may not write",
                resolved.display(),
                tree.display()
            )),
            None => Err(format!(
                "{} is outside every path this session may write",
                resolved.display()
            )),
        }
    }
}

/// `target` (absolute, or relative to `cwd`) as the filesystem would reach it: absolute,
/// `..`-normalized, the symlinks of its longest existing ancestor resolved. Shared by the write
/// scope and the read guard so both see a path the same way.
pub(super) fn resolve_target(cwd: &Path, target: &Path) -> Result<PathBuf, String> {
    if target.as_os_str().is_empty() {
        return Err("the path is empty".to_string());
    }
    resolve(&normalize(&cwd.join(target)))
}

/// `..` and `.` removed without touching the filesystem (`..` at the root stays at the root).
pub(super) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if out.parent().is_some() {
                    out.pop();
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The path with the symlinks of its longest existing ancestor resolved (all of them when the
/// path exists). `path` is absolute and normalized.
fn resolve(path: &Path) -> Result<PathBuf, String> {
    let mut existing = path.to_path_buf();
    let mut missing = Vec::new();
    loop {
        match existing.symlink_metadata() {
            Ok(_) => break,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Absolute and normalized: every component but the root has a name.
                let Some(name) = existing.file_name() else {
                    return Err(format!("{} does not exist", existing.display()));
                };
                missing.push(name.to_os_string());
                existing.pop();
            }
            Err(e) => return Err(format!("cannot examine {}: {e}", existing.display())),
        }
    }
    // Exists but does not resolve: a dangling symlink (or a loop), whose write would land
    // wherever it points.
    let real = existing
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", existing.display()))?;
    Ok(missing.iter().rev().fold(real, |p, n| p.join(n)))
}

/// A rule's tree as the targets will be compared with it; a tree that cannot be resolved is
/// kept as written (it then matches only targets spelled the same way).
pub(super) fn resolve_rule(tree: &Path) -> PathBuf {
    let normalized = normalize(tree);
    resolve(&normalized).unwrap_or(normalized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A repository with a worktree inside it, the Implementor's scope, and a dir beside it.
    struct Layout {
        _tmp: tempfile::TempDir,
        repo: PathBuf,
        worktree: PathBuf,
        beside: PathBuf,
        scope: WriteScope,
    }

    fn layout() -> Layout {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let repo = root.join("repo");
        let worktree = repo.join(".worktrees/wi-1");
        let beside = root.join("beside");
        fs::create_dir_all(worktree.join("src")).unwrap();
        fs::create_dir_all(&beside).unwrap();
        fs::write(repo.join("README.md"), "engine").unwrap();
        fs::write(worktree.join(".git"), "gitdir: ../../.git/worktrees/wi-1").unwrap();
        let scope = WriteScope::default()
            .deny(&repo)
            .allow(&worktree)
            .deny(&worktree.join(".git"));
        Layout {
            _tmp: tmp,
            repo,
            worktree,
            beside,
            scope,
        }
    }

    #[test]
    fn files_inside_the_worktree_are_writable_absolute_or_relative() {
        let l = layout();
        let w = |p: &Path| p.to_str().unwrap().to_string();
        assert_eq!(
            l.scope.check(&l.worktree, &w(&l.worktree.join("a.txt"))),
            Ok(())
        );
        assert_eq!(l.scope.check(&l.worktree, "src/new/deep.rs"), Ok(()));
        assert_eq!(l.scope.check(&l.worktree, "./src/../b.txt"), Ok(()));
    }

    #[test]
    fn the_engine_checkout_and_paths_beside_the_repository_are_not() {
        let l = layout();
        let readme = l.repo.join("README.md");
        let err = l
            .scope
            .check(&l.worktree, readme.to_str().unwrap())
            .unwrap_err();
        assert!(err.contains(l.repo.to_str().unwrap()), "{err}");
        let beside = l.beside.join("x.txt");
        let err = l
            .scope
            .check(&l.worktree, beside.to_str().unwrap())
            .unwrap_err();
        assert!(err.contains("outside every path"), "{err}");
        assert!(l.scope.check(&l.worktree, "/etc/passwd").is_err());
    }

    #[test]
    fn dot_dot_cannot_climb_out_of_the_worktree() {
        let l = layout();
        assert!(l.scope.check(&l.worktree, "../../README.md").is_err());
        assert!(l
            .scope
            .check(&l.worktree, "src/../../../../beside/x")
            .is_err());
        let sneaky = format!("{}/src/../../wi-2/a", l.worktree.display());
        assert!(l.scope.check(&l.worktree, &sneaky).is_err());
        assert!(l
            .scope
            .check(&l.worktree, "../../../../../../../../etc/x")
            .is_err());
    }

    #[test]
    fn the_worktrees_git_file_is_not_writable() {
        let l = layout();
        assert!(l.scope.check(&l.worktree, ".git").is_err());
        assert!(l.scope.check(&l.worktree, "src/../.git").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_inside_the_worktree_cannot_lead_outside_it() {
        let l = layout();
        std::os::unix::fs::symlink(&l.beside, l.worktree.join("out")).unwrap();
        std::os::unix::fs::symlink(l.repo.join("README.md"), l.worktree.join("readme")).unwrap();
        std::os::unix::fs::symlink(l.beside.join("nothing"), l.worktree.join("dangling")).unwrap();
        std::os::unix::fs::symlink(l.worktree.join("src"), l.worktree.join("in")).unwrap();
        assert!(l.scope.check(&l.worktree, "out/new.txt").is_err());
        assert!(l.scope.check(&l.worktree, "out/deeper/new.txt").is_err());
        assert!(l.scope.check(&l.worktree, "readme").is_err());
        let err = l.scope.check(&l.worktree, "dangling").unwrap_err();
        assert!(err.contains("cannot resolve"), "{err}");
        assert_eq!(l.scope.check(&l.worktree, "in/x.rs"), Ok(()));
    }

    #[test]
    fn a_read_only_session_writes_its_temp_dir_but_not_a_repository_inside_it() {
        let l = layout();
        let tmp = l.repo.parent().unwrap().to_path_buf();
        let scope = WriteScope::default().allow(&tmp).deny(&l.repo);
        assert_eq!(
            scope.check(&l.repo, l.beside.join("n.txt").to_str().unwrap()),
            Ok(())
        );
        assert!(scope.check(&l.repo, "README.md").is_err());
        assert!(scope.check(&l.repo, ".worktrees/wi-1/a").is_err());
        assert!(WriteScope::default().check(&l.repo, "/tmp/x").is_err());
        assert!(scope.check(&l.repo, "").is_err());
    }

    #[test]
    fn a_denied_tree_wins_a_tie_with_an_allowed_one() {
        let l = layout();
        let scope = WriteScope::default().allow(&l.beside).deny(&l.beside);
        assert!(scope
            .check(&l.repo, l.beside.join("x").to_str().unwrap())
            .is_err());
    }
}
