//! Google Vertex AI: each request carries a Google access token from Application Default
//! Credentials (`gcp_auth`: the service-account key `GOOGLE_APPLICATION_CREDENTIALS` names,
//! gcloud's user credentials, the metadata server — GKE workload identity included), cached and
//! fetched again before it expires.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gcp_auth::{CustomServiceAccount, TokenProvider};
use http::header::HeaderValue;
use http::Method;

use super::provider_spec::{
    required, set_bearer, AuthFuture, Authenticate, ProviderRoutes, ProviderSpec,
};
use super::route::Route;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::process::env_value;

/// The CLI's calls (2.1.330): the Messages API as `streamRawPredict` / `rawPredict` of a
/// publisher model (the token count is `count-tokens:rawPredict`).
const ROUTES: [Route; 2] = [
    Route::new(
        Method::POST,
        "/projects/*/locations/*/publishers/anthropic/models/*:streamRawPredict",
        0,
    ),
    Route::new(
        Method::POST,
        "/projects/*/locations/*/publishers/anthropic/models/*:rawPredict",
        0,
    ),
];
const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The longest a token request may take.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) const VERTEX: ProviderSpec = ProviderSpec {
    api: "Vertex AI",
    switch: "CLAUDE_CODE_USE_VERTEX",
    base_url_var: "ANTHROPIC_VERTEX_BASE_URL",
    skip_auth_var: "CLAUDE_CODE_SKIP_VERTEX_AUTH",
    routes: |cli_env| Box::pin(routes(cli_env)),
};

async fn routes(cli_env: &[(String, String)]) -> Result<ProviderRoutes> {
    required(cli_env, &["ANTHROPIC_VERTEX_PROJECT_ID"], "Vertex AI")?;
    let region = required(cli_env, &["CLOUD_ML_REGION"], "Vertex AI")?;
    let base = env_value(cli_env, "ANTHROPIC_VERTEX_BASE_URL").filter(|v| !v.is_empty());
    let upstream = match base {
        Some(base) => base.to_string(),
        None => format!("https://{}/v1", regional_host(region)),
    };
    let unusable = |why: String| {
        AdapterError::new(
            ErrorCode::Provision,
            format!("Vertex AI: no usable Google credentials: {why}"),
        )
    };
    let source: Arc<dyn TokenProvider> =
        match env_value(cli_env, "GOOGLE_APPLICATION_CREDENTIALS").filter(|v| !v.is_empty()) {
            Some(path) => Arc::new(CustomServiceAccount::from_file(path).map_err(|e| {
                unusable(format!(
                    "GOOGLE_APPLICATION_CREDENTIALS ({path}) is not a service account key: {e}"
                ))
            })?),
            None => gcp_auth::provider()
                .await
                .map_err(|e| unusable(e.to_string()))?,
        };
    let auth = Token {
        source,
        current: Mutex::new(String::new()),
        regional: base.is_none(),
    };
    auth.token().await.map_err(unusable)?;
    Ok(ProviderRoutes {
        upstreams: vec![upstream],
        routes: ROUTES.to_vec(),
        auth: Arc::new(auth),
    })
}

struct Token {
    source: Arc<dyn TokenProvider>,
    /// The token in use, for the masking.
    current: Mutex<String>,
    /// Google's own endpoint: each request goes to the host of the region in its path (the CLI
    /// picks a region per model with `VERTEX_REGION_CLAUDE_*`).
    regional: bool,
}

/// Vertex AI's host for `region`.
fn regional_host(region: &str) -> String {
    match region {
        "global" => "aiplatform.googleapis.com".to_string(),
        r => format!("{r}-aiplatform.googleapis.com"),
    }
}

/// `uri` sent to the host of the region its path names (`/locations/<region>/`).
fn to_region_host(uri: &http::Uri) -> Option<http::Uri> {
    let path = uri.path();
    let region = path.split("/locations/").nth(1)?.split('/').next()?;
    if region.is_empty()
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return None;
    }
    let target = uri.path_and_query()?.as_str();
    format!("https://{}{target}", regional_host(region))
        .parse()
        .ok()
}

impl Token {
    /// A valid token: `gcp_auth` caches it and fetches a new one before it expires.
    async fn token(&self) -> std::result::Result<String, String> {
        let token = tokio::time::timeout(TOKEN_TIMEOUT, self.source.token(&[SCOPE]))
            .await
            .map_err(|_| format!("no token in {TOKEN_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let token = token.as_str().to_string();
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = token.clone();
        Ok(token)
    }
}

impl Authenticate for Token {
    fn authenticate<'a>(
        &'a self,
        parts: &'a mut http::request::Parts,
        _body: &'a [u8],
    ) -> AuthFuture<'a> {
        Box::pin(async move {
            if self.regional {
                let uri = to_region_host(&parts.uri)
                    .ok_or_else(|| format!("no region in {}", parts.uri.path()))?;
                if let Some(host) = uri
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                {
                    parts.headers.insert(http::header::HOST, host);
                }
                parts.uri = uri;
            }
            let token = self.token().await?;
            set_bearer(parts, &token)
        })
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        vec![self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_bytes()
            .to_vec()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_goes_to_the_host_of_the_region_in_its_path() {
        let to = |u: &str| to_region_host(&u.parse().unwrap()).map(|u| u.to_string());
        assert_eq!(
            to("https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/europe-west1/publishers/anthropic/models/m:rawPredict?x=1").as_deref(),
            Some("https://europe-west1-aiplatform.googleapis.com/v1/projects/p/locations/europe-west1/publishers/anthropic/models/m:rawPredict?x=1")
        );
        assert_eq!(
            to("https://x/v1/projects/p/locations/global/publishers/anthropic/models/m:rawPredict").as_deref(),
            Some("https://aiplatform.googleapis.com/v1/projects/p/locations/global/publishers/anthropic/models/m:rawPredict")
        );
        assert_eq!(
            to("https://x/v1/projects/p/locations/evil.com%2F/models/m"),
            None
        );
    }
}
