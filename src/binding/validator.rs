//! `validateBashCommand` and `createBashValidatorHook`: the shared Bash rule set for JS.
//!
//! The hook is a native function (no JS source) that returns an already-settled promise, so it
//! is async for its callers without a thread hop. It never throws and never rejects: anything it
//! cannot read is a block decision (fail closed). It carries a Node-API type tag so the adapter
//! can recognise it and run [`crate::bash_validator::NativeBashHook`] instead of calling back into
//! JS; JS cannot forge a type tag. A non-enumerable, read-only `__nativeBashValidator: true`
//! property says the same thing to JS readers (tests, debugging) but is not what Rust trusts.
//!
//! Strings cross Node-API as UTF-8: a lone UTF-16 surrogate in a command arrives as U+FFFD,
//! which no rule treats differently from the surrogate (neither is white space or a word
//! character), so decisions are unchanged; only a quoted word in a message shows U+FFFD.

use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;
use serde_json::{json, Value};

use crate::bash_validator::{self, INVALID_EVENT_REASON};
use crate::deps::HookDecision;

/// The type tag on every function `createBashValidatorHook` returns (a random constant).
pub const NATIVE_HOOK_TYPE_TAG: sys::napi_type_tag = sys::napi_type_tag {
    lower: 0x5a1e_b7c4_93d2_4f06,
    upper: 0xb45d_0c61_e2a8_7f13,
};

/// The JS-visible marker property (informational; see the module comment).
pub const NATIVE_HOOK_PROPERTY: &str = "__nativeBashValidator";

/// Whether `value` is a hook made by `createBashValidatorHook` (checks the type tag, so a JS
/// function that merely copies the marker property does not pass).
pub fn is_native_bash_validator_hook(value: &Unknown) -> bool {
    if !matches!(value.get_type(), Ok(ValueType::Function)) {
        return false;
    }
    let mut tagged = false;
    // SAFETY: the handles belong to the current call; the tag is a static.
    let status = unsafe {
        sys::napi_check_object_type_tag(
            value.env(),
            value.raw(),
            &NATIVE_HOOK_TYPE_TAG,
            &mut tagged,
        )
    };
    status == sys::Status::napi_ok && tagged
}

/// Check one Bash command against the shared rule set.
#[napi(
    ts_args_type = "command: string",
    ts_return_type = "{ allowed: true } | { allowed: false; reason: string }"
)]
pub fn validate_bash_command(command: String) -> Value {
    match bash_validator::validate_bash_command(&command) {
        Ok(()) => json!({ "allowed": true }),
        Err(reason) => json!({ "allowed": false, "reason": reason }),
    }
}

/// The shared rule set as a `PreToolUse` hook: Bash commands are validated natively, other
/// tools approved.
#[napi(ts_return_type = "BashValidatorHook")]
pub fn create_bash_validator_hook(env: &Env) -> Result<Unknown<'_>> {
    let hook = env.create_function_from_closure::<Unknown, _, _>("bashValidatorHook", |ctx| {
        let event = if ctx.length() > 0 {
            ctx.get::<Unknown>(0).ok()
        } else {
            None
        };
        let decision = match event {
            Some(event) => decide(ctx.env, &event),
            None => block(INVALID_EVENT_REASON),
        };
        PromiseRaw::<'static, Value>::resolve(ctx.env, answer(decision))
    })?;
    let raw = hook.raw();
    // SAFETY: `raw` is the function just created in this env; the tag is a static.
    unsafe {
        check_status!(sys::napi_type_tag_object(
            env.raw(),
            raw,
            &NATIVE_HOOK_TYPE_TAG
        ))?;
    }
    define_marker(env, raw)?;
    // SAFETY: same handle, returned as a plain value.
    Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), raw) })
}

fn define_marker(env: &Env, target: sys::napi_value) -> Result<()> {
    let mut value = std::ptr::null_mut();
    // SAFETY: plain Node-API calls on handles of this env; the name is a NUL-terminated static.
    unsafe {
        check_status!(sys::napi_get_boolean(env.raw(), true, &mut value))?;
        let property = sys::napi_property_descriptor {
            utf8name: c"__nativeBashValidator".as_ptr(),
            name: std::ptr::null_mut(),
            method: None,
            getter: None,
            setter: None,
            value,
            // Not writable, enumerable or configurable: the marker cannot be removed or changed.
            attributes: sys::PropertyAttributes::default,
            data: std::ptr::null_mut(),
        };
        check_status!(sys::napi_define_properties(env.raw(), target, 1, &property))
    }
}

fn block(reason: &str) -> HookDecision {
    HookDecision::Block {
        reason: reason.to_owned(),
    }
}

fn answer(decision: HookDecision) -> Value {
    match decision {
        HookDecision::Approve => json!({ "decision": "approve" }),
        HookDecision::Block { reason } => json!({ "decision": "block", "reason": reason }),
    }
}

/// Reads only `tool_name` and `tool_input.command` (never the whole event: it may be large,
/// cyclic or hold values JSON cannot carry). A property read that throws (a getter, a proxy)
/// leaves a pending exception; it is cleared and the event blocks.
fn decide(env: &Env, event: &Unknown) -> HookDecision {
    let read = || -> Result<HookDecision> {
        let Some(event) = as_object(event)? else {
            return Ok(block(INVALID_EVENT_REASON));
        };
        let Some(tool_name) = string_property(&event, "tool_name")? else {
            return Ok(block(INVALID_EVENT_REASON));
        };
        if tool_name != "Bash" {
            return Ok(HookDecision::Approve);
        }
        let command = match event.get::<Unknown>("tool_input")? {
            Some(input) => match as_object(&input)? {
                Some(input) => string_property(&input, "command")?,
                None => None,
            },
            None => None,
        };
        // The core decides, so a missing command blocks with the same reason as in Rust.
        let tool_input = command.map_or_else(|| json!({}), |c| json!({ "command": c }));
        Ok(bash_validator::hook_decision(&tool_name, &tool_input))
    };
    read().unwrap_or_else(|e| {
        clear_pending_exception(env);
        block(&format!(
            "Blocked: the hook event could not be read: {}",
            e.reason
        ))
    })
}

fn as_object<'a>(value: &Unknown<'a>) -> Result<Option<Object<'a>>> {
    Ok(match value.get_type()? {
        // SAFETY: checked to be an object (functions are not events).
        ValueType::Object => Some(unsafe { value.cast::<Object>() }?),
        _ => None,
    })
}

fn string_property(object: &Object, key: &str) -> Result<Option<String>> {
    match object.get::<Unknown>(key)? {
        Some(value) if value.get_type()? == ValueType::String => {
            // SAFETY: checked to be a string of this env.
            Ok(Some(unsafe {
                String::from_napi_value(value.env(), value.raw())
            }?))
        }
        _ => Ok(None),
    }
}

fn clear_pending_exception(env: &Env) {
    let mut pending = false;
    // SAFETY: plain Node-API calls on this env; the exception value is dropped.
    unsafe {
        if sys::napi_is_exception_pending(env.raw(), &mut pending) == sys::Status::napi_ok
            && pending
        {
            let mut exception = std::ptr::null_mut();
            sys::napi_get_and_clear_last_exception(env.raw(), &mut exception);
        }
    }
}
