//! The CLI process and everything it starts. Each session's CLI runs as the leader of a process
//! session of its own (`setsid`), so every process it starts — including the Bash commands it
//! puts in process groups of their own — can be found (same session id, or a descendant) and
//! killed, even after the CLI itself has died and they were re-parented
//! ([`crate::process::tree`]).

use std::ffi::OsStr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use futures::future::BoxFuture;
use tokio::process::{Child, Command};

use super::{Exec, ExecControl};
use crate::process::tree::{signal, ProcessTree, SIGTERM};

/// What a child runs between fork and exec, before anything else (joining the session's
/// cgroup, setting its rlimits): async-signal-safe calls only.
pub type PreExec = Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>;

/// Starts `program` with exactly `env`, piped stdio, as the leader of a new process session.
fn spawn<S: AsRef<OsStr>>(
    program: &OsStr,
    args: &[S],
    env: &[(String, String)],
    cwd: &Path,
    first: Option<PreExec>,
) -> std::io::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A safety net only: the session kills the process itself in every path.
        .kill_on_drop(true);
    #[cfg(not(unix))]
    let _ = first;
    #[cfg(unix)]
    {
        if let Some(f) = first {
            // SAFETY: the caller's promise (PreExec): async-signal-safe only.
            unsafe {
                cmd.pre_exec(f);
            }
        }
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // If the host process dies without cleaning up (killed, `process.exit()`), the
                // CLI gets SIGTERM, on which it stops its running tool and exits.
                #[cfg(target_os = "linux")]
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// [`spawn`], as an [`Exec`] whose control kills the whole process tree. `first` runs in the
/// child before anything else (Unix).
pub fn start<S: AsRef<OsStr>>(
    program: &OsStr,
    args: &[S],
    env: &[(String, String)],
    cwd: &Path,
    first: Option<PreExec>,
) -> std::io::Result<Exec> {
    #[cfg(target_os = "linux")]
    let sandboxed = first.is_some();
    let mut child = spawn(program, args, env, cwd, first)?;
    let tree = std::sync::Arc::new(ProcessTree::of(&child));
    // A sandbox's processes are in a pid namespace of their own: noted as soon as it exists,
    // so that a kill finds them after its outer process is gone (a normal exit included).
    #[cfg(target_os = "linux")]
    if sandboxed {
        let tree = std::sync::Arc::downgrade(&tree);
        tokio::spawn(async move {
            for _ in 0..NAMESPACE_POLLS {
                let Some(tree) = tree.upgrade() else { return };
                if tokio::task::spawn_blocking(move || tree.note_namespaces())
                    .await
                    .unwrap_or(true)
                {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
    }
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("the child's stdio is not piped"));
    };
    Ok(Exec {
        stdin: Box::new(stdin),
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
        control: Box::new(LocalControl { child, tree }),
    })
}

/// How often a sandbox's pid namespace is looked for (every 20 ms: 5 s).
#[cfg(target_os = "linux")]
const NAMESPACE_POLLS: u32 = 250;

struct LocalControl {
    child: Child,
    tree: std::sync::Arc<ProcessTree>,
}

impl ExecControl for LocalControl {
    fn pid(&self) -> Option<u32> {
        Some(self.tree.leader())
    }

    fn terminate(&self) {
        signal(self.tree.leader(), SIGTERM);
    }

    fn kill_all(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let tree = self.tree.clone();
            let _ = tokio::task::spawn_blocking(move || tree.kill_all()).await;
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Option<ExitStatus>> {
        Box::pin(async move { self.child.wait().await.ok() })
    }
}
