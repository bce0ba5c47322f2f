//! The shared base of a commit and the copy-on-write layers over it: what makes a session's
//! checkout cost the same on a 100,000-file repository as on a small one.
//!
//! **A base** is one checkout of the default branch's commit at
//! `<repoRoot>/.worktrees/.base-<uuid>`: a repository borrowing the repository's objects
//! (`objects/info/alternates`), its config the handful of `core.*` keys `git init` writes, no
//! ref but the default branch (see [`super::view`] for why nothing else of the repository).
//! An Implementor's base also has the repository's `user.*`, has run the `post-checkout` hook
//! and the setup command (`yarn install` once per commit, not once per session) and holds the
//! post-setup snapshot the agents' patches are measured from. A Planner or Reviewer reads a
//! base as its view of the repository, read-only; theirs has no hook or setup run (they never
//! ran one), so the two kinds are distinct bases of one commit.
//!
//! Bases are shared by every sandboxed session of this process on the same (repository,
//! default branch, commit, setup): the first one makes it while the others wait on the slot's
//! lock, so sixteen sessions racing on a new commit make it once; a failure is handed to the
//! sessions that were waiting for that attempt (one failing `yarn install`, not sixteen in a
//! row), later ones try again. A base is removed when its last session ends and it is no longer
//! the default branch's tip (kept for the next session otherwise); a newer base of the same
//! kind removes the unused older ones. Each carries this adapter's owner record like a clone
//! ([`super::record`]), so the sweep of a dead engine removes it ([`super::sweep`]) — after
//! the layers over it, whose work needs it to be read. A base is never removed while a layer's
//! record names it.
//!
//! **Bases outlive the process.** Once complete, a base's record says what it is a checkout
//! of (repository, default branch, commit, the digest of its setup, its snapshot). At
//! `shutdown()` the unused bases whose commit is still the tip get the kept mark; the others
//! go. A later process asked for a base of the same key adopts the kept one instead of checking
//! out again, after checking it: record equal to the key, directory there, HEAD at the commit,
//! the snapshot's tree readable, and its owner gone (a live process's kept base is its own).
//! Adopting takes it under a lock of its record dir ([`claim_kept`]), so two processes never
//! both take it. A base a process died making, or died using, has no kept mark and is swept;
//! a kept one whose commit is no longer the tip is removed by the sweep or by the next base
//! made on that default branch. Only records this adapter wrote are ever read for this.
//!
//! **A layer** is an Implementor's checkout: the overlay of the agent's writes on the base,
//! with a git dir of its own (its parts, mounts and removal: [`super::layer`]), made here over
//! the base it holds ([`RepoGit::make_layer`]).
//!
//! Where the overlay cannot be mounted (another OS, no user namespaces, a kernel before 5.11,
//! bubblewrap missing: the sandbox says, [`Confiner::layers_mountable`]) or `sandbox: false`
//! or `sharedBase: false`, a session gets a full clone as before ([`super::provision`]); the
//! log says once why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
#[cfg(target_os = "linux")]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::command::{run_git, At, CommandError};
use super::confine::{CloneMounts, Confiner};
use super::layer::{remove_tree, Layer};
use super::layer_patch::Verified;
use super::list::object_dirs;
use super::patch::Snapshot;
use super::prepare::prepare_checkout;
use super::record::{write_owner, AdminRecord, BaseRecord, SessionRecord, KEPT_FILE};
use super::repo::{
    cancelled, lock_std, provision_error, LiveCheckout, ProvisionGuard, RepoGit, WORKTREES_DIR,
};
use crate::error::{ErrorCode, Result};
use crate::process::Owner;

/// The name every base directory starts with (a ref component cannot: no branch has it).
pub const BASE_PREFIX: &str = ".base-";

/// How an Implementor's base is prepared after its checkout.
#[derive(Debug, Clone)]
pub(crate) struct Preparation {
    /// The setup command's argv; None or empty: no setup.
    pub setup: Option<Vec<String>>,
    /// The setup command's whole environment.
    pub env: Vec<(String, String)>,
    /// Bound on the hook and on the setup command.
    pub timeout: Duration,
}

impl Preparation {
    /// Bases made with different setups (or environments) are different bases. A digest: the
    /// key is written in the base's record (the environment may hold secrets).
    fn key(&self) -> String {
        let json = serde_json::to_string(&(&self.setup, &self.env)).unwrap_or_default();
        match git2::Oid::hash_object(git2::ObjectType::Blob, json.as_bytes()) {
            Ok(oid) => oid.to_string(),
            // Never seen; a key that matches nothing costs a base of its own, never a wrong one.
            Err(_) => uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// (repository root, default branch as configured, commit, preparation key; None: a view).
type BaseKey = (PathBuf, String, String, Option<String>);

/// One checked-out base.
pub(crate) struct Base {
    pub path: PathBuf,
    pub commit: String,
    /// The post-setup snapshot (prepared bases only).
    pub snapshot: Option<Snapshot>,
    /// The configured default branch (what "still the tip" is asked of).
    default_branch: String,
    /// None: a private base (an unsandboxed Planner's), never shared.
    key: Option<BaseKey>,
    checkout: LiveCheckout,
    /// Its verification for extractions that read only what a layer changed
    /// ([`super::layer_patch`]): unset until done, then whether it holds.
    verified: Verification,
}

/// A base's verification (see [`Base`]).
pub(crate) type Verification = Arc<tokio::sync::OnceCell<Option<Arc<Verified>>>>;

#[derive(Default)]
struct SlotState {
    base: Option<Arc<Base>>,
    /// The last failed attempt: which one (see [`Slot::attempts`]) and its error.
    failed: Option<(u64, crate::error::AdapterError)>,
}

impl SlotState {
    /// Its base, when no session holds it (only the slot does).
    fn unused(&self) -> Option<&Arc<Base>> {
        self.base.as_ref().filter(|b| Arc::strong_count(b) == 1)
    }
}

#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
    /// Attempts at making the base that have ended.
    attempts: AtomicU64,
}

fn slots() -> &'static StdMutex<HashMap<BaseKey, Arc<Slot>>> {
    static SLOTS: OnceLock<StdMutex<HashMap<BaseKey, Arc<Slot>>>> = OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

/// A session's hold on a base. Released with [`BaseShare::release`]; dropped unreleased, it
/// is released in the background.
pub struct BaseShare {
    base: Option<Arc<Base>>,
    path: PathBuf,
    commit: String,
    snapshot: Option<Snapshot>,
    verified: Verification,
}

impl std::fmt::Debug for BaseShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseShare")
            .field("path", &self.path)
            .field("commit", &self.commit)
            .finish()
    }
}

impl BaseShare {
    fn of(base: Arc<Base>) -> BaseShare {
        BaseShare {
            path: base.path.clone(),
            commit: base.commit.clone(),
            snapshot: base.snapshot.clone(),
            verified: base.verified.clone(),
            base: Some(base),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn commit(&self) -> &str {
        &self.commit
    }

    pub(crate) fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    /// Its verification for extractions from layers ([`Base`]).
    pub(crate) fn verification(&self) -> &Verification {
        &self.verified
    }

    /// Gives up this hold; the base goes if nobody else holds it and it is not kept (module
    /// docs). Idempotent.
    pub async fn release(&mut self) -> Result<()> {
        match self.base.take() {
            Some(base) => release(base).await,
            None => Ok(()),
        }
    }
}

impl Drop for BaseShare {
    fn drop(&mut self) {
        let Some(base) = self.base.take() else {
            return;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = release(base).await {
                    tracing::warn!(error = %e, "releasing a base failed");
                }
            });
        }
        // No runtime left: the base is no longer live once its value is gone, so the next
        // sweep removes it.
    }
}

async fn release(base: Arc<Base>) -> Result<()> {
    let Some(key) = base.key.clone() else {
        return match Arc::into_inner(base) {
            Some(b) => retire(b).await,
            None => Ok(()),
        };
    };
    let slot = lock_std(slots()).get(&key).cloned();
    drop(base);
    let Some(slot) = slot else { return Ok(()) };
    let mut state = slot.state.lock().await;
    let Some(b) = state.unused() else {
        return Ok(());
    };
    let tip = b.checkout.repo.resolve_commit(&b.default_branch).await.ok();
    if tip.as_deref() == Some(b.commit.as_str()) {
        return Ok(());
    }
    match state.base.take().and_then(Arc::into_inner) {
        Some(b) => retire(b).await,
        None => Ok(()),
    }
}

/// Removes a base nobody holds, unless a layer's record still names it (a checkout kept
/// because its work could not be read, or being swept): then it is left to the sweep, which
/// removes it after that layer.
async fn retire(base: Base) -> Result<()> {
    let repo = &base.checkout.repo;
    if repo.layers_on(&base.path).await {
        return Ok(());
    }
    // Unmarked first: a removal cut short by a crash leaves a base no process adopts.
    if let Ok(admin) = repo.record_dir(&base.path).await {
        let _ = std::fs::remove_file(admin.join(KEPT_FILE));
    }
    base.checkout.remove().await
}

impl RepoGit {
    /// A hold on the base of `commit` (module docs): the shared one, made now if there is none,
    /// or, unless `shared`, a private one. `prep`: an Implementor's (hook, setup, snapshot);
    /// None: a view. `stop` ends the wait and the making (what was made is removed).
    pub(crate) async fn base(
        &self,
        default_branch: &str,
        commit: &str,
        prep: Option<&Preparation>,
        shared: bool,
        session: &SessionRecord,
        stop: &CancellationToken,
    ) -> Result<BaseShare> {
        if !shared {
            let base = self
                .make_base(default_branch, commit, prep, None, session, stop)
                .await?;
            return Ok(BaseShare::of(Arc::new(base)));
        }
        let key: BaseKey = (
            self.root.clone(),
            default_branch.to_string(),
            commit.to_string(),
            prep.map(Preparation::key),
        );
        let slot = {
            let mut all = lock_std(slots());
            // Slots nobody waits on and that hold nothing.
            all.retain(|_, s| {
                Arc::strong_count(s) > 1 || s.state.try_lock().map_or(true, |st| st.base.is_some())
            });
            all.entry(key.clone()).or_default().clone()
        };
        let arrived = slot.attempts.load(Ordering::SeqCst);
        let mut state = tokio::select! {
            s = slot.state.lock() => s,
            _ = stop.cancelled() => return Err(cancelled()),
        };
        if let Some(b) = &state.base {
            return Ok(BaseShare::of(b.clone()));
        }
        if let Some((attempt, e)) = &state.failed {
            if *attempt > arrived {
                return Err(e.clone());
            }
        }
        let made = match self.adopt(&key, prep.is_some()).await {
            Some(base) => Ok(base),
            None => {
                self.make_base(
                    default_branch,
                    commit,
                    prep,
                    Some(key.clone()),
                    session,
                    stop,
                )
                .await
            }
        };
        let attempt = slot.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        match made {
            Ok(base) => {
                let base = Arc::new(base);
                state.base = Some(base.clone());
                state.failed = None;
                drop(state);
                // In the background: removing a checkout of the old tip (a second for 100,000
                // files) is no part of this session's start.
                let repo = self.arc();
                tokio::spawn(async move { repo.retire_older_bases(&key).await });
                Ok(BaseShare::of(base))
            }
            Err(e) => {
                // A stopped attempt says nothing about the next one.
                if e.code != ErrorCode::Cancelled {
                    state.failed = Some((attempt, e.clone()));
                }
                Err(e)
            }
        }
    }

    /// Removes the unused bases of the same kind as `key` on other commits: a new tip has
    /// its own now. Likewise every base a gone process kept for a tip of this default branch
    /// that is not this commit (any kind: none can be adopted any more).
    async fn retire_older_bases(&self, key: &BaseKey) {
        let older: Vec<Arc<Slot>> = lock_std(slots())
            .iter()
            .filter(|(k, _)| k.0 == key.0 && k.1 == key.1 && k.3 == key.3 && k.2 != key.2)
            .map(|(_, s)| s.clone())
            .collect();
        self.retire_unused(older).await;
        for (path, admin, record) in self.kept_bases().await {
            let Some(b) = &record.base else { continue };
            if b.default_branch != key.1 || record.base_commit == key.2 {
                continue;
            }
            if claim_kept(&admin, &self.owner).await {
                self.remove_claimed(&path).await;
            }
        }
    }

    /// At `shutdown()`: every unused base of this repository goes, but the tip's, which stay
    /// marked kept (module docs) so the next process adopts them instead of checking out again;
    /// in this process they stay shared.
    pub async fn keep_tip_bases(&self) {
        let mine = self.slots_of_repository();
        let mut other = Vec::new();
        for slot in mine {
            let kept = {
                let Ok(state) = slot.state.try_lock() else {
                    continue;
                };
                match state.unused() {
                    Some(b) => self.mark_kept(b).await,
                    None => continue,
                }
            };
            if !kept {
                other.push(slot);
            }
        }
        self.retire_unused(other).await;
    }

    /// Marks `base` kept when it is complete and its commit is the tip; whether it is.
    async fn mark_kept(&self, base: &Base) -> bool {
        let tip = self.resolve_commit(&base.default_branch).await.ok();
        if tip.as_deref() != Some(base.commit.as_str()) {
            return false;
        }
        let Ok(admin) = self.record_dir(&base.path).await else {
            return false;
        };
        if AdminRecord::read(&admin).and_then(|r| r.base).is_none() {
            return false;
        }
        match std::fs::write(admin.join(KEPT_FILE), b"") {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(base = %base.path.display(), error = %e, "could not mark the tip's base kept for the next process; removing it");
                false
            }
        }
    }

    /// The bases of this repository marked kept, with their record dirs and records (the
    /// owner may be gone or not: see [`claim_kept`]).
    pub(crate) async fn kept_bases(&self) -> Vec<(PathBuf, PathBuf, AdminRecord)> {
        let Ok(common) = self.common_dir().await else {
            return Vec::new();
        };
        let root = self.root.to_str();
        super::list::clones(&common)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| is_base(&c.path) && c.admin.join(KEPT_FILE).exists())
            .filter_map(|c| {
                let record = AdminRecord::read(&c.admin)?;
                let ours = record
                    .base
                    .as_ref()
                    .is_some_and(|b| Some(b.repository.as_str()) == root);
                ours.then_some((c.path, c.admin, record))
            })
            .collect()
    }

    /// Whether a base a gone process kept is the checkout of its default branch's tip now (a
    /// sweep leaves it for adoption).
    pub(crate) async fn kept_for_tip(&self, admin: &Path) -> bool {
        let Some(record) = AdminRecord::read(admin) else {
            return false;
        };
        let Some(b) = record.base.filter(|_| admin.join(KEPT_FILE).exists()) else {
            return false;
        };
        Some(b.repository.as_str()) == self.root.to_str()
            && self.resolve_commit(&b.default_branch).await.ok() == Some(record.base_commit)
    }

    /// The base a gone process kept for `key` (module docs), now this process's; None when
    /// there is none that checks out. One that matches but does not check out is removed.
    async fn adopt(&self, key: &BaseKey, prepared: bool) -> Option<Base> {
        for (path, admin, record) in self.kept_bases().await {
            let Some(b) = &record.base else { continue };
            let matches =
                b.default_branch == key.1 && record.base_commit == key.2 && b.setup == key.3;
            if !matches {
                continue;
            }
            let snapshot = match (&b.snapshot_tree, b.snapshot_taken) {
                (Some(tree), Some(taken)) => Some(Snapshot {
                    tree: tree.clone(),
                    taken,
                }),
                _ => None,
            };
            let sound = snapshot.is_some() == prepared
                && self.checks_out(&path, &key.2, snapshot.as_ref()).await;
            if !claim_kept(&admin, &self.owner).await {
                continue;
            }
            if !sound {
                tracing::info!(base = %path.display(), "a kept base does not hold what its record says; removed");
                self.remove_claimed(&path).await;
                continue;
            }
            lock_std(&self.live).insert(path.clone());
            tracing::info!(base = %path.display(), commit = %key.2, "adopted the base a previous process kept for the tip");
            return Some(Base {
                path: path.clone(),
                commit: key.2.clone(),
                snapshot,
                default_branch: key.1.clone(),
                key: Some(key.clone()),
                checkout: LiveCheckout::new(self.arc(), path),
                // Verified again by this process, as a base it made would be.
                verified: Verification::default(),
            });
        }
        None
    }

    /// Whether the base at `path` is what its record says: there with its index, its HEAD at
    /// `commit`, and its snapshot's tree readable.
    async fn checks_out(&self, path: &Path, commit: &str, snapshot: Option<&Snapshot>) -> bool {
        if !path.join(".git/index").is_file() {
            return false;
        }
        let head = run_git(path, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]).await;
        if !head.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == commit) {
            return false;
        }
        match snapshot {
            Some(s) => run_git(path, &["cat-file", "-e", &format!("{}^{{tree}}", s.tree)])
                .await
                .is_ok(),
            None => true,
        }
    }

    /// Removes a base this process claimed from a gone one, unless a layer's record names it.
    async fn remove_claimed(&self, path: &Path) {
        if self.layers_on(path).await {
            return;
        }
        if let Err(e) = self.remove_session(path).await {
            tracing::warn!(base = %path.display(), error = %e, "could not remove a base a previous process kept");
        }
    }

    /// Removes every unused base of this repository (`shutdown({ keepBases: false })`).
    pub async fn release_unused_bases(&self) {
        let mine = self.slots_of_repository();
        self.retire_unused(mine).await;
    }

    /// This process's base slots of this repository, every kind and commit.
    fn slots_of_repository(&self) -> Vec<Arc<Slot>> {
        lock_std(slots())
            .iter()
            .filter(|(k, _)| k.0 == self.root)
            .map(|(_, s)| s.clone())
            .collect()
    }

    async fn retire_unused(&self, slots: Vec<Arc<Slot>>) {
        for slot in slots {
            let Ok(mut state) = slot.state.try_lock() else {
                continue;
            };
            if state.unused().is_none() {
                continue;
            }
            if let Some(b) = state.base.take().and_then(Arc::into_inner) {
                let path = b.path.clone();
                if let Err(e) = retire(b).await {
                    tracing::warn!(base = %path.display(), error = %e, "could not remove an unused base");
                }
            }
        }
    }

    /// Whether a layer's record names the base at `base`.
    pub(crate) async fn layers_on(&self, base: &Path) -> bool {
        let Ok(common) = self.common_dir().await else {
            return true;
        };
        let Ok(records) = super::list::clones(&common) else {
            return true;
        };
        records
            .iter()
            .any(|c| c.layer.as_ref().is_some_and(|l| Path::new(&l.base) == base))
    }

    /// Claims, records and makes a base; removes what it made if it fails or is stopped.
    async fn make_base(
        &self,
        default_branch: &str,
        commit: &str,
        prep: Option<&Preparation>,
        key: Option<BaseKey>,
        session: &SessionRecord,
        stop: &CancellationToken,
    ) -> Result<Base> {
        let path = self
            .root
            .join(WORKTREES_DIR)
            .join(format!("{BASE_PREFIX}{}", uuid::Uuid::new_v4()));
        {
            let _guard = tokio::select! {
                g = self.lock.lock() => g,
                _ = stop.cancelled() => return Err(cancelled()),
            };
            self.ensure_excluded().await?;
            let mut record = AdminRecord::new(session, default_branch, commit);
            record.path = path.to_str().map(str::to_string);
            self.record_clone(&path, &record).await?;
        }
        // From here on any failure (or the future being dropped) removes what was made.
        let mut guard = ProvisionGuard::new(self, &path);
        let branch = self.local_branch(default_branch);
        let made = tokio::select! {
            r = self.check_out(&path, commit, branch.as_deref()) => r.map_err(|e| {
                provision_error(format!("cannot check out the base at {}", path.display()))
                    .with_cause(e)
            }),
            _ = stop.cancelled() => Err(cancelled()),
        };
        let prepared = match (made, prep) {
            (Ok(()), Some(p)) => prepare_checkout(
                self,
                &path,
                commit,
                p.setup.as_deref(),
                &p.env,
                p.timeout,
                stop,
            )
            .await
            .map(Some),
            (made, _) => made.map(|()| None),
        };
        let snapshot = match prepared {
            Ok(s) => s,
            Err(e) => {
                guard.rollback().await;
                return Err(if stop.is_cancelled() { cancelled() } else { e });
            }
        };
        if let Some(k) = &key {
            self.note_complete(&path, k, snapshot.as_ref()).await;
        }
        guard.disarm();
        Ok(Base {
            path: path.clone(),
            commit: commit.to_string(),
            snapshot,
            default_branch: default_branch.to_string(),
            key,
            checkout: LiveCheckout::new(self.arc(), path),
            verified: Verification::default(),
        })
    }

    /// Writes what the complete base at `path` is into its record (module docs): from now on
    /// a later process may adopt it once it is kept. Unwritten, it is merely never adopted.
    async fn note_complete(&self, path: &Path, key: &BaseKey, snapshot: Option<&Snapshot>) {
        let noted = async {
            let admin = self.record_dir(path).await.ok()?;
            let mut record = AdminRecord::read(&admin)?;
            record.base = Some(BaseRecord {
                repository: key.0.to_str()?.to_string(),
                default_branch: key.1.clone(),
                setup: key.3.clone(),
                snapshot_tree: snapshot.map(|s| s.tree.clone()),
                snapshot_taken: snapshot.map(|s| s.taken),
            });
            record.write(&admin).ok()
        };
        if noted.await.is_none() {
            tracing::warn!(base = %path.display(), "could not record what the base is; no later process will adopt it");
        }
    }

    /// `rev` when it is a branch of the repository (the base then has that branch checked
    /// out, as the agent would expect); None for any other revision (a detached HEAD).
    fn local_branch(&self, rev: &str) -> Option<String> {
        let repo = git2::Repository::open(&self.root).ok()?;
        let name = format!("refs/heads/{rev}");
        repo.find_reference(&name).ok().map(|_| name)
    }

    /// A repository at `path` borrowing the repository's objects, its HEAD (on `branch` when
    /// given) at `commit`, checked out. Every git here dies with the future (a stop drops it).
    async fn check_out(
        &self,
        path: &Path,
        commit: &str,
        branch: Option<&str>,
    ) -> std::result::Result<(), CommandError> {
        self.init_borrowing(path).await?;
        match branch {
            Some(b) => {
                run_git(path, &["update-ref", b, commit]).await?;
                run_git(path, &["symbolic-ref", "HEAD", b]).await?;
            }
            None => {
                run_git(path, &["update-ref", "--no-deref", "HEAD", commit]).await?;
            }
        }
        run_git(
            path,
            &["reset", "--hard", "--no-recurse-submodules", "--quiet"],
        )
        .await?;
        Ok(())
    }

    /// Verifies `base` once, in the background, for the extractions of the layers over it
    /// ([`super::layer_patch::verify`]): on a layer with nothing written, made for this in a
    /// temp directory of this process, in the jail an extraction runs in. Until it is done,
    /// and where it does not hold, extractions take the full path.
    pub(crate) async fn verify_in_background(&self, base: &BaseShare, sandbox: &dyn Confiner) {
        let cell = base.verification().clone();
        let Some(snapshot) = base.snapshot().cloned() else {
            return;
        };
        let commit = base.commit.clone();
        if cell.initialized() || !sandbox.confines().await {
            return;
        }
        let Ok(common) = self.git_dir().await else {
            return;
        };
        let Ok(scratch) = crate::scratch::ScratchDir::create("verify") else {
            return;
        };
        let layer = Layer {
            base: base.path().to_path_buf(),
            dir: scratch.path().join("layer"),
        };
        let target = scratch.path().join("checkout");
        let jail = sandbox.confine(&CloneMounts {
            clone: target.clone(),
            objects: object_dirs(&common),
            layer: Some(layer.mounts(&target)),
        });
        tokio::spawn(async move {
            cell.get_or_init(|| async {
                layer.create(&target).ok()?;
                let at = At {
                    dir: &target,
                    jail: Some(jail.as_ref()),
                };
                super::layer_patch::verify(at, &layer, &commit, &snapshot)
                    .await
                    .map(Arc::new)
            })
            .await;
            // overlayfs leaves its work directory unreadable; `remove_tree` copes.
            let _ = remove_tree(scratch.path());
            drop(scratch);
        });
    }

    /// Makes the layer of an Implementor's checkout at `target` over `base` (module docs),
    /// recorded (with the base's snapshot) under the claim `record_dir` already holds.
    /// On failure the caller's rollback removes it.
    pub(crate) async fn make_layer(
        &self,
        base: &BaseShare,
        target: &Path,
        branch: &str,
        session: &SessionRecord,
    ) -> Result<(Layer, Snapshot)> {
        let mut record = AdminRecord::new(session, branch, base.commit());
        record.path = target.to_str().map(str::to_string);
        let layer = Layer::new(base.path(), &self.root.join(WORKTREES_DIR));
        record.layer = Some(layer.record());
        let snapshot = base
            .snapshot()
            .cloned()
            .ok_or_else(|| provision_error("the base has no snapshot"))?;
        record.snapshot_tree = Some(snapshot.tree.clone());
        record.snapshot_taken = Some(snapshot.taken);
        let record_dir = self.record_dir(target).await?;
        // Recorded before anything is made, so a rollback or a sweep finds the layer.
        record
            .write(&record_dir)
            .map_err(|e| provision_error("cannot record the checkout's layer").with_cause(e))?;
        let failed = |e: std::io::Error| {
            provision_error(format!("cannot make the layer at {}", layer.dir.display()))
                .with_cause(e)
        };
        layer.create(target).map_err(failed)?;
        let git_dir = layer.git_dir();
        let head = format!("refs/heads/{branch}");
        let git = |args: Vec<&str>| {
            let mut all = vec!["--git-dir".as_ref(), git_dir.as_os_str()];
            all.extend(args.into_iter().map(std::ffi::OsStr::new));
            all.into_iter()
                .map(|a| a.to_os_string())
                .collect::<Vec<_>>()
        };
        // The layer's git dir has no ref but the session's branch (refs are not copied from
        // the base).
        let steps = async {
            run_git(&self.root, &git(vec!["update-ref", &head, &base.commit])).await?;
            run_git(&self.root, &git(vec!["symbolic-ref", "HEAD", &head])).await?;
            Ok::<(), CommandError>(())
        };
        steps.await.map_err(|e| {
            provision_error(format!("cannot set up the branch in {}", git_dir.display()))
                .with_cause(e)
        })?;
        Ok((layer, snapshot))
    }
}

/// Whether the layer of checkouts can be mounted here (the sandbox mounts it, so it is asked),
/// said once in the log when not.
pub(crate) async fn layers_work(root: &Path, sandbox: &dyn Confiner) -> bool {
    #[cfg(target_os = "linux")]
    {
        static SAID: AtomicBool = AtomicBool::new(false);
        match sandbox.layers_mountable(&root.join(WORKTREES_DIR)).await {
            Ok(()) => true,
            Err(why) => {
                if !SAID.swap(true, Ordering::SeqCst) {
                    tracing::warn!(reason = %why, "Implementors get full clones: a copy-on-write layer over a shared base cannot be mounted here");
                }
                false
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (root, sandbox);
        false
    }
}

/// Whether `path` is a base's directory (by its name).
pub(crate) fn is_base(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(BASE_PREFIX))
}

/// Takes the kept base whose record dir is `admin` for `me`, when it is still kept and its
/// owner is gone (or `me`): the owner record becomes `me`'s and the kept mark goes. Under an
/// exclusive lock of the record dir (flock, released by the kernel if this process dies), so
/// of processes adopting or sweeping it at once exactly one takes it; the others see it owned
/// by a live process.
pub(crate) async fn claim_kept(admin: &Path, me: &Owner) -> bool {
    let (admin, me) = (admin.to_path_buf(), me.clone());
    tokio::task::spawn_blocking(move || {
        let Ok(dir) = std::fs::File::open(&admin) else {
            return false;
        };
        if dir.lock().is_err() {
            return false;
        }
        let kept = admin.join(KEPT_FILE);
        let owner = std::fs::read_to_string(admin.join("locked"))
            .ok()
            .and_then(|r| Owner::parse(&r));
        let free = kept.exists() && owner.is_some_and(|o| o == me || !o.is_alive());
        free && write_owner(&me, &admin).is_ok() && std::fs::remove_file(&kept).is_ok()
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record dir whose base is kept (or not) by `owner`.
    fn record_dir(owner: &Owner, kept: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write_owner(owner, dir.path()).unwrap();
        if kept {
            std::fs::write(dir.path().join(KEPT_FILE), b"").unwrap();
        }
        dir
    }

    fn owner_of(dir: &Path) -> Option<Owner> {
        Owner::parse(&std::fs::read_to_string(dir.join("locked")).unwrap())
    }

    #[tokio::test]
    async fn a_kept_base_of_a_gone_process_is_claimed_once_and_becomes_the_claimers() {
        let gone = Owner::on_this_host(std::process::id(), 1);
        let dir = record_dir(&gone, true);
        let me = Owner::current();
        let (a, b) = tokio::join!(claim_kept(dir.path(), &me), claim_kept(dir.path(), &me));
        assert!(a ^ b, "exactly one claim wins: {a} {b}");
        assert_eq!(owner_of(dir.path()), Some(me));
        assert!(!dir.path().join(KEPT_FILE).exists());
    }

    #[tokio::test]
    async fn a_base_kept_by_a_live_process_or_not_kept_is_not_claimed() {
        let me = Owner::current();
        let live = Owner::of_pid(1).expect("pid 1 runs");
        let kept_by_live = record_dir(&live, true);
        assert!(!claim_kept(kept_by_live.path(), &me).await);
        assert_eq!(owner_of(kept_by_live.path()), Some(live));
        assert!(kept_by_live.path().join(KEPT_FILE).exists());

        let unkept = record_dir(&Owner::on_this_host(std::process::id(), 1), false);
        assert!(!claim_kept(unkept.path(), &me).await);
    }
}
