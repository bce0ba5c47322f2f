//! Which process owns something the adapter leaves behind it: a checkout's owner record
//! ([`crate::git::record`]), a temp dir's name ([`crate::scratch`]), a pod's annotation
//! ([`crate::environment::kubernetes`]). An engine killed before it cleaned up (SIGKILL, a
//! crash) leaves them, and the next adapter removes exactly those whose owner is gone, never a
//! live one's: so the record must say unambiguously whether its process still runs.
//!
//! A pid alone is not enough: pids are reused, so the record also carries the process start time
//! (field 22 of `/proc/<pid>/stat`, clock ticks since boot) and the host name (a repository on a
//! shared file system may be used from several machines; another host's pids cannot be checked,
//! so such owners are presumed alive). A text that is not this record (a person's `git worktree
//! lock` reason, git's own placeholder) is never taken for one: what it marks is never removed
//! by mistake, at worst kept.

use std::fmt;

const PREFIX: &str = "claude-runtime-adapter owner";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    /// Start time of the process in clock ticks since boot; 0 when unknown (no `/proc`).
    pub start_time: u64,
    pub host: String,
}

impl Owner {
    /// The current process.
    pub fn current() -> Owner {
        Owner::of_pid(std::process::id()).unwrap_or(Owner {
            pid: std::process::id(),
            start_time: 0,
            host: hostname(),
        })
    }

    /// The owner record for a running process, or None if there is no such process.
    pub fn of_pid(pid: u32) -> Option<Owner> {
        let start_time = match proc_start_time(pid) {
            Some(t) => t,
            None if cfg!(target_os = "linux") => return None,
            None => 0,
        };
        Some(Owner {
            pid,
            start_time,
            host: hostname(),
        })
    }

    /// A record of this host read back from elsewhere (a directory's name).
    pub fn on_this_host(pid: u32, start_time: u64) -> Owner {
        Owner {
            pid,
            start_time,
            host: hostname(),
        }
    }

    /// The record as text (a checkout's `locked` file, a pod's annotation).
    pub fn to_record(&self) -> String {
        self.to_string()
    }

    /// Parses a record written by [`Owner::to_record`]; None for anything else (a user's own
    /// `git worktree lock` reason, a worktree made by another tool).
    pub fn parse(record: &str) -> Option<Owner> {
        let rest = record.trim().strip_prefix(PREFIX)?;
        let (mut pid, mut start, mut host) = (None, None, None);
        for field in rest.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            match k {
                "pid" => pid = v.parse().ok(),
                "start" => start = v.parse().ok(),
                "host" => host = Some(v.to_string()),
                _ => {}
            }
        }
        Some(Owner {
            pid: pid?,
            start_time: start?,
            host: host?,
        })
    }

    /// Whether the recorded process still runs (same pid, same start time) on this host.
    pub fn is_alive(&self) -> bool {
        if self.host != hostname() {
            return true;
        }
        if self.start_time != 0 {
            if let Some(t) = proc_start_time(self.pid) {
                return t == self.start_time;
            }
            if cfg!(target_os = "linux") {
                return false;
            }
        }
        pid_exists(self.pid)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX} pid={} start={} host={}",
            self.pid, self.start_time, self.host
        )
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`. The command name (field 2) may contain spaces
/// and parentheses, so fields are counted from the last ')'.
fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // After ')' come fields 3 (state), 4, ...; starttime is field 22, i.e. index 19.
    let start: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    // A zombie has exited: its pid is not reused yet but the owner is gone.
    let state = after.split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    Some(start)
}

#[cfg(unix)]
fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence/permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Without a cheap existence probe, an owner is presumed alive: a sweep must never remove a
/// live session's worktree.
#[cfg(not(unix))]
fn pid_exists(_pid: u32) -> bool {
    true
}

#[cfg(not(unix))]
fn hostname() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "unknown".to_string())
}

#[cfg(unix)]
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates when it fits.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name: String = String::from_utf8_lossy(&buf[..end])
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '=')
        .collect();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}
