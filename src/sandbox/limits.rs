//! What one session may use of the host, enforced by the kernel (`sandbox.limits`): memory and
//! tasks (processes and threads) for all of the session's processes together, through a cgroup
//! of its own where the host lets the engine make one, else through rlimits.
//!
//! - **cgroup v2** (most current hosts): a directory beside the engine's own cgroup (in a
//!   delegated subtree: a systemd user service or a `Delegate=yes` unit), or below it when it
//!   is its namespace's root; `memory.max` (no swap), `memory.oom.group` (an OOM kill ends the
//!   whole session), `pids.max`.
//! - **cgroup v1**: a directory below the engine's own in the `memory` and the `pids`
//!   hierarchies; `memory.limit_in_bytes` (and `memsw` where swap is accounted), `pids.max`.
//! - **rlimits** when neither is usable: `RLIMIT_DATA` bounds each process's private memory
//!   (not the session's total); `RLIMIT_NPROC` bounds the tasks of the whole user id, so it is
//!   set to the tasks the user has when the session starts plus the limit (shared with
//!   everything else the user starts meanwhile). Nothing is known of a limit being hit.
//!
//! The session's first process (bubblewrap) joins the cgroup before it executes anything
//! ([`SessionLimits::pre_exec`], run in the forked child), so everything it starts is inside.
//! The cgroup's process list is the kill-all of the session; the cgroup is removed when the
//! session ends. An engine that crashed leaves its empty directories (bubblewrap's
//! `--die-with-parent` ended what was inside): the next session any engine makes in the same
//! parent removes them.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Limits;

/// The cgroup filesystem the engine looks in (an operator's knob, and how tests force the
/// rlimit fallback: a directory without cgroups).
pub const CGROUP_ROOT_ENV: &str = "CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT";
const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Session cgroups are `<prefix><engine pid>-<uuid>`.
const PREFIX: &str = "claude-runtime-adapter-";
/// How often the memory watcher looks for an OOM kill.
const WATCH_EVERY: Duration = Duration::from_millis(100);
const MIB: u64 = 1024 * 1024;

/// The limits of one running session. Dropping it kills whatever is left in its cgroup and
/// removes the cgroup.
pub struct SessionLimits {
    limits: Limits,
    how: How,
    watcher: Option<tokio::task::JoinHandle<()>>,
}

enum How {
    Cgroup(Cgroup),
    Rlimits(Vec<(RlimitResource, u64)>),
}

#[cfg(target_env = "gnu")]
type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type RlimitResource = libc::c_int;

/// One session's cgroup: one directory (v2) or one per hierarchy (v1: memory, pids).
struct Cgroup {
    version: u8,
    /// Every directory made, the one listing the session's processes first.
    dirs: Vec<PathBuf>,
    /// Their `cgroup.procs`, opened before the child is forked (writing `0` moves the writer).
    procs: Vec<OwnedFd>,
    /// The file with the `oom_kill` counter, and the one with the pids `max` counter.
    oom_events: PathBuf,
    pids_events: PathBuf,
}

impl SessionLimits {
    /// Makes the session's cgroup (or picks rlimits) and, with a cgroup and a memory limit,
    /// starts the watcher that ends the session at its first OOM kill. Must run in a Tokio
    /// runtime.
    pub fn create(limits: Limits) -> SessionLimits {
        let root = std::env::var_os(CGROUP_ROOT_ENV)
            .map_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT), PathBuf::from);
        SessionLimits::create_in(&root, limits)
    }

    /// [`SessionLimits::create`] with the cgroup filesystem at `root`.
    fn create_in(root: &Path, limits: Limits) -> SessionLimits {
        let how = match Cgroup::create(root, &limits) {
            Some(cg) => How::Cgroup(cg),
            None => How::Rlimits(rlimits(&limits)),
        };
        let watcher = match &how {
            How::Cgroup(cg) if limits.memory.is_some() => {
                Some(tokio::spawn(watch_oom(cg.killer())))
            }
            _ => None,
        };
        SessionLimits {
            limits,
            how,
            watcher,
        }
    }

    /// What the child runs between fork and exec: join the cgroup, or set the rlimits. Only
    /// async-signal-safe calls on data prepared here.
    pub fn pre_exec(&self) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let fds: Vec<RawFd> = match &self.how {
            How::Cgroup(cg) => cg.procs.iter().map(AsRawFd::as_raw_fd).collect(),
            How::Rlimits(_) => Vec::new(),
        };
        let rlimits = match &self.how {
            How::Rlimits(r) => r.clone(),
            How::Cgroup(_) => Vec::new(),
        };
        move || {
            for fd in &fds {
                // SAFETY: write(2) on a descriptor this process holds (inherited, still open:
                // `SessionLimits` outlives the spawn).
                if unsafe { libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (resource, value) in &rlimits {
                let lim = libc::rlimit {
                    rlim_cur: *value,
                    rlim_max: *value,
                };
                // SAFETY: setrlimit(2) with a valid struct.
                if unsafe { libc::setrlimit(*resource, &lim) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        }
    }

    /// Which mechanism applies and the limits, for the transcript and the logger.
    pub fn describe(&self) -> String {
        let l = &self.limits;
        let mem = l.memory.map_or_else(
            || "no memory limit".into(),
            |m| format!("memory {} MiB", m / MIB),
        );
        let tasks = l
            .tasks
            .map_or_else(|| "no task limit".into(), |t| format!("{t} tasks"));
        let tmp = l.tmpfs.map_or_else(
            || "tmpfs unsized".into(),
            |t| format!("{} MiB per tmpfs", t / MIB),
        );
        match &self.how {
            How::Cgroup(cg) => format!(
                "limits by cgroup v{} ({}): {mem}, {tasks}; {tmp}",
                cg.version,
                cg.dirs[0].display()
            ),
            How::Rlimits(_) => format!(
                "limits by rlimits (no usable cgroup): {mem} per process (RLIMIT_DATA), {tasks} \
                 more for the user id (RLIMIT_NPROC); {tmp}"
            ),
        }
    }

    /// True when the limits are only rlimits (weaker: per process, per user id).
    pub fn is_fallback(&self) -> bool {
        matches!(self.how, How::Rlimits(_))
    }

    /// The kernel limit the session ran into, if any, in words naming the config field.
    pub fn hit(&self) -> Option<String> {
        let How::Cgroup(cg) = &self.how else {
            return None;
        };
        if let (Some(m), true) = (self.limits.memory, counter(&cg.oom_events, "oom_kill") > 0) {
            let mib = m / MIB;
            return Some(format!(
                "the session reached its memory limit (sandbox.limits.memoryMiB = {mib}): the \
                 kernel killed a process for memory and the session was ended"
            ));
        }
        let refused = counter(&cg.pids_events, "max");
        (refused > 0).then(|| {
            format!(
                "the session reached its process limit (sandbox.limits.processes = {}): {refused} \
                 fork(s) refused",
                self.limits.tasks.unwrap_or(0)
            )
        })
    }
}

impl Drop for SessionLimits {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.take() {
            w.abort();
        }
        if let How::Cgroup(cg) = &self.how {
            cg.killer().kill_all();
            cg.remove();
        }
    }
}

/// Ends the session at the first OOM kill in its cgroup (cgroup v2's `memory.oom.group` does
/// so as well; v1 has nothing like it): what is left after the kernel killed one process of a
/// session is not a session to trust.
async fn watch_oom(killer: Killer) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if counter(&killer.oom_events, "oom_kill") > 0 {
            let _ = tokio::task::spawn_blocking(move || killer.kill_all()).await;
            return;
        }
    }
}

/// What killing a session's processes needs (owned, for the watcher).
#[derive(Clone)]
struct Killer {
    procs: PathBuf,
    /// cgroup v2's `cgroup.kill` (Linux 5.14).
    kill: Option<PathBuf>,
    oom_events: PathBuf,
}

impl Killer {
    /// SIGKILL every process in the cgroup until it is empty (bounded: a process may fork while
    /// we kill).
    fn kill_all(&self) {
        if let Some(k) = &self.kill {
            if std::fs::write(k, "1").is_ok() {
                return;
            }
        }
        for _ in 0..50 {
            let pids = std::fs::read_to_string(&self.procs).unwrap_or_default();
            let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: plain syscall; a process that already exited yields ESRCH.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Cgroup {
    /// The session's cgroup under `root`, with the limits written; `None` when the host offers
    /// none the engine may use (nothing is left behind then).
    fn create(root: &Path, limits: &Limits) -> Option<Cgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        if root.join("cgroup.controllers").is_file() {
            Cgroup::create_v2(root, &own, &name, limits)
        } else {
            Cgroup::create_v1(root, &own, &name, limits)
        }
    }

    fn create_v2(root: &Path, own: &str, name: &str, limits: &Limits) -> Option<Cgroup> {
        let parent = v2_parent(root, own)?;
        sweep_leftovers(&parent);
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        let cg = Cgroup {
            version: 2,
            procs: Vec::new(),
            oom_events: dir.join("memory.events"),
            pids_events: dir.join("pids.events"),
            dirs: vec![dir.clone()],
        };
        let written = limits.memory.is_none_or(|m| {
            write(&dir, "memory.max", m)
                && write_optional(&dir, "memory.swap.max", "0")
                && write_optional(&dir, "memory.oom.group", "1")
        }) && limits.tasks.is_none_or(|t| write(&dir, "pids.max", t));
        if !written {
            cg.remove();
            return None;
        }
        cg.opened()
    }

    fn create_v1(root: &Path, own: &str, name: &str, limits: &Limits) -> Option<Cgroup> {
        let memory = v1_parent(root, own, "memory")?;
        let pids = v1_parent(root, own, "pids")?;
        let mut made = Vec::new();
        for parent in [&pids, &memory] {
            sweep_leftovers(parent);
            let dir = parent.join(name);
            if std::fs::create_dir(&dir).is_err() {
                break;
            }
            made.push(dir);
        }
        let cg = Cgroup {
            version: 1,
            procs: Vec::new(),
            oom_events: memory.join(name).join("memory.oom_control"),
            pids_events: pids.join(name).join("pids.events"),
            dirs: made,
        };
        let (pids, memory) = (pids.join(name), memory.join(name));
        let written = cg.dirs.len() == 2
            && limits.memory.is_none_or(|m| {
                // memsw (memory + swap) exists where swap is accounted; it may not be set
                // below the memory limit, so it goes second.
                write(&memory, "memory.limit_in_bytes", m)
                    && write_optional(&memory, "memory.memsw.limit_in_bytes", &m.to_string())
            })
            && limits.tasks.is_none_or(|t| write(&pids, "pids.max", t));
        if !written {
            cg.remove();
            return None;
        }
        cg.opened()
    }

    /// With every `cgroup.procs` open; removed when one cannot be opened.
    fn opened(mut self) -> Option<Cgroup> {
        for dir in &self.dirs {
            match std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
            {
                Ok(f) => self.procs.push(f.into()),
                Err(_) => {
                    self.remove();
                    return None;
                }
            }
        }
        Some(self)
    }

    fn killer(&self) -> Killer {
        let kill = self.dirs[0].join("cgroup.kill");
        Killer {
            procs: self.dirs[0].join("cgroup.procs"),
            kill: (self.version == 2 && kill.exists()).then_some(kill),
            oom_events: self.oom_events.clone(),
        }
    }

    /// Removes the (emptied) directories; an exiting process may keep one busy a moment.
    fn remove(&self) {
        for dir in &self.dirs {
            for _ in 0..100 {
                match std::fs::remove_dir(dir) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => break,
                }
            }
        }
    }
}

/// cgroup v2: where the session's cgroup goes. The engine's own cgroup takes children with
/// controllers only when it is the root (a cgroup with processes cannot enable controllers for
/// children); its parent does in a delegated subtree (systemd's user service, a `Delegate=yes`
/// unit). Moving a process between cgroups takes write access to the `cgroup.procs` of their
/// common ancestor (the parent here): the delegation check.
fn v2_parent(root: &Path, own: &str) -> Option<PathBuf> {
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mine = root.join(path.trim_start_matches('/'));
    let found = [Some(mine.as_path()), mine.parent()]
        .into_iter()
        .flatten()
        .find(|p| {
            p.starts_with(root) && writable(&p.join("cgroup.procs")) && enable_v2_controllers(p)
        })
        .map(Path::to_path_buf);
    found
}

/// cgroup v1: the engine's own directory in `controller`'s hierarchy (`<root>/<controller>`).
fn v1_parent(root: &Path, own: &str, controller: &str) -> Option<PathBuf> {
    let path = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, list, path) = (f.next()?, f.next()?, f.next()?);
        list.split(',').any(|c| c == controller).then_some(path)
    })?;
    let dir = root.join(controller).join(path.trim_start_matches('/'));
    dir.join("cgroup.procs").is_file().then_some(dir)
}

/// True when children of `parent` get the memory and pids controllers (enabling them if the
/// parent has them and lets us).
fn enable_v2_controllers(parent: &Path) -> bool {
    let has = |file: &str| {
        let list = std::fs::read_to_string(parent.join(file)).unwrap_or_default();
        let words: Vec<&str> = list.split_whitespace().collect();
        words.contains(&"memory") && words.contains(&"pids")
    };
    has("cgroup.subtree_control")
        || (has("cgroup.controllers")
            && std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids").is_ok()
            && has("cgroup.subtree_control"))
}

/// Removes the session cgroups of engines that are gone (a crash: their processes went with
/// bubblewrap's `--die-with-parent`; a directory still holding processes is not removable).
fn sweep_leftovers(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// access(2) `W_OK`: what the kernel checks of the engine's credentials.
fn writable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn write(dir: &Path, file: &str, value: u64) -> bool {
    std::fs::write(dir.join(file), value.to_string()).is_ok()
}

/// A setting that not every kernel or host has: absent is fine, refused is not.
fn write_optional(dir: &Path, file: &str, value: &str) -> bool {
    let p = dir.join(file);
    !p.exists() || std::fs::write(p, value).is_ok()
}

/// The value of `key` in a flat-keyed cgroup file (`memory.events`, `pids.events`,
/// `memory.oom_control`); 0 when absent.
fn counter(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0)
}

/// The fallback: `RLIMIT_DATA` for memory; `RLIMIT_NPROC` at the user id's current task count
/// plus the limit (it counts every task of the user id, not the session's).
fn rlimits(limits: &Limits) -> Vec<(RlimitResource, u64)> {
    let mut out = Vec::new();
    if let Some(m) = limits.memory {
        out.push((libc::RLIMIT_DATA, m));
    }
    if let Some(t) = limits.tasks {
        out.push((libc::RLIMIT_NPROC, user_tasks().saturating_add(t)));
    }
    out
}

/// Tasks (threads) of the engine's real user id now, as `RLIMIT_NPROC` counts them.
fn user_tasks() -> u64 {
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            n += field("Threads:").unwrap_or(1);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    const LIMITS: Limits = Limits {
        memory: Some(1024 * MIB),
        tasks: Some(64),
        tmpfs: None,
    };

    /// A `sleep` started as the session's first process is.
    fn start(limits: &SessionLimits) -> std::process::Child {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: the hook is async-signal-safe (see `pre_exec`).
        unsafe {
            cmd.pre_exec(limits.pre_exec());
        }
        cmd.spawn().unwrap()
    }

    fn limit_of(pid: u32, name: &str) -> String {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn without_a_usable_cgroup_the_limits_are_rlimits_set_before_exec() {
        let empty = tempfile::tempdir().unwrap();
        let limits = SessionLimits::create_in(empty.path(), LIMITS);
        assert!(limits.is_fallback());
        assert!(limits.describe().starts_with("limits by rlimits (no usable cgroup): memory 1024 MiB per process (RLIMIT_DATA), 64 tasks more for the user id (RLIMIT_NPROC)"), "{}", limits.describe());
        let mut child = start(&limits);
        let pid = child.id();
        assert_eq!(limit_of(pid, "Max data size"), (1024 * MIB).to_string());
        // The user id's tasks then (which other tests change meanwhile) plus 64.
        let nproc: u64 = limit_of(pid, "Max processes").parse().unwrap();
        assert!(nproc > 64, "{nproc}");
        assert_eq!(limits.hit(), None);
        child.kill().unwrap();
        child.wait().unwrap();
        // Nothing was made under the root.
        assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn no_limit_configured_sets_no_rlimit() {
        let empty = tempfile::tempdir().unwrap();
        let none = Limits {
            memory: None,
            tasks: None,
            tmpfs: None,
        };
        let limits = SessionLimits::create_in(empty.path(), none);
        let mut child = start(&limits);
        assert_eq!(limit_of(child.id(), "Max data size"), "unlimited");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// On a host with a cgroup the engine may use (this CI machine: cgroup v1, as root).
    #[tokio::test]
    async fn the_first_process_runs_in_the_session_cgroup_which_dropping_empties_and_removes() {
        let limits = SessionLimits::create(LIMITS);
        let How::Cgroup(cg) = &limits.how else {
            eprintln!("skipped: no usable cgroup here ({})", limits.describe());
            return;
        };
        let dirs = cg.dirs.clone();
        let mut child = start(&limits);
        let procs = std::fs::read_to_string(dirs[0].join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == child.id().to_string()),
            "{procs}"
        );
        // The first directory holds the pids controller in either version.
        let max = std::fs::read_to_string(dirs[0].join("pids.max")).unwrap();
        assert_eq!(max.trim(), "64");
        drop(limits);
        // Killed by the drop (reaped here), and every directory gone.
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        for d in dirs {
            assert!(!d.exists(), "{}", d.display());
        }
    }

    #[test]
    fn leftovers_of_engines_that_are_gone_are_removed_and_others_kept() {
        let t = tempfile::tempdir().unwrap();
        let gone = t.path().join(format!("{PREFIX}{}-abc", u32::MAX));
        let alive = t.path().join(format!("{PREFIX}{}-abc", std::process::id()));
        let other = t.path().join("user.slice");
        for d in [&gone, &alive, &other] {
            std::fs::create_dir(d).unwrap();
        }
        sweep_leftovers(t.path());
        assert!(!gone.exists() && alive.exists() && other.exists());
    }

    /// A fake cgroup directory: its controllers, those enabled for children, `cgroup.procs`.
    fn fake(dir: &Path, controllers: &str, subtree: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(dir.join("cgroup.subtree_control"), subtree).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
    }

    #[test]
    fn cgroup_v2_sessions_go_beside_the_engine_in_a_delegated_parent_or_below_a_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fake(root, "cpu memory pids", "memory pids");
        fake(&root.join("app.slice"), "memory pids", "memory pids");
        // The engine's scope holds the engine: no controllers for children there.
        fake(&root.join("app.slice/engine.scope"), "memory pids", "");
        let own = "0::/app.slice/engine.scope\n";
        assert_eq!(v2_parent(root, own), Some(root.join("app.slice")));
        // In its namespace's root the engine's own cgroup is the parent.
        assert_eq!(v2_parent(root, "0::/\n"), Some(root.to_path_buf()));
        // A parent without the pids controller: no cgroup (the rlimits apply).
        fake(&root.join("lean.slice"), "memory", "memory");
        fake(&root.join("lean.slice/engine.scope"), "memory", "");
        assert_eq!(v2_parent(root, "0::/lean.slice/engine.scope\n"), None);
        // Never above the cgroup root; nothing without a v2 line.
        assert_eq!(
            v2_parent(&root.join("app.slice"), "0::/\n"),
            Some(root.join("app.slice"))
        );
        assert_eq!(v2_parent(root, "4:memory:/x\n"), None);
    }

    #[test]
    fn cgroup_v1_sessions_go_below_the_engine_in_each_hierarchy() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fake(&root.join("memory/process_api/abc"), "", "");
        fake(&root.join("pids"), "", "");
        let own = "3:cpu,cpuacct:/\n4:memory:/process_api/abc\n8:pids:/\n0::/\n";
        assert_eq!(
            v1_parent(root, own, "memory"),
            Some(root.join("memory/process_api/abc"))
        );
        assert_eq!(v1_parent(root, own, "pids"), Some(root.join("pids")));
        assert_eq!(v1_parent(root, own, "cpu"), None);
    }

    #[test]
    fn counters_are_read_from_flat_keyed_files() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(counter(&f, "oom_kill"), 3);
        assert_eq!(counter(&f, "max"), 0);
        assert_eq!(counter(&t.path().join("absent"), "max"), 0);
    }
}
