//! One CLI process driven through a session: spawn, `initialize`, the prompt, then the control
//! loop (assistant text out, hook callbacks answered, the result) and a stop that leaves no
//! process behind. Stopping — cancel, timeout, shutdown, or the normal end — is one procedure:
//! an `interrupt` request, a short grace for a `result`, SIGTERM to the CLI, then SIGKILL to
//! every process of the session still alive.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::protocol::{self, Inbound, ReadTarget, ResultMessage};
use crate::deps::{BashHook, HookDecision};
use crate::environment::{Exec, ExecControl};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::sandbox::{ReadGuard, WriteScope};
use crate::stats::RunStats;

/// How long the CLI gets to answer `interrupt` with a `result` before SIGTERM.
const INTERRUPT_GRACE: Duration = Duration::from_millis(250);
/// How long the CLI gets to exit after SIGTERM (it exits in ~150 ms) before SIGKILL.
const TERM_GRACE: Duration = Duration::from_millis(200);
/// After a normal `result`, how long the CLI gets to exit once stdin is closed.
const EXIT_GRACE: Duration = Duration::from_secs(3);
/// Spawn → `initialize` answered. The real CLI takes ~0.3 s; this bounds a CLI that hangs.
const INIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of stderr kept for error messages.
const STDERR_TAIL: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    Timeout,
    /// The session's model spend passed its budget.
    Budget,
    /// The session passed a limit it was writing past as it ran (its disk bound, the host's
    /// disk floor): stopped at once, not after the interrupt's grace.
    Limit,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Cancelled => "cancelled",
            StopReason::Timeout => "timeout",
            StopReason::Budget => "budget",
            StopReason::Limit => "limit",
        }
    }
}

/// Asks a session to stop; the first reason given wins.
#[derive(Clone, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    /// The stop came from the adapter's `shutdown()` (a deploy, a restart) before any other.
    shutdown: Arc<std::sync::atomic::AtomicBool>,
}

impl StopSignal {
    pub fn stop(&self, reason: StopReason) {
        self.stop_as(reason, false);
    }

    /// The stop of `shutdown()`: `Cancelled`, remembered as the shutdown's when it is the first.
    pub fn stop_for_shutdown(&self) {
        self.stop_as(StopReason::Cancelled, true);
    }

    fn stop_as(&self, reason: StopReason, shutdown: bool) {
        {
            let mut r = self.reason.lock().unwrap_or_else(|e| e.into_inner());
            if r.is_none() {
                *r = Some(reason);
                self.shutdown
                    .store(shutdown, std::sync::atomic::Ordering::SeqCst);
            }
        }
        self.token.cancel();
    }

    /// Whether the session was stopped by `shutdown()` (before anything else stopped it).
    pub fn by_shutdown(&self) -> bool {
        self.shutdown.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub async fn stopped(&self) {
        self.token.cancelled().await
    }
}

/// What a session reports as it runs (for the output stream, the transcript and the logger).
pub enum SessionEvent<'a> {
    Init(&'a Value),
    Text(&'a str),
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
    /// What a tool call returned to the model (its output, or its error).
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    Hook {
        tool_name: &'a str,
        /// The call's id (the model's `tool_use` block), as the hook's input names it.
        tool_use_id: &'a str,
        input: &'a Value,
        decision: &'a HookDecision,
        failure: Option<&'a str>,
    },
    /// The adapter's own answer to a file tool call (Write, Edit, … or Read, Glob, Grep):
    /// `path` is what the call named (for a search, the tree it names or `.`; `None` when it
    /// named nothing readable).
    FileAccess {
        access: Access,
        tool_name: &'a str,
        tool_use_id: &'a str,
        path: Option<&'a str>,
        decision: &'a HookDecision,
    },
    Result(&'a ResultMessage),
    /// A follow-up user turn sent after a `result` (e.g. listing output violations).
    FollowUp(&'a str),
    UnreadableLine {
        error: &'a str,
        bytes: usize,
    },
    Stopping(StopReason),
}

/// Which guard answered a file tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

pub trait SessionObserver: Send + Sync + 'static {
    fn on_event(&self, event: SessionEvent<'_>);
}

#[derive(Clone)]
pub struct SessionSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub role: String,
    pub agent: Value,
    pub schema: Value,
    pub prompt: String,
    /// A validator that has not answered by then blocks the command (fail closed).
    pub hook_timeout: Duration,
    /// Where the CLI's file tools may write (relative paths are taken against `cwd`).
    pub write_scope: WriteScope,
    /// What the CLI's read tools may not read.
    pub read_guard: ReadGuard,
}

/// How a session ended.
pub struct SessionEnd {
    pub result: Option<ResultMessage>,
    pub exit: Option<ExitStatus>,
    pub stderr_tail: String,
    pub stopped: Option<StopReason>,
    pub pid: u32,
    /// Turns, cost, tokens and model over every turn of the session.
    pub stats: RunStats,
    /// How many follow-up user turns were sent after a `result`.
    pub follow_ups: u32,
    /// The structured output the last follow-up turn asked the agent to correct: what stands
    /// when the agent ends that turn without a new one.
    pub sent_back: Option<Value>,
}

/// What reading the CLI's output has gathered so far.
#[derive(Default)]
struct Turn {
    /// The latest `result` (cleared when a follow-up turn is sent).
    result: Option<ResultMessage>,
    /// (reason, deadline of the current step, SIGTERM sent) once a stop was asked for.
    stopping: Option<(StopReason, Instant, bool)>,
    initialized: bool,
    stats: RunStats,
}

pub struct RunningSession {
    control: Box<dyn ExecControl>,
    pid: u32,
    reader: BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    writer: Option<mpsc::UnboundedSender<Value>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Taken when awaited: a finished JoinHandle must not be polled again.
    stderr_done: Option<tokio::task::JoinHandle<()>>,
    hook: Arc<dyn BashHook>,
    observer: Arc<dyn SessionObserver>,
    stop: StopSignal,
    hook_timeout: Duration,
    write_scope: WriteScope,
    read_guard: ReadGuard,
    cwd: PathBuf,
    pending: Vec<Vec<u8>>,
    next_request: u64,
}

fn tail_text(buf: &Mutex<VecDeque<u8>>) -> String {
    let b = buf.lock().unwrap_or_else(|e| e.into_inner());
    let bytes: Vec<u8> = b.iter().copied().collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// Drive the CLI started as `exec` (see [`crate::environment::Environment::exec`]): initialize
/// it and hand it the prompt. Resolves once the CLI has answered `initialize` and the prompt is
/// written; the agent then runs under [`RunningSession::run`]. On any failure the process (and
/// anything it started) is killed before returning.
pub async fn start(
    exec: Exec,
    spec: SessionSpec,
    hook: Arc<dyn BashHook>,
    observer: Arc<dyn SessionObserver>,
    stop: StopSignal,
) -> Result<RunningSession> {
    let Exec {
        stdin,
        stdout,
        stderr,
        control,
    } = exec;
    let pid = control.pid().unwrap_or(0);

    let (tx, mut rx) = mpsc::unbounded_channel::<Value>();
    // The writer owns stdin; when every sender is dropped it closes stdin, which is how the
    // CLI learns the conversation is over.
    tokio::spawn(async move {
        let mut stdin = stdin;
        while let Some(msg) = rx.recv().await {
            let mut line = msg.to_string().into_bytes();
            line.push(b'\n');
            if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let tail_w = tail.clone();
    let stderr_done = tokio::spawn(async move {
        let mut stderr = stderr;
        let mut chunk = vec![0u8; 8192];
        while let Ok(n) = stderr.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            let mut t = tail_w.lock().unwrap_or_else(|e| e.into_inner());
            t.extend(&chunk[..n]);
            while t.len() > STDERR_TAIL {
                t.pop_front();
            }
        }
    });

    let mut session = RunningSession {
        control,
        pid,
        reader: BufReader::with_capacity(64 * 1024, stdout),
        writer: Some(tx),
        stderr: tail,
        stderr_done: Some(stderr_done),
        hook,
        observer,
        stop,
        hook_timeout: spec.hook_timeout,
        write_scope: spec.write_scope.clone(),
        read_guard: spec.read_guard.clone(),
        cwd: spec.cwd.clone(),
        pending: Vec::new(),
        next_request: 0,
    };
    match session.initialize(&spec).await {
        Ok(()) => Ok(session),
        Err(e) => {
            session.kill_all().await;
            Err(e)
        }
    }
}

impl RunningSession {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn request_id(&mut self) -> String {
        self.next_request += 1;
        format!("req_{}", self.next_request)
    }

    fn send(&self, msg: Value) {
        if let Some(w) = &self.writer {
            let _ = w.send(msg);
        }
    }

    async fn initialize(&mut self, spec: &SessionSpec) -> Result<()> {
        let id = self.request_id();
        self.send(protocol::initialize(
            &id,
            &spec.role,
            &spec.agent,
            &spec.schema,
        ));
        let deadline = Instant::now() + INIT_TIMEOUT;
        let mut buf = Vec::new();
        loop {
            let read = tokio::select! {
                r = self.reader.read_until(b'\n', &mut buf) => r,
                _ = sleep_until(deadline) => {
                    return Err(AdapterError::new(ErrorCode::AgentFailed, format!(
                        "the Claude Code CLI did not answer initialize within {}s; stderr: {}",
                        INIT_TIMEOUT.as_secs(), tail_text(&self.stderr))));
                }
                _ = self.stop.stopped() => {
                    let code = match self.stop.reason() { Some(StopReason::Timeout) => ErrorCode::Timeout, Some(StopReason::Budget) => ErrorCode::Budget, Some(StopReason::Limit) => ErrorCode::ResourceLimit, _ => ErrorCode::Cancelled };
                    return Err(AdapterError::new(code, "the session was stopped while the CLI was starting"));
                }
            };
            match read {
                Ok(0) | Err(_) => {
                    let status = self.control.wait().await;
                    self.drain_stderr().await;
                    return Err(AdapterError::new(
                        ErrorCode::AgentFailed,
                        format!(
                            "the Claude Code CLI exited before answering initialize ({}); stderr: {}",
                            describe_exit(status),
                            tail_text(&self.stderr)
                        ),
                    ));
                }
                Ok(_) => {}
            }
            let line = std::mem::take(&mut buf);
            match protocol::parse_line(&line) {
                Ok(Inbound::ControlResponse {
                    request_id,
                    outcome,
                }) if request_id == id => {
                    return match outcome {
                        Ok(_) => {
                            self.send(protocol::user_message(&spec.prompt));
                            Ok(())
                        }
                        Err(e) => Err(AdapterError::new(
                            ErrorCode::AgentFailed,
                            format!("the Claude Code CLI refused initialize: {e}"),
                        )),
                    };
                }
                // Anything else before the answer is kept and handled in order by `run`.
                _ => self.pending.push(line),
            }
        }
    }

    /// Drive the session to its end and make sure nothing of it is left running.
    ///
    /// After each `result` that is not the answer to a stop, `check` may ask for a follow-up
    /// user turn (`Some(text)`): it is sent over stream-json in the same session and the
    /// agent's next `result` is awaited, at most `max_follow_ups` times. The stop procedure
    /// (interrupt, SIGTERM, SIGKILL) covers every turn. `check` runs on the session's task
    /// between turns, so it must be quick (the semantic checks are pure).
    pub async fn run<F>(mut self, max_follow_ups: u32, mut check: F) -> SessionEnd
    where
        F: FnMut(&ResultMessage) -> Option<String> + Send,
    {
        let mut turn = Turn::default();
        let mut follow_ups = 0;
        let mut sent_back = None;
        loop {
            self.read_turn(&mut turn).await;
            let Some(result) = turn.result.as_ref() else {
                break;
            };
            if turn.stopping.is_some() || follow_ups >= max_follow_ups {
                break;
            }
            let Some(text) = check(result) else { break };
            if let Some(reason) = self.stop.reason() {
                // Asked to stop between turns: the answer needed correcting, so the session
                // ends stopped rather than with output known to be wrong.
                self.observer.on_event(SessionEvent::Stopping(reason));
                turn.stopping = Some((reason, Instant::now(), false));
                break;
            }
            follow_ups += 1;
            self.observer.on_event(SessionEvent::FollowUp(&text));
            self.send(protocol::user_message(&text));
            sent_back = turn.result.take().and_then(|r| r.structured_output);
        }
        self.end(turn, follow_ups, sent_back).await
    }

    /// Read until the current turn's `result`, the end of the CLI's output, or the end of
    /// the stop procedure (which starts here when the session is asked to stop).
    async fn read_turn(&mut self, turn: &mut Turn) {
        for line in std::mem::take(&mut self.pending) {
            self.handle_line(&line, turn);
        }
        let mut buf = Vec::new();
        while turn.result.is_none() {
            let deadline = turn.stopping.map(|(_, d, _)| d);
            tokio::select! {
                read = self.reader.read_until(b'\n', &mut buf) => {
                    match read {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let line = std::mem::take(&mut buf);
                            self.handle_line(&line, turn);
                        }
                    }
                }
                _ = self.stop.stopped(), if turn.stopping.is_none() => {
                    let reason = self.stop.reason().unwrap_or(StopReason::Cancelled);
                    self.observer.on_event(SessionEvent::Stopping(reason));
                    if reason == StopReason::Limit {
                        // What passes the limit is running now (a command filling the disk):
                        // every process of the session goes at once.
                        turn.stopping = Some((reason, Instant::now(), true));
                        self.kill_all().await;
                        break;
                    }
                    let id = self.request_id();
                    self.send(protocol::interrupt(&id));
                    turn.stopping = Some((reason, Instant::now() + INTERRUPT_GRACE, false));
                }
                _ = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let (reason, _, termed) = turn.stopping.expect("deadline implies stopping");
                    if termed {
                        break;
                    }
                    self.control.terminate();
                    turn.stopping = Some((reason, Instant::now() + TERM_GRACE, true));
                }
            }
        }
    }

    /// Close stdin, give the CLI its grace to exit, then make sure nothing is left.
    async fn end(mut self, turn: Turn, follow_ups: u32, sent_back: Option<Value>) -> SessionEnd {
        let Turn {
            result,
            stopping,
            stats,
            ..
        } = turn;
        // Closing stdin tells the CLI the conversation is over.
        self.writer = None;
        // A stopped session's outcome is already decided: SIGTERM at once rather than waiting
        // for the CLI's own wind-down (it takes 100-250 ms after an interrupt result).
        let mut termed = stopping.is_some_and(|(_, _, termed)| termed);
        if stopping.is_some() && !termed {
            self.control.terminate();
            termed = true;
        }
        let grace = if termed || result.is_none() {
            TERM_GRACE
        } else {
            EXIT_GRACE
        };
        let mut exit = timeout(grace, self.control.wait()).await.ok().flatten();
        if exit.is_none() && !termed {
            self.control.terminate();
            exit = timeout(TERM_GRACE, self.control.wait())
                .await
                .ok()
                .flatten();
        }
        self.kill_all().await;
        if exit.is_none() {
            exit = self.control.wait().await;
        }
        SessionEnd {
            result,
            exit,
            stderr_tail: tail_text(&self.stderr),
            stopped: self.stop.reason().filter(|_| stopping.is_some()),
            pid: self.pid,
            stats,
            follow_ups,
            sent_back,
        }
    }

    /// SIGKILL every process of the session, reap the CLI and drain stderr.
    async fn kill_all(&mut self) {
        self.writer = None;
        self.control.kill_all().await;
        self.drain_stderr().await;
    }

    /// Waits until stderr is read to its end: it closes once every holder of the pipe is dead;
    /// bounded in case one escaped.
    async fn drain_stderr(&mut self) {
        if let Some(done) = self.stderr_done.take() {
            let _ = timeout(Duration::from_secs(2), done).await;
        }
    }

    fn handle_line(&mut self, line: &[u8], turn: &mut Turn) {
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            return;
        }
        let msg = match protocol::parse_line(trimmed) {
            Ok(m) => m,
            Err(e) => {
                self.observer.on_event(SessionEvent::UnreadableLine {
                    error: &e,
                    bytes: trimmed.len(),
                });
                return;
            }
        };
        match msg {
            // The CLI sends `system/init` at the start of every turn; observers get the first.
            Inbound::SystemInit(v) => {
                if !turn.initialized {
                    turn.initialized = true;
                    turn.stats.add_init(&v);
                    self.observer.on_event(SessionEvent::Init(&v));
                }
            }
            Inbound::Assistant(v) => {
                for block in protocol::assistant_blocks(&v) {
                    match block {
                        protocol::Block::Text(t) => self.observer.on_event(SessionEvent::Text(t)),
                        protocol::Block::ToolUse { id, name, input } => self
                            .observer
                            .on_event(SessionEvent::ToolUse { id, name, input }),
                        protocol::Block::Other => {}
                    }
                }
            }
            Inbound::ControlRequest {
                request_id,
                request,
            } => self.answer_control_request(request_id, request),
            Inbound::Result(r) => {
                self.observer.on_event(SessionEvent::Result(&r));
                r.add_to(&mut turn.stats);
                turn.result = Some(*r);
            }
            Inbound::User(v) => {
                for r in protocol::tool_results(&v) {
                    self.observer.on_event(SessionEvent::ToolResult {
                        tool_use_id: r.tool_use_id,
                        content: &r.content,
                        is_error: r.is_error,
                    });
                }
            }
            Inbound::ControlResponse { .. } | Inbound::System(_) | Inbound::Other(_) => {}
        }
    }

    fn answer_control_request(&self, request_id: String, request: Value) {
        let Some(writer) = self.writer.clone() else {
            return;
        };
        let subtype = request.get("subtype").and_then(Value::as_str).unwrap_or("");
        let callback = request.get("callback_id").and_then(Value::as_str);
        let input = request.get("input").cloned().unwrap_or(Value::Null);
        match (subtype, callback) {
            ("hook_callback", Some(protocol::BASH_HOOK_ID)) => {}
            ("hook_callback", Some(id @ (protocol::FILE_HOOK_ID | protocol::READ_HOOK_ID))) => {
                let answer = if id == protocol::READ_HOOK_ID {
                    self.answer_file_read(&input)
                } else {
                    self.answer_file_write(&input)
                };
                let _ = writer.send(protocol::success_response(&request_id, answer));
                return;
            }
            _ => {
                // Nothing else was registered. An error answer to a hook blocks
                // (onFailure: block).
                let _ = writer.send(protocol::error_response(
                    &request_id,
                    &format!("unsupported control request: {subtype}"),
                ));
                return;
            }
        }
        let hook = self.hook.clone();
        let observer = self.observer.clone();
        let bound = self.hook_timeout;
        tokio::spawn(async move {
            let tool_name = input
                .get("tool_name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let tool_input = input.get("tool_input").cloned().unwrap_or(Value::Null);
            let tool_use_id = input
                .get("tool_use_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let (decision, failure) =
                match timeout(bound, hook.validate(tool_name.clone(), tool_input.clone())).await {
                    Ok(Ok(d)) => (d, None),
                    Ok(Err(e)) => (validator_failed(&e.message), Some(e.message)),
                    Err(_) => {
                        let m = format!(
                            "the validator did not answer within {} ms",
                            bound.as_millis()
                        );
                        (validator_failed(&m), Some(m))
                    }
                };
            observer.on_event(SessionEvent::Hook {
                tool_name: &tool_name,
                tool_use_id,
                input: &tool_input,
                decision: &decision,
                failure: failure.as_deref(),
            });
            let answer = match &decision {
                HookDecision::Approve => protocol::hook_allow(),
                HookDecision::Block { reason } => protocol::hook_deny(reason),
            };
            let _ = writer.send(protocol::success_response(&request_id, answer));
        });
    }
}

impl RunningSession {
    /// The file tools' hook, answered here (no engine round trip): the call is allowed only
    /// when the file it names lies inside the session's write scope; anything unreadable is
    /// blocked.
    fn answer_file_write(&self, input: &Value) -> Value {
        let tool_name = input.get("tool_name").and_then(Value::as_str).unwrap_or("");
        let tool_input = input.get("tool_input").unwrap_or(&Value::Null);
        let target = protocol::file_tool_target(tool_name, tool_input);
        let verdict = target
            .clone()
            .and_then(|path| self.write_scope.check(&self.cwd, path));
        let decision = match verdict {
            Ok(()) => HookDecision::Approve,
            Err(why) => {
                let roots: Vec<String> = self
                    .write_scope
                    .writable()
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                HookDecision::Block {
                    reason: format!(
                        "Blocked: this session may not write there with {tool_name} ({why}). \
                         It may write only inside: {}",
                        if roots.is_empty() {
                            "nothing".to_string()
                        } else {
                            roots.join(", ")
                        }
                    ),
                }
            }
        };
        self.answer_file_tool(Access::Write, input, target.ok(), decision)
    }

    /// The read tools' hook, answered here: the call is allowed unless what it reads lies in a
    /// credential store (for a search: in one, or above one); anything unreadable is blocked.
    fn answer_file_read(&self, input: &Value) -> Value {
        let tool_name = input.get("tool_name").and_then(Value::as_str).unwrap_or("");
        let tool_input = input.get("tool_input").unwrap_or(&Value::Null);
        let target = protocol::read_tool_target(tool_name, tool_input);
        let guard = &self.read_guard;
        let verdict = match &target {
            Ok(ReadTarget::File(file)) => guard.check_file(&self.cwd, file),
            Ok(ReadTarget::Search(trees)) => trees
                .iter()
                .try_for_each(|tree| guard.check_search(&self.cwd, tree)),
            Err(why) => Err(why.clone()),
        };
        let decision = match verdict {
            Ok(()) => HookDecision::Approve,
            Err(why) => HookDecision::Block {
                reason: format!(
                    "Blocked: this session may not read there with {tool_name} ({why}). \
                     Credential stores (ssh keys, cloud and gh credentials, .netrc, git \
                     credentials) are not readable; everything else is"
                ),
            },
        };
        let path = match &target {
            Ok(ReadTarget::File(file)) => file.to_str(),
            Ok(ReadTarget::Search(trees)) => trees.first().and_then(|t| t.to_str()),
            Err(_) => None,
        };
        self.answer_file_tool(Access::Read, input, path, decision)
    }

    /// Reports the decision on a file tool call and turns it into the hook's answer.
    fn answer_file_tool(
        &self,
        access: Access,
        input: &Value,
        path: Option<&str>,
        decision: HookDecision,
    ) -> Value {
        let field = |k: &str| input.get(k).and_then(Value::as_str).unwrap_or("");
        self.observer.on_event(SessionEvent::FileAccess {
            access,
            tool_name: field("tool_name"),
            tool_use_id: field("tool_use_id"),
            path,
            decision: &decision,
        });
        match &decision {
            HookDecision::Approve => protocol::hook_allow(),
            HookDecision::Block { reason } => protocol::hook_deny(reason),
        }
    }
}

fn validator_failed(why: &str) -> HookDecision {
    HookDecision::Block {
        reason: format!("Blocked: the Bash validator failed ({why}); the command was not run"),
    }
}

pub fn describe_exit(status: Option<ExitStatus>) -> String {
    match status {
        None => "exit status unknown".to_string(),
        Some(s) => {
            #[cfg(unix)]
            {
                use std::os::unix::process::ExitStatusExt;
                if let Some(sig) = s.signal() {
                    return format!("killed by signal {sig}");
                }
            }
            match s.code() {
                Some(c) => format!("exit code {c}"),
                None => "exit status unknown".to_string(),
            }
        }
    }
}
