//! Running the git CLI: argv only (never a shell string), stdin closed, no prompt, no pager,
//! C locale (so the few stderr messages we classify read the same everywhere), output read
//! into growable buffers (no ceiling short of memory), and bounded retries when another git
//! process holds one of the repository's lock files.

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::confine::Confinement;
use crate::process::tree::KillTree;

/// Environment variables that would point git at another repository, index or diff program.
/// The Node process may itself run under a git hook (which exports `GIT_DIR`, `GIT_INDEX_FILE`,
/// ...); inheriting them would make every command below act on the wrong repository.
pub(crate) const SCRUBBED_ENV: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_QUARANTINE_PATH",
    "GIT_EXTERNAL_DIFF",
    "GIT_DIFF_OPTS",
    "GIT_ATTR_SOURCE",
];

/// How long a lock held by another git process is waited out before giving up.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A git (or setup) command that could not start or exited unsuccessfully. Kept as the
/// `cause` of the `AdapterError` so callers see git's own words.
#[derive(Debug, Clone)]
pub struct CommandError {
    /// The command line, for humans (argv joined with spaces; never executed as a string).
    pub command: String,
    /// Exit code, when the process exited normally.
    pub code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    /// What it printed (git: stderr; setup: the tail of stdout+stderr), lossily decoded.
    pub output: String,
    /// Set when the process could not be started at all (e.g. not on PATH).
    pub spawn_error: Option<String>,
}

impl CommandError {
    pub(crate) fn from_status(command: String, status: ExitStatus, output: String) -> Self {
        #[cfg(unix)]
        let signal = std::os::unix::process::ExitStatusExt::signal(&status);
        #[cfg(not(unix))]
        let signal = None;
        CommandError {
            command,
            code: status.code(),
            signal,
            output,
            spawn_error: None,
        }
    }

    pub(crate) fn spawn(command: String, err: &std::io::Error) -> Self {
        CommandError {
            command,
            code: None,
            signal: None,
            output: String::new(),
            spawn_error: Some(err.to_string()),
        }
    }

    /// "exit status 1" / "killed by signal 9" / "could not start: ...".
    pub fn status_text(&self) -> String {
        if let Some(e) = &self.spawn_error {
            format!("could not start: {e}")
        } else if let Some(c) = self.code {
            format!("exit status {c}")
        } else if let Some(s) = self.signal {
            format!("killed by signal {s}")
        } else {
            "unknown status".to_string()
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` failed ({})", self.command, self.status_text())?;
        let out = self.output.trim();
        if !out.is_empty() {
            write!(f, ": {out}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CommandError {}

pub(crate) fn display_argv<S: AsRef<OsStr>>(program: &str, args: &[S]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(&a.as_ref().to_string_lossy());
    }
    s
}

/// A `git` command with the hygiene every invocation needs.
pub(crate) fn git_command<S: AsRef<OsStr>>(cwd: &Path, args: &[S]) -> Command {
    let mut cmd = Command::new("git");
    cmd.args(args);
    hygiene(cmd, cwd)
}

/// Where a git command of the adapter's runs: a directory, and the sandbox to run it in when
/// the directory is an agent's clone ([`super::confine`]). The agent wrote that clone's config,
/// hooks and attributes (`core.fsmonitor`, filter drivers, …), which git would otherwise run
/// unconfined when the adapter stages the clone for its patch.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub dir: &'a Path,
    pub jail: Option<&'a dyn Confinement>,
}

impl std::ops::Deref for At<'_> {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.dir
    }
}

/// Settings of the clone's config that the adapter's git never honours, jailed or not: the
/// agent's `core.fsmonitor` (a program git runs on every index read: `sleep 100000` would wedge
/// the extraction), hooks, and any transport (a partial clone's lazy fetch would run
/// `core.sshCommand` or an `ext::` helper), and the settings that would make git trust an
/// index entry's stat data further than its racy-clean rule allows (a file judged unchanged
/// by its size and mtime alone: `super::patch`'s module docs). Passed as `-c`, which outranks
/// the clone's config and reaches the git processes git itself starts (`GIT_CONFIG_PARAMETERS`).
const NEUTRALISED: &[&str] = &[
    "-c",
    "core.fsmonitor=",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.allow=never",
    "-c",
    "core.checkStat=default",
    "-c",
    "core.trustctime=true",
    "-c",
    "core.ignoreStat=false",
    "-c",
    "core.untrackedCache=false",
];

/// `git` with [`NEUTRALISED`], as a shell command (for git run in a remote checkout).
#[cfg(unix)]
pub(crate) fn neutral_git_sh() -> String {
    std::iter::once("git")
        .chain(NEUTRALISED.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

impl At<'_> {
    /// `git args` in this directory with the clone's own programs neutralised
    /// ([`NEUTRALISED`]); inside the sandbox when there is one, else in a process group of its
    /// own. Either way dropping the run (a time limit, a cancel) kills git and everything it
    /// started ([`run`]).
    pub(crate) fn git<S: AsRef<OsStr>>(&self, args: &[S]) -> Command {
        let args: Vec<std::ffi::OsString> = NEUTRALISED
            .iter()
            .map(OsStr::new)
            .chain(args.iter().map(AsRef::as_ref))
            .map(Into::into)
            .collect();
        self.program("git", &args)
    }

    /// `sh -c script sh args…` where [`At::git`] would run git: for several git steps in one
    /// jail (one bubblewrap, one overlay mount). `script` is the adapter's fixed text, which
    /// calls git as [`neutral_git_sh`] does; whatever the agent controls (paths) goes in `args`
    /// or on stdin, never into the text. Only layers use it, which exist on Linux alone.
    #[cfg(target_os = "linux")]
    pub(crate) fn sh(&self, script: &str, args: &[std::ffi::OsString]) -> Command {
        let mut argv: Vec<std::ffi::OsString> = vec!["-c".into(), script.into(), "sh".into()];
        argv.extend_from_slice(args);
        self.program("sh", &argv)
    }

    fn program(&self, program: &str, args: &[std::ffi::OsString]) -> Command {
        let Some(jail) = self.jail else {
            let mut cmd = Command::new(program);
            cmd.args(args);
            #[cfg_attr(not(unix), allow(unused_mut))]
            let mut cmd = hygiene(cmd, self.dir);
            #[cfg(unix)]
            cmd.process_group(0);
            return cmd;
        };
        hygiene(jail.command(OsStr::new(program), args), self.dir)
    }
}

fn hygiene(mut cmd: Command, cwd: &Path) -> Command {
    cmd.current_dir(cwd)
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env("PAGER", "cat")
        .env("LC_ALL", "C")
        .env("LANGUAGE", "C");
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// Output of a successful git run (its stderr only matters when it fails).
pub(crate) struct GitOutput {
    pub stdout: Vec<u8>,
}

/// Runs `cmd` to completion, reading stdout and stderr concurrently into growable buffers
/// (reading them one after the other deadlocks once the other pipe fills).
pub(crate) async fn run(mut cmd: Command, display: String) -> Result<GitOutput, CommandError> {
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandError::spawn(display.clone(), &e))?;
    let mut tree = KillTree(child.id());
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let (r1, r2, status) = tokio::join!(
        stdout.read_to_end(&mut out),
        stderr.read_to_end(&mut err),
        child.wait()
    );
    tree.0 = None;
    let status = status.map_err(|e| CommandError::spawn(display.clone(), &e))?;
    if let Err(e) = r1.and(r2) {
        return Err(CommandError::spawn(display, &e));
    }
    finish(display, status, out, &err)
}

fn finish(
    display: String,
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: &[u8],
) -> Result<GitOutput, CommandError> {
    if status.success() {
        Ok(GitOutput { stdout })
    } else {
        Err(CommandError::from_status(
            display,
            status,
            String::from_utf8_lossy(stderr).into_owned(),
        ))
    }
}

/// Whether git failed only because another process holds one of the repository's lock files
/// (`index.lock`, `config.lock`, `refs/heads/x.lock`, `packed-refs.lock`, ...). Relies on the C
/// locale set in [`git_command`]: "Unable to create '<path>.lock': File exists." and
/// "could not lock config file".
pub(crate) fn is_lock_contention(err: &CommandError) -> bool {
    let o = &err.output;
    (o.contains(".lock") && o.contains("File exists")) || o.contains("could not lock config file")
}

/// Runs git in `cwd`; if it fails on a lock held by another git process, waits with exponential
/// backoff (25 ms doubling to 500 ms) and retries, for up to [`LOCK_WAIT`]. Retrying is safe for
/// the commands we run this way: git rolls back a `worktree add` or `branch -D` that failed on a
/// lock before changing anything.
pub(crate) async fn run_git_retrying<S: AsRef<OsStr>>(
    cwd: &Path,
    args: &[S],
) -> Result<GitOutput, CommandError> {
    run_git_retrying_until(cwd, args, None).await
}

/// [`run_git_retrying`] that stops waiting between attempts once `stop` fires (returning the
/// last lock error: the failed attempt changed nothing). An attempt already running is never
/// interrupted, so git is never killed half-way through a metadata change.
pub(crate) async fn run_git_retrying_until<S: AsRef<OsStr>>(
    cwd: &Path,
    args: &[S],
    stop: Option<&CancellationToken>,
) -> Result<GitOutput, CommandError> {
    let shown = display_argv("git", args);
    let deadline = Instant::now() + LOCK_WAIT;
    let mut delay = Duration::from_millis(25);
    loop {
        match run(git_command(cwd, args), shown.clone()).await {
            Err(e) if is_lock_contention(&e) && Instant::now() + delay < deadline => {
                tracing::debug!(command = %shown, "git lock held by another process; retrying");
                let stopped = async {
                    match stop {
                        Some(s) => s.cancelled().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stopped => return Err(e),
                }
                delay = (delay * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Runs `cmd` with `input` written to its stdin (then closed), e.g. `update-index --index-info`.
pub(crate) async fn run_with_input(
    mut cmd: Command,
    display: String,
    input: Vec<u8>,
) -> Result<GitOutput, CommandError> {
    use tokio::io::AsyncWriteExt;
    cmd.stdin(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandError::spawn(display.clone(), &e))?;
    let mut tree = KillTree(child.id());
    let mut stdin = child.stdin.take().expect("stdin piped");
    let mut stdout = child.stdout.take().expect("stdout piped");
    let mut stderr = child.stderr.take().expect("stderr piped");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let feed = async move {
        let r = stdin.write_all(&input).await;
        drop(stdin);
        r
    };
    let (w, r1, r2, status) = tokio::join!(
        feed,
        stdout.read_to_end(&mut out),
        stderr.read_to_end(&mut err),
        child.wait()
    );
    tree.0 = None;
    let status = status.map_err(|e| CommandError::spawn(display.clone(), &e))?;
    if let Err(e) = w.and(r1.map(drop)).and(r2.map(drop)) {
        return Err(CommandError::spawn(display, &e));
    }
    finish(display, status, out, &err)
}

/// Runs git once (read-only commands: no lock to wait for).
pub(crate) async fn run_git<S: AsRef<OsStr>>(
    cwd: &Path,
    args: &[S],
) -> Result<GitOutput, CommandError> {
    run(git_command(cwd, args), display_argv("git", args)).await
}
