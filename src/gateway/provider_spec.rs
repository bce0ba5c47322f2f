//! What a model provider's module (Bedrock, Vertex AI, Foundry) gives the relay: a
//! [`ProviderSpec`] — how the CLI is switched to the provider and pointed at the relay, and
//! the relay's routes and authentication ([`Authenticate`]) for it. The providers import only
//! this (and the relay's building blocks: routes, upstreams); the table of them is
//! [`super::provider`], which imports them, so a provider never depends on the list it is in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use http::header::HeaderValue;

use super::route::Route;
use crate::error::{AdapterError, Result};
use crate::process::env_value;

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

/// A model provider's authentication: turns the CLI's unsigned request into an authenticated
/// one (AWS Signature V4, a Google or Entra ID access token, an API key). One small
/// implementation per provider beside the relay ([`super::bedrock`], [`super::vertex`],
/// [`super::foundry`]).
pub trait Authenticate: Send + Sync {
    /// Adds the credential to `parts`, whose URI is the upstream's (absolute) and whose `host`
    /// header is set; `body` is the whole request body. An error is the reason for a 502.
    fn authenticate<'a>(
        &'a self,
        parts: &'a mut http::request::Parts,
        body: &'a [u8],
    ) -> AuthFuture<'a>;

    /// The credentials in use now (a refreshed token is new), masked in every response.
    fn secrets(&self) -> Vec<Vec<u8>>;
}

/// What [`Authenticate::authenticate`] returns: done, or why not.
pub type AuthFuture<'a> =
    Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send + 'a>>;

/// Puts `value` in the header `name` (marked sensitive), in place of any credential the CLI
/// sent (its `skip-…-auth` placeholder); `what` names the value in the error.
pub(super) fn set_credential(
    parts: &mut http::request::Parts,
    name: &'static str,
    value: &str,
    what: &str,
) -> std::result::Result<(), String> {
    for h in ["authorization", "x-api-key", "api-key"] {
        parts.headers.remove(h);
    }
    let mut v =
        HeaderValue::from_str(value).map_err(|_| format!("{what} is not a valid header value"))?;
    v.set_sensitive(true);
    parts.headers.insert(name, v);
    Ok(())
}

/// Puts an OAuth access token in as `Authorization: Bearer` (Vertex AI's, Foundry's).
pub(super) fn set_bearer(
    parts: &mut http::request::Parts,
    token: &str,
) -> std::result::Result<(), String> {
    set_credential(
        parts,
        "authorization",
        &format!("Bearer {token}"),
        "the access token",
    )
}

/// A fixed credential (an API key): the header `name` set to `prefix` + `secret`.
pub(super) struct StaticCredential {
    pub name: &'static str,
    pub prefix: &'static str,
    pub secret: String,
    /// Where the secret came from, for the error.
    pub what: &'static str,
}

impl Authenticate for StaticCredential {
    fn authenticate<'a>(
        &'a self,
        parts: &'a mut http::request::Parts,
        _body: &'a [u8],
    ) -> AuthFuture<'a> {
        let set = set_credential(
            parts,
            self.name,
            &format!("{}{}", self.prefix, self.secret),
            self.what,
        );
        Box::pin(std::future::ready(set))
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        vec![self.secret.as_bytes().to_vec()]
    }
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
