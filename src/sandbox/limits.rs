//! What one session may use of the host, enforced by the kernel (`sandbox.limits`): memory and
//! tasks (processes and threads) for all of the session's processes together, through a cgroup
//! of its own where the host lets the engine make one, else through rlimits; and, with a disk
//! bound, each file's size (`RLIMIT_FSIZE`; the total is the disk watch's, `crate::disk`).
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
//!   An engine whose real user is root gets **no process limit** this way: fork(2) does not
//!   hold the host's root user to `RLIMIT_NPROC`, in the sandbox's user namespace too (its
//!   processes are still root outside it). The rlimit is set all the same (harmless), but the
//!   transcript and the engine's logger say that no process limit applies
//!   ([`SessionLimits::unenforced`]) rather than name a limit the kernel ignores.
//!
//! Inside the session's cgroup the agent's commands get one of their own with a smaller share
//! ([`commands_share`]): the session's cgroup has a child for the CLI (`cli`) and one for the
//! agent's commands (`tools`). Nothing of the cgroup filesystem is writable inside: the engine
//! moves the processes, by one rule that asks nothing of what a process inside says — every
//! process in `cli` goes to `tools` but the sandbox's init, the CLI and its two network bridges
//! (and their connections): whatever the CLI started (a Bash command, its ripgrep, its git)
//! and whatever those left behind. The placer ([`Placer`], a thread per session) applies it
//! every [`SWEEP_EVERY`] and whenever a line arrives on the request pipe
//! ([`super::commands::REQUEST_FIFO`]), where every Bash command asks first and waits to be
//! moved before it runs (`CLAUDE_CODE_SHELL_PREFIX`: [`TOOLS_PREFIX_SCRIPT`]), as do the
//! wrappers of the CLI's own ripgrep and git ([`super::commands::WRAPPED_TOOLS`]). Were
//! `tools`' `cgroup.procs` writable inside (as it was), any process could put any other under
//! the commands' share (the CLI's own pid, say), and what the CLI runs itself was never in it.
//! `pids.max` counts threads and the CLI is one of the session's tasks: a
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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::commands::{commands_share, CLI, REQUEST_FIFO, TOOLS};
use crate::config::Limits;

/// The cgroup filesystem the engine looks in (an operator's knob, and how tests force the
/// rlimit fallback: a directory without cgroups).
pub const CGROUP_ROOT_ENV: &str = "CLAUDE_RUNTIME_ADAPTER_CGROUP_ROOT";
const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Session cgroups are `<prefix><engine pid>-<uuid>`.
const PREFIX: &str = "claude-runtime-adapter-";

/// How often the memory watcher looks for an OOM kill.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How often the placer moves what the CLI started without a request (its ripgrep, its git,
/// a Bash command whose prefix did not run): the longest such a process runs outside the
/// commands' share.
const SWEEP_EVERY: Duration = Duration::from_millis(20);
/// The least time between two moves a request asks for: a flood of requests costs the engine
/// at most this rate of sweeps (a sweep reads a few small `/proc` files).
const REQUEST_GAP: Duration = Duration::from_millis(2);
const MIB: u64 = 1024 * 1024;

/// The limits of one running session. Dropping it kills whatever is left in its cgroup and
/// removes the cgroup.
pub struct SessionLimits {
    limits: Limits,
    /// The agent's commands' part of `limits` ([`commands_share`]).
    commands: Limits,
    how: How,
    /// Whether the kernel holds the session's processes to `RLIMIT_NPROC` ([`nproc_binds`]).
    nproc_binds: bool,
    watcher: Option<tokio::task::JoinHandle<()>>,
    placer: Option<Placer>,
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
        SessionLimits::create_in(&root, limits, nproc_binds())
    }

    /// [`SessionLimits::create`] with the cgroup filesystem at `root`; `nproc_binds`: whether
    /// the kernel holds the engine's processes to `RLIMIT_NPROC` (a parameter so that the
    /// tests can say both, whichever user runs them).
    fn create_in(root: &Path, limits: Limits, nproc_binds: bool) -> SessionLimits {
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
            nproc_binds,
            watcher,
            placer: None,
        }
    }

    /// What puts the agent's commands under the commands' limits, made in `dir` (the
    /// directory the sandbox sees beside the prefix script): with a cgroup, the request pipe
    /// and the placer reading it (running until the session's limits are dropped); with
    /// rlimits, the environment the prefix needs (the commands' `RLIMIT_NPROC`).
    pub fn commands_setup(&mut self, dir: &Path) -> std::io::Result<Vec<(String, String)>> {
        match &self.how {
            How::Cgroup(cg) => {
                self.placer = Some(Placer::start(&dir.join(REQUEST_FIFO), cg.dirs.clone())?);
                Ok(Vec::new())
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
                Ok(env.into_iter().collect())
            }
        }
    }

    /// What the child runs between fork and exec: join the cgroup, or set the rlimits; with a
    /// disk bound, `RLIMIT_FSIZE` at it either way (no file of the session grows past it: a
    /// write past it fails, `EFBIG`, or the writer gets `SIGXFSZ`). Only async-signal-safe
    /// calls on data prepared here.
    pub fn pre_exec(&self) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let fds: Vec<RawFd> = match &self.how {
            How::Cgroup(cg) => cg.procs.iter().map(AsRawFd::as_raw_fd).collect(),
            How::Rlimits(_) => Vec::new(),
        };
        let mut rlimits = match &self.how {
            How::Rlimits(r) => r.clone(),
            How::Cgroup(_) => Vec::new(),
        };
        rlimits.extend(self.limits.disk.map(|d| (libc::RLIMIT_FSIZE, d)));
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
        let tmp = match l.disk {
            Some(d) => format!(
                "{tmp}; disk {} MiB (RLIMIT_FSIZE per file, the disk watch for the total)",
                d / MIB
            ),
            None => tmp,
        };
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
            How::Rlimits(_) if !self.nproc_binds && l.tasks.is_some() => format!(
                "limits by rlimits (no usable cgroup): {mem} per process (RLIMIT_DATA), no process \
                 limit (the engine runs as root, which RLIMIT_NPROC does not bind: {tasks} asked); \
                 {tmp}"
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

    /// What of the configured limits the kernel does not enforce at all, in words naming the
    /// config field: the process limit, with rlimits only and an engine running as root (which
    /// `RLIMIT_NPROC` does not bind). `None` when every configured limit applies.
    pub fn unenforced(&self) -> Option<String> {
        let tasks = self.limits.tasks?;
        (self.is_fallback() && !self.nproc_binds).then(|| {
            format!(
                "no process limit applies (sandbox.limits.processes = {tasks}), to the session or \
                 to the agent's commands: there is no usable cgroup and the engine runs as root, \
                 which the kernel exempts from RLIMIT_NPROC (in the sandbox's user namespace too)"
            )
        })
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
        // Stopped first: nothing is moved while the cgroup is emptied and removed.
        drop(self.placer.take());
        if let How::Cgroup(cg) = &self.how {
            cg.killer().kill_all();
            cg.remove();
        }
    }
}

/// The thread that moves what the CLI started into the commands' cgroup (the module doc has
/// the rule). Dropping it stops it (within [`SWEEP_EVERY`]) and waits for it.
struct Placer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Placer {
    /// Makes the request pipe at `fifo` (a FIFO only the session's user may open), opens it
    /// for reading and writing (never an end of file, never a writer blocked on an absent
    /// reader) and starts the thread over the session's cgroup `dirs`.
    fn start(fifo: &Path, dirs: Vec<PathBuf>) -> std::io::Result<Placer> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: open(2) of the FIFO just made; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor this process just opened and nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cra-placer".into())
            .spawn(move || place(&fd, &dirs, &flag))?;
        Ok(Placer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Placer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The placer's loop: waits for a request or [`SWEEP_EVERY`], then moves. Nothing is moved
/// before the first line, the bridge script's, has said which processes are the bridges (it
/// is written before the CLI runs, so before any process of the agent's can write).
fn place(fifo: &OwnedFd, dirs: &[PathBuf], stop: &AtomicBool) {
    let mut bridges: Option<Vec<i32>> = None;
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: fifo.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let wait = i32::try_from(SWEEP_EVERY.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: poll(2) on one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait) } > 0;
        let mut requested = false;
        if ready {
            // SAFETY: read(2) into a buffer of its length, on a descriptor held here.
            let n = unsafe { libc::read(fifo.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if let Ok(n) = usize::try_from(n) {
                requested = n > 0;
                if requested && bridges.is_none() {
                    bridges = Some(announced_bridges(&buf[..n]));
                }
            }
        }
        if let Some(b) = &bridges {
            // Again while the last round moved something: a process that forked while it was
            // moved leaves its child behind.
            for _ in 0..4 {
                if sweep(dirs, b) == 0 {
                    break;
                }
            }
        }
        if requested {
            std::thread::sleep(REQUEST_GAP);
        }
    }
}

/// The bridges' pids (in the sandbox) of the request pipe's first line, `bridges <pid> <pid>
/// [<pid>]` (the proxy's, the relay's, and the telemetry forwarder's when the CLI's telemetry
/// is on); none when the first line is anything else.
fn announced_bridges(first: &[u8]) -> Vec<i32> {
    let line = first.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    if words.next() != Some("bridges") {
        return Vec::new();
    }
    words
        .take(3)
        .filter_map(|w| w.parse().ok())
        .filter(|p| *p > 2)
        .collect()
}

/// One move of what the CLI started from `cli` to `tools` (in every hierarchy); how many
/// processes were moved.
fn sweep(dirs: &[PathBuf], bridges: &[i32]) -> usize {
    let Some(first) = dirs.first() else {
        return 0;
    };
    let members: Vec<i32> = std::fs::read_to_string(first.join(CLI).join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let moving = started_by_cli(&members, &proc_info, bridges);
    for pid in &moving {
        for dir in dirs {
            // A process that exited meanwhile is refused (ESRCH): nothing to move.
            let _ = std::fs::write(dir.join(TOOLS).join("cgroup.procs"), pid.to_string());
        }
    }
    moving.len()
}

/// What the placer knows of a process: its parent, and its pid in the sandbox (none for a
/// process outside it: bubblewrap's first process).
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProcInfo {
    ppid: i32,
    inside: Option<i32>,
}

/// `/proc/<pid>/status`: `PPid`, and `NSpid`'s second pid (the sandbox's namespace, one below
/// the engine's).
fn proc_info(pid: i32) -> Option<ProcInfo> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k));
    let ppid = field("PPid:")?.trim().parse().ok()?;
    let inside = field("NSpid:")
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok());
    Some(ProcInfo { ppid, inside })
}

/// Which of the `cli` part's processes (`members`, host pids) go to the commands' part: all but
/// bubblewrap's first process (outside the sandbox), the sandbox's init (pid 1 inside), the
/// CLI (pid 2 inside, init's child: bubblewrap's init starts it first, and nothing of the
/// agent's can be pid 1 or 2 while they live) and the announced `bridges` (pids inside, the
/// CLI's or init's children) with their children (socat's connections). Nothing a process
/// inside writes or names is trusted: which is which is the kernel's account of pids and
/// parents. Before the CLI is there, nothing moves.
fn started_by_cli(
    members: &[i32],
    info: &dyn Fn(i32) -> Option<ProcInfo>,
    bridges: &[i32],
) -> Vec<i32> {
    let known: Vec<(i32, ProcInfo)> = members
        .iter()
        .filter_map(|&p| info(p).map(|i| (p, i)))
        .collect();
    let Some(init) = known
        .iter()
        .find(|(_, i)| i.inside == Some(1))
        .map(|(p, _)| *p)
    else {
        return Vec::new();
    };
    let Some(cli) = known
        .iter()
        .find(|(_, i)| i.inside == Some(2) && i.ppid == init)
        .map(|(p, _)| *p)
    else {
        return Vec::new();
    };
    let is_bridge = |i: &ProcInfo| {
        i.inside.is_some_and(|n| bridges.contains(&n)) && (i.ppid == cli || i.ppid == init)
    };
    known
        .iter()
        .filter(|(p, i)| {
            let kept = i.inside.is_none()
                || *p == init
                || *p == cli
                || is_bridge(i)
                || info(i.ppid).is_some_and(|parent| is_bridge(&parent));
            !kept
        })
        .map(|(p, _)| *p)
        .collect()
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

/// Whether fork(2) holds the engine's processes to `RLIMIT_NPROC`: not when their real user is
/// the host's root (the kernel exempts it, and its processes stay root outside any user
/// namespace the sandbox makes). An engine that is root only in a user namespace of its own (a
/// rootless container: `/proc/self/uid_map` maps its uid 0 to another user outside) is held to
/// it like any user. A non-root engine with `CAP_SYS_RESOURCE` or `CAP_SYS_ADMIN` in the host's
/// user namespace is exempt too; not looked for here.
fn nproc_binds() -> bool {
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    uid != 0
        || !root_outside(
            std::fs::read_to_string("/proc/self/uid_map")
                .ok()
                .as_deref(),
        )
}

/// Whether uid 0 of this user namespace is uid 0 of its parent by `uid_map` (`inside outside
/// count` lines); unreadable: taken to be (the cautious answer: no process limit is claimed).
/// A namespace nested in another that maps 0 elsewhere is not seen through.
fn root_outside(uid_map: Option<&str>) -> bool {
    let Some(map) = uid_map else {
        return true;
    };
    map.lines().any(|line| {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // The range that holds uid 0 inside maps it to its first outside uid.
        matches!(f[..], [0, 0, count] if count > 0)
    })
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
    use crate::config::DiskFloor;
    use std::os::unix::process::CommandExt;

    const LIMITS: Limits = Limits {
        memory: Some(1024 * MIB),
        tasks: Some(64),
        tmpfs: None,
        disk: None,
        disk_floor: DiskFloor::Off,
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
    async fn a_disk_bound_is_every_file_s_rlimit_fsize_with_a_cgroup_or_without() {
        let bounded = Limits {
            disk: Some(256 * MIB),
            ..LIMITS
        };
        let empty = tempfile::tempdir().unwrap();
        for limits in [
            SessionLimits::create_in(empty.path(), bounded, nproc_binds()),
            SessionLimits::create(bounded),
        ] {
            let mut child = start(&limits);
            let want = (256 * MIB).to_string();
            assert_eq!(limit_of(child.id(), "Max file size"), want);
            assert!(limits
                .describe()
                .contains("disk 256 MiB (RLIMIT_FSIZE per file"));
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let mut child = start(&SessionLimits::create_in(
            empty.path(),
            LIMITS,
            nproc_binds(),
        ));
        assert_eq!(limit_of(child.id(), "Max file size"), "unlimited");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn without_a_usable_cgroup_the_limits_are_rlimits_set_before_exec() {
        let empty = tempfile::tempdir().unwrap();
        // An engine that RLIMIT_NPROC binds (the rlimits set are the same for root's).
        let limits = SessionLimits::create_in(empty.path(), LIMITS, true);
        assert!(limits.is_fallback());
        assert_eq!(limits.unenforced(), None);
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
    async fn without_a_usable_cgroup_an_engine_running_as_root_has_no_process_limit_and_the_words_say_so(
    ) {
        let empty = tempfile::tempdir().unwrap();
        let limits = SessionLimits::create_in(empty.path(), LIMITS, false);
        assert!(limits.is_fallback());
        let said = limits.describe();
        assert!(said.starts_with("limits by rlimits (no usable cgroup): memory 1024 MiB per process (RLIMIT_DATA), no process limit (the engine runs as root, which RLIMIT_NPROC does not bind: 64 tasks asked)"), "{said}");
        assert!(!said.contains("more for the user id"), "{said}");
        let unenforced = limits.unenforced().unwrap();
        assert!(
            unenforced.starts_with("no process limit applies (sandbox.limits.processes = 64)")
                && unenforced.contains("root")
                && unenforced.contains("RLIMIT_NPROC"),
            "{unenforced}"
        );
        // Without a process limit configured, nothing is missing.
        let memory_only = Limits {
            tasks: None,
            ..LIMITS
        };
        let limits = SessionLimits::create_in(empty.path(), memory_only, false);
        assert_eq!(limits.unenforced(), None);
        assert!(limits.describe().contains("no task limit"));
    }

    /// What [`nproc_binds`] says of this process's user is what the kernel does: a shell whose
    /// `RLIMIT_NPROC` is 1 (its user has more tasks than that: this test's own threads) starts
    /// a command, which takes a fork that only an exempt user (root) gets.
    #[test]
    fn rlimit_nproc_stops_a_fork_exactly_when_nproc_binds_says_it_does() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "/bin/true && echo forked"]);
        // SAFETY: setrlimit(2) with a valid struct, async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                let one = libc::rlimit {
                    rlim_cur: 1,
                    rlim_max: 1,
                };
                match libc::setrlimit(libc::RLIMIT_NPROC, &one) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        let out = cmd.output().unwrap();
        let forked = String::from_utf8_lossy(&out.stdout).contains("forked");
        assert_eq!(forked, !nproc_binds(), "{out:?}");
        if nproc_binds() {
            return;
        }
        // As root, the same shell as another user (nobody) is refused its fork: the kernel
        // exempts root, not everyone on this host.
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "/bin/true && echo forked"]);
        // SAFETY: setrlimit(2) and setuid(2), async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                let one = libc::rlimit {
                    rlim_cur: 1,
                    rlim_max: 1,
                };
                if libc::setrlimit(libc::RLIMIT_NPROC, &one) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("forked"),
            "{out:?}"
        );
    }

    #[test]
    fn root_is_the_host_s_root_only_where_uid_map_maps_0_to_0() {
        assert!(root_outside(Some("         0          0 4294967295\n")));
        // A rootless container: its root is uid 100000 outside.
        assert!(!root_outside(Some("         0     100000      65536\n")));
        // bubblewrap's own map of one user (1000 inside as 1000 outside): no 0 at all.
        assert!(!root_outside(Some("      1000       1000          1\n")));
        assert!(root_outside(None));
    }

    #[tokio::test]
    async fn no_limit_configured_sets_no_rlimit() {
        let empty = tempfile::tempdir().unwrap();
        let none = Limits {
            memory: None,
            tasks: None,
            tmpfs: None,
            disk: None,
            disk_floor: DiskFloor::Off,
        };
        let limits = SessionLimits::create_in(empty.path(), none, nproc_binds());
        let mut child = start(&limits);
        assert_eq!(limit_of(child.id(), "Max data size"), "unlimited");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// On a host with a cgroup the engine may use (this CI machine: cgroup v1, as root).
    #[tokio::test]
    async fn the_first_process_runs_in_the_session_cgroup_which_dropping_empties_and_removes() {
        let mut limits = SessionLimits::create(LIMITS);
        let How::Cgroup(cg) = &limits.how else {
            eprintln!("skipped: no usable cgroup here ({})", limits.describe());
            return;
        };
        let dirs = cg.dirs.clone();
        // A cgroup's pids.max binds root too.
        assert_eq!(limits.unenforced(), None);
        let mut child = start(&limits);
        let procs = std::fs::read_to_string(dirs[0].join(CLI).join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l == child.id().to_string()),
            "{procs}"
        );
        // The first directory holds the pids controller in either version; the commands get
        // their share below it, which the placer moves them into on the request pipe's word.
        let max = |d: &Path| std::fs::read_to_string(d.join("pids.max")).unwrap();
        assert_eq!(max(&dirs[0]).trim(), "64");
        assert_eq!(max(&dirs[0].join(TOOLS)).trim(), "32");
        let pipe = tempfile::tempdir().unwrap();
        let env = limits.commands_setup(pipe.path()).unwrap();
        assert!(env.is_empty());
        let fifo = std::fs::metadata(pipe.path().join(REQUEST_FIFO)).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
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
                disk: None,
                disk_floor: DiskFloor::Off,
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
            disk: None,
            disk_floor: DiskFloor::Off,
        });
        assert_eq!((none.memory, none.tasks), (None, None));
    }

    #[tokio::test]
    async fn with_rlimits_the_prefix_gets_the_commands_task_share() {
        let empty = tempfile::tempdir().unwrap();
        let mut limits = SessionLimits::create_in(empty.path(), LIMITS, nproc_binds());
        let pipe = tempfile::tempdir().unwrap();
        let env = limits.commands_setup(pipe.path()).unwrap();
        assert_eq!(env, [("CRA_TOOLS_NPROC".to_string(), "32".to_string())]);
        // No request pipe: there is no placer to read it.
        assert_eq!(std::fs::read_dir(pipe.path()).unwrap().count(), 0);
    }

    /// A sandbox as the kernel shows it (host pid → parent, pid inside): bubblewrap (100, the
    /// engine's child), its init (101, pid 1 inside), the CLI (102, pid 2), the bridges (103,
    /// 104) and a connection of one (110), a Bash command (120) with its child (121), ripgrep
    /// (130), an orphan of the agent's (140, init's child now) and a process inside a command
    /// already in `tools` (150, not a member: a member's parent may be one).
    fn sandbox(pid: i32) -> Option<ProcInfo> {
        let (ppid, inside) = match pid {
            100 => (99, None),
            101 => (100, Some(1)),
            102 => (101, Some(2)),
            103 => (102, Some(3)),
            104 => (102, Some(4)),
            110 => (104, Some(10)),
            120 => (102, Some(20)),
            121 => (120, Some(21)),
            130 => (102, Some(30)),
            140 => (101, Some(40)),
            150 => (102, Some(50)),
            151 => (150, Some(51)),
            _ => return None,
        };
        Some(ProcInfo { ppid, inside })
    }

    #[test]
    fn what_the_cli_started_moves_to_the_commands_part_and_only_init_the_cli_and_its_bridges_stay()
    {
        let members = [100, 101, 102, 103, 104, 110, 120, 121, 130, 140, 151, 999];
        let mut moving = started_by_cli(&members, &sandbox, &[3, 4]);
        moving.sort_unstable();
        // The command and its child, ripgrep, the orphan, a child of a process already moved;
        // 999 exited meanwhile.
        assert_eq!(moving, [120, 121, 130, 140, 151]);
    }

    #[test]
    fn a_pid_claimed_as_a_bridge_stays_only_if_it_is_the_cli_s_or_init_s_child() {
        // The bridge line names pids of the agent's processes: only children of the CLI or of
        // init with those pids stay; a command's own child (pid 21 inside) is moved anyway.
        let moving = started_by_cli(&[100, 101, 102, 121], &sandbox, &[21]);
        assert_eq!(moving, [121]);
        // Without the bridges' word, the bridges are moved too (the CLI, init and bubblewrap
        // never are).
        let mut moving = started_by_cli(&[100, 101, 102, 103, 104, 110], &sandbox, &[]);
        moving.sort_unstable();
        assert_eq!(moving, [103, 104, 110]);
    }

    #[test]
    fn before_the_cli_runs_or_after_it_is_gone_nothing_moves() {
        // Bubblewrap alone; bubblewrap and its init; init's child gone.
        assert!(started_by_cli(&[100], &sandbox, &[]).is_empty());
        assert!(started_by_cli(&[100, 101, 140], &sandbox, &[]).is_empty());
        // A process with pid 2 inside that is not init's child is not the CLI.
        let fake = |pid: i32| match pid {
            200 => Some(ProcInfo {
                ppid: 101,
                inside: Some(7),
            }),
            201 => Some(ProcInfo {
                ppid: 200,
                inside: Some(2),
            }),
            p => sandbox(p),
        };
        assert!(started_by_cli(&[100, 101, 200, 201], &fake, &[]).is_empty());
    }

    #[test]
    fn the_bridges_are_the_first_line_s_pids_at_most_three_and_nothing_else_names_them() {
        assert_eq!(announced_bridges(b"bridges 3 4\ntools\n"), [3, 4]);
        // At most the three bridges there can be.
        assert_eq!(announced_bridges(b"bridges 3 4 5\n"), [3, 4, 5]);
        assert_eq!(announced_bridges(b"bridges 3 4 5 6\n"), [3, 4, 5]);
        // Init and the CLI are never bridges; junk and other lines name none.
        assert_eq!(announced_bridges(b"bridges 1 2\n"), Vec::<i32>::new());
        assert_eq!(
            announced_bridges(b"tools\nbridges 3 4\n"),
            Vec::<i32>::new()
        );
        assert_eq!(announced_bridges(b"bridges x \xff\n"), Vec::<i32>::new());
        assert_eq!(announced_bridges(b""), Vec::<i32>::new());
    }

    #[test]
    fn proc_info_reads_this_process_parent_and_no_pid_inside() {
        let me = proc_info(i32::try_from(std::process::id()).unwrap()).unwrap();
        // SAFETY: getppid(2) cannot fail.
        assert_eq!(me.ppid, unsafe { libc::getppid() });
        assert_eq!(me.inside, None);
    }

    /// The placer end to end on a real cgroup: a sandbox (bubblewrap, its init, a stand-in
    /// CLI), whose CLI starts a child: the child is moved to `tools`, the CLI stays in `cli`.
    #[tokio::test]
    async fn the_placer_moves_the_cli_s_child_into_the_commands_part_and_not_the_cli() {
        if crate::sandbox::find_on_path("bwrap", std::env::var_os("PATH").as_deref()).is_none() {
            eprintln!("skipped: no bwrap");
            return;
        }
        let mut limits = SessionLimits::create(LIMITS);
        let How::Cgroup(cg) = &limits.how else {
            eprintln!("skipped: no usable cgroup here ({})", limits.describe());
            return;
        };
        let dirs = cg.dirs.clone();
        let pipe = tempfile::tempdir().unwrap();
        limits.commands_setup(pipe.path()).unwrap();
        let fifo = pipe.path().join(REQUEST_FIFO);
        // Pid 2 inside announces no bridges, starts a child and waits.
        let script = format!(
            "echo 'bridges' > {f}; sleep 30 & echo $! > /dev/null; exec sleep 31",
            f = fifo.display()
        );
        let mut cmd = std::process::Command::new("bwrap");
        cmd.args([
            "--dev-bind",
            "/",
            "/",
            "--unshare-pid",
            "--unshare-user",
            "--die-with-parent",
        ])
        .args(["sh", "-c", &script]);
        // SAFETY: the hook is async-signal-safe (see `pre_exec`).
        unsafe {
            cmd.pre_exec(limits.pre_exec());
        }
        let mut child = cmd.spawn().unwrap();
        let procs = |part: &str| -> Vec<String> {
            std::fs::read_to_string(dirs[0].join(part).join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect()
        };
        let cmdline = |pid: &String| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default()
        };
        let mut found = false;
        for _ in 0..250 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let tools = procs(TOOLS);
            if tools.iter().any(|p| cmdline(p).starts_with("sleep\u{0}30")) {
                found = true;
                break;
            }
        }
        assert!(found, "cli {:?} tools {:?}", procs(CLI), procs(TOOLS));
        // The stand-in CLI (pid 2 inside) is still in the CLI's part.
        assert!(procs(CLI)
            .iter()
            .any(|p| cmdline(p).starts_with("sleep\u{0}31")));
        drop(limits);
        let _ = child.wait();
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
