//! Reading untrusted JS values: a callback's return value that may or may not be a promise,
//! and shapes checked in Rust with errors that name the callback and the field.

use std::cell::Cell;
use std::rc::Rc;

use futures::channel::oneshot::{self, Receiver};
use napi::bindgen_prelude::*;
use napi::sys;
use serde_json::Value;

/// A callback's return value: the value itself or a promise of it (`getState` may return
/// either; the engine's providers are async).
pub enum MaybePromise<T: FromNapiValue + 'static> {
    Ready(T),
    Pending(Receiver<Result<T>>),
}

/// Why a promise's reply never came although it neither resolved nor rejected: nothing held
/// it, or a way to settle it, so the garbage collector took it with the reactions that would
/// have answered (a `new Promise(() => {})` can go at the next full collection). napi's own
/// `Promise` calls this "oneshot canceled".
const COLLECTED_UNSETTLED: &str =
    "the promise it returned was garbage-collected unsettled, so it can never answer";

impl<T: FromNapiValue + 'static> FromNapiValue for MaybePromise<T> {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        let mut is_promise = false;
        // SAFETY: env and value come from napi for this call.
        unsafe {
            check_status!(sys::napi_is_promise(env, value, &mut is_promise))?;
            Ok(if is_promise {
                MaybePromise::Pending(settled(PromiseRaw::<T>::from_napi_value(env, value)?)?)
            } else {
                MaybePromise::Ready(T::from_napi_value(env, value)?)
            })
        }
    }
}

impl<T: FromNapiValue + 'static> MaybePromise<T> {
    pub async fn settle(self) -> Result<T> {
        match self {
            MaybePromise::Ready(v) => Ok(v),
            MaybePromise::Pending(reply) => reply
                .await
                .unwrap_or_else(|_| Err(Error::new(Status::GenericFailure, COLLECTED_UNSETTLED))),
        }
    }
}

/// The receiving end of a promise's settlement, as napi's `Promise` reads it, but with the
/// sender dropped unsent (the promise collected unsettled) left for `settle` to name.
fn settled<T: FromNapiValue + 'static>(promise: PromiseRaw<T>) -> Result<Receiver<Result<T>>> {
    let (tx, rx) = oneshot::channel();
    // Both reactions run on the JS thread, at most one of them ever.
    let on_value = Rc::new(Cell::new(Some(tx)));
    let on_error = on_value.clone();
    promise
        .then(move |ctx| {
            if let Some(tx) = on_value.take() {
                let _ = tx.send(Ok(ctx.value));
            }
            Ok(())
        })?
        .catch(move |ctx: CallbackContext<Unknown>| {
            if let Some(tx) = on_error.take() {
                // Any value may be thrown, a primitive included: read without coercion.
                let _ = tx.send(Err(Error::from_unknown_without_coercion(ctx.value)));
            }
            Ok(())
        })?;
    Ok(rx)
}

/// A JS value read as JSON, where a conversion problem is data, not an `Err`: the only `Err`
/// a callback call can then produce is the JS error it threw or rejected with (the `cause`).
/// `Map`s become arrays of `[key, value]` pairs and plain objects stay objects (in key order
/// via `pairs`), so the engine's Maps are accepted wherever the spec indexes objects.
pub struct Json(pub std::result::Result<Value, String>);

impl FromNapiValue for Json {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        // SAFETY: forwarded napi handles.
        // The `Map` constructor is looked up once per reply, not once per object in it.
        let read = || -> Result<Value> {
            let map_ctor: Function<Unknown, Unknown> =
                Env::from_raw(env).get_global()?.get_named_property("Map")?;
            // SAFETY: forwarded napi handles; map_ctor is a live function value of this env.
            unsafe { to_json(env, value, map_ctor.raw()) }
        };
        Ok(Json(read().map_err(|e| e.reason)))
    }
}

unsafe fn type_of(env: sys::napi_env, value: sys::napi_value) -> Result<ValueType> {
    let mut t = 0;
    // SAFETY: forwarded napi handles.
    unsafe { check_status!(sys::napi_typeof(env, value, &mut t))? };
    Ok(ValueType::from(t))
}

unsafe fn is_map(
    env: sys::napi_env,
    value: sys::napi_value,
    map_ctor: sys::napi_value,
) -> Result<bool> {
    let mut result = false;
    // SAFETY: forwarded napi handles.
    unsafe { check_status!(sys::napi_instanceof(env, value, map_ctor, &mut result))? };
    Ok(result)
}

/// JSON of a JS value, with `Map` → `[[k, v], …]` at any depth and `undefined` → `null`.
unsafe fn to_json(
    env: sys::napi_env,
    value: sys::napi_value,
    map_ctor: sys::napi_value,
) -> Result<Value> {
    // SAFETY: every handle below comes from napi calls on this env during this callback.
    unsafe {
        match type_of(env, value)? {
            ValueType::Undefined | ValueType::Null => Ok(Value::Null),
            ValueType::Boolean => Ok(Value::Bool(bool::from_napi_value(env, value)?)),
            ValueType::Number => {
                let n = f64::from_napi_value(env, value)?;
                // JSON has no NaN or Infinity; they arrive as their names so a check can name
                // them (as `null` they would pass for an absent optional number).
                Ok(serde_json::Number::from_f64(n)
                    .map(Value::Number)
                    .unwrap_or_else(|| Value::String(n.to_string())))
            }
            ValueType::String => Ok(Value::String(String::from_napi_value(env, value)?)),
            ValueType::Object => {
                let mut is_array = false;
                check_status!(sys::napi_is_array(env, value, &mut is_array))?;
                if is_array || is_map(env, value, map_ctor)? {
                    let items = if is_array {
                        value
                    } else {
                        let env_ = Env::from_raw(env);
                        // `Array` is a function; read it as one and use it as the `this` of `from`.
                        let array: Unknown = env_.get_global()?.get_named_property("Array")?;
                        let array = array.coerce_to_object()?;
                        let from: Function<Unknown, Unknown> = array.get_named_property("from")?;
                        from.apply(array, Unknown::from_raw_unchecked(env, value))?
                            .raw()
                    };
                    let mut len = 0u32;
                    check_status!(sys::napi_get_array_length(env, items, &mut len))?;
                    let mut out = Vec::with_capacity(len as usize);
                    for i in 0..len {
                        let mut el = std::ptr::null_mut();
                        check_status!(sys::napi_get_element(env, items, i, &mut el))?;
                        out.push(to_json(env, el, map_ctor)?);
                    }
                    return Ok(Value::Array(out));
                }
                let mut names = std::ptr::null_mut();
                check_status!(sys::napi_get_property_names(env, value, &mut names))?;
                let mut len = 0u32;
                check_status!(sys::napi_get_array_length(env, names, &mut len))?;
                let mut map = serde_json::Map::new();
                for i in 0..len {
                    let mut key = std::ptr::null_mut();
                    check_status!(sys::napi_get_element(env, names, i, &mut key))?;
                    let mut v = std::ptr::null_mut();
                    check_status!(sys::napi_get_property(env, value, key, &mut v))?;
                    if matches!(type_of(env, v)?, ValueType::Function) {
                        continue;
                    }
                    let k = String::from_napi_value(env, key)?;
                    map.insert(k, to_json(env, v, map_ctor)?);
                }
                Ok(Value::Object(map))
            }
            other => Err(Error::new(
                Status::InvalidArg,
                format!("a {other} value cannot be read as data"),
            )),
        }
    }
}
