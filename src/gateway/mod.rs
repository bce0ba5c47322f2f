//! The model gateway: the relay between the Claude Code CLI and the model API that every model
//! request of a session in the local sandbox, and of every session in a pod (`sandbox: false`
//! included), passes — its routes and upstream, the providers (Bedrock, Vertex AI, Foundry:
//! [`provider`]), the session's ride through an API outage ([`outage`]), the fleet's shared
//! pace ([`pacing`]), the budget's metering ([`metering`], counting with [`crate::spend`]), the
//! server tools it refuses ([`reach`]) and the secrets it masks ([`mask`]). A layer of its own:
//! it imports only foundations, and is started by the sandbox (one relay per session, on a unix
//! socket that a pod's is tunnelled to) and read by the lifecycle (its outage). Not
//! `sandbox::Egress`, which is all a confined session reaches the outside through: this relay,
//! the egress proxy and the telemetry forwarder.
//!
//! The CLI runs without network and without the real model-API credential: it gets
//! `ANTHROPIC_BASE_URL=http://127.0.0.1:<port>` (a loopback port bridged to this relay's unix
//! socket) and a [`placeholder`] in place of the key or token.
//! The relay forwards the CLI's requests to the real upstream base URL (http or https, possibly
//! with a path prefix) over hyper, and is strict about the secret:
//!
//! - It puts the real secret in place of the placeholder only as the whole `x-api-key` value or
//!   as `authorization: Bearer <placeholder>`. A placeholder anywhere else (another header, the
//!   path or query) refuses the request (400, logged): substituted there, it would come back in
//!   an error that quotes the header. Bodies are not rewritten: the placeholder in a body (the
//!   agent printed its environment) is not the secret.
//! - It forwards only the routes the CLI uses ([`route`]); a model provider's
//!   (Bedrock, Vertex AI, Foundry) are its own, and its authentication is added here too.
//! - Every secret is masked in the response's headers and body (streamed events too, also when
//!   a secret is split across chunks) before the response goes back in ([`mask`]).
//!
//! Each client connection carries one request (the response says `Connection: close`; a
//! reused local connection could race its close); the upstream connections are pooled and
//! reused, so a session pays one TLS handshake, not one per turn ([`upstream`]).
//!
//! A request's way through, file by file: this file starts the relay and serves each
//! connection; [`request`] takes the CLI's request in (target, route, placeholders, body,
//! budget); [`send`] sends it upstream, held through an outage under the fleet's pace; and
//! [`answer`] brings the answer back, masked and watched; [`metering`] counts it as it passes.

mod answer;
mod bedrock;
mod body;
mod foundry;
pub(crate) mod mask;
mod metering;
pub mod outage;
mod pacing;
pub mod provider;
mod provider_spec;
mod reach;
mod request;
mod route;
mod send;
mod stream_head;
#[cfg(all(test, unix))]
mod tests;
mod trace;
mod upstream;
mod vertex;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use hyper_util::rt::TokioIo;

use self::body::BodyBudget;
use self::mask::Masker;
use self::outage::ApiOutage;
use self::provider_spec::Authenticate;
use self::route::{Route, ANTHROPIC_ROUTES};
use self::trace::Exchange;
use self::upstream::Upstream;
use crate::audit::AuditRecord;
use crate::config::ServerTool;
use crate::error::{AdapterError, Result};
use crate::https::extra_roots;
use crate::server::{full, http1_server, Body, Limits, UnixServer, UnixStream};
use crate::spend::SpendMeter;

/// The relay's connections at once (the CLI makes a few in parallel at most).
const MAX_RELAY_CONNECTIONS: usize = 64;

/// What a session asks of its relay beyond the plan: its outage ([`outage`]), whether its
/// requests are paced with the fleet's ([`pacing`]), and its spend and budget ([`metering`]).
#[derive(Clone, Default)]
pub struct ApiHooks {
    pub outage: Option<Arc<ApiOutage>>,
    pub pacing: bool,
    /// The session's spend meter: every answer counted, requests refused past its budget
    /// ([`metering`]).
    pub spend: Option<Arc<SpendMeter>>,
    /// The session's span: each model request is a span under it ([`crate::otel`]).
    pub trace: Option<tracing::Span>,
    /// The session's audit record: each request and its answer in it ([`crate::audit`]).
    pub audit: Option<Arc<AuditRecord>>,
}

/// A running relay; dropping it stops the listener and every connection it carries and removes
/// its socket file.
pub struct ModelRelay {
    _server: UnixServer,
}

/// Everything a relay forwards and how: the routes, their upstream base URLs (each request's
/// target is appended to its route's base URL, path included), the placeholders the CLI holds
/// (see the module's documentation), the provider's authentication, and headers of the
/// user's gateway (`ANTHROPIC_CUSTOM_HEADERS`: added outside, their values masked).
pub struct RelayPlan {
    /// What the routes are of, for messages: "Messages API", "Bedrock", …
    pub api: &'static str,
    pub routes: Vec<Route>,
    pub upstreams: Vec<String>,
    pub substitutions: Vec<(String, String)>,
    pub auth: Option<Arc<dyn Authenticate>>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The API's features that reach out on the agent's behalf which requests may use
    /// (`sandbox.serverTools`); `None`: any (a session without a sandbox).
    pub server_tools: Option<Vec<ServerTool>>,
    /// The session's outage: requests held through it (`None`: sent once, as the CLI asks).
    pub outage: Option<Arc<ApiOutage>>,
    /// Paced with every other session's requests to the same account ([`pacing`]).
    pub pacing: bool,
    /// The session's spend, counted from every response; requests are refused once it has
    /// passed the budget ([`metering`]).
    pub spend: Option<Arc<SpendMeter>>,
    /// The session's span, the parent of each request's span.
    pub trace: Option<tracing::Span>,
    /// The session's audit record.
    pub audit: Option<Arc<AuditRecord>>,
}

impl RelayPlan {
    /// The Anthropic Messages API at `upstream`, the CLI's key or token as `substitutions`.
    pub fn anthropic(upstream: &str, substitutions: Vec<(String, String)>) -> RelayPlan {
        let routes = ANTHROPIC_ROUTES
            .iter()
            .map(|(m, p)| Route::new(m.clone(), p, 0))
            .collect();
        let upstreams = vec![upstream.to_string()];
        RelayPlan::new("Messages API", routes, upstreams, substitutions, None)
    }

    /// `api`'s routes to `upstreams`, before the session's part is set: no header of the
    /// user's gateway, no server tool allowed, no outage, pace, meter, span or record. Every
    /// provider's plan starts here ([`provider::provider_relay`]).
    fn new(
        api: &'static str,
        routes: Vec<Route>,
        upstreams: Vec<String>,
        substitutions: Vec<(String, String)>,
        auth: Option<Arc<dyn Authenticate>>,
    ) -> RelayPlan {
        RelayPlan {
            api,
            routes,
            upstreams,
            substitutions,
            auth,
            headers: Vec::new(),
            server_tools: Some(Vec::new()),
            outage: None,
            pacing: false,
            spend: None,
            trace: None,
            audit: None,
        }
    }
}

impl ModelRelay {
    /// Listens on the unix socket `socket` (which must not exist yet) and relays to the
    /// Anthropic API at `upstream`, the real base URL; `substitutions` are (placeholder, secret)
    /// pairs. Needs a tokio runtime.
    pub async fn start(
        socket: &Path,
        upstream: &str,
        substitutions: Vec<(String, String)>,
    ) -> Result<ModelRelay> {
        Self::start_plan(socket, RelayPlan::anthropic(upstream, substitutions)).await
    }

    /// Listens on the unix socket `socket` (which must not exist yet) and relays as `plan`
    /// says. An https upstream is verified against the webpki roots plus the certificates in
    /// the PEM files named by `SSL_CERT_FILE` and `NODE_EXTRA_CA_CERTS` (a corporate proxy's
    /// root). Needs a tokio runtime.
    pub async fn start_plan(socket: &Path, plan: RelayPlan) -> Result<ModelRelay> {
        Self::start_with_roots(socket, plan, &extra_roots())
    }

    fn start_with_roots(
        socket: &Path,
        plan: RelayPlan,
        extra_roots: &[PathBuf],
    ) -> Result<ModelRelay> {
        let relay = Arc::new(Relay::new(plan, extra_roots)?);
        let limits = Limits {
            max_connections: MAX_RELAY_CONNECTIONS,
            idle: None,
        };
        let server = UnixServer::start(
            socket,
            "the model-API relay",
            limits,
            || tracing::warn!("model relay: a connection over the cap was refused"),
            move |stream, _| relay.clone().serve(stream),
        )?;
        Ok(ModelRelay { _server: server })
    }
}

/// A fresh random placeholder credential for the CLI inside the sandbox: unguessable and
/// unrelated to the secret, shaped like an Anthropic key so the CLI's own checks accept it.
pub fn placeholder() -> String {
    format!(
        "sk-ant-sandbox-placeholder-{}",
        uuid::Uuid::new_v4().simple()
    )
}

struct Relay {
    api: &'static str,
    upstreams: Vec<Upstream>,
    routes: Vec<Route>,
    substitutions: Vec<(String, String)>,
    /// The secrets' bytes, masked in every response.
    masks: Arc<Vec<Vec<u8>>>,
    auth: Option<Arc<dyn Authenticate>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    server_tools: Option<Vec<ServerTool>>,
    /// The session's share of the engine's memory for request bodies.
    bodies: BodyBudget,
    outage: Option<Arc<ApiOutage>>,
    /// The account whose pace (one per model, shared with every relay sending to it) the
    /// requests keep; `None`: not paced.
    account: Option<pacing::Account>,
    spend: Option<Arc<SpendMeter>>,
    trace: Option<tracing::Span>,
    audit: Option<Arc<AuditRecord>>,
}

impl Relay {
    /// The relay `plan` says, an https upstream trusted through `extra_roots` too; fails on
    /// an empty placeholder (every request would hold it) or an upstream URL it cannot use.
    fn new(plan: RelayPlan, extra_roots: &[PathBuf]) -> Result<Relay> {
        let RelayPlan {
            api,
            routes,
            upstreams,
            substitutions,
            auth,
            headers,
            server_tools,
            outage,
            pacing,
            spend,
            trace,
            audit,
        } = plan;
        if substitutions
            .iter()
            .any(|(placeholder, _)| placeholder.is_empty())
        {
            return Err(AdapterError::invalid_params(
                "the model relay's credential placeholder is empty",
            ));
        }
        let upstreams: Vec<Upstream> = upstreams
            .iter()
            .map(|u| Upstream::new(u, extra_roots))
            .collect::<Result<_>>()?;
        let account = pacing.then(|| pacing_account(&upstreams, &substitutions, &headers));
        Ok(Relay {
            api,
            routes,
            masks: secrets(&substitutions, &headers),
            substitutions,
            upstreams,
            outage,
            account,
            auth,
            headers,
            server_tools,
            bodies: BodyBudget::new(),
            spend,
            trace,
            audit,
        })
    }

    async fn serve(self: Arc<Self>, client: UnixStream) {
        let relay = self.clone();
        let service = hyper::service::service_fn(move |req| {
            let relay = relay.clone();
            async move {
                // The budget is kept around the whole exchange: a spent one refuses the
                // request before anything of it is read, and every answer is counted.
                let exchange = Exchange::begin(relay.trace.as_ref(), relay.audit.as_ref());
                if let Some(refused) = metering::refusal(relay.spend.as_deref()) {
                    return Ok::<_, std::convert::Infallible>(exchange.failed(refused));
                }
                // A refusal is the relay's own answer, failed like the API's.
                let response = relay.handle(req, &exchange).await.unwrap_or_else(|r| *r);
                if !response.status().is_success() {
                    return Ok(exchange.failed(response));
                }
                Ok(metering::metered(relay.spend.as_ref(), response, exchange))
            }
        });
        let _ = http1_server()
            .keep_alive(false)
            .serve_connection(TokioIo::new(client), service)
            .await;
    }

    /// Every secret to mask now: the placeholders' secrets, the gateway's headers and the
    /// provider's current credentials.
    fn masks_now(&self) -> Arc<Vec<Vec<u8>>> {
        match &self.auth {
            None => self.masks.clone(),
            Some(auth) => Arc::new(
                self.masks
                    .iter()
                    .cloned()
                    .chain(auth.secrets().into_iter().filter(|s| !s.is_empty()))
                    .collect(),
            ),
        }
    }

    /// `text` with every secret masked (a reason quoted back to the CLI).
    fn mask_text(&self, text: &str) -> String {
        String::from_utf8_lossy(&Masker::new(self.masks_now()).push(text.as_bytes(), true))
            .into_owned()
    }
}

/// The secrets' bytes, masked in every answer: the placeholders' secrets and the values of the
/// user's gateway headers (which may carry its credential).
fn secrets(
    substitutions: &[(String, String)],
    headers: &[(HeaderName, HeaderValue)],
) -> Arc<Vec<Vec<u8>>> {
    Arc::new(
        substitutions
            .iter()
            .map(|(_, secret)| secret.as_bytes().to_vec())
            .chain(headers.iter().map(|(_, v)| v.as_bytes().to_vec()))
            .filter(|secret| !secret.is_empty())
            .collect(),
    )
}

/// The account whose pace the requests keep ([`pacing`]): the first upstream and every
/// credential the relay adds.
fn pacing_account(
    upstreams: &[Upstream],
    substitutions: &[(String, String)],
    headers: &[(HeaderName, HeaderValue)],
) -> pacing::Account {
    let credentials = substitutions
        .iter()
        .map(|(_, secret)| secret.as_str())
        .chain(headers.iter().filter_map(|(_, v)| v.to_str().ok()))
        .collect::<Vec<_>>()
        .join("\n");
    pacing::account(
        upstreams.first().map_or("", |u| u.origin.as_str()),
        &credentials,
    )
}

/// An error answer of the relay's own, shaped like the Anthropic API's so the CLI shows it.
fn api_error(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": "error",
        "error": { "type": kind, "message": format!("claude-runtime-adapter relay: {message}") },
    })
    .to_string();
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
