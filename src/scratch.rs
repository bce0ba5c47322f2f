//! The adapter's own directories in the engine's temp dir: a session's sockets, a pod's history
//! server, the scratch repository a pod's patch is computed in. Each is removed when its owner
//! drops it; an engine killed before that (SIGKILL, a crash) leaves them, so each is named after
//! the process that made it — `claude-runtime-adapter-<kind>-<pid>-<start>-<id>`, `start` being
//! the process's start time, as in the worktrees' owner record (pids are reused) — and the next
//! adapter removes exactly those whose process is gone. The name is the record: the directory's
//! content may be the sandbox's to write, its name is not. A directory of that prefix without
//! the record (an older version's, anybody else's) is never touched.

use std::path::{Path, PathBuf};

use crate::process::Owner;

const PREFIX: &str = "claude-runtime-adapter-";

/// One of the adapter's temp directories (mode 0700), removed with everything in it on drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Makes `$TMPDIR/claude-runtime-adapter-<kind>-<pid>-<start>-<id>`; `kind` is one word.
    pub fn create(kind: &str) -> std::io::Result<ScratchDir> {
        Self::create_in(&std::env::temp_dir(), kind)
    }

    fn create_in(parent: &Path, kind: &str) -> std::io::Result<ScratchDir> {
        debug_assert!(!kind.is_empty() && !kind.contains('-'));
        let me = Owner::current();
        // 12 hex digits: unique enough beside the pid, and short, since sockets live inside
        // (a socket's path has at most 107 bytes).
        let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let dir = parent.join(format!("{PREFIX}{kind}-{}-{}-{id}", me.pid, me.start_time));
        std::fs::create_dir(&dir)?;
        let dir = ScratchDir(dir);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The owner a directory's name records, if it is one of ours.
fn owner_of(name: &str) -> Option<Owner> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut fields = rest.rsplitn(4, '-');
    let (id, start, pid, kind) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let ok = !kind.is_empty()
        && kind.chars().all(|c| c.is_ascii_lowercase())
        && id.len() == 12
        && id.chars().all(|c| c.is_ascii_hexdigit());
    ok.then_some(Owner::on_this_host(pid.parse().ok()?, start.parse().ok()?))
}

/// Removes the temp directories of adapters whose process is gone; returns them.
pub fn sweep() -> Vec<PathBuf> {
    sweep_in(&std::env::temp_dir())
}

fn sweep_in(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let Some(owner) = e.file_name().to_str().and_then(owner_of) else {
            continue;
        };
        // Only directories (never follows a link: file_type is the entry's own).
        if !e.file_type().is_ok_and(|t| t.is_dir()) || owner.is_alive() {
            continue;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_dir_is_private_named_after_its_process_and_gone_when_dropped() {
        let t = tempfile::tempdir().unwrap();
        let d = ScratchDir::create_in(t.path(), "sockets").unwrap();
        std::fs::write(d.path().join("f"), "x").unwrap();
        let name = d.path().file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(owner_of(&name), Some(Owner::current()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(d.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        // A live owner's directory is kept by a sweep.
        assert!(sweep_in(t.path()).is_empty());
        assert!(d.path().exists());
        let path = d.path().to_path_buf();
        drop(d);
        assert!(!path.exists());
    }

    #[test]
    fn the_sweep_removes_only_recorded_dirs_of_processes_that_are_gone() {
        let t = tempfile::tempdir().unwrap();
        // A child that has exited and been reaped: its pid names no process of that start time.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mk = |name: &str| {
            let p = t.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("sock"), "").unwrap();
            p
        };
        let dead = mk(&format!("{PREFIX}history-{pid}-1-0123456789ab"));
        let me = Owner::current();
        let alive = mk(&format!(
            "{PREFIX}extract-{}-{}-0123456789ab",
            me.pid, me.start_time
        ));
        let unrecorded = mk(&format!("{PREFIX}0123456789abcdef0123456789abcdef"));
        let foreign = mk("someone-else-1-1-0123456789ab");
        let file = t
            .path()
            .join(format!("{PREFIX}sockets-{pid}-1-0123456789ab"));
        std::fs::write(&file, "").unwrap();
        assert_eq!(sweep_in(t.path()), vec![dead.clone()]);
        assert!(!dead.exists());
        for kept in [&alive, &unrecorded, &foreign, &file] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

    #[test]
    fn names_that_are_not_a_record_are_not_ours() {
        for name in [
            "claude-runtime-adapter-",
            "claude-runtime-adapter-x-1-2",
            "claude-runtime-adapter-x-1-2-0123456789ab0",
            "claude-runtime-adapter-x-y-2-0123456789ab",
            "claude-runtime-adapter--1-2-0123456789ab",
            "claude-runtime-adapter-Kind-1-2-0123456789ab",
            "claude-runtime-adapter-a-b-1-2-0123456789ab",
            "claude-runtime-adapter-0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(owner_of(name), None, "{name}");
        }
    }
}
