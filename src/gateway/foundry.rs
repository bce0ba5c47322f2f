//! Microsoft Foundry: each request carries the resource's API key (`ANTHROPIC_FOUNDRY_API_KEY`,
//! as `x-api-key`, as the CLI itself sends it, in place of its `Bearer skip-foundry-auth`) or an Entra ID access token of a service
//! principal (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`; the OAuth 2.0 client
//! credentials grant, fetched again before it expires).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request};
use http_body_util::BodyExt;

use super::provider_spec::{
    required, set_bearer, AuthFuture, Authenticate, ProviderRoutes, ProviderSpec, StaticCredential,
};
use super::route::Route;
use super::upstream::Upstream;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::https::extra_roots;
use crate::process::env_value;
use crate::server::full;

/// The CLI's calls (2.1.330): the Messages API under the resource's `/anthropic` base.
const ROUTES: [Route; 2] = [
    Route::new(Method::POST, "/v1/messages", 0),
    Route::new(Method::POST, "/v1/messages/count_tokens", 0),
];
const SCOPE: &str = "https://cognitiveservices.azure.com/.default";
const AUTHORITY: &str = "https://login.microsoftonline.com";
/// A token is fetched again this long before it expires (or at half its life when shorter).
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) const FOUNDRY: ProviderSpec = ProviderSpec {
    api: "Foundry",
    switch: "CLAUDE_CODE_USE_FOUNDRY",
    base_url_var: "ANTHROPIC_FOUNDRY_BASE_URL",
    skip_auth_var: "CLAUDE_CODE_SKIP_FOUNDRY_AUTH",
    routes: |cli_env| Box::pin(routes(cli_env)),
};

async fn routes(cli_env: &[(String, String)]) -> Result<ProviderRoutes> {
    let var = |k| env_value(cli_env, k).filter(|v| !v.trim().is_empty());
    let upstream = match var("ANTHROPIC_FOUNDRY_BASE_URL") {
        Some(base) => base.to_string(),
        None => {
            let resource = required(
                cli_env,
                &["ANTHROPIC_FOUNDRY_RESOURCE", "ANTHROPIC_FOUNDRY_BASE_URL"],
                "Foundry",
            )?;
            format!("https://{resource}.services.ai.azure.com/anthropic")
        }
    };
    let auth: Arc<dyn Authenticate> = match var("ANTHROPIC_FOUNDRY_API_KEY") {
        Some(key) => Arc::new(StaticCredential {
            name: "x-api-key",
            prefix: "",
            secret: key.to_string(),
            what: "ANTHROPIC_FOUNDRY_API_KEY",
        }),
        None => {
            let (Some(tenant), Some(client), Some(secret)) = (
                var("AZURE_TENANT_ID"),
                var("AZURE_CLIENT_ID"),
                var("AZURE_CLIENT_SECRET"),
            ) else {
                return Err(AdapterError::new(
                    ErrorCode::Provision,
                    "Foundry needs ANTHROPIC_FOUNDRY_API_KEY, or AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET for an Entra ID token (in config.env or the engine's environment)",
                ));
            };
            let authority = var("AZURE_AUTHORITY_HOST").unwrap_or(AUTHORITY);
            let entra = Entra {
                token_url: format!(
                    "{}/{tenant}/oauth2/v2.0/token",
                    authority.trim_end_matches('/')
                ),
                form: form_encode(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client),
                    ("client_secret", secret),
                    ("scope", SCOPE),
                ]),
                secret: secret.to_string(),
                cached: tokio::sync::Mutex::new(None),
                current: Mutex::new(String::new()),
            };
            entra.token().await.map_err(|why| {
                AdapterError::new(
                    ErrorCode::Provision,
                    format!("Foundry: no Entra ID token: {why}"),
                )
            })?;
            Arc::new(entra)
        }
    };
    Ok(ProviderRoutes {
        upstreams: vec![upstream],
        routes: ROUTES.to_vec(),
        auth,
    })
}

struct Entra {
    token_url: String,
    form: String,
    /// The client secret, masked too (a token endpoint's error might quote it).
    secret: String,
    cached: tokio::sync::Mutex<Option<(String, Instant)>>,
    current: Mutex<String>,
}

impl Entra {
    async fn token(&self) -> std::result::Result<String, String> {
        let mut cached = self.cached.lock().await;
        if let Some((token, _)) = cached.as_ref().filter(|(_, renew)| Instant::now() < *renew) {
            return Ok(token.clone());
        }
        let answer = tokio::time::timeout(TOKEN_TIMEOUT, post_form(&self.token_url, &self.form))
            .await
            .map_err(|_| format!("{} did not answer in {TOKEN_TIMEOUT:?}", self.token_url))??;
        let token = answer["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                let why = answer["error_description"]
                    .as_str()
                    .or(answer["error"].as_str())
                    .unwrap_or("no access_token in the answer");
                format!("{}: {why}", self.token_url)
            })?
            .to_string();
        let life = Duration::from_secs(answer["expires_in"].as_u64().unwrap_or(300));
        let renew = Instant::now() + life.saturating_sub(REFRESH_BEFORE.min(life / 2));
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = token.clone();
        *cached = Some((token.clone(), renew));
        Ok(token)
    }
}

impl Authenticate for Entra {
    fn authenticate<'a>(
        &'a self,
        parts: &'a mut http::request::Parts,
        _body: &'a [u8],
    ) -> AuthFuture<'a> {
        Box::pin(async move {
            let token = self.token().await?;
            set_bearer(parts, &token)
        })
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        vec![current.as_bytes().to_vec(), self.secret.as_bytes().to_vec()]
    }
}

/// `application/x-www-form-urlencoded` of `pairs`.
fn form_encode(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// POSTs `form` to `url` and reads the JSON answer (an OAuth token endpoint's).
async fn post_form(url: &str, form: &str) -> std::result::Result<serde_json::Value, String> {
    let upstream = Upstream::new(url, &extra_roots()).map_err(|e| e.message)?;
    let request = Request::post(format!("{}{}", upstream.origin, upstream.base_path))
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(full(Bytes::from(form.to_string())))
        .map_err(|e| e.to_string())?;
    let response = upstream
        .client
        .request(request)
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|_| format!("{url} answered {status} without JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_is_url_encoded() {
        assert_eq!(form_encode(&[("a b", "c&d=e/~")]), "a%20b=c%26d%3De%2F~");
    }
}
