//! An Implementor's copy-on-write layer over a shared base ([`super::base`], which makes one
//! per checkout): where its parts are, what a sandbox mounts to show it, its record, its
//! directories and their removal. One module, so the session's sandbox and the jail its
//! extraction runs in mount a layer alike: both ask [`Layer::mounts`].
//!
//! `<repoRoot>/.worktrees/.layer-<uuid>/` holds `upper/` (every file the agent writes,
//! deletions as overlayfs whiteouts), `work/` (overlayfs's scratch) and `git/`, the checkout's
//! own git dir: the base's small files (HEAD, config, refs, the index with its timestamps, so
//! `git status` is clean and instant) and an object store borrowing the base's, with the
//! session's branch at the commit. The checkout is the overlay of `upper` on the base, mounted
//! at `<repoRoot>/.worktrees/<branch>` only inside the session's sandbox and the jail its
//! extraction runs in (the sandbox mounts it, `crate::sandbox::overlay`); on the host that
//! directory holds just the `.git` file naming `git/` (which the overlay replaces by the same
//! file in `upper`). An operator finds a session's work in `upper/`, and its commits in `git/`.
//! Its record ([`LayerRecord`]) names the base and the layer, so a sweep saves its work exactly
//! as a clone's and then removes all three.

use std::path::{Path, PathBuf};

use super::list::object_dirs;
use super::record::{AdminRecord, LayerRecord};

/// The name every layer directory starts with (a ref component cannot: no branch has it).
const LAYER_PREFIX: &str = ".layer-";

/// Where a layered checkout's parts are (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// The base's directory (the overlay's lower layer).
    pub base: PathBuf,
    /// The layer's own directory.
    pub dir: PathBuf,
}

/// What a sandbox mounts to show a layered checkout: the overlay, the checkout's git dir
/// writable, and the object stores that git dir reads through (the base's and what they
/// borrow) readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerMounts {
    /// The base, read-only below the overlay.
    pub lower: PathBuf,
    /// Takes every write.
    pub upper: PathBuf,
    /// overlayfs's scratch directory (on `upper`'s file system).
    pub work: PathBuf,
    /// Where the overlay is mounted: the checkout.
    pub target: PathBuf,
    /// The checkout's own git dir.
    pub git_dir: PathBuf,
    /// The object stores its git reads (the base's snapshot among them).
    pub objects: Vec<PathBuf>,
}

impl Layer {
    /// A new layer over the base at `base`, in `worktrees` (`<repoRoot>/.worktrees`).
    pub(crate) fn new(base: &Path, worktrees: &Path) -> Layer {
        Layer {
            base: base.to_path_buf(),
            dir: worktrees.join(format!("{LAYER_PREFIX}{}", uuid::Uuid::new_v4())),
        }
    }

    pub(crate) fn from_record(r: &LayerRecord) -> Layer {
        Layer {
            base: PathBuf::from(&r.base),
            dir: PathBuf::from(&r.dir),
        }
    }

    /// What its checkout's record says of it.
    pub(crate) fn record(&self) -> LayerRecord {
        LayerRecord {
            base: self.base.display().to_string(),
            dir: self.dir.display().to_string(),
        }
    }

    fn upper(&self) -> PathBuf {
        self.dir.join("upper")
    }

    fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// The checkout's own git dir.
    pub fn git_dir(&self) -> PathBuf {
        self.dir.join("git")
    }

    /// What the session writes of the layer: `upper` (its files) and the checkout's git dir
    /// (its commits' objects); never the shared base.
    pub fn written(&self) -> Vec<PathBuf> {
        vec![self.upper(), self.git_dir()]
    }

    /// The base's git dir (its object store holds the snapshot).
    fn base_git_dir(&self) -> PathBuf {
        self.base.join(".git")
    }

    /// What a sandbox mounts to show the checkout at `target`.
    pub fn mounts(&self, target: &Path) -> LayerMounts {
        LayerMounts {
            lower: self.base.clone(),
            upper: self.upper(),
            work: self.work(),
            target: target.to_path_buf(),
            git_dir: self.git_dir(),
            objects: object_dirs(&self.base_git_dir()),
        }
    }

    /// The layer's directories, its git dir, and the `.git` files (at `target` on the host,
    /// and in `upper`, which the overlay shows at the same place).
    pub(crate) fn create(&self, target: &Path) -> std::io::Result<()> {
        let base_git = self.base_git_dir();
        let git = self.git_dir();
        for d in [
            self.upper(),
            self.work(),
            git.join("objects/info"),
            git.join("refs/heads"),
            git.join("refs/tags"),
        ] {
            std::fs::create_dir_all(d)?;
        }
        std::fs::create_dir_all(target)?;
        let mut pointer = b"gitdir: ".to_vec();
        pointer.extend_from_slice(git.as_os_str().as_encoded_bytes());
        pointer.push(b'\n');
        std::fs::write(target.join(".git"), &pointer)?;
        std::fs::write(self.upper().join(".git"), &pointer)?;
        let mut alternates = base_git
            .join("objects")
            .into_os_string()
            .into_encoded_bytes();
        alternates.push(b'\n');
        std::fs::write(git.join("objects/info/alternates"), alternates)?;
        for f in ["HEAD", "config", "shallow", "packed-refs"] {
            match std::fs::copy(base_git.join(f), git.join(f)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::create_dir_all(git.join("info"))?;
        // The index with its timestamps: git then trusts the base's stat data for every file
        // the agent has not touched (overlayfs shows the lower file's own), so `git status` is
        // clean without reading the tree.
        let index = base_git.join("index");
        if let Ok(meta) = std::fs::metadata(&index) {
            std::fs::copy(&index, git.join("index"))?;
            let copy = std::fs::File::options()
                .write(true)
                .open(git.join("index"))?;
            copy.set_modified(meta.modified()?)?;
        }
        Ok(())
    }
}

/// Removes a directory tree the adapter made — a layer, a clone, a base; nothing there is
/// success. An agent can make its checkout unremovable for a non-root engine (`mkdir -p d/e &&
/// chmod 000 d`: `d` can be neither listed nor emptied), as overlayfs does with `work/work`;
/// then the removal failed, the record stayed and every later sweep tried again. So when
/// removing fails, the owner gets its permissions back on every directory inside
/// ([`restore_owner_access`]) and the removal is tried once more.
pub fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let remove = || match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    remove().or_else(|_| {
        #[cfg(unix)]
        restore_owner_access(dir);
        remove()
    })
}

/// Gives the owner read, write and search permission on `root` and every directory below it.
/// Directories are found by lstat and changed without following a symlink (a link in the
/// checkout to a directory outside is neither entered nor changed): only what lies inside the
/// tree is touched. Nothing of the agent runs by then (its sandbox is gone), so nothing swaps
/// a directory for a link between the two. Best effort: the removal that follows reports what
/// still fails.
#[cfg(unix)]
fn restore_owner_access(root: &Path) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.file_type().is_dir() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o700 != 0o700 {
            let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
            unsafe {
                libc::fchmodat(
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    (mode | 0o700) as libc::mode_t,
                    libc::AT_SYMLINK_NOFOLLOW,
                );
            }
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        // The entry's own type (no stat through a link): a symlink is never a directory here.
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
}

/// Removes the layer a clone record names, if any (a session's cleanup, a rollback, a sweep).
pub(crate) fn remove_recorded_layer(record: Option<&AdminRecord>) -> std::io::Result<()> {
    match record.and_then(|r| r.layer.as_ref()) {
        Some(l) => remove_tree(&Layer::from_record(l).dir),
        None => Ok(()),
    }
}
