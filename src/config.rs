//! The adapter's configuration as the core sees it, and its validation: every problem is an
//! `ERR_INVALID_PARAMS` naming the field, raised by `createClaudeAdapter` before anything runs.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::error::{AdapterError, Result};

pub const DEFAULT_CONTEXT_CONCURRENCY: usize = 16;

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
    pub context_concurrency: usize,
    /// Where to look for `node_modules/@anthropic-ai/claude-agent-sdk-<platform>`.
    pub cli_search_roots: Vec<PathBuf>,
    /// Bound on one context callback (`ERR_CONTEXT` past it).
    pub context_call_timeout: Duration,
    /// Bound on one Bash validator answer (the command is blocked past it).
    pub hook_timeout: Duration,
}

/// Default bounds; each can be tuned through the environment variable named beside it (an
/// operator's knob, and how the tests reach the "never settles" paths in reasonable time).
pub const CONTEXT_CALL_TIMEOUT: (&str, Duration) = (
    "CLAUDE_RUNTIME_ADAPTER_CONTEXT_TIMEOUT_MS",
    Duration::from_secs(30),
);
pub const HOOK_TIMEOUT: (&str, Duration) = (
    "CLAUDE_RUNTIME_ADAPTER_HOOK_TIMEOUT_MS",
    Duration::from_secs(30),
);

fn bound((var, default): (&str, Duration)) -> Duration {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .unwrap_or(default)
}

/// The untrusted inputs as they arrive, before validation.
pub struct RawConfig {
    pub repo_root: String,
    pub default_branch: String,
    pub context_paths: Vec<String>,
    pub max_agent_duration: f64,
    pub agent_sessions_logging: bool,
    pub logs_dir: String,
    pub claude_executable: Option<String>,
    pub env: Vec<(String, String)>,
    pub model: Option<String>,
    /// Outer `None`: not given (default `yarn install`); `Some(None)`: `null`, skip.
    pub worktree_setup_command: Option<Option<Vec<String>>>,
    pub context_concurrency: Option<f64>,
    pub cli_search_roots: Vec<PathBuf>,
}

fn invalid(field: &str, why: impl std::fmt::Display) -> AdapterError {
    AdapterError::invalid_params(format!("config.{field} {why}"))
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

impl RawConfig {
    pub fn validate(self) -> Result<AdapterConfig> {
        let root = PathBuf::from(&self.repo_root);
        if self.repo_root.is_empty() || !root.is_absolute() {
            return Err(invalid(
                "repoRoot",
                format!("must be an absolute path (got {:?})", self.repo_root),
            ));
        }
        if !root.is_dir() {
            return Err(invalid(
                "repoRoot",
                format!("{} does not exist or is not a directory", root.display()),
            ));
        }
        let repo = git2::Repository::open(&root).map_err(|e| {
            invalid(
                "repoRoot",
                format!(
                    "{} is not a git repository: {}",
                    root.display(),
                    e.message()
                ),
            )
            .with_cause(e)
        })?;
        if self.default_branch.trim().is_empty() {
            return Err(invalid("defaultBranch", "must be a non-empty branch name"));
        }
        if repo
            .revparse_single(&format!("{}^{{commit}}", self.default_branch))
            .is_err()
        {
            return Err(invalid(
                "defaultBranch",
                format!(
                    "{:?} does not name a commit in {}",
                    self.default_branch,
                    root.display()
                ),
            ));
        }
        for (i, p) in self.context_paths.iter().enumerate() {
            if !is_contained_relative(p) {
                return Err(invalid(
                    &format!("contextPaths[{i}]"),
                    format!("must be a relative path inside repoRoot (got {p:?})"),
                ));
            }
        }
        let d = self.max_agent_duration;
        if !d.is_finite() || d < 0.0 {
            return Err(invalid(
                "maxAgentDuration",
                format!("must be a number of seconds >= 0 (got {d})"),
            ));
        }
        let logs_dir = if self.agent_sessions_logging {
            if self.logs_dir.is_empty() {
                return Err(invalid(
                    "logging.logsDir",
                    "must be a directory path when logging.agentSessions is true",
                ));
            }
            Some(std::path::absolute(&self.logs_dir).map_err(|e| invalid("logging.logsDir", e))?)
        } else {
            None
        };
        let worktree_setup_command = match self.worktree_setup_command {
            None => Some(vec!["yarn".to_string(), "install".to_string()]),
            Some(None) => None,
            Some(Some(argv)) if argv.is_empty() || argv[0].is_empty() => {
                return Err(invalid(
                    "worktreeSetupCommand",
                    "must be null or a non-empty argv array",
                ));
            }
            Some(Some(argv)) => Some(argv),
        };
        let context_concurrency = match self.context_concurrency {
            None => DEFAULT_CONTEXT_CONCURRENCY,
            Some(n) if n.is_finite() && n >= 1.0 && n.fract() == 0.0 => n as usize,
            Some(n) => {
                return Err(invalid(
                    "contextConcurrency",
                    format!("must be an integer >= 1 (got {n})"),
                ))
            }
        };
        if let Some(m) = &self.model {
            if m.is_empty() {
                return Err(invalid(
                    "model",
                    "must be a non-empty model name when given",
                ));
            }
        }
        if let Some(k) = self
            .env
            .iter()
            .map(|(k, _)| k)
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(invalid(
                "env",
                format!("has an invalid variable name {k:?}"),
            ));
        }
        Ok(AdapterConfig {
            repo_root: root,
            default_branch: self.default_branch,
            context_paths: self.context_paths,
            max_agent_duration: (d > 0.0).then(|| Duration::from_secs_f64(d)),
            logs_dir,
            claude_executable: self
                .claude_executable
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            env: self.env,
            model: self.model,
            worktree_setup_command,
            context_concurrency,
            cli_search_roots: self.cli_search_roots,
            context_call_timeout: bound(CONTEXT_CALL_TIMEOUT),
            hook_timeout: bound(HOOK_TIMEOUT),
        })
    }
}

impl RawConfig {
    /// The data fields of the JS config (functions are taken by the binding). `setup_given`
    /// tells an explicit `worktreeSetupCommand: null` (skip) from an absent one (default).
    pub fn from_json(
        v: &serde_json::Value,
        setup_given: bool,
        cli_search_roots: Vec<PathBuf>,
    ) -> Result<RawConfig> {
        use serde_json::Value;
        let obj = v
            .as_object()
            .ok_or_else(|| AdapterError::invalid_params("config must be an object"))?;
        let string = |key: &str| match obj.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(invalid(key, "must be a string")),
        };
        let opt_string = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(invalid(key, "must be a string when given")),
        };
        let strings = |key: &str, v: &Value| -> Result<Vec<String>> {
            v.as_array()
                .ok_or_else(|| invalid(key, "must be an array of strings"))?
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid(&format!("{key}[{i}]"), "must be a string"))
                })
                .collect()
        };
        let logging = obj
            .get("logging")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("logging", "must be an object { agentSessions, logsDir }"))?;
        let agent_sessions_logging = logging
            .get("agentSessions")
            .and_then(Value::as_bool)
            .ok_or_else(|| invalid("logging.agentSessions", "must be a boolean"))?;
        let logs_dir = match logging.get("logsDir") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) if !agent_sessions_logging => String::new(),
            _ => return Err(invalid("logging.logsDir", "must be a string")),
        };
        let env = match obj.get("env") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|s| (k.clone(), s.to_string()))
                        .ok_or_else(|| invalid(&format!("env.{k}"), "must be a string"))
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(invalid("env", "must be an object of strings")),
        };
        Ok(RawConfig {
            repo_root: string("repoRoot")?,
            default_branch: string("defaultBranch")?,
            context_paths: strings(
                "contextPaths",
                obj.get("contextPaths").unwrap_or(&Value::Null),
            )?,
            max_agent_duration: obj
                .get("maxAgentDuration")
                .and_then(Value::as_f64)
                .ok_or_else(|| {
                    invalid(
                        "maxAgentDuration",
                        "must be a number of seconds (0 = no limit)",
                    )
                })?,
            agent_sessions_logging,
            logs_dir,
            claude_executable: opt_string("claudeExecutable")?,
            env,
            model: opt_string("model")?,
            worktree_setup_command: match obj.get("worktreeSetupCommand") {
                _ if !setup_given => None,
                None | Some(Value::Null) => Some(None),
                Some(v) => Some(Some(strings("worktreeSetupCommand", v)?)),
            },
            context_concurrency: match obj.get("contextConcurrency") {
                None | Some(Value::Null) => None,
                Some(v) => Some(
                    v.as_f64()
                        .ok_or_else(|| invalid("contextConcurrency", "must be a number"))?,
                ),
            },
            cli_search_roots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
