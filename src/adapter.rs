//! `createClaudeAdapter`'s core (napi-free): one `Adapter` per call. What its sessions share —
//! the config, the engine's callbacks, the session registry, the backend — is a
//! [`SessionHost`] it builds and hands to each one (their lifecycle is
//! [`crate::lifecycle::Session`]); the adapter itself keeps what only it does: the sweeps of
//! what dead engines left, `shutdown()`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::claude::session::StopSignal;
use crate::config::{AdapterConfig, BackendConfig};
use crate::context::{self, FetchOptions};
use crate::deps::{BashHook, Deps, LogLevel, Logger};
use crate::domain::{StartOptions, StartParams};
#[cfg(unix)]
use crate::environment::kubernetes::KubernetesBackend;
use crate::environment::{Backend, LocalBackend};
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::RepoGit;
use crate::lifecycle::{self, SessionHost, SessionInfo, StartedSession};
use crate::logging::LogRoute;
use crate::otel;
use crate::params;
use crate::sandbox::GitJails;

pub struct Adapter {
    /// What every session of this adapter shares.
    host: Arc<SessionHost>,
    /// Fired by `shutdown()`: later starts are refused and a sweep still running stops.
    shut_down: CancellationToken,
}

impl Adapter {
    pub fn new(
        config: AdapterConfig,
        deps: Arc<dyn Deps>,
        hook: Arc<dyn BashHook>,
        logger: Arc<dyn Logger>,
    ) -> Arc<Adapter> {
        let log_route = LogRoute::register(logger.clone());
        match otel::configure_from_env() {
            otel::Configured::Nothing => {}
            otel::Configured::Exporting { traces, metrics } => logger.log(
                LogLevel::Info,
                "OpenTelemetry: the adapter exports its own telemetry over OTLP",
                json!({ "traces": traces, "metrics": metrics }),
            ),
            otel::Configured::Refused(why) => logger.log(
                LogLevel::Warn,
                &format!("OpenTelemetry: not exported: {why}"),
                json!({}),
            ),
        }
        let backend: Arc<dyn Backend> = match &config.backend {
            BackendConfig::Local => Arc::new(LocalBackend),
            #[cfg(unix)]
            BackendConfig::Kubernetes(k) => Arc::new(KubernetesBackend::new(
                (**k).clone(),
                pod_deadline(&config),
                config.resume_interrupted,
                crate::environment::kubernetes::Times {
                    agent: config.max_agent_duration,
                    extraction: config.extraction_timeout,
                },
            )),
            // Refused by the config's validation off Unix.
            #[cfg(not(unix))]
            BackendConfig::Kubernetes(_) => Arc::new(LocalBackend),
        };
        Arc::new(Adapter {
            host: Arc::new(SessionHost {
                config,
                deps,
                hook,
                logger,
                registry: Arc::default(),
                backend,
                log_route,
            }),
            shut_down: CancellationToken::new(),
        })
    }

    /// Remove worktrees that a dead engine process left under `.worktrees/`. Runs in the
    /// background (serialized with provisioning by the repository's git lock), so it does not
    /// delay `createClaudeAdapter`; logs what it did. Each checkout's saving is bounded by
    /// `config.extractionTimeout`; `shutdown()` ends the sweep. Checkouts of interrupted
    /// sessions the engine may dispatch again are left until `resumeInterrupted` has passed
    /// since their last step ([`crate::git::interrupted`]); the sweep runs again then.
    pub async fn sweep_stale_worktrees(&self) {
        let repo = RepoGit::for_repo(&self.host.config.repo_root);
        let within = self.host.config.resume_interrupted;
        loop {
            self.sweep_once(&repo, within).await;
            let Some(within) = within else { return };
            let Some(until) = repo.interrupted_until(within).await else {
                return;
            };
            let wait = until
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::select! {
                _ = tokio::time::sleep(wait + Duration::from_secs(1)) => {}
                _ = self.shut_down.cancelled() => return,
            }
        }
    }

    async fn sweep_once(&self, repo: &RepoGit, within: Option<Duration>) {
        let swept = repo.sweep_stale(
            self.host.config.extraction_timeout,
            within,
            &GitJails,
            &self.shut_down,
        );
        match swept.instrument(self.host.log_route.span()).await {
            Ok(removed) => self.host.logger.log(
                if removed.is_empty() { LogLevel::Debug } else { LogLevel::Info },
                "swept worktrees left by processes that are gone",
                json!({
                    "paths": removed.iter().map(|s| s.path.display().to_string()).collect::<Vec<_>>(),
                    "patches": removed.iter().filter_map(|s| s.patch.as_ref()).map(|p| p.display().to_string()).collect::<Vec<_>>(),
                }),
            ),
            Err(e) => self.host.logger.log(
                LogLevel::Warn,
                "could not sweep stale worktrees",
                json!({ "error": e.to_string() }),
            ),
        }
    }

    /// Remove the temp directories (sockets, history servers, patch scratch repositories) of
    /// adapters whose engine process is gone; logged.
    pub async fn sweep_temp_dirs(&self) {
        let Ok(removed) = tokio::task::spawn_blocking(crate::scratch::sweep).await else {
            return;
        };
        if !removed.is_empty() {
            self.host.logger.log(
                LogLevel::Info,
                "removed temp directories of adapters whose process is gone",
                json!({ "paths": removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>() }),
            );
        }
    }

    /// Reads now, in the background, what a session's start would otherwise wait for the first
    /// time in this process (the backend's [`Backend::warm_up`]); ended by `shutdown()`. In the
    /// adapter's span, so what it logs (and what the tasks it starts log: the warm pods') reaches
    /// the engine's logger.
    pub async fn warm_up(&self) {
        let env = self.host.cli_env();
        let sandbox = self.host.config.sandbox.as_ref();
        let warm = self
            .host
            .backend
            .warm_up(&env, sandbox)
            .instrument(self.host.log_route.span());
        tokio::select! {
            () = warm => {}
            () = self.shut_down.cancelled() => {}
        }
    }

    /// Delete what the backend made for sessions of engine processes that are gone (a
    /// Kubernetes backend: their pods); bounded, ended by `shutdown()`, logged.
    pub async fn sweep_backend(&self) {
        let swept = tokio::select! {
            r = self.host.backend.sweep().instrument(self.host.log_route.span()) => r,
            () = self.shut_down.cancelled() => return,
        };
        match swept {
            Ok(gone) if gone.is_empty() => {}
            Ok(gone) => self.host.logger.log(
                LogLevel::Info,
                "deleted what sessions of processes that are gone left in the backend",
                json!({ "removed": gone }),
            ),
            Err(e) => self.host.logger.log(
                LogLevel::Warn,
                "could not sweep the backend",
                json!({ "error": e.to_string() }),
            ),
        }
    }

    /// The enriched prompt `startAgent` would send; provisions and runs nothing.
    pub async fn preview_prompt(&self, params: &StartParams) -> Result<String> {
        params::validate_start_params(params, &self.host.config.repo_root)?;
        let stop = StopSignal::default();
        let opts = FetchOptions {
            concurrency: self.host.config.context_concurrency,
            call_timeout: self.host.config.context_call_timeout,
            cancel: stop.token().clone(),
        };
        context::build_prompt(params, &self.host.deps, &self.host.config.repo_root, &opts).await
    }

    pub fn cancel(&self, session_id: &str) {
        self.host.registry.cancel(session_id);
    }

    /// The running sessions, oldest first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.host.registry.list()
    }

    /// Later starts are refused; running sessions get up to `grace` to finish, then are
    /// cancelled; resolves once each one has settled and been cleaned up. The unused bases go,
    /// but, with `keep_bases`, the tip's: they stay for the next process (git/base.rs).
    pub async fn shutdown(&self, grace: Duration, keep_bases: bool) {
        self.shut_down.cancel();
        self.host.registry.stop_all(grace).await;
        self.host.backend.shutdown().await;
        let repo = RepoGit::for_repo(&self.host.config.repo_root);
        if keep_bases {
            repo.keep_tip_bases().await;
        } else {
            repo.release_unused_bases().await;
        }
        // What the sessions' spans and the metrics hold yet goes to the collector now.
        let flushed = tokio::task::spawn_blocking(otel::flush);
        if tokio::time::timeout(otel::FLUSH_BOUND, flushed)
            .await
            .is_err()
        {
            self.host.logger.log(
                LogLevel::Warn,
                "OpenTelemetry: the collector did not take the pending telemetry in time",
                json!({ "boundMs": otel::FLUSH_BOUND.as_millis() as u64 }),
            );
        }
    }

    pub async fn start_agent(
        self: &Arc<Self>,
        params: StartParams,
        options: StartOptions,
    ) -> Result<StartedSession> {
        if self.shut_down.is_cancelled() {
            return Err(AdapterError::new(
                ErrorCode::Cancelled,
                "the adapter has been shut down",
            ));
        }
        lifecycle::start_agent(&self.host, params, options)
            .instrument(self.host.log_route.span())
            .await
    }
}

/// Compile-time check: the binding runs `start_agent`'s future on napi's multi-threaded
/// runtime, so it must stay `Send` (a borrow held across an await can silently break that).
const _: fn(Arc<Adapter>, StartParams) = |adapter, params| {
    fn assert_send<T: Send>(_: &T) {}
    let start = async move { adapter.start_agent(params, StartOptions::default()).await };
    assert_send(&start);
};

#[cfg(unix)]
/// The cluster's own end of a session (`activeDeadlineSeconds`) when the engine is gone:
/// `maxAgentDuration` plus the longest the steps around the agent may take (pod start, setup,
/// extraction) and a minute; none without `maxAgentDuration`.
fn pod_deadline(config: &AdapterConfig) -> Option<Duration> {
    let BackendConfig::Kubernetes(k) = &config.backend else {
        return None;
    };
    config.max_agent_duration.map(|d| {
        d + k.pod_start_timeout
            + config.worktree_setup_timeout
            + config.extraction_timeout
            + Duration::from_secs(60)
    })
}
