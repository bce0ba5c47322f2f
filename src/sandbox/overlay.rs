//! A copy-on-write view of a directory, mounted in the namespace of the process about to run
//! bubblewrap: overlayfs with the shared base as its lower layer and the session's own layer as
//! its upper one (see [`crate::git::layer`] for what they hold).
//!
//! Why here and not in bwrap: bubblewrap 0.8 (Debian 12) has no `--overlay` (0.9 added it).
//! So the child, between fork and exec, makes a user namespace (mapping only its own uid and
//! gid, which needs no privilege) and a mount namespace, mounts the overlay there (Linux 5.11+
//! lets a user namespace mount overlayfs), and execs bwrap, which builds the sandbox inside
//! and binds the merged directory like any other. Nothing is mounted in the host's namespace:
//! the mount exists exactly as long as the processes of that namespace, so no crash can leave
//! one behind. The agent keeps the uid and gid it has without the overlay
//! ([`Overlay::ids`]: bwrap's `--uid`/`--gid`).
//!
//! Two mounts of one upper layer at once are undefined in overlayfs: the adapter mounts a
//! session's layer for one process tree at a time (its CLI, then its extraction).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::git::layer::remove_tree;

/// One overlay mount: `lower` read-only below, `upper` taking every write (`work` is
/// overlayfs's scratch directory on the same file system), merged at `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub target: PathBuf,
}

impl Overlay {
    /// The option string, or why these paths cannot be given to overlayfs (its option syntax
    /// gives ',' ':' and '\' meanings, and a NUL cannot be passed at all).
    fn options(&self) -> Result<CString, String> {
        let mut data = Vec::new();
        for (key, p) in [
            ("lowerdir", &self.lower),
            ("upperdir", &self.upper),
            ("workdir", &self.work),
        ] {
            let bytes = p.as_os_str().as_bytes();
            if bytes.iter().any(|b| b",:\\\0".contains(b)) {
                return Err(format!(
                    "the path {} has a character overlayfs options cannot carry (',' ':' '\\')",
                    p.display()
                ));
            }
            if !data.is_empty() {
                data.push(b',');
            }
            data.extend_from_slice(key.as_bytes());
            data.push(b'=');
            data.extend_from_slice(bytes);
        }
        // Its markers (a directory made opaque, a directory's move) as `user.overlay.*`
        // xattrs: the mount is in a user namespace, which may not set `trusted.*`, and
        // without this `rm -rf` of a directory of the base ended in EIO (Linux 5.11+).
        data.extend_from_slice(b",userxattr");
        CString::new(data).map_err(|e| e.to_string())
    }

    /// The uid and gid the sandbox's processes get (bwrap's `--uid`/`--gid`): the ones this
    /// process has, which the namespace made for the mount maps to its root.
    pub fn ids() -> (u32, u32) {
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        unsafe { (libc::getuid(), libc::getgid()) }
    }

    /// What the child runs before exec: a user and mount namespace of its own, this overlay
    /// mounted in it. Everything is prepared here; the closure makes system calls only
    /// (async-signal-safe, as between fork and exec it must be).
    pub fn pre_exec(
        &self,
    ) -> Result<impl FnMut() -> std::io::Result<()> + Send + Sync + 'static, String> {
        let data = self.options()?;
        let target = CString::new(self.target.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        let (uid, gid) = Overlay::ids();
        let uid_map = CString::new(format!("0 {uid} 1")).map_err(|e| e.to_string())?;
        let gid_map = CString::new(format!("0 {gid} 1")).map_err(|e| e.to_string())?;
        Ok(move || {
            // SAFETY: plain system calls on memory owned by the closure.
            unsafe {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Without "deny" an unprivileged process may not write its gid_map.
                write_proc(c"/proc/self/setgroups", c"deny", true)?;
                write_proc(c"/proc/self/uid_map", &uid_map, false)?;
                write_proc(c"/proc/self/gid_map", &gid_map, false)?;
                // The new mount namespace must not pass the overlay back to the host's.
                if libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::mount(
                    c"overlay".as_ptr(),
                    target.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    data.as_ptr().cast(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    }
}

/// Writes `content` to a /proc file with raw system calls. `optional`: a missing file is fine
/// (`setgroups` came in Linux 3.19).
unsafe fn write_proc(
    path: &std::ffi::CStr,
    content: &std::ffi::CStr,
    optional: bool,
) -> std::io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return if optional && e.raw_os_error() == Some(libc::ENOENT) {
            Ok(())
        } else {
            Err(e)
        };
    }
    let bytes = content.to_bytes();
    let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    let e = std::io::Error::last_os_error();
    libc::close(fd);
    if n == bytes.len() as isize {
        Ok(())
    } else {
        Err(e)
    }
}

/// Whether an overlay can be mounted here for layers under `dir` (the file system the layers
/// go on, in the namespace this process may make): tried once per directory by mounting one
/// in a child. `Err` says why not, for the log.
pub fn available(dir: &Path) -> Result<(), String> {
    static TRIED: Mutex<Vec<(PathBuf, Result<(), String>)>> = Mutex::new(Vec::new());
    let mut tried = TRIED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = tried.iter().find(|(d, _)| d == dir) {
        return r.clone();
    }
    let r = try_mount(dir);
    tried.push((dir.to_path_buf(), r.clone()));
    r
}

fn try_mount(dir: &Path) -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("overlayfs is Linux's".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let probe = dir.join(format!(".overlay-probe-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir(&probe)
        .map_err(|e| format!("cannot create a directory in {}: {e}", dir.display()))?;
    let result = probe_in(&probe);
    let _ = remove_tree(&probe);
    result
}

fn probe_in(p: &Path) -> Result<(), String> {
    let overlay = Overlay {
        lower: p.join("l"),
        upper: p.join("u"),
        work: p.join("w"),
        target: p.join("m"),
    };
    for d in [
        &overlay.lower,
        &overlay.upper,
        &overlay.work,
        &overlay.target,
    ] {
        std::fs::create_dir(d).map_err(|e| e.to_string())?;
    }
    std::fs::write(overlay.lower.join("f"), b"lower").map_err(|e| e.to_string())?;
    std::fs::create_dir_all(overlay.lower.join("d/e")).map_err(|e| e.to_string())?;
    // The way a session uses it: bubblewrap started inside the namespace the overlay is in.
    let bwrap = super::find_on_path("bwrap", std::env::var_os("PATH").as_deref())
        .ok_or("bubblewrap (bwrap) is not on PATH")?;
    let jail = super::Jail::new(&super::JailPlan {
        cwd: overlay.target.clone(),
        writable: vec![overlay.target.clone()],
        overlay: Some(overlay.clone()),
        ..super::JailPlan::default()
    });
    // What an agent does to the base: a file changed and removed, a directory removed and
    // one made in its place (each needs the overlay's markers).
    let script = "echo upper > f && rm f && rm -rf d && mkdir -p d/x".into();
    let mut cmd = std::process::Command::new(bwrap);
    cmd.args(jail.argv("sh".as_ref(), &["-c".into(), script]))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let hook = overlay.pre_exec()?;
    // SAFETY: the hook makes system calls only (see `Overlay::pre_exec`).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, hook);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("mounting overlayfs in a user namespace failed: {e}"))?;
    let lower_kept = std::fs::read(overlay.lower.join("f")).ok().as_deref() == Some(b"lower");
    let whiteout = std::fs::symlink_metadata(overlay.upper.join("f")).is_ok();
    if out.status.success() && lower_kept && whiteout {
        Ok(())
    } else {
        Err(format!(
            "a test overlay did not behave ({}; lower kept: {lower_kept}; deletion recorded: \
             {whiteout}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(t: &Path) -> Overlay {
        let o = Overlay {
            lower: t.join("lower"),
            upper: t.join("upper"),
            work: t.join("work"),
            target: t.join("merged"),
        };
        for d in [&o.lower, &o.upper, &o.work, &o.target] {
            std::fs::create_dir_all(d).unwrap();
        }
        o
    }

    #[test]
    fn paths_overlayfs_options_cannot_carry_are_refused_naming_the_path() {
        let t = tempfile::tempdir().unwrap();
        let mut o = layers(t.path());
        assert!(o.options().is_ok());
        o.upper = t.path().join("a,b");
        let err = o.options().unwrap_err();
        assert!(err.contains("a,b"), "{err}");
        o.upper = t.path().join("a:b");
        assert!(o.pre_exec().is_err());
    }

    /// The mount exists in the child's namespace only: its writes land in `upper`, `lower` is
    /// untouched, a deletion is recorded in `upper`, and the host's `target` stays empty.
    #[test]
    fn writes_in_the_merged_view_land_in_upper_and_the_host_sees_no_mount() {
        let t = tempfile::tempdir().unwrap();
        let o = layers(t.path());
        std::fs::write(o.lower.join("kept"), "lower\n").unwrap();
        std::fs::write(o.lower.join("deleted"), "lower\n").unwrap();
        let script = format!(
            "cd {} && cat kept && echo new > kept && rm deleted && echo added > added",
            o.target.display()
        );
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", &script]);
        let hook = o.pre_exec().unwrap();
        // SAFETY: the hook makes system calls only.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, hook);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "lower\n");
        assert_eq!(
            std::fs::read_to_string(o.lower.join("kept")).unwrap(),
            "lower\n"
        );
        assert!(o.lower.join("deleted").exists());
        assert_eq!(
            std::fs::read_to_string(o.upper.join("kept")).unwrap(),
            "new\n"
        );
        assert_eq!(
            std::fs::read_to_string(o.upper.join("added")).unwrap(),
            "added\n"
        );
        // A whiteout: a character device 0/0 where the deleted file was.
        use std::os::unix::fs::FileTypeExt;
        let whiteout = std::fs::symlink_metadata(o.upper.join("deleted")).unwrap();
        assert!(whiteout.file_type().is_char_device());
        assert_eq!(std::fs::read_dir(&o.target).unwrap().count(), 0);
        remove_tree(t.path()).unwrap();
        assert!(!t.path().exists());
    }
}
