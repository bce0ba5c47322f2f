//! One repository's git state, shared process-wide: the per-repository lock that serializes
//! every change this process makes to the repository's git metadata, the set of worktrees this
//! process is using (so neither a sweep nor a new provision touches a live one), and the small
//! metadata operations the other modules build on (resolve a commit, delete a branch, remove a
//! worktree, find the common git dir). And a claimed checkout's life, the same for a clone, a
//! layer or a base: recorded and made live ([`RepoGit::record_clone`]), rolled back if making
//! it fails ([`ProvisionGuard`]), removed once its holder is done ([`LiveCheckout`]).
//!
//! Division of labour between git2 and the git CLI: the CLI makes every change (it applies
//! `.gitattributes`, filters and locking exactly as a person's git would, which libgit2 does
//! not); git2 only reads (resolving the default branch, locating the common git dir) and the CLI
//! is the fallback when git2 cannot open the repository (e.g. a format newer than libgit2's).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};

use super::command::{run_git, run_git_retrying, CommandError};
use super::confine::{CloneMounts, Confinement, Confiner};
use super::layer::{remove_recorded_layer, remove_tree, Layer};
use super::list::{self, object_dirs, ListedWorktree};
use super::record::{write_owner, AdminRecord};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::process::Owner;

/// Directory (relative to the repository root) that holds the worktrees.
pub const WORKTREES_DIR: &str = ".worktrees";

pub(crate) fn provision_error(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// What a provision (of a checkout, a view, a base) stopped by its session returns.
pub(crate) fn cancelled() -> AdapterError {
    AdapterError::new(
        ErrorCode::Cancelled,
        "the session was stopped while its worktree was being provisioned",
    )
}

/// Git state for one repository, shared process-wide (see [`RepoGit::for_repo`]).
pub struct RepoGit {
    pub(crate) root: PathBuf,
    pub(crate) me: Weak<RepoGit>,
    /// Serializes every change to this repository's git metadata made by this process.
    pub(crate) lock: tokio::sync::Mutex<()>,
    /// Worktree paths for which a [`super::Worktree`] value exists in this process.
    pub(crate) live: StdMutex<HashSet<PathBuf>>,
    pub(crate) owner: Owner,
    common: tokio::sync::OnceCell<PathBuf>,
}

impl std::fmt::Debug for RepoGit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoGit").field("root", &self.root).finish()
    }
}

fn registry() -> &'static StdMutex<HashMap<PathBuf, Arc<RepoGit>>> {
    static REGISTRY: OnceLock<StdMutex<HashMap<PathBuf, Arc<RepoGit>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

pub(crate) fn lock_std<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these short critical sections cannot leave the set inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RepoGit {
    /// The process-wide instance for a repository, keyed by its canonical path, so every
    /// adapter on one repository shares one serialization lock and one set of live worktrees.
    pub fn for_repo(repo_root: &Path) -> Arc<RepoGit> {
        let root = std::fs::canonicalize(repo_root).unwrap_or_else(|_| {
            std::path::absolute(repo_root).unwrap_or_else(|_| repo_root.to_path_buf())
        });
        let mut reg = lock_std(registry());
        reg.entry(root.clone())
            .or_insert_with(|| {
                Arc::new_cyclic(|me| RepoGit {
                    root,
                    me: me.clone(),
                    lock: tokio::sync::Mutex::new(()),
                    live: StdMutex::new(HashSet::new()),
                    owner: Owner::current(),
                    common: tokio::sync::OnceCell::new(),
                })
            })
            .clone()
    }

    /// The canonical repository root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the worktree for `branch` lives.
    pub fn worktree_path(&self, branch: &str) -> PathBuf {
        self.root.join(WORKTREES_DIR).join(branch)
    }

    pub(crate) fn arc(&self) -> Arc<RepoGit> {
        self.me
            .upgrade()
            .expect("RepoGit is only reachable through its Arc")
    }

    pub(crate) fn is_live(&self, path: &Path) -> bool {
        lock_std(&self.live).iter().any(|p| same_path(p, path))
    }

    /// The repository's common git dir (`.git` of the main checkout), where worktree metadata,
    /// hooks and `info/exclude` live. git2 first; `git rev-parse --git-common-dir` (git 2.5+)
    /// when git2 cannot open the repository.
    pub(crate) async fn common_dir(&self) -> Result<PathBuf, CommandError> {
        self.common
            .get_or_try_init(|| async {
                if let Ok(r) = git2::Repository::open(&self.root) {
                    return Ok(canonical(r.commondir()));
                }
                let out = run_git(&self.root, &["rev-parse", "--git-common-dir"]).await?;
                let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                Ok(canonical(&self.root.join(p)))
            })
            .await
            .cloned()
    }

    /// A new repository at `path` that reads this repository's objects (`objects/info/
    /// alternates`) with their hash (a SHA-256 repository needs `--object-format=sha256`; git
    /// 2.30 knows both) and, of a shallow repository, where its history ends (without the
    /// `shallow` file `git log` would fail on the first missing parent). The Planner's and
    /// Reviewer's view, and the scratch repository where a remote checkout's patch is computed.
    pub(crate) async fn init_borrowing(&self, path: &Path) -> Result<(), CommandError> {
        let common = self.common_dir().await?;
        let format = run_git(&self.root, &["rev-parse", "--show-object-format"]).await?;
        let format = format!(
            "--object-format={}",
            String::from_utf8_lossy(&format.stdout).trim()
        );
        let init: [&std::ffi::OsStr; 5] = [
            "init".as_ref(),
            "--quiet".as_ref(),
            format.as_ref(),
            "--".as_ref(),
            path.as_os_str(),
        ];
        run_git(&self.root, &init).await?;
        let git_dir = path.join(".git");
        let io = |what: &str, e: std::io::Error| CommandError::spawn(what.into(), &e);
        let mut alternates = common.join("objects").into_os_string().into_encoded_bytes();
        alternates.push(b'\n');
        std::fs::write(git_dir.join("objects/info/alternates"), alternates)
            .map_err(|e| io("writing objects/info/alternates", e))?;
        match std::fs::copy(common.join("shallow"), git_dir.join("shallow")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io("copying the repository's shallow file", e))
            }
            _ => Ok(()),
        }
    }

    /// [`RepoGit::common_dir`] as a provision error, for the steps that cannot go on without it.
    pub(crate) async fn git_dir(&self) -> Result<PathBuf> {
        self.common_dir()
            .await
            .map_err(|e| provision_error("cannot locate the repository's git dir").with_cause(e))
    }

    /// Every worktree of the repository, the main checkout first (read from the metadata files
    /// git 2.30 already writes: see [`super::list`]).
    pub(crate) async fn list_worktrees(&self) -> Result<Vec<ListedWorktree>> {
        let common = self.git_dir().await?;
        list::worktrees(&common)
            .map_err(|e| provision_error("cannot list the repository's worktrees").with_cause(e))
    }

    /// Adds `/.worktrees/` to `<common git dir>/info/exclude` once, so the main checkout's
    /// `git status` stays clean. Runs under the lock, so concurrent provisions append it once.
    pub(crate) async fn ensure_excluded(&self) -> Result<()> {
        let err = |e: std::io::Error| {
            provision_error("cannot add .worktrees/ to .git/info/exclude").with_cause(e)
        };
        let common = self.git_dir().await?;
        append_exclude(&common.join("info")).map_err(err)
    }

    /// The commit `rev` names now, as a hex oid (git2; the CLI if git2 cannot read the repo).
    pub(crate) async fn resolve_commit(&self, rev: &str) -> Result<String> {
        let spec = format!("{rev}^{{commit}}");
        let via_git2 = git2::Repository::open(&self.root)
            .and_then(|r| r.revparse_single(&spec).map(|o| o.id().to_string()));
        let git2_err = match via_git2 {
            Ok(oid) => return Ok(oid),
            Err(e) => e,
        };
        let unresolved = || {
            provision_error(format!(
                "cannot resolve default branch '{rev}' to a commit ({git2_err})"
            ))
        };
        // `--end-of-options` for rev-parse is newer than git 2.30: refuse option-like names.
        if rev.starts_with('-') {
            return Err(unresolved());
        }
        match run_git(&self.root, &["rev-parse", "--verify", "--quiet", &spec]).await {
            Ok(out) => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
            Err(e) => Err(unresolved().with_cause(e)),
        }
    }

    /// Removes the worktree at `path` and its metadata. `git worktree remove --force --force`
    /// (twice: our worktrees are locked) first; if git refuses (it will not remove a worktree
    /// containing submodules), the directory is deleted and the metadata pruned. Only ever
    /// called for worktrees this adapter made (see [`super::sweep`]).
    pub(crate) async fn remove_worktree_dir(&self, path: &Path) -> Result<(), CommandError> {
        let args: [&std::ffi::OsStr; 5] = [
            "worktree".as_ref(),
            "remove".as_ref(),
            "--force".as_ref(),
            "--force".as_ref(),
            path.as_os_str(),
        ];
        if let Err(git_err) = run_git_retrying(&self.root, &args).await {
            if path.exists() {
                let p = path.to_path_buf();
                let rm = tokio::task::spawn_blocking(move || remove_tree(&p))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
                if let Err(io) = rm {
                    let mut e = git_err;
                    e.output
                        .push_str(&format!("\nremoving the directory failed too: {io}"));
                    return Err(e);
                }
            }
            let unlock: [&std::ffi::OsStr; 3] =
                ["worktree".as_ref(), "unlock".as_ref(), path.as_os_str()];
            let _ = run_git(&self.root, &unlock).await;
        }
        // Drops the metadata of worktrees whose directory is gone (ours, after a fallback).
        run_git_retrying(&self.root, &["worktree", "prune"]).await?;
        Ok(())
    }

    /// `git branch -D`; a branch that does not exist is not an error (cleanup is idempotent).
    pub(crate) async fn delete_branch(&self, branch: &str) -> Result<(), CommandError> {
        match run_git_retrying(&self.root, &["branch", "-D", branch]).await {
            Ok(_) => Ok(()),
            Err(e) if e.output.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Where this adapter records a clone at `path` (inside the repository's git dir, which
    /// no sandbox can write, so an agent cannot forge or remove the record of its own clone).
    pub(crate) async fn record_dir(&self, path: &Path) -> Result<PathBuf> {
        let common = self.git_dir().await?;
        let id = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_URL,
            path.as_os_str().as_encoded_bytes(),
        );
        Ok(common.join(list::CLONES_DIR).join(id.to_string()))
    }

    /// Every linked worktree and every clone this adapter recorded (not the main checkout).
    pub(crate) async fn list_all(&self) -> Result<Vec<ListedWorktree>> {
        let common = self.git_dir().await?;
        let mut all: Vec<ListedWorktree> = self
            .list_worktrees()
            .await?
            .into_iter()
            .filter(|w| w.admin != common)
            .collect();
        all.extend(
            list::clones(&common)
                .map_err(|e| provision_error("cannot list the adapter's clones").with_cause(e))?,
        );
        Ok(all)
    }

    /// The sandbox the adapter's own git runs in inside an agent's clone: the clone writable,
    /// the repository's object stores readable, a layered checkout's layer mounted, nothing
    /// else of the host (see [`super::command::At`]). Whenever `sandbox` can confine git here,
    /// whatever `config.sandbox` says now: a clone made by a sandboxed session may be swept by
    /// a `sandbox: false` adapter, and its config, attributes and filters are the agent's.
    /// `None` only where it cannot (other systems; a Linux host without bubblewrap), where git
    /// runs with the clone's programs neutralised as far as `-c` reaches
    /// ([`super::command::At::git`]).
    pub(crate) async fn extraction_jail(
        &self,
        sandbox: &dyn Confiner,
        clone: &Path,
    ) -> Result<Option<Arc<dyn Confinement>>> {
        if !sandbox.confines().await {
            return Ok(None);
        }
        let common = self.git_dir().await?;
        let record = AdminRecord::read(&self.record_dir(clone).await?);
        let layer = record.and_then(|r| r.layer).map(|l| Layer::from_record(&l));
        Ok(Some(sandbox.confine(&CloneMounts {
            clone: clone.to_path_buf(),
            objects: object_dirs(&common),
            layer: layer.map(|l| l.mounts(clone)),
        })))
    }

    /// Records the clone about to be made at `path` as this process's (the session record,
    /// then the owner record beside it) and marks it live. The caller holds the lock; a
    /// failure leaves no record.
    pub(crate) async fn record_clone(&self, path: &Path, record: &AdminRecord) -> Result<()> {
        let record_dir = self.record_dir(path).await?;
        let written = std::fs::create_dir_all(&record_dir).and_then(|()| {
            record.write(&record_dir)?;
            write_owner(&self.owner, &record_dir)
        });
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&record_dir);
            return Err(provision_error(format!(
                "cannot record the owner of the new worktree at {}",
                path.display()
            ))
            .with_cause(e));
        }
        lock_std(&self.live).insert(path.to_path_buf());
        Ok(())
    }

    /// Removes the clone at `path` and its records (a session's cleanup, a rollback).
    ///
    /// Its files go before the lock is taken: every claim and record of the repository waits
    /// on the lock, and removing a base takes what its checkout took (a new tip's first session
    /// waited ~0.3 s on cargo's old base, a second at 100,000 files). Meanwhile the path is
    /// still live, so no sweep or claim of this process touches it; a crash leaves the record,
    /// which the next sweep acts on as before.
    pub(crate) async fn remove_session(&self, path: &Path) -> Result<()> {
        let record_dir = self.record_dir(path).await?;
        remove_checkout(path, &record_dir).await?;
        let _guard = self.lock.lock().await;
        remove_records(path, &record_dir).await?;
        lock_std(&self.live).remove(path);
        Ok(())
    }
}

/// A checkout this process made live ([`RepoGit::record_clone`]) as its holder (a session's
/// [`super::Worktree`], a base) holds it: removed with its records at most once
/// ([`LiveCheckout::remove`]); dropped without that, no longer live, so the next sweep saves
/// its work and removes it.
pub(crate) struct LiveCheckout {
    pub repo: Arc<RepoGit>,
    path: PathBuf,
    removed: AtomicBool,
}

impl LiveCheckout {
    pub(crate) fn new(repo: Arc<RepoGit>, path: PathBuf) -> LiveCheckout {
        LiveCheckout {
            repo,
            path,
            removed: AtomicBool::new(false),
        }
    }

    /// Removes the clone (or layer, or base) and its records, once.
    pub(crate) async fn remove(&self) -> Result<()> {
        if !self.removed.load(Ordering::SeqCst) {
            self.repo.remove_session(&self.path).await?;
            self.removed.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

impl Drop for LiveCheckout {
    fn drop(&mut self) {
        if !self.removed.load(Ordering::SeqCst) {
            lock_std(&self.repo.live).remove(&self.path);
        }
    }
}

/// Rolls a half-provisioned worktree (or repository view, [`super::view`]) back: awaited on
/// error paths, spawned if the provision future is dropped.
pub(crate) struct ProvisionGuard {
    repo: Option<Arc<RepoGit>>,
    path: PathBuf,
}

impl ProvisionGuard {
    /// Armed for the clone at `path`, which [`RepoGit::record_clone`] has recorded.
    pub(crate) fn new(repo: &RepoGit, path: &Path) -> ProvisionGuard {
        ProvisionGuard {
            repo: Some(repo.arc()),
            path: path.to_path_buf(),
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.repo = None;
    }

    pub(crate) async fn rollback(&mut self) {
        if let Some(repo) = self.repo.take() {
            if let Err(e) = repo.remove_session(&self.path).await {
                tracing::warn!(path = %self.path.display(), error = %e, "rolling back a failed provision failed");
            }
        }
    }
}

impl Drop for ProvisionGuard {
    fn drop(&mut self) {
        let Some(repo) = self.repo.take() else {
            return;
        };
        let path = std::mem::take(&mut self.path);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = repo.remove_session(&path).await {
                        tracing::warn!(path = %path.display(), error = %e, "rolling back a dropped provision failed");
                    }
                });
            }
            // No runtime left: the worktree is no longer live, so the next sweep removes it.
            Err(_) => {
                lock_std(&repo.live).remove(&path);
            }
        }
    }
}

/// Appends `/.worktrees/` to `<info>/exclude` unless an equivalent line is there.
fn append_exclude(info: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let exclude = info.join("exclude");
    let current = match std::fs::read_to_string(&exclude) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let listed = current.lines().map(str::trim).any(|l| {
        matches!(
            l,
            ".worktrees" | ".worktrees/" | "/.worktrees" | "/.worktrees/"
        )
    });
    if listed {
        return Ok(());
    }
    std::fs::create_dir_all(info)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&exclude)?;
    let sep = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    writeln!(f, "{sep}/{WORKTREES_DIR}/")
}

pub(crate) fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

pub(crate) fn same_path(a: &Path, b: &Path) -> bool {
    a == b || canonical(a) == canonical(b)
}

/// Removes a clone's directory, then its records (in that order: a failure leaves the record,
/// so a later sweep still finds it).
pub(crate) async fn remove_clone(path: &Path, record_dir: &Path) -> Result<()> {
    remove_checkout(path, record_dir).await?;
    remove_records(path, record_dir).await
}

/// A clone's own files: its directory and the layer its record names.
async fn remove_checkout(path: &Path, record_dir: &Path) -> Result<()> {
    let (p, r) = (path.to_path_buf(), record_dir.to_path_buf());
    let removed = tokio::task::spawn_blocking(move || {
        remove_tree(&p)?;
        remove_recorded_layer(AdminRecord::read(&r).as_ref())
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    removed.map_err(|e| {
        provision_error(format!("cannot remove the worktree {}", path.display())).with_cause(e)
    })
}

/// A removed clone's records, under the repository's lock: a claim makes the directories they
/// are in.
async fn remove_records(path: &Path, record_dir: &Path) -> Result<()> {
    let r = record_dir.to_path_buf();
    let removed = tokio::task::spawn_blocking(move || {
        // The CLI's config dir in it was the sandbox's to write (a `chmod 000` included).
        remove_tree(&r)?;
        // `clones/` and `claude-runtime-adapter/` go once empty: the repository's git dir is
        // left as it was found (another session's record keeps them, `remove_dir` then fails).
        for dir in r.ancestors().skip(1).take(2) {
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    removed.map_err(|e| {
        provision_error(format!("cannot remove the worktree {}", path.display())).with_cause(e)
    })
}
