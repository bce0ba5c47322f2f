//! What a session needs of the adapter that starts it: the configuration, the engine's
//! callbacks, the registry its id is claimed in, the backend it runs on, and the route of its
//! diagnostics to the engine's logger. The adapter ([`crate::adapter`], the layer above) builds
//! one and hands it to each session, which holds it until it has settled; the lifecycle never
//! sees the adapter itself (its shutdown, its sweeps).

use std::sync::Arc;
use std::time::Duration;

use super::registry::Registry;
use crate::claude::command;
use crate::config::AdapterConfig;
use crate::deps::{BashHook, Deps, Logger};
use crate::environment::Backend;
use crate::logging::LogRoute;

pub struct SessionHost {
    pub config: AdapterConfig,
    /// The engine's context callbacks.
    pub deps: Arc<dyn Deps>,
    /// The engine's verdict on each of the agent's Bash commands.
    pub hook: Arc<dyn BashHook>,
    pub logger: Arc<dyn Logger>,
    /// The adapter's running sessions.
    pub registry: Arc<Registry>,
    /// Where sessions run.
    pub backend: Arc<dyn Backend>,
    /// Routes the core modules' `tracing` diagnostics to `logger`.
    pub log_route: LogRoute,
}

impl SessionHost {
    /// The CLI's environment, as every session of this adapter starts it with.
    pub fn cli_env(&self) -> Vec<(String, String)> {
        let mut env = command::build_env(std::env::vars(), &self.config.env);
        let tolerance = self.config.api_outage_tolerance;
        // Only where a relay holds requests: without one (`sandbox: false` locally) a request
        // that hangs would wait the raised timeout for nothing.
        let held = self
            .backend
            .meters_model_requests(self.config.sandbox.as_ref());
        if held && !tolerance.is_zero() && !env.iter().any(|(k, _)| k == "API_TIMEOUT_MS") {
            // The CLI gives up on a request after API_TIMEOUT_MS (10 minutes by default); one
            // the relay holds through an outage may take the whole tolerance.
            let ms = (tolerance + Duration::from_secs(600)).as_millis();
            env.push(("API_TIMEOUT_MS".into(), ms.to_string()));
        }
        env
    }
}
