//! What a session's read tools may not read: the home directory's credential stores. Inside
//! the session sandbox they are absent anyway (a private HOME); the CLI's Read, Glob and Grep
//! still get their PreToolUse hook answered with [`ReadGuard`], which names the reason, and
//! which is what keeps `~/.ssh/id_rsa` from them with `sandbox: false`. Everything else stays
//! readable: agents must read their repository freely.
//!
//! Paths are seen as [`super::WriteScope`] sees them (absolute, `..`-normalized, the symlinks of
//! their longest existing ancestor resolved), so neither `..` nor a symlink reaches a store. A
//! store is matched both as written and resolved (a `~/.ssh` that is a symlink is covered
//! through either name). A path that cannot be examined is refused.

use std::path::{Path, PathBuf};

use super::write_scope::{normalize, resolve_rule, resolve_target};

#[derive(Debug, Clone, Default)]
pub struct ReadGuard {
    /// Each credential store, as written and resolved, with what it is called in a refusal.
    stores: Vec<(PathBuf, &'static str)>,
}

impl ReadGuard {
    /// A guard over `stores` (files or directory trees; they need not exist).
    pub fn new(stores: impl IntoIterator<Item = PathBuf>) -> Self {
        Self::named(stores.into_iter().map(|s| (s, "the credential store")))
    }

    fn named(stores: impl IntoIterator<Item = (PathBuf, &'static str)>) -> Self {
        let mut all: Vec<(PathBuf, &'static str)> = stores
            .into_iter()
            .flat_map(|(s, what)| [(normalize(&s), what), (resolve_rule(&s), what)])
            .collect();
        all.sort();
        all.dedup();
        ReadGuard { stores: all }
    }

    /// The credential stores of the CLI's environment, the ones the sandbox makes unreadable.
    pub fn for_cli_env(cli_env: &[(String, String)]) -> Self {
        Self::new(super::credentials::credential_stores(cli_env))
    }

    /// The guard with `tree` kept from the read tools as well (the adapter's own records: the
    /// audit record is the engine's, not the agent's).
    pub fn and_record(self, tree: &Path) -> Self {
        let record = (tree.to_path_buf(), "the adapter's audit records");
        Self::named(self.stores.into_iter().chain([record]))
    }

    /// `Ok` when the file `target` (absolute, or relative to `cwd`) may be read.
    pub fn check_file(&self, cwd: &Path, target: &Path) -> Result<(), String> {
        let resolved = resolve_target(cwd, target)?;
        match self.stores.iter().find(|(s, _)| resolved.starts_with(s)) {
            Some((store, what)) => Err(inside(&resolved, store, what)),
            None => Ok(()),
        }
    }

    /// `Ok` when the tree `root` may be searched: it must neither lie inside a credential store
    /// nor contain one (a search of the home directory would read them).
    pub fn check_search(&self, cwd: &Path, root: &Path) -> Result<(), String> {
        let resolved = resolve_target(cwd, root)?;
        for (store, what) in &self.stores {
            if resolved.starts_with(store) {
                return Err(inside(&resolved, store, what));
            }
            if store.starts_with(&resolved) {
                return Err(format!(
                    "searching {} would reach {what} {}",
                    resolved.display(),
                    store.display()
                ));
            }
        }
        Ok(())
    }
}

fn inside(path: &Path, store: &Path, what: &str) -> String {
    format!("{} is inside {what} {}", path.display(), store.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A home with credential stores (one of them a symlink), and a repository inside it.
    struct Home {
        _tmp: tempfile::TempDir,
        home: PathBuf,
        repo: PathBuf,
        guard: ReadGuard,
    }

    fn home() -> Home {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let home = root.join("home");
        let repo = home.join("src/repo");
        fs::create_dir_all(home.join(".ssh")).unwrap();
        fs::create_dir_all(repo.join("src")).unwrap();
        fs::write(home.join(".ssh/id_rsa"), "SECRET").unwrap();
        fs::write(home.join(".netrc"), "machine x password SECRET").unwrap();
        fs::write(repo.join("README.md"), "repo").unwrap();
        let env = vec![("HOME".to_string(), home.to_str().unwrap().to_string())];
        Home {
            _tmp: tmp,
            guard: ReadGuard::for_cli_env(&env),
            home,
            repo,
        }
    }

    #[test]
    fn the_repository_and_ordinary_files_stay_readable_and_searchable() {
        let h = home();
        assert_eq!(h.guard.check_file(&h.repo, Path::new("README.md")), Ok(()));
        assert_eq!(
            h.guard.check_file(&h.repo, Path::new("/etc/hostname")),
            Ok(())
        );
        assert_eq!(h.guard.check_search(&h.repo, Path::new(".")), Ok(()));
        assert_eq!(h.guard.check_search(&h.repo, Path::new("src")), Ok(()));
        assert_eq!(
            h.guard.check_search(&h.repo, &h.home.join(".config/nvim")),
            Ok(())
        );
        assert_eq!(
            ReadGuard::default().check_search(&h.repo, Path::new("/")),
            Ok(())
        );
    }

    #[test]
    fn a_file_in_a_credential_store_is_refused_however_it_is_named() {
        let h = home();
        let key = h.home.join(".ssh/id_rsa");
        let err = h.guard.check_file(&h.repo, &key).unwrap_err();
        assert!(err.contains("inside the credential store"), "{err}");
        assert!(h
            .guard
            .check_file(&h.repo, Path::new("../../.netrc"))
            .is_err());
        assert!(h
            .guard
            .check_file(&h.repo, Path::new("src/../../../.ssh/id_rsa"))
            .is_err());
        assert!(h
            .guard
            .check_file(&h.repo, &h.home.join(".ssh/new"))
            .is_err());
        assert!(h
            .guard
            .check_file(&h.repo, &h.home.join(".aws/credentials"))
            .is_err());
        assert!(h.guard.check_file(&h.repo, Path::new("")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_into_a_store_is_refused_and_a_symlinked_store_is_covered() {
        let h = home();
        std::os::unix::fs::symlink(h.home.join(".ssh"), h.repo.join("keys")).unwrap();
        std::os::unix::fs::symlink(h.home.join(".netrc"), h.repo.join("rc")).unwrap();
        assert!(h
            .guard
            .check_file(&h.repo, Path::new("keys/id_rsa"))
            .is_err());
        assert!(h.guard.check_file(&h.repo, Path::new("rc")).is_err());
        assert!(h.guard.check_search(&h.repo, Path::new("keys")).is_err());
        // A store that is itself a symlink to elsewhere: its target is a store too.
        let elsewhere = h.home.parent().unwrap().join("kube-real");
        fs::create_dir_all(&elsewhere).unwrap();
        fs::write(elsewhere.join("config"), "token").unwrap();
        std::os::unix::fs::symlink(&elsewhere, h.home.join(".kube")).unwrap();
        let env = vec![("HOME".to_string(), h.home.to_str().unwrap().to_string())];
        let guard = ReadGuard::for_cli_env(&env);
        assert!(guard
            .check_file(&h.repo, &elsewhere.join("config"))
            .is_err());
        assert!(guard
            .check_file(&h.repo, &h.home.join(".kube/config"))
            .is_err());
    }

    #[test]
    fn a_search_inside_or_above_a_store_is_refused() {
        let h = home();
        let err = h.guard.check_search(&h.repo, &h.home).unwrap_err();
        assert!(err.contains("would reach the credential store"), "{err}");
        assert!(h.guard.check_search(&h.repo, Path::new("../..")).is_err());
        assert!(h.guard.check_search(&h.repo, Path::new("/")).is_err());
        assert!(h.guard.check_search(&h.repo, &h.home.join(".ssh")).is_err());
        assert!(h
            .guard
            .check_search(&h.repo, &h.home.join(".config"))
            .is_err());
        assert!(h.guard.check_search(&h.home, Path::new(".")).is_err());
    }

    #[test]
    fn the_claude_login_of_the_config_dir_is_a_store() {
        let h = home();
        let config = h.home.parent().unwrap().join("claude-config");
        let env = vec![(
            "CLAUDE_CONFIG_DIR".to_string(),
            config.to_str().unwrap().to_string(),
        )];
        let guard = ReadGuard::for_cli_env(&env);
        assert!(guard
            .check_file(&h.repo, &config.join(".credentials.json"))
            .is_err());
        assert!(guard.check_search(&h.repo, &config).is_err());
        assert_eq!(
            guard.check_file(&h.repo, &config.join("settings.json")),
            Ok(())
        );
        // Without HOME in the CLI's environment, nothing under this home is a store.
        assert_eq!(guard.check_file(&h.repo, &h.home.join(".netrc")), Ok(()));
    }
}
