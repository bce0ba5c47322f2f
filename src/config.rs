//! The adapter's configuration as the core sees it, and its validation: every problem is an
//! `ERR_INVALID_PARAMS` naming the field, raised by `createClaudeAdapter` before anything runs.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::audit::{AuditConfig, SigningKey};
use crate::error::AdapterError;
use crate::spend::Prices;

mod budget;
pub mod kubernetes;
pub use budget::unmetered_locally;
pub use kubernetes::{KubernetesConfig, PullPolicy, Toleration};

const DEFAULT_CONTEXT_CONCURRENCY: f64 = 16.0;
const DEFAULT_SETUP_TIMEOUT_S: f64 = 600.0;
const DEFAULT_EXTRACTION_TIMEOUT_S: f64 = 300.0;
const DEFAULT_OUTPUT_RETRIES: f64 = 2.0;
const DEFAULT_CALL_TIMEOUT_S: f64 = 30.0;
/// The longest any configurable wait may be (365 days): far beyond a real session, and far
/// below what `Duration`, `Instant` arithmetic or a timer can hold, so no number reaches them
/// unchecked.
pub const MAX_SECONDS: f64 = 31_536_000.0;
const MAX_CONCURRENCY: f64 = 1024.0;
/// Half an hour: longer than most overload incidents of the API, short enough that a session
/// stuck behind a real outage ends the same working session.
const DEFAULT_OUTAGE_TOLERANCE_S: f64 = 1800.0;
/// A day: an engine is redeployed or restarted well within it.
const DEFAULT_RESUME_INTERRUPTED_S: f64 = 86_400.0;
const MAX_OUTPUT_RETRIES: f64 = 10.0;

#[derive(Debug, Clone)]
pub struct AdapterConfig {
    pub repo_root: PathBuf,
    pub default_branch: String,
    pub context_paths: Vec<String>,
    /// `None` = no limit (`maxAgentDuration: 0`).
    pub max_agent_duration: Option<Duration>,
    /// `Some(dir)` when `logging.agentSessions` is on.
    pub logs_dir: Option<PathBuf>,
    pub claude_executable: Option<PathBuf>,
    pub env: Vec<(String, String)>,
    pub model: Option<String>,
    /// `None` skips the step.
    pub worktree_setup_command: Option<Vec<String>>,
    /// Bound on the setup command (`ERR_PROVISION` past it).
    pub worktree_setup_timeout: Duration,
    /// Bound on reading an Implementor's work out of its checkout, and on saving a dead
    /// session's (`ERR_EXTRACT` past it).
    pub extraction_timeout: Duration,
    pub context_concurrency: usize,
    /// Where to look for `node_modules/@anthropic-ai/claude-agent-sdk-<platform>`.
    pub cli_search_roots: Vec<PathBuf>,
    /// Bound on one context callback (`ERR_CONTEXT` past it).
    pub context_call_timeout: Duration,
    /// Bound on one Bash validator answer (the command is blocked past it).
    pub hook_timeout: Duration,
    /// Follow-up turns the agent gets to fix semantic violations of its output.
    pub output_retries: u32,
    /// The OS sandbox for agent commands; `None` = `sandbox: false` (knowingly off).
    pub sandbox: Option<SandboxConfig>,
    /// Where sessions run (`backend`): this machine (the default) or one pod per session.
    pub backend: BackendConfig,
    /// `sharedBase`: sandboxed Implementors on one commit work in copy-on-write layers over
    /// one checkout made (and set up) once; false: each gets a full clone of its own.
    pub shared_base: bool,
    /// `apiOutageTolerance`: how long one API outage may last before the session fails; the
    /// relay holds requests through it and a CLI that ended on it is resumed (zero: off).
    pub api_outage_tolerance: Duration,
    /// `fleetPacing`: every session's model requests to one account paced together.
    pub fleet_pacing: bool,
    /// `resumeInterrupted`: an Implementor interrupted with its engine (killed, crashed, shut
    /// down) is continued by the next session on its branch within this of its last step;
    /// `None` (`0`): never, its work is saved as a patch and the next session starts afresh.
    pub resume_interrupted: Option<Duration>,
    /// `maxBudgetUsd`: the model spend a session may pass only by its last request; `None`
    /// (`0` or absent): no budget. `params.maxBudgetUsd` wins over it.
    pub max_budget_usd: Option<f64>,
    /// The price table with `modelPrices` over it, which every session's spend is counted at.
    pub prices: Prices,
    /// `audit`: a hash-chained record of each session in `audit.dir`, sealed with
    /// `audit.signingKey` when given; `None`: no record.
    pub audit: Option<AuditConfig>,
}

/// `config.backend`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BackendConfig {
    /// `"local"` or absent: each session in a clone on this machine.
    #[default]
    Local,
    /// `{ kubernetes: {...} }`: each session in a pod of its own.
    Kubernetes(Box<KubernetesConfig>),
}

/// `config.sandbox` when on (the default, `{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Hosts agent commands may reach (nothing else).
    pub allowed_domains: Vec<String>,
    /// Extra absolute paths agent sessions may write.
    pub allow_write: Vec<PathBuf>,
    /// Extra absolute paths agent sessions may read.
    pub allow_read: Vec<PathBuf>,
    /// What one session may use of the host (`sandbox.limits`).
    pub limits: Limits,
    /// Features of the model API that reach out on the agent's behalf, allowed through the
    /// relay (`sandbox.serverTools`); none by default.
    pub server_tools: Vec<ServerTool>,
}

/// A feature of the model API that makes the API's servers contact other hosts, for the agent:
/// what `sandbox.serverTools` may allow. Each opens a way past the egress allowlist, to any
/// host the agent names, carrying any data it puts in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerTool {
    /// `web_search`: the API searches the web (the CLI's WebSearch tool).
    WebSearch,
    /// `web_fetch`: the API fetches any URL.
    WebFetch,
    /// `code_execution`: the API runs code in a container of its own, with network access.
    CodeExecution,
    /// `mcp_servers`: the API connects to the MCP servers the request names (the MCP connector).
    McpServers,
}

impl ServerTool {
    /// Every value, with its name in `sandbox.serverTools`.
    pub const ALL: [(&'static str, ServerTool); 4] = [
        ("web_search", ServerTool::WebSearch),
        ("web_fetch", ServerTool::WebFetch),
        ("code_execution", ServerTool::CodeExecution),
        ("mcp_servers", ServerTool::McpServers),
    ];

    /// Its name in `sandbox.serverTools`.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("", |(n, _)| n)
    }
}

/// `config.sandbox.limits`: per session, enforced by the kernel; `None` = no limit (`0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory (RAM, the session's tmpfs files included) for all its processes.
    pub memory: Option<u64>,
    /// Tasks (processes and threads) alive at once.
    pub tasks: Option<u64>,
    /// Bytes each private tmpfs (`/tmp`, HOME, `/dev/shm`) holds.
    pub tmpfs: Option<u64>,
    /// Bytes the session may add on the engine's disk (its checkout's writes, the CLI's config
    /// dir), see [`crate::disk`].
    pub disk: Option<u64>,
    /// How much of the engine's filesystem sessions never take (`sandbox.limits.diskFloorMiB`).
    pub disk_floor: DiskFloor,
}

/// `sandbox.limits.diskFloorMiB`: the free space sessions leave the filesystem holding
/// `<repoRoot>/.worktrees`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFloor {
    /// Absent: the larger of 2 GiB and 5 % of the filesystem ([`crate::disk::floor_bytes`]).
    Default,
    /// `0`: no floor.
    Off,
    /// Bytes.
    Bytes(u64),
}

const MIB: u64 = 1024 * 1024;

/// The defaults: 4 GiB holds the CLI (a few hundred MB) plus a typical build or test run
/// (compilers, bundlers, test workers); 1024 tasks is far above what a build with one worker
/// per core starts (each a dozen threads) and far below what takes a host down; 1 GiB of /tmp
/// holds build scratch and package caches but not a runaway writer, and is RAM the memory
/// limit counts anyway. No disk bound per session (what a build writes ranges from megabytes to
/// tens of gigabytes: no one number fits), but the floor, which keeps the host's disk from
/// filling whatever the sessions write.
impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory: Some(4096 * MIB),
            tasks: Some(1024),
            tmpfs: Some(1024 * MIB),
            disk: None,
            disk_floor: DiskFloor::Default,
        }
    }
}

/// The ranges of `sandbox.limits` (besides `0`, no limit): below the minimums the CLI itself
/// cannot run (its runtime alone takes a few dozen threads and over 100 MiB); the maximums are
/// 16 TiB, the kernel's largest pid count, and 1 TiB.
const MEMORY_MIB: (f64, f64) = (128.0, 16_777_216.0);
const TASKS: (f64, f64) = (32.0, 4_194_304.0);
const TMPFS_MIB: (f64, f64) = (1.0, 1_048_576.0);
/// `diskMiB`: below 64 MiB the CLI's own config dir (its conversation) would soon pass it; the
/// floor from 1 MiB; both at most 1 PiB.
const DISK_MIB: (f64, f64) = (64.0, 1_073_741_824.0);
const DISK_FLOOR_MIB: (f64, f64) = (1.0, 1_073_741_824.0);

/// Operator overrides of two bounds, in milliseconds (also how the tests reach the "never
/// settles" paths quickly); they win over the config fields.
pub const CONTEXT_TIMEOUT_ENV: &str = "CLAUDE_RUNTIME_ADAPTER_CONTEXT_TIMEOUT_MS";
pub const HOOK_TIMEOUT_ENV: &str = "CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS";

fn env_override(var: &str) -> Option<Duration> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0 && *ms as f64 <= MAX_SECONDS * 1000.0)
        .map(Duration::from_millis)
}

/// Every problem found in a config, so one error names them all (an engine fixing its config
/// should not discover the problems one attempt at a time).
#[derive(Debug, Default)]
pub struct Problems(Vec<String>);

impl Problems {
    pub fn add(&mut self, field: &str, why: impl std::fmt::Display) {
        self.0.push(format!("config.{field} {why}"));
    }

    /// A problem found outside the data fields (a callback that is not a function).
    pub fn push(&mut self, message: String) {
        self.0.push(message);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_error(self) -> AdapterError {
        AdapterError::invalid_params(self.0.join("; "))
    }
}

/// True when `p` is relative and cannot leave the directory it is joined to.
pub fn is_contained_relative(p: &str) -> bool {
    let path = Path::new(p);
    if p.is_empty() || path.is_absolute() || path.has_root() {
        return false;
    }
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Reads typed fields of the JS config object, recording a problem for each bad one.
struct Reader<'a> {
    obj: &'a Map<String, Value>,
    problems: &'a mut Problems,
    /// The path of `obj` in the config (`""` at the top, `"backend.kubernetes."` inside it),
    /// so every problem names the field in full.
    prefix: &'a str,
}

impl Reader<'_> {
    fn add(&mut self, key: &str, why: impl std::fmt::Display) {
        self.problems.add(&format!("{}{key}", self.prefix), why);
    }

    fn string(&mut self, key: &str) -> String {
        match self.obj.get(key) {
            Some(Value::String(s)) => s.clone(),
            _ => {
                self.add(key, "must be a string");
                String::new()
            }
        }
    }

    /// A string when given; an empty one is a problem (it names nothing).
    fn opt_string(&mut self, key: &str) -> Option<String> {
        match self.obj.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::String(_)) => {
                self.add(key, "must be a non-empty string when given");
                None
            }
            Some(_) => {
                self.add(key, "must be a string when given");
                None
            }
        }
    }

    fn strings(&mut self, key: &str, v: Option<&Value>) -> Vec<String> {
        let Some(items) = v.and_then(Value::as_array) else {
            self.add(key, "must be an array of strings");
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, s) in items.iter().enumerate() {
            match s.as_str() {
                Some(s) => out.push(s.to_string()),
                None => self.add(&format!("{key}[{i}]"), "must be a string"),
            }
        }
        out
    }

    /// A boolean, `default` when absent.
    fn flag(&mut self, key: &str, default: bool) -> bool {
        match self.obj.get(key) {
            None | Some(Value::Null) => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                self.add(key, format!("must be true or false (got {v})"));
                default
            }
        }
    }

    /// A positive duration in seconds (fractions allowed), `default` when absent.
    fn seconds(&mut self, key: &str, default: f64) -> f64 {
        self.number(key, Some(default), 0.001, MAX_SECONDS, false)
    }

    /// An integer in `[lo, hi]`, `default` when absent.
    fn count(&mut self, key: &str, default: f64, lo: f64, hi: f64) -> f64 {
        self.number(key, Some(default), lo, hi, true)
    }

    /// A limit: `0` (none) or an integer in `[lo, hi]`, times `unit`; `default` when absent.
    /// `name` is the field's full path for the problem.
    fn limit(
        &mut self,
        key: &str,
        name: &str,
        default: Option<u64>,
        (lo, hi): (f64, f64),
        unit: u64,
    ) -> Option<u64> {
        let v = match self.obj.get(key) {
            None | Some(Value::Null) => return default,
            Some(v) => v.as_f64(),
        };
        match v {
            Some(0.0) => None,
            Some(n) if n >= lo && n <= hi && n.fract() == 0.0 => Some(n as u64 * unit),
            other => {
                let got = other.map_or_else(|| describe(self.obj.get(key)), |n| n.to_string());
                self.add(
                    name,
                    format!("must be 0 (no limit) or an integer in [{lo}, {hi}] (got {got})"),
                );
                default
            }
        }
    }

    /// A number in `[lo, hi]` (an integer when `integer`); `default` when absent. NaN,
    /// infinities, negatives and out-of-range values are problems naming the allowed range.
    fn number(&mut self, key: &str, default: Option<f64>, lo: f64, hi: f64, integer: bool) -> f64 {
        let v = match (self.obj.get(key), default) {
            (None | Some(Value::Null), Some(d)) => return d,
            (Some(v), _) => v.as_f64(),
            (None, None) => None,
        };
        let kind = if integer { "an integer" } else { "a number" };
        match v {
            Some(n) if n >= lo && n <= hi && (!integer || n.fract() == 0.0) => n,
            other => {
                let got = other.map_or_else(|| describe(self.obj.get(key)), |n| n.to_string());
                self.add(key, format!("must be {kind} in [{lo}, {hi}] (got {got})"));
                default.unwrap_or(lo)
            }
        }
    }
}

/// How a non-number arrived (NaN and ±Infinity arrive as their names, see `binding::js`).
fn describe(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(Value::String(s)) if matches!(s.as_str(), "NaN" | "inf" | "-inf") => {
            s.replace("inf", "Infinity")
        }
        Some(v) => format!("{v}"),
    }
}

fn seconds(n: f64) -> Duration {
    Duration::from_secs_f64(n)
}

/// Validates the data fields of the JS config (functions are checked by the binding, which
/// adds its problems to the same list). `setup_given` tells an explicit
/// `worktreeSetupCommand: null` (skip) from an absent one (default).
pub fn parse_config(
    v: &Value,
    setup_given: bool,
    cli_search_roots: Vec<PathBuf>,
    problems: &mut Problems,
) -> Option<AdapterConfig> {
    let Some(obj) = v.as_object() else {
        problems.push("config must be an object".into());
        return None;
    };
    let mut r = Reader {
        obj,
        problems,
        prefix: "",
    };
    let repo_root = r.string("repoRoot");
    let default_branch = r.string("defaultBranch");
    let root = check_repository(&repo_root, &default_branch, r.problems);
    let context_paths = r.strings("contextPaths", obj.get("contextPaths"));
    for (i, p) in context_paths.iter().enumerate() {
        if !is_contained_relative(p) {
            r.problems.add(
                &format!("contextPaths[{i}]"),
                format!("must be a relative path inside repoRoot (got {p:?})"),
            );
        }
    }
    let max = r.number("maxAgentDuration", None, 0.0, MAX_SECONDS, false);
    let logs_dir = logging(obj.get("logging"), r.problems);
    let worktree_setup_command = setup_command(&mut r, setup_given);
    let setup_timeout = r.seconds("worktreeSetupTimeout", DEFAULT_SETUP_TIMEOUT_S);
    let extraction_timeout = r.seconds("extractionTimeout", DEFAULT_EXTRACTION_TIMEOUT_S);
    let concurrency = r.count(
        "contextConcurrency",
        DEFAULT_CONTEXT_CONCURRENCY,
        1.0,
        MAX_CONCURRENCY,
    );
    let call_timeout = r.seconds("contextCallbackTimeout", DEFAULT_CALL_TIMEOUT_S);
    let hook_timeout = r.seconds("hookTimeout", DEFAULT_CALL_TIMEOUT_S);
    let retries = r.count(
        "outputRetries",
        DEFAULT_OUTPUT_RETRIES,
        0.0,
        MAX_OUTPUT_RETRIES,
    );
    let claude_executable = r.opt_string("claudeExecutable").map(PathBuf::from);
    let model = r.opt_string("model");
    let env = env_vars(obj.get("env"), r.problems);
    let sandbox = sandbox(obj.get("sandbox"), r.problems);
    let mut backend = kubernetes::backend(obj.get("backend"), r.problems);
    if let (BackendConfig::Kubernetes(k), Some(disk)) =
        (&mut backend, sandbox.as_ref().and_then(|s| s.limits.disk))
    {
        kubernetes::disk_limit(k, disk, r.problems);
    }
    let shared_base = r.flag("sharedBase", true);
    let outage_tolerance = r.number(
        "apiOutageTolerance",
        Some(DEFAULT_OUTAGE_TOLERANCE_S),
        0.0,
        MAX_SECONDS,
        false,
    );
    let fleet_pacing = r.flag("fleetPacing", true);
    let resume_interrupted = r.number(
        "resumeInterrupted",
        Some(DEFAULT_RESUME_INTERRUPTED_S),
        0.0,
        MAX_SECONDS,
        false,
    );
    let (max_budget_usd, prices) = budget::budget(&mut r, sandbox.as_ref(), &backend);
    let audit = audit(obj.get("audit"), r.problems);
    if !problems.is_empty() {
        return None;
    }
    Some(AdapterConfig {
        repo_root: root?,
        default_branch,
        context_paths,
        max_agent_duration: (max > 0.0).then(|| seconds(max)),
        logs_dir,
        claude_executable,
        env,
        model,
        worktree_setup_command,
        worktree_setup_timeout: seconds(setup_timeout),
        extraction_timeout: seconds(extraction_timeout),
        context_concurrency: concurrency as usize,
        cli_search_roots,
        context_call_timeout: env_override(CONTEXT_TIMEOUT_ENV)
            .unwrap_or_else(|| seconds(call_timeout)),
        hook_timeout: env_override(HOOK_TIMEOUT_ENV).unwrap_or_else(|| seconds(hook_timeout)),
        output_retries: retries as u32,
        sandbox,
        backend,
        shared_base,
        api_outage_tolerance: seconds(outage_tolerance),
        fleet_pacing,
        resume_interrupted: (resume_interrupted > 0.0).then(|| seconds(resume_interrupted)),
        max_budget_usd,
        prices,
        audit,
    })
}

/// `repoRoot` is an absolute path of a git repository in which `defaultBranch` names a commit.
fn check_repository(
    repo_root: &str,
    default_branch: &str,
    problems: &mut Problems,
) -> Option<PathBuf> {
    let root = PathBuf::from(repo_root);
    if repo_root.is_empty() || !root.is_absolute() {
        problems.add(
            "repoRoot",
            format!("must be an absolute path (got {repo_root:?})"),
        );
        return None;
    }
    if !root.is_dir() {
        problems.add(
            "repoRoot",
            format!("{} does not exist or is not a directory", root.display()),
        );
        return None;
    }
    let repo = match git2::Repository::open(&root) {
        Ok(r) => r,
        Err(e) => {
            problems.add(
                "repoRoot",
                format!(
                    "{} is not a git repository: {}",
                    root.display(),
                    e.message()
                ),
            );
            return None;
        }
    };
    if default_branch.trim().is_empty() {
        problems.add("defaultBranch", "must be a non-empty branch name");
    } else if repo
        .revparse_single(&format!("{default_branch}^{{commit}}"))
        .is_err()
    {
        problems.add(
            "defaultBranch",
            format!(
                "{default_branch:?} does not name a commit in {}",
                root.display()
            ),
        );
    }
    Some(root)
}

fn logging(v: Option<&Value>, problems: &mut Problems) -> Option<PathBuf> {
    let Some(logging) = v.and_then(Value::as_object) else {
        problems.add("logging", "must be an object { agentSessions, logsDir }");
        return None;
    };
    let Some(on) = logging.get("agentSessions").and_then(Value::as_bool) else {
        problems.add("logging.agentSessions", "must be a boolean");
        return None;
    };
    match (on, logging.get("logsDir")) {
        (false, None | Some(Value::Null | Value::String(_))) => None,
        (false, Some(_)) => {
            problems.add("logging.logsDir", "must be a string");
            None
        }
        (true, Some(Value::String(s))) if !s.is_empty() => match std::path::absolute(s) {
            Ok(p) => Some(p),
            Err(e) => {
                problems.add("logging.logsDir", e);
                None
            }
        },
        (true, _) => {
            problems.add(
                "logging.logsDir",
                "must be a directory path when logging.agentSessions is true",
            );
            None
        }
    }
}

fn setup_command(r: &mut Reader<'_>, setup_given: bool) -> Option<Vec<String>> {
    match r.obj.get("worktreeSetupCommand") {
        _ if !setup_given => Some(vec!["yarn".to_string(), "install".to_string()]),
        None | Some(Value::Null) => None,
        Some(v) => {
            let argv = r.strings("worktreeSetupCommand", Some(v));
            if argv.first().is_none_or(String::is_empty) {
                r.problems.add(
                    "worktreeSetupCommand",
                    "must be null or a non-empty argv array",
                );
            }
            Some(argv)
        }
    }
}

fn env_vars(v: Option<&Value>, problems: &mut Problems) -> Vec<(String, String)> {
    let m = match v {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            problems.add("env", "must be an object of strings");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (k, v) in m {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            problems.add("env", format!("has an invalid variable name {k:?}"));
        }
        match v.as_str() {
            Some(s) if !s.contains('\0') => out.push((k.clone(), s.to_string())),
            _ => problems.add(&format!("env.{k}"), "must be a string without NUL"),
        }
    }
    out
}

/// `audit`: absent or null = no record; else `{ dir, signingKey? }`, `dir` an absolute path (made
/// when missing) and `signingKey` a PEM PKCS#8 Ed25519 private key.
fn audit(v: Option<&Value>, problems: &mut Problems) -> Option<AuditConfig> {
    let obj = match v {
        None | Some(Value::Null) => return None,
        Some(Value::Object(o)) => o,
        Some(_) => {
            problems.add("audit", "must be an object { dir, signingKey? }");
            return None;
        }
    };
    for k in obj
        .keys()
        .filter(|k| !matches!(k.as_str(), "dir" | "signingKey"))
    {
        problems.add(
            &format!("audit.{k}"),
            "is not a field of audit (dir, signingKey)",
        );
    }
    let dir = match obj.get("dir") {
        Some(Value::String(d)) if Path::new(d).is_absolute() => Some(PathBuf::from(d)),
        other => {
            problems.add(
                "audit.dir",
                format!("must be an absolute directory path (got {})", shown(other)),
            );
            None
        }
    };
    let key = match obj.get("signingKey") {
        None | Some(Value::Null) => None,
        Some(Value::String(pem)) => match SigningKey::from_pem(pem) {
            Ok(k) => Some(std::sync::Arc::new(k)),
            Err(e) => {
                problems.add("audit.signingKey", e);
                None
            }
        },
        Some(_) => {
            problems.add(
                "audit.signingKey",
                "must be a PEM PKCS#8 Ed25519 private key (a string)",
            );
            None
        }
    };
    Some(AuditConfig { dir: dir?, key })
}

/// A bad value as a message shows it: JSON, cut short.
fn shown(v: Option<&Value>) -> String {
    let text = v.map_or_else(|| "nothing".to_string(), Value::to_string);
    text.chars().take(80).collect()
}

/// `sandbox`: absent or `{}` = on with defaults; `false` = off; anything else is a problem.
fn sandbox(v: Option<&Value>, problems: &mut Problems) -> Option<SandboxConfig> {
    let obj = match v {
        None | Some(Value::Null) => return Some(SandboxConfig::default()),
        Some(Value::Bool(false)) => return None,
        Some(Value::Object(o)) => o,
        Some(_) => {
            problems.add(
                "sandbox",
                "must be false or an object { allowedDomains?, allowWrite?, allowRead?, serverTools?, limits? }",
            );
            return None;
        }
    };
    let mut r = Reader {
        obj,
        problems,
        prefix: "",
    };
    let mut cfg = SandboxConfig::default();
    if obj.get("allowedDomains").is_some_and(|v| !v.is_null()) {
        cfg.allowed_domains = r.strings("sandbox.allowedDomains", obj.get("allowedDomains"));
        for (i, d) in cfg.allowed_domains.iter().enumerate() {
            if !is_domain_pattern(d) {
                r.problems.add(
                    &format!("sandbox.allowedDomains[{i}]"),
                    format!("must be a host name or *.domain pattern, optionally with :port (got {d:?})"),
                );
            }
        }
    }
    cfg.allow_write = absolute_paths(&mut r, "allowWrite");
    cfg.allow_read = absolute_paths(&mut r, "allowRead");
    if obj.get("serverTools").is_some_and(|v| !v.is_null()) {
        for (i, name) in r
            .strings("sandbox.serverTools", obj.get("serverTools"))
            .into_iter()
            .enumerate()
        {
            match ServerTool::ALL.iter().find(|(n, _)| *n == name) {
                Some((_, tool)) => cfg.server_tools.push(*tool),
                None => r.problems.add(
                    &format!("sandbox.serverTools[{i}]"),
                    format!(
                        "must be one of {} (got {name:?})",
                        ServerTool::ALL.map(|(n, _)| n).join(", ")
                    ),
                ),
            }
        }
    }
    cfg.limits = limits(obj.get("limits"), r.problems);
    Some(cfg)
}

/// `sandbox.limits`: absent = the defaults; each field absent = its default, `0` = no limit.
fn limits(v: Option<&Value>, problems: &mut Problems) -> Limits {
    let d = Limits::default();
    let obj = match v {
        None | Some(Value::Null) => return d,
        Some(Value::Object(o)) => o,
        Some(_) => {
            problems.add(
                "sandbox.limits",
                "must be an object { memoryMiB?, processes?, tmpMiB?, diskMiB?, diskFloorMiB? }",
            );
            return d;
        }
    };
    let mut r = Reader {
        obj,
        problems,
        prefix: "",
    };
    Limits {
        memory: r.limit(
            "memoryMiB",
            "sandbox.limits.memoryMiB",
            d.memory,
            MEMORY_MIB,
            MIB,
        ),
        tasks: r.limit("processes", "sandbox.limits.processes", d.tasks, TASKS, 1),
        tmpfs: r.limit("tmpMiB", "sandbox.limits.tmpMiB", d.tmpfs, TMPFS_MIB, MIB),
        disk: r.limit("diskMiB", "sandbox.limits.diskMiB", d.disk, DISK_MIB, MIB),
        disk_floor: match obj.get("diskFloorMiB") {
            None | Some(Value::Null) => DiskFloor::Default,
            Some(_) => r
                .limit(
                    "diskFloorMiB",
                    "sandbox.limits.diskFloorMiB",
                    None,
                    DISK_FLOOR_MIB,
                    MIB,
                )
                .map_or(DiskFloor::Off, DiskFloor::Bytes),
        },
    }
}

/// `sandbox.<key>`: absent, or a list of absolute paths.
fn absolute_paths(r: &mut Reader<'_>, key: &str) -> Vec<PathBuf> {
    let v = r.obj.get(key).filter(|v| !v.is_null());
    if v.is_none() {
        return Vec::new();
    }
    let name = format!("sandbox.{key}");
    let mut out = Vec::new();
    for (i, p) in r.strings(&name, v).into_iter().enumerate() {
        if Path::new(&p).is_absolute() {
            out.push(PathBuf::from(p));
        } else {
            r.problems.add(
                &format!("{name}[{i}]"),
                format!("must be an absolute path (got {p:?})"),
            );
        }
    }
    out
}

/// `example.com`, `127.0.0.1`, `*.example.com`: letters, digits, `-`, `.`, an optional leading
/// `*.`; no scheme, port, path or whitespace.
fn is_domain_pattern(d: &str) -> bool {
    // `host:port` admits that port only (a bare host: 80 and 443).
    let d = match d.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok_and(|p| p > 0) => host,
        Some(_) => return false,
        None => d,
    };
    let host = d.strip_prefix("*.").unwrap_or(d);
    !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !host.starts_with('.')
        && !host.ends_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_domains_may_name_a_port() {
        for ok in [
            "example.com",
            "*.example.com:8443",
            "127.0.0.1:3000",
            "h:65535",
        ] {
            assert!(is_domain_pattern(ok), "{ok}");
        }
        for bad in ["h:0", "h:65536", "h:x", "h:", ":80", "h:80:80", "[::1]:80"] {
            assert!(!is_domain_pattern(bad), "{bad}");
        }
    }

    #[test]
    fn sandbox_server_tools_are_none_by_default_and_each_unknown_one_is_named() {
        let mut problems = Problems::default();
        let none = sandbox(Some(&serde_json::json!({})), &mut problems).unwrap();
        assert!(none.server_tools.is_empty());
        let v = serde_json::json!({ "serverTools": ["web_search", "mcp_servers", "browser"] });
        let cfg = sandbox(Some(&v), &mut problems).unwrap();
        assert_eq!(
            cfg.server_tools,
            vec![ServerTool::WebSearch, ServerTool::McpServers]
        );
        let msg = problems.into_error().message;
        assert!(
            msg.contains("config.sandbox.serverTools[2] must be one of web_search, web_fetch, code_execution, mcp_servers (got \"browser\")"),
            "{msg}"
        );
    }

    #[test]
    fn sandbox_paths_must_be_absolute_and_each_bad_one_is_named() {
        let mut problems = Problems::default();
        let v = serde_json::json!({ "allowRead": ["/opt/specs", "rel/x"], "allowWrite": ["/tmp/out", "../y"] });
        let cfg = sandbox(Some(&v), &mut problems).unwrap();
        assert_eq!(cfg.allow_read, vec![PathBuf::from("/opt/specs")]);
        assert_eq!(cfg.allow_write, vec![PathBuf::from("/tmp/out")]);
        let msg = problems.into_error().message;
        assert!(
            msg.contains("config.sandbox.allowRead[1] must be an absolute path"),
            "{msg}"
        );
        assert!(
            msg.contains("config.sandbox.allowWrite[1] must be an absolute path"),
            "{msg}"
        );
        let mut none = Problems::default();
        let cfg = sandbox(Some(&serde_json::json!({})), &mut none).unwrap();
        assert!(none.is_empty() && cfg.allow_read.is_empty() && cfg.allow_write.is_empty());
    }

    #[test]
    fn sandbox_limits_have_defaults_zero_means_none_and_every_bad_one_is_named_with_its_range() {
        let parse = |v: Value| {
            let mut problems = Problems::default();
            let cfg = sandbox(Some(&v), &mut problems).unwrap();
            (cfg.limits, problems)
        };
        let (d, none) = parse(serde_json::json!({}));
        assert!(none.is_empty());
        assert_eq!(d, Limits::default());
        assert_eq!(
            (d.memory, d.tasks, d.tmpfs),
            (Some(4096 * MIB), Some(1024), Some(1024 * MIB))
        );
        assert_eq!((d.disk, d.disk_floor), (None, DiskFloor::Default));
        let (l, none) = parse(serde_json::json!({ "limits": {
            "memoryMiB": 0, "processes": 200, "tmpMiB": 8, "diskMiB": 1024, "diskFloorMiB": 512
        } }));
        assert!(none.is_empty());
        assert_eq!(
            (l.memory, l.tasks, l.tmpfs, l.disk, l.disk_floor),
            (
                None,
                Some(200),
                Some(8 * MIB),
                Some(1024 * MIB),
                DiskFloor::Bytes(512 * MIB)
            )
        );
        let (l, _) = parse(serde_json::json!({ "limits": { "diskMiB": 0, "diskFloorMiB": 0 } }));
        assert_eq!((l.disk, l.disk_floor), (None, DiskFloor::Off));
        let (_, problems) = parse(serde_json::json!({ "limits": {
            "memoryMiB": 64, "processes": 1.5, "tmpMiB": "NaN", "diskMiB": 63, "diskFloorMiB": -1
        } }));
        let msg = problems.into_error().message;
        for expected in [
            "config.sandbox.limits.memoryMiB must be 0 (no limit) or an integer in [128, 16777216] (got 64)",
            "config.sandbox.limits.processes must be 0 (no limit) or an integer in [32, 4194304] (got 1.5)",
            "config.sandbox.limits.tmpMiB must be 0 (no limit) or an integer in [1, 1048576] (got NaN)",
            "config.sandbox.limits.diskMiB must be 0 (no limit) or an integer in [64, 1073741824] (got 63)",
            "config.sandbox.limits.diskFloorMiB must be 0 (no limit) or an integer in [1, 1073741824] (got -1)",
        ] {
            assert!(msg.contains(expected), "{msg}");
        }
        let (_, problems) = parse(serde_json::json!({ "limits": 5 }));
        assert!(problems.into_error().message.contains(
            "config.sandbox.limits must be an object { memoryMiB?, processes?, tmpMiB?, diskMiB?, diskFloorMiB? }"
        ));
    }

    #[test]
    fn contained_relative_paths() {
        assert!(is_contained_relative(".claude/CLAUDE.md"));
        assert!(is_contained_relative("a/../b"));
        assert!(!is_contained_relative("../x"));
        assert!(!is_contained_relative("a/../../x"));
        assert!(!is_contained_relative("/etc/passwd"));
        assert!(!is_contained_relative(""));
    }
}
