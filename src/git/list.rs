//! The repository's worktrees, read from the metadata files git itself keeps — the same files
//! every git since 2.5 writes and reads — instead of `git worktree list --porcelain -z`, which
//! needs git 2.36:
//!
//! - `<common>/HEAD`: the main checkout's HEAD;
//! - `<common>/worktrees/<id>/gitdir`: the path of the linked worktree's `.git` file (absolute;
//!   relative to the admin dir with git 2.48's `worktree.useRelativePaths`);
//! - `<common>/worktrees/<id>/HEAD`: its HEAD (`ref: refs/heads/<branch>` or a detached oid);
//! - `<common>/worktrees/<id>/locked`: present when locked, holding the reason (may be empty).
//!
//! An admin dir without a readable `gitdir` is skipped (git would report it prunable).
//!
//! Likewise a repository's object stores: `objects/info/alternates` read the way git reads it
//! ([`object_dirs`]), for what a sandbox must let a checkout's git read.

use std::path::{Component, Path, PathBuf};

/// One worktree as its metadata describes it.
#[derive(Debug, Clone)]
pub(crate) struct ListedWorktree {
    pub path: PathBuf,
    /// The admin dir (`<common>/worktrees/<id>`; the common dir itself for the main checkout).
    pub admin: PathBuf,
    /// `refs/heads/<branch>` when a branch is checked out.
    pub head_ref: Option<String>,
    /// `Some(reason)` when locked (the reason may be empty). For a clone: its owner record.
    pub locked: Option<String>,
    /// A clone this adapter made (`admin` is then its record dir), not a linked worktree.
    pub clone: bool,
    /// A layered checkout's parts, from its record (see [`super::base`]).
    pub layer: Option<super::record::LayerRecord>,
}

/// Where the records of the adapter's clones live, under the common git dir.
pub(crate) const CLONES_DIR: &str = "claude-runtime-adapter/clones";

/// The clones this adapter recorded (see [`super::provision`]): path from the session record,
/// owner from the `locked` file beside it. A record without a readable path is skipped.
pub(crate) fn clones(common: &Path) -> std::io::Result<Vec<ListedWorktree>> {
    let dir = match std::fs::read_dir(common.join(CLONES_DIR)) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in dir {
        let admin = entry?.path();
        let Some(record) = super::record::AdminRecord::read(&admin) else {
            continue;
        };
        let Some(path) = record.path else { continue };
        out.push(ListedWorktree {
            path: PathBuf::from(path),
            head_ref: Some(format!("refs/heads/{}", record.branch)),
            locked: std::fs::read_to_string(admin.join("locked")).ok(),
            admin,
            clone: true,
            layer: record.layer,
        });
    }
    Ok(out)
}

/// The main checkout (unless the repository is bare) followed by every linked worktree.
pub(crate) fn worktrees(common: &Path) -> std::io::Result<Vec<ListedWorktree>> {
    let mut out = Vec::new();
    if common.file_name().is_some_and(|n| n == ".git") {
        if let Some(main) = common.parent() {
            out.push(ListedWorktree {
                path: main.to_path_buf(),
                admin: common.to_path_buf(),
                head_ref: head_ref(common),
                locked: None,
                clone: false,
                layer: None,
            });
        }
    }
    let dir = match std::fs::read_dir(common.join("worktrees")) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in dir {
        let admin = entry?.path();
        if let Some(w) = linked(&admin) {
            out.push(w);
        }
    }
    Ok(out)
}

fn linked(admin: &Path) -> Option<ListedWorktree> {
    let gitdir = std::fs::read(admin.join("gitdir")).ok()?;
    let dot_git = resolve(admin, &path_from_bytes(trim_newline(&gitdir)));
    Some(ListedWorktree {
        path: dot_git.parent()?.to_path_buf(),
        admin: admin.to_path_buf(),
        head_ref: head_ref(admin),
        locked: std::fs::read_to_string(admin.join("locked")).ok(),
        clone: false,
        layer: None,
    })
}

fn head_ref(admin: &Path) -> Option<String> {
    let head = std::fs::read_to_string(admin.join("HEAD")).ok()?;
    head.trim()
        .strip_prefix("ref:")
        .map(|r| r.trim().to_string())
}

/// The admin dir of the worktree checked out at `worktree`, from its `.git` file
/// (`gitdir: <admin>`); `<worktree>/.git` itself when that is a directory (a main checkout).
pub(crate) fn admin_dir_of(worktree: &Path) -> std::io::Result<PathBuf> {
    let dot_git = worktree.join(".git");
    if dot_git.is_dir() {
        return Ok(dot_git);
    }
    let content = std::fs::read(&dot_git)?;
    let target = content
        .strip_prefix(b"gitdir:")
        .map(|p| trim_newline(p).trim_ascii_start())
        .ok_or_else(|| {
            std::io::Error::other(format!("{} is not a gitdir file", dot_git.display()))
        })?;
    Ok(resolve(worktree, &path_from_bytes(target)))
}

fn trim_newline(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// `p` as written by git: absolute, or relative to `base`; `..` resolved lexically.
fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let mut out = base.to_path_buf();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// git writes paths as raw bytes: exact on Unix; on Windows git writes UTF-8.
#[cfg(unix)]
fn path_from_bytes(p: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(p))
}

#[cfg(not(unix))]
fn path_from_bytes(p: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(p).into_owned())
}

/// The object store at `<common>/objects` and every store it borrows from (its
/// `info/alternates`, recursively): what a `--shared` clone reads.
pub(crate) fn object_dirs(common: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![common.join("objects")];
    let mut i = 0;
    while i < dirs.len() && dirs.len() < 16 {
        let alt = std::fs::read_to_string(dirs[i].join("info/alternates")).unwrap_or_default();
        for line in alt.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let p = dirs[i].join(line);
            let p = p.canonicalize().unwrap_or(p);
            if !dirs.contains(&p) {
                dirs.push(p);
            }
        }
        i += 1;
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_files_give_paths_branches_and_lock_reasons() {
        let tmp = tempfile::tempdir().unwrap();
        let common = tmp.path().join("repo/.git");
        std::fs::create_dir_all(common.join("worktrees/x")).unwrap();
        std::fs::create_dir_all(common.join("worktrees/y")).unwrap();
        std::fs::create_dir_all(common.join("worktrees/broken")).unwrap();
        std::fs::write(common.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let x = common.join("worktrees/x");
        std::fs::write(x.join("gitdir"), "/r/.worktrees/x/.git\n").unwrap();
        std::fs::write(x.join("HEAD"), "ref: refs/heads/x\n").unwrap();
        std::fs::write(x.join("locked"), "why not\n").unwrap();
        let y = common.join("worktrees/y");
        std::fs::write(y.join("gitdir"), "../../../.worktrees/y/.git\n").unwrap();
        std::fs::write(y.join("HEAD"), "0123456789012345678901234567890123456789\n").unwrap();
        let mut l = worktrees(&common).unwrap();
        l[1..].sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].path, tmp.path().join("repo"));
        assert_eq!(l[0].head_ref.as_deref(), Some("refs/heads/main"));
        assert_eq!(l[1].path, Path::new("/r/.worktrees/x"));
        assert_eq!(l[1].head_ref.as_deref(), Some("refs/heads/x"));
        assert_eq!(l[1].locked.as_deref(), Some("why not\n"));
        assert_eq!(l[2].path, tmp.path().join("repo/.worktrees/y"));
        assert_eq!(l[2].head_ref, None);
        assert_eq!(l[2].locked, None);
    }
}
