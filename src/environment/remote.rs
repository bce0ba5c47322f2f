//! The engine's half of the `pod-wire` protocol: a [`RemoteShell`] runs processes and tunnels
//! unix-socket connections through the in-pod agent (`cra-pod mux`) over one byte stream (a
//! Kubernetes exec in production, a local `cra-pod mux` child in the protocol tests).
//!
//! Everything from the pod is untrusted: frames are size-checked by the decoder, a frame that
//! breaks the protocol (a bad header, bad JSON, a kind only the engine sends, an id from the
//! wrong range) ends the shell with an error, frames for ids the engine does not know are
//! ignored, and what the engine buffers for its consumers is bounded per channel and in
//! total. One task reads the stream and only ever queues what it decodes (each channel has its
//! own queue, drained by its own consumer), so a slow consumer never stalls the others; one
//! task writes the stream. When the stream breaks every pending [`Exec`] ends: its output
//! reaches EOF and its `wait` gives `None`.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{ExitStatus, Output};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use pod_wire::{Decoder, Exit, Failure, Frame, Hello, Kind, Listen, Open, SignalRequest, Spawn};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::{CancellationToken, PollSender};

use super::{Exec, ExecControl};
use crate::error::{AdapterError, ErrorCode, Result};

/// How long the pod agent has to say `Ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a control frame may wait for room in the outgoing queue, and the pod for a
/// `Listen` to be answered.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `kill_all` waits for the killed process's `Exit`, and `shutdown` for the pod
/// agent to end the stream after `Bye`.
const END_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a tunnelled connection may take to connect to its engine-side socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes per `Data` frame the engine sends.
const CHUNK: usize = 64 * 1024;
/// Frames waiting for the stream writer.
const OUT_QUEUE: usize = 64;
/// Bytes one channel may hold unread before it fails (output) or is closed (connection).
const MAX_QUEUED_PER_CHANNEL: usize = 16 << 20;
/// Bytes all channels together may hold unread.
const MAX_QUEUED_TOTAL: usize = 64 << 20;
/// Tunnelled connections open at once; more are refused (`Close`).
const MAX_CONNECTIONS: usize = 256;

fn error(message: impl Into<String>) -> AdapterError {
    AdapterError::new(ErrorCode::Provision, message)
}

/// A process to start in the pod: the whole environment (the pod agent adds nothing).
#[derive(Debug, Clone)]
pub struct RemoteCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
}

/// The protocol's engine half over one transport.
pub struct RemoteShell {
    inner: Arc<Inner>,
}

struct Inner {
    out: mpsc::Sender<Vec<u8>>,
    rt: tokio::runtime::Handle,
    tables: Mutex<Tables>,
    next_id: AtomicU32,
    /// All channels' unread bytes.
    queued: Arc<AtomicUsize>,
    /// Cancelled when the shell ends (stream broken, protocol error, shut down, dropped).
    ended: CancellationToken,
    /// Why it ended, set once, before `ended` is cancelled.
    why: Mutex<Option<String>>,
    bye_sent: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Tables {
    procs: HashMap<u32, ProcEntry>,
    listeners: HashMap<u32, ListenerEntry>,
    conns: HashMap<u32, ConnEntry>,
}

struct ProcEntry {
    stdout: Option<Inbound>,
    stderr: Option<Inbound>,
    exit: watch::Sender<Option<Ended>>,
}

struct ListenerEntry {
    engine_socket: PathBuf,
    ready: Option<oneshot::Sender<std::result::Result<(), String>>>,
}

struct ConnEntry {
    /// Pod→engine bytes; `None` after the pod's `Eof`.
    inbound: Option<Inbound>,
    task: Option<tokio::task::AbortHandle>,
}

#[derive(Debug, Clone)]
enum Ended {
    Status(ExitStatus),
    SpawnFailed(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a channel's reader gets: bytes, or why the channel failed.
type Chunk = std::result::Result<Vec<u8>, String>;

/// The demux's end of one channel's queue.
struct Inbound {
    tx: mpsc::UnboundedSender<Chunk>,
    queued: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl Inbound {
    fn pair(total: &Arc<AtomicUsize>) -> (Inbound, ChannelReader) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        (
            Inbound {
                tx,
                queued: queued.clone(),
                total: total.clone(),
            },
            ChannelReader {
                rx,
                current: Vec::new(),
                pos: 0,
                queued,
                total: total.clone(),
            },
        )
    }

    /// Queues `bytes`; false (and the reader gets an error) when that would go over a bound.
    fn push(&self, bytes: Vec<u8>, what: &str) -> bool {
        let n = bytes.len();
        let mine = self.queued.load(Ordering::Relaxed);
        let all = self.total.load(Ordering::Relaxed);
        if mine + n > MAX_QUEUED_PER_CHANNEL || all + n > MAX_QUEUED_TOTAL {
            let _ = self.tx.send(Err(format!(
                "more than {} MiB of {what} left unread",
                if mine + n > MAX_QUEUED_PER_CHANNEL {
                    MAX_QUEUED_PER_CHANNEL >> 20
                } else {
                    MAX_QUEUED_TOTAL >> 20
                }
            )));
            return false;
        }
        self.queued.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
        if self.tx.send(Ok(bytes)).is_err() {
            // The reader is gone: nothing will drain it.
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.total.fetch_sub(n, Ordering::Relaxed);
        }
        true
    }
}

/// A channel's bytes as an [`AsyncRead`]: EOF when the channel ends (or the shell does).
struct ChannelReader {
    rx: mpsc::UnboundedReceiver<Chunk>,
    current: Vec<u8>,
    pos: usize,
    queued: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.pos == this.current.len() {
            match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(why))) => return Poll::Ready(Err(io::Error::other(why))),
                Poll::Ready(Some(Ok(bytes))) => {
                    this.current = bytes;
                    this.pos = 0;
                }
            }
        }
        let n = buf.remaining().min(this.current.len() - this.pos);
        buf.put_slice(&this.current[this.pos..this.pos + n]);
        this.pos += n;
        this.queued.fetch_sub(n, Ordering::Relaxed);
        this.total.fetch_sub(n, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

impl Drop for ChannelReader {
    fn drop(&mut self) {
        // Unread bytes no longer count against the shell's budget.
        self.rx.close();
        let mut left = self.current.len() - self.pos;
        while let Ok(chunk) = self.rx.try_recv() {
            if let Ok(b) = chunk {
                left += b.len();
            }
        }
        self.queued.fetch_sub(left, Ordering::Relaxed);
        self.total.fetch_sub(left, Ordering::Relaxed);
    }
}

/// A process's stdin as an [`AsyncWrite`]: `Data` frames, `Eof` on shutdown or drop.
struct ChannelWriter {
    id: u32,
    out: PollSender<Vec<u8>>,
    inner: Arc<Inner>,
    eof_sent: bool,
}

fn broken_pipe() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the pod's stream has ended")
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.eof_sent {
            return Poll::Ready(Err(broken_pipe()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        match self.out.poll_reserve(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(broken_pipe())),
            Poll::Ready(Ok(())) => {
                let n = buf.len().min(CHUNK);
                let frame =
                    pod_wire::encode(Kind::Data, self.id, &buf[..n]).map_err(io::Error::other)?;
                self.out.send_item(frame).map_err(|_| broken_pipe())?;
                Poll::Ready(Ok(n))
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.eof_sent {
            return Poll::Ready(Ok(()));
        }
        match self.out.poll_reserve(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(broken_pipe())),
            Poll::Ready(Ok(())) => {
                let frame = frame_bytes(Kind::Eof, self.id, b"");
                self.out.send_item(frame).map_err(|_| broken_pipe())?;
                self.eof_sent = true;
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl Drop for ChannelWriter {
    fn drop(&mut self) {
        // As dropping a pipe's write end: the process sees EOF.
        if !self.eof_sent {
            self.out.abort_send();
            self.inner.send_detached(Kind::Eof, self.id, b"");
        }
    }
}

/// A frame whose payload is known to fit (empty, or small JSON the engine builds itself).
fn frame_bytes(kind: Kind, id: u32, payload: &[u8]) -> Vec<u8> {
    pod_wire::encode(kind, id, payload).unwrap_or_default()
}

impl Inner {
    /// Queues a frame without waiting (from sync code and from the demux, which must never
    /// wait on the writer): when the queue is full, a task sends it.
    fn send_detached(&self, kind: Kind, id: u32, payload: &[u8]) {
        let frame = frame_bytes(kind, id, payload);
        match self.out.try_send(frame) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(frame)) => {
                let out = self.out.clone();
                self.rt.spawn(async move {
                    let _ = out.send(frame).await;
                });
            }
        }
    }

    /// Queues a frame, waiting (bounded) for room.
    async fn send(&self, kind: Kind, id: u32, payload: &[u8]) -> Result<()> {
        let frame = pod_wire::encode(kind, id, payload)
            .map_err(|e| error(format!("cannot send to the pod: {e}")))?;
        tokio::select! {
            r = tokio::time::timeout(CONTROL_TIMEOUT, self.out.send(frame)) => match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(self.ended_error()),
                Err(_) => Err(error(format!(
                    "the stream to the pod accepted nothing for {}s", CONTROL_TIMEOUT.as_secs()
                ))),
            },
            _ = self.ended.cancelled() => Err(self.ended_error()),
        }
    }

    fn new_id(&self) -> Result<u32> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if id >= pod_wire::POD_ID_BASE {
            return Err(error("the shell has used up its 2^31 ids"));
        }
        Ok(id)
    }

    fn ended_error(&self) -> AdapterError {
        let why = lock(&self.why).clone();
        error(format!(
            "the pod's stream has ended: {}",
            why.as_deref().unwrap_or("shut down")
        ))
    }

    /// Ends the shell once: records why, then drops every channel (outputs reach EOF, waits
    /// give `None`, tunnels close).
    fn end(&self, why: String) {
        {
            let mut w = lock(&self.why);
            if w.is_none() {
                *w = Some(why);
            }
        }
        self.ended.cancel();
        let tables = std::mem::take(&mut *lock(&self.tables));
        for (_, c) in tables.conns {
            if let Some(t) = c.task {
                t.abort();
            }
        }
        drop(tables.procs);
        drop(tables.listeners);
    }

    /// Removes a connection, ending its tunnel; `tell_pod`: send `Close`.
    fn close_conn(&self, cid: u32, tell_pod: bool) {
        let entry = lock(&self.tables).conns.remove(&cid);
        if let Some(c) = entry {
            if let Some(t) = c.task {
                t.abort();
            }
            if tell_pod {
                self.send_detached(Kind::Close, cid, b"");
            }
        }
    }

    /// One frame from the pod. `Err`: the stream broke the protocol.
    fn handle(self: &Arc<Self>, frame: Frame) -> std::result::Result<(), String> {
        let id = frame.id;
        let from_pod = id >= pod_wire::POD_ID_BASE;
        match frame.kind {
            Kind::Stdout | Kind::Stderr => {
                let mut t = lock(&self.tables);
                if let Some(p) = t.procs.get_mut(&id) {
                    let (slot, what) = if frame.kind == Kind::Stdout {
                        (&mut p.stdout, "stdout")
                    } else {
                        (&mut p.stderr, "stderr")
                    };
                    if let Some(inbound) = slot {
                        if !inbound.push(frame.payload, what) {
                            *slot = None;
                        }
                    }
                }
            }
            Kind::Exit => {
                let exit = Exit::from_json(&frame.payload).map_err(|e| e.to_string())?;
                let entry = lock(&self.tables).procs.remove(&id);
                if let Some(p) = entry {
                    let ended = match exit {
                        Exit::Code(c) => Ended::Status(exit_status_from_code(c)),
                        Exit::Signal(s) => Ended::Status(exit_status_from_signal(s)),
                        Exit::Error(m) => Ended::SpawnFailed(m),
                    };
                    let _ = p.exit.send(Some(ended));
                }
            }
            Kind::Ready => {
                // Only a listener's; the hello was taken by `start`.
                let waiter = lock(&self.tables)
                    .listeners
                    .get_mut(&id)
                    .and_then(|l| l.ready.take());
                if let Some(w) = waiter {
                    let _ = w.send(Ok(()));
                }
            }
            Kind::Open => {
                if !from_pod {
                    return Err(format!("an Open for engine id {id}"));
                }
                let open = Open::from_json(&frame.payload).map_err(|e| e.to_string())?;
                self.open(id, open.listener)?;
            }
            Kind::Data | Kind::Eof => {
                if !from_pod {
                    return Err(format!("a {:?} frame for engine id {id}", frame.kind));
                }
                let mut t = lock(&self.tables);
                let Some(c) = t.conns.get_mut(&id) else {
                    return Ok(());
                };
                if frame.kind == Kind::Eof {
                    c.inbound = None;
                } else if let Some(inbound) = &c.inbound {
                    if !inbound.push(frame.payload, "a tunnelled connection") {
                        drop(t);
                        self.close_conn(id, true);
                    }
                }
            }
            Kind::Close => {
                if from_pod {
                    self.close_conn(id, false);
                } else {
                    // A listener the pod could not bind (or lost).
                    let entry = lock(&self.tables).listeners.remove(&id);
                    if let Some(l) = entry {
                        if let Some(w) = l.ready {
                            let why = Failure::from_json(&frame.payload)
                                .map(|f| f.error)
                                .unwrap_or_else(|_| "the pod closed the listener".into());
                            let _ = w.send(Err(why));
                        }
                    }
                }
            }
            Kind::Spawn | Kind::Signal | Kind::Listen | Kind::Bye => {
                return Err(format!("a {:?} frame from the pod", frame.kind));
            }
        }
        Ok(())
    }

    /// A connection the pod accepted: tunnel it to the listener's engine socket.
    fn open(self: &Arc<Self>, cid: u32, listener: u32) -> std::result::Result<(), String> {
        let mut t = lock(&self.tables);
        if t.conns.contains_key(&cid) {
            return Err(format!("connection id {cid} opened twice"));
        }
        let socket = t.listeners.get(&listener).map(|l| l.engine_socket.clone());
        let Some(socket) = socket.filter(|_| t.conns.len() < MAX_CONNECTIONS) else {
            drop(t);
            self.send_detached(Kind::Close, cid, b"");
            return Ok(());
        };
        let (inbound, reader) = Inbound::pair(&self.queued);
        t.conns.insert(
            cid,
            ConnEntry {
                inbound: Some(inbound),
                task: None,
            },
        );
        let task = self.rt.spawn(tunnel(self.clone(), cid, socket, reader));
        if let Some(c) = t.conns.get_mut(&cid) {
            c.task = Some(task.abort_handle());
        }
        Ok(())
    }
}

fn exit_status_from_code(code: i32) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw((code & 0xff) << 8)
}

fn exit_status_from_signal(sig: i32) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    ExitStatus::from_raw(sig & 0x7f)
}

/// One tunnelled connection: pod bytes to a fresh connection to `socket` and back, with
/// half-close both ways.
async fn tunnel(inner: Arc<Inner>, cid: u32, socket: PathBuf, mut from_pod: ChannelReader) {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&socket)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(socket = %socket.display(), "tunnel: connect failed: {e}");
            return inner.close_conn(cid, true);
        }
        Err(_) => {
            tracing::warn!(socket = %socket.display(), "tunnel: connect timed out");
            return inner.close_conn(cid, true);
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let to_engine = async {
        tokio::io::copy(&mut from_pod, &mut wr).await?;
        wr.shutdown().await
    };
    let to_pod = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = rd.read(&mut buf).await?;
            if n == 0 {
                return inner
                    .send(Kind::Eof, cid, b"")
                    .await
                    .map_err(io::Error::other);
            }
            inner
                .send(Kind::Data, cid, &buf[..n])
                .await
                .map_err(io::Error::other)?;
        }
    };
    match tokio::try_join!(to_engine, to_pod) {
        // Both halves closed cleanly: nothing left to say.
        Ok(_) => {
            lock(&inner.tables).conns.remove(&cid);
        }
        Err(_) => inner.close_conn(cid, true),
    }
}

/// Reads the stream until it ends or breaks the protocol; hands the hello to `start`.
async fn demux<R: AsyncRead + Unpin>(
    inner: Arc<Inner>,
    mut reader: R,
    hello: oneshot::Sender<std::result::Result<Hello, String>>,
) {
    let mut hello = Some(hello);
    let mut decoder = Decoder::new();
    let mut buf = vec![0u8; CHUNK];
    let why = 'read: loop {
        let n = tokio::select! {
            r = reader.read(&mut buf) => match r {
                Ok(0) if inner.bye_sent.load(Ordering::Relaxed) => break 'read "shut down".to_string(),
                Ok(0) => break 'read "the pod agent's stream ended".to_string(),
                Ok(n) => n,
                Err(e) => break 'read format!("reading the pod agent's stream: {e}"),
            },
            _ = inner.ended.cancelled() => break 'read "shut down".to_string(),
        };
        decoder.feed(&buf[..n]);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => break 'read format!("protocol error from the pod: {e}"),
            };
            if let Some(h) = hello.take() {
                let first = if frame.kind == Kind::Ready && frame.id == 0 {
                    Hello::from_json(&frame.payload).map_err(|e| e.to_string())
                } else {
                    Err(format!("the first frame is {:?}, not Ready", frame.kind))
                };
                let bad = first.is_err();
                let _ = h.send(first);
                if bad {
                    break 'read "no hello from the pod agent".to_string();
                }
                continue;
            }
            if let Err(e) = inner.handle(frame) {
                break 'read format!("protocol error from the pod: {e}");
            }
        }
    };
    if let Some(h) = hello.take() {
        let _ = h.send(Err(why.clone()));
    }
    inner.end(why);
}

/// Writes queued frames to the stream until the shell ends.
async fn write_frames<W: AsyncWrite + Unpin>(
    inner: Arc<Inner>,
    mut writer: W,
    mut rx: mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let frame = tokio::select! {
            f = rx.recv() => f,
            _ = inner.ended.cancelled() => None,
        };
        let Some(frame) = frame else { break };
        let written = tokio::select! {
            r = async {
                writer.write_all(&frame).await?;
                writer.flush().await
            } => r,
            _ = inner.ended.cancelled() => break,
        };
        if let Err(e) = written {
            inner.end(format!("writing to the pod agent's stream: {e}"));
            break;
        }
    }
}

impl RemoteShell {
    /// Starts the engine half on a transport whose other end runs `cra-pod mux`; returns once
    /// the pod agent said `Ready` (bounded).
    pub async fn start<R, W>(reader: R, writer: W) -> Result<RemoteShell>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, rx) = mpsc::channel(OUT_QUEUE);
        let inner = Arc::new(Inner {
            out,
            rt: tokio::runtime::Handle::current(),
            tables: Mutex::new(Tables::default()),
            next_id: AtomicU32::new(1),
            queued: Arc::new(AtomicUsize::new(0)),
            ended: CancellationToken::new(),
            why: Mutex::new(None),
            bye_sent: std::sync::atomic::AtomicBool::new(false),
        });
        let (hello_tx, hello_rx) = oneshot::channel();
        tokio::spawn(write_frames(inner.clone(), writer, rx));
        tokio::spawn(demux(inner.clone(), reader, hello_tx));
        let shell = RemoteShell { inner };
        let hello = match tokio::time::timeout(READY_TIMEOUT, hello_rx).await {
            Ok(Ok(Ok(h))) => h,
            Ok(Ok(Err(why))) => return Err(error(format!("the pod agent did not start: {why}"))),
            Ok(Err(_)) => return Err(shell.inner.ended_error()),
            Err(_) => {
                return Err(error(format!(
                    "the pod agent said nothing within {}s",
                    READY_TIMEOUT.as_secs()
                )))
            }
        };
        if hello.version != pod_wire::VERSION {
            return Err(error(format!(
                "the pod agent speaks protocol version {}, the adapter {}",
                hello.version,
                pod_wire::VERSION
            )));
        }
        Ok(shell)
    }

    /// Starts a process in the pod, in its own process group, with piped stdio. A process
    /// that cannot start shows as output EOF and `wait` → `None` ([`RemoteShell::run`] says
    /// why).
    pub async fn spawn(&self, cmd: RemoteCommand) -> Result<Exec> {
        let (control, stdout, stderr, stdin) = self.start_process(cmd).await?;
        Ok(Exec {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            control: Box::new(control),
        })
    }

    async fn start_process(
        &self,
        cmd: RemoteCommand,
    ) -> Result<(RemoteControl, ChannelReader, ChannelReader, ChannelWriter)> {
        let inner = &self.inner;
        if inner.ended.is_cancelled() {
            return Err(inner.ended_error());
        }
        if cmd.argv.is_empty() {
            return Err(error("a remote command needs a program"));
        }
        let id = inner.new_id()?;
        let (out_in, stdout) = Inbound::pair(&inner.queued);
        let (err_in, stderr) = Inbound::pair(&inner.queued);
        let (exit_tx, exit_rx) = watch::channel(None);
        lock(&inner.tables).procs.insert(
            id,
            ProcEntry {
                stdout: Some(out_in),
                stderr: Some(err_in),
                exit: exit_tx,
            },
        );
        let spawn = Spawn {
            argv: cmd.argv,
            env: cmd.env,
            cwd: cmd.cwd,
        };
        if let Err(e) = inner.send(Kind::Spawn, id, &spawn.to_json()).await {
            lock(&inner.tables).procs.remove(&id);
            return Err(e);
        }
        let stdin = ChannelWriter {
            id,
            out: PollSender::new(inner.out.clone()),
            inner: inner.clone(),
            eof_sent: false,
        };
        let control = RemoteControl {
            id,
            inner: inner.clone(),
            exit: exit_rx,
        };
        Ok((control, stdout, stderr, stdin))
    }

    /// Runs `cmd` to its end: `input` on its stdin, then EOF; stdout and stderr collected up to
    /// `max_output` bytes each (more is an error and the process is killed). Dropping the
    /// future kills the process.
    pub async fn run(&self, cmd: RemoteCommand, input: &[u8], max_output: usize) -> Result<Output> {
        let program = cmd.argv.first().cloned().unwrap_or_default();
        let (mut control, stdout, stderr, mut stdin) = self.start_process(cmd).await?;
        let guard = KillOnDrop(Some((control.id, self.inner.clone())));
        let feed = async {
            // A process that exits without reading its input is not an error here: its
            // status says what happened.
            let _ = stdin.write_all(input).await;
            let _ = stdin.shutdown().await;
        };
        let name = program.as_str();
        let collect = |r: ChannelReader, what: &'static str| async move {
            let mut buf = Vec::new();
            let n = r
                .take(max_output as u64 + 1)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| error(format!("{name}: reading its {what}: {e}")))?;
            if n > max_output {
                return Err(error(format!(
                    "{name}: more than {max_output} bytes on {what}"
                )));
            }
            Ok(buf)
        };
        // The first error ends the run at once (the guard kills the process): the other
        // stream may never end while the process runs.
        let ((), out, err) = tokio::try_join!(
            async {
                feed.await;
                Ok(())
            },
            collect(stdout, "stdout"),
            collect(stderr, "stderr")
        )?;
        let status = match control.ended().await {
            Some(Ended::Status(s)) => s,
            Some(Ended::SpawnFailed(why)) => return Err(error(why)),
            None => {
                return Err(error(format!(
                    "{program}: {}",
                    self.inner.ended_error().message
                )))
            }
        };
        drop(guard.disarm());
        Ok(Output {
            status,
            stdout: out,
            stderr: err,
        })
    }

    /// Makes the pod agent listen on `pod_path` (a stale socket there is replaced); each
    /// connection accepted there is tunnelled to a fresh connection to `engine_socket`.
    /// Returns once the pod listens (bounded).
    pub async fn listen(&self, pod_path: &str, engine_socket: PathBuf) -> Result<()> {
        let inner = &self.inner;
        let id = inner.new_id()?;
        let (tx, rx) = oneshot::channel();
        lock(&inner.tables).listeners.insert(
            id,
            ListenerEntry {
                engine_socket,
                ready: Some(tx),
            },
        );
        let request = Listen {
            path: pod_path.to_string(),
        };
        inner.send(Kind::Listen, id, &request.to_json()).await?;
        match tokio::time::timeout(CONTROL_TIMEOUT, rx).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(why))) => Err(error(why)),
            Ok(Err(_)) => Err(inner.ended_error()),
            Err(_) => {
                lock(&inner.tables).listeners.remove(&id);
                Err(error(format!(
                    "the pod agent did not answer a listen on {pod_path} within {}s",
                    CONTROL_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Resolves once the shell has ended (the stream broke, the pod went away, a protocol
    /// error, or `shutdown`), with why.
    pub async fn closed(&self) -> AdapterError {
        self.inner.ended.cancelled().await;
        self.inner.ended_error()
    }

    /// Says `Bye` (the pod agent kills everything it started and exits) and waits, bounded,
    /// for the stream to end.
    pub async fn shutdown(self) -> Result<()> {
        let inner = self.inner.clone();
        if inner.ended.is_cancelled() {
            return Err(inner.ended_error());
        }
        inner.bye_sent.store(true, Ordering::Relaxed);
        inner.send(Kind::Bye, 0, b"").await?;
        let ended = tokio::time::timeout(END_TIMEOUT, inner.ended.cancelled()).await;
        let result = match ended {
            Ok(()) => match lock(&inner.why).as_deref() {
                Some("shut down") | None => Ok(()),
                Some(other) => Err(error(format!("the pod's stream has ended: {other}"))),
            },
            Err(_) => Err(error(format!(
                "the pod agent did not end the stream within {}s of Bye",
                END_TIMEOUT.as_secs()
            ))),
        };
        inner.end("shut down".into());
        result
    }
}

impl Drop for RemoteShell {
    fn drop(&mut self) {
        // The tasks end and drop the transport: the pod agent sees its stream end, which it
        // treats as Bye.
        self.inner.end("shut down".into());
    }
}

/// SIGKILLs a process's group when dropped while armed.
struct KillOnDrop(Option<(u32, Arc<Inner>)>);

impl KillOnDrop {
    fn disarm(mut self) -> Self {
        self.0 = None;
        self
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some((id, inner)) = self.0.take() {
            inner.send_detached(Kind::Signal, id, &SignalRequest { signal: 9 }.to_json());
        }
    }
}

struct RemoteControl {
    id: u32,
    inner: Arc<Inner>,
    exit: watch::Receiver<Option<Ended>>,
}

impl RemoteControl {
    fn signal(&self, signal: i32) {
        self.inner
            .send_detached(Kind::Signal, self.id, &SignalRequest { signal }.to_json());
    }

    /// How it ended; `None` when the shell ended first.
    async fn ended(&mut self) -> Option<Ended> {
        match self.exit.wait_for(|e| e.is_some()).await {
            Ok(e) => e.clone(),
            Err(_) => None,
        }
    }
}

impl ExecControl for RemoteControl {
    fn pid(&self) -> Option<u32> {
        None
    }

    fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    fn kill_all(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.signal(libc::SIGKILL);
            let _ = tokio::time::timeout(END_TIMEOUT, self.ended()).await;
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Option<ExitStatus>> {
        Box::pin(async move {
            match self.ended().await {
                Some(Ended::Status(s)) => Some(s),
                _ => None,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    //! The engine half against a scripted pod that breaks the rules (the well-behaved pod is
    //! the real `cra-pod`, in `tests/remote.rs`).

    use super::*;
    use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

    struct FakePod {
        rd: ReadHalf<DuplexStream>,
        wr: WriteHalf<DuplexStream>,
        decoder: Decoder,
    }

    impl FakePod {
        async fn send(&mut self, kind: Kind, id: u32, payload: &[u8]) {
            let bytes = pod_wire::encode(kind, id, payload).unwrap();
            self.wr.write_all(&bytes).await.unwrap();
        }

        async fn next(&mut self) -> Frame {
            let mut buf = vec![0u8; 4096];
            loop {
                if let Some(f) = self.decoder.next_frame().unwrap() {
                    return f;
                }
                let n = self.rd.read(&mut buf).await.unwrap();
                assert!(n > 0, "the engine closed the stream");
                self.decoder.feed(&buf[..n]);
            }
        }
    }

    async fn shell() -> (RemoteShell, FakePod) {
        let (engine, pod) = tokio::io::duplex(1 << 20);
        let (rd, wr) = tokio::io::split(pod);
        let mut pod = FakePod {
            rd,
            wr,
            decoder: Decoder::new(),
        };
        pod.send(Kind::Ready, 0, &Hello { version: 1 }.to_json())
            .await;
        let (er, ew) = tokio::io::split(engine);
        let shell = RemoteShell::start(er, ew).await.unwrap();
        (shell, pod)
    }

    fn cmd() -> RemoteCommand {
        RemoteCommand {
            argv: vec!["x".into()],
            env: Vec::new(),
            cwd: "/".into(),
        }
    }

    async fn bounded<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("settles within the bound")
    }

    #[tokio::test]
    async fn a_first_frame_that_is_not_ready_fails_the_start() {
        let (engine, pod) = tokio::io::duplex(4096);
        let (_prd, mut pwr) = tokio::io::split(pod);
        pwr.write_all(&pod_wire::encode(Kind::Stdout, 1, b"hi").unwrap())
            .await
            .unwrap();
        let (er, ew) = tokio::io::split(engine);
        let err = bounded(RemoteShell::start(er, ew)).await.err().unwrap();
        assert!(err.message.contains("not Ready"), "{}", err.message);

        let (engine, pod) = tokio::io::duplex(4096);
        let (_prd, mut pwr) = tokio::io::split(pod);
        pwr.write_all(&pod_wire::encode(Kind::Ready, 0, b"{\"version\":2}").unwrap())
            .await
            .unwrap();
        let (er, ew) = tokio::io::split(engine);
        let err = bounded(RemoteShell::start(er, ew)).await.err().unwrap();
        assert!(err.message.contains("version 2"), "{}", err.message);
    }

    #[tokio::test]
    async fn an_oversize_frame_ends_the_shell_and_every_pending_exec() {
        let (shell, mut pod) = shell().await;
        let mut exec = bounded(shell.spawn(cmd())).await.unwrap();
        assert_eq!(pod.next().await.kind, Kind::Spawn);
        let mut header = vec![Kind::Stdout as u8, 0, 0, 0, 1];
        header.extend(((pod_wire::MAX_PAYLOAD + 1) as u32).to_be_bytes());
        pod.wr.write_all(&header).await.unwrap();
        let why = bounded(shell.closed()).await;
        assert!(why.message.contains("protocol error"), "{}", why.message);
        let mut out = Vec::new();
        bounded(exec.stdout.read_to_end(&mut out)).await.unwrap();
        assert_eq!(bounded(exec.control.wait()).await, None);
    }

    #[tokio::test]
    async fn frames_only_the_engine_sends_or_bad_exits_are_protocol_errors() {
        for (kind, id, payload) in [
            (Kind::Spawn, 1, cmd_json()),
            (Kind::Data, 1, b"x".to_vec()),
            (Kind::Open, 5, b"{\"listener\":1}".to_vec()),
            (Kind::Exit, 1, b"{\"nothing\":1}".to_vec()),
        ] {
            let (shell, mut pod) = shell().await;
            let _exec = bounded(shell.spawn(cmd())).await.unwrap();
            pod.send(kind, id, &payload).await;
            let why = bounded(shell.closed()).await;
            assert!(
                why.message.contains("protocol error"),
                "{kind:?}: {}",
                why.message
            );
        }
    }

    fn cmd_json() -> Vec<u8> {
        Spawn {
            argv: vec!["x".into()],
            env: Vec::new(),
            cwd: "/".into(),
        }
        .to_json()
    }

    #[tokio::test]
    async fn unknown_ids_are_ignored_and_an_unknown_listener_gets_close() {
        let (shell, mut pod) = shell().await;
        pod.send(Kind::Stdout, 77, b"nobody").await;
        pod.send(Kind::Exit, 78, &Exit::Code(0).to_json()).await;
        pod.send(Kind::Data, pod_wire::POD_ID_BASE + 9, b"nobody")
            .await;
        pod.send(
            Kind::Open,
            pod_wire::POD_ID_BASE + 1,
            &Open { listener: 42 }.to_json(),
        )
        .await;
        let f = bounded(pod.next()).await;
        assert_eq!((f.kind, f.id), (Kind::Close, pod_wire::POD_ID_BASE + 1));
        // Still working.
        let out = tokio::spawn(async move { shell.run(cmd(), b"", 10).await });
        assert_eq!(bounded(pod.next()).await.kind, Kind::Spawn);
        assert_eq!(bounded(pod.next()).await.kind, Kind::Eof);
        pod.send(Kind::Stdout, 1, b"ok").await;
        pod.send(Kind::Exit, 1, &Exit::Code(4).to_json()).await;
        let out = bounded(out).await.unwrap().unwrap();
        assert_eq!((out.stdout, out.status.code()), (b"ok".to_vec(), Some(4)));
    }

    #[tokio::test]
    async fn an_unread_channel_neither_stalls_the_others_nor_grows_without_bound() {
        let (shell, mut pod) = shell().await;
        let mut slow = bounded(shell.spawn(cmd())).await.unwrap();
        let mut fast = bounded(shell.spawn(cmd())).await.unwrap();
        let chunk = vec![7u8; 1 << 20];
        // 17 MiB nobody reads on one channel...
        for _ in 0..17 {
            pod.send(Kind::Stdout, 1, &chunk).await;
        }
        // ...and the other channel's bytes still arrive.
        pod.send(Kind::Stdout, 2, b"here").await;
        let mut got = [0u8; 4];
        bounded(fast.stdout.read_exact(&mut got)).await.unwrap();
        assert_eq!(&got, b"here");
        // The unread channel failed past its bound rather than buffer on.
        let mut all = Vec::new();
        let err = bounded(slow.stdout.read_to_end(&mut all))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("MiB of stdout left unread"),
            "{err}"
        );
        assert_eq!(all.len(), MAX_QUEUED_PER_CHANNEL);
    }
}
