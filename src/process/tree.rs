//! Process trees: finding and killing everything a process started. The adapter starts
//! processes that start others — the CLI (its Bash commands, which it puts in process groups
//! of their own), git (filters, hooks, `core.fsmonitor`), the worktree setup command (`yarn
//! install`, daemons) — and must be able to end all of them, even after the process it started
//! has died and its children were re-parented. On Unix the process it starts leads a process
//! session or process group of its own, and the tree is the members of that session or group
//! plus their descendants, found through `/proc`; on Windows a job object holds the tree.
//!
//! Session-agnostic, so the layers that start processes (git, the sandbox, the environments)
//! all share it.

use tokio::process::Child;

#[cfg(unix)]
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain syscall; a stale pid at worst yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

#[cfg(unix)]
pub const SIGTERM: i32 = libc::SIGTERM;

/// Every live process that belongs to the session led by `leader` (the CLI's pid, or the
/// worktree setup command's, which leads a process group): members of its process session or
/// process group plus descendants by parent pid (a child that called `setsid` itself).
#[cfg(target_os = "linux")]
pub fn session_processes(leader: u32) -> Vec<u32> {
    let table = process_table();
    let seeds = table
        .iter()
        .filter(|(pid, _, pgrp, sid)| *sid == leader || *pgrp == leader || *pid == leader)
        .map(|(pid, _, _, _)| *pid)
        .collect();
    with_descendants(&table, seeds)
}

/// Every live process: (pid, ppid, pgrp, sid).
#[cfg(target_os = "linux")]
fn process_table() -> Vec<(u32, u32, u32, u32)> {
    let mut table = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name (field 2) may hold spaces and parentheses: parse after the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // rest: state ppid pgrp session ...
        if fields.len() < 4 || fields[0] == "Z" {
            continue;
        }
        let ppid = fields[1].parse().unwrap_or(0);
        let pgrp = fields[2].parse().unwrap_or(0);
        let sid = fields[3].parse().unwrap_or(0);
        table.push((pid, ppid, pgrp, sid));
    }
    table
}

/// `found` and every descendant of it by parent pid in `table`.
#[cfg(target_os = "linux")]
fn with_descendants(table: &[(u32, u32, u32, u32)], mut found: Vec<u32>) -> Vec<u32> {
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for (pid, ppid, _, _) in table {
            if *ppid == parent && !found.contains(pid) {
                found.push(*pid);
            }
        }
        i += 1;
    }
    found
}

/// SIGKILL everything of the session until nothing is left (a process may fork while we kill;
/// a few rounds settle it).
#[cfg(target_os = "linux")]
pub fn kill_session(leader: u32) {
    kill_tree(leader, &[]);
}

/// [`kill_session`], and every process in the pid namespaces `namespaces` (a sandbox's: its
/// processes leave the session's parent links once its outer process has exited, while the
/// kernel is still tearing them down).
#[cfg(target_os = "linux")]
fn kill_tree(leader: u32, namespaces: &[String]) {
    let mut killed = std::collections::HashSet::new();
    for _ in 0..10 {
        let mut procs = session_processes(leader);
        procs.extend(in_namespaces(namespaces));
        if procs.is_empty() {
            break;
        }
        for pid in &procs {
            signal(*pid, libc::SIGKILL);
        }
        killed.extend(procs);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SIGKILL is asynchronous: a big process (the CLI's node heap) takes a while to exit on a
    // busy machine, and a killed parent's children leave the tree's parent links at once, so
    // they are waited for by pid. Bounded: a process stuck in the kernel (D state) may take
    // longer, and the caller must not hang on it.
    let deadline = std::time::Instant::now() + KILL_WAIT;
    while killed.iter().any(|pid| alive(*pid)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The pid namespace of `pid` (`pid:[<inode>]`).
#[cfg(target_os = "linux")]
fn pid_ns(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// Every live process in one of `namespaces`, and their descendants (a command's own pid
/// namespace nested in the sandbox's).
#[cfg(target_os = "linux")]
fn in_namespaces(namespaces: &[String]) -> Vec<u32> {
    if namespaces.is_empty() {
        return Vec::new();
    }
    let table = process_table();
    let seeds = table
        .iter()
        .map(|(pid, _, _, _)| *pid)
        .filter(|pid| pid_ns(*pid).is_some_and(|ns| namespaces.contains(&ns)))
        .collect();
    with_descendants(&table, seeds)
}

/// How long [`kill_session`] waits for the processes it killed to be gone.
#[cfg(target_os = "linux")]
const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether `pid` is a process that has not exited (a zombie has).
#[cfg(target_os = "linux")]
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// SIGKILL the session's process group: without /proc that group is the best handle there is,
/// and there is nothing to re-check.
#[cfg(all(unix, not(target_os = "linux")))]
pub fn kill_session(leader: u32) {
    // SAFETY: plain syscall on our own process group.
    unsafe {
        libc::killpg(leader as libc::pid_t, libc::SIGKILL);
    }
    signal(leader, libc::SIGKILL);
}

/// While armed (`Some(pid)`), dropping it SIGKILLs the process `pid`, every descendant of it
/// and its process group: a run whose future is dropped (a time limit, a cancel) leaves
/// nothing behind: no git, no filter, hook or login profile it started, no sandbox. Disarmed
/// once the process has been reaped (its pid may then be reused).
pub(crate) struct KillTree(pub Option<u32>);

impl Drop for KillTree {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.0.take() {
            // The /proc walk first, while every parent link is intact (a killed parent's
            // setsid'd children are re-parented at once), then the group as a safety net
            // (there is none unless the process leads one).
            kill_session(pid);
            // SAFETY: signalling a process group; failure (none, already gone) is fine.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            }
        }
    }
}

#[cfg(windows)]
pub const SIGTERM: i32 = 15;

/// No signals on Windows: stopping goes straight to [`ProcessTree::kill_all`].
#[cfg(windows)]
pub fn signal(_pid: u32, _sig: i32) {}

/// Everything one session's CLI starts. On Unix the CLI leads a process session of its own and
/// the tree is found through `/proc` (see [`kill_session`]); on Windows the CLI is put in a job
/// object that kills every process in it when terminated or closed.
pub struct ProcessTree {
    leader: u32,
    /// The pid namespaces of its processes other than this process's ([`ProcessTree::note_namespaces`]).
    #[cfg(target_os = "linux")]
    namespaces: std::sync::Mutex<Vec<String>>,
    #[cfg(windows)]
    job: Option<windows_job::Job>,
}

impl ProcessTree {
    #[cfg(unix)]
    pub fn of(child: &Child) -> ProcessTree {
        ProcessTree {
            leader: child.id().unwrap_or(0),
            #[cfg(target_os = "linux")]
            namespaces: std::sync::Mutex::default(),
        }
    }

    /// Notes the pid namespaces its processes live in other than this process's (a sandbox's,
    /// once it has made one): [`ProcessTree::kill_all`] then kills and waits for every process
    /// in them, whatever their parent links. True once one is noted.
    #[cfg(target_os = "linux")]
    pub fn note_namespaces(&self) -> bool {
        self.note_namespaces_of(&session_processes(self.leader))
    }

    /// [`ProcessTree::note_namespaces`] of `procs`, the tree's processes as just found.
    #[cfg(target_os = "linux")]
    fn note_namespaces_of(&self, procs: &[u32]) -> bool {
        let own = pid_ns(std::process::id());
        let found: Vec<String> = procs
            .iter()
            .filter_map(|pid| pid_ns(*pid))
            .filter(|ns| Some(ns) != own.as_ref())
            .collect();
        let mut noted = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        for ns in found {
            if !noted.contains(&ns) {
                noted.push(ns);
            }
        }
        !noted.is_empty()
    }

    #[cfg(windows)]
    pub fn of(child: &Child) -> ProcessTree {
        let job = child
            .raw_handle()
            .and_then(|h| windows_job::Job::containing(h).ok());
        ProcessTree {
            leader: child.id().unwrap_or(0),
            job,
        }
    }

    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// Kill every process of the session still alive.
    pub fn kill_all(&self) {
        #[cfg(target_os = "linux")]
        {
            // Its namespaces noted while its outer process may still hold the links to what
            // it started; then what runs now (a command filling the disk at GB/s) is killed at
            // once, before the sweep of its namespaces, which reads every process's namespace
            // on the machine (some hundred milliseconds on a loaded one).
            let procs = session_processes(self.leader);
            self.note_namespaces_of(&procs);
            for pid in procs {
                signal(pid, libc::SIGKILL);
            }
            let namespaces = self
                .namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            kill_tree(self.leader, &namespaces);
        }
        #[cfg(all(unix, not(target_os = "linux")))]
        kill_session(self.leader);
        #[cfg(windows)]
        if let Some(job) = &self.job {
            job.terminate();
        }
    }
}

#[cfg(windows)]
mod windows_job {
    use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
    use windows_sys::Win32::System::JobObjects::{
        AssignProcessToJobObject, CreateJobObjectW, JobObjectExtendedLimitInformation,
        SetInformationJobObject, TerminateJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
        JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    };

    pub struct Job(HANDLE);

    // SAFETY: a job handle is a kernel handle, usable from any thread.
    unsafe impl Send for Job {}
    unsafe impl Sync for Job {}

    impl Job {
        /// A job that kills its processes when closed, holding `process`.
        pub fn containing(process: std::os::windows::io::RawHandle) -> std::io::Result<Job> {
            // SAFETY: plain Win32 calls on handles we own; the info struct is zero-initialised
            // and fully sized.
            unsafe {
                let job = CreateJobObjectW(std::ptr::null(), std::ptr::null());
                if job.is_null() {
                    return Err(std::io::Error::last_os_error());
                }
                let job = Job(job);
                let mut info: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = std::mem::zeroed();
                info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
                if SetInformationJobObject(
                    job.0,
                    JobObjectExtendedLimitInformation,
                    (&info as *const JOBOBJECT_EXTENDED_LIMIT_INFORMATION).cast(),
                    std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>() as u32,
                ) == 0
                    || AssignProcessToJobObject(job.0, process as HANDLE) == 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(job)
            }
        }

        pub fn terminate(&self) {
            // SAFETY: our own job handle.
            unsafe {
                TerminateJobObject(self.0, 1);
            }
        }
    }

    impl Drop for Job {
        fn drop(&mut self) {
            // SAFETY: closing our own handle; KILL_ON_JOB_CLOSE ends whatever is left.
            unsafe {
                CloseHandle(self.0);
            }
        }
    }
}
