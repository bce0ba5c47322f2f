//! `createClaudeAdapter` and the `RuntimeAdapter` class: argument checking and conversion only;
//! the lifecycle is the core's `Adapter`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::deps::{method, JsCallback, JsDeps, JsHook, JsLogger};
use super::error::{guard, guarded, injected_panic, to_napi};
use super::handle;
use super::js::Json;
use super::validator::is_native_bash_validator_hook;

use crate::adapter::Adapter;
use crate::bash_validator::NativeBashHook;
use crate::config::{parse_config, Problems, MAX_SECONDS};
use crate::deps::BashHook;
use crate::domain::{StartOptions, StartParams};
use crate::error::{AdapterError, Result as CoreResult};
use crate::git::check_git_version;
use crate::lifecycle::StartedSession;

#[napi]
pub struct RuntimeAdapter {
    inner: Arc<Adapter>,
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

/// Create the adapter for one repository. Throws `ERR_INVALID_PARAMS` naming every bad field.
#[napi(ts_args_type = "config: ClaudeAdapterConfig, deps: RuntimeAdapterDeps")]
pub fn create_claude_adapter(env: Env, config: Unknown, deps: Unknown) -> Result<RuntimeAdapter> {
    guard(&env, "createClaudeAdapter", || {
        injected_panic("createClaudeAdapter");
        create(&env, &config, &deps)
    })
}

fn create(env: &Env, config: &Unknown, deps: &Unknown) -> Result<RuntimeAdapter> {
    let config_obj = object(env, config, "config")?;
    let deps_obj = object(env, deps, "deps")?;
    // `null` skips the setup step; absent (or undefined) means the default.
    let setup_given = config_obj.get::<Unknown>("worktreeSetupCommand")?.is_some();
    let data =
        read_json(config).map_err(|e| invalid(env, format!("config cannot be read: {e}")))?;
    let mut problems = Problems::default();
    let roots = crate::claude::locate::search_roots(addon_dir().as_deref());
    let cfg = parse_config(&data, setup_given, roots, &mut problems);
    let hook = bash_hook(&config_obj, &mut problems)?;
    let logger = js_logger(&config_obj, &mut problems)?;
    let js_deps = js_deps(&deps_obj, &mut problems);
    let (Some(cfg), Some(hook), Some(logger), Some(js_deps), true) =
        (cfg, hook, logger, js_deps, problems.is_empty())
    else {
        return Err(to_napi(env, &problems.into_error()));
    };
    // Once per process: an older git would fail every Implementor start on some option.
    napi::bindgen_prelude::block_on(check_git_version()).map_err(|e| to_napi(env, &e))?;
    if cfg.sandbox.is_none() {
        warn_now(&config_obj, SANDBOX_OFF)?;
    }
    let inner = Adapter::new(cfg, Arc::new(js_deps), hook, Arc::new(logger));
    // Worktrees, pods and temp dirs a dead engine process left behind are removed in the
    // background; the repo's git lock orders the worktree sweep before any provisioning that
    // would race it. What the first session would otherwise wait for is read meanwhile.
    let sweeper = inner.clone();
    napi::bindgen_prelude::spawn(async move {
        tokio::join!(
            sweeper.sweep_stale_worktrees(),
            sweeper.sweep_backend(),
            sweeper.sweep_temp_dirs(),
            sweeper.warm_up()
        );
    });
    Ok(RuntimeAdapter { inner })
}

const SANDBOX_OFF: &str = "the OS sandbox is off (config.sandbox: false): agent sessions can \
    read and (through Bash) write anywhere the engine can and reach any host";

/// Logs a warning through the engine's logger before `createClaudeAdapter` returns (the core's
/// logger is asynchronous): `warn` when the logger has it, else `info`. A throwing logger is
/// ignored, as everywhere.
fn warn_now(config: &Object, message: &str) -> Result<()> {
    let Some(logger) = object_property(config, "logger")? else {
        return Ok(());
    };
    for level in ["warn", "info"] {
        if let Ok(f) =
            logger.get_named_property::<Function<FnArgs<(String, Object)>, Unknown>>(level)
        {
            let env = config.env();
            let data = Object::new(&Env::from_raw(env))?;
            if f.apply(logger, (message.to_string(), data).into()).is_err() {
                // The logger threw: drop its exception so it does not surface as ours.
                let mut thrown = std::ptr::null_mut();
                // SAFETY: the live env of this call; clearing a pending exception is always allowed.
                unsafe { napi::sys::napi_get_and_clear_last_exception(env, &mut thrown) };
            }
            return Ok(());
        }
    }
    Ok(())
}

/// The hook `createBashValidatorHook()` makes runs natively: no round trip through JS for
/// every command. Any other function is called as the engine's own hook.
fn bash_hook(config: &Object, problems: &mut Problems) -> Result<Option<Arc<dyn BashHook>>> {
    Ok(match config.get::<Unknown>("bashValidatorHook")? {
        Some(f) if is_native_bash_validator_hook(&f) => Some(Arc::new(NativeBashHook)),
        _ => match method(config, "bashValidatorHook", "config.bashValidatorHook") {
            Ok(f) => Some(Arc::new(JsHook(Arc::new(f)))),
            Err(e) => {
                problems.push(e);
                None
            }
        },
    })
}

fn js_logger(config: &Object, problems: &mut Problems) -> Result<Option<JsLogger>> {
    let Some(logger) = object_property(config, "logger")? else {
        problems.push("config.logger must be an object with debug, info and error methods".into());
        return Ok(None);
    };
    let log = Some(&logger);
    let debug = callback(log, "debug", "config.logger.debug", problems);
    let info = callback(log, "info", "config.logger.info", problems);
    let error = callback(log, "error", "config.logger.error", problems);
    let warn = match logger.get::<Unknown>("warn")? {
        None => None,
        Some(_) => callback(log, "warn", "config.logger.warn", problems),
    };
    Ok(match (debug, info, error) {
        (Some(debug), Some(info), Some(error)) => Some(JsLogger {
            debug,
            info,
            warn,
            error,
        }),
        _ => None,
    })
}

/// `obj[key]` when it is an object (type-checked first: a failed conversion of `null` would
/// leave a pending JS exception behind).
fn object_property<'a>(obj: &Object<'a>, key: &str) -> Result<Option<Object<'a>>> {
    match obj.get::<Unknown>(key)? {
        Some(v) if v.get_type()? == ValueType::Object => {
            // SAFETY: checked to be an object above.
            Ok(Some(unsafe { v.cast::<Object>() }?))
        }
        _ => Ok(None),
    }
}

/// A callback of the engine, or a recorded problem naming it.
fn callback<Args: JsValuesTupleIntoVec + 'static>(
    obj: Option<&Object>,
    key: &str,
    what: &str,
    problems: &mut Problems,
) -> Option<JsCallback<Args>> {
    method(obj?, key, what).map_err(|e| problems.push(e)).ok()
}

fn js_deps(deps: &Object, problems: &mut Problems) -> Option<JsDeps> {
    let mut reader = |key: &str| {
        let found = object_property(deps, key).ok().flatten();
        if found.is_none() {
            problems.push(format!("deps.{key} must be an object"));
        }
        found
    };
    let work_items = reader("workItemReader");
    let revisions = reader("revisionReader");
    let get_state = callback(Some(deps), "getState", "deps.getState", problems);
    let body = callback(
        work_items.as_ref(),
        "getWorkItemBody",
        "deps.workItemReader.getWorkItemBody",
        problems,
    );
    let files = callback(
        revisions.as_ref(),
        "getRevisionFiles",
        "deps.revisionReader.getRevisionFiles",
        problems,
    );
    let history = callback(
        Some(deps),
        "getReviewHistory",
        "deps.getReviewHistory",
        problems,
    );
    Some(JsDeps {
        get_state: Arc::new(get_state?),
        get_work_item_body: Arc::new(body?),
        get_revision_files: Arc::new(files?),
        get_review_history: Arc::new(history?),
    })
}

fn parse_params(params: &Unknown) -> CoreResult<(StartParams, StartOptions)> {
    let v = read_json(params)
        .map_err(|e| AdapterError::invalid_params(format!("params cannot be read: {e}")))?;
    StartParams::from_json(&v).map_err(|why| {
        // Counted with the sessions' errors: a dispatcher sending bad params shows on the
        // dashboards like any other failure.
        let role = v
            .get("role")
            .and_then(|r| r.as_str())
            .filter(|r| matches!(*r, "planner" | "implementor" | "reviewer"))
            .unwrap_or("unknown");
        let e = AdapterError::invalid_params(why);
        crate::otel::metrics::refused(role, e.code.as_str());
        e
    })
}

/// `shutdown({ graceMs, keepBases })`: the grace period and whether the tip's bases stay for
/// the next process (absent: true; else a boolean).
fn shutdown_options(env: &Env, options: Option<&Unknown>) -> Result<(Duration, bool)> {
    let Some(options) = options.filter(|o| o.get_type().is_ok_and(|t| t == ValueType::Object))
    else {
        return Ok((Duration::ZERO, true));
    };
    // SAFETY: checked to be an object above.
    let obj = unsafe { options.cast::<Object>() }?;
    let keep = match obj.get::<Unknown>("keepBases")? {
        None => true,
        Some(v) if v.get_type()? == ValueType::Undefined => true,
        Some(v) if v.get_type()? == ValueType::Boolean => v.coerce_to_bool()?,
        Some(_) => {
            return Err(invalid(
                env,
                "options.keepBases must be a boolean".to_string(),
            ))
        }
    };
    Ok((grace_period(env, &obj)?, keep))
}

/// `graceMs`: absent = 0 (immediate); else milliseconds in range. Read from the JS value itself
/// so NaN and Infinity are refused by name.
fn grace_period(env: &Env, obj: &Object) -> Result<Duration> {
    let ms = match obj.get::<Unknown>("graceMs")? {
        None => return Ok(Duration::ZERO),
        Some(v) if v.get_type()? == ValueType::Undefined => return Ok(Duration::ZERO),
        Some(v) if v.get_type()? == ValueType::Number => v.coerce_to_number()?.get_double()?,
        Some(_) => f64::NAN,
    };
    let max = MAX_SECONDS * 1000.0;
    if !(0.0..=max).contains(&ms) {
        return Err(invalid(
            env,
            format!("options.graceMs must be a number of milliseconds in [0, {max}] (got {ms})"),
        ));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

/// What `adapter.sessions()` lists.
#[napi(object, js_name = "SessionInfo", use_nullable = true)]
pub struct JsSessionInfo {
    #[napi(js_name = "sessionID")]
    pub session_id: String,
    #[napi(ts_type = "AgentRole")]
    pub role: String,
    #[napi(js_name = "workItemID")]
    pub work_item_id: Option<String>,
    pub branch_name: Option<String>,
    /// epoch milliseconds
    pub started_at: f64,
    /// the CLI's pid once it runs
    pub pid: Option<u32>,
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
        guard(env, "startAgent", || {
            injected_panic("startAgent");
            let parsed = parse_params(&params);
            let inner = self.inner.clone();
            env.spawn_future_with_callback(
                async move {
                    Ok(guarded("startAgent", async move {
                        let (p, options) = parsed?;
                        injected_panic("startAgent.async");
                        inner.start_agent(p, options).await
                    })
                    .await)
                },
                move |env: &Env, started: CoreResult<StartedSession>| -> Result<Object> {
                    match started {
                        Ok(s) => guard(env, "startAgent", || handle::build(env, s)),
                        Err(e) => Err(to_napi(env, &e)),
                    }
                },
            )
        })
    }

    /// Stop a running session (`result` rejects with `ERR_CANCELLED` unless it had already
    /// ended; `abortSignal` follows `result`); unknown ids are a no-op.
    #[napi(ts_args_type = "sessionID: string")]
    pub fn cancel_agent(&self, env: Env, session_id: Unknown) -> Result<()> {
        guard(&env, "cancelAgent", || {
            // Any id the engine passes is looked up; a non-string cannot name a session.
            if let Ok(id) = session_id.coerce_to_string().and_then(|s| s.into_utf8()) {
                self.inner.cancel(id.as_str()?);
            }
            Ok(())
        })
    }

    /// The running sessions, oldest first.
    #[napi]
    pub fn sessions(&self, env: Env) -> Result<Vec<JsSessionInfo>> {
        guard(&env, "sessions", || {
            Ok(self
                .inner
                .sessions()
                .into_iter()
                .map(|s| JsSessionInfo {
                    session_id: s.session_id,
                    role: s.role.as_str().to_string(),
                    work_item_id: s.work_item_id,
                    branch_name: s.branch_name,
                    started_at: s.started_at,
                    pid: s.pid,
                })
                .collect())
        })
    }

    /// Lets sessions finish for up to `graceMs` (default 0), cancels the rest; resolves when
    /// each has settled and been cleaned up. Later starts reject `ERR_CANCELLED`. The checkouts
    /// of the default branch's tip (one per kind) stay for the next adapter, which adopts them
    /// instead of checking out again; `keepBases: false` removes them too (an engine going
    /// away for good).
    #[napi(
        ts_args_type = "options?: { graceMs?: number; keepBases?: boolean }",
        ts_return_type = "Promise<void>"
    )]
    pub fn shutdown<'env>(
        &self,
        env: &'env Env,
        options: Option<Unknown<'env>>,
    ) -> Result<PromiseRaw<'env, ()>> {
        guard(env, "shutdown", || {
            let (grace, keep_bases) = shutdown_options(env, options.as_ref())?;
            let inner = self.inner.clone();
            env.spawn_future_with_callback(
                async move {
                    Ok(guarded("shutdown", async move {
                        inner.shutdown(grace, keep_bases).await;
                        Ok(())
                    })
                    .await)
                },
                |env: &Env, done: CoreResult<()>| done.map_err(|e| to_napi(env, &e)),
            )
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
        guard(env, "previewPrompt", || {
            let parsed = parse_params(&params);
            let inner = self.inner.clone();
            env.spawn_future_with_callback(
                async move {
                    Ok(guarded("previewPrompt", async move {
                        let (p, _) = parsed?;
                        inner.preview_prompt(&p).await
                    })
                    .await)
                },
                |env: &Env, prompt: CoreResult<String>| -> Result<String> {
                    prompt.map_err(|e| to_napi(env, &e))
                },
            )
        })
    }
}
