//! `AgentRunHandle` in JS: `output` as an async iterable whose every iteration is a fresh
//! native reader replaying from the first chunk, `result` as a promise that is
//! marked handled at birth (an engine that awaits it late still gets the rejection, and Node
//! never reports it unhandled), and `abortSignal` from a real `AbortController`, aborted with
//! `'cancelled'` or `'timeout'` before `result` rejects for that cause.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::error::to_napi;
use crate::claude::session::StopReason;
use crate::error::{AdapterError, ErrorCode, Result as CoreResult};
use crate::lifecycle::StartedSession;
use crate::output::{OutputBuffer, OutputReader};
use crate::stats::SessionStats;

/// One reader of a session's live text. Breaking out of `for await` ends this reader only,
/// not the other readers and not the agent.
#[napi(async_iterator)]
pub struct OutputStream {
    reader: OutputReader,
}

#[napi]
impl AsyncGenerator for OutputStream {
    type Yield = String;
    type Next = ();
    type Return = ();

    fn next(
        &mut self,
        _value: Option<()>,
    ) -> impl std::future::Future<Output = Result<Option<String>>> + Send + 'static {
        let reader = self.reader.clone();
        async move { Ok(reader.next().await) }
    }

    fn complete(
        &mut self,
        _value: Option<()>,
    ) -> impl std::future::Future<Output = Result<Option<String>>> + Send + 'static {
        self.reader.detach();
        async move { Ok(None) }
    }
}

fn async_iterator_symbol<'env>(env: &'env Env) -> Result<Unknown<'env>> {
    // `Symbol` is a function, which the checked getter would refuse as an `Object`.
    let symbol: Object = env.get_global()?.get_named_property_unchecked("Symbol")?;
    symbol.get_named_property("asyncIterator")
}

/// `handle.output`: `{ [Symbol.asyncIterator]() }` making a new [`OutputStream`] per call, so
/// each `for await` starts from the first chunk. (A napi async-iterator instance hands every
/// `for await` the same underlying generator, which would split the text between readers.)
fn output_iterable<'env>(env: &'env Env, buffer: Arc<OutputBuffer>) -> Result<Object<'env>> {
    let factory =
        env.create_function_from_closure::<(), Unknown, _>("asyncIterator", move |ctx| {
            let env: &Env = ctx.env;
            let stream = OutputStream {
                reader: buffer.reader(),
            };
            // Through `ToNapiValue`, which (unlike `into_instance`) installs the instance's
            // `Symbol.asyncIterator`.
            // SAFETY: `env` is the live env of this call; the value is used within it.
            let raw = unsafe { OutputStream::to_napi_value(env.raw(), stream)? };
            let object = Object::from_raw(env.raw(), raw);
            let iterate: Function<(), Unknown> =
                object.get_property_unchecked(async_iterator_symbol(env)?)?;
            iterate.apply(object, ())
        })?;
    let mut iterable = Object::new(env)?;
    iterable.set_property(async_iterator_symbol(env)?, factory)?;
    Ok(iterable)
}

fn abort(env: &Env, controller: &ObjectRef<false>, reason: StopReason) -> Result<()> {
    let controller = controller.get_value(env)?;
    let abort: Function<String, Unknown> = controller.get_named_property("abort")?;
    abort.apply(controller, reason.as_str().to_string())?;
    Ok(())
}

/// The handle. Its `abortSignal` is aborted only from `result`'s settlement, right before a
/// rejection for a stop: a cancel that arrives after the agent's outcome was settled (during
/// patch extraction or cleanup) changes nothing, so the two never disagree.
pub fn build<'env>(env: &'env Env, started: StartedSession) -> Result<Object<'env>> {
    let StartedSession {
        session_id,
        output,
        result,
        log_file_path,
        audit_record_path,
    } = started;
    let ctor: Function<(), Unknown> = env.get_global()?.get_named_property("AbortController")?;
    let controller = ctor.new_instance(())?.coerce_to_object()?;
    let signal: Object = controller.get_named_property("signal")?;
    let controller = controller.create_ref::<false>()?;
    // One settlement feeds both promises: `result`, then `stats` (also for failed and
    // cancelled sessions). The sender only goes away unsettled if the session's task panicked.
    let (stats_tx, stats_rx) = tokio::sync::oneshot::channel();
    let settled = async move {
        match result.await {
            Ok((outcome, stats)) => {
                let _ = stats_tx.send(Ok(stats));
                outcome
            }
            Err(_) => {
                let e = AdapterError::new(
                    ErrorCode::Internal,
                    "the session ended without reporting a result (its task panicked; a bug in claude-runtime-adapter)",
                );
                let _ = stats_tx.send(Err(e.clone()));
                Err(e)
            }
        }
    };
    let promise = env.spawn_future_with_callback(
        async move { Ok(settled.await) },
        move |env: &Env, outcome: CoreResult<serde_json::Value>| -> Result<serde_json::Value> {
            match outcome {
                Ok(value) => Ok(value),
                Err(e) => {
                    let reason = match e.code {
                        ErrorCode::Cancelled => Some(StopReason::Cancelled),
                        ErrorCode::Timeout => Some(StopReason::Timeout),
                        _ => None,
                    };
                    if let Some(reason) = reason {
                        abort(env, &controller, reason)?;
                    }
                    Err(to_napi(env, &e))
                }
            }
        },
    )?;
    let stats = env.spawn_future_with_callback(
        async move {
            Ok(stats_rx.await.unwrap_or_else(|_| {
                Err(AdapterError::new(
                    ErrorCode::Internal,
                    "the session's stats were lost",
                ))
            }))
        },
        |env: &Env, stats: CoreResult<SessionStats>| -> Result<serde_json::Value> {
            let stats = stats.map_err(|e| to_napi(env, &e))?;
            serde_json::to_value(stats).map_err(|e| Error::from_reason(e.to_string()))
        },
    )?;
    // Mark the original promises handled; the handle holds the originals, so an engine that
    // awaits them (even late) still sees a rejection.
    let _ = promise.catch(|_ctx: CallbackContext<Unknown>| Ok(()))?;
    let _ = stats.catch(|_ctx: CallbackContext<Unknown>| Ok(()))?;

    let mut handle = Object::new(env)?;
    handle.set("sessionID", session_id)?;
    handle.set("output", output_iterable(env, output)?)?;
    handle.set("result", promise)?;
    handle.set(
        "logFilePath",
        log_file_path.map(|p| p.display().to_string()),
    )?;
    handle.set(
        "auditRecordPath",
        audit_record_path.map(|p| p.display().to_string()),
    )?;
    handle.set("abortSignal", signal)?;
    handle.set("stats", stats)?;
    Ok(handle)
}
