//! Core errors → JS `Error`s with `.code` (the API.md table) and `.cause` (the original JS
//! error object where there is one, else an `Error` carrying the underlying message).

use napi::bindgen_prelude::*;

use crate::error::AdapterError;

pub fn js_error_value<'env>(env: &'env Env, e: &AdapterError) -> Result<Object<'env>> {
    let ctor: Function<String, Object> = env.get_global()?.get_named_property("Error")?;
    let mut err = ctor.new_instance(e.message.clone())?.coerce_to_object()?;
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
