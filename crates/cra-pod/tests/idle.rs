//! `cra-pod idle` as pid 1: run it as pid 1 of a new pid namespace (`unshare`), as a pod's
//! container command is.

use std::process::Command;
use std::time::{Duration, Instant};

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// SIGKILLs the namespace (its pid 1) when dropped, so a failing test leaves nothing running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(init) = children(self.0.id()).first() {
            // SAFETY: signalling a process this test started; killing a pid namespace's
            // pid 1 kills the whole namespace.
            unsafe {
                libc::kill(*init as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it holds, for at most 10 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn idle_as_pid_1_reaps_orphans_and_exits_0_on_sigterm_and_sigint() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // pid 1 (sh) leaves an orphan that outlives it by a moment, then becomes cra-pod idle:
        // the orphan's exit must be reaped by idle, or it stays a zombie child of it.
        let script = format!(
            "sh -c 'sleep 0.3 &'; exec {} idle",
            env!("CARGO_BIN_EXE_cra-pod")
        );
        let unshare = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "sh",
                "-c",
                &script,
            ])
            .spawn()
            .expect("unshare runs");
        let mut unshare = KillOnDrop(unshare);
        let mut idle = 0;
        eventually("cra-pod idle runs as the namespace's pid 1", || {
            idle = children(unshare.0.id()).first().copied().unwrap_or(0);
            idle != 0 && comm(idle) == "cra-pod"
        });
        eventually("the orphan is reaped", || children(idle).is_empty());
        // SAFETY: signalling the process this test started.
        unsafe {
            libc::kill(idle as libc::pid_t, signal);
        }
        let status = unshare.0.wait().unwrap();
        assert_eq!(status.code(), Some(0), "after signal {signal}");
    }
}
