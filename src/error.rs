//! Errors are values with a code (the public `ERR_*` table of API.md), a message naming what
//! was wrong, and the original error as `cause` where there is one (a JS callback's own error,
//! a git error). The binding turns them into JS `Error`s with `.code` and `.cause`.

use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidParams,
    DuplicateSession,
    Provision,
    Context,
    AgentDefinition,
    CliNotFound,
    Cancelled,
    Timeout,
    AgentFailed,
    OutputInvalid,
    EmptyPatch,
    Extract,
    SandboxUnavailable,
    ResourceLimit,
    /// The session's model spend passed its `maxBudgetUsd`.
    Budget,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidParams => "ERR_INVALID_PARAMS",
            ErrorCode::DuplicateSession => "ERR_DUPLICATE_SESSION",
            ErrorCode::Provision => "ERR_PROVISION",
            ErrorCode::Context => "ERR_CONTEXT",
            ErrorCode::AgentDefinition => "ERR_AGENT_DEFINITION",
            ErrorCode::CliNotFound => "ERR_CLI_NOT_FOUND",
            ErrorCode::Cancelled => "ERR_CANCELLED",
            ErrorCode::Timeout => "ERR_TIMEOUT",
            ErrorCode::AgentFailed => "ERR_AGENT_FAILED",
            ErrorCode::OutputInvalid => "ERR_OUTPUT_INVALID",
            ErrorCode::EmptyPatch => "ERR_EMPTY_PATCH",
            ErrorCode::Extract => "ERR_EXTRACT",
            ErrorCode::SandboxUnavailable => "ERR_SANDBOX_UNAVAILABLE",
            ErrorCode::ResourceLimit => "ERR_RESOURCE_LIMIT",
            ErrorCode::Budget => "ERR_BUDGET",
            ErrorCode::Internal => "ERR_INTERNAL",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The original error behind an [`AdapterError`]. Shared (`Arc`) so an error can be cloned
/// into several places (a result promise and a log line) without losing its cause.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Clone)]
pub struct AdapterError {
    pub code: ErrorCode,
    pub message: String,
    pub cause: Option<Cause>,
}

impl AdapterError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AdapterError {
            code,
            message: message.into(),
            cause: None,
        }
    }

    pub fn with_cause(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Arc::new(cause));
        self
    }

    pub fn with_shared_cause(mut self, cause: Cause) -> Self {
        self.cause = Some(cause);
        self
    }

    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message)
    }

    pub fn context(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Context, message)
    }

    /// `ERR_EXTRACT`: the work in a checkout could not be read out as a patch.
    pub fn extract(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Extract, message)
    }

    /// A panic caught at a boundary (a bug here, never the engine's fault): `ERR_INTERNAL`
    /// with the panic's message, instead of an abort of the host process.
    pub fn from_panic(what: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        Self::new(
            ErrorCode::Internal,
            format!("internal error in {what}: {text} (a bug in claude-runtime-adapter; please report it)"),
        )
    }
}

impl fmt::Debug for AdapterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(cause) = &self.cause {
            write!(f, " (cause: {cause})")?;
        }
        Ok(())
    }
}

impl fmt::Display for AdapterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for AdapterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

pub type Result<T, E = AdapterError> = std::result::Result<T, E>;
