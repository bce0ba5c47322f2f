//! The engine's half of the pod protocol (`environment::remote`) against the real in-pod agent:
//! each test runs `cra-pod mux` as a local child process and talks to it over its stdin and
//! stdout, exactly as the Kubernetes backend does over its exec stream. The "pod" is this
//! machine, so what the pod agent starts can be checked in /proc.
//!
//! `cra-pod` is another package of the workspace, so cargo does not build it for these tests:
//! the first test to need it runs `cargo build -p cra-pod` (a no-op once built) and takes the
//! binary's path from cargo's own build report.
#![cfg(unix)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use claude_runtime_adapter::environment::remote::{RemoteCommand, RemoteShell};
use claude_runtime_adapter::environment::Exec;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The `cra-pod` binary, built once per test run.
fn cra_pod() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "cra-pod", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(Stdio::inherit())
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo build -p cra-pod failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["target"]["name"] == "cra-pod")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo reports the cra-pod executable")
    })
}

/// A `cra-pod mux` child and the shell over its stdio.
async fn pod() -> (RemoteShell, Child) {
    let mut child = Command::new(cra_pod())
        .arg("mux")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (r, w) = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
    let shell = RemoteShell::start(r, w)
        .await
        .expect("the pod agent says Ready");
    (shell, child)
}

fn sh(script: &str) -> RemoteCommand {
    RemoteCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
        cwd: "/".into(),
    }
}

const BOUND: Duration = Duration::from_secs(20);

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("settles within the bound")
}

/// True while `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

async fn until_dead(pids: &[u32]) {
    bounded(async {
        while pids.iter().any(|p| alive(*p)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// The pids a command prints, one a line, read from its stdout (which stays open).
async fn read_pids(exec: &mut Exec, n: usize) -> Vec<u32> {
    let mut lines = BufReader::new(&mut exec.stdout).lines();
    let mut pids = Vec::new();
    while pids.len() < n {
        let line = bounded(lines.next_line())
            .await
            .unwrap()
            .expect("a pid line");
        pids.push(line.trim().parse().unwrap());
    }
    pids
}

#[tokio::test]
async fn run_round_trips_binary_stdin_stdout_stderr_and_the_exit_code() {
    let (shell, _child) = pod().await;
    let input: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let out = bounded(shell.run(sh("cat; printf 'e\\0rr' >&2; exit 3"), &input, 1 << 20))
        .await
        .unwrap();
    assert_eq!(out.stdout, input);
    assert_eq!(out.stderr, b"e\0rr");
    assert_eq!(out.status.code(), Some(3));

    // The environment is exactly the one given, the cwd is honoured.
    let mut cmd = sh("pwd; env | sort");
    cmd.env.push(("ONLY".into(), "this".into()));
    cmd.cwd = "/tmp".into();
    let out = bounded(shell.run(cmd, b"", 4096)).await.unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("/tmp"));
    let env: Vec<&str> = lines
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    assert_eq!(env.len(), 2, "{env:?}");
    assert!(env.contains(&"ONLY=this"));
    bounded(shell.shutdown()).await.unwrap();
}

#[tokio::test]
async fn ten_megabytes_go_through_cat_and_back() {
    let (shell, _child) = pod().await;
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let mut exec = bounded(shell.spawn(sh("exec cat"))).await.unwrap();
    let mut stdin = exec.stdin;
    let to_write = data.clone();
    let writer = tokio::spawn(async move {
        stdin.write_all(&to_write).await.unwrap();
        stdin.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    bounded(exec.stdout.read_to_end(&mut back)).await.unwrap();
    bounded(writer).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the bytes came back changed");
    let status = bounded(exec.control.wait()).await.expect("an exit status");
    assert!(status.success());
    bounded(shell.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_program_that_cannot_start_and_too_much_output_are_errors() {
    let (shell, _child) = pod().await;
    let missing = RemoteCommand {
        argv: vec!["/nonexistent/program".into()],
        env: Vec::new(),
        cwd: "/".into(),
    };
    let err = bounded(shell.run(missing.clone(), b"", 10))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("spawn failed") && err.message.contains("/nonexistent/program"),
        "{}",
        err.message
    );
    // Through spawn: output EOF and no status.
    let mut exec = bounded(shell.spawn(missing)).await.unwrap();
    let mut out = Vec::new();
    bounded(exec.stdout.read_to_end(&mut out)).await.unwrap();
    assert_eq!(bounded(exec.control.wait()).await, None);

    // Endless output: the error comes at once and the process is killed.
    let err = bounded(shell.run(sh("exec yes"), b"", 4096))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("more than 4096 bytes on stdout"),
        "{}",
        err.message
    );
    // The shell is still usable.
    let out = bounded(shell.run(sh("echo ok"), b"", 10)).await.unwrap();
    assert_eq!(out.stdout, b"ok\n");
    bounded(shell.shutdown()).await.unwrap();
}

#[tokio::test]
async fn terminate_and_kill_all_reach_the_whole_process_group() {
    let (shell, _child) = pod().await;
    // SIGTERM: the shell and its background sleep both end.
    let mut exec = bounded(shell.spawn(sh("sleep 100 & echo $!; wait")))
        .await
        .unwrap();
    let pids = read_pids(&mut exec, 1).await;
    assert!(alive(pids[0]));
    exec.control.terminate();
    let status = bounded(exec.control.wait()).await.expect("an exit status");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    until_dead(&pids).await;

    // SIGKILL: a group that ignores SIGTERM still ends, and kill_all returns once it has.
    // What left the group (a session of its own) is part of the tree it kills.
    let script = "trap '' TERM; sleep 100 & echo $!; setsid sleep 100 & echo $!; wait";
    let mut exec = bounded(shell.spawn(sh(script))).await.unwrap();
    let pids = read_pids(&mut exec, 2).await;
    exec.control.terminate();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(alive(pids[0]) && alive(pids[1]), "SIGTERM is ignored");
    bounded(exec.control.kill_all()).await;
    assert_eq!(
        bounded(exec.control.wait()).await.and_then(|s| s.signal()),
        Some(libc::SIGKILL)
    );
    until_dead(&pids).await;
    bounded(shell.shutdown()).await.unwrap();
}

#[tokio::test]
async fn listen_tunnels_pod_connections_to_the_engine_socket_both_ways_with_half_close() {
    let (shell, _child) = pod().await;
    let tmp = tempfile::tempdir().unwrap();
    let engine_sock = tmp.path().join("engine.sock");
    let pod_sock = tmp.path().join("pod.sock");
    // A stale socket at the pod path is replaced.
    let _stale = std::os::unix::net::UnixListener::bind(&pod_sock).unwrap();
    let engine = tokio::net::UnixListener::bind(&engine_sock).unwrap();
    bounded(shell.listen(pod_sock.to_str().unwrap(), engine_sock.clone()))
        .await
        .unwrap();

    // The engine side: read the whole request (its EOF is the client's half-close), then
    // answer and close.
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (mut s, _) = engine.accept().await.unwrap();
            let mut req = Vec::new();
            s.read_to_end(&mut req).await.unwrap();
            s.write_all(b"pong:").await.unwrap();
            s.write_all(&req).await.unwrap();
            s.shutdown().await.unwrap();
        }
    });

    // A connection from inside the "pod": this process, directly.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut c = tokio::net::UnixStream::connect(&pod_sock).await.unwrap();
    c.write_all(&big).await.unwrap();
    c.shutdown().await.unwrap();
    let mut reply = Vec::new();
    bounded(c.read_to_end(&mut reply)).await.unwrap();
    assert_eq!(&reply[..5], b"pong:");
    assert!(
        reply[5..] == big[..],
        "the tunnelled bytes came back changed"
    );

    // And from a process the pod agent runs, through socat.
    let script = format!(
        "printf ping | socat -t 10 - UNIX-CONNECT:{}",
        pod_sock.display()
    );
    let out = bounded(shell.run(sh(&script), b"", 1024)).await.unwrap();
    assert_eq!(
        out.stdout,
        b"pong:ping",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bounded(server).await.unwrap();

    // Listening where something else is: a clear error.
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err = bounded(shell.listen(file.to_str().unwrap(), engine_sock))
        .await
        .unwrap_err();
    assert!(err.message.contains("not a socket"), "{}", err.message);
    bounded(shell.shutdown()).await.unwrap();
    // Bye unlinks the pod's sockets.
    assert!(!pod_sock.exists());
}

#[tokio::test]
async fn a_broken_transport_ends_every_pending_exec() {
    let (shell, mut child) = pod().await;
    let mut a = bounded(shell.spawn(sh("exec cat"))).await.unwrap();
    let mut b = bounded(shell.spawn(sh("echo started; exec sleep 100")))
        .await
        .unwrap();
    let mut first = [0u8; 8];
    bounded(b.stdout.read_exact(&mut first)).await.unwrap();
    child.start_kill().unwrap();
    bounded(shell.closed()).await;
    for exec in [&mut a, &mut b] {
        let mut rest = Vec::new();
        bounded(exec.stdout.read_to_end(&mut rest)).await.unwrap();
        bounded(exec.stderr.read_to_end(&mut rest)).await.unwrap();
        assert_eq!(bounded(exec.control.wait()).await, None);
        bounded(exec.control.kill_all()).await;
    }
    assert!(a.stdin.write_all(b"x").await.is_err());
    let err = bounded(shell.spawn(sh("true")))
        .await
        .err()
        .expect("no spawn after the end");
    assert!(err.message.contains("ended"), "{}", err.message);
}

#[tokio::test]
async fn bye_and_a_dropped_shell_leave_no_process_behind() {
    for by_bye in [true, false] {
        let (shell, mut child) = pod().await;
        let script = "sleep 100 & echo $!; setsid sleep 100 & echo $!; sh -c 'echo $$; exec sleep 100' & wait";
        let mut a = bounded(shell.spawn(sh(script))).await.unwrap();
        let mut pids = read_pids(&mut a, 3).await;
        let mut b = bounded(shell.spawn(sh("echo $$; exec sleep 100")))
            .await
            .unwrap();
        pids.extend(read_pids(&mut b, 1).await);
        assert!(pids.iter().all(|p| alive(*p)));
        if by_bye {
            bounded(shell.shutdown()).await.unwrap();
        } else {
            drop(shell);
        }
        let status = bounded(child.wait()).await.unwrap();
        assert_eq!(status.code(), Some(0));
        until_dead(&pids).await;
        // Killed (if its Exit got out before the pod agent did) or unknown.
        use std::os::unix::process::ExitStatusExt;
        let status = bounded(a.control.wait()).await;
        assert!(
            status.is_none_or(|s| s.signal() == Some(libc::SIGKILL)),
            "{status:?}"
        );
    }
}

/// bubblewrap's `--die-with-parent` (PR_SET_PDEATHSIG) fires when the THREAD that forked it
/// exits: the pod agent forks from a thread that lives as long as it does, so a jailed CLI
/// is not killed when the spawn is over.
#[tokio::test]
async fn a_die_with_parent_sandbox_outlives_its_spawn() {
    let (shell, _child) = pod().await;
    let mut cmd = sh("");
    cmd.argv = [
        "bwrap",
        "--die-with-parent",
        "--unshare-user",
        "--unshare-pid",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "sh",
        "-c",
        "sleep 1; echo alive",
    ]
    .map(String::from)
    .to_vec();
    let out = bounded(shell.run(cmd, b"", 1024)).await.unwrap();
    assert_eq!(
        out.stdout,
        b"alive\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    bounded(shell.shutdown()).await.unwrap();
}
