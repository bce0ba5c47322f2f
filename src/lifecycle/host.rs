//! What a session needs of the adapter that starts it: the configuration, the engine's
//! callbacks, the registry its id is claimed in, the backend it runs on, and the route of its
//! diagnostics to the engine's logger. The adapter ([`crate::adapter`], the layer above) builds
//! one and hands it to each session, which holds it until it has settled; the lifecycle never
//! sees the adapter itself (its shutdown, its sweeps).

use std::sync::Arc;

use super::registry::Registry;
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
