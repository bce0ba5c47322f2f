//! Amazon Bedrock: each request signed with AWS Signature Version 4 (the AWS SDK's `aws-sigv4`),
//! or a Bedrock API key (`AWS_BEARER_TOKEN_BEDROCK`) as its bearer token. Credentials come
//! from `config.env`'s keys, else the AWS SDK's standard chain (environment, shared
//! config/credentials files and profiles, web identity, the container and instance metadata
//! endpoints), and are fetched again before they expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use http::header::HeaderValue;
use http::Method;

use super::provider_spec::{
    required, AuthFuture, Authenticate, ProviderRoutes, ProviderSpec, StaticCredential,
};
use super::route::Route;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::https::sources;
use crate::process::env_value;

/// The routes the CLI uses (2.1.330): the inference-profile listing on the control plane
/// (upstream 1), the model calls on the runtime (upstream 0).
const ROUTES: [Route; 4] = [
    Route::new(Method::GET, "/inference-profiles", 1),
    Route::new(Method::POST, "/model/*/invoke-with-response-stream", 0),
    Route::new(Method::POST, "/model/*/invoke", 0),
    Route::new(Method::POST, "/model/*/count-tokens", 0),
];
/// The service name both endpoints sign with.
const SERVICE: &str = "bedrock";
/// Credentials are fetched again this long before they expire.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// The longest the credential chain may take (the instance metadata endpoint, an STS call).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) const BEDROCK: ProviderSpec = ProviderSpec {
    api: "Bedrock",
    switch: "CLAUDE_CODE_USE_BEDROCK",
    base_url_var: "ANTHROPIC_BEDROCK_BASE_URL",
    skip_auth_var: "CLAUDE_CODE_SKIP_BEDROCK_AUTH",
    routes: |cli_env| Box::pin(routes(cli_env)),
};

async fn routes(cli_env: &[(String, String)]) -> Result<ProviderRoutes> {
    let region = required(cli_env, &["AWS_REGION", "AWS_DEFAULT_REGION"], "Bedrock")?.to_string();
    let upstreams = match env_value(cli_env, "ANTHROPIC_BEDROCK_BASE_URL").filter(|v| !v.is_empty())
    {
        Some(base) => vec![base.to_string(), base.to_string()],
        None => vec![
            format!("https://bedrock-runtime.{region}.amazonaws.com"),
            format!("https://bedrock.{region}.amazonaws.com"),
        ],
    };
    let auth: Arc<dyn Authenticate> =
        match env_value(cli_env, "AWS_BEARER_TOKEN_BEDROCK").filter(|v| !v.is_empty()) {
            Some(key) => Arc::new(StaticCredential {
                name: "authorization",
                prefix: "Bearer ",
                secret: key.to_string(),
                what: "AWS_BEARER_TOKEN_BEDROCK",
            }),
            None => {
                let signer = SigV4 {
                    region: region.clone(),
                    source: credential_source(cli_env, &region).await,
                    cached: tokio::sync::Mutex::new(None),
                    current: Mutex::new(Vec::new()),
                };
                signer.credentials().await.map_err(|why| {
                    AdapterError::new(
                        ErrorCode::Provision,
                        format!("Bedrock: no usable AWS credentials: {why}"),
                    )
                })?;
                Arc::new(signer)
            }
        };
    Ok(ProviderRoutes {
        upstreams,
        routes: ROUTES.to_vec(),
        auth,
    })
}

/// Where the credentials come from: `cli_env`'s keys (the engine's `config.env`), its web
/// identity settings, else the SDK's default chain (which reads the engine's own environment,
/// the profile `AWS_PROFILE` names and the files `cli_env` names).
async fn credential_source(
    cli_env: &[(String, String)],
    region: &str,
) -> SharedCredentialsProvider {
    let var = |k| env_value(cli_env, k).filter(|v| !v.is_empty());
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        return SharedCredentialsProvider::new(Credentials::new(
            id,
            secret,
            var("AWS_SESSION_TOKEN").map(str::to_string),
            None,
            "environment",
        ));
    }
    let region = aws_config::Region::new(region.to_string());
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    if let (Some(file), Some(role)) = (var("AWS_WEB_IDENTITY_TOKEN_FILE"), var("AWS_ROLE_ARN")) {
        let config = ProviderConfig::default()
            .with_http_client(http)
            .with_region(Some(region));
        return SharedCredentialsProvider::new(
            WebIdentityTokenCredentialsProvider::builder()
                .configure(&config)
                .static_configuration(StaticConfiguration {
                    web_identity_token_file: file.into(),
                    role_arn: role.to_string(),
                    session_name: var("AWS_ROLE_SESSION_NAME")
                        .unwrap_or("claude-runtime-adapter")
                        .to_string(),
                })
                .build(),
        );
    }
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(region)
        .http_client(http);
    let (config_file, credentials_file) =
        (var("AWS_CONFIG_FILE"), var("AWS_SHARED_CREDENTIALS_FILE"));
    if config_file.is_some() || credentials_file.is_some() {
        let mut files = EnvConfigFiles::builder()
            .include_default_config_file(config_file.is_none())
            .include_default_credentials_file(credentials_file.is_none());
        for (path, kind) in [
            (config_file, EnvConfigFileKind::Config),
            (credentials_file, EnvConfigFileKind::Credentials),
        ] {
            if let Some(path) = path {
                files = files.with_file(kind, path);
            }
        }
        loader = loader.profile_files(files.build());
    }
    if let Some(profile) = var("AWS_PROFILE") {
        loader = loader.profile_name(profile);
    }
    loader
        .load()
        .await
        .credentials_provider()
        .unwrap_or_else(|| SharedCredentialsProvider::new(NoCredentials))
}

/// What the chain is when the SDK built none.
#[derive(Debug)]
struct NoCredentials;

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no credential source is configured",
            ),
        ))
    }
}

struct SigV4 {
    region: String,
    source: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<Credentials>>,
    /// The secret key and session token in use, for the masking.
    current: Mutex<Vec<Vec<u8>>>,
}

impl SigV4 {
    /// The cached credentials, fetched again when they expire within [`REFRESH_BEFORE`].
    async fn credentials(&self) -> std::result::Result<Credentials, String> {
        let mut cached = self.cached.lock().await;
        let fresh = |c: &Credentials| {
            c.expiry()
                .is_none_or(|at| at > SystemTime::now() + REFRESH_BEFORE)
        };
        if let Some(c) = cached.as_ref().filter(|c| fresh(c)) {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(RESOLVE_TIMEOUT, self.source.provide_credentials())
            .await
            .map_err(|_| format!("the credential chain did not answer in {RESOLVE_TIMEOUT:?}"))?
            .map_err(|e| error_chain(&e))?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            [Some(c.secret_access_key()), c.session_token()]
                .into_iter()
                .flatten()
                .map(|s| s.as_bytes().to_vec())
                .collect();
        *cached = Some(c.clone());
        Ok(c)
    }
}

impl Authenticate for SigV4 {
    fn authenticate<'a>(
        &'a self,
        parts: &'a mut http::request::Parts,
        body: &'a [u8],
    ) -> AuthFuture<'a> {
        Box::pin(async move {
            let identity = self.credentials().await?.into();
            for h in [
                "authorization",
                "x-amz-date",
                "x-amz-security-token",
                "x-amz-content-sha256",
            ] {
                parts.headers.remove(h);
            }
            let params = v4::SigningParams::builder()
                .identity(&identity)
                .region(&self.region)
                .name(SERVICE)
                .time(SystemTime::now())
                .settings(SigningSettings::default())
                .build()
                .map_err(|e| e.to_string())?
                .into();
            let uri = parts.uri.to_string();
            let headers = parts
                .headers
                .iter()
                .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)));
            let signable = SignableRequest::new(
                parts.method.as_str(),
                &uri,
                headers,
                SignableBody::Bytes(body),
            )
            .map_err(|e| e.to_string())?;
            let (instructions, _) = sign(signable, &params)
                .map_err(|e| e.to_string())?
                .into_parts();
            for (name, value) in instructions.headers() {
                let mut v = HeaderValue::from_str(value).map_err(|e| e.to_string())?;
                v.set_sensitive(name == "authorization" || name == "x-amz-security-token");
                parts.headers.insert(
                    http::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|e| e.to_string())?,
                    v,
                );
            }
            Ok(())
        })
    }

    fn secrets(&self) -> Vec<Vec<u8>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// An error and its sources, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = std::iter::once(e.to_string()).chain(sources(e)).collect();
    parts.dedup();
    parts.join(": ")
}
