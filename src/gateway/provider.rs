//! Which model provider a session's CLI talks to, and what the relay does for it. The CLI is
//! configured the way Claude Code documents (`CLAUDE_CODE_USE_BEDROCK`, `_VERTEX`, `_FOUNDRY`
//! and their variables, in `config.env` or the engine's environment); inside the sandbox it gets
//! the provider's base URL pointing at the relay and the provider's `CLAUDE_CODE_SKIP_*_AUTH`
//! switch, so it sends its requests unsigned, and the relay authenticates them outside, where
//! the credential is. A misconfiguration fails here, before the CLI starts.
//!
//! The providers are one table, [`PROVIDERS`], of the [`ProviderSpec`] each one's module gives.

use http::header::{HeaderName, HeaderValue};

use super::bedrock::BEDROCK;
use super::foundry::FOUNDRY;
use super::provider_spec::{ProviderRoutes, ProviderSpec};
use super::vertex::VERTEX;
use super::RelayPlan;
use crate::error::{AdapterError, Result};
use crate::process::env_value;

/// Where the CLI talks to the Anthropic API when `ANTHROPIC_BASE_URL` does not say otherwise.
pub const DEFAULT_API: &str = "https://api.anthropic.com";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    Bedrock,
    Vertex,
    Foundry,
}

/// The providers behind the relay, in the order the CLI picks among them when several are
/// switched on.
const PROVIDERS: [(Provider, &ProviderSpec); 3] = [
    (Provider::Bedrock, &BEDROCK),
    (Provider::Vertex, &VERTEX),
    (Provider::Foundry, &FOUNDRY),
];

impl Provider {
    /// The provider the CLI would use with `cli_env`.
    pub fn of(cli_env: &[(String, String)]) -> Provider {
        let on = |k| env_value(cli_env, k).is_some_and(truthy);
        PROVIDERS
            .iter()
            .find(|(_, spec)| on(spec.switch))
            .map_or(Provider::Anthropic, |(p, _)| *p)
    }

    /// Its entry in [`PROVIDERS`]; `None` for the Anthropic API.
    fn spec(self) -> Option<&'static ProviderSpec> {
        PROVIDERS.iter().find(|(p, _)| *p == self).map(|(_, s)| *s)
    }
}

/// The CLI's reading of a boolean switch.
fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// What a provider's relay needs: its plan, and the variables the CLI gets inside.
pub struct ProviderRelay {
    pub plan: RelayPlan,
    pub inside: Vec<(String, String)>,
}

/// The relay for `cli_env`'s provider (credentials found and checked once here), the CLI inside
/// reaching it at `relay_url`. `substitutions` are the Anthropic credentials' placeholders.
pub async fn provider_relay(
    cli_env: &[(String, String)],
    relay_url: &str,
    substitutions: Vec<(String, String)>,
) -> Result<ProviderRelay> {
    let spec = Provider::of(cli_env).spec();
    let headers = custom_headers(cli_env)?;
    let mut plan = match spec {
        None => RelayPlan::anthropic(&anthropic_upstream(cli_env), substitutions),
        Some(spec) => {
            let ProviderRoutes {
                upstreams,
                routes,
                auth,
            } = (spec.routes)(cli_env).await?;
            RelayPlan::new(spec.api, routes, upstreams, substitutions, Some(auth))
        }
    };
    plan.headers = headers;
    let inside = spec
        .map(|s| {
            vec![
                (s.base_url_var.to_string(), relay_url.to_string()),
                (s.skip_auth_var.to_string(), "1".to_string()),
            ]
        })
        .unwrap_or_default();
    Ok(ProviderRelay { plan, inside })
}

/// The Anthropic API's real base URL.
pub fn anthropic_upstream(cli_env: &[(String, String)]) -> String {
    env_value(cli_env, "ANTHROPIC_BASE_URL")
        .filter(|v| !v.is_empty())
        .unwrap_or(DEFAULT_API)
        .to_string()
}

/// `ANTHROPIC_CUSTOM_HEADERS` (`Name: Value` per line): a gateway's headers, which may carry its
/// credential, so they are added by the relay outside, never seen inside.
fn custom_headers(cli_env: &[(String, String)]) -> Result<Vec<(HeaderName, HeaderValue)>> {
    let Some(text) = env_value(cli_env, "ANTHROPIC_CUSTOM_HEADERS") else {
        return Ok(Vec::new());
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
        .map(|(i, line)| {
            let bad = |why: &str| {
                AdapterError::invalid_params(format!(
                    "ANTHROPIC_CUSTOM_HEADERS line {}: {why} (expected `Name: Value`)",
                    i + 1
                ))
            };
            let (name, value) = line.split_once(':').ok_or_else(|| bad("no colon"))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| bad("not a header name"))?;
            let mut value =
                HeaderValue::from_str(value.trim()).map_err(|_| bad("not a header value"))?;
            value.set_sensitive(true);
            Ok((name, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::tests::env;

    #[test]
    fn the_provider_is_the_one_the_cli_would_use() {
        assert_eq!(Provider::of(&env(&[])), Provider::Anthropic);
        assert_eq!(
            Provider::of(&env(&[("CLAUDE_CODE_USE_BEDROCK", "1")])),
            Provider::Bedrock
        );
        assert_eq!(
            Provider::of(&env(&[
                ("CLAUDE_CODE_USE_BEDROCK", "0"),
                ("CLAUDE_CODE_USE_VERTEX", "true")
            ])),
            Provider::Vertex
        );
        assert_eq!(
            Provider::of(&env(&[("CLAUDE_CODE_USE_FOUNDRY", "1")])),
            Provider::Foundry
        );
    }

    #[test]
    fn custom_headers_are_parsed_and_a_bad_line_is_named() {
        let h = custom_headers(&env(&[(
            "ANTHROPIC_CUSTOM_HEADERS",
            "X-Gw-Key: abc\n\nX-Other:  d e ",
        )]))
        .unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].0, "x-gw-key");
        assert_eq!(h[1].1, "d e");
        let e = custom_headers(&env(&[("ANTHROPIC_CUSTOM_HEADERS", "ok: 1\nbroken")]))
            .err()
            .unwrap();
        assert!(e.message.contains("line 2"), "{}", e.message);
    }

    #[tokio::test]
    async fn a_provider_without_its_settings_fails_before_the_cli_naming_what_is_missing() {
        for (vars, missing) in [
            (vec![("CLAUDE_CODE_USE_BEDROCK", "1")], "AWS_REGION"),
            (
                vec![
                    ("CLAUDE_CODE_USE_VERTEX", "1"),
                    ("CLOUD_ML_REGION", "us-east5"),
                ],
                "ANTHROPIC_VERTEX_PROJECT_ID",
            ),
            (
                vec![
                    ("CLAUDE_CODE_USE_VERTEX", "1"),
                    ("ANTHROPIC_VERTEX_PROJECT_ID", "p"),
                ],
                "CLOUD_ML_REGION",
            ),
            (
                vec![("CLAUDE_CODE_USE_FOUNDRY", "1")],
                "ANTHROPIC_FOUNDRY_RESOURCE",
            ),
        ] {
            let e = provider_relay(&env(&vars), "http://127.0.0.1:1", Vec::new())
                .await
                .err()
                .unwrap_or_else(|| panic!("{vars:?} accepted"));
            assert_eq!(e.code, crate::error::ErrorCode::InvalidParams, "{vars:?}");
            assert!(e.message.contains(missing), "{vars:?}: {}", e.message);
        }
    }
}
