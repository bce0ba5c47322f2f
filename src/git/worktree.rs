//! Implementor worktrees: `<repoRoot>/.worktrees/<branch>` on a branch force-reset to the
//! default branch, with the setup command (e.g. `yarn install`) run in it.
//!
//! Division of labour between git2 and the git CLI:
//! - the CLI makes every change (`worktree add`, `reset --hard`, `worktree remove`, `branch -D`,
//!   `worktree prune`): it applies `.gitattributes` conversions and configured filters (Git LFS)
//!   and runs hooks exactly as `git worktree add` does, which libgit2 does not;
//! - git2 reads: resolving the default branch to its commit and locating the common git dir
//!   (no process spawn). If git2 cannot open the repository (e.g. a ref/repository format newer
//!   than libgit2 understands), the CLI is used for those reads too.
//!
//! `git worktree add` is split in two, exactly as git itself does it internally: the metadata
//! step (`worktree add --no-checkout`: admin dir, branch, HEAD) runs under the per-repository
//! lock, while populating the files (`reset --hard`, then the `post-checkout` hook) and the setup
//! command run outside it, so parallel provisions only queue for the short metadata steps.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::command::{display_argv, run_git, run_git_retrying, CommandError};
use super::owner::Owner;
use crate::error::{AdapterError, ErrorCode, Result};

/// Directory (relative to the repository root) that holds the worktrees.
pub const WORKTREES_DIR: &str = ".worktrees";

/// How much of the setup command's output is kept for the error message.
pub const SETUP_OUTPUT_TAIL: usize = 8 * 1024;

/// After the setup command exits, how long to keep reading its pipes: a daemon it started may
/// hold them open forever.
const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(2);

const NULL_OID: &str = "0000000000000000000000000000000000000000";

fn provision_error(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// Git state for one repository, shared process-wide (see [`RepoGit::for_repo`]).
pub struct RepoGit {
    root: PathBuf,
    me: Weak<RepoGit>,
    /// Serializes every change to this repository's git metadata made by this process.
    lock: tokio::sync::Mutex<()>,
    /// Worktree paths for which a [`Worktree`] value exists in this process.
    live: StdMutex<HashSet<PathBuf>>,
    owner: Owner,
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

fn lock_std<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these short critical sections cannot leave the set inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One parsed record of `git worktree list --porcelain -z`.
#[derive(Debug, Default, Clone)]
struct ListedWorktree {
    path: PathBuf,
    branch: Option<String>,
    /// `Some(reason)` when locked (reason may be empty).
    locked: Option<String>,
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

    /// Provisions `<repoRoot>/.worktrees/<branch>` on `branch` force-reset to `default_branch`
    /// (`git worktree add -B` semantics), then runs `setup` in it. See the module docs.
    pub async fn provision(
        &self,
        branch: &str,
        default_branch: &str,
        setup: Option<&[String]>,
        env: &[(String, String)],
    ) -> Result<Worktree> {
        check_branch_path(branch)?;
        let repo = self
            .me
            .upgrade()
            .expect("RepoGit is only reachable through its Arc");
        let path = self.worktree_path(branch);

        // Phase 1, under the lock: the metadata changes.
        let base_commit = {
            let _guard = self.lock.lock().await;
            self.ensure_excluded().map_err(|e| {
                provision_error("cannot add .worktrees/ to .git/info/exclude").with_cause(e)
            })?;
            let base = self.resolve_commit(default_branch).await?;
            let listed = self.list_worktrees().await.map_err(|e| {
                provision_error("cannot list the repository's worktrees").with_cause(e)
            })?;
            if let Some(stale) = listed.iter().find(|w| same_path(&w.path, &path)) {
                self.check_not_in_use(stale)?;
                self.remove_worktree_dir(&path).await.map_err(|e| {
                    provision_error(format!(
                        "cannot remove the stale worktree at {}",
                        path.display()
                    ))
                    .with_cause(e)
                })?;
            }
            let want_ref = format!("refs/heads/{branch}");
            if let Some(other) = listed
                .iter()
                .find(|w| !same_path(&w.path, &path) && w.branch.as_deref() == Some(&want_ref))
            {
                return Err(provision_error(format!(
                    "branch '{branch}' is checked out in another worktree at {}; it cannot be \
                     force-reset for a new session",
                    other.path.display()
                )));
            }
            let branch_existed = self.branch_exists(branch).await;
            let reason = self.owner.to_record();
            let add_args: Vec<&std::ffi::OsStr> = vec![
                "worktree".as_ref(),
                "add".as_ref(),
                "--no-checkout".as_ref(),
                "--lock".as_ref(),
                "--reason".as_ref(),
                reason.as_ref(),
                "-B".as_ref(),
                branch.as_ref(),
                path.as_os_str(),
                base.as_ref(),
            ];
            if let Err(e) = run_git_retrying(&self.root, &add_args).await {
                // git removes its own half-made worktree, but a branch it created before failing
                // (e.g. the path exists and is not empty) stays; a branch that existed before
                // is left alone (it was going to be reset anyway, but it is not ours to delete).
                if !branch_existed {
                    let _ = self.delete_branch(branch).await;
                }
                return Err(provision_error(format!(
                    "git worktree add failed for branch '{branch}'"
                ))
                .with_cause(e));
            }
            lock_std(&self.live).insert(path.clone());
            base
        };

        // From here on any failure (or the future being dropped) removes worktree and branch.
        let mut guard = ProvisionGuard {
            repo: Some(repo.clone()),
            path: path.clone(),
            branch: branch.to_string(),
        };

        // Phase 2, outside the lock: populate the files exactly as `git worktree add` does
        // (`reset --hard --no-recurse-submodules`, then the post-checkout hook).
        let populate = async {
            run_git_retrying(
                &path,
                &["reset", "--hard", "--no-recurse-submodules", "--quiet"],
            )
            .await?;
            run_git(
                &path,
                &[
                    "hook",
                    "run",
                    "--ignore-missing",
                    "post-checkout",
                    "--",
                    NULL_OID,
                    &base_commit,
                    "1",
                ],
            )
            .await?;
            Ok::<_, CommandError>(())
        };
        if let Err(e) = populate.await {
            guard.rollback().await;
            return Err(provision_error(format!(
                "cannot check out the worktree at {}",
                path.display()
            ))
            .with_cause(e));
        }

        if let Some(argv) = setup.filter(|a| !a.is_empty()) {
            if let Err(e) = run_setup(&path, argv, env).await {
                guard.rollback().await;
                let mut message = format!(
                    "setup command `{}` failed in {} ({})",
                    e.command,
                    path.display(),
                    e.status_text()
                );
                if !e.output.is_empty() {
                    message.push_str("; output tail:\n");
                    message.push_str(&e.output);
                }
                return Err(provision_error(message).with_cause(e));
            }
        }

        guard.disarm();
        Ok(Worktree {
            path: path.clone(),
            branch: branch.to_string(),
            base_commit,
            state: Arc::new(WorktreeState {
                repo,
                path,
                branch: branch.to_string(),
                cleaned: AtomicBool::new(false),
            }),
        })
    }

    /// Removes worktrees under `.worktrees/` left behind by processes that are gone: those
    /// whose owner record names a dead process (their branch is deleted too), those owned by
    /// this process for which no [`Worktree`] value exists any more (leaked), and those with no
    /// lock at all (made by another tool or the previous adapter; their branch is kept since it
    /// may hold work we cannot vouch for). Worktrees of live processes, and ones a user locked
    /// with a reason of their own, are kept. Returns the removed paths.
    pub async fn sweep_stale(&self) -> Result<Vec<PathBuf>> {
        let _guard = self.lock.lock().await;
        let sweep_error = |m: String| AdapterError::new(ErrorCode::Provision, m);
        let listed = self.list_worktrees().await.map_err(|e| {
            sweep_error("cannot list the repository's worktrees".into()).with_cause(e)
        })?;
        let dir = self.root.join(WORKTREES_DIR);
        let live = lock_std(&self.live).clone();
        let mut removed = Vec::new();
        for wt in listed {
            let Ok(rel) = wt.path.strip_prefix(&dir) else {
                continue;
            };
            if rel.as_os_str().is_empty() || live.iter().any(|p| same_path(p, &wt.path)) {
                continue;
            }
            let delete_branch = match wt.locked.as_deref() {
                None => false,
                Some(reason) => match Owner::parse(reason) {
                    Some(o) if o == self.owner => true,
                    Some(o) if o.is_alive() => continue,
                    Some(_) => true,
                    None => continue,
                },
            };
            self.remove_worktree_dir(&wt.path).await.map_err(|e| {
                sweep_error(format!(
                    "cannot remove stale worktree {}",
                    wt.path.display()
                ))
                .with_cause(e)
            })?;
            if delete_branch {
                if let Some(b) = wt
                    .branch
                    .as_deref()
                    .and_then(|r| r.strip_prefix("refs/heads/"))
                {
                    self.delete_branch(b).await.map_err(|e| {
                        sweep_error(format!("cannot delete branch '{b}' of a stale worktree"))
                            .with_cause(e)
                    })?;
                }
            }
            removed.push(wt.path);
        }
        Ok(removed)
    }

    /// The stale worktree at our path may still be in use: by this process (a duplicate
    /// branch) or by another live engine process. Removing it would destroy a running
    /// session's work, so that is refused.
    fn check_not_in_use(&self, wt: &ListedWorktree) -> Result<()> {
        if lock_std(&self.live).iter().any(|p| same_path(p, &wt.path)) {
            return Err(provision_error(format!(
                "the worktree at {} is in use by a running session of this process",
                wt.path.display()
            )));
        }
        if let Some(owner) = wt.locked.as_deref().and_then(Owner::parse) {
            if owner != self.owner && owner.is_alive() {
                return Err(provision_error(format!(
                    "the worktree at {} is in use by live process {} on {}",
                    wt.path.display(),
                    owner.pid,
                    owner.host
                )));
            }
        }
        Ok(())
    }

    /// Adds `/.worktrees/` to `<common git dir>/info/exclude` once, so the main checkout's
    /// `git status` stays clean. Runs under the lock, so concurrent provisions append it once.
    fn ensure_excluded(&self) -> std::io::Result<()> {
        use std::io::Write;
        let common = match git2::Repository::open(&self.root) {
            Ok(r) => r.commondir().to_path_buf(),
            Err(_) => self.root.join(".git"),
        };
        let info = common.join("info");
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
        std::fs::create_dir_all(&info)?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&exclude)?;
        let sep = if current.is_empty() || current.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        writeln!(f, "{sep}/{WORKTREES_DIR}/")?;
        Ok(())
    }

    /// The commit `rev` names now, as a hex oid (git2; the CLI if git2 cannot read the repo).
    async fn resolve_commit(&self, rev: &str) -> Result<String> {
        let spec = format!("{rev}^{{commit}}");
        let via_git2 = git2::Repository::open(&self.root)
            .and_then(|r| r.revparse_single(&spec).map(|o| o.id().to_string()));
        match via_git2 {
            Ok(oid) => Ok(oid),
            Err(git2_err) => {
                match run_git(
                    &self.root,
                    &["rev-parse", "--verify", "--end-of-options", &spec],
                )
                .await
                {
                    Ok(out) => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
                    Err(e) => Err(provision_error(format!(
                        "cannot resolve default branch '{rev}' to a commit ({git2_err})"
                    ))
                    .with_cause(e)),
                }
            }
        }
    }

    async fn branch_exists(&self, branch: &str) -> bool {
        let full = format!("refs/heads/{branch}");
        run_git(&self.root, &["rev-parse", "--verify", "--quiet", &full])
            .await
            .is_ok()
    }

    async fn list_worktrees(&self) -> Result<Vec<ListedWorktree>, CommandError> {
        let out = run_git(&self.root, &["worktree", "list", "--porcelain", "-z"]).await?;
        Ok(parse_worktree_list(&out.stdout))
    }

    /// Removes the worktree at `path` and its metadata. `git worktree remove --force --force`
    /// (twice: our worktrees are locked) first; if git refuses (it will not remove a worktree
    /// containing submodules), the directory is deleted and the metadata pruned.
    async fn remove_worktree_dir(&self, path: &Path) -> Result<(), CommandError> {
        let args: [&std::ffi::OsStr; 5] = [
            "worktree".as_ref(),
            "remove".as_ref(),
            "--force".as_ref(),
            "--force".as_ref(),
            path.as_os_str(),
        ];
        let git_result = run_git_retrying(&self.root, &args).await;
        if let Err(git_err) = git_result {
            if path.exists() {
                let p = path.to_path_buf();
                let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&p))
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
    async fn delete_branch(&self, branch: &str) -> Result<(), CommandError> {
        match run_git_retrying(&self.root, &["branch", "-D", branch]).await {
            Ok(_) => Ok(()),
            Err(e) if e.output.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes a session's worktree and branch (cleanup and rollback).
    async fn remove_session(&self, path: &Path, branch: &str) -> Result<(), CommandError> {
        let _guard = self.lock.lock().await;
        let registered = self
            .list_worktrees()
            .await?
            .iter()
            .any(|w| same_path(&w.path, path));
        if registered || path.exists() {
            self.remove_worktree_dir(path).await?;
        }
        self.delete_branch(branch).await?;
        lock_std(&self.live).remove(path);
        Ok(())
    }
}

/// Rolls a half-provisioned worktree back: awaited on error paths, spawned if the provision
/// future is dropped (the session was cancelled while `yarn install` ran).
struct ProvisionGuard {
    repo: Option<Arc<RepoGit>>,
    path: PathBuf,
    branch: String,
}

impl ProvisionGuard {
    fn disarm(&mut self) {
        self.repo = None;
    }

    async fn rollback(&mut self) {
        if let Some(repo) = self.repo.take() {
            if let Err(e) = repo.remove_session(&self.path, &self.branch).await {
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
        let (path, branch) = (
            std::mem::take(&mut self.path),
            std::mem::take(&mut self.branch),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = repo.remove_session(&path, &branch).await {
                        tracing::warn!(path = %path.display(), error = %e, "rolling back a cancelled provision failed");
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

/// A provisioned worktree. Clones share state; once the last clone is dropped without
/// [`Worktree::cleanup`], the worktree is no longer live and the next sweep removes it.
#[derive(Clone)]
pub struct Worktree {
    pub path: PathBuf,
    pub branch: String,
    /// Hex oid the default branch resolved to when the worktree was created: the patch base.
    pub base_commit: String,
    state: Arc<WorktreeState>,
}

impl std::fmt::Debug for Worktree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worktree")
            .field("path", &self.path)
            .field("branch", &self.branch)
            .field("base_commit", &self.base_commit)
            .finish()
    }
}

struct WorktreeState {
    repo: Arc<RepoGit>,
    path: PathBuf,
    branch: String,
    cleaned: AtomicBool,
}

impl Drop for WorktreeState {
    fn drop(&mut self) {
        if !self.cleaned.load(Ordering::SeqCst) {
            lock_std(&self.repo.live).remove(&self.path);
        }
    }
}

impl Worktree {
    /// Removes the worktree (force), deletes the local branch, prunes worktree metadata (the
    /// owner record goes with it). Idempotent: once it has succeeded, later calls do nothing.
    /// A failed attempt can be retried.
    pub async fn cleanup(&self) -> Result<()> {
        let s = &self.state;
        if s.cleaned.load(Ordering::SeqCst) {
            return Ok(());
        }
        s.repo
            .remove_session(&s.path, &s.branch)
            .await
            .map_err(|e| {
                provision_error(format!(
                    "cannot remove worktree {} and branch '{}'",
                    s.path.display(),
                    s.branch
                ))
                .with_cause(e)
            })?;
        s.cleaned.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether [`Worktree::cleanup`] has completed.
    pub fn is_cleaned(&self) -> bool {
        self.state.cleaned.load(Ordering::SeqCst)
    }
}

/// Branch names are validated elsewhere; this only guarantees the worktree path stays inside
/// `.worktrees/` whatever string arrives.
fn check_branch_path(branch: &str) -> Result<()> {
    let p = Path::new(branch);
    let ok = !branch.is_empty()
        && !branch.contains('\0')
        && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(AdapterError::invalid_params(format!(
            "branch name {branch:?} cannot be used as a worktree path"
        )))
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// git prints paths as raw bytes: exact on Unix; on Windows git writes UTF-8.
#[cfg(unix)]
fn path_from_bytes(p: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(p))
}

#[cfg(not(unix))]
fn path_from_bytes(p: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(p).into_owned())
}

fn parse_worktree_list(raw: &[u8]) -> Vec<ListedWorktree> {
    let mut out = Vec::new();
    let mut cur: Option<ListedWorktree> = None;
    for field in raw.split(|&b| b == 0) {
        if field.is_empty() {
            out.extend(cur.take());
            continue;
        }
        if let Some(p) = field.strip_prefix(b"worktree ") {
            out.extend(cur.take());
            cur = Some(ListedWorktree {
                path: path_from_bytes(p),
                ..Default::default()
            });
        } else if let Some(w) = cur.as_mut() {
            if let Some(b) = field.strip_prefix(b"branch ") {
                w.branch = Some(String::from_utf8_lossy(b).into_owned());
            } else if field == b"locked" {
                w.locked = Some(String::new());
            } else if let Some(r) = field.strip_prefix(b"locked ") {
                w.locked = Some(String::from_utf8_lossy(r).into_owned());
            }
        }
    }
    out.extend(cur);
    out
}

/// Last `cap` bytes of a stream.
struct Tail {
    buf: std::collections::VecDeque<u8>,
    cap: usize,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }
}

/// Kills the setup command's whole process group (yarn's children included) unless disarmed.
struct KillGroup(Option<i32>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pgid) = self.0 {
            // SAFETY: signalling a process group we created; failure (already gone) is fine.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// Runs the setup command in `dir` with exactly `env`, stdin closed, stdout and stderr drained
/// continuously (keeping a bounded tail for the error), in its own process group so a failure
/// or cancellation kills everything it started.
async fn run_setup(
    dir: &Path,
    argv: &[String],
    env: &[(String, String)],
) -> Result<(), CommandError> {
    let display = display_argv(&argv[0], &argv[1..]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandError::spawn(display.clone(), &e))?;
    let mut kill_group = KillGroup(child.id().and_then(|p| i32::try_from(p).ok()));
    let tail = Arc::new(StdMutex::new(Tail {
        buf: Default::default(),
        cap: SETUP_OUTPUT_TAIL,
    }));
    let mut pumps = Vec::new();
    let readers: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
        Box::new(child.stdout.take().expect("stdout piped")),
        Box::new(child.stderr.take().expect("stderr piped")),
    ];
    for mut r in readers {
        let tail = tail.clone();
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => lock_std(&tail).push(&buf[..n]),
                }
            }
        }));
    }
    let status = child.wait().await;
    let drained = futures::future::join_all(pumps.iter_mut());
    let _ = tokio::time::timeout(PIPE_DRAIN_GRACE, drained).await;
    for p in &pumps {
        p.abort();
    }
    let status = status.map_err(|e| CommandError::spawn(display.clone(), &e))?;
    if status.success() {
        // Leave anything it deliberately started in the background running.
        kill_group.0 = None;
        return Ok(());
    }
    let bytes: Vec<u8> = lock_std(&tail).buf.iter().copied().collect();
    Err(CommandError::from_status(
        display,
        status,
        String::from_utf8_lossy(&bytes).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_only_the_last_bytes() {
        let mut t = Tail {
            buf: Default::default(),
            cap: 4,
        };
        t.push(b"ab");
        t.push(b"cdef");
        assert_eq!(t.buf.iter().copied().collect::<Vec<_>>(), b"cdef");
        t.push(b"0123456789");
        assert_eq!(t.buf.iter().copied().collect::<Vec<_>>(), b"6789");
    }

    #[test]
    fn branch_paths_cannot_escape_the_worktrees_dir() {
        assert!(check_branch_path("feature/x").is_ok());
        for bad in ["", "/etc", "../x", "a/../../b", "./a"] {
            assert!(check_branch_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn worktree_list_parses_locked_reasons_and_branches() {
        let raw = b"worktree /r\0HEAD 1\0branch refs/heads/main\0\0worktree /r/.worktrees/x\0HEAD 1\0branch refs/heads/x\0locked why not\0\0worktree /r/.worktrees/y\0HEAD 1\0detached\0locked\0\0";
        let l = parse_worktree_list(raw);
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].branch.as_deref(), Some("refs/heads/x"));
        assert_eq!(l[1].locked.as_deref(), Some("why not"));
        assert_eq!(l[2].locked.as_deref(), Some(""));
        assert_eq!(l[2].branch, None);
    }
}
