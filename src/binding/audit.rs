//! `verifyAuditRecord`: the core's [`crate::audit::verify`] off the JS thread.

use napi::bindgen_prelude::*;
use napi_derive::napi;
use serde_json::{json, Value};

use super::error::{guard, guarded, to_napi};
use super::js::Json;
use crate::error::{AdapterError, Result as CoreResult};

/// Checks a session's audit record: the chain, the seal's signature against `publicKey` (a PEM
/// SPKI Ed25519 key), and its patch subject against `patch` (the patch text). A record that
/// fails resolves `ok: false` naming the first bad entry; bad arguments (no such file, a key
/// that is not one) reject `ERR_INVALID_PARAMS`.
#[napi(
    ts_args_type = "path: string, opts?: { publicKey?: string; patch?: string }",
    ts_return_type = "Promise<{ ok: boolean; sealed: boolean; entries: number; firstBad: number | null; reason: string | null }>"
)]
pub fn verify_audit_record<'env>(
    env: &'env Env,
    path: Json,
    opts: Option<Json>,
) -> Result<PromiseRaw<'env, Value>> {
    guard(env, "verifyAuditRecord", || {
        let args = arguments(path, opts);
        env.spawn_future_with_callback(
            async move {
                Ok(guarded("verifyAuditRecord", async move {
                    let (path, key, patch) = args?;
                    tokio::task::spawn_blocking(move || {
                        crate::audit::verify(path.as_ref(), key.as_deref(), patch.as_deref())
                    })
                    .await
                    .map_err(|e| AdapterError::invalid_params(e.to_string()))?
                    .map_err(AdapterError::invalid_params)
                })
                .await)
            },
            |env: &Env, verdict: CoreResult<crate::audit::Verdict>| -> Result<Value> {
                let v = verdict.map_err(|e| to_napi(env, &e))?;
                Ok(json!({
                    "ok": v.ok, "sealed": v.sealed, "entries": v.entries,
                    "firstBad": v.first_bad, "reason": v.reason,
                }))
            },
        )
    })
}

type Arguments = (String, Option<String>, Option<String>);

/// The path and the options, each checked: a wrong type is named.
fn arguments(path: Json, opts: Option<Json>) -> CoreResult<Arguments> {
    let bad = |m: String| AdapterError::invalid_params(m);
    let path = match path.0 {
        Ok(Value::String(p)) if !p.is_empty() => p,
        _ => {
            return Err(bad(
                "verifyAuditRecord: path must be a non-empty string".into()
            ))
        }
    };
    let opts = match opts.map(|o| o.0) {
        None | Some(Ok(Value::Null)) => serde_json::Map::new(),
        Some(Ok(Value::Object(o))) => o,
        _ => {
            return Err(bad(
                "verifyAuditRecord: opts must be an object { publicKey?, patch? }".into(),
            ))
        }
    };
    let field = |k: &str| match opts.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("verifyAuditRecord: opts.{k} must be a string"))),
    };
    Ok((path, field("publicKey")?, field("patch")?))
}
