//! The candidates of a layered checkout's end: every path the agent wrote, created or deleted
//! is in the layer's `upper/` (a deletion as a whiteout, a directory made anew marked opaque),
//! and every path whose index entry it changed differs from the base's index, which every
//! layer starts from. Why a `git add -A` limited to them stages what the whole one would is
//! argued where the engine uses them (`src/git/layer_patch.rs`'s module docs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::index_file::{self, Entry, CE_INTENT_TO_ADD, CE_SKIP_WORKTREE, CE_VALID, GITLINK_MODE};

/// The candidates the layer's `upper/` names.
pub struct Candidates {
    /// Path → whether it exists in the checkout (false: a whiteout).
    pub paths: BTreeMap<Vec<u8>, bool>,
}

/// How the checkout's own `.git` may appear at the top of `upper/`.
pub enum RootGit<'a> {
    /// A file pointing at the layer's git dir, kept elsewhere (a local layer): these bytes.
    Pointer(&'a [u8]),
    /// The git dir itself, inside the checkout (a pod's): a directory the base has too, neither
    /// opaque nor new, whose content [`git_dir_as_made`] checks; it names no candidate.
    Dir,
}

/// The names whose rules reach beyond their own path.
pub fn reaches_beyond(name: &[u8]) -> bool {
    matches!(
        name,
        b".gitignore" | b".gitattributes" | b".gitmodules" | b".git"
    )
}

/// Walks `upper` (no symlink followed): every non-directory is a candidate, a directory the
/// base does not have as one is a candidate as a whole, a directory both have is walked.
pub fn upper_candidates(upper: &Path, base: &Path, root_git: RootGit<'_>) -> Option<Candidates> {
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
                let as_made = match root_git {
                    // The pointer the layer was made with, and nothing else.
                    RootGit::Pointer(pointer) => {
                        t.is_file() && read_regular(&e.path()).as_deref() == Some(pointer)
                    }
                    RootGit::Dir => {
                        t.is_dir()
                            && matches!(overlay_marks(&e.path())?, Marks::Bookkeeping)
                            && std::fs::symlink_metadata(base.join(".git"))
                                .is_ok_and(|l| l.is_dir() && l.mode() == m.mode())
                    }
                };
                if !as_made {
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

/// What a layer's git dir was made with, which it must still hold ([`git_dir_as_made`]).
pub struct MadeAs<'a> {
    /// The base's config, which the layer's must be byte for byte where it has one.
    pub config: &'a [u8],
    /// `objects/info/alternates` as made, `objects/info/` then being there (a local layer's
    /// git dir borrows the base's objects); None: there is none, and none may be added.
    pub alternates: Option<&'a [u8]>,
    /// `info/` may be there, empty (a local layer's is made so); false: it may not be there at
    /// all (in a pod's `upper/` it is there only once something of the base's changed in it).
    pub empty_info: bool,
}

/// Whether the layer's git dir holds nothing that changes how git stages: only files git
/// writes for refs, history, objects and operations in progress, its config as made, `info/`
/// as made, its alternates as made. Err names what is not.
pub fn git_dir_as_made(git_dir: &Path, made: &MadeAs<'_>) -> Result<(), String> {
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
        "branches",
        "rebase-merge",
        "rebase-apply",
        "sequencer",
        "rr-cache",
        "gc.pid",
        "gc.log",
        // A pod's marker that the history can be fetched, and why it could not be
        // (image/git-history).
        "cra-history",
        "cra-history.err",
    ];
    let unread = |e: std::io::Error| format!("{}: {e}", git_dir.display());
    for e in std::fs::read_dir(git_dir).map_err(unread)? {
        let e = e.map_err(unread)?;
        let name = e.file_name();
        let shown = name.to_string_lossy().into_owned();
        let Some(name) = name.to_str() else {
            return Err(shown);
        };
        let m = std::fs::symlink_metadata(e.path()).map_err(unread)?;
        if m.file_type().is_symlink() {
            return Err(shown);
        }
        let ok = match name {
            n if WRITTEN.contains(&n) => true,
            // git's lock files and the extraction's own temporary indexes beside the index.
            n if n.ends_with(".lock") || n.starts_with("index.patch-") => true,
            n if n.starts_with("sharedindex.") => true,
            "config" => m.is_file() && read_regular(&e.path()).as_deref() == Some(made.config),
            "info" => {
                made.empty_info
                    && m.is_dir()
                    && std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_none())
            }
            "objects" => m.is_dir() && objects_as_made(&e.path(), made.alternates),
            _ => false,
        };
        if !ok {
            return Err(shown);
        }
    }
    Ok(())
}

/// `objects/info/` holds the alternates the layer was made with (see [`MadeAs::alternates`]),
/// and nothing that changes which objects exist besides what git writes there itself.
fn objects_as_made(objects: &Path, alternates: Option<&[u8]>) -> bool {
    let info = objects.join("info");
    let entries = match std::fs::symlink_metadata(&info) {
        Ok(m) if m.is_dir() => std::fs::read_dir(&info),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && alternates.is_none() => return true,
        _ => return false,
    };
    let Ok(entries) = entries else {
        return false;
    };
    for e in entries {
        let Ok(e) = e else { return false };
        let ok = match e.file_name().to_str() {
            Some("alternates") => {
                alternates.is_some() && read_regular(&e.path()).as_deref() == alternates
            }
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
/// is one of at most `max` bytes.
pub fn read_at_most(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() > max {
        return None;
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

/// [`read_at_most`] 1 MiB: a config, a pointer.
pub fn read_regular(path: &Path) -> Option<Vec<u8>> {
    read_at_most(path, 1 << 20)
}

/// NUL-terminated paths, for `--pathspec-from-file=- --pathspec-file-nul` and `--stdin -z`.
pub fn nul_list<'a>(paths: impl Iterator<Item = &'a Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for p in paths {
        out.extend_from_slice(p);
        out.push(0);
    }
    out
}

/// Whether an entry is one a limited staging handles: stage 0, no gitlink, none of the marks
/// git obeys whatever the file holds (assume-unchanged, skip-worktree, intent-to-add).
pub fn plain(e: &Entry<'_>) -> bool {
    e.mode != GITLINK_MODE
        && e.flags & (CE_VALID | CE_INTENT_TO_ADD | CE_SKIP_WORKTREE) == 0
        && e.stage() == 0
}

/// The paths whose entry in the agent's index (`mine`) differs from the base's (`base`) in
/// anything git keeps of it but the device ([`index_file::Entry::record`]), or that only one
/// of them has; None when an entry of `mine` is not [`plain`]. Both are in git's order (by
/// path: [`index_file::entries`] reads nothing else), so one walk of both decides, without a
/// map of 100,000 paths.
pub fn changed_paths(mine: &[Entry<'_>], base: &[Entry<'_>]) -> Option<Vec<Vec<u8>>> {
    if !mine.iter().all(plain) {
        return None;
    }
    let mut changed = Vec::new();
    let (mut m, mut b) = (mine.iter().peekable(), base.iter().peekable());
    loop {
        match (m.peek(), b.peek()) {
            (None, None) => return Some(changed),
            (Some(x), Some(y)) if x.path == y.path => {
                if x.record != y.record {
                    changed.push(x.path.clone());
                }
                m.next();
                b.next();
            }
            (Some(x), Some(y)) if x.path < y.path => {
                changed.push(x.path.clone());
                m.next();
            }
            (Some(x), None) => {
                changed.push(x.path.clone());
                m.next();
            }
            (_, Some(y)) => {
                changed.push(y.path.clone());
                b.next();
            }
        }
    }
}

/// What a limited `git add -A` is given ([`staging`]).
pub struct Staging {
    /// How many candidates there were, before those git would refuse were left out: none
    /// means nothing changed, and the snapshot is the final tree.
    pub candidates: usize,
    /// Candidates with an index entry at or under them.
    pub tracked: Vec<Vec<u8>>,
    /// Candidates that exist with nothing of the index at or under them: each is staged
    /// unless `git check-ignore --no-index` says it is ignored (`git add` refuses a pathspec
    /// naming an ignored untracked path, and `git add -A` does not stage it either).
    pub untracked: Vec<Vec<u8>>,
}

/// The pathspecs of the end: the candidates of `upper/` and the paths whose index entry
/// changed (`changed`; `in_base`: whether one exists in the base, where it is not in
/// `upper/`), none under another (a pathspec names a whole subtree), sorted into what the
/// agent's index (`entries`) tracks and what it does not; None when a changed path's rules
/// reach beyond it.
pub fn staging(
    mut cands: Candidates,
    changed: Vec<Vec<u8>>,
    in_base: impl Fn(&[u8]) -> bool,
    entries: &[Entry<'_>],
) -> Option<Staging> {
    for p in changed {
        let name = p.rsplit(|&b| b == b'/').next().unwrap_or(&p);
        if reaches_beyond(name) {
            return None;
        }
        if cands.paths.contains_key(&p) {
            continue;
        }
        let exists = in_base(&p);
        cands.paths.insert(p, exists);
    }
    let covered = |p: &[u8]| {
        p.iter()
            .enumerate()
            .any(|(i, &b)| b == b'/' && cands.paths.contains_key(&p[..i]))
    };
    let paths: Vec<(&Vec<u8>, bool)> = cands
        .paths
        .iter()
        .filter(|(p, _)| !covered(p))
        .map(|(p, e)| (p, *e))
        .collect();
    let in_index = |p: &[u8]| !under(entries, p).is_empty();
    // `git add` refuses a pathspec that matches nothing (a whiteout where no index entry is):
    // `git add -A` stages nothing there either. Only a path with nothing tracked at or under
    // it is left out so.
    let (tracked, untracked): (Vec<_>, Vec<_>) = paths
        .iter()
        .filter(|(p, exists)| *exists || in_index(p))
        .map(|(p, _)| p.to_vec())
        .partition(|p| in_index(p));
    Some(Staging {
        candidates: paths.len(),
        tracked,
        untracked,
    })
}

/// The entries (sorted as git sorts them) that are `p` or lie under it: one run of them.
pub fn under<'e, 'd>(entries: &'e [Entry<'d>], p: &[u8]) -> &'e [Entry<'d>] {
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

const EMPTY_BLOB: &str = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391";

/// The agent's index (`data`, read as `entries`) rewritten so that staging `paths` decides as
/// under `limit` once the copy is stamped now. Under `limit` (the racy-clean limit the full
/// staging uses) git compares by content every entry of that second or later and, each time it
/// writes the index, re-reads every such file it did not stage (its "smudge"): on a checkout
/// made in the seconds before the snapshot, that is most of 100,000 files read through the
/// overlay. Only the staged paths' answers matter (the others are not staged, and a smudge
/// changes stat data, never the tree), so the entries under the staged paths that are racy
/// under `limit` are smudged as git would (size 0): git then compares them by content, as
/// under `limit`. The checksum no longer matches, so it is nulled ("not computed", as
/// `index.skipHash` writes it). None where which entries are racy depends on how git was built
/// (nanoseconds of the limit's second).
pub fn smudge_racy(
    data: &[u8],
    entries: &[Entry<'_>],
    paths: &[Vec<u8>],
    limit: (i64, i64),
) -> Option<Vec<u8>> {
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
    let trailer = out.len().checked_sub(20)?;
    out[trailer..].fill(0);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    }

    #[test]
    fn changed_paths_names_each_path_whose_entry_differs_or_that_one_index_alone_has() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        git(d, &["init", "-q"]);
        for p in ["a", "b", "c", "e"] {
            std::fs::write(d.join(p), p).unwrap();
        }
        git(d, &["add", "-A"]);
        let base = std::fs::read(d.join(".git/index")).unwrap();
        // Removed (b), its mode changed (c), added before and after every other (0, d, f).
        git(d, &["rm", "-q", "--cached", "b"]);
        git(d, &["update-index", "--chmod=+x", "c"]);
        for p in ["0", "d", "f"] {
            std::fs::write(d.join(p), p).unwrap();
            git(d, &["add", p]);
        }
        let mine = std::fs::read(d.join(".git/index")).unwrap();
        let (base, mine) = (
            index_file::entries(&base).unwrap(),
            index_file::entries(&mine).unwrap(),
        );
        let names = |v: Vec<Vec<u8>>| -> Vec<String> {
            let mut v: Vec<String> = v
                .into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(changed_paths(&mine, &base).unwrap()),
            ["0", "b", "c", "d", "f"]
        );
        assert_eq!(changed_paths(&base, &base), Some(Vec::new()));
        // A marked entry is not one a limited staging handles.
        git(d, &["update-index", "--assume-unchanged", "a"]);
        let marked = std::fs::read(d.join(".git/index")).unwrap();
        assert!(changed_paths(&index_file::entries(&marked).unwrap(), &base).is_none());
    }
}
