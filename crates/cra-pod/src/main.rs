//! The adapter's agent inside a session pod (`/usr/local/bin/cra-pod`), a static binary:
//! - `cra-pod idle`: the container's command, pid 1: reaps orphans, exits 0 on SIGTERM/SIGINT.
//! - `cra-pod mux`: the `pod-wire` protocol server on stdin/stdout for the engine's one exec
//!   stream: spawns processes with their stdio as channels, signals them, reports their exit,
//!   listens on unix sockets and tunnels accepted connections back. Its own diagnostics go to
//!   stderr.
//! - `cra-pod layer` and `cra-pod base`: a checkout's base kept once per node and each
//!   session's layer over it ([`node_base`]).
//! - `cra-pod candidates`, `receive` and `pathspecs`: the end of a session on such a layer
//!   reads only what changed ([`candidates`]).
//!
//! Threads, so no frame waits on another channel's consumer: one reader of stdin frames (the
//! main thread), one writer of stdout frames fed by a channel, a writer thread per process
//! stdin and per connection, a reader thread per process stdout/stderr and per connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

mod candidates;
mod node_base;

use pod_wire::{Decoder, Exit, Failure, Frame, Hello, Kind, Listen, Open, SignalRequest, Spawn};

/// Bytes read from a pipe or connection per `Stdout`/`Stderr`/`Data` frame.
const CHUNK: usize = 64 * 1024;
/// Frames waiting for the stream writer (at most 16 MiB).
const OUT_QUEUE: usize = 256;

fn main() {
    let mode = std::env::args().nth(1);
    match mode.as_deref() {
        Some("idle") => idle(),
        Some("mux") => mux(),
        Some("layer") => node_base::layer(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("base") => node_base::base(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("candidates") => candidates::candidates(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("receive") => candidates::receive(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("pathspecs") => candidates::pathspecs(&std::env::args().skip(2).collect::<Vec<_>>()),
        _ => {
            eprintln!(
                "usage: cra-pod idle | mux | layer FILE -- CMD... | base BASES KEY NAME | \
                 candidates LAYERFILE LIMIT | receive DIR | pathspecs DIR"
            );
            std::process::exit(2);
        }
    }
}

/// pid 1 of the session pod: nothing runs it but the container runtime, and the processes
/// `mux` starts are re-parented to it when their parent dies, so it reaps them.
fn idle() -> ! {
    let oom_kills_at_start = oom_kills();
    // SAFETY: signal-mask calls on this single-threaded process with a zeroed, initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        // Blocked, so they are taken by sigtimedwait below, not by default dispositions (which
        // pid 1 does not have anyway: the kernel drops signals pid 1 does not handle).
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let tick = libc::timespec {
            tv_sec: 0,
            tv_nsec: 250_000_000,
        };
        loop {
            let sig = libc::sigtimedwait(&set, std::ptr::null_mut(), &tick);
            if sig == libc::SIGTERM || sig == libc::SIGINT {
                std::process::exit(0);
            }
            if sig == libc::SIGCHLD {
                // Reap every exited child (several may share one signal).
                while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            }
            // A process of the pod killed for memory ends the whole pod (and so the session),
            // as an OOM kill ends a local session: the container's runtime then reports it
            // `OOMKilled`, which the engine names. Without this only the biggest process (the
            // agent's build, say) would die and the session go on without it.
            if oom_kills() > oom_kills_at_start {
                eprintln!("cra-pod: a process of this pod was killed for memory; ending the pod");
                std::process::exit(137);
            }
        }
    }
}

/// The container's count of processes killed for memory (cgroup v2 `memory.events`, v1
/// `memory.oom_control`); 0 when neither can be read.
fn oom_kills() -> u64 {
    [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .find_map(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
    })
    .unwrap_or(0)
}

enum Input {
    Data(Vec<u8>),
    Eof,
}

struct Proc {
    /// Its stdin writer; `None` once the engine sent `Eof`.
    stdin: Option<Sender<Input>>,
    /// Its process group once spawned (0 before).
    pgid: i32,
    /// A signal that came before the spawn finished.
    pending_signal: Option<i32>,
}

struct Conn {
    to_socket: Sender<Input>,
    stream: UnixStream,
}

struct State {
    /// Frames for the stream writer. Bounded: a process that writes faster than the stream
    /// carries waits in its pipe (as it would on a terminal) instead of growing this queue.
    /// The engine reads the stream without ever waiting on a consumer, so this drains.
    out: SyncSender<Vec<u8>>,
    procs: Mutex<HashMap<u32, Proc>>,
    conns: Mutex<HashMap<u32, Conn>>,
    listeners: Mutex<Vec<String>>,
    /// Every process group started, for `Bye`.
    groups: Mutex<Vec<i32>>,
    next_conn: AtomicU32,
}

/// A poisoned lock only means another thread panicked while holding it; the maps stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn send(&self, kind: Kind, id: u32, payload: &[u8]) {
        match pod_wire::encode(kind, id, payload) {
            Ok(bytes) => {
                let _ = self.out.send(bytes);
            }
            Err(e) => eprintln!("cra-pod: not sent: {e}"),
        }
    }

    /// `Bye`, stdin EOF or a broken stream: SIGKILL everything started, unlink the sockets,
    /// exit.
    fn finish(&self, code: i32) -> ! {
        let groups = lock(&self.groups).clone();
        kill_tree(std::process::id() as i32, &groups);
        for path in lock(&self.listeners).iter() {
            let _ = std::fs::remove_file(path);
        }
        std::process::exit(code);
    }
}

fn mux() {
    let (out_tx, out_rx) = sync_channel::<Vec<u8>>(OUT_QUEUE);
    let state = Arc::new(State {
        out: out_tx,
        procs: Mutex::new(HashMap::new()),
        conns: Mutex::new(HashMap::new()),
        listeners: Mutex::new(Vec::new()),
        groups: Mutex::new(Vec::new()),
        next_conn: AtomicU32::new(pod_wire::POD_ID_BASE),
    });
    {
        let state = state.clone();
        thread::spawn(move || {
            let mut stdout = std::io::stdout().lock();
            for bytes in out_rx {
                if stdout
                    .write_all(&bytes)
                    .and_then(|_| stdout.flush())
                    .is_err()
                {
                    // The engine is gone.
                    state.finish(0);
                }
            }
        });
    }
    // Spawned processes get PR_SET_PDEATHSIG, which fires when the spawning THREAD exits:
    // this one never does.
    let (spawn_tx, spawn_rx) = channel::<(u32, Spawn, Receiver<Input>)>();
    {
        let state = state.clone();
        thread::spawn(move || {
            for (id, req, stdin_rx) in spawn_rx {
                spawn_process(&state, id, req, stdin_rx);
            }
        });
    }
    state.send(
        Kind::Ready,
        0,
        &Hello {
            version: pod_wire::VERSION,
        }
        .to_json(),
    );

    let mut decoder = Decoder::new();
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(0) => state.finish(0),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("cra-pod: reading the stream: {e}");
                state.finish(1);
            }
        };
        decoder.feed(&buf[..n]);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => handle(&state, &spawn_tx, frame),
                Ok(None) => break,
                Err(e) => {
                    eprintln!("cra-pod: protocol error: {e}");
                    state.finish(1);
                }
            }
        }
    }
}

fn handle(state: &Arc<State>, spawn_tx: &Sender<(u32, Spawn, Receiver<Input>)>, frame: Frame) {
    let id = frame.id;
    match frame.kind {
        Kind::Spawn => {
            let req = match Spawn::from_json(&frame.payload) {
                Ok(r) => r,
                Err(e) => {
                    let why = Exit::Error(format!("spawn failed: {e}"));
                    state.send(Kind::Exit, id, &why.to_json());
                    return;
                }
            };
            let mut procs = lock(&state.procs);
            if id >= pod_wire::POD_ID_BASE || procs.contains_key(&id) {
                eprintln!("cra-pod: spawn with an unusable id {id} ignored");
                return;
            }
            let (tx, rx) = channel();
            procs.insert(
                id,
                Proc {
                    stdin: Some(tx),
                    pgid: 0,
                    pending_signal: None,
                },
            );
            drop(procs);
            let _ = spawn_tx.send((id, req, rx));
        }
        Kind::Data | Kind::Eof => {
            let input = if frame.kind == Kind::Data {
                Input::Data(frame.payload)
            } else {
                Input::Eof
            };
            if id >= pod_wire::POD_ID_BASE {
                if let Some(c) = lock(&state.conns).get(&id) {
                    let _ = c.to_socket.send(input);
                }
            } else if let Some(p) = lock(&state.procs).get_mut(&id) {
                let eof = matches!(input, Input::Eof);
                if let Some(tx) = &p.stdin {
                    let _ = tx.send(input);
                }
                if eof {
                    p.stdin = None;
                }
            }
        }
        Kind::Signal => match SignalRequest::from_json(&frame.payload) {
            Ok(s) => {
                if let Some(p) = lock(&state.procs).get_mut(&id) {
                    if p.pgid > 0 {
                        signal_process(p.pgid, s.signal);
                    } else {
                        p.pending_signal = Some(s.signal);
                    }
                }
            }
            Err(e) => eprintln!("cra-pod: signal for {id} ignored: {e}"),
        },
        Kind::Listen => match Listen::from_json(&frame.payload) {
            Ok(l) => listen(state, id, l.path),
            Err(e) => {
                let f = Failure {
                    error: format!("listen failed: {e}"),
                };
                state.send(Kind::Close, id, &f.to_json());
            }
        },
        Kind::Close => {
            if let Some(c) = lock(&state.conns).remove(&id) {
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
            }
        }
        Kind::Bye => state.finish(0),
        Kind::Ready | Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Open => {
            eprintln!("cra-pod: a {:?} frame from the engine ignored", frame.kind);
        }
    }
}

/// Runs on the spawner thread.
fn spawn_process(state: &Arc<State>, id: u32, req: Spawn, stdin_rx: Receiver<Input>) {
    let mut cmd = Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .env_clear()
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&req.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // If cra-pod dies without its cleanup (SIGKILL), its direct children die too.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            lock(&state.procs).remove(&id);
            let why = Exit::Error(format!("spawn failed: {}: {e}", req.argv[0]));
            state.send(Kind::Exit, id, &why.to_json());
            return;
        }
    };
    let pgid = child.id() as i32;
    lock(&state.groups).push(pgid);
    if let Some(p) = lock(&state.procs).get_mut(&id) {
        p.pgid = pgid;
        if let Some(sig) = p.pending_signal.take() {
            signal_process(pgid, sig);
        }
    }
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        // Piped above: cannot happen; end it rather than leave the engine waiting.
        killpg(pgid, libc::SIGKILL);
        let _ = child.wait();
        lock(&state.procs).remove(&id);
        state.send(
            Kind::Exit,
            id,
            &Exit::Error("spawn failed: no pipes".into()).to_json(),
        );
        return;
    };
    thread::spawn(move || write_input(stdin, stdin_rx));
    let out = pump(state.clone(), stdout, Kind::Stdout, id);
    let err = pump(state.clone(), stderr, Kind::Stderr, id);
    let state = state.clone();
    thread::spawn(move || {
        let _ = out.join();
        let _ = err.join();
        let exit = match child.wait() {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => Exit::Code(c),
                (None, Some(sig)) => Exit::Signal(sig),
                (None, None) => Exit::Error("exit status unknown".into()),
            },
            Err(e) => Exit::Error(format!("wait failed: {e}")),
        };
        lock(&state.procs).remove(&id);
        state.send(Kind::Exit, id, &exit.to_json());
    });
}

/// Writes what arrives for a pipe or socket until `Eof` (or the sender is dropped); a write
/// error drops the rest (the reader is gone).
fn write_input<W: Write>(mut w: W, rx: Receiver<Input>) {
    let mut broken = false;
    for input in rx {
        match input {
            Input::Data(d) if !broken => broken = w.write_all(&d).is_err(),
            Input::Data(_) => {}
            Input::Eof => break,
        }
    }
}

/// Forwards what `r` yields as `kind` frames of `id` until EOF.
fn pump<R: Read + Send + 'static>(
    state: Arc<State>,
    mut r: R,
    kind: Kind,
    id: u32,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => state.send(kind, id, &buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })
}

fn listen(state: &Arc<State>, id: u32, path: String) {
    let fail = |why: String| {
        let f = Failure {
            error: format!("listen on {path} failed: {why}"),
        };
        state.send(Kind::Close, id, &f.to_json());
    };
    // A stale socket from an earlier run is replaced; anything else at the path is not ours.
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            if let Err(e) = std::fs::remove_file(&path) {
                return fail(format!("removing the stale socket: {e}"));
            }
        }
        Ok(_) => return fail("the path exists and is not a socket".into()),
        Err(_) => {}
    }
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => return fail(e.to_string()),
    };
    lock(&state.listeners).push(path);
    state.send(Kind::Ready, id, b"{}");
    let state = state.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let cid = state.next_conn.fetch_add(1, Ordering::Relaxed);
            if cid < pod_wire::POD_ID_BASE {
                // Ids wrapped after 2^31 connections: refuse rather than reuse.
                continue;
            }
            connect(&state, id, cid, stream);
        }
    });
}

fn connect(state: &Arc<State>, listener: u32, cid: u32, stream: UnixStream) {
    let (Ok(reader), Ok(writer), Ok(control)) =
        (stream.try_clone(), stream.try_clone(), stream.try_clone())
    else {
        return;
    };
    let (tx, rx) = channel();
    lock(&state.conns).insert(
        cid,
        Conn {
            to_socket: tx,
            stream: control,
        },
    );
    state.send(Kind::Open, cid, &Open { listener }.to_json());
    thread::spawn(move || {
        write_input(&writer, rx);
        // Eof from the engine (or Close): half-close towards the client.
        let _ = writer.shutdown(std::net::Shutdown::Write);
    });
    let state = state.clone();
    thread::spawn(move || {
        let mut r = &reader;
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf) {
                Ok(0) => {
                    if lock(&state.conns).contains_key(&cid) {
                        state.send(Kind::Eof, cid, b"");
                    }
                    return;
                }
                Ok(n) => state.send(Kind::Data, cid, &buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    if lock(&state.conns).remove(&cid).is_some() {
                        state.send(Kind::Close, cid, b"");
                    }
                    return;
                }
            }
        }
    });
}

fn killpg(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; a gone group yields ESRCH.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// A `Signal` for a process: its group gets it; SIGKILL also reaches whatever of its tree left
/// the group (a command in a session or group of its own), as the local backend's kill does.
/// Off the reader thread: the /proc walk takes a few milliseconds.
fn signal_process(pgid: i32, sig: i32) {
    if sig == libc::SIGKILL {
        thread::spawn(move || kill_tree(pgid, &[pgid]));
    } else {
        killpg(pgid, sig);
    }
}

/// SIGKILL the `groups`, every process of the sessions they lead and every descendant of
/// `root`, a few rounds, since a process may fork while it is killed. Never this process.
fn kill_tree(root: i32, groups: &[i32]) {
    for _ in 0..10 {
        // The /proc walk first, while every parent link is intact: a killed parent's children
        // are re-parented at once (to pid 1), out of reach of the walk.
        let found = tree(root, groups);
        for g in groups {
            killpg(*g, libc::SIGKILL);
        }
        if found.is_empty() {
            return;
        }
        for pid in found {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Live processes in one of `sessions` or descending from `root`, from /proc; never this
/// process.
fn tree(root: i32, sessions: &[i32]) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut table: Vec<(i32, i32, i32)> = Vec::new(); // (pid, ppid, sid)
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses: parse after the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 4 || f[0] == "Z" {
            continue;
        }
        let ppid = f[1].parse().unwrap_or(0);
        let sid = f[3].parse().unwrap_or(0);
        table.push((pid, ppid, sid));
    }
    let mut found: Vec<i32> = table
        .iter()
        .filter(|(pid, _, sid)| *pid != me && (sessions.contains(sid) || *pid == root))
        .map(|(pid, _, _)| *pid)
        .collect();
    let mut parents = vec![root];
    parents.extend(found.iter().copied());
    let mut i = 0;
    while i < parents.len() {
        let parent = parents[i];
        for (pid, ppid, _) in &table {
            if *ppid == parent && *pid != me && !parents.contains(pid) {
                parents.push(*pid);
                found.push(*pid);
            }
        }
        i += 1;
    }
    found
}
