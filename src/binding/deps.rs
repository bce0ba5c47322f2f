//! The engine's JS callbacks behind the core's `Deps`, `BashHook` and `Logger` traits. Every
//! callback is a weak threadsafe function (it never holds the process open) called with
//! `call_async_catch` (a synchronous throw becomes an `Err`, not a fatal exception). The reply
//! is read as data here; its shape is checked by the core's `from_json` with errors naming the
//! callback and field. Timeouts, cancellation and concurrency limits are the core's (it races
//! every await), so nothing here can wait forever.

use std::sync::Arc;

use futures::future::BoxFuture;
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use serde_json::{json, Value};

use super::js::{Json, MaybePromise};
use crate::deps::{BashHook, Deps, HookDecision, LogLevel, Logger};
use crate::domain::{from_json, EngineState, ReviewHistory, RevisionFile};
use crate::error::{AdapterError, Result as CoreResult};

/// Every JS callback: weak, not callee-handled, returning a value or a promise of one.
pub type JsCallback<Args> = ThreadsafeFunction<Args, MaybePromise<Json>, Args, Status, false, true>;

/// A function-valued property of `obj`, bound to `obj` so a provider's methods see `this`.
pub fn method<Args: JsValuesTupleIntoVec + 'static>(
    obj: &Object,
    key: &str,
    what: &str,
) -> std::result::Result<JsCallback<Args>, String> {
    let f: Function<Args, MaybePromise<Json>> = obj
        .get_named_property::<Function<Args, MaybePromise<Json>>>(key)
        .map_err(|_| format!("{what} must be a function"))?;
    let bound = f.bind(obj).map_err(|e| format!("{what}: {}", e.reason))?;
    bound
        .build_threadsafe_function::<Args>()
        .weak::<true>()
        .callee_handled::<false>()
        .build()
        .map_err(|e| format!("{what}: {}", e.reason))
}

async fn call<Args: JsValuesTupleIntoVec + Send + 'static>(
    f: &JsCallback<Args>,
    args: Args,
    what: String,
) -> CoreResult<Value> {
    let failed =
        |e: Error| AdapterError::context(format!("{what} failed: {}", e.reason)).with_cause(e);
    let pending = f.call_async_catch(args).await.map_err(failed)?;
    let Json(value) = pending.settle().await.map_err(failed)?;
    value.map_err(|e| {
        AdapterError::context(format!("{what} returned a value that cannot be read: {e}"))
    })
}

fn shape<T>(what: &str, parsed: std::result::Result<T, String>) -> CoreResult<T> {
    parsed.map_err(|e| AdapterError::context(format!("{what} returned the wrong shape: {e}")))
}

pub struct JsDeps {
    pub get_state: Arc<JsCallback<()>>,
    pub get_work_item_body: Arc<JsCallback<String>>,
    pub get_revision_files: Arc<JsCallback<String>>,
    pub get_review_history: Arc<JsCallback<String>>,
}

impl Deps for JsDeps {
    fn get_state(&self) -> BoxFuture<'static, CoreResult<EngineState>> {
        let f = self.get_state.clone();
        Box::pin(async move {
            let v = call(&f, (), "getState()".into()).await?;
            shape("getState()", from_json::engine_state(&v))
        })
    }

    fn get_work_item_body(&self, id: String) -> BoxFuture<'static, CoreResult<String>> {
        let f = self.get_work_item_body.clone();
        Box::pin(async move {
            let what = format!("workItemReader.getWorkItemBody({id:?})");
            match call(&f, id, what.clone()).await? {
                Value::String(s) => Ok(s),
                _ => Err(AdapterError::context(format!(
                    "{what} returned the wrong shape: the body must be a string"
                ))),
            }
        })
    }

    fn get_revision_files(
        &self,
        revision_id: String,
    ) -> BoxFuture<'static, CoreResult<Vec<RevisionFile>>> {
        let f = self.get_revision_files.clone();
        Box::pin(async move {
            let what = format!("revisionReader.getRevisionFiles({revision_id:?})");
            let v = call(&f, revision_id, what.clone()).await?;
            shape(&what, from_json::revision_files(&v))
        })
    }

    fn get_review_history(
        &self,
        revision_id: String,
    ) -> BoxFuture<'static, CoreResult<ReviewHistory>> {
        let f = self.get_review_history.clone();
        Box::pin(async move {
            let what = format!("getReviewHistory({revision_id:?})");
            let v = call(&f, revision_id, what.clone()).await?;
            shape(&what, from_json::review_history(&v))
        })
    }
}

/// `config.bashValidatorHook` in JS. Anything but `{decision:'approve'}`, `undefined` or
/// `{decision:'block', reason}` is an error, and the session blocks on errors (fail closed).
pub struct JsHook(pub Arc<JsCallback<Value>>);

impl BashHook for JsHook {
    fn validate(
        &self,
        tool_name: String,
        tool_input: Value,
    ) -> BoxFuture<'static, CoreResult<HookDecision>> {
        let f = self.0.clone();
        Box::pin(async move {
            let event = json!({ "tool_name": tool_name, "tool_input": tool_input });
            let answer = call(&f, event, "bashValidatorHook".into()).await?;
            parse_hook_answer(&answer).map_err(|e| {
                AdapterError::context(format!("bashValidatorHook answered nonsense: {e}"))
            })
        })
    }
}

pub fn parse_hook_answer(v: &Value) -> std::result::Result<HookDecision, String> {
    match v {
        Value::Null => Ok(HookDecision::Approve),
        Value::Object(m) => match m.get("decision").and_then(Value::as_str) {
            Some("approve") => Ok(HookDecision::Approve),
            Some("block") => match m.get("reason") {
                Some(Value::String(reason)) => Ok(HookDecision::Block {
                    reason: reason.clone(),
                }),
                _ => Err("a 'block' decision must carry a string reason".into()),
            },
            _ => Err(format!(
                "expected {{decision: 'approve'}} or {{decision: 'block', reason}}, got {v}"
            )),
        },
        other => Err(format!("expected an object or undefined, got {other}")),
    }
}

pub type LogFn = JsCallback<FnArgs<(String, Value)>>;

/// `config.logger`. Fire and forget: a logger that throws is ignored, never fatal.
pub struct JsLogger {
    pub debug: LogFn,
    pub info: LogFn,
    pub warn: Option<LogFn>,
    pub error: LogFn,
}

impl Logger for JsLogger {
    fn log(&self, level: LogLevel, message: &str, data: Value) {
        let f = match level {
            LogLevel::Debug => &self.debug,
            LogLevel::Info => &self.info,
            // `warn` is optional in the Logger interface; `info` carries warnings otherwise.
            LogLevel::Warn => self.warn.as_ref().unwrap_or(&self.info),
            LogLevel::Error => &self.error,
        };
        f.call_with_return_value(
            FnArgs::from((message.to_string(), data)),
            ThreadsafeFunctionCallMode::NonBlocking,
            |_, _| Ok(()),
        );
    }
}
