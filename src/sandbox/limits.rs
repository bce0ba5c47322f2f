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
//! Inside the session's cgroup the agent's commands get one of their own with a smaller share
//! ([`commands_share`]): the session's cgroup has a child for the CLI (`cli`) and one for the
//! agent's commands (`tools`), which every Bash command joins first (`CLAUDE_CODE_SHELL_PREFIX`:
//! [`TOOLS_PREFIX_SCRIPT`], given the `tools` cgroup's `cgroup.procs` and nothing else of the
//! cgroup filesystem). `pids.max` counts threads and the CLI is one of the session's tasks: a
//! command that forks thousands of processes would otherwise take every task and the CLI, unable
//! to make a thread, would abort and lose the session. Now the command's forks fail with EAGAIN
//! and a command that outgrows its memory share is killed by the kernel (the agent sees both,
//! as in a person's shell), while the CLI keeps its headroom and the session goes on. What still
//! ends a session: the CLI itself killed for memory (the session's whole limit reached), or the
//! session's own task limit reached by the CLI. With rlimits the commands' share is a lower
//! `RLIMIT_NPROC` set by the same prefix (`ulimit`), counted in the sandbox's user namespace.
//!
//! The session's first process (bubblewrap) joins the `cli` cgroup before it executes anything
//! ([`SessionLimits::pre_exec`], run in the forked child), so everything it starts is inside.
//! The cgroup's process list is the kill-all of the session; the cgroup is removed when the
//! session ends. An engine that crashed leaves its empty directories (bubblewrap's
//! `--die-with-parent` ended what was inside): the next session any engine makes in the same
//! parent removes them.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::commands::{commands_share, CLI, TOOLS};
use crate::config::Limits;

/// The cgroup filesystem the engine looks in (an operator's knob, and how tests force the
/// rlimit fallback: a directory without cgroups).
pub const CGROUP_ROOT_ENV: &str = "CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT";
const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Session cgroups are `<prefix><engine pid>-<uuid>`.
const PREFIX: &str = "claude-runtime-adapter-";
/// What [`SessionLimits::commands_setup`] gives the sandbox: files to bind (host path, name
/// beside the prefix script) and variables for the prefix.
pub type CommandsSetup = (Vec<(PathBuf, String)>, Vec<(String, String)>);

/// How often the memory watcher looks for an OOM kill.
const WATCH_EVERY: Duration = Duration::from_millis(100);
const MIB: u64 = 1024 * 1024;

/// The limits of one running session. Dropping it kills whatever is left in its cgroup and
/// removes the cgroup.
pub struct SessionLimits {
    limits: Limits,
    /// The agent's commands' part of `limits` ([`commands_share`]).
    commands: Limits,
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

/// One session's cgroup: one directory (v2) or one per hierarchy (v1: pids, memory), each with
/// its [`CLI`] and [`TOOLS`] children.
struct Cgroup {
    version: u8,
    /// The session's directory in each hierarchy, the one with the pids controller first.
    dirs: Vec<PathBuf>,
    /// The CLI children's `cgroup.procs`, opened before the child is forked (writing `0` moves
    /// the writer).
    procs: Vec<OwnedFd>,
    /// The `oom_kill` counters of the CLI's part and of the commands' part.
    oom_events: PathBuf,
    tools_oom_events: PathBuf,
    /// The pids `max` counters of the session's own limit and of the commands' limit.
    pids_events: PathBuf,
    tools_pids_events: PathBuf,
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
        let commands = commands_share(&limits);
        let how = match Cgroup::create(root, &limits, &commands) {
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
            commands,
            how,
            watcher,
        }
    }

    /// The files inside the sandbox that put a command under the commands' limits: the `tools`
    /// cgroups' `cgroup.procs` (host path, name beside the prefix script), and the environment
    /// the prefix needs (the commands' `RLIMIT_NPROC` with rlimits).
    pub fn commands_setup(&self) -> CommandsSetup {
        match &self.how {
            How::Cgroup(cg) => {
                let files = cg
                    .dirs
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        (
                            d.join(TOOLS).join("cgroup.procs"),
                            format!("tools-{i}.procs"),
                        )
                    })
                    .collect();
                (files, Vec::new())
            }
            How::Rlimits(r) => {
                // The sandbox's user namespace counts its own tasks: the commands may have the
                // share, the CLI the rest up to the session's limit.
                let env = r
                    .iter()
                    .any(|(res, _)| *res == libc::RLIMIT_NPROC)
                    .then_some(self.commands.tasks)
                    .flatten()
                    .map(|n| ("CRA_TOOLS_NPROC".to_string(), n.to_string()));
                (Vec::new(), env.into_iter().collect())
            }
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
        let c = &self.commands;
        let share = match (c.memory, c.tasks) {
            (None, None) => String::new(),
            (m, t) => format!(
                " (the agent's commands: {})",
                [
                    m.map(|m| format!("memory {} MiB", m / MIB)),
                    t.map(|t| format!("{t} tasks"))
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            ),
        };
        match &self.how {
            How::Cgroup(cg) => format!(
                "limits by cgroup v{} ({}): {mem}, {tasks}{share}; {tmp}",
                cg.version,
                cg.dirs[0].display()
            ),
            How::Rlimits(_) => {
                let share = c.tasks.map_or_else(String::new, |t| {
                    format!(" (the agent's commands: {t} tasks in the sandbox, RLIMIT_NPROC)")
                });
                format!(
                    "limits by rlimits (no usable cgroup): {mem} per process (RLIMIT_DATA), \
                     {tasks} more for the user id (RLIMIT_NPROC){share}; {tmp}"
                )
            }
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

    /// The commands' limits the agent's commands ran into (the session went on), in words.
    pub fn commands_hit(&self) -> Option<String> {
        let How::Cgroup(cg) = &self.how else {
            return None;
        };
        let mut said = Vec::new();
        let refused = counter(&cg.tools_pids_events, "max");
        if let (Some(t), true) = (self.commands.tasks, refused > 0) {
            said.push(format!(
                "the agent's commands reached their process limit ({t} of sandbox.limits.processes \
                 = {}, the rest kept for the CLI): {refused} fork(s) refused",
                self.limits.tasks.unwrap_or(0)
            ));
        }
        let killed = counter(&cg.tools_oom_events, "oom_kill");
        if let (Some(m), true) = (self.commands.memory, killed > 0) {
            said.push(format!(
                "the kernel killed {killed} process(es) of the agent's commands for memory (their \
                 share: {} MiB of sandbox.limits.memoryMiB = {}); the session went on",
                m / MIB,
                self.limits.memory.unwrap_or(0) / MIB
            ));
        }
        (!said.is_empty()).then(|| said.join("; "))
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
    /// The `cgroup.procs` of every directory of the session in the pids (or unified) hierarchy.
    procs: Vec<PathBuf>,
    /// cgroup v2's `cgroup.kill` (Linux 5.14): the session's, recursive.
    kill: Option<PathBuf>,
    /// The CLI part's OOM counter: a kill there ends the session.
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
            let pids: Vec<i32> = self
                .procs
                .iter()
                .flat_map(|p| {
                    let list = std::fs::read_to_string(p).unwrap_or_default();
                    list.lines()
                        .filter_map(|l| l.trim().parse().ok())
                        .collect::<Vec<i32>>()
                })
                .collect();
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
    /// The session's cgroup under `root`, with the limits written (the commands' share on its
    /// `tools` child); `None` when the host offers none the engine may use (nothing is left
    /// behind then).
    fn create(root: &Path, limits: &Limits, commands: &Limits) -> Option<Cgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        if root.join("cgroup.controllers").is_file() {
            Cgroup::create_v2(root, &own, &name, limits, commands)
        } else {
            Cgroup::create_v1(root, &own, &name, limits, commands)
        }
    }

    fn create_v2(
        root: &Path,
        own: &str,
        name: &str,
        limits: &Limits,
        commands: &Limits,
    ) -> Option<Cgroup> {
        let parent = v2_parent(root, own)?;
        sweep_leftovers(&parent);
        let dir = parent.join(name);
        std::fs::create_dir(&dir).ok()?;
        let cg = Cgroup {
            version: 2,
            procs: Vec::new(),
            oom_events: dir.join(CLI).join("memory.events"),
            tools_oom_events: dir.join(TOOLS).join("memory.events"),
            pids_events: local_events(&dir),
            tools_pids_events: dir.join(TOOLS).join("pids.events"),
            dirs: vec![dir.clone()],
        };
        let v2_limits = |dir: &Path, l: &Limits| {
            l.memory.is_none_or(|m| {
                write(dir, "memory.max", m) && write_optional(dir, "memory.swap.max", "0")
            }) && l.tasks.is_none_or(|t| write(dir, "pids.max", t))
        };
        // A v2 cgroup whose children have controllers holds no process itself: the CLI's part
        // is a child too. An OOM kill there ends the session; in the commands' part it ends
        // only the process the kernel picked.
        let written = v2_limits(&dir, limits)
            && std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids").is_ok()
            && std::fs::create_dir(dir.join(CLI)).is_ok()
            && std::fs::create_dir(dir.join(TOOLS)).is_ok()
            && (limits.memory.is_none() || write_optional(&dir.join(CLI), "memory.oom.group", "1"))
            && v2_limits(&dir.join(TOOLS), commands);
        if !written {
            cg.remove();
            return None;
        }
        cg.opened()
    }

    fn create_v1(
        root: &Path,
        own: &str,
        name: &str,
        limits: &Limits,
        commands: &Limits,
    ) -> Option<Cgroup> {
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
        let (pids, memory) = (pids.join(name), memory.join(name));
        let cg = Cgroup {
            version: 1,
            procs: Vec::new(),
            oom_events: memory.join(CLI).join("memory.oom_control"),
            tools_oom_events: memory.join(TOOLS).join("memory.oom_control"),
            pids_events: pids.join("pids.events"),
            tools_pids_events: pids.join(TOOLS).join("pids.events"),
            dirs: made,
        };
        let v1_limits = |pids: &Path, memory: &Path, l: &Limits| {
            l.memory.is_none_or(|m| {
                // memsw (memory + swap) exists where swap is accounted; it may not be set
                // below the memory limit, so it goes second.
                write(memory, "memory.limit_in_bytes", m)
                    && write_optional(memory, "memory.memsw.limit_in_bytes", &m.to_string())
            }) && l.tasks.is_none_or(|t| write(pids, "pids.max", t))
        };
        // Children's usage counts in their parent's limit only with hierarchy on (always, on
        // current kernels; settable only while the cgroup has no children).
        let written = cg.dirs.len() == 2
            && write_optional(&memory, "memory.use_hierarchy", "1")
            && v1_limits(&pids, &memory, limits)
            && [&pids, &memory].iter().all(|d| {
                std::fs::create_dir(d.join(CLI)).is_ok()
                    && std::fs::create_dir(d.join(TOOLS)).is_ok()
            })
            && v1_limits(&pids.join(TOOLS), &memory.join(TOOLS), commands);
        if !written {
            cg.remove();
            return None;
        }
        cg.opened()
    }

    /// With every CLI part's `cgroup.procs` open; removed when one cannot be opened.
    fn opened(mut self) -> Option<Cgroup> {
        for dir in &self.dirs {
            match std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(CLI).join("cgroup.procs"))
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
        let top = &self.dirs[0];
        let kill = top.join("cgroup.kill");
        Killer {
            procs: [top.join(CLI), top.join(TOOLS), top.clone()]
                .iter()
                .map(|d| d.join("cgroup.procs"))
                .collect(),
            kill: (self.version == 2 && kill.exists()).then_some(kill),
            oom_events: self.oom_events.clone(),
        }
    }

    /// Removes the (emptied) directories, children first; an exiting process may keep one
    /// busy a moment.
    fn remove(&self) {
        for dir in &self.dirs {
            for d in [dir.join(CLI), dir.join(TOOLS), dir.clone()] {
                for _ in 0..100 {
                    match std::fs::remove_dir(&d) {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        _ => break,
                    }
                }
            }
        }
    }
}

/// The session's own pids `max` counter: `pids.events.local` where the kernel has it (there
/// `pids.events` also counts the children's limits), else `pids.events`.
fn local_events(dir: &Path) -> PathBuf {
    let local = dir.join("pids.events.local");
    if local.exists() {
        local
    } else {
        dir.join("pids.events")
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
            for child in [CLI, TOOLS] {
                let _ = std::fs::remove_dir(e.path().join(child));
            }
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
        let procs = std::fs::read_to_string(dirs[0].join(CLI).join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == child.id().to_string()),
            "{procs}"
        );
        // The first directory holds the pids controller in either version; the commands get
        // their share below it, and the prefix writes to their `cgroup.procs`.
        let max = |d: &Path| std::fs::read_to_string(d.join("pids.max")).unwrap();
        assert_eq!(max(&dirs[0]).trim(), "64");
        assert_eq!(max(&dirs[0].join(TOOLS)).trim(), "32");
        let (files, env) = limits.commands_setup();
        assert_eq!(files.len(), dirs.len());
        assert_eq!(files[0].0, dirs[0].join(TOOLS).join("cgroup.procs"));
        assert!(env.is_empty());
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
    fn the_commands_share_leaves_the_cli_a_quarter_at_least_64_tasks_and_512_mib_at_most_half() {
        let of = |memory_mib: u64, tasks: u64| {
            let l = commands_share(&Limits {
                memory: Some(memory_mib * MIB),
                tasks: Some(tasks),
                tmpfs: None,
            });
            (l.memory.unwrap() / MIB, l.tasks.unwrap())
        };
        assert_eq!(of(4096, 1024), (3072, 768));
        assert_eq!(of(1024, 200), (512, 136));
        assert_eq!(of(768, 100), (384, 50));
        assert_eq!(of(128, 1), (64, 1));
        let none = commands_share(&Limits {
            memory: None,
            tasks: None,
            tmpfs: None,
        });
        assert_eq!((none.memory, none.tasks), (None, None));
    }

    #[tokio::test]
    async fn with_rlimits_the_prefix_gets_the_commands_task_share() {
        let empty = tempfile::tempdir().unwrap();
        let limits = SessionLimits::create_in(empty.path(), LIMITS);
        let (files, env) = limits.commands_setup();
        assert!(files.is_empty());
        assert_eq!(env, [("CRA_TOOLS_NPROC".to_string(), "32".to_string())]);
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
