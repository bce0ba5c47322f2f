//! `createClaudeAdapter` and the `RuntimeAdapter` class: argument checking and conversion only;
//! the lifecycle is the core's `Adapter`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::deps::{method, JsDeps, JsHook, JsLogger};
use super::error::to_napi;
use super::handle::{self, Controllers};
use super::js::Json;
use super::validator::is_native_bash_validator_hook;
use crate::adapter::Adapter;
use crate::bash_validator::NativeBashHook;
use crate::claude::session::StopReason;
use crate::config::RawConfig;
use crate::deps::BashHook;
use crate::domain::StartParams;
use crate::error::{AdapterError, Result as CoreResult};

#[napi]
pub struct RuntimeAdapter {
    inner: Arc<Adapter>,
    controllers: Controllers,
}

fn invalid(env: &Env, message: String) -> Error {
    to_napi(env, &AdapterError::invalid_params(message))
}

/// The directory of this addon file: the CLI's platform package is looked for in the
/// `node_modules` above it (where npm put this package's optional dependency).
#[cfg(unix)]
fn addon_dir() -> Option<PathBuf> {
    // SAFETY: dladdr only reads loader tables; the address is a function of this library.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addon_dir as *const libc::c_void, &mut info) != 0
            && !info.dli_fname.is_null()
        {
            let path = std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned();
            return PathBuf::from(path).parent().map(|p| p.to_path_buf());
        }
    }
    None
}

#[cfg(not(unix))]
fn addon_dir() -> Option<PathBuf> {
    None
}

fn read_json(value: &Unknown) -> std::result::Result<serde_json::Value, String> {
    // SAFETY: the value belongs to the current call's env.
    unsafe { Json::from_napi_value(value.env(), value.raw()) }
        .map_err(|e| e.reason)?
        .0
}

fn object<'a>(env: &Env, value: &Unknown<'a>, what: &str) -> Result<Object<'a>> {
    if value.get_type()? != ValueType::Object {
        return Err(invalid(env, format!("{what} must be an object")));
    }
    // SAFETY: checked to be an object above.
    unsafe { value.cast::<Object>() }
}

/// Create the adapter for one repository. Throws `ERR_INVALID_PARAMS` naming the field.
#[napi(ts_args_type = "config: ClaudeAdapterConfig, deps: RuntimeAdapterDeps")]
pub fn create_claude_adapter(env: Env, config: Unknown, deps: Unknown) -> Result<RuntimeAdapter> {
    let config_obj = object(&env, &config, "config")?;
    let deps_obj = object(&env, &deps, "deps")?;
    // `null` skips the setup step; absent (or undefined) means the default.
    let setup_given = config_obj.get::<Unknown>("worktreeSetupCommand")?.is_some();
    let data =
        read_json(&config).map_err(|e| invalid(&env, format!("config cannot be read: {e}")))?;
    let raw = RawConfig::from_json(
        &data,
        setup_given,
        crate::claude::locate::search_roots(addon_dir().as_deref()),
    )
    .map_err(|e| to_napi(&env, &e))?;
    let cfg = raw.validate().map_err(|e| to_napi(&env, &e))?;

    let fail = |m: String| invalid(&env, m);
    // The hook `createBashValidatorHook()` makes runs natively: no round trip through JS for
    // every command. Any other function is called as the engine's own hook.
    let hook: Arc<dyn BashHook> = match config_obj.get::<Unknown>("bashValidatorHook")? {
        Some(f) if is_native_bash_validator_hook(&f) => Arc::new(NativeBashHook),
        _ => Arc::new(JsHook(Arc::new(
            method(&config_obj, "bashValidatorHook", "config.bashValidatorHook").map_err(fail)?,
        ))),
    };
    let logger_obj = config_obj
        .get::<Object>("logger")
        .ok()
        .flatten()
        .ok_or_else(|| {
            fail("config.logger must be an object with debug, info and error methods".into())
        })?;
    let warn = match logger_obj.get::<Unknown>("warn")? {
        None => None,
        Some(_) => Some(method(&logger_obj, "warn", "config.logger.warn").map_err(fail)?),
    };
    let logger = JsLogger {
        debug: method(&logger_obj, "debug", "config.logger.debug").map_err(fail)?,
        info: method(&logger_obj, "info", "config.logger.info").map_err(fail)?,
        warn,
        error: method(&logger_obj, "error", "config.logger.error").map_err(fail)?,
    };
    let reader = |key: &str| -> Result<Object> {
        deps_obj
            .get::<Object>(key)
            .ok()
            .flatten()
            .ok_or_else(|| invalid(&env, format!("deps.{key} must be an object")))
    };
    let work_items = reader("workItemReader")?;
    let revisions = reader("revisionReader")?;
    let js_deps = JsDeps {
        get_state: Arc::new(method(&deps_obj, "getState", "deps.getState").map_err(fail)?),
        get_work_item_body: Arc::new(
            method(
                &work_items,
                "getWorkItemBody",
                "deps.workItemReader.getWorkItemBody",
            )
            .map_err(fail)?,
        ),
        get_revision_files: Arc::new(
            method(
                &revisions,
                "getRevisionFiles",
                "deps.revisionReader.getRevisionFiles",
            )
            .map_err(fail)?,
        ),
        get_review_history: Arc::new(
            method(&deps_obj, "getReviewHistory", "deps.getReviewHistory").map_err(fail)?,
        ),
    };
    let inner = Adapter::new(cfg, Arc::new(js_deps), hook, Arc::new(logger));
    // Worktrees a dead engine process left behind are removed before the first session.
    let sweeper = inner.clone();
    napi::bindgen_prelude::block_on(async move { sweeper.sweep_stale_worktrees().await });
    Ok(RuntimeAdapter {
        inner,
        controllers: Rc::new(RefCell::new(HashMap::new())),
    })
}

fn parse_params(params: &Unknown) -> CoreResult<(StartParams, Option<String>)> {
    let v = read_json(params)
        .map_err(|e| AdapterError::invalid_params(format!("params cannot be read: {e}")))?;
    StartParams::from_json(&v).map_err(AdapterError::invalid_params)
}

#[napi]
impl RuntimeAdapter {
    /// Provision (Implementor), assemble the prompt, start the CLI; resolves once the agent runs.
    #[napi(
        ts_args_type = "params: AgentStartParams",
        ts_return_type = "Promise<AgentRunHandle>"
    )]
    pub fn start_agent<'env>(
        &self,
        env: &'env Env,
        params: Unknown<'env>,
    ) -> Result<PromiseRaw<'env, Object<'env>>> {
        let parsed = parse_params(&params);
        let inner = self.inner.clone();
        let controllers = self.controllers.clone();
        env.spawn_future_with_callback(
            async move {
                Ok(match parsed {
                    Ok((p, id)) => inner.start_agent(p, id).await,
                    Err(e) => Err(e),
                })
            },
            move |env: &Env,
                  started: CoreResult<crate::adapter::StartedSession>|
                  -> Result<Object> {
                match started {
                    Ok(s) => handle::build(env, s, &controllers),
                    Err(e) => Err(to_napi(env, &e)),
                }
            },
        )
    }

    /// Stop a running session (`result` rejects with `ERR_CANCELLED`); unknown ids are a no-op.
    #[napi(ts_args_type = "sessionID: string")]
    pub fn cancel_agent(&self, env: Env, session_id: String) -> Result<()> {
        if let Some(c) = self.controllers.borrow().get(&session_id) {
            handle::abort(&env, c, StopReason::Cancelled)?;
        }
        self.inner.cancel(&session_id);
        Ok(())
    }

    /// Cancel every session; resolves when each has settled and been cleaned up.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn shutdown<'env>(&self, env: &'env Env) -> Result<PromiseRaw<'env, ()>> {
        let inner = self.inner.clone();
        env.spawn_future(async move {
            inner.shutdown().await;
            Ok(())
        })
    }

    /// The enriched prompt `startAgent` would send for these params; provisions and runs nothing.
    #[napi(
        ts_args_type = "params: AgentStartParams",
        ts_return_type = "Promise<string>"
    )]
    pub fn preview_prompt<'env>(
        &self,
        env: &'env Env,
        params: Unknown<'env>,
    ) -> Result<PromiseRaw<'env, String>> {
        let parsed = parse_params(&params);
        let inner = self.inner.clone();
        env.spawn_future_with_callback(
            async move {
                Ok(match parsed {
                    Ok((p, id)) => inner.preview_prompt(&p, id).await,
                    Err(e) => Err(e),
                })
            },
            |env: &Env, prompt: CoreResult<String>| -> Result<String> {
                prompt.map_err(|e| to_napi(env, &e))
            },
        )
    }
}
