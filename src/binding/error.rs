//! Core errors → JS `Error`s with `.code` (the API.md table) and `.cause` (the original JS
//! error object where there is one, else an `Error` carrying the underlying message).

use napi::bindgen_prelude::*;

use crate::error::{AdapterError, Result as CoreResult};

pub fn js_error_value<'env>(env: &'env Env, e: &AdapterError) -> Result<Object<'env>> {
    let ctor: Function<String, Object> = env.get_global()?.get_named_property("Error")?;
    // The code also leads the message: engines that keep only `error.message` still know it.
    let message = format!("[{}] {}", e.code.as_str(), e.message);
    let mut err = ctor.new_instance(message)?.coerce_to_object()?;
    err.set("code", e.code.as_str())?;
    if let Some(cause) = &e.cause {
        let as_error: &(dyn std::error::Error + 'static) = &**cause;
        if let Some(js) = as_error.downcast_ref::<Error>() {
            // The original JS error object, as thrown or rejected by the engine's callback.
            err.set("cause", js.try_clone()?)?;
        } else if let Some(inner) = as_error.downcast_ref::<AdapterError>() {
            err.set("cause", js_error_value(env, inner)?)?;
        } else {
            err.set("cause", ctor.new_instance(cause.to_string())?)?;
        }
    }
    Ok(err)
}

/// An `Err` that throws (or rejects with) exactly the object built above.
pub fn to_napi(env: &Env, e: &AdapterError) -> Error {
    match js_error_value(env, e) {
        Ok(obj) => Error::from(obj.to_unknown()),
        Err(fallback) => Error::new(Status::GenericFailure, format!("{e} ({})", fallback.reason)),
    }
}

/// Runs a napi entry point's body; a panic becomes a thrown `ERR_INTERNAL` instead of unwinding
/// into Node (which aborts the whole engine process).
pub fn guard<T>(env: &Env, what: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(payload) => Err(to_napi(env, &AdapterError::from_panic(what, &*payload))),
    }
}

/// The same for the async part of an entry point: a panic rejects its promise with
/// `ERR_INTERNAL`.
pub async fn guarded<T>(
    what: &'static str,
    work: impl std::future::Future<Output = CoreResult<T>>,
) -> CoreResult<T> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(work).catch_unwind().await {
        Ok(r) => r,
        Err(payload) => Err(AdapterError::from_panic(what, &*payload)),
    }
}

/// Fault injection for the panic boundary: `CLAUDE_RUNTIME_ADAPTER_PANIC=<entry>` makes that
/// entry point (`createClaudeAdapter`, `startAgent`, `startAgent.async`) panic, so the tests —
/// and an engine checking its own handling of `ERR_INTERNAL` — can see a real panic turned into
/// a rejection. In every build, so the released binary is what is tested.
pub fn injected_panic(entry: &str) {
    if std::env::var("CLAUDE_RUNTIME_ADAPTER_PANIC").is_ok_and(|v| v == entry) {
        panic!("injected panic in {entry} (CLAUDE_RUNTIME_ADAPTER_PANIC)");
    }
}
