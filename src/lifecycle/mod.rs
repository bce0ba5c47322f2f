//! One agent session, from `startAgent` to its settled `result`, as one type whose methods are
//! the spec's steps (`000_…` "startAgent"):
//!
//! | step        | spec heading                                    | method                  |
//! |-------------|-------------------------------------------------|-------------------------|
//! | register    | 5. Session tracking                             | [`Session::register`]   |
//! | provision   | 1. Worktree setup / "Worktree Management"       | [`Session::provision`]  |
//! | assemble    | 2. Context assembly, 3. Agent definition loading, 6. Log file setup | [`Session::assemble`] |
//! | spawn       | 4. SDK session creation                         | [`Session::spawn`]      |
//! | supervise   | "Output Stream", "Duration Timeout", "Programmatic Hooks" | [`Session::supervise`] |
//! | extract     | "Result Assembly", "Patch Extraction"           | [`Session::extract`]    |
//! | clean       | "Worktree Management" (cleanup), "Agent Session Logging" | [`Session::clean`] |
//!
//! The time limit runs from `register`, so it reaches provisioning (worktree creation and the
//! setup command) as well as the agent; `cancelAgent` and `shutdown` reach every step through the
//! same [`StopSignal`], and so does the budget: the session's [`SpendMeter`], which the relay
//! counts every model request on, stops it once the spend has passed `maxBudgetUsd` (and the
//! relay refuses any further request meanwhile); such a session ends `ERR_BUDGET`
//! ([`Session::over_budget`]). So does the disk: the session's [`DiskWatch`] stops it at once
//! past `sandbox.limits.diskMiB`, or below the floor as the one that wrote most
//! ([`StopReason::Limit`], `ERR_RESOURCE_LIMIT` naming the limit: [`Session::past_limits`]). A stop only decides the outcome while something is still running: once
//! the CLI has ended with a result, the outcome is settled (so `abortSignal` and `result` can
//! never disagree) unless reading the agent's work out of its checkout is still running
//! [`EXTRACT_STOP_GRACE`] after the stop: that is then killed (see [`Session::read_work`]).
//!
//! What a session needs of the adapter that starts it (config, callbacks, registry, backend) is
//! a [`SessionHost`], which the adapter builds: the lifecycle sits below the adapter.

mod audited;
mod continued;
mod host;
mod observer;
mod outcome;
mod registry;
mod resume;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::agent_definition;
use crate::audit::AuditRecord;
use crate::claude::command::{self, CliArgs};
use crate::claude::ids;
use crate::claude::locate;
use crate::claude::session::{
    self, RunningSession, SessionEnd, SessionSpec, StopReason, StopSignal,
};
use crate::context::{self, FetchOptions};
use crate::deps::LogLevel;
use crate::disk::{DiskWatch, Floor, WatchPlan};
use crate::domain::{Role, StartOptions, StartParams};
use crate::environment::{EnvRequest, Environment, ExecCommand, Workspace};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::gateway::outage::ApiOutage;
use crate::gateway::ApiHooks;
use crate::git::worktree::Continuation;
use crate::git::{ProvisionRequest, RepoGit, SessionRecord, ViewRequest};
use crate::otel::{self, metrics, ToolSpans, SPANS};
use crate::output::{OutputBuffer, DEFAULT_BOUND};
use crate::params;
use crate::sandbox::{EgressAttempt, EgressSink, ReadGuard, WriteScope};
use crate::schema;
use crate::schema::semantic::Facts;
use crate::spend::SpendMeter;
use crate::stats::{ApiStats, RunStats, SessionStats};
use crate::transcript::{self, Transcript};

pub use host::SessionHost;
use observer::Observer;
use outcome::evaluate;
use registry::Registration;
pub use registry::{Registry, SessionInfo};
use resume::{Resume, RunEnd};

/// What `startAgent` hands back; the binding wraps it into the JS `AgentRunHandle`.
pub struct StartedSession {
    pub session_id: String,
    pub output: Arc<OutputBuffer>,
    /// The result and the run's stats, together once the session is cleaned up.
    pub result: oneshot::Receiver<(Result<Value>, SessionStats)>,
    pub log_file_path: Option<std::path::PathBuf>,
    /// The session's audit record (`config.audit`).
    pub audit_record_path: Option<std::path::PathBuf>,
}

/// How long reading the agent's work (its patch, or what a failed run left) may go on after a
/// stop before it is killed. A healthy extraction takes well under this, so a cancel that
/// arrives just after the agent's result still gets the result (and `abortSignal` agrees); one
/// wedged by the agent (a FIFO, a filter that never returns) ends promptly.
const EXTRACT_STOP_GRACE: Duration = Duration::from_secs(2);

/// One session's state as it moves through the steps.
pub struct Session {
    host: Arc<SessionHost>,
    /// The engine's id (`params.sessionID`) or a generated UUID: what `cancelAgent` takes.
    id: String,
    /// The UUID the CLI runs with (derived from `id` when that is not a UUID).
    cli_id: String,
    params: StartParams,
    options: StartOptions,
    stop: StopSignal,
    registration: Registration,
    /// Where the session runs (its checkout, its sandbox) once provisioned.
    environment: Option<Box<dyn Environment>>,
    transcript: Option<Arc<Transcript>>,
    output: Arc<OutputBuffer>,
    /// What the semantic output checks need, fetched once during context assembly.
    facts: Facts,
    started: Instant,
    /// The CLI's environment (the allowlisted part of the engine's plus `config.env`), built
    /// once: the setup command, the sandbox check and the CLI all get this one.
    env: Vec<(String, String)>,
    /// Set once the agent's work could not be read out of its checkout (refused, past
    /// `config.extractionTimeout`, stopped): nothing tries again, and the checkout is kept
    /// rather than removed with the work in it.
    unsaved: AtomicBool,
    /// Set once the CLI's conversation was asked for ([`Session::keep_conversation`]), which
    /// the end does beside the reading of the work rather than after it.
    conversation_asked: AtomicBool,
    /// The model API's failures as the session's relay saw them (`apiOutageTolerance`).
    outage: Arc<ApiOutage>,
    /// The transcript, for the outage's notices (which can come before it is open).
    noted: Arc<OnceLock<Arc<Transcript>>>,
    /// The audit record (`config.audit`), opened with the transcript; the outage's notices
    /// reach it through the cell.
    audit: Arc<OnceLock<Arc<AuditRecord>>>,
    /// The commit the session started from, as its record's start named it (for the seal).
    base_commit: Option<String>,
    /// What the CLI was first started with, to start it again on the same conversation.
    spec: Option<SessionSpec>,
    /// The interrupted session this one continues ([`continued`]).
    continued: Option<Continuation>,
    /// Its checkout's record names its agent: stopped by `shutdown()` before its end, it is
    /// left for the next engine process to continue ([`continued`]).
    continuable: bool,
    /// CLI runs that continued the conversation after the CLI ended on an API failure.
    resumes: u32,
    /// Why the session ended on an API outage it could not wait out (past the tolerance).
    outage_failure: Option<String>,
    /// The model spend the relay counts, with the session's budget; `None` when no relay
    /// sees the session's requests (`sandbox: false`).
    spend: Option<Arc<SpendMeter>>,
    /// The session's span: the root of its trace (or the child of the engine's `traceparent`),
    /// its steps, model requests and tool calls under it ([`crate::otel`]).
    trace: tracing::Span,
    /// The floor of the engine's filesystem the session started above ([`Session::check_disk`]).
    floor: Option<Floor>,
    /// What the session writes on the engine's disk, watched from its CLI's first start until
    /// the session is dropped (after its checkout is gone: the floor then looks at the others).
    disk: Option<DiskWatch>,
    /// The words of the disk limit the watch found (then the session is stopped,
    /// [`StopReason::Limit`]).
    disk_hit: Arc<OnceLock<String>>,
}

impl Session {
    /// Validate, claim the session id (and the branch), start the time limit.
    pub fn register(
        host: &Arc<SessionHost>,
        params: StartParams,
        options: StartOptions,
    ) -> Result<Session> {
        params::validate_start_params(&params, &host.config.repo_root)?;
        let spend = Self::spend_meter(host, &options)?;
        let id = options
            .session_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let stop = StopSignal::default();
        let registration = host.registry.register(&id, &params, &stop)?;
        let trace = session_span(host, &id, &params);
        if let Some(parent) = options.traceparent.as_deref() {
            // Checked with the params; a value that fails here was never accepted.
            if let Ok(parent) = otel::parse_traceparent(parent) {
                otel::set_remote_parent(&trace, parent);
            }
        }
        metrics::session_started(params.role().as_str());
        let output = OutputBuffer::new(DEFAULT_BOUND);
        let noted: Arc<OnceLock<Arc<Transcript>>> = Arc::new(OnceLock::new());
        let audit: Arc<OnceLock<Arc<AuditRecord>>> = Arc::new(OnceLock::new());
        let outage = outage_watch(host, &id, params.role(), &stop, &output, &noted, &audit);
        let env = host.cli_env();
        if let Some(limit) = host.config.max_agent_duration {
            let timer = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(limit) => timer.stop(StopReason::Timeout),
                    _ = timer.stopped() => {}
                }
            });
        }
        if let Some(meter) = spend.clone().filter(|m| m.budget().is_some()) {
            let stopper = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = meter.crossed() => stopper.stop(StopReason::Budget),
                    _ = stopper.stopped() => {}
                }
            });
        }
        Ok(Session {
            host: host.clone(),
            cli_id: ids::cli_session_uuid(&id),
            id,
            params,
            options,
            stop,
            registration,
            environment: None,
            transcript: None,
            output,
            facts: Facts::Implementor,
            started: Instant::now(),
            env,
            unsaved: AtomicBool::new(false),
            conversation_asked: AtomicBool::new(false),
            outage,
            noted,
            audit,
            base_commit: None,
            spec: None,
            continued: None,
            continuable: false,
            resumes: 0,
            outage_failure: None,
            spend,
            trace,
            floor: None,
            disk: None,
            disk_hit: Arc::new(OnceLock::new()),
        })
    }

    /// The session's spend meter, with `params.maxBudgetUsd` or else `config.maxBudgetUsd` as
    /// its budget (`0`: none); `None` when no relay would see the session's requests, which
    /// then cannot have a budget.
    fn spend_meter(host: &SessionHost, options: &StartOptions) -> Result<Option<Arc<SpendMeter>>> {
        let cfg = &host.config;
        let budget = options
            .max_budget_usd
            .or(cfg.max_budget_usd)
            .filter(|b| *b > 0.0);
        if !host.backend.meters_model_requests(cfg.sandbox.as_ref()) {
            if budget.is_some() {
                let why = crate::config::unmetered_locally(cfg.sandbox.as_ref())
                    .unwrap_or("needs the model relay, which this backend does not put between the CLI and the model API");
                return Err(AdapterError::invalid_params(format!(
                    "params.maxBudgetUsd {why}"
                )));
            }
            return Ok(None);
        }
        Ok(Some(SpendMeter::new(budget, cfg.prices.clone())))
    }

    /// The stats' spend: what the relay counted.
    fn spend_stats(&self, mut stats: SessionStats) -> SessionStats {
        stats.spend = self.spend.as_ref().map(|m| m.stats());
        stats
    }

    /// A span for one of the session's steps (the table above), under the session's; none
    /// while traces are not exported.
    fn step(&self, name: &'static str) -> tracing::Span {
        if !otel::tracing_on() {
            return tracing::Span::none();
        }
        tracing::info_span!(target: SPANS, parent: &self.trace, "step", otel.name = name, cra.step = name)
    }

    fn role(&self) -> Role {
        self.params.role()
    }

    fn log(&self, level: LogLevel, message: &str, mut data: Value) {
        data["sessionID"] = json!(self.id);
        data["role"] = json!(self.role().as_str());
        self.host.logger.log(level, message, data);
    }

    /// The error for a stop that arrived before the agent ran (`None` while not stopped).
    fn stopped_error(&self) -> Option<AdapterError> {
        self.stop.reason().map(|reason| match reason {
            StopReason::Cancelled => AdapterError::new(
                ErrorCode::Cancelled,
                "the session was cancelled before the agent started",
            ),
            StopReason::Timeout => AdapterError::new(
                ErrorCode::Timeout,
                "the session exceeded maxAgentDuration before the agent started",
            ),
            StopReason::Budget => self.budget_error(),
            StopReason::Limit => AdapterError::new(
                ErrorCode::ResourceLimit,
                self.disk_hit
                    .get()
                    .cloned()
                    .unwrap_or_else(|| "the session passed a limit".into()),
            ),
        })
    }

    /// A failure of a step that raced the stop signal is reported as the stop when the stop
    /// came first (the step failed *because* it was stopped).
    fn or_stopped(&self, e: AdapterError) -> AdapterError {
        match (e.code, self.stopped_error()) {
            (ErrorCode::Cancelled | ErrorCode::Timeout, Some(stopped)) => stopped,
            _ => e,
        }
    }

    /// The session's environment: the Implementor's checkout or the Planner's and Reviewer's
    /// view of the repository, and the sandbox every role runs in. The transcript is opened
    /// first, so the checkout's record names it: a crash's sweep saves the work beside it.
    pub async fn provision(&mut self) -> Result<()> {
        let host = self.host.clone();
        self.transcript = host
            .config
            .logs_dir
            .as_ref()
            .map(|dir| self.create_transcript(dir));
        self.open_audit()?;
        let cfg = &self.host.config;
        let session = SessionRecord {
            session_id: self.id.clone(),
            transcript: self.transcript.as_ref().map(|t| t.path().to_path_buf()),
        };
        let workspace = match &self.params {
            StartParams::Implementor { branch_name, .. } => Workspace::Checkout(ProvisionRequest {
                branch: branch_name.clone(),
                default_branch: cfg.default_branch.clone(),
                setup: cfg.worktree_setup_command.clone(),
                env: self.env.clone(),
                setup_timeout: cfg.worktree_setup_timeout,
                session: session.clone(),
                extraction_timeout: cfg.extraction_timeout,
                layered: cfg.sandbox.is_some() && cfg.shared_base,
                continue_within: cfg.resume_interrupted,
                model: self.model(),
            }),
            _ => Workspace::View(ViewRequest {
                default_branch: cfg.default_branch.clone(),
                session,
                sandboxed: cfg.sandbox.is_some(),
            }),
        };
        let request = EnvRequest {
            session_id: self.id.clone(),
            role: self.role(),
            repo_root: cfg.repo_root.clone(),
            workspace,
            sandbox: cfg.sandbox.clone(),
            env: self.env.clone(),
            egress: Some(self.egress_sink()),
            api: ApiHooks {
                outage: Some(self.outage.clone()),
                pacing: cfg.fleet_pacing,
                spend: self.spend.clone(),
                trace: Some(self.trace.clone()),
                audit: self.audit.get().cloned(),
            },
        };
        let provisioned = self
            .host
            .backend
            .provision(request, self.stop.token())
            .await;
        self.environment = Some(provisioned.map_err(|e| self.or_stopped(e))?);
        self.take_continuation();
        Ok(())
    }

    /// The model asked for: `params.model`, then `config.model` (None: the definition's).
    fn model(&self) -> Option<String> {
        self.options
            .model
            .clone()
            .or_else(|| self.host.config.model.clone())
    }

    /// With `config.audit`: the session's record, its first entry written.
    fn open_audit(&mut self) -> Result<()> {
        let Some(config) = &self.host.config.audit else {
            return Ok(());
        };
        let record = audited::open(
            config,
            &self.params,
            &self.id,
            &self.env,
            self.host.logger.clone(),
        )?;
        self.base_commit = audited::start(
            &record,
            &self.host.config,
            &self.params,
            &self.options,
            (&self.id, &self.cli_id),
        );
        let _ = self.audit.set(record);
        Ok(())
    }

    fn workdir(&self) -> PathBuf {
        self.environment
            .as_ref()
            .map(|e| e.workdir().to_path_buf())
            .unwrap_or_else(|| self.host.config.repo_root.clone())
    }

    /// The environment when it holds the Implementor's checkout (whose patch is the work).
    fn checkout(&self) -> Option<&dyn Environment> {
        self.environment.as_deref().filter(|e| e.has_checkout())
    }

    fn has_checkout(&self) -> bool {
        self.checkout().is_some()
    }

    /// Prompt, agent definition, CLI location, argv, environment and transcript.
    pub async fn assemble(&mut self) -> Result<SessionSpec> {
        let host = self.host.clone();
        let cfg = &host.config;
        let role = self.role();
        let fetch = FetchOptions {
            concurrency: cfg.context_concurrency,
            call_timeout: cfg.context_call_timeout,
            cancel: self.stop.token().clone(),
        };
        let context::Assembled { prompt, facts } =
            context::assemble(&self.params, &self.host.deps, &cfg.repo_root, &fetch)
                .await
                .map_err(|e| self.or_stopped(e))?;
        self.facts = facts;
        if let Some(e) = self.stopped_error() {
            return Err(e);
        }
        let mut definition = agent_definition::load(&cfg.repo_root, role, &cfg.context_paths)?;
        let program = match host.backend.cli_program() {
            Some(inside) => inside,
            None => locate::locate_cli(cfg.claude_executable.as_deref(), &cfg.cli_search_roots)?,
        };
        // Model per dispatch: params.model, then config.model, then the definition's own.
        let model = self.model();
        if let Some(m) = &model {
            definition.model = m.clone();
        }
        let cwd = self.workdir();
        let env = self.env.clone();
        let write_scope = self.write_scope();
        // The stores Bash may not read (`denyRead`), under the same HOME; with `sandbox: false`
        // too, like the write scope.
        let mut read_guard = ReadGuard::for_cli_env(&env);
        if let Some(audit) = &cfg.audit {
            read_guard = read_guard.and_record(&audit.dir);
        }
        let schema = schema::output_schema(role).clone();
        let mut args = command::build_args(&CliArgs {
            role: role.as_str(),
            schema: &schema,
            max_turns: definition.max_turns,
            model: model.as_deref(),
            session_id: &self.cli_id,
        });
        let mut prompt = prompt;
        if let Some(c) = &self.continued {
            args = continued::args(&args, c)?;
            prompt = continued::prompt(&prompt);
        }
        Ok(SessionSpec {
            program,
            args,
            env,
            cwd,
            role: role.as_str().to_string(),
            agent: definition.to_cli_json(),
            schema,
            prompt,
            hook_timeout: cfg.hook_timeout,
            write_scope,
            read_guard,
        })
    }

    /// Where the CLI's own file tools (Write, Edit, …) may write: the boundary issue 9 draws,
    /// enforced by the session's file hook. The Implementor writes its worktree (not its `.git`
    /// pointer); the Planner and the Reviewer write the temp dir ("temp dirs are fine"); every
    /// role may write `sandbox.allowWrite`, and none the rest of the repository, its git dir
    /// or the transcripts. It holds with `sandbox: false` too: it needs no OS support, and that
    /// switch is for hosts without bubblewrap, not for letting agents write anywhere.
    fn write_scope(&self) -> WriteScope {
        let cfg = &self.host.config;
        let mut scope = WriteScope::default();
        for extra in cfg.sandbox.iter().flat_map(|s| &s.allow_write) {
            scope = scope.allow(extra);
        }
        if let Some(env) = self.environment.as_deref().filter(|e| !e.has_checkout()) {
            scope = scope.allow(&env.temp_dir());
        }
        scope = scope.deny(&cfg.repo_root);
        if let Ok(repo) = git2::Repository::open(&cfg.repo_root) {
            scope = scope.deny(repo.commondir());
        }
        if let Some(logs) = &cfg.logs_dir {
            scope = scope.deny(logs);
        }
        if let Some(audit) = &cfg.audit {
            scope = scope.deny(&audit.dir);
        }
        if self.has_checkout() {
            let w = self.workdir();
            scope = scope.allow(&w).deny(&w.join(".git"));
        }
        scope
    }

    /// Every connection attempt of an agent command: in the transcript, and blocked ones in
    /// the engine's log (they are the interesting ones).
    fn egress_sink(&self) -> EgressSink {
        let transcript = self.transcript.clone();
        let audit = self.audit.get().cloned();
        let logger = self.host.logger.clone();
        let ids = json!({ "sessionID": self.id, "role": self.role().as_str() });
        let role = self.role();
        Arc::new(move |a: &EgressAttempt| {
            if let Some(record) = &audit {
                record.append(
                    "network",
                    json!({ "protocol": a.protocol, "host": a.host, "port": a.port, "allowed": a.allowed, "reason": a.reason }),
                );
            }
            let verdict = if a.allowed { "allowed" } else { "blocked" };
            let why = a
                .reason
                .as_deref()
                .map_or(String::new(), |r| format!(" ({r})"));
            if let Some(t) = &transcript {
                t.note(
                    "network",
                    &format!("{verdict} {} {}:{}{why}", a.protocol, a.host, a.port),
                );
            }
            if !a.allowed {
                let mut d = ids.clone();
                d["host"] = json!(a.host);
                d["port"] = json!(a.port);
                d["reason"] = json!(a.reason);
                logger.log(LogLevel::Warn, "network access blocked by the sandbox", d);
                metrics::denial(role.as_str(), "network");
            }
        })
    }

    /// An Implementor's branch is its own: not `defaultBranch`, not checked out in the
    /// repository ([`RepoGit::check_own_branch`]). Checked before anything is made.
    async fn check_branch(&self) -> Result<()> {
        let StartParams::Implementor { branch_name, .. } = &self.params else {
            return Ok(());
        };
        let cfg = &self.host.config;
        RepoGit::for_repo(&cfg.repo_root)
            .check_own_branch(branch_name, &cfg.default_branch)
            .await
    }

    /// Nothing is provisioned for a session whose files would take the engine's filesystem
    /// below its floor (`sandbox.limits.diskFloorMiB`): it is there already. `ERR_RESOURCE_LIMIT`
    /// naming the floor and what is free.
    fn check_disk(&mut self) -> Result<()> {
        let cfg = &self.host.config;
        let Some(sandbox) = cfg.sandbox.as_ref() else {
            return Ok(());
        };
        if !self.host.backend.on_engine_disk() {
            return Ok(());
        }
        let worktrees = cfg.repo_root.join(crate::git::WORKTREES_DIR);
        let on = if worktrees.is_dir() {
            worktrees
        } else {
            cfg.repo_root.clone()
        };
        self.floor = Floor::check(&on, sandbox.limits.disk_floor)
            .map_err(|why| AdapterError::new(ErrorCode::ResourceLimit, why))?;
        Ok(())
    }

    /// From the CLI's first start: the watch of what the session writes on the engine's disk
    /// (its bound, the floor), which stops the session at once past either.
    fn watch_disk(&mut self) {
        let Some(env) = self.environment.as_deref() else {
            return;
        };
        let bound = self
            .host
            .config
            .sandbox
            .as_ref()
            .and_then(|s| s.limits.disk);
        let roots = env.disk_paths();
        if self.disk.is_some() || roots.is_empty() || (bound.is_none() && self.floor.is_none()) {
            return;
        }
        let plan = WatchPlan {
            roots,
            bound,
            floor: self.floor.clone(),
        };
        let (hit, stop) = (self.disk_hit.clone(), self.stop.clone());
        self.disk = Some(DiskWatch::start(plan, move |why| {
            let _ = hit.set(why);
            stop.stop(StopReason::Limit);
        }));
    }

    /// Nothing is provisioned for a session that cannot be confined.
    fn check_sandbox(&self) -> Result<()> {
        let cfg = &self.host.config;
        self.host.backend.preflight(&self.env, cfg.sandbox.as_ref())
    }

    fn create_transcript(&self, dir: &std::path::Path) -> Arc<Transcript> {
        let logger = self.host.logger.clone();
        let sid = self.id.clone();
        let t = Transcript::create(
            dir,
            crate::clock::now_ms(),
            &self.params,
            &self.id,
            Box::new(move |msg: &str| logger.log(LogLevel::Warn, msg, json!({ "sessionID": sid }))),
        );
        // Secrets the adapter knows of are never written, from the first entry on (a setup
        // command's output in an ERR_PROVISION footer included).
        t.redact(transcript::secrets_in(&self.env));
        let t = Arc::new(t);
        let _ = self.noted.set(t.clone());
        t
    }

    /// Start the CLI; resolves once it has answered `initialize` and has the prompt.
    pub async fn spawn(&mut self, spec: SessionSpec) -> Result<RunningSession> {
        let observer = Arc::new(Observer {
            output: self.output.clone(),
            transcript: self.transcript.clone(),
            logger: self.host.logger.clone(),
            session_id: self.id.clone(),
            role: self.role(),
            trace: self.trace.clone(),
            tools: ToolSpans::default(),
            audit: self.audit.get().cloned(),
        });
        let environment = self.environment.as_mut().ok_or_else(|| {
            AdapterError::new(ErrorCode::Internal, "the session has no environment")
        })?;
        let exec = environment
            .exec(ExecCommand {
                program: spec.program.clone(),
                args: spec.args.clone(),
                env: spec.env.clone(),
            })
            .await?;
        let described = environment.describe();
        if let Some(t) = &self.transcript {
            t.note("sandbox", &described);
        }
        self.watch_disk();
        let environment = self.environment.as_mut().ok_or_else(|| {
            AdapterError::new(ErrorCode::Internal, "the session has no environment")
        })?;
        // An engine running as root without a usable cgroup has no process limit at all
        // (RLIMIT_NPROC does not bind root): said in the transcript and the warning rather
        // than left to the rlimits' line.
        let unenforced = environment.limits_unenforced();
        if let (Some(t), Some(u)) = (&self.transcript, &unenforced) {
            t.note("limits", u);
        }
        if environment.limits_are_fallback() {
            let message = match &unenforced {
                Some(u) => format!(
                    "no usable cgroup for the session: its memory limit is an rlimit (per process), and {u}"
                ),
                None => "no usable cgroup for the session: its memory and process limits are rlimits (per process; per user id)".to_string(),
            };
            self.log(LogLevel::Warn, &message, json!({ "sandbox": described }));
        }
        // The first run's start; a resume is the outage's notice in the record.
        if let (Some(record), None) = (self.audit.get(), &self.spec) {
            audited::agent(record, &spec, &described);
        }
        // The first run's: a resume is made from it (its turn limit less what was used).
        if self.spec.is_none() {
            self.spec = Some(spec.clone());
        }
        let running = session::start(
            exec,
            spec,
            self.host.hook.clone(),
            observer,
            self.stop.clone(),
        )
        .await
        .map_err(|e| self.or_stopped(e))?;
        self.registration.set_pid(running.pid());
        // What continuing it after an interruption needs, once its CLI runs.
        if self.host.config.resume_interrupted.is_some() {
            let model = self.model();
            if let Some(env) = self.environment.as_deref() {
                let recorded = env.record_agent(Some((&self.cli_id, model.as_deref())));
                self.continuable = recorded.await;
            }
        }
        self.log(
            LogLevel::Debug,
            "claude CLI initialized",
            json!({ "pid": running.pid(), "sandbox": described }),
        );
        Ok(running)
    }

    /// Run the agent to its end (result, crash, stop); nothing of the CLI is left running.
    /// Output that passes the schema but breaks the semantic rules is sent back to the agent
    /// in the same session, up to `config.outputRetries` times.
    /// A CLI that ended on a model-API failure the session may still wait out is started again
    /// on the same conversation (`--resume`, the same checkout, role, schema, hooks and
    /// sandbox); its stats add up.
    pub async fn supervise(&mut self, running: RunningSession) -> SessionEnd {
        let mut stats = RunStats::default();
        let mut end = self.run_resuming(running, &mut stats).await;
        end.stats = stats;
        self.output.close();
        end
    }

    /// [`Session::supervise`]'s runs: each CLI run's stats added to `stats`; the last run's end.
    async fn run_resuming(
        &mut self,
        mut running: RunningSession,
        stats: &mut RunStats,
    ) -> SessionEnd {
        let retries = self.host.config.output_retries;
        loop {
            let (role, facts) = (self.role(), &self.facts);
            let mut end = running
                .run(retries, |r| outcome::semantic_follow_up(role, facts, r))
                .await;
            stats.then(std::mem::take(&mut end.stats));
            let (reason, spec) = match self.resumable(&end, stats.turns().unwrap_or(0)).await {
                Resume::Yes(resume) => resume,
                Resume::No => return end,
                Resume::Refused(why) => {
                    self.outage_failure = Some(why);
                    return end;
                }
            };
            self.resumes += 1;
            self.outage.notice(&resume::notice(&reason, self.resumes));
            // An API that cuts every answer is not asked again at once; a stop ends the pause.
            tokio::select! {
                _ = tokio::time::sleep(resume::pause(self.resumes)) => {}
                _ = self.stop.stopped() => {}
            }
            if let Some(reason) = self.stop.reason() {
                end.stopped = Some(reason);
                return end;
            }
            match self.spawn(spec).await {
                Ok(next) => running = next,
                Err(e) => {
                    self.log(
                        LogLevel::Warn,
                        "the CLI could not be started again on its conversation",
                        json!({ "error": e.message }),
                    );
                    return end;
                }
            }
        }
    }

    /// Whether the CLI run that `end` ended is resumed ([`resume::judge`]), with the outage's
    /// reason and the spec to run. An environment lost under it is not an API failure (a pod
    /// its node killed): not resumed. `turns_used`: what the runs so far reported, taken off
    /// the resumed run's `--max-turns` (none left: not resumed).
    async fn resumable(&self, end: &SessionEnd, turns_used: u64) -> Resume<(String, SessionSpec)> {
        let judged = resume::judge(RunEnd {
            stopped: end.stopped.is_some() || self.stop.reason().is_some(),
            result: end.result.as_ref(),
            outage: self.outage.ongoing(),
            tolerance: self.outage.tolerance(),
            resumes: self.resumes,
        });
        let reason = match judged {
            Resume::Yes(reason) => reason,
            Resume::No => return Resume::No,
            Resume::Refused(why) => return Resume::Refused(why),
        };
        if let Some(env) = &self.environment {
            if env.lost().await.is_some() {
                return Resume::No;
            }
        }
        match self
            .spec
            .as_ref()
            .and_then(|first| resume::resumed_spec(first, turns_used))
        {
            Some(spec) => Resume::Yes((reason, spec)),
            None => Resume::No,
        }
    }

    /// How the session ended → the engine's `result` (the Implementor's patch added).
    pub async fn extract(&self, end: SessionEnd) -> (Result<Value>, SessionStats) {
        let run_stats = end.stats.clone();
        // The CLI has ended: its conversation is final, and reading it (a step in a pod) need
        // not wait for the work's.
        let kept = async {
            if let Some(env) = self.environment.as_deref() {
                self.keep_conversation(env).await;
            }
        };
        let (outcome, ()) = tokio::join!(self.result_of(end), kept);
        let outcome = resume::failed_on_outage(self.outage_failure.as_deref(), outcome);
        let changes = self.changes(&outcome).await;
        let elapsed = self.started.elapsed().as_millis() as u64;
        let mut stats = self.spend_stats(run_stats.finish(elapsed, changes.as_deref()));
        stats.api = self.api_stats();
        stats.continued_from = self.continued.as_ref().map(|c| c.from_session.clone());
        (outcome, stats)
    }

    fn api_stats(&self) -> ApiStats {
        let counts = self.outage.counts();
        ApiStats {
            retries: counts.retries,
            resumes: self.resumes,
            waited_ms: counts.waited.as_millis() as u64,
        }
    }

    /// The Implementor's changes (`None` for the other roles), for the stats' changed files:
    /// the result's patch, or, when the result carries none (failed, cancelled, timed out,
    /// blocked), what the worktree holds, which is also kept beside the transcript so an
    /// operator can recover the agent's work before the worktree goes.
    async fn changes(&self, outcome: &Result<Value>) -> Option<String> {
        let env = self.checkout()?;
        let reported = outcome.as_ref().ok().and_then(|v| v.get("patch"));
        if let Some(patch) = reported.and_then(Value::as_str) {
            return Some(patch.to_string());
        }
        if self.unsaved.load(Ordering::SeqCst) {
            // Reading it already failed; the checkout is kept instead.
            return None;
        }
        let warn = |m: &str, d| self.log(LogLevel::Warn, m, d);
        let work = self.read_work(env);
        Some(outcome::salvage_patch(work, self.transcript.as_deref(), warn).await)
    }

    async fn result_of(&self, end: SessionEnd) -> Result<Value> {
        let evaluated = self.or_lost(evaluate(self.role(), &self.facts, end)).await;
        let output = self.over_budget(self.past_limits(evaluated))?;
        match self.checkout() {
            Some(env) => {
                outcome::with_patch(
                    output,
                    self.read_work(env),
                    self.transcript.as_deref(),
                    |m, d| self.log(LogLevel::Warn, m, d),
                )
                .await
            }
            None => Ok(output),
        }
    }

    /// The agent's work read out of its checkout, bounded: by `config.extractionTimeout`
    /// (`ERR_EXTRACT`) and by the stop signal, which leaves a read already under way
    /// [`EXTRACT_STOP_GRACE`] to finish (`ERR_CANCELLED`/`ERR_TIMEOUT` past it). Either way
    /// what the read ran is killed (dropping it does that). A failure marks the work unsaved:
    /// the error says where the checkout is kept.
    async fn read_work(&self, env: &dyn Environment) -> Result<String> {
        let limit = self.host.config.extraction_timeout;
        let dir = env.workdir();
        let stopped = async {
            self.stop.stopped().await;
            if matches!(
                self.stop.reason(),
                Some(StopReason::Budget | StopReason::Limit)
            ) {
                // The budget or a limit stopped the agent, not the reading of its work, which
                // is what that failure keeps: only extractionTimeout bounds it.
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(EXTRACT_STOP_GRACE).await;
        };
        let read = tokio::select! {
            r = tokio::time::timeout(limit, env.extract_patch()) => {
                r.unwrap_or_else(|_| Err(crate::git::patch::timed_out(dir, limit)))
            }
            _ = stopped => Err(match self.stop.reason() {
                Some(StopReason::Timeout) => AdapterError::new(
                    ErrorCode::Timeout,
                    "the session exceeded maxAgentDuration while its work was being read out of its checkout",
                ),
                _ => AdapterError::new(
                    ErrorCode::Cancelled,
                    "the session was cancelled while its work was being read out of its checkout",
                ),
            }),
        };
        let read = match read {
            // The work could not be read because the environment went (its pod was deleted or
            // OOM-killed meanwhile): that is the reason.
            Err(e) => match env.lost().await {
                Some(lost) => Err(lost.with_shared_cause(Arc::new(e))),
                None => Err(e),
            },
            ok => ok,
        };
        read.map_err(|e| {
            self.unsaved.store(true, Ordering::SeqCst);
            if !env.keeps_unreadable_work() {
                return e;
            }
            let message = format!(
                "{}; the checkout is kept as it is at {} (the next adapter's sweep tries to save it \
                 again; remove it once you have what you need)",
                e.message,
                dir.display()
            );
            AdapterError {
                message,
                ..e
            }
        })
    }

    /// A session that failed because its environment went (its pod deleted, evicted,
    /// OOM-killed) fails with that as the reason, the agent's failure as the cause.
    async fn or_lost(&self, outcome: Result<Value>) -> Result<Value> {
        let Err(e) = outcome else { return outcome };
        if matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) {
            return Err(e);
        }
        let lost = match self.environment.as_deref() {
            Some(env) => env.lost().await,
            None => None,
        };
        match lost {
            Some(l) => Err(l.with_shared_cause(Arc::new(e))),
            None => Err(e),
        }
    }

    /// A kernel limit the session ran into goes in the transcript; when the session failed
    /// (other than by cancel or timeout), the limit is why: `ERR_RESOURCE_LIMIT` naming it.
    fn past_limits(&self, outcome: Result<Value>) -> Result<Value> {
        let commands = self.environment.as_ref().and_then(|e| e.commands_limited());
        if let (Some(t), Some(c)) = (&self.transcript, commands) {
            t.note("limits", &c);
        }
        let hit = self.disk_hit.get().cloned();
        let Some(hit) = hit.or_else(|| self.environment.as_ref().and_then(|e| e.limit_hit()))
        else {
            return outcome;
        };
        if let Some(t) = &self.transcript {
            t.note("limits", &hit);
        }
        match outcome {
            Err(e) if !matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) => Err(
                AdapterError::new(ErrorCode::ResourceLimit, format!("{hit}; {}", e.message))
                    .with_shared_cause(Arc::new(e)),
            ),
            other => other,
        }
    }

    /// A session whose spend passed its budget ends `ERR_BUDGET`, naming the budget and the
    /// spend, whatever else its end was (the stop for the budget; the CLI's failure at the
    /// refused request; even a result that came with the crossing request: the budget is hard,
    /// and the spend does not depend on which came first) — unless it was cancelled or timed
    /// out first. The Implementor's work is then saved as for any failed run.
    fn over_budget(&self, outcome: Result<Value>) -> Result<Value> {
        if !self.spend.as_ref().is_some_and(|m| m.exceeded()) {
            return outcome;
        }
        let budget = self.budget_error();
        if let Some(t) = &self.transcript {
            t.note("budget", &budget.message);
        }
        if let Some(record) = self.audit.get() {
            record.append("budget", json!({ "message": budget.message }));
        }
        match outcome {
            Err(e) if matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) => Err(e),
            Err(e) if e.code == ErrorCode::Budget => Err(budget),
            Err(e) => Err(budget.with_shared_cause(Arc::new(e))),
            Ok(_) => Err(budget),
        }
    }

    /// `ERR_BUDGET` naming the budget and the spend.
    fn budget_error(&self) -> AdapterError {
        let spent = self
            .spend
            .as_ref()
            .map_or_else(|| "unknown".to_string(), |m| m.describe());
        AdapterError::new(
            ErrorCode::Budget,
            format!("the session's model budget is spent: {spent}; the relay refuses further model requests and the session was stopped"),
        )
    }

    /// With `logging.agentSessions`, the CLI's conversation beside the transcript, so a person
    /// can continue it with `claude --resume` (docs/troubleshooting.md says how). Once: the
    /// end asks for it beside the reading of the work, [`Session::clean`] when the session
    /// ended before that.
    async fn keep_conversation(&self, env: &dyn Environment) {
        let Some(t) = &self.transcript else { return };
        if self.conversation_asked.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(bytes) = env.conversation(&self.cli_id).await else {
            return;
        };
        let path = t.path().with_extension("conversation.jsonl");
        match std::fs::write(&path, bytes) {
            Ok(()) => t.note(
                "conversation",
                &format!(
                    "the CLI's conversation {} was kept at {}",
                    self.cli_id,
                    path.display()
                ),
            ),
            Err(e) => self.log(
                LogLevel::Warn,
                "could not keep the CLI's conversation beside the transcript",
                json!({ "path": path.display().to_string(), "error": e.to_string() }),
            ),
        }
    }

    /// Remove the environment — checkout, sandbox, its proxy and relay (the work was kept by
    /// `changes`; a checkout whose work could not be read is kept instead) — write the
    /// footer, log, release the id.
    pub async fn clean(mut self, outcome: &Result<Value>, stats: &SessionStats) {
        if let Some(mut env) = self.environment.take() {
            self.keep_conversation(env.as_ref()).await;
            let keep = self.unsaved.load(Ordering::SeqCst);
            if keep {
                let path = env.workdir().display().to_string();
                if let Some(t) = &self.transcript {
                    t.note("patch", &format!("the agent's work could not be read out of its checkout, which is kept at {path}"));
                }
                self.log(
                    LogLevel::Warn,
                    "the agent's work could not be read out of its checkout; the checkout is kept",
                    json!({ "path": path }),
                );
            }
            let left = !keep && self.left_for_next(outcome);
            // Ended for good: a checkout that stays (unreadable work, a failed removal) is no
            // interrupted session's to continue. One removed takes its record with it.
            let forget = self.continuable && !left;
            if forget && keep {
                env.record_agent(None).await;
            }
            if let Err(e) = env.destroy(keep || left).await {
                if forget && !keep {
                    env.record_agent(None).await;
                }
                self.log(
                    LogLevel::Error,
                    "worktree cleanup failed",
                    json!({ "path": env.workdir().display().to_string(), "error": e.to_string() }),
                );
            }
        }
        self.write_end(outcome, stats);
        // Stop the timer (if any) and release the id before the result is visible.
        self.stop.token().cancel();
        self.registration.release();
    }

    /// The transcript's stats and footer, the logger's completed/failed entry, the session's
    /// span's outcome and the metrics of its end.
    fn write_end(&self, outcome: &Result<Value>, stats: &SessionStats) {
        let code = outcome.as_ref().err().map(|e| e.code.as_str());
        metrics::session_ended(self.role().as_str(), code, self.started.elapsed());
        self.trace.record(
            "cra.outcome",
            if code.is_some() { "error" } else { "success" },
        );
        if let Some(e) = outcome.as_ref().err() {
            self.trace.record("error.type", e.code.as_str());
            self.trace.record("otel.status_code", "ERROR");
            self.trace
                .record("otel.status_description", e.message.as_str());
        }
        if let Some(spend) = &stats.spend {
            self.trace.record("cra.cost.usd", spend.usd);
        }
        if let Some(record) = self.audit.get() {
            let base = self.base_commit.as_deref();
            audited::end(record, base, &self.params, &self.id, outcome, stats);
        }
        let stats_json = serde_json::to_value(stats).unwrap_or(Value::Null);
        if let Some(t) = &self.transcript {
            t.note("stats", &stats_json.to_string());
            match outcome {
                Ok(_) => t.footer("completed", "the agent's result passed validation"),
                Err(e) if matches!(e.code, ErrorCode::Cancelled | ErrorCode::Timeout) => {
                    t.footer("cancelled", &e.to_string())
                }
                Err(e) => t.footer("failed", &e.to_string()),
            }
        }
        match outcome {
            Ok(_) => self.log(
                LogLevel::Info,
                "agent session completed",
                json!({ "stats": stats_json }),
            ),
            Err(e) => self.log(
                LogLevel::Error,
                "agent session failed",
                json!({ "code": e.code.as_str(), "error": e.message, "stats": stats_json }),
            ),
        }
    }

    /// The steps up to a running agent. A failure cleans what was made and is returned.
    async fn start(mut self) -> Result<(Session, RunningSession)> {
        let started = async {
            self.check_branch().await?;
            self.check_sandbox()?;
            self.check_disk()?;
            // Step spans are held, not entered: what a step starts that outlives it (the
            // relay's and the bridges' servers keep the span they start in) stays in the
            // session's span, so a step's span ends with the step.
            {
                let _step = self.step("provision");
                self.provision().await?;
            }
            let spec = {
                let _step = self.step("assemble");
                self.assemble().await?
            };
            let _step = self.step("spawn");
            self.spawn(spec).await
        }
        .await;
        match started {
            Ok(running) => Ok((self, running)),
            Err(e) => {
                let failed = Err(e.clone());
                let changes = self.changes(&failed).await;
                let elapsed = self.started.elapsed().as_millis() as u64;
                let stats =
                    self.spend_stats(RunStats::default().finish(elapsed, changes.as_deref()));
                self.clean(&failed, &stats).await;
                Err(e)
            }
        }
    }
}

/// `startAgent`: the steps up to a running agent, then supervision in the background.
pub async fn start_agent(
    host: &Arc<SessionHost>,
    params: StartParams,
    options: StartOptions,
) -> Result<StartedSession> {
    let role = params.role();
    let session = Session::register(host, params, options)
        .inspect_err(|e| metrics::refused(role.as_str(), e.code.as_str()))?;
    session.log(LogLevel::Info, "starting agent session", json!({}));
    let trace = session.trace.clone();
    let (session, running) = session.start().instrument(trace.clone()).await?;
    metrics::session_handed(role.as_str(), session.started.elapsed());
    let (result_tx, result_rx) = oneshot::channel();
    let started = StartedSession {
        session_id: session.id.clone(),
        output: session.output.clone(),
        result: result_rx,
        log_file_path: session.transcript.as_ref().map(|t| t.path().to_path_buf()),
        audit_record_path: session.audit.get().map(|r| r.path().to_path_buf()),
    };
    tokio::spawn(
        async move {
            let mut session = session;
            let step = session.step("supervise");
            let end = session.supervise(running).await;
            drop(step);
            let step = session.step("extract");
            let (outcome, stats) = session.extract(end).await;
            drop(step);
            let step = session.step("clean");
            session.clean(&outcome, &stats).await;
            drop(step);
            let _ = result_tx.send((outcome, stats));
        }
        .instrument(trace),
    );
    Ok(started)
}

/// A session's span (see [`Session::trace`]): what the engine knows it by. Its parent is the
/// adapter's, which routes its events to the adapter's logger; the exporter never sees that
/// one, so a session's span starts a trace of its own.
fn session_span(host: &SessionHost, id: &str, params: &StartParams) -> tracing::Span {
    let role = params.role().as_str();
    let (work_item, branch, revision) = match params {
        StartParams::Planner { .. } => (None, None, None),
        StartParams::Implementor {
            work_item_id,
            branch_name,
        } => (
            Some(work_item_id.as_str()),
            Some(branch_name.as_str()),
            None,
        ),
        StartParams::Reviewer {
            work_item_id,
            revision_id,
        } => (
            Some(work_item_id.as_str()),
            None,
            Some(revision_id.as_str()),
        ),
    };
    tracing::info_span!(
        target: SPANS,
        parent: &host.log_route.span(),
        "invoke_agent",
        otel.name = format!("invoke_agent {role}"),
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = role,
        cra.session.id = id,
        cra.role = role,
        cra.work_item.id = work_item,
        cra.branch = branch,
        cra.revision.id = revision,
        cra.outcome = tracing::field::Empty,
        error.type = tracing::field::Empty,
        cra.cost.usd = tracing::field::Empty,
    )
}

/// The session's outage watch: its notices go to the engine's stream (a line of their own), the
/// transcript, the audit record and the engine's log.
fn outage_watch(
    host: &Arc<SessionHost>,
    id: &str,
    role: Role,
    stop: &StopSignal,
    output: &Arc<OutputBuffer>,
    noted: &Arc<OnceLock<Arc<Transcript>>>,
    audit: &Arc<OnceLock<Arc<AuditRecord>>>,
) -> Arc<ApiOutage> {
    let (output, noted, logger) = (output.clone(), noted.clone(), host.logger.clone());
    let audit = audit.clone();
    let ids = json!({ "sessionID": id, "role": role.as_str() });
    ApiOutage::new(
        host.config.api_outage_tolerance,
        stop.token().clone(),
        Box::new(move |text: &str| {
            output.push(&format!("\n[claude-runtime-adapter] {text}\n"));
            if let Some(t) = noted.get() {
                t.note("api", text);
            }
            if let Some(record) = audit.get() {
                record.append("api", json!({ "notice": text }));
            }
            logger.log(LogLevel::Warn, text, ids.clone());
        }),
    )
}
