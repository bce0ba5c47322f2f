//! `AgentRunHandle` in JS: `output` as a native async iterator, `result` as a promise that is
//! marked handled at birth (an engine that awaits it late still gets the rejection, and Node
//! never reports it unhandled), and `abortSignal` from a real `AbortController`, aborted with
//! `'cancelled'` or `'timeout'` before `result` rejects for that cause.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::error::to_napi;
use crate::claude::session::StopReason;
use crate::error::ErrorCode;
use crate::lifecycle::StartedSession;
use crate::output::OutputBuffer;

/// The live text of one session. Breaking out of `for await` stops delivery, not the agent.
#[napi(async_iterator)]
pub struct OutputStream {
    buffer: Arc<OutputBuffer>,
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
        let buffer = self.buffer.clone();
        async move { Ok(buffer.next().await) }
    }

    fn complete(
        &mut self,
        _value: Option<()>,
    ) -> impl std::future::Future<Output = Result<Option<String>>> + Send + 'static {
        self.buffer.detach();
        async move { Ok(None) }
    }
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
    } = started;
    let ctor: Function<(), Unknown> = env.get_global()?.get_named_property("AbortController")?;
    let controller = ctor.new_instance(())?.coerce_to_object()?;
    let signal: Object = controller.get_named_property("signal")?;
    let controller = controller.create_ref::<false>()?;
    let promise = env.spawn_future_with_callback(
        async move {
            // The sender only goes away without a result if the session's task panicked.
            Ok(result.await.unwrap_or_else(|_| {
                Err(crate::error::AdapterError::new(
                    ErrorCode::Internal,
                    "the session ended without reporting a result (its task panicked; a bug in claude-runtime-adapter)",
                ))
            }))
        },
        move |env: &Env,
              outcome: std::result::Result<serde_json::Value, crate::error::AdapterError>|
              -> Result<serde_json::Value> {
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
    // Mark the original promise handled; `handle.result` is the original, so an engine that
    // awaits it (even late) still sees the rejection.
    let _ = promise.catch(|_ctx: CallbackContext<Unknown>| Ok(()))?;

    let mut handle = Object::new(env)?;
    handle.set("sessionID", session_id)?;
    handle.set("output", OutputStream { buffer: output })?;
    handle.set("result", promise)?;
    handle.set(
        "logFilePath",
        log_file_path.map(|p| p.display().to_string()),
    )?;
    handle.set("abortSignal", signal)?;
    Ok(handle)
}
