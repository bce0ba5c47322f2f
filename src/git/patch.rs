//! The agent's work as one `git diff --binary` style patch.
//!
//! What counts as the agent's work: provisioning snapshots the worktree once the checkout hook
//! and the setup command are done ([`snapshot`]: a tree object of everything in it). At
//! extraction only paths whose content differs between that snapshot and the final state are
//! the agent's; for those paths the patch goes from the session's base commit to the final state,
//! so it still applies with `git apply --index` on the base commit. What the setup wrote or
//! changed (`install-state.txt`, a lockfile) is left out unless the agent changed the same path
//! again; an agent that changed nothing relative to the snapshot gets an empty patch.
//!
//! How: the worktree's index is copied to a temporary index file (keeping its stat cache, so only
//! files that changed are re-hashed; the agent wrote that file, so it is opened without following
//! a symlink or blocking on a FIFO, and copied only when it is a regular file of bounded size:
//! [`TempIndex::copy_of`]), `git add -A` stages everything into that copy
//! (`GIT_INDEX_FILE`; the agent's own index is never touched) and `git write-tree` names the
//! final tree. `git diff-tree` between snapshot and final lists the agent's paths; a second
//! temporary index is the base tree with exactly those entries replaced
//! (`read-tree` + `update-index --index-info`), and `git diff-tree --binary -M` from the base
//! tree to that tree prints the patch. Staging with git itself means the patch is what git would
//! commit: `.gitignore` honoured, `.gitattributes` eol conversion and clean filters (Git LFS)
//! applied. Plumbing only (all in git 2.30), so user configuration (`diff.noprefix`,
//! `diff.external`, colour, textconv) cannot change the format; non-UTF-8 content is handled by
//! [`super::binary`].
//!
//! What the stat cache is trusted for. Git judges a file unchanged when its stat data (mtime,
//! ctime, size, inode) matches the index entry, except for a "racily clean" entry, one whose
//! mtime is not older than the index file itself: that one it compares by content. A copy of the
//! index is a new file with a new mtime, which made every entry look safely older than the index:
//! a same-size edit in the second of the checkout (`printf … > src/index.js`) matched its entry
//! and was judged unchanged, and the agent's work was lost. So the copy's mtime is set to
//! [`stat_trust_limit`]: the original's, and never later than shortly before the snapshot, so
//! that every entry git recorded at or after the snapshot is compared by content, and an older
//! entry matches only a file whose ctime (which no user can set back) is older than the snapshot.
//! The settings that would let git trust stat data further (`core.checkStat=minimal`,
//! `core.trustctime=false`, `core.ignoreStat`, the untracked cache) are overridden on every
//! command ([`super::command`]), and `update-index --really-refresh` clears "assume unchanged"
//! bits in the copy, which `git add -A` would otherwise honour by not looking at the file at all.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::binary::binarize_non_utf8;
use super::command::{run, run_with_input, At, CommandError};
use super::list::admin_dir_of;
use super::setup::seconds;
use crate::error::{AdapterError, Result};

const NULL_OID: &str = "0000000000000000000000000000000000000000";

/// The largest index file extraction copies. An index takes about 100 bytes per tracked file
/// (a checkout of a million files: ~100 MB); a bigger file is refused rather than copied (a
/// sparse file of terabytes would otherwise be written out densely).
pub(crate) const MAX_INDEX_BYTES: u64 = 512 << 20;

/// The `ERR_EXTRACT` for an extraction that ran past `config.extractionTimeout` (its git and
/// everything that git started have been killed by then: dropping a run kills its tree).
pub(crate) fn timed_out(worktree: &Path, limit: Duration) -> AdapterError {
    AdapterError::extract(format!(
        "reading the work out of {} did not finish within {} (config.extractionTimeout); git \
         and everything it started were killed",
        worktree.display(),
        seconds(limit)
    ))
}

/// How far before the snapshot an index entry's stat data stops being trusted: a margin for
/// file systems whose timestamps are coarser than git's one-second comparison (FAT: 2 s).
pub(crate) const STAT_TRUST_MARGIN_SECS: u64 = 2;

/// The worktree after its setup step: the tree the agent's work is measured against, and the
/// time (Unix seconds, before the tree was staged) that bounds what the stat cache is trusted
/// for afterwards (see the module docs).
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub tree: String,
    pub taken: u64,
}

/// The latest index timestamp extraction lets git see for a worktree snapshotted at `taken`
/// (Unix seconds; `None`: unknown, as for a record an older version wrote, so nothing is
/// trusted): entries recorded at or after it are compared by content. Never 0, which git reads
/// as "no timestamp" and then trusts every entry.
pub(crate) fn stat_trust_limit(taken: Option<u64>) -> u64 {
    taken.map_or(1, |t| t.saturating_sub(STAT_TRUST_MARGIN_SECS).max(1))
}

/// Everything in `worktree` now (what `git add -A` would stage), as a [`Snapshot`].
pub(crate) async fn snapshot(worktree: At<'_>) -> Result<Snapshot> {
    let taken = unix_now();
    // The index as git left it after checkout and setup, its own mtime kept: git's racy-clean
    // rule then applies exactly as it would in the worktree itself.
    let temp = TempIndex::copy_of(&index_path(worktree)?, None)?;
    let tree = stage_all(worktree, &temp.path).await?;
    Ok(Snapshot { tree, taken })
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The patch from `base` (a commit) to the worktree's files now, limited to the paths that
/// differ from the `since` snapshot tree when one is given (see the module docs). Index stat
/// data is trusted only when older than `trust_before` ([`stat_trust_limit`]). Empty when
/// nothing counts. Failures carry `ERR_EXTRACT` with git's error as cause. Unbounded: callers
/// bound it (dropping the future kills the git it runs).
pub(crate) async fn agent_patch(
    worktree: At<'_>,
    base: &str,
    since: Option<&str>,
    trust_before: u64,
) -> Result<String> {
    let index = index_path(worktree)?;
    let final_tree = {
        let temp = TempIndex::copy_of(&index, Some(trust_before))?;
        stage_all(worktree, &temp.path).await?
    };
    patch_of_trees(worktree, &index, base, since, &final_tree).await
}

/// The patch from `base` (a commit) to `final_tree`, limited to the paths that differ from the
/// `since` tree when one is given: [`agent_patch`] once the worktree is staged, and the
/// remote backends' extraction, which brings the snapshot and final trees of a checkout
/// elsewhere into a local repository — one computation, so the bytes are the same wherever the
/// agent ran. `index` names where the temporary index goes (beside it).
pub(crate) async fn patch_of_trees(
    worktree: At<'_>,
    index: &Path,
    base: &str,
    since: Option<&str>,
    final_tree: &str,
) -> Result<String> {
    let final_tree = final_tree.to_string();
    match since {
        None => diff(worktree, base, &final_tree).await,
        // A snapshot that is the base's own tree (no setup changed a tracked file): the base
        // with the changes since the snapshot applied is the final tree itself, which the
        // overlay would build again in an index of the whole tree (100,000 files: ~0.3 s).
        Some(snapshot) if tree_of(worktree, base).await.as_deref() == Some(snapshot) => {
            diff(worktree, base, &final_tree).await
        }
        Some(snapshot) => {
            let changes = changed_entries(worktree, snapshot, &final_tree).await?;
            patch_of_changes(worktree, index, base, changes).await
        }
    }
}

/// The tree `commit` names; None when git cannot say (the caller then takes the general way).
pub(crate) async fn tree_of(worktree: At<'_>, commit: &str) -> Option<String> {
    let spec = format!("{commit}^{{tree}}");
    let out = run(
        worktree.git(&["rev-parse", "--verify", "-q", &spec]),
        format!("git rev-parse {spec}"),
    )
    .await
    .ok()?;
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

/// The patch from `base` (a commit) for `changes`, the `update-index -z --index-info` records
/// of the paths the agent changed (mode 0: removed); empty when there are none. The second
/// half of [`patch_of_trees`], which [`super::layer_patch`] reaches with the records it made
/// itself.
pub(crate) async fn patch_of_changes(
    worktree: At<'_>,
    index: &Path,
    base: &str,
    changes: Vec<u8>,
) -> Result<String> {
    if changes.is_empty() {
        return Ok(String::new());
    }
    let target = overlay(worktree, index, base, changes).await?;
    diff(worktree, base, &target).await
}

/// `git add -A` into `index`, then `git write-tree`: the tree's hex oid. Every git step here
/// runs in the clone's sandbox when it has one: not only staging (clean filters) but any
/// command that reads an index runs the clone's `core.fsmonitor` (measured: `write-tree` does).
/// First `update-index --really-refresh`: it clears the "assume unchanged" bits (`git add -A`
/// skips such a file whatever its content) and, with `-q`, goes on past modified files.
pub(crate) async fn stage_all(worktree: At<'_>, index: &Path) -> Result<String> {
    git_with_index(
        worktree.git(&["update-index", "-q", "--really-refresh"]),
        index,
        "git update-index -q --really-refresh (temporary index)",
    )
    .await
    .map_err(|e| AdapterError::extract("cannot refresh the temporary index").with_cause(e))?;
    git_with_index(
        worktree.git(&["add", "-A"]),
        index,
        "git add -A (temporary index)",
    )
    .await
    .map_err(|e| {
        AdapterError::extract("cannot stage the worktree into a temporary index").with_cause(e)
    })?;
    write_tree(worktree, index).await
}

pub(crate) async fn write_tree(worktree: At<'_>, index: &Path) -> Result<String> {
    let out = git_with_index(worktree.git(&["write-tree"]), index, "git write-tree")
        .await
        .map_err(|e| AdapterError::extract("cannot write the staged tree").with_cause(e))?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

pub(crate) async fn git_with_index(
    mut cmd: tokio::process::Command,
    index: &Path,
    shown: &str,
) -> Result<Vec<u8>, CommandError> {
    cmd.env("GIT_INDEX_FILE", index);
    Ok(run(cmd, shown.to_string()).await?.stdout)
}

/// `update-index -z --index-info` records that turn the snapshot's entries into the final
/// ones for every path the agent changed: `<mode> <oid>\t<path>`, or mode 0 to remove.
async fn changed_entries(worktree: At<'_>, snapshot: &str, final_tree: &str) -> Result<Vec<u8>> {
    let args = [
        "diff-tree",
        "-r",
        "-z",
        "--no-renames",
        snapshot,
        final_tree,
    ];
    let out = run(
        worktree.git(&args),
        "git diff-tree -r -z (snapshot..final)".into(),
    )
    .await
    .map_err(|e| {
        AdapterError::extract("cannot compare the worktree with its snapshot").with_cause(e)
    })?;
    records_of_raw_diff(&out.stdout)
}

/// The `update-index -z --index-info` records of `git diff-tree -r -z --no-renames`'s output
/// (see [`changed_entries`]).
pub(crate) fn records_of_raw_diff(raw: &[u8]) -> Result<Vec<u8>> {
    let mut records = Vec::new();
    let mut fields = raw.split(|&b| b == 0).filter(|f| !f.is_empty());
    while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
        // ":<old mode> <new mode> <old oid> <new oid> <status>"
        let meta = String::from_utf8_lossy(meta);
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [_, mode, _, oid, status] = parts[..] else {
            return Err(AdapterError::extract(format!(
                "unexpected git diff-tree output: {meta}"
            )));
        };
        let entry = if status.starts_with('D') {
            format!("0 {NULL_OID}\t")
        } else {
            format!("{mode} {oid}\t")
        };
        records.extend_from_slice(entry.as_bytes());
        records.extend_from_slice(path);
        records.push(0);
    }
    Ok(records)
}

/// The tree of `base` with `changes` applied (in a temporary index beside the real one).
async fn overlay(worktree: At<'_>, index: &Path, base: &str, changes: Vec<u8>) -> Result<String> {
    let temp = TempIndex::empty_beside(index);
    let fail = |what: &str, e: CommandError| AdapterError::extract(what.to_string()).with_cause(e);
    git_with_index(
        worktree.git(&["read-tree", base]),
        &temp.path,
        "git read-tree <base>",
    )
    .await
    .map_err(|e| fail("cannot read the base commit's tree", e))?;
    let args = [
        "update-index",
        "-z",
        "--add",
        "--remove",
        "--replace",
        "--index-info",
    ];
    let mut cmd = worktree.git(&args);
    cmd.env("GIT_INDEX_FILE", &temp.path);
    run_with_input(cmd, "git update-index -z --index-info".into(), changes)
        .await
        .map_err(|e| fail("cannot apply the agent's changes to the base tree", e))?;
    write_tree(worktree, &temp.path).await
}

/// `git diff-tree --binary -M <base tree> <target tree>`, made UTF-8.
pub(crate) async fn diff(worktree: At<'_>, base: &str, target: &str) -> Result<String> {
    let base_tree = format!("{base}^{{tree}}");
    let args = [
        "-c",
        "core.quotePath=true",
        "diff-tree",
        "-r",
        "--binary",
        // Full object ids on every `index` line: the non-UTF-8 fallback reads blobs by them.
        "--full-index",
        "-M",
        &base_tree,
        target,
    ];
    let out = run(
        worktree.git(&args),
        format!("git diff-tree -r --binary -M {base_tree} {target}"),
    )
    .await
    .map_err(|e| {
        AdapterError::extract("cannot diff the worktree against its base commit").with_cause(e)
    })?;
    match String::from_utf8(out.stdout) {
        Ok(s) => Ok(s),
        Err(e) => binarize_non_utf8(worktree, e.as_bytes()).await,
    }
}

/// The worktree's own index file (`<admin dir>/index` for a linked worktree), found from its
/// `.git` file. A clone's `.git` must be a directory of its own: through a symlink the
/// temporary index would be written wherever it points.
pub(crate) fn index_path(worktree: At<'_>) -> Result<PathBuf> {
    let admin = admin_dir_of(&worktree).map_err(|e| {
        AdapterError::extract(format!("{} is not a git worktree", worktree.display())).with_cause(e)
    })?;
    match std::fs::symlink_metadata(&admin) {
        Ok(m) if m.is_dir() => Ok(admin.join("index")),
        Ok(m) => Err(AdapterError::extract(format!(
            "the git dir {} is {}, not a directory; its work is not read through it",
            admin.display(),
            file_kind(&m)
        ))),
        Err(e) => Err(AdapterError::extract(format!(
            "cannot read the git dir {}",
            admin.display()
        ))
        .with_cause(e)),
    }
}

/// "a symbolic link", "a FIFO", …: what a file that should be a regular one is instead.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Opens the agent's index for reading as what it is: never through a symlink (`O_NOFOLLOW`:
/// `ln -sf ~/.ssh/id_rsa .git/index` must not copy a host file into the checkout) and never
/// waiting on a FIFO's writer (`O_NONBLOCK`); then checks that it is a regular file of at
/// most [`MAX_INDEX_BYTES`]. `None`: there is no index (git treats that as empty).
fn open_index(index: &Path) -> Result<Option<(std::fs::File, u64)>> {
    let refused = |why: String| {
        Err(AdapterError::extract(format!(
            "the checkout's index {} {why}; it is not read",
            index.display()
        )))
    };
    match std::fs::symlink_metadata(index) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(AdapterError::extract("cannot read the worktree's index").with_cause(e))
        }
        Ok(m) if !m.is_file() => {
            return refused(format!("is {}, not a regular file", file_kind(&m)))
        }
        Ok(_) => {}
    }
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let file = open
        .open(index)
        .map_err(|e| AdapterError::extract("cannot open the worktree's index").with_cause(e))?;
    let m = file
        .metadata()
        .map_err(|e| AdapterError::extract("cannot read the worktree's index").with_cause(e))?;
    if !m.is_file() {
        return refused(format!("is {}, not a regular file", file_kind(&m)));
    }
    if m.len() > MAX_INDEX_BYTES {
        return refused(format!(
            "is {} bytes, more than the {MAX_INDEX_BYTES} an index of any real checkout takes",
            m.len()
        ));
    }
    Ok(Some((file, m.len())))
}

/// A temporary index next to the real one (same file system, and split-index shared files
/// resolve), deleted on drop whatever happens.
pub(crate) struct TempIndex {
    pub(crate) path: PathBuf,
}

impl TempIndex {
    pub(crate) fn empty_beside(index: &Path) -> TempIndex {
        let dir = index.parent().unwrap_or(Path::new("."));
        TempIndex {
            path: dir.join(format!("index.patch-{}", uuid::Uuid::new_v4())),
        }
    }

    /// A copy of the index (see [`open_index`] for what is refused), at most the size it had
    /// when it was checked, with the original's mtime, or `not_after` (Unix seconds) when that
    /// is earlier: the timestamp git's racy-clean rule measures entries against (module docs).
    pub(crate) fn copy_of(index: &Path, not_after: Option<u64>) -> Result<TempIndex> {
        let temp = TempIndex::empty_beside(index);
        let Some((file, len)) = open_index(index)? else {
            // No index yet: git treats a missing index file as empty.
            return Ok(temp);
        };
        let copy_failed =
            |e| AdapterError::extract("cannot copy the worktree's index").with_cause(e);
        let mtime = file
            .metadata()
            .and_then(|m| m.modified())
            .map_err(copy_failed)?;
        let mtime = match not_after.map(|s| UNIX_EPOCH + Duration::from_secs(s)) {
            Some(limit) if limit < mtime => limit,
            _ => mtime,
        };
        let mut create = std::fs::OpenOptions::new();
        create.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut create, libc::O_NOFOLLOW);
        create
            .open(&temp.path)
            .and_then(|mut out| {
                std::io::copy(&mut std::io::Read::take(file, len), &mut out)?;
                out.set_modified(mtime)
            })
            .map_err(copy_failed)?;
        Ok(temp)
    }
}

impl Drop for TempIndex {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let mut lock = self.path.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
    }
}
