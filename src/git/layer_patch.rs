//! The end of an Implementor on a layer reads only what changed (issue 37).
//!
//! [`super::patch`] stages the whole checkout: `update-index --really-refresh` and `git add -A`
//! stat every file through the overlay (100,000 files: seconds), although the agent wrote a
//! few. On a layer the candidates are known: every path the agent wrote, created or deleted
//! is in the layer's `upper/` (a deletion as a whiteout), and every path whose index entry it
//! changed differs from the base's index, which every layer starts from. Everywhere else the
//! checkout is the base, and the full staging's answer there is what it would be for an agent
//! that did nothing — which is verified once per base ([`verify`]): that staging, run as an
//! extraction runs it (jailed, on a layer with nothing written, the same index and racy-clean
//! limit) gives exactly the snapshot tree. So the final tree is the snapshot's outside the
//! candidates, and, for them, what `git add -A` limited to them stages into a copy of the
//! agent's index; written by `write-tree` and compared with the snapshot by `git diff-tree`,
//! as on the full path, its records go through the same code as before
//! ([`super::patch::patch_of_changes`]), so the patch is byte-identical whenever the tree is.
//!
//! What it costs at 100,000 files is the index (8 MiB), not the tree: the three git steps run
//! by one fixed script in one jail (one bubblewrap, one overlay mount; [`stage_candidates`]);
//! the agent's index is read in place, not listed by git ([`super::index_file`]); git's
//! re-reading of every racily clean file each time it writes an index is avoided where it
//! changes no answer ([`keep_racy_answers`]); and when the setup changed no tracked file the
//! final tree is the patch's target itself, where the full path builds it again in an index
//! of the whole base tree.
//!
//! Why the per-path answer is the same. `git add -A` decides each path by its index entry, its
//! file and the rules that apply to it (attributes, ignores, config); limited by a pathspec it
//! makes the same decision for the paths it covers and leaves the others alone. Outside the
//! candidates the entry is the base's (compared field by field: stat data, flags, mode, oid,
//! stage, as the index file stores them), the file is the base's, and the rules are the
//! base's, which is checked: the layer's git dir holds nothing that changes them (its config
//! byte for byte the base's, no `info/` file, nothing git reads that the layer did not start
//! with), no candidate is a `.gitignore`, `.gitattributes` or `.gitmodules` (their rules reach
//! beyond the path), and the host's git config and version are those of the verification. The
//! one input left is the racy-clean limit: the copy of the index gets the agent's index's
//! mtime capped before the snapshot ([`super::patch::stat_trust_limit`]); a limit other than
//! the verification's changes nothing when no entry is racy under one and not the other, or
//! when every entry that could be is one whose content is its oid (checked at verification).
//!
//! A directory of the base the agent removed is a whiteout in `upper/`, one it made anew is
//! marked opaque (`user.overlay.opaque`, the overlay being mounted with `userxattr`): either is
//! a candidate as a whole, as a new directory is.
//!
//! Everything that is not proven so — a gitlink anywhere, an entry marked assume-unchanged,
//! skip-worktree or intent-to-add or unmerged, a nested `.git`, an entry of `upper/` with
//! extended attributes other than overlayfs's bookkeeping and a directory's opaque mark, a
//! directory of the base with another mode, an index git would read otherwise than
//! [`super::index_file`] does, an index mtime set back before the verification's, a git that
//! fails or complains — makes
//! the extraction take the full path ([`super::patch::agent_patch`]), as it does while a base
//! is not verified yet. The layer's git dir is the agent's: on the host it is only listed and
//! compared (no symlink followed) and its index read as bytes (every length checked); git
//! reads it in the jail, with the hardening of every extraction ([`super::command`]'s
//! `NEUTRALISED`: no fsmonitor, hooks or transport, stat data trusted no further than git's
//! racy-clean rule), the agent's paths passed on stdin, never in the script's text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::command::{neutral_git_sh, run_with_input, At};
use super::index_file::{self, CE_INTENT_TO_ADD, CE_SKIP_WORKTREE, CE_VALID, GITLINK_MODE};
use super::layer::Layer;
use super::patch::{
    diff, git_with_index, index_path, patch_of_changes, records_of_raw_diff, stage_all, tree_of,
    unix_now, Snapshot, TempIndex,
};
use crate::error::Result;

/// What the verification of a base established (module docs).
#[derive(Debug)]
pub(crate) struct Verified {
    /// The base's index, as every layer over it starts with it.
    index: Vec<u8>,
    /// Its entries: path → everything the index keeps of it but the path and the device
    /// ([`index_file::Entry::record`]).
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The mtime (seconds, nanoseconds) of the verification's copy of the index.
    limit: (i64, i64),
    /// Every entry at or after `limit`'s second holds its content's oid: a later limit
    /// changes nothing.
    later_limit_ok: bool,
    /// The host's git as the verification saw it (system config and attributes, version).
    host: Vec<u8>,
    /// The base's config, which a layer's must still be.
    config: Vec<u8>,
    /// The base's commit and its tree (see [`from_layer`]'s use of them).
    base_commit: String,
    base_tree: String,
}

/// One entry of `git ls-files --stage --debug -z`.
struct Entry {
    path: Vec<u8>,
    mode: String,
    oid: String,
    stage: String,
    mtime: i64,
    flags: u32,
    /// The stat data git compares with the file, but the device: it differs between two
    /// mounts of one overlay (the agent's git rewrites racy entries with its mount's), and
    /// leaving it out changes no answer — git does not compare it unless built with
    /// `USE_STDEV`, and then it finds every entry changed in every mount and compares all by
    /// content, whatever the entry says.
    stat: String,
}

/// Parses `git ls-files --stage --debug -z`: `<mode> <oid> <stage>\t<path>\0` then five
/// `\n`-ended lines of stat data (ctime, mtime, dev/ino, uid/gid, size/flags).
fn parse_listing(out: &[u8]) -> Option<Vec<Entry>> {
    let mut entries = Vec::new();
    let mut chunks = out.split(|&b| b == 0);
    let mut head = chunks.next()?.to_vec();
    for chunk in chunks {
        // The stat lines of the entry `head` names, then the next entry's head.
        let mut at = 0;
        for _ in 0..5 {
            at += chunk.get(at..)?.iter().position(|&b| b == b'\n')? + 1;
        }
        let (stat, next) = chunk.split_at(at);
        let tab = head.iter().position(|&b| b == b'\t')?;
        let meta = std::str::from_utf8(&head[..tab]).ok()?;
        let mut f = meta.split(' ');
        let (mode, oid, stage) = (f.next()?, f.next()?, f.next()?);
        let stat_text = std::str::from_utf8(stat).ok()?;
        let mut lines = stat_text.lines();
        let _ctime = lines.next()?;
        let mtime = lines
            .next()?
            .trim()
            .strip_prefix("mtime: ")?
            .split(':')
            .next()?
            .parse()
            .ok()?;
        let all: Vec<&str> = stat_text.lines().collect();
        let [ctime, mtime_line, dev_ino, ids, size_flags] = all[..] else {
            return None;
        };
        let (size, flags) = size_flags.split_once("\tflags: ")?;
        let flags = u32::from_str_radix(flags.trim(), 16).ok()?;
        let ino = dev_ino.split_once('\t')?.1;
        let stat_key = format!("{ctime}\n{mtime_line}\n{ino}\n{ids}\n{size}");
        entries.push(Entry {
            path: head[tab + 1..].to_vec(),
            mode: mode.to_string(),
            oid: oid.to_string(),
            stage: stage.to_string(),
            mtime,
            flags,
            stat: stat_key,
        });
        head = next.to_vec();
    }
    head.is_empty().then_some(entries)
}

/// `git ls-files --stage --debug -z` of `index`, parsed; None: git failed or said something
/// this does not read.
async fn listing(at: At<'_>, index: &Path) -> Option<Vec<Entry>> {
    let out = git_with_index(
        at.git(&["ls-files", "--stage", "--debug", "-z"]),
        index,
        "git ls-files --stage --debug -z",
    )
    .await
    .ok()?;
    parse_listing(&out)
}

/// The mtime of a file as (seconds, nanoseconds).
fn mtime_of(path: &Path) -> Option<(i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.mtime(), m.mtime_nsec()))
}

/// What of the host git reads in every jail: its system config and attributes, and which git
/// it is.
async fn host_git() -> Vec<u8> {
    let mut out = Vec::new();
    for f in ["/etc/gitconfig", "/etc/gitattributes"] {
        out.extend_from_slice(f.as_bytes());
        match std::fs::read(f) {
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => out.extend_from_slice(format!("({:?})", e.kind()).as_bytes()),
        }
        out.push(0);
    }
    if let Ok(v) = super::command::run_git(Path::new("/"), &["--version"]).await {
        out.extend_from_slice(&v.stdout);
    }
    out
}

/// Verifies the base of `layer` (a layer with nothing written, made for this, its checkout at
/// `at`): the extraction's staging there must give the snapshot's tree (module docs). None
/// when it does not, or anything on the way is not as expected: the base's layers then take
/// the full path.
pub(crate) async fn verify(
    at: At<'_>,
    layer: &Layer,
    commit: &str,
    snapshot: &Snapshot,
) -> Option<Verified> {
    let started = unix_now() as i64;
    let base_tree = tree_of(at, commit).await?;
    let host = host_git().await;
    let git_dir = layer.git_dir();
    let index = std::fs::read(git_dir.join("index")).ok()?;
    let config = std::fs::read(git_dir.join("config")).ok()?;
    let limit_secs = super::patch::stat_trust_limit(Some(snapshot.taken));
    let temp = TempIndex::copy_of(&git_dir.join("index"), Some(limit_secs)).ok()?;
    let limit = mtime_of(&temp.path)?;
    let before = listing(at, &temp.path).await?;
    let tree = stage_all(at, &temp.path).await.ok()?;
    if tree != snapshot.tree {
        tracing::debug!(base = %layer.base.display(), "the base's layers take the full extraction: an untouched layer does not stage to the snapshot");
        return None;
    }
    // The base's index as this reads it, which must be what git lists.
    let parsed = index_file::entries(&index)?;
    let same = parsed.len() == before.len()
        && parsed.iter().zip(&before).all(|(p, b)| {
            p.path == b.path
                && format!("{:o}", p.mode) == b.mode
                && p.oid_hex() == b.oid
                && p.stage().to_string() == b.stage
        });
    if !same {
        return None;
    }
    let entries = parsed
        .iter()
        .map(|e| (e.path.clone(), e.record_bytes()))
        .collect();
    let after = listing(at, &temp.path).await?;
    let plain = |e: &Entry| {
        e.stage == "0"
            && e.mode != format!("{GITLINK_MODE:o}")
            && e.flags & (CE_VALID | CE_INTENT_TO_ADD | CE_SKIP_WORKTREE) == 0
    };
    if !before.iter().chain(&after).all(plain) {
        return None;
    }
    let staged: BTreeMap<&[u8], &Entry> = after.iter().map(|e| (e.path.as_slice(), e)).collect();
    // Which entries a limit can decide: those whose stat data matches their file (staging
    // left it as it was); the others are compared by content whatever the limit. Each one
    // racy under the verification's limit was compared by content: whether its content is
    // its oid is known, and when it is, no limit changes its answer.
    let later_limit_ok = before.iter().filter(|e| e.mtime >= limit.0).all(|e| {
        staged
            .get(e.path.as_slice())
            .is_some_and(|s| s.stat != e.stat || (s.mode == e.mode && s.oid == e.oid))
    });
    // An entry of the checkout's last second is racy here also when the staging reads the
    // index it rewrote (stamped `started` or later), and may not be in a later extraction:
    // the same answer only if its content is its oid.
    if !later_limit_ok && before.iter().any(|e| e.mtime >= started) {
        return None;
    }
    Some(Verified {
        index,
        entries,
        limit,
        later_limit_ok,
        host,
        config,
        base_commit: commit.to_string(),
        base_tree,
    })
}

/// The candidates the layer's `upper/` names (module docs), or None when one of them is not
/// provably handled by a limited `git add -A`.
struct Candidates {
    /// Path → whether it exists in the checkout (false: a whiteout).
    paths: BTreeMap<Vec<u8>, bool>,
}

/// The names whose rules reach beyond their own path.
fn reaches_beyond(name: &[u8]) -> bool {
    matches!(
        name,
        b".gitignore" | b".gitattributes" | b".gitmodules" | b".git"
    )
}

/// Walks `upper` (no symlink followed): every non-directory is a candidate, a directory the
/// base does not have as one is a candidate as a whole, a directory both have is walked.
fn upper_candidates(upper: &Path, base: &Path, pointer: &[u8]) -> Option<Candidates> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Candidates {
        paths: BTreeMap::new(),
    };
    // (directory in upper, its path in the checkout)
    let mut dirs: Vec<(PathBuf, Vec<u8>)> = vec![(upper.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = dirs.pop() {
        for e in std::fs::read_dir(&dir).ok()? {
            let e = e.ok()?;
            let name = e.file_name();
            let name = name.as_bytes();
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            let t = m.file_type();
            if rel.is_empty() && name == b".git" {
                // The pointer the layer was made with, and nothing else.
                if !t.is_file() || read_regular(&e.path()).as_deref() != Some(pointer) {
                    return None;
                }
                continue;
            }
            if reaches_beyond(name) {
                return None;
            }
            // overlayfs marks in extended attributes a directory opaque (nothing below it is
            // the base's: a candidate as a whole, as a new one is) or redirected, a whiteout or
            // a file whose data is below: what is seen through those is not what their place
            // in `upper/` says, and is not handled here.
            let opaque = match overlay_marks(&e.path())? {
                Marks::Bookkeeping => false,
                Marks::Opaque if t.is_dir() => true,
                Marks::Opaque | Marks::Other => return None,
            };
            if !t.is_dir() {
                let whiteout = t.is_char_device() && m.rdev() == 0;
                out.paths.insert(path, !whiteout);
                continue;
            }
            if opaque {
                out.paths.insert(path, true);
                continue;
            }
            let lower = base.join(std::ffi::OsStr::from_bytes(&path));
            match std::fs::symlink_metadata(&lower) {
                Ok(l) if l.is_dir() => {
                    if l.mode() != m.mode() {
                        return None;
                    }
                    dirs.push((e.path(), path));
                }
                _ => {
                    out.paths.insert(path, true);
                }
            }
        }
    }
    Some(out)
}

/// The extended attributes overlayfs (mounted with `userxattr`) sets on what it copies up,
/// which say where an entry came from (inode numbers) and change nothing of what is seen.
const BOOKKEEPING_MARKS: &[&[u8]] = &[
    b"user.overlay.origin",
    b"user.overlay.impure",
    b"user.overlay.uuid",
    b"user.overlay.nlink",
];

/// What the extended attributes of an entry of `upper/` say (see [`overlay_marks`]).
enum Marks {
    /// None, or [`BOOKKEEPING_MARKS`] only.
    Bookkeeping,
    /// Those and `user.overlay.opaque=y`: a directory that hides the base's below it.
    Opaque,
    /// Anything else.
    Other,
}

/// The extended attributes of `path` (not followed if a symlink); None: unreadable.
fn overlay_marks(path: &Path) -> Option<Marks> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut names = vec![0u8; 1024];
    // SAFETY: a valid NUL-terminated path and a buffer of the length given.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        // No extended attributes on this file system; anything else (a list longer than
        // the buffer: ERANGE) is not what overlayfs leaves.
        let e = std::io::Error::last_os_error();
        return (e.raw_os_error() == Some(libc::ENOTSUP)).then_some(Marks::Bookkeeping);
    }
    names.truncate(n as usize);
    let mut marks = Marks::Bookkeeping;
    for name in names.split(|&b| b == 0).filter(|name| !name.is_empty()) {
        if BOOKKEEPING_MARKS.contains(&name) {
            continue;
        }
        if name != b"user.overlay.opaque" {
            return Some(Marks::Other);
        }
        let mut value = [0u8; 2];
        // SAFETY: as above; `name` is NUL-terminated in `names` (llistxattr's format).
        let len = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                name.as_ptr().cast(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        // "y": opaque; "x" (a directory holding whiteouts as files) and anything else: other.
        if len != 1 || value[0] != b'y' {
            return Some(Marks::Other);
        }
        marks = Marks::Opaque;
    }
    Some(marks)
}

/// Whether the layer's git dir holds nothing that changes how git stages (module docs): only
/// files git writes for refs, history, objects and operations in progress, its config as the
/// base's, `info/` empty, its alternates as made.
fn git_dir_as_made(git_dir: &Path, layer: &Layer, config: &[u8]) -> bool {
    const WRITTEN: &[&str] = &[
        "index",
        "HEAD",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
        "MERGE_MSG",
        "MERGE_MODE",
        "MERGE_RR",
        "AUTO_MERGE",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "REBASE_HEAD",
        "BISECT_LOG",
        "BISECT_START",
        "BISECT_TERMS",
        "BISECT_EXPECTED_REV",
        "BISECT_ANCESTORS_OK",
        "BISECT_NAMES",
        "COMMIT_EDITMSG",
        "SQUASH_MSG",
        "TAG_EDITMSG",
        "description",
        "shallow",
        "packed-refs",
        "refs",
        "logs",
        "hooks",
        "rebase-merge",
        "rebase-apply",
        "sequencer",
        "rr-cache",
        "gc.pid",
        "gc.log",
    ];
    let Ok(entries) = std::fs::read_dir(git_dir) else {
        return false;
    };
    for e in entries {
        let Ok(e) = e else { return false };
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return false;
        };
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            return false;
        };
        if m.file_type().is_symlink() {
            return false;
        }
        let ok = match name {
            n if WRITTEN.contains(&n) => true,
            // git's lock files and the extraction's own temporary indexes beside the index.
            n if n.ends_with(".lock") || n.starts_with("index.patch-") => true,
            n if n.starts_with("sharedindex.") => true,
            "config" => m.is_file() && read_regular(&e.path()).as_deref() == Some(config),
            "info" => {
                m.is_dir() && std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_none())
            }
            "objects" => m.is_dir() && objects_as_made(&e.path(), layer),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// `objects/info/` holds the alternates the layer was made with, and nothing that changes
/// which objects exist besides what git writes there itself.
fn objects_as_made(objects: &Path, layer: &Layer) -> bool {
    let info = objects.join("info");
    match std::fs::symlink_metadata(&info) {
        Ok(m) if m.is_dir() => {}
        _ => return false,
    }
    let Ok(entries) = std::fs::read_dir(&info) else {
        return false;
    };
    let mut expected = layer
        .base
        .join(".git/objects")
        .into_os_string()
        .into_encoded_bytes();
    expected.push(b'\n');
    for e in entries {
        let Ok(e) = e else { return false };
        let ok = match e.file_name().to_str() {
            Some("alternates") => read_regular(&e.path()).as_deref() == Some(expected.as_slice()),
            Some("packs" | "commit-graph" | "commit-graphs" | "multi-pack-index") => true,
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// A regular file's bytes (opened without following a symlink or blocking on a FIFO), when it
/// is one of at most 1 MiB.
fn read_regular(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > 1 << 20 {
        return None;
    }
    let mut out = Vec::new();
    f.take(1 << 20).read_to_end(&mut out).ok()?;
    Some(out)
}

/// NUL-terminated paths, for `--pathspec-from-file=- --pathspec-file-nul` and `--stdin -z`.
fn nul_list<'a>(paths: impl Iterator<Item = &'a Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for p in paths {
        out.extend_from_slice(p);
        out.push(0);
    }
    out
}

/// The agent's patch read from its layer (module docs); None: not provably the full
/// staging's, the caller takes the full path. Errors only where the full path would fail the
/// same way (the agent's index unreadable).
pub(crate) async fn patch_from_layer(
    at: At<'_>,
    layer: &Layer,
    verified: &Verified,
    base: &str,
    snapshot: &Snapshot,
    trust_before: u64,
) -> Result<Option<String>> {
    let index = index_path(at)?;
    let temp = TempIndex::copy_of(&index, Some(trust_before))?;
    Ok(from_layer(at, layer, verified, base, snapshot, &index, &temp.path).await)
}

async fn from_layer(
    at: At<'_>,
    layer: &Layer,
    v: &Verified,
    base: &str,
    snapshot: &Snapshot,
    index: &Path,
    temp: &Path,
) -> Option<String> {
    let git_dir = layer.git_dir();
    if host_git().await != v.host || !git_dir_as_made(&git_dir, layer, &v.config) {
        return None;
    }
    // The racy-clean limit (module docs).
    let limit = mtime_of(temp)?;
    if !(limit == v.limit || (limit > v.limit && v.later_limit_ok)) {
        return None;
    }
    // What the agent's index changed.
    let mut changed: Vec<Vec<u8>> = Vec::new();
    let mine = std::fs::read(temp).ok()?;
    let entries = index_file::entries(&mine)?;
    if mine != v.index {
        let mut records = BTreeMap::new();
        for e in &entries {
            if e.mode == GITLINK_MODE
                || e.flags & (CE_VALID | CE_INTENT_TO_ADD | CE_SKIP_WORKTREE) != 0
                || e.stage() != 0
            {
                return None;
            }
            records.insert(e.path.as_slice(), e.record_bytes());
        }
        for (p, r) in &records {
            if v.entries.get(*p) != Some(r) {
                changed.push(p.to_vec());
            }
        }
        for p in v.entries.keys() {
            if !records.contains_key(p.as_slice()) {
                changed.push(p.clone());
            }
        }
    }
    let upper = layer.dir.join("upper");
    let mut pointer = b"gitdir: ".to_vec();
    pointer.extend_from_slice(git_dir.as_os_str().as_encoded_bytes());
    pointer.push(b'\n');
    let mut cands = upper_candidates(&upper, &layer.base, &pointer)?;
    for p in changed {
        let name = p.rsplit(|&b| b == b'/').next().unwrap_or(&p);
        if reaches_beyond(name) {
            return None;
        }
        if cands.paths.contains_key(&p) {
            continue;
        }
        let exists = {
            use std::os::unix::ffi::OsStrExt;
            std::fs::symlink_metadata(layer.base.join(std::ffi::OsStr::from_bytes(&p))).is_ok()
        };
        cands.paths.insert(p, exists);
    }
    // A path under another candidate is covered by it (a pathspec names a whole subtree).
    let covered = |p: &[u8]| {
        p.iter()
            .enumerate()
            .any(|(i, &b)| b == b'/' && cands.paths.contains_key(&p[..i]))
    };
    let paths: Vec<(Vec<u8>, bool)> = cands
        .paths
        .iter()
        .filter(|(p, _)| !covered(p))
        .map(|(p, e)| (p.clone(), *e))
        .collect();
    // Nothing changed: the snapshot's tree is the final one, as the full staging finds.
    if paths.is_empty() {
        return Some(String::new());
    }
    // Whether an index entry is `p` or lies under it.
    let in_index = |p: &[u8]| !under(&entries, p).is_empty();
    // `git add` refuses a pathspec that matches nothing (a whiteout where no index entry is)
    // and one naming an ignored untracked path: neither is staged by `git add -A` either.
    // Only a path with nothing tracked at or under it can be left out so; one that has (a
    // deleted directory whose name a rule ignores) is staged, and should `git add` then
    // refuse it, the extraction falls back.
    let (tracked, untracked): (Vec<_>, Vec<_>) = paths
        .iter()
        .filter(|(p, exists)| *exists || in_index(p))
        .partition(|(p, _)| in_index(p));
    let ignored = if untracked.is_empty() {
        std::collections::BTreeSet::new()
    } else {
        // Nothing of these is in the index, so it need not be read (100,000 entries: 8 MiB).
        let cmd = at.git(&["check-ignore", "--no-index", "-z", "--stdin"]);
        let names = nul_list(untracked.iter().map(|(p, _)| p));
        match run_with_input(cmd, "git check-ignore --no-index".into(), names).await {
            Ok(out) => out
                .stdout
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(<[u8]>::to_vec)
                .collect(),
            // 1: none is ignored.
            Err(e) if e.code == Some(1) => std::collections::BTreeSet::new(),
            Err(_) => return None,
        }
    };
    let staged: Vec<&Vec<u8>> = tracked
        .iter()
        .chain(untracked.iter().filter(|(p, _)| !ignored.contains(p)))
        .map(|(p, _)| p)
        .collect();
    keep_racy_answers(temp, &mine, &entries, &staged, limit)?;
    let (tree, changes) = stage_candidates(at, temp, &snapshot.tree, &staged).await?;
    if changes.is_empty() {
        return Some(String::new());
    }
    // With no tracked change of the setup's (the snapshot is the base commit's tree), the
    // base's tree with the agent's changes applied — what `patch_of_changes` builds in an
    // index of the whole tree — is the final tree itself: every entry outside the changes is
    // the snapshot's, that is the base's, and both trees were written by `write-tree`.
    if v.base_commit == base && v.base_tree == snapshot.tree {
        return diff(at, base, &tree).await.ok();
    }
    patch_of_changes(at, index, base, changes).await.ok()
}

const EMPTY_BLOB: &str = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391";

/// The entries (sorted as git sorts them) that are `p` or lie under it: one run of them.
fn under<'e, 'd>(entries: &'e [index_file::Entry<'d>], p: &[u8]) -> &'e [index_file::Entry<'d>] {
    let mut dir = p.to_vec();
    dir.push(b'/');
    let from = entries.partition_point(|e| e.path.as_slice() < p);
    let exact = entries.get(from).is_some_and(|e| e.path == p);
    let dirs = from + usize::from(exact);
    let to = dirs + entries[dirs..].partition_point(|e| e.path.starts_with(&dir));
    if exact || to > dirs {
        &entries[from..to]
    } else {
        &[]
    }
}

/// Rewrites the copy of the agent's index at `temp` (read as `data`) so that writing it is
/// cheap and staging `paths` decides as under `limit`. Under `limit` (the racy-clean limit the
/// full staging uses) git compares by content every entry of that second or later and, each
/// time it writes the index, re-reads every such file it did not stage (its "smudge"): on a
/// checkout made in the seconds before the snapshot, that is most of 100,000 files read through
/// the overlay. Only the staged paths' answers matter here (the others are not staged, and a
/// smudge changes stat data, never the tree), so the copy is stamped now, and the entries
/// under the staged paths that are racy under `limit` are smudged as git would (size 0): git
/// then compares them by content, as under `limit`. None where which entries are racy depends
/// on how git was built (nanoseconds of the limit's second).
fn keep_racy_answers(
    temp: &Path,
    data: &[u8],
    entries: &[index_file::Entry<'_>],
    paths: &[&Vec<u8>],
    limit: (i64, i64),
) -> Option<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut out = data.to_vec();
    for p in paths {
        for e in under(entries, p) {
            let (sec, nsec) = e.mtime();
            let (sec, nsec) = (i64::from(sec), i64::from(nsec));
            // Racy as git built with `USE_NSEC` says, and as without it (seconds only).
            let racy_nsec = sec > limit.0 || (sec == limit.0 && nsec >= limit.1);
            if racy_nsec != (sec >= limit.0) {
                return None;
            }
            // An entry of size 0 naming the empty blob still matches an empty file by stat
            // data, where under `limit` its content (through a clean filter) was compared.
            if racy_nsec && e.oid_hex() == EMPTY_BLOB {
                return None;
            }
            if racy_nsec {
                out[e.offset + index_file::SIZE.start..e.offset + index_file::SIZE.end].fill(0);
            }
        }
    }
    // The checksum no longer matches: a null one says "not computed" (`index.skipHash`).
    let trailer = out.len().checked_sub(20)?;
    out[trailer..].fill(0);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(temp)
        .ok()?;
    f.write_all(&out).ok()?;
    f.set_modified(std::time::SystemTime::now()).ok()
}

/// Stages `paths` (none: the index is taken as it is) into the copy of the agent's index at
/// `temp`, writes the final tree and lists how it differs from `snapshot`, in one jail (one
/// bubblewrap, one overlay mount; the paths on stdin): the final tree and the records
/// [`patch_of_changes`] takes. `index.skipHash`: the copy is written twice and read by
/// nothing else, so its checksum over 8 MiB (100,000 entries) is not worth computing.
async fn stage_candidates(
    at: At<'_>,
    temp: &Path,
    snapshot: &str,
    paths: &[&Vec<u8>],
) -> Option<(String, Vec<u8>)> {
    let g = neutral_git_sh();
    let script = format!(
        "set -e; if [ \"$1\" = add ]; then {g} -c index.skipHash=true --literal-pathspecs add \
         -A --pathspec-from-file=- --pathspec-file-nul; fi; t=$({g} -c index.skipHash=true \
         write-tree); echo \"$t\"; {g} diff-tree -r -z --no-renames \"$2\" \"$t\""
    );
    let add = if paths.is_empty() { "-" } else { "add" };
    let mut cmd = at.sh(&script, &[add.into(), snapshot.into()]);
    cmd.env("GIT_INDEX_FILE", temp);
    let out = run_with_input(
        cmd,
        "git add -A (candidates); git write-tree; git diff-tree (snapshot..final)".into(),
        nul_list(paths.iter().copied()),
    )
    .await
    .ok()?;
    let newline = out.stdout.iter().position(|&b| b == b'\n')?;
    let tree = std::str::from_utf8(&out.stdout[..newline]).ok()?;
    if tree.is_empty() || !tree.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let changes = records_of_raw_diff(&out.stdout[newline + 1..]).ok()?;
    Some((tree.to_string(), changes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_with_newlines_in_names_is_read_entry_by_entry() {
        // (`dev` and `ino` are separated by a tab, as are `size` and `flags`.)
        let stat = "  ctime: 1:2\n  mtime: 3:4\n  dev: 5\tino: 6\n  uid: 7\tgid: 8\n  size: 9\tflags: 8000\n";
        let mut out = Vec::new();
        out.extend_from_slice(b"100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\ta\nb");
        out.push(0);
        out.extend_from_slice(stat.as_bytes());
        out.extend_from_slice(b"120000 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\tc");
        out.push(0);
        out.extend_from_slice(stat.as_bytes());
        let e = parse_listing(&out).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].path, b"a\nb");
        assert_eq!(e[0].mtime, 3);
        assert_eq!(e[0].flags, CE_VALID);
        assert_eq!(e[1].mode, "120000");
        assert_eq!(e[1].path, b"c");
        assert!(parse_listing(b"garbage").is_none_or(|e| e.is_empty()));
    }
}
