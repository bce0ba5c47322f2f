//! The `startAgent` lifecycle and the session registry (napi-free). One `Adapter` per
//! `createClaudeAdapter` call; sessions are keyed by the session id the engine sees, so
//! `cancelAgent(handle.sessionID)` always reaches its session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::agent_definition;
use crate::claude::command::{self, CliArgs};
use crate::claude::locate;
use crate::claude::session::{
    self, SessionEnd, SessionEvent, SessionObserver, SessionSpec, StopReason, StopSignal,
};
use crate::config::AdapterConfig;
use crate::context::{self, FetchOptions};
use crate::deps::{BashHook, Deps, HookDecision, LogLevel, Logger};
use crate::domain::{Role, StartParams};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::patch;
use crate::git::worktree::{RepoGit, Worktree};
use crate::logging::LogRoute;
use crate::output::{OutputBuffer, DEFAULT_BOUND};
use crate::params;
use crate::schema;
use crate::transcript::{self, Transcript};

struct Entry {
    stop: StopSignal,
    branch: Option<String>,
    done: watch::Receiver<bool>,
}

pub struct Adapter {
    config: AdapterConfig,
    deps: Arc<dyn Deps>,
    hook: Arc<dyn BashHook>,
    logger: Arc<dyn Logger>,
    sessions: Mutex<HashMap<String, Entry>>,
    shut_down: AtomicBool,
    /// Routes the core modules' `tracing` diagnostics to this adapter's logger.
    log_route: LogRoute,
}

/// Everything a session needs before its CLI starts.
struct Prepared {
    spec: SessionSpec,
    transcript: Option<Arc<Transcript>>,
    output: Arc<OutputBuffer>,
    observer: Arc<dyn SessionObserver>,
}

/// What `startAgent` hands back; the binding wraps it into the JS `AgentRunHandle`.
pub struct StartedSession {
    pub session_id: String,
    pub output: Arc<OutputBuffer>,
    pub result: oneshot::Receiver<Result<Value>>,
    pub log_file_path: Option<std::path::PathBuf>,
}

/// Removes a registry entry (and marks it done) unless the session was handed to its monitor.
struct Registration {
    adapter: Arc<Adapter>,
    id: String,
    done: Option<watch::Sender<bool>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            self.adapter.lock_sessions().remove(&self.id);
            let _ = done.send(true);
        }
    }
}

/// `params.sessionID` when given (it must be a UUID: the CLI runs with it as its session id),
/// else a fresh one.
fn session_id_for(given: Option<String>) -> Result<String> {
    match given {
        Some(id) if uuid::Uuid::parse_str(&id).is_ok() && id.len() == 36 => Ok(id),
        Some(id) => Err(AdapterError::invalid_params(format!(
            "params.sessionID must be a UUID (the CLI runs with it as its session id); got {id:?}"
        ))),
        None => Ok(uuid::Uuid::new_v4().to_string()),
    }
}

impl Adapter {
    pub fn new(
        config: AdapterConfig,
        deps: Arc<dyn Deps>,
        hook: Arc<dyn BashHook>,
        logger: Arc<dyn Logger>,
    ) -> Arc<Adapter> {
        let log_route = LogRoute::register(logger.clone());
        Arc::new(Adapter {
            config,
            deps,
            hook,
            logger,
            sessions: Mutex::new(HashMap::new()),
            shut_down: AtomicBool::new(false),
            log_route,
        })
    }

    pub fn config(&self) -> &AdapterConfig {
        &self.config
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self, level: LogLevel, message: &str, data: Value) {
        self.logger.log(level, message, data);
    }

    /// Remove worktrees that a dead engine process left under `.worktrees/`.
    pub async fn sweep_stale_worktrees(&self) {
        let repo = RepoGit::for_repo(&self.config.repo_root);
        match repo.sweep_stale().instrument(self.log_route.span()).await {
            Ok(removed) if !removed.is_empty() => self.log(
                LogLevel::Info,
                "removed worktrees left by a process that is gone",
                json!({ "paths": removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>() }),
            ),
            Ok(_) => {}
            Err(e) => self.log(LogLevel::Warn, "could not sweep stale worktrees", json!({ "error": e.to_string() })),
        }
    }

    fn fetch_options(&self, stop: &StopSignal) -> FetchOptions {
        FetchOptions {
            concurrency: self.config.context_concurrency,
            call_timeout: self.config.context_call_timeout,
            cancel: stop.token().clone(),
        }
    }

    /// The enriched prompt `startAgent` would send; provisions and runs nothing.
    pub async fn preview_prompt(
        &self,
        params: &StartParams,
        session_id: Option<String>,
    ) -> Result<String> {
        params::validate_start_params(params, &self.config.repo_root)?;
        session_id_for(session_id)?;
        let stop = StopSignal::default();
        context::build_prompt(
            params,
            &self.deps,
            &self.config.repo_root,
            &self.fetch_options(&stop),
        )
        .await
    }

    pub fn cancel(&self, session_id: &str) {
        if let Some(e) = self.lock_sessions().get(session_id) {
            e.stop.stop(StopReason::Cancelled);
        }
    }

    /// Cancel every session and resolve once each one has settled and been cleaned up.
    pub async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        let waits: Vec<watch::Receiver<bool>> = {
            let sessions = self.lock_sessions();
            sessions
                .values()
                .map(|e| {
                    e.stop.stop(StopReason::Cancelled);
                    e.done.clone()
                })
                .collect()
        };
        for mut done in waits {
            let _ = done.wait_for(|d| *d).await;
        }
    }

    pub async fn start_agent(
        self: &Arc<Self>,
        params: StartParams,
        session_id: Option<String>,
    ) -> Result<StartedSession> {
        self.start(params, session_id)
            .instrument(self.log_route.span())
            .await
    }

    async fn start(
        self: &Arc<Self>,
        params: StartParams,
        session_id: Option<String>,
    ) -> Result<StartedSession> {
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(AdapterError::new(
                ErrorCode::Cancelled,
                "the adapter has been shut down",
            ));
        }
        params::validate_start_params(&params, &self.config.repo_root)?;
        let session_id = session_id_for(session_id)?;
        let branch = match &params {
            StartParams::Implementor { branch_name, .. } => Some(branch_name.clone()),
            _ => None,
        };
        let stop = StopSignal::default();
        let (done_tx, done_rx) = watch::channel(false);
        {
            let mut sessions = self.lock_sessions();
            if sessions.contains_key(&session_id) {
                return Err(AdapterError::new(
                    ErrorCode::DuplicateSession,
                    format!("a session with sessionID {session_id} is running"),
                ));
            }
            if let Some(b) = &branch {
                if let Some((id, _)) = sessions.iter().find(|(_, e)| e.branch.as_ref() == Some(b)) {
                    return Err(AdapterError::new(
                        ErrorCode::DuplicateSession,
                        format!(
                            "branch {b:?} is in use by running session {id}; its worktree is live"
                        ),
                    ));
                }
            }
            sessions.insert(
                session_id.clone(),
                Entry {
                    stop: stop.clone(),
                    branch: branch.clone(),
                    done: done_rx,
                },
            );
        }
        let mut registration = Registration {
            adapter: self.clone(),
            id: session_id.clone(),
            done: Some(done_tx),
        };
        let role = params.role();
        self.log(
            LogLevel::Info,
            "starting agent session",
            json!({ "sessionID": session_id, "role": role.as_str() }),
        );

        // Worktree first (Implementor): context and definition failures must clean it up.
        let worktree = match &branch {
            Some(b) => {
                let env = command::build_env(std::env::vars(), &self.config.env);
                let provisioned = RepoGit::for_repo(&self.config.repo_root)
                    .provision(
                        b,
                        &self.config.default_branch,
                        self.config.worktree_setup_command.as_deref(),
                        &env,
                    )
                    .await?;
                Some(provisioned)
            }
            None => None,
        };
        let prepared = self
            .prepare(&params, &session_id, &stop, worktree.as_ref())
            .await;
        let Prepared {
            spec,
            transcript,
            output,
            observer,
        } = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.cleanup_worktree(worktree.as_ref(), &session_id).await;
                self.log(LogLevel::Error, "agent session failed to start", json!({ "sessionID": session_id, "role": role.as_str(), "code": e.code.as_str(), "error": e.message }));
                return Err(e);
            }
        };
        let running = match session::start(spec, self.hook.clone(), observer, stop.clone()).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(t) = &transcript {
                    t.footer("failed", &e.to_string());
                }
                self.cleanup_worktree(worktree.as_ref(), &session_id).await;
                self.log(LogLevel::Error, "agent session failed to start", json!({ "sessionID": session_id, "role": role.as_str(), "code": e.code.as_str(), "error": e.message }));
                return Err(e);
            }
        };
        self.log(
            LogLevel::Debug,
            "claude CLI initialized",
            json!({ "sessionID": session_id, "role": role.as_str(), "pid": running.pid() }),
        );

        let (result_tx, result_rx) = oneshot::channel();
        let done = registration.done.take().expect("registration is fresh");
        drop(registration);
        if let Some(limit) = self.config.max_agent_duration {
            let timer_stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(limit) => timer_stop.stop(StopReason::Timeout),
                    _ = timer_stop.stopped() => {}
                }
            });
        }
        let adapter = self.clone();
        let monitor_output = output.clone();
        let monitor_stop = stop.clone();
        let monitor_id = session_id.clone();
        let log_file_path = transcript.as_ref().map(|t| t.path().to_path_buf());
        let monitor_span = self.log_route.span();
        tokio::spawn(
            async move {
            let end = running.run().await;
            monitor_output.close();
            let outcome = adapter
                .finish(
                    role,
                    end,
                    worktree.as_ref(),
                    transcript.as_deref(),
                    &monitor_id,
                )
                .await;
            if let (Some(w), Some(t)) = (worktree.as_ref(), transcript.as_deref()) {
                let has_patch =
                    matches!(&outcome, Ok(v) if v.get("patch").is_some_and(Value::is_string));
                if !has_patch {
                    adapter.salvage_patch(w, t, &monitor_id).await;
                }
            }
            adapter
                .cleanup_worktree(worktree.as_ref(), &monitor_id)
                .await;
            match (&outcome, &transcript) {
                (Ok(_), Some(t)) => t.footer("completed", "the agent's result passed validation"),
                (Err(e), Some(t))
                    if matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) =>
                {
                    t.footer("cancelled", &e.to_string())
                }
                (Err(e), Some(t)) => t.footer("failed", &e.to_string()),
                _ => {}
            }
            match &outcome {
                Ok(_) => adapter.log(LogLevel::Info, "agent session completed", json!({ "sessionID": monitor_id, "role": role.as_str() })),
                Err(e) => adapter.log(LogLevel::Error, "agent session failed", json!({ "sessionID": monitor_id, "role": role.as_str(), "code": e.code.as_str(), "error": e.message })),
            }
            // Stop the timer (if any) and release the id before the result is visible.
            monitor_stop.token().cancel();
            adapter.lock_sessions().remove(&monitor_id);
            let _ = done.send(true);
            let _ = result_tx.send(outcome);
            }
            .instrument(monitor_span),
        );
        Ok(StartedSession {
            session_id,
            output,
            result: result_rx,
            log_file_path,
        })
    }

    async fn prepare(
        &self,
        params: &StartParams,
        session_id: &str,
        stop: &StopSignal,
        worktree: Option<&Worktree>,
    ) -> Result<Prepared> {
        let cfg = &self.config;
        let role = params.role();
        let prompt = context::build_prompt(
            params,
            &self.deps,
            &cfg.repo_root,
            &self.fetch_options(stop),
        )
        .await?;
        let definition = agent_definition::load(&cfg.repo_root, role, &cfg.context_paths)?;
        let program = locate::locate_cli(cfg.claude_executable.as_deref(), &cfg.cli_search_roots)?;
        let schema = schema::output_schema(role).clone();
        let args = command::build_args(&CliArgs {
            role: role.as_str(),
            schema: &schema,
            max_turns: definition.max_turns,
            model: cfg.model.as_deref(),
            session_id,
            settings: None,
        });
        let env = command::build_env(std::env::vars(), &cfg.env);
        let transcript = cfg.logs_dir.as_ref().map(|dir| {
            let logger = self.logger.clone();
            let sid = session_id.to_string();
            Arc::new(Transcript::create(
                dir,
                transcript::epoch_millis(),
                params,
                session_id,
                Box::new(move |msg: &str| {
                    logger.log(LogLevel::Warn, msg, json!({ "sessionID": sid }))
                }),
            ))
        });
        let output = OutputBuffer::new(DEFAULT_BOUND);
        let observer: Arc<dyn SessionObserver> = Arc::new(Observer {
            output: output.clone(),
            transcript: transcript.clone(),
            logger: self.logger.clone(),
            session_id: session_id.to_string(),
            role,
        });
        let cwd = worktree
            .map(|w| w.path.clone())
            .unwrap_or_else(|| cfg.repo_root.clone());
        let spec = SessionSpec {
            program,
            args,
            env,
            cwd,
            role: role.as_str().to_string(),
            agent: definition.to_cli_json(),
            schema,
            prompt,
            hook_timeout: cfg.hook_timeout,
        };
        Ok(Prepared {
            spec,
            transcript,
            output,
            observer,
        })
    }

    /// A run that ends without a patch in its result (failed, cancelled, timed out, blocked)
    /// may still have changed files. With logging on, keep them next to the transcript before
    /// the worktree goes, so an operator can recover the agent's work.
    async fn salvage_patch(&self, w: &Worktree, t: &Transcript, session_id: &str) {
        match patch::extract_patch(&w.path, &w.base_commit).await {
            Ok(p) if !p.is_empty() => {
                let path = t.path().with_extension("patch");
                match std::fs::write(&path, &p) {
                    Ok(()) => t.note("patch", &format!("the worktree's changes were saved to {}", path.display())),
                    Err(e) => self.log(
                        LogLevel::Warn,
                        "could not save the worktree's changes next to the transcript",
                        json!({ "sessionID": session_id, "path": path.display().to_string(), "error": e.to_string() }),
                    ),
                }
            }
            Ok(_) => {}
            Err(e) => self.log(
                LogLevel::Warn,
                "could not read the worktree's changes before cleanup",
                json!({ "sessionID": session_id, "error": e.to_string() }),
            ),
        }
    }

    async fn cleanup_worktree(&self, worktree: Option<&Worktree>, session_id: &str) {
        if let Some(w) = worktree {
            if let Err(e) = w.cleanup().await {
                self.log(LogLevel::Error, "worktree cleanup failed", json!({ "sessionID": session_id, "path": w.path.display().to_string(), "error": e.to_string() }));
            }
        }
    }

    /// Turn how the session ended into the `result` the engine gets.
    async fn finish(
        &self,
        role: Role,
        end: SessionEnd,
        worktree: Option<&Worktree>,
        transcript: Option<&Transcript>,
        session_id: &str,
    ) -> Result<Value> {
        let output = evaluate(role, end)?;
        let Some(w) = worktree else { return Ok(output) };
        let mut output = output;
        let completed = output.get("outcome").and_then(Value::as_str) == Some("completed");
        let patch = if completed {
            let patch = patch::extract_patch(&w.path, &w.base_commit)
                .await
                .map_err(|e| {
                    AdapterError::new(
                        ErrorCode::AgentFailed,
                        format!("could not extract the patch: {}", e.message),
                    )
                    .with_shared_cause(Arc::new(e))
                })?;
            if patch.is_empty() {
                return Err(AdapterError::new(
                    ErrorCode::EmptyPatch,
                    "the implementor reported outcome 'completed' but changed nothing relative to the base commit",
                ));
            }
            if let Some(t) = transcript {
                let path = t.path().with_extension("patch");
                if let Err(e) = std::fs::write(&path, &patch) {
                    self.log(LogLevel::Warn, "could not write the patch next to the transcript", json!({ "sessionID": session_id, "path": path.display().to_string(), "error": e.to_string() }));
                }
            }
            Value::String(patch)
        } else {
            Value::Null
        };
        if let Value::Object(map) = &mut output {
            let mut with_patch = serde_json::Map::new();
            for (k, v) in std::mem::take(map) {
                if k == "summary" {
                    with_patch.insert("patch".into(), patch.clone());
                }
                with_patch.insert(k, v);
            }
            with_patch.entry("patch").or_insert(patch);
            *map = with_patch;
        }
        Ok(output)
    }
}

/// The result rules: `success` AND not `is_error` AND structured output present AND valid.
pub fn evaluate(role: Role, end: SessionEnd) -> Result<Value> {
    let exit = session::describe_exit(end.exit);
    let stderr = if end.stderr_tail.is_empty() {
        String::new()
    } else {
        format!("; stderr: {}", end.stderr_tail)
    };
    if let Some(reason) = end.stopped {
        return Err(match reason {
            StopReason::Cancelled => {
                AdapterError::new(ErrorCode::Cancelled, "the session was cancelled")
            }
            StopReason::Timeout => AdapterError::new(
                ErrorCode::Timeout,
                "the session exceeded maxAgentDuration and was stopped",
            ),
        });
    }
    let Some(r) = end.result else {
        return Err(AdapterError::new(
            ErrorCode::AgentFailed,
            format!("the Claude Code CLI ended without a result ({exit}){stderr}"),
        ));
    };
    let errors = r.error_texts();
    if r.subtype == "error_max_structured_output_retries" {
        return Err(AdapterError::new(
            ErrorCode::OutputInvalid,
            format!("the agent could not produce structured output that satisfies the {} schema after the CLI's retries: {}", role.as_str(), errors.join("; ")),
        ));
    }
    if r.subtype != "success" || r.is_error {
        let text = r
            .result
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| format!("; result: {t}"))
            .unwrap_or_default();
        return Err(AdapterError::new(
            ErrorCode::AgentFailed,
            format!(
                "the agent failed: subtype {}{}, errors [{}] ({exit}){text}{stderr}",
                r.subtype,
                if r.is_error { ", is_error" } else { "" },
                errors.join("; ")
            ),
        ));
    }
    let Some(out) = r.structured_output else {
        return Err(AdapterError::new(ErrorCode::OutputInvalid, "the agent finished without structured output (it never called the StructuredOutput tool)"));
    };
    schema::validate(role, &out).map_err(|violations| {
        AdapterError::new(
            ErrorCode::OutputInvalid,
            format!(
                "the structured output fails the {} schema: {}",
                role.as_str(),
                violations.join("; ")
            ),
        )
    })?;
    Ok(out)
}

/// Fans session events out to the output stream, the transcript and the logger.
struct Observer {
    output: Arc<OutputBuffer>,
    transcript: Option<Arc<Transcript>>,
    logger: Arc<dyn Logger>,
    session_id: String,
    role: Role,
}

impl SessionObserver for Observer {
    fn on_event(&self, event: SessionEvent<'_>) {
        let t = self.transcript.as_deref();
        let ids = || json!({ "sessionID": self.session_id, "role": self.role.as_str() });
        match event {
            SessionEvent::Init(v) => {
                if let Some(t) = t {
                    t.init(v);
                }
                let mut d = ids();
                d["model"] = v.get("model").cloned().unwrap_or(Value::Null);
                d["cwd"] = v.get("cwd").cloned().unwrap_or(Value::Null);
                self.logger
                    .log(LogLevel::Debug, "agent session initialized", d);
            }
            SessionEvent::Text(text) => {
                self.output.push(text);
                if let Some(t) = t {
                    t.text(text);
                }
            }
            SessionEvent::ToolUse { name, input } => {
                if let Some(t) = t {
                    t.tool_use(name, input);
                }
            }
            SessionEvent::Hook {
                tool_name,
                input,
                decision,
                failure,
            } => {
                if let Some(t) = t {
                    t.hook(tool_name, input, decision, failure);
                }
                let mut d = ids();
                d["command"] = input.get("command").cloned().unwrap_or(Value::Null);
                match (decision, failure) {
                    (_, Some(f)) => {
                        d["error"] = json!(f);
                        self.logger.log(
                            LogLevel::Error,
                            "bash validator hook failed; command blocked",
                            d,
                        );
                    }
                    (HookDecision::Block { reason }, None) => {
                        d["reason"] = json!(reason);
                        self.logger
                            .log(LogLevel::Info, "bash command blocked by validator", d);
                    }
                    (HookDecision::Approve, None) => {
                        self.logger.log(LogLevel::Debug, "bash command approved", d)
                    }
                }
            }
            SessionEvent::Result(r) => {
                if let Some(t) = t {
                    t.result(r);
                }
            }
            SessionEvent::UnreadableLine { error, bytes } => {
                if let Some(t) = t {
                    t.note(
                        "warning",
                        &format!("unreadable line from the CLI ({bytes} bytes): {error}"),
                    );
                }
                let mut d = ids();
                d["error"] = json!(error);
                self.logger.log(
                    LogLevel::Warn,
                    "unreadable line from the Claude Code CLI",
                    d,
                );
            }
            SessionEvent::Stopping(reason) => {
                if let Some(t) = t {
                    t.note(
                        "stop",
                        &format!("stopping the session ({})", reason.as_str()),
                    );
                }
                self.logger.log(
                    LogLevel::Info,
                    &format!("stopping agent session ({})", reason.as_str()),
                    ids(),
                );
            }
        }
    }
}

/// Compile-time check: the binding runs `start_agent`'s future on napi's multi-threaded
/// runtime, so it must stay `Send` (a borrow held across an await can silently break that).
const _: fn(Arc<Adapter>, StartParams) = |adapter, params| {
    fn assert_send<T: Send>(_: &T) {}
    let start = async move { adapter.start_agent(params, None).await };
    assert_send(&start);
};
