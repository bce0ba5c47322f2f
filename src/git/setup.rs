//! Running the commands provisioning starts that are not git: the worktree setup command
//! (`yarn install`) and the repository's `post-checkout` hook. Either may hang (a registry that
//! never answers) or start daemons, so each runs:
//!
//! - in a process group of its own, so the whole tree it starts can be found and killed — the
//!   group plus descendants that called `setsid` themselves (the `/proc` walk of
//!   [`crate::process::tree::kill_session`], shared with the CLI's process tree);
//! - bounded twice: by its own time limit (`config.worktreeSetupTimeout`) and by the session's
//!   stop signal (`cancelAgent`, `shutdown()`, the session's time limit). Either kills the tree
//!   at once (a few milliseconds) and reports which bound it was;
//! - with stdin closed and stdout/stderr drained continuously (a chatty install must not block
//!   on a full pipe), keeping only a bounded tail for the error message.
//!
//! On success anything it deliberately left running in the background is left alone.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::command::CommandError;
use super::repo::lock_std;
use crate::process::tree::KillTree;

/// How much of the command's output is kept for the error message.
pub const SETUP_OUTPUT_TAIL: usize = 8 * 1024;

/// After the command exits, how long to keep reading its pipes: a daemon it started may hold
/// them open forever.
const PIPE_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Why a bounded command did not succeed.
#[derive(Debug)]
pub(crate) enum RunError {
    /// It could not start, or exited unsuccessfully (with its output tail).
    Failed(CommandError),
    /// It was still running when its own time limit passed; its tree was killed.
    TimedOut { command: String, output: String },
    /// The stop signal fired while it ran; its tree was killed.
    Cancelled,
}

/// Runs `cmd` (program, args, cwd and environment already set) to completion within `limit`,
/// unless `stop` fires first. See the module docs.
pub(crate) async fn run_bounded(
    mut cmd: Command,
    display: String,
    limit: Duration,
    stop: &CancellationToken,
) -> Result<(), RunError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| RunError::Failed(CommandError::spawn(display.clone(), &e)))?;
    // Dropping this (an error, or the provision future being dropped) kills the whole tree.
    let mut tree = KillTree(child.id());
    let tail = Arc::new(StdMutex::new(Tail::new(SETUP_OUTPUT_TAIL)));
    let pumps = start_pumps(&mut child, &tail);
    let ended = tokio::select! {
        status = child.wait() => status,
        _ = tokio::time::sleep(limit) => {
            return Err(kill(tree, child, pumps, RunError::TimedOut { command: display, output: tail_text(&tail) }).await);
        }
        _ = stop.cancelled() => return Err(kill(tree, child, pumps, RunError::Cancelled).await),
    };
    let drained = async {
        let _ = tokio::time::timeout(PIPE_DRAIN_GRACE, futures::future::join_all(pumps)).await;
    };
    tokio::select! {
        _ = drained => {}
        _ = stop.cancelled() => return Err(RunError::Cancelled),
    }
    let status: ExitStatus =
        ended.map_err(|e| RunError::Failed(CommandError::spawn(display.clone(), &e)))?;
    if status.success() {
        tree.0 = None;
        return Ok(());
    }
    Err(RunError::Failed(CommandError::from_status(
        display,
        status,
        tail_text(&tail),
    )))
}

/// Kills the tree, reaps the leader and stops reading its pipes (a process that escaped the
/// kill must not keep us waiting on them).
async fn kill(
    tree: KillTree,
    mut child: Child,
    pumps: Vec<JoinHandle<()>>,
    why: RunError,
) -> RunError {
    drop(tree);
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_millis(500), child.wait()).await;
    for p in pumps {
        p.abort();
    }
    why
}

fn start_pumps(child: &mut Child, tail: &Arc<StdMutex<Tail>>) -> Vec<JoinHandle<()>> {
    let readers: Vec<Box<dyn tokio::io::AsyncRead + Unpin + Send>> = vec![
        Box::new(child.stdout.take().expect("stdout piped")),
        Box::new(child.stderr.take().expect("stderr piped")),
    ];
    readers
        .into_iter()
        .map(|mut r| {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match r.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => lock_std(&tail).push(&buf[..n]),
                    }
                }
            })
        })
        .collect()
}

fn tail_text(tail: &StdMutex<Tail>) -> String {
    let bytes: Vec<u8> = lock_std(tail).buf.iter().copied().collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Last `cap` bytes of a stream.
struct Tail {
    buf: std::collections::VecDeque<u8>,
    cap: usize,
}

impl Tail {
    fn new(cap: usize) -> Tail {
        Tail {
            buf: Default::default(),
            cap,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }
}

/// "600 s", "1.5 s": how a time limit is named in messages.
pub(crate) fn seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_only_the_last_bytes() {
        let mut t = Tail::new(4);
        t.push(b"ab");
        t.push(b"cdef");
        assert_eq!(t.buf.iter().copied().collect::<Vec<_>>(), b"cdef");
        t.push(b"0123456789");
        assert_eq!(t.buf.iter().copied().collect::<Vec<_>>(), b"6789");
    }

    #[test]
    fn limits_are_named_in_seconds() {
        assert_eq!(seconds(Duration::from_secs(600)), "600 s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
    }
}
