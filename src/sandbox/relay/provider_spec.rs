//! What a model provider's module (Bedrock, Vertex AI, Foundry) gives the relay: a
//! [`ProviderSpec`] — how the CLI is switched to the provider and pointed at the relay, and
//! the relay's routes and authentication for it. The providers import only this (and the
//! relay's building blocks); the table of them is [`super::provider`], which imports them, so
//! a provider never depends on the list it is in.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Authenticate, Route};
use crate::error::{AdapterError, Result};
use crate::sandbox::credentials::env_value;

/// One model provider behind the relay.
pub struct ProviderSpec {
    /// What its routes are of, for messages ("Bedrock").
    pub api: &'static str,
    /// The CLI's switch to it (`CLAUDE_CODE_USE_BEDROCK`).
    pub switch: &'static str,
    /// The CLI's variable naming its base URL: inside, the relay's.
    pub base_url_var: &'static str,
    /// The CLI's switch that leaves the authentication to a gateway: inside, the relay.
    pub skip_auth_var: &'static str,
    /// Its part of the relay's plan for `cli_env` (credentials found and checked here).
    pub routes: fn(&[(String, String)]) -> RoutesFuture<'_>,
}

/// What [`ProviderSpec::routes`] returns.
pub type RoutesFuture<'a> = BoxFuture<'a, Result<ProviderRoutes>>;

/// A provider's part of the plan: the upstream base URLs, the routes to them, and the
/// authentication (none for the Anthropic API, whose credential is a placeholder's secret).
pub struct ProviderRoutes {
    pub upstreams: Vec<String>,
    pub routes: Vec<Route>,
    pub auth: Arc<dyn Authenticate>,
}

/// A required variable of `cli_env`, or `ERR_INVALID_PARAMS` naming it and what needs it.
pub(super) fn required<'a>(
    cli_env: &'a [(String, String)],
    names: &[&str],
    needed_by: &str,
) -> Result<&'a str> {
    names
        .iter()
        .find_map(|k| env_value(cli_env, k).filter(|v| !v.trim().is_empty()))
        .ok_or_else(|| {
            AdapterError::invalid_params(format!(
                "{needed_by} needs {} (in config.env or the engine's environment)",
                names.join(" or ")
            ))
        })
}
