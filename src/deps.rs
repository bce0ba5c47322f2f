//! The core's view of the engine: the four provider callbacks, the Bash validator hook and the
//! logger. The binding implements these over JS callbacks; Rust tests implement them directly.
//! Implementations only make the call: timeouts, cancellation and concurrency bounds are applied
//! by the caller (see `context::fetch`), so every implementation gets them.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::domain::{EngineState, ReviewHistory, RevisionFile};
use crate::error::Result;

pub trait Deps: Send + Sync + 'static {
    fn get_state(&self) -> BoxFuture<'static, Result<EngineState>>;
    fn get_work_item_body(&self, id: String) -> BoxFuture<'static, Result<String>>;
    fn get_revision_files(
        &self,
        revision_id: String,
    ) -> BoxFuture<'static, Result<Vec<RevisionFile>>>;
    fn get_review_history(&self, revision_id: String) -> BoxFuture<'static, Result<ReviewHistory>>;
}

/// What the Bash validator hook answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookDecision {
    Approve,
    Block { reason: String },
}

pub trait BashHook: Send + Sync + 'static {
    /// `Err` means the hook failed (threw, rejected, answered nonsense): the caller blocks.
    fn validate(
        &self,
        tool_name: String,
        tool_input: Value,
    ) -> BoxFuture<'static, Result<HookDecision>>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

pub trait Logger: Send + Sync + 'static {
    fn log(&self, level: LogLevel, message: &str, data: Value);
}
