//! The model gateway: the relay between the Claude Code CLI and the model API that every model
//! request of a session in the local sandbox or in a pod (`sandbox: false` too) passes — its
//! routes and upstream, the providers (Bedrock, Vertex AI, Foundry: [`provider`]), the
//! session's ride through an API outage ([`outage`]), the fleet's shared pace ([`pacing`]), the
//! budget's metering ([`metering`], counting with [`crate::spend`]), the server tools it refuses
//! ([`reach`]) and the secrets it masks ([`mask`]). A layer of its own: it imports only
//! foundations, and is started by the sandbox (one relay per session, on a unix socket that a
//! pod's is tunnelled to) and read by the lifecycle (its outage). Not `sandbox::Gateway`, which
//! is all a confined session reaches the outside through: this relay, the egress proxy and the
//! telemetry forwarder.
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
mod route;
mod stream_head;
mod trace;
mod upstream;
mod vertex;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;

use self::body::BodyBudget;
use self::mask::{find, mask_headers, Masker};
use self::outage::ApiOutage;
use self::pacing::Pace;
use self::provider_spec::Authenticate;
use self::route::{Route, ANTHROPIC_ROUTES};
use self::stream_head::Head;
use self::trace::Exchange;
use self::upstream::Upstream;
use crate::audit::AuditRecord;
use crate::config::ServerTool;
use crate::error::{AdapterError, Result};
use crate::https::{extra_roots, sources, BoxError};
use crate::server::{full, http1_server, strip_hop_by_hop, Body, Limits, UnixServer, UnixStream};
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
        RelayPlan {
            api: "Messages API",
            routes: ANTHROPIC_ROUTES
                .iter()
                .map(|(m, p)| Route::new(m.clone(), p, 0))
                .collect(),
            upstreams: vec![upstream.to_string()],
            substitutions,
            auth: None,
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
        let masks = Arc::new(
            substitutions
                .iter()
                .map(|(_, secret)| secret.as_bytes().to_vec())
                .chain(headers.iter().map(|(_, v)| v.as_bytes().to_vec()))
                .filter(|secret| !secret.is_empty())
                .collect(),
        );
        let upstreams: Vec<Upstream> = upstreams
            .iter()
            .map(|u| Upstream::new(u, extra_roots))
            .collect::<Result<_>>()?;
        // The account: the first upstream and every credential the relay adds.
        let account = substitutions
            .iter()
            .map(|(_, secret)| secret.as_str())
            .chain(headers.iter().filter_map(|(_, v)| v.to_str().ok()))
            .collect::<Vec<_>>()
            .join("\n");
        let account = pacing.then(|| {
            pacing::account(
                upstreams.first().map_or("", |u| u.origin.as_str()),
                &account,
            )
        });
        let relay = Arc::new(Relay {
            upstreams,
            outage,
            account,
            api,
            routes,
            substitutions,
            masks,
            auth,
            headers,
            server_tools,
            bodies: BodyBudget::new(),
            spend,
            trace,
            audit,
        });
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

/// What a request header holds of the placeholders.
enum Credential {
    /// No placeholder.
    None,
    /// A placeholder where it belongs: this is the header's value with the secret.
    Substituted(HeaderValue),
    /// A placeholder anywhere else.
    Misplaced,
}

impl Relay {
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
                let response = relay.handle(req, &exchange).await;
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

    /// `exchange`: the request's span (held, not entered, so its name can still take the model)
    /// and audit.
    async fn handle(&self, req: Request<Incoming>, exchange: &Exchange) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
        let target = match parts.uri.path_and_query() {
            Some(t) if parts.uri.scheme().is_none() && t.as_str().starts_with('/') => {
                t.as_str().to_string()
            }
            _ => {
                return api_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the relay takes origin-form requests (/v1/...) only",
                )
            }
        };
        if self.holds_placeholder(target.as_bytes()) {
            return self.misplaced(&method, &path, "the request target");
        }
        let Some(route) = self.routes.iter().find(|r| r.matches(&method, &path)) else {
            tracing::warn!("model relay: refused {method} {path}: not a route the CLI uses");
            return api_error(
                StatusCode::NOT_FOUND,
                "not_found_error",
                &format!(
                    "{method} {path} is not a {} route the sandbox relays",
                    self.api
                ),
            );
        };
        let upstream = &self.upstreams[route.upstream];
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(HOST);
        for (name, value) in parts.headers.iter_mut() {
            match self.credential(name, value) {
                Credential::None => {}
                Credential::Substituted(secret) => *value = secret,
                Credential::Misplaced => {
                    return self.misplaced(&method, &path, &format!("the {name} header"))
                }
            }
        }
        for (name, value) in &self.headers {
            parts.headers.insert(name.clone(), value.clone());
        }
        // Plain bytes back, so the masking below sees the secret if it is there.
        parts
            .headers
            .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        let uri = format!("{}{}{target}", upstream.origin, upstream.base_path);
        parts.uri = match uri.parse() {
            Ok(uri) => uri,
            Err(_) => {
                return api_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "bad target",
                )
            }
        };
        // The whole body: a provider's signature covers it, and the length is fixed with it.
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = match self.bodies.read(body, declared).await {
            Ok(body) => body,
            Err(refused) => {
                tracing::warn!("model relay: refused {method} {path}: {}", refused.message);
                return api_error(refused.status, "invalid_request_error", &refused.message);
            }
        };
        let bytes = body.bytes.clone();
        if let Some(why) = reach::refusal(self.server_tools.as_deref(), &bytes) {
            tracing::warn!("model relay: refused {method} {path}: {why}");
            return api_error(StatusCode::BAD_REQUEST, "invalid_request_error", &why);
        }
        // What is signed is what is sent: the host and the length are fixed here.
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(HOST, host);
        }
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        parts
            .headers
            .insert(http::header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        // Read once: its model for the record and the pace, whether it streams for its bound.
        let asks = Asks::of(&bytes);
        exchange.requested(method.as_str(), &path, &bytes, asks.model.as_deref());
        // Its worst case reserved against the budget until its answer is counted
        // ([`metering::metered`] takes the hold from the response).
        let hold = match &self.spend {
            Some(meter) => {
                let worst = meter.worst_case(asks.model.as_deref(), bytes.len(), asks.max_tokens);
                match meter.admit(worst).await {
                    Some(hold) => Some(hold),
                    None => return metering::budget_refusal(meter),
                }
            }
            None => None,
        };
        let mut response = self
            .send(upstream, parts, bytes, &asks, &exchange.span)
            .await;
        if let Some(hold) = hold {
            response.extensions_mut().insert(hold);
        }
        response
    }

    /// Sends the request upstream, holding it through an outage ([`outage`]) under the fleet's
    /// pace ([`pacing`]). Sent again only when it provably was not acted on: the answer was a
    /// retryable error status (the API did not take it), or no connection was made. A request
    /// the upstream may have received is never sent again: the API may have acted on it and
    /// billed it (a cut stream included), and the CLI decides what to retry. hyper's pool itself
    /// retries only a request it never wrote, on a pooled connection found closed (a server's
    /// idle timeout racing the next turn).
    async fn send(
        &self,
        upstream: &Upstream,
        template: http::request::Parts,
        bytes: Bytes,
        asks: &Asks,
        span: &tracing::Span,
    ) -> Response<Body> {
        let (method, path) = (template.method.clone(), template.uri.path().to_string());
        let head_bound = asks.head_bound();
        let pace = self
            .account
            .map(|a| pacing::pace_for(a, asks.model.as_deref()));
        let mut attempt: u32 = 0;
        let mut tries = Tries::default();
        loop {
            let permit = match &pace {
                Some(pace) => match self.turn(pace).await {
                    Some(permit) => Some(permit),
                    None => {
                        let reason = "the model API kept failing while the request waited its turn in the fleet's pace, past apiOutageTolerance";
                        tracing::warn!("model relay: {method} {path}: {reason}");
                        return api_error(
                            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                            "overloaded_error",
                            reason,
                        );
                    }
                },
                None => None,
            };
            let mut request = Request::new(full(bytes.clone()));
            *request.method_mut() = template.method.clone();
            *request.uri_mut() = template.uri.clone();
            *request.version_mut() = template.version;
            *request.headers_mut() = template.headers.clone();
            let (mut parts, body) = request.into_parts();
            if let Some(auth) = &self.auth {
                if let Err(reason) = auth.authenticate(&mut parts, &bytes).await {
                    let reason = self.mask_text(&reason);
                    tracing::warn!(
                        "model relay: cannot authenticate to the model provider: {reason}"
                    );
                    return api_error(
                        StatusCode::BAD_GATEWAY,
                        "api_error",
                        &format!("cannot authenticate to the model provider: {reason}"),
                    );
                }
            }
            let sent = tokio::time::timeout(
                head_bound,
                upstream.client.request(Request::from_parts(parts, body)),
            )
            .await;
            drop(permit);
            let sent = match sent {
                Ok(sent) => Ok(sent),
                Err(_) => {
                    // No head: a failure like a connection not made, held and sent again.
                    let reason = format!(
                        "no answer from the model API within {} s",
                        head_bound.as_secs()
                    );
                    Err(HeadTimeout(reason))
                }
            };
            let (reason, answer, headers, failure) = match sent {
                Ok(Ok(response)) => match self.answer_of(upstream, response.status()) {
                    pacing::Answer::Came => {
                        let (parts, body) = response.into_parts();
                        // Held only where a failure would be held too.
                        let holds = self
                            .outage
                            .as_ref()
                            .is_some_and(|o| !o.tolerance().is_zero());
                        let head = if holds && is_event_stream(&parts.headers) {
                            stream_head::read(body).await
                        } else {
                            Head::Content(Bytes::new(), body)
                        };
                        match head {
                            Head::Failed {
                                reason,
                                answer,
                                bytes,
                            } => {
                                let headers = parts.headers.clone();
                                (reason, answer, Some(headers), Failure::Held(parts, bytes))
                            }
                            Head::Content(held, rest) => {
                                return self.came(pace.as_deref(), parts, held, Ok(rest))
                            }
                            Head::Cut(held, e) => {
                                return self.came(pace.as_deref(), parts, held, Err(e))
                            }
                        }
                    }
                    answer => {
                        let status = response.status();
                        let reason = format!(
                            "{} {}",
                            status.as_u16(),
                            status.canonical_reason().unwrap_or("")
                        );
                        let headers = response.headers().clone();
                        (
                            reason.trim().to_string(),
                            answer,
                            Some(headers),
                            Failure::Answer(response),
                        )
                    }
                },
                Err(HeadTimeout(reason)) => {
                    let failure = Failure::Unreached(reason.clone());
                    (reason, pacing::Answer::Failing, None, failure)
                }
                Ok(Err(e)) if e.is_connect() => {
                    let reason = self.failure(upstream, &e);
                    let failure = Failure::Unreached(reason.clone());
                    (reason, pacing::Answer::Failing, None, failure)
                }
                Ok(Err(e)) => {
                    let reason = self.failure(upstream, &e);
                    tracing::warn!("model relay: {reason}");
                    if let Some(o) = &self.outage {
                        o.cut(&reason);
                    }
                    return api_error(StatusCode::BAD_GATEWAY, "api_error", &reason);
                }
            };
            // A rate limit is the account's, never one request's.
            let own = matches!(failure, Failure::Answer(_))
                && answer == pacing::Answer::Failing
                && pace.as_deref().is_some_and(|p| tries.own_failure(p));
            if own && tries.own >= OWN_FAILURES {
                if let Some(o) = &self.outage {
                    o.not_an_outage(&format!("the model API answered this request {reason} {} times while it answered others: the request's failure, not an outage; the CLI gets it", tries.own + 1));
                }
                tracing::warn!("model relay: {method} {path}: {reason}, the request's own");
                return self.failed(failure);
            }
            let wait = match (&pace, own) {
                (Some(pace), false) => pace.learn(answer, headers.as_ref()),
                _ => headers
                    .as_ref()
                    .and_then(pacing::retry_after)
                    .unwrap_or_else(|| backoff(attempt)),
            };
            let hold = match &self.outage {
                Some(o) => o.failed(&reason, wait),
                None => outage::Hold::GiveUp,
            };
            let given_up = match (hold, &self.outage) {
                (outage::Hold::Until(until), Some(o)) => {
                    tracing::info!("model relay: {method} {path}: {reason}; held, sent again");
                    !o.wait(until).await
                }
                _ => true,
            };
            if given_up {
                tracing::warn!("model relay: {method} {path}: {reason}");
                return self.failed(failure);
            }
            attempt = attempt.saturating_add(1);
            span.record("cra.retries", i64::from(attempt));
        }
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

    fn holds_placeholder(&self, bytes: &[u8]) -> bool {
        self.substitutions
            .iter()
            .any(|(p, _)| find(bytes, p.as_bytes()).is_some())
    }

    fn credential(&self, name: &HeaderName, value: &HeaderValue) -> Credential {
        let bytes = value.as_bytes();
        if !self.holds_placeholder(bytes) {
            return Credential::None;
        }
        let whole = |v: &[u8]| {
            self.substitutions
                .iter()
                .find(|(p, _)| p.as_bytes() == v)
                .map(|(_, secret)| secret.as_str())
        };
        let substituted = if name == "x-api-key" {
            whole(bytes).map(str::to_string)
        } else if name == AUTHORIZATION {
            bytes
                .split_at_checked(7)
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"bearer "))
                .and_then(|(_, token)| whole(token))
                .map(|secret| format!("Bearer {secret}"))
        } else {
            None
        };
        match substituted.and_then(|v| HeaderValue::from_str(&v).ok()) {
            Some(mut v) => {
                v.set_sensitive(true);
                Credential::Substituted(v)
            }
            None => Credential::Misplaced,
        }
    }

    fn misplaced(&self, method: &Method, path: &str, place: &str) -> Response<Body> {
        tracing::warn!(
            "model relay: refused {method} {path}: the credential placeholder is in {place}"
        );
        api_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!(
                "the credential placeholder is in {place}; the relay accepts it only as the whole x-api-key value or as Authorization: Bearer"
            ),
        )
    }

    /// Why the upstream request failed, for the 502 and the log: the error's whole chain.
    fn failure(&self, upstream: &Upstream, e: &hyper_util::client::legacy::Error) -> String {
        let origin = upstream.origin.split_once("://").map_or("", |o| o.1);
        let what = match e.is_connect() {
            true => format!("cannot connect to {origin}"),
            false => format!("the request to {origin} failed"),
        };
        let text = std::iter::once(what)
            .chain(sources(e))
            .collect::<Vec<_>>()
            .join(": ");
        self.mask_text(&text)
    }

    /// `text` with every secret masked (a reason quoted back to the CLI).
    fn mask_text(&self, text: &str) -> String {
        String::from_utf8_lossy(&Masker::new(self.masks_now()).push(text.as_bytes(), true))
            .into_owned()
    }

    /// How the relay takes an answer's status. A `502` or `504` of a gateway of the user's own
    /// (`ANTHROPIC_BASE_URL` naming another host than the API's) may come after the API behind
    /// it generated the answer, and sending it again would bill it twice: it goes to the CLI as
    /// it came. The API's own (and a model provider's) `502`/`504` come from its edge, before
    /// the model took the request, and are held like a `529`.
    fn answer_of(&self, upstream: &Upstream, status: StatusCode) -> pacing::Answer {
        let gateway = self.api == "Messages API" && !is_anthropic_api(&upstream.origin);
        match status.as_u16() {
            502 | 504 if gateway => pacing::Answer::Came,
            _ => pacing::Answer::of(status),
        }
    }

    /// What the CLI gets of a failed attempt the relay gives up on.
    fn failed(&self, failure: Failure) -> Response<Body> {
        match failure {
            Failure::Answer(response) => {
                let (parts, body) = response.into_parts();
                self.masked(parts, Bytes::new(), Ok(body), true)
            }
            // What the API sent before its error, as it sent it (the stream ended). Its error
            // event is the failure just recorded, not a cut.
            Failure::Held(parts, bytes) => self.masked(parts, bytes, Err(None), false),
            Failure::Unreached(reason) => api_error(StatusCode::BAD_GATEWAY, "api_error", &reason),
        }
    }

    /// Waits for the request's turn in the fleet's pace. A wait longer than a moment is part of
    /// the session's outage and counts toward `apiOutageTolerance`: `None` once past it (or
    /// stopped meanwhile). Without a tolerance the wait is the pace's alone.
    async fn turn(&self, pace: &Arc<Pace>) -> Option<pacing::Permit> {
        let acquire = pace.acquire();
        tokio::pin!(acquire);
        tokio::select! {
            permit = &mut acquire => return Some(permit),
            _ = tokio::time::sleep(QUEUED) => {}
        }
        let Some(deadline) = self.outage.as_ref().and_then(|o| o.queued()) else {
            return Some(acquire.await);
        };
        let outage = self.outage.as_ref()?;
        tokio::select! {
            permit = &mut acquire => Some(permit),
            _ = outage.wait(deadline) => None,
        }
    }

    /// An answer came (its head, and for a stream its first events, `held`): the fleet's pace
    /// and the outage learn it, and it goes to the CLI.
    fn came(
        &self,
        pace: Option<&Pace>,
        parts: http::response::Parts,
        held: Bytes,
        rest: std::result::Result<Incoming, hyper::Error>,
    ) -> Response<Body> {
        if let Some(pace) = pace {
            pace.learn(pacing::Answer::Came, Some(&parts.headers));
        }
        if let Some(o) = &self.outage {
            o.answered();
        }
        self.masked(parts, held, rest.map_err(Some), true)
    }

    /// The upstream's response with every secret masked, in its headers and its body: `held`
    /// (what the relay read of it already), then `rest` — the body still to come, or how it
    /// ended (`Err(Some)`: cut; `Err(None)`: nothing more). An answer the API cuts, or (with
    /// `scan`) reports an error inside after it began ([`stream_head::ErrorScan`]), is recorded
    /// on the outage.
    fn masked(
        &self,
        mut parts: http::response::Parts,
        held: Bytes,
        rest: std::result::Result<Incoming, Option<hyper::Error>>,
        scan: bool,
    ) -> Response<Body> {
        strip_hop_by_hop(&mut parts.headers);
        let masks = self.masks_now();
        mask_headers(&mut parts.headers, &masks);
        let scan = (scan && is_event_stream(&parts.headers)).then(stream_head::ErrorScan::default);
        let data = Data {
            held: Some(held),
            rest: Some(rest),
        };
        let watch = Watch {
            masker: Masker::new(masks),
            scan,
            outage: self.outage.clone(),
        };
        let frames = futures::stream::unfold(Some((data, watch)), |state| async move {
            let (mut data, mut watch) = state?;
            loop {
                match data.next().await {
                    Some(Ok(bytes)) => {
                        watch.scanned(&bytes);
                        let out = watch.masker.push(&bytes, false);
                        if !out.is_empty() {
                            return Some((Ok(Frame::data(Bytes::from(out))), Some((data, watch))));
                        }
                    }
                    Some(Err(e)) => {
                        // Begun, so not sent again: the CLI sees the cut, and the lifecycle
                        // may continue its conversation.
                        if let Some(o) = &watch.outage {
                            o.cut(&format!("the answer was cut: {e}"));
                        }
                        return Some((Err(BoxError::from(e)), None));
                    }
                    None => {
                        let tail = watch.masker.push(&[], true);
                        return (!tail.is_empty())
                            .then(|| (Ok(Frame::data(Bytes::from(tail))), None));
                    }
                }
            }
        });
        Response::from_parts(parts, BodyExt::boxed(StreamBody::new(frames)))
    }
}

/// A request waiting this long for its turn in the fleet's pace is held by an outage: its wait
/// counts toward the session's tolerance.
const QUEUED: Duration = Duration::from_secs(1);
/// How long a streamed request may wait for its answer's head: the Messages API sends the head
/// of a stream when it takes the request, before anything is generated; past this the request
/// is a failure like a connection not made (held and sent again within the tolerance). A
/// request that is not streamed gets its head with the whole answer: the CLI's own default
/// timeout (10 minutes).
const STREAM_HEAD_BOUND: Duration = Duration::from_secs(120);
const WHOLE_ANSWER_BOUND: Duration = Duration::from_secs(600);

/// What a request body says of how the relay sends it: its model (whose pace it keeps) and
/// whether its answer streams (how long its head may take).
#[derive(Default, serde::Deserialize)]
struct Asks {
    #[serde(default)]
    stream: bool,
    model: Option<String>,
    /// The output it may take: its worst case against the budget.
    max_tokens: Option<u64>,
}

impl Asks {
    fn of(body: &[u8]) -> Asks {
        serde_json::from_slice(body).unwrap_or_default()
    }

    /// The bound on the wait for the answer's head ([`STREAM_HEAD_BOUND`]).
    fn head_bound(&self) -> Duration {
        if self.stream {
            STREAM_HEAD_BOUND
        } else {
            WHOLE_ANSWER_BOUND
        }
    }
}

/// A failing status that one request keeps getting while its model's pace sees answers to
/// others is that request's own (the API cannot serve it), not an outage: it does not put the
/// fleet's pace down, and after this many the CLI gets it instead of the tolerance's wait.
const OWN_FAILURES: u32 = 3;

/// One request's failures, told apart from the API's.
#[derive(Default)]
struct Tries {
    /// The pace's answers when this request first failed.
    answered_at_first: Option<u64>,
    /// Its failures since, while others were answered.
    own: u32,
}

impl Tries {
    /// Whether this failure is the request's own: others of its model were answered since
    /// its first.
    fn own_failure(&mut self, pace: &Pace) -> bool {
        let answered = pace.answered();
        match self.answered_at_first {
            None => {
                self.answered_at_first = Some(answered);
                false
            }
            Some(first) if answered > first => {
                self.own += 1;
                true
            }
            Some(_) => false,
        }
    }
}

/// No head came within [`Asks::head_bound`].
struct HeadTimeout(String);

/// What the CLI gets of a failed attempt when the relay gives up on it.
enum Failure {
    /// The API's error answer.
    Answer(Response<Incoming>),
    /// A streamed answer's head and the error event the API sent in it.
    Held(http::response::Parts, Bytes),
    /// No connection: the relay's own error.
    Unreached(String),
}

/// What watches an answer on its way to the CLI: the masking of secrets, and the API's error
/// events inside a stream.
struct Watch {
    masker: Masker,
    scan: Option<stream_head::ErrorScan>,
    outage: Option<Arc<ApiOutage>>,
}

impl Watch {
    fn scanned(&mut self, bytes: &[u8]) {
        let Some(reason) = self.scan.as_mut().and_then(|s| s.push(bytes)) else {
            return;
        };
        tracing::warn!("model relay: {reason}");
        if let Some(o) = &self.outage {
            o.cut(&reason);
        }
    }
}

/// An answer's data: what the relay read of it already, then the rest of its body (trailers
/// are dropped: the Messages API sends none, and they are not masked), or how it ended.
struct Data {
    held: Option<Bytes>,
    rest: Option<std::result::Result<Incoming, Option<hyper::Error>>>,
}

impl Data {
    async fn next(&mut self) -> Option<std::result::Result<Bytes, hyper::Error>> {
        if let Some(held) = self.held.take() {
            return Some(Ok(held));
        }
        loop {
            match self.rest.as_mut()? {
                Ok(body) => match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            return Some(Ok(data));
                        }
                    }
                    Some(Err(e)) => {
                        self.rest = None;
                        return Some(Err(e));
                    }
                    None => return None,
                },
                Err(_) => {
                    return match self.rest.take() {
                        Some(Err(Some(e))) => Some(Err(e)),
                        _ => None,
                    }
                }
            }
        }
    }
}

/// Whether `origin` (`scheme://host[:port]`) is Anthropic's own API.
fn is_anthropic_api(origin: &str) -> bool {
    let host = origin.split("://").nth(1).unwrap_or(origin);
    let host = host.split(':').next().unwrap_or(host);
    host.eq_ignore_ascii_case("api.anthropic.com")
}

/// A streamed answer (`text/event-stream`): the Messages API's, Vertex AI's, Foundry's.
fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// How long a request waits before it is sent again without the fleet's pace: doubling from
/// half a second to the probe interval's double (the API's recovery is seen within 2 s).
fn backoff(attempt: u32) -> Duration {
    (Duration::from_millis(500) * 2u32.saturating_pow(attempt.min(8)))
        .min(2 * pacing::PROBE_INTERVAL)
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

#[cfg(all(test, unix))]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream, UnixStream};
    use tokio::sync::{mpsc, Notify};
    use tokio::time::Instant;
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio_rustls::rustls::{self, ServerConfig};
    use tokio_rustls::TlsAcceptor;

    use super::*;
    use crate::error::ErrorCode;
    use crate::server::test_io::read_head;

    /// Reads from `client` until what it got contains `needle` (each read bounded: a streamed
    /// part must arrive before the upstream sends the next).
    async fn read_until(client: &mut UnixStream, needle: &str) -> Vec<u8> {
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains(needle) {
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .unwrap_or_else(|_| panic!("{needle:?} arrives in time"))
                .unwrap();
            assert!(n > 0, "the stream ended before {needle:?}");
            got.extend_from_slice(&chunk[..n]);
        }
        got
    }

    const PH: &str = "sk-ant-sandbox-placeholder-test";
    const SECRET: &str = "sk-ant-real-secret";
    /// A request on a route the relay forwards.
    const MESSAGES: &[u8] = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";

    /// A test upstream on 127.0.0.1; each connection is handled by `handle`. Returns its port.
    async fn upstream<F, Fut>(handle: F) -> u16
    where
        F: Fn(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(handle(stream));
            }
        });
        port
    }

    /// Reads one request: its head and its body (Content-Length or chunked).
    async fn read_request(stream: &mut (impl AsyncRead + Unpin)) -> (String, Vec<u8>) {
        let (head, mut body) = read_head(stream).await;
        let chunked = header(&head, "transfer-encoding").is_some();
        let length: usize = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
        let mut chunk = [0u8; 8192];
        while if chunked {
            !body.ends_with(b"0\r\n\r\n")
        } else {
            body.len() < length
        } {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "request ended early");
            body.extend_from_slice(&chunk[..n]);
        }
        (head, body)
    }

    /// The value of a header (the first one named `name`).
    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.split("\r\n").skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// Answers every request with `ok` and reports what arrived.
    async fn recording_upstream() -> (u16, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let port = upstream(move |mut s| {
            let tx = tx.clone();
            async move {
                let request = read_request(&mut s).await;
                tx.send(request).unwrap();
                // A keep-alive answer: the relay must still close the client side.
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            }
        })
        .await;
        (port, rx)
    }

    struct Running {
        _dir: tempfile::TempDir,
        socket: PathBuf,
        _relay: ModelRelay,
    }

    fn relay_to(url: &str, extra_roots: &[PathBuf]) -> Result<Running> {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("relay.sock");
        let subs = vec![(PH.to_string(), SECRET.to_string())];
        let relay =
            ModelRelay::start_with_roots(&socket, RelayPlan::anthropic(url, subs), extra_roots)?;
        Ok(Running {
            _dir: dir,
            socket,
            _relay: relay,
        })
    }

    /// Sends `request` on a fresh connection and reads the answer up to the relay's close.
    async fn send(socket: &Path, request: &[u8]) -> String {
        let mut client = UnixStream::connect(socket).await.unwrap();
        client.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
            .await
            .expect("the relay closes the connection after the response")
            .unwrap();
        String::from_utf8(answer).unwrap()
    }

    #[tokio::test]
    async fn secret_replaces_the_placeholder_and_host_and_path_are_rewritten() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}/anthropic/"), &[]).unwrap();
        let answer = send(
            &relay.socket,
            format!(
                "POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:4000\r\nx-api-key: {PH}\r\n\
                 Authorization: Bearer {PH}\r\nConnection: keep-alive, x-hop\r\nx-hop: 1\r\n\
                 Content-Length: 2\r\n\r\n{{}}"
            )
            .as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert_eq!(header(&answer, "connection"), Some("close"));
        assert_eq!(header(&answer, "keep-alive"), None);
        assert!(answer.ends_with("\r\n\r\nok"));

        let (head, body) = seen.recv().await.unwrap();
        assert!(
            head.starts_with("POST /anthropic/v1/messages?beta=true HTTP/1.1\r\n"),
            "{head}"
        );
        assert_eq!(
            header(&head, "host"),
            Some(format!("127.0.0.1:{port}").as_str())
        );
        assert_eq!(header(&head, "x-api-key"), Some(SECRET));
        assert_eq!(
            header(&head, "authorization"),
            Some(format!("Bearer {SECRET}").as_str())
        );
        assert_eq!(header(&head, "x-hop"), None);
        assert_eq!(
            head.matches("Host:").count() + head.matches("host:").count(),
            1
        );
        assert!(!head.contains(PH));
        assert_eq!(body, b"{}");
    }

    #[tokio::test]
    async fn a_request_the_upstream_read_whole_and_dropped_is_answered_502_and_not_sent_again() {
        // The upstream reads the request, then closes without an answer: it may have acted on
        // it (and billed it), so the relay must not send it again (issue 36).
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        let port = upstream(move |mut s| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                read_request(&mut s).await;
            }
        })
        .await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let answer = send(
            &relay.socket,
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\nContent-Length: 8\r\n\r\n{{\"a\": 1}}"
            )
            .as_bytes(),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{answer}"
        );
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_upstream_closed_while_idle_is_not_used_for_the_next_request() {
        // A server's idle timeout: the first turn's connection is closed between turns; the
        // next turn goes on a new connection and is answered.
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, mut seen) = mpsc::unbounded_channel();
        let counted = connections.clone();
        let port = upstream(move |mut s| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let tx = tx.clone();
            async move {
                let request = read_request(&mut s).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
                    )
                    .await;
                tx.send(request).unwrap();
                // Closed while idle, once the answer is out.
            }
        })
        .await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let request = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n"
        );
        for turn in 0..2 {
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.ends_with("\r\n\r\nok"), "turn {turn}: {answer}");
            seen.recv().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn each_connection_carries_one_request_and_the_client_reconnects() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let request = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n"
        );
        for _ in 0..2 {
            // `send` reads to the end: the relay closed the connection after the response.
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert_eq!(header(&answer, "connection"), Some("close"));
            let (head, _) = seen.recv().await.unwrap();
            assert!(head.starts_with("POST /v1/messages HTTP/1.1\r\n"), "{head}");
            assert_eq!(header(&head, "x-api-key"), Some(SECRET));
        }
    }

    #[tokio::test]
    async fn a_streamed_response_arrives_event_by_event() {
        let second = Arc::new(Notify::new());
        let go = second.clone();
        let port = upstream(move |mut s| {
            let go = go.clone();
            async move {
                read_request(&mut s).await;
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
                s.write_all(b"14\r\nevent: a\ndata: one\n\n\r\n").await.unwrap();
                // The second event only once the client has the first.
                go.notified().await;
                s.write_all(b"14\r\nevent: b\ndata: two\n\n\r\n0\r\n\r\n").await.unwrap();
            }
        })
        .await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        client
            .write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut got = read_until(&mut client, "data: one").await;
        assert!(!String::from_utf8_lossy(&got).contains("data: two"));
        second.notify_one();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        let got = String::from_utf8(got).unwrap();
        assert!(got.ends_with("data: two\n\n\r\n0\r\n\r\n"), "{got}");
    }

    #[tokio::test]
    async fn large_and_chunked_request_bodies_arrive_intact() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        // JSON, as every body the relay forwards (it reads what a request asks the API to
        // reach: `reach`), of every printable byte.
        let text: String = (0..1024 * 1024)
            .map(|i| char::from(b' ' + (i * 31 % 94) as u8))
            .filter(|c| *c != '"' && *c != '\\')
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "text": text })).unwrap();
        let mut request = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let answer = send(&relay.socket, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(seen.recv().await.unwrap().1 == body);

        let chunked = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        let answer = send(&relay.socket, chunked).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        // Read whole (a provider signs it), it goes on with its length.
        let (head, body) = seen.recv().await.unwrap();
        assert_eq!(body, b"{\"a\":1}");
        assert_eq!(header(&head, "content-length"), Some("7"));
    }

    /// An upstream that answers `529` to its first `failures` requests (each with the
    /// `retry-after-ms` given), then `ok`; counts what it was sent.
    async fn failing_upstream(
        failures: usize,
        retry_after_ms: u64,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        counting_upstream(move |n| {
            if n < failures {
                format!("HTTP/1.1 529 Overloaded\r\nretry-after-ms: {retry_after_ms}\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno")
            } else {
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok".to_string()
            }
        })
        .await
    }

    /// An upstream answering its `n`th request (from 0) with `answer(n)`; counts them.
    async fn counting_upstream(
        answer: impl Fn(usize) -> String + Send + Sync + 'static,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        let answer = Arc::new(answer);
        let port = upstream(move |mut s| {
            let (seen, answer) = (seen.clone(), answer.clone());
            async move {
                read_head(&mut s).await;
                let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = s.write_all(answer(n).as_bytes()).await;
            }
        })
        .await;
        (port, count)
    }

    /// A relay to `url` holding requests through outages of up to `tolerance`.
    fn holding_relay_to(url: &str, tolerance: Duration, pacing: bool) -> (Running, Arc<ApiOutage>) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("relay.sock");
        let outage = ApiOutage::new(
            tolerance,
            tokio_util::sync::CancellationToken::new(),
            Box::new(|_| {}),
        );
        let mut plan = RelayPlan::anthropic(url, vec![(PH.to_string(), SECRET.to_string())]);
        plan.outage = Some(outage.clone());
        plan.pacing = pacing;
        let relay = ModelRelay::start_with_roots(&socket, plan, &[]).unwrap();
        let running = Running {
            _dir: dir,
            socket,
            _relay: relay,
        };
        (running, outage)
    }

    #[tokio::test]
    async fn an_overloaded_answer_is_held_and_sent_again_so_the_cli_sees_only_the_recovery() {
        for pacing in [false, true] {
            let (port, sent) = failing_upstream(3, 100).await;
            let (relay, outage) = holding_relay_to(
                &format!("http://127.0.0.1:{port}"),
                Duration::from_secs(30),
                pacing,
            );
            let answer = send(&relay.socket, MESSAGES).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert!(answer.ends_with("ok"));
            assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 4);
            assert_eq!(outage.counts().retries, 3);
            assert!(outage.counts().waited >= Duration::from_millis(250));
            assert!(outage.ongoing().is_none(), "the answer ended the outage");
        }
    }

    #[tokio::test]
    async fn past_the_tolerance_the_cli_gets_the_apis_failure() {
        let (port, sent) = failing_upstream(usize::MAX, 200).await;
        let (relay, outage) = holding_relay_to(
            &format!("http://127.0.0.1:{port}"),
            Duration::from_millis(700),
            false,
        );
        let started = Instant::now();
        let answer = send(&relay.socket, MESSAGES).await;
        assert!(answer.starts_with("HTTP/1.1 529 "), "{answer}");
        assert!(started.elapsed() >= Duration::from_millis(700));
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst) >= 3);
        let (reason, _, may_wait) = outage.ongoing().unwrap();
        assert!(reason.starts_with("529"), "{reason}");
        assert!(!may_wait);
    }

    /// An upstream whose first `failures` answers are `200` streams that report an overload
    /// right after `message_start`, then a stream with content.
    async fn stream_error_upstream(failures: usize) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        counting_upstream(move |n| {
            let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
            let tail = if n < failures {
                "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
            } else {
                "event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\n"
            };
            let body = format!("{start}{tail}");
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        })
        .await
    }

    #[tokio::test]
    async fn an_overload_inside_a_200_stream_is_held_like_a_529_and_past_the_tolerance_the_cli_gets_the_stream_as_sent(
    ) {
        // One request through a relay holding up to `tolerance` to an upstream whose first
        // `failures` streams report an overload: the answer, the upstream's count, the outage.
        let through = |failures, tolerance| async move {
            let (port, sent) = stream_error_upstream(failures).await;
            let (relay, outage) =
                holding_relay_to(&format!("http://127.0.0.1:{port}"), tolerance, false);
            let answer = send(&relay.socket, MESSAGES).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            (
                answer,
                sent.load(std::sync::atomic::Ordering::SeqCst),
                outage,
            )
        };
        let (answer, sent, outage) = through(2, Duration::from_secs(30)).await;
        assert!(
            answer.contains("content_block_start") && !answer.contains("overloaded_error"),
            "{answer}"
        );
        assert_eq!(sent, 3);
        assert_eq!(outage.counts().retries, 2);
        assert!(outage.ongoing().is_none(), "the answer ended the outage");

        let (answer, sent, outage) = through(usize::MAX, Duration::from_millis(700)).await;
        assert!(
            answer.contains("event: message_start") && answer.contains("overloaded_error"),
            "{answer}"
        );
        assert!(sent >= 2);
        let (reason, _, may_wait) = outage.ongoing().unwrap();
        assert_eq!(reason, "200 then overloaded_error: Overloaded");
        assert!(!may_wait);
    }

    #[tokio::test]
    async fn a_gateways_502_or_504_goes_to_the_cli_at_once_and_is_never_sent_again() {
        for status in ["502 Bad Gateway", "504 Gateway Timeout"] {
            let (port, count) = counting_upstream(move |_| {
                format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno")
            })
            .await;
            // 127.0.0.1 is not api.anthropic.com: a gateway of the user's.
            let (relay, outage) = holding_relay_to(
                &format!("http://127.0.0.1:{port}"),
                Duration::from_secs(30),
                true,
            );
            let answer = send(&relay.socket, MESSAGES).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "{answer}"
            );
            assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
            assert!(outage.ongoing().is_none());
        }
        assert!(is_anthropic_api("https://api.anthropic.com"));
        assert!(is_anthropic_api("https://API.anthropic.com:443"));
        assert!(!is_anthropic_api("https://llm-gateway.example.com"));
        assert!(!is_anthropic_api("https://api.anthropic.com.evil.example"));
    }

    #[tokio::test]
    async fn a_held_request_whose_client_went_away_is_never_sent_again() {
        let (port, sent) = failing_upstream(1, 500).await;
        let (relay, _outage) = holding_relay_to(
            &format!("http://127.0.0.1:{port}"),
            Duration::from_secs(30),
            false,
        );
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        client.write_all(MESSAGES).await.unwrap();
        // Held after the first 529; the CLI gives up on it (its own timeout, a stop).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
        drop(client);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            sent.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "nobody waits for its answer: it must not be sent (and billed)"
        );
    }

    #[tokio::test]
    async fn a_connection_that_cannot_be_made_is_held_like_an_outage() {
        let port = closed_port().await;
        let (relay, outage) = holding_relay_to(
            &format!("http://127.0.0.1:{port}"),
            Duration::from_millis(600),
            true,
        );
        let answer = send(&relay.socket, MESSAGES).await;
        assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
        assert!(outage.counts().retries >= 1);
        assert!(outage.ongoing().unwrap().0.contains("cannot connect"));
    }

    /// A port nothing listens on.
    async fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn an_unreachable_upstream_answers_502_with_the_reason() {
        let port = closed_port().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let answer = send(&relay.socket, MESSAGES).await;
        assert!(
            answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{answer}"
        );
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            header(&answer, "content-length"),
            Some(body.len().to_string().as_str())
        );
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("cannot connect to 127.0.0.1:{port}")),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_body_over_the_apis_request_limit_is_refused_413_before_it_is_read() {
        let (port, _seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        // Declared over 32 MB and never sent: the answer comes at once, nothing is read.
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        client
            .write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 32000001\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until(&mut client, "\r\n\r\n").await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
        // Sent chunked (no length declared), it is refused once it passes the limit.
        let mut chunked =
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..33 {
            chunked.extend_from_slice(format!("{:x}\r\n", 1_000_000).as_bytes());
            chunked.extend_from_slice(&vec![b'x'; 1_000_000]);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        // The relay may answer and close before it has all of it.
        let _ = client.write_all(&chunked).await;
        let answer = read_until(&mut client, "\r\n\r\n").await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    }

    #[tokio::test]
    async fn oversized_and_malformed_heads_are_refused() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let big = format!("GET / HTTP/1.1\r\nx-big: {}\r\n\r\n", "a".repeat(70 * 1024));
        let answer = send(&relay.socket, big.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        for bad in [
            "POST http://evil/v1/messages HTTP/1.1\r\n\r\n",
            "POST /v1/messages HTTP/1.1\r\nno colon\r\n\r\n",
            "POST /v1/messages HTTP/1.1\r\nx: a\r\n folded: b\r\n\r\n",
            "POST /v1/messages HTTP/1.1\r\nHost : evil\r\n\r\n",
            "POST /v1/messages HTTP/1.1\r\nx: a\rHost: evil\r\n\r\n",
        ] {
            let answer = send(&relay.socket, bad.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
        }
        // A bare LF ends a header line for hyper as for most servers; the head is re-written,
        // so the upstream still sees one Host, its own.
        let bare_lf = "POST /v1/messages HTTP/1.1\r\nx: a\nHost: evil\r\nContent-Length: 0\r\n\r\n";
        let answer = send(&relay.socket, bare_lf.as_bytes()).await;
        if answer.starts_with("HTTP/1.1 200 ") {
            let (head, _) = seen.recv().await.unwrap();
            assert_eq!(
                header(&head, "host"),
                Some(format!("127.0.0.1:{port}").as_str())
            );
            assert!(!head.to_ascii_lowercase().contains("evil"), "{head}");
        } else {
            assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        }
    }

    #[tokio::test]
    async fn unusable_upstream_urls_and_placeholders_fail_at_start() {
        for url in [
            "api.anthropic.com",
            "ftp://api.anthropic.com",
            "http://",
            "http://:80",
            "https://user:pw@gateway.example/",
            "http://host:99999",
            "https://gateway.example/a?b=c",
            "https://gateway.example/a b",
        ] {
            let e = relay_to(url, &[])
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert_eq!(e.code, ErrorCode::InvalidParams, "{url}");
        }
        let dir = tempfile::tempdir().unwrap();
        let e = ModelRelay::start_with_roots(
            &dir.path().join("s"),
            RelayPlan::anthropic("http://127.0.0.1:1", vec![(String::new(), SECRET.into())]),
            &[],
        )
        .err()
        .unwrap();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert!(!format!("{e:?}").contains(SECRET));
    }

    #[tokio::test]
    async fn the_socket_file_goes_with_the_relay() {
        let running = relay_to("https://api.anthropic.com", &[]).unwrap();
        let socket = running.socket.clone();
        assert!(socket.exists());
        drop(running._relay);
        assert!(!socket.exists());
    }

    #[test]
    fn placeholders_are_fresh_and_shaped_like_a_key() {
        let (a, b) = (placeholder(), placeholder());
        assert_ne!(a, b);
        assert!(a.starts_with("sk-ant-") && a.len() > 40, "{a}");
    }

    /// A TLS acceptor with a fresh self-signed certificate for `localhost`, whose PEM is
    /// written to `dir/ca.pem` (returned) for the relay to trust.
    fn localhost_acceptor(dir: &Path) -> (TlsAcceptor, PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let pem = dir.join("ca.pem");
        std::fs::write(&pem, cert.cert.pem()).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        (TlsAcceptor::from(Arc::new(config)), pem)
    }

    /// An https upstream on 127.0.0.1 with a self-signed certificate for `localhost`; returns
    /// its port and the certificate's PEM file.
    async fn tls_upstream(dir: &Path) -> (u16, PathBuf) {
        let (acceptor, pem) = localhost_acceptor(dir);
        let port = upstream(move |tcp| {
            let acceptor = acceptor.clone();
            async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (head, _) = read_request(&mut tls).await;
                let body = format!(
                    "{}|{}",
                    header(&head, "x-api-key") == Some(SECRET),
                    head.lines().next().unwrap()
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                tls.write_all(answer.as_bytes()).await.unwrap();
                tls.shutdown().await.unwrap();
            }
        })
        .await;
        (port, pem)
    }

    #[tokio::test]
    async fn an_https_upstream_is_trusted_through_an_extra_root_file() {
        let dir = tempfile::tempdir().unwrap();
        let (port, pem) = tls_upstream(dir.path()).await;
        let relay = relay_to(&format!("https://localhost:{port}/gw"), &[pem]).unwrap();
        let answer = send(
            &relay.socket,
            format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.ends_with("\r\n\r\ntrue|POST /gw/v1/messages HTTP/1.1"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn an_https_upstream_with_an_unknown_issuer_answers_502() {
        let dir = tempfile::tempdir().unwrap();
        let (port, _) = tls_upstream(dir.path()).await;
        let relay = relay_to(&format!("https://localhost:{port}"), &[]).unwrap();
        let answer = send(&relay.socket, MESSAGES).await;
        assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
        assert!(
            answer.contains(&format!("cannot connect to localhost:{port}")),
            "{answer}"
        );
        assert!(answer.contains("UnknownIssuer"), "{answer}");
    }

    #[tokio::test]
    async fn a_placeholder_outside_the_credential_headers_is_refused_and_never_substituted() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        for (request, place) in [
            (format!("POST /v1/messages HTTP/1.1\r\nx-api-key: {PH}\r\nanthropic-beta: {PH}\r\nContent-Length: 0\r\n\r\n"), "anthropic-beta header"),
            (format!("POST /v1/messages HTTP/1.1\r\nx-api-key: x{PH}\r\nContent-Length: 0\r\n\r\n"), "x-api-key header"),
            (format!("POST /v1/messages HTTP/1.1\r\nAuthorization: Basic {PH}\r\nContent-Length: 0\r\n\r\n"), "authorization header"),
            (format!("POST /v1/messages HTTP/1.1\r\nAuthorization: Bearer {PH} {PH}\r\nContent-Length: 0\r\n\r\n"), "authorization header"),
            (format!("POST /v1/messages?k={PH} HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n"), "request target"),
            (format!("POST /v1/{PH} HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), "request target"),
        ] {
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 400 "), "{request:?}: {answer}");
            assert!(answer.contains(place), "{request:?}: {answer}");
            assert!(!answer.contains(SECRET), "{answer}");
        }
        // None of them went upstream: the first request there is the next, legitimate one.
        let good = format!("POST /v1/messages HTTP/1.1\r\nauthorization: bearer {PH}\r\nanthropic-beta: b1\r\nContent-Length: 0\r\n\r\n");
        assert!(send(&relay.socket, good.as_bytes())
            .await
            .starts_with("HTTP/1.1 200 "));
        let (head, _) = seen.recv().await.unwrap();
        assert_eq!(
            header(&head, "authorization"),
            Some(format!("Bearer {SECRET}").as_str())
        );
        assert_eq!(header(&head, "anthropic-beta"), Some("b1"));
        assert!(seen.try_recv().is_err());
    }

    #[tokio::test]
    async fn only_the_routes_the_cli_uses_are_forwarded() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        for refused in [
            "GET /v1/models",
            "GET /v1/messages",
            "POST /v1/files",
            "POST /api/oauth/claude_cli/create_api_key",
            "POST /v1/messages/batches",
            "POST /v1/messages/../models",
        ] {
            let request =
                format!("{refused} HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n");
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 404 "), "{refused}: {answer}");
        }
        for route in [
            "/v1/messages?beta=true",
            "/v1/messages/count_tokens?beta=true",
        ] {
            let request =
                format!("POST {route} HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n");
            assert!(send(&relay.socket, request.as_bytes())
                .await
                .starts_with("HTTP/1.1 200 "));
            let (head, _) = seen.recv().await.unwrap();
            assert!(head.starts_with(&format!("POST {route} ")), "{head}");
        }
        assert!(seen.try_recv().is_err());
    }

    #[tokio::test]
    async fn the_secret_is_masked_in_response_headers_and_streamed_bodies_even_split_across_chunks()
    {
        let split = Arc::new(Notify::new());
        let go = split.clone();
        let port = upstream(move |mut s| {
            let go = go.clone();
            async move {
                read_request(&mut s).await;
                let (a, b) = SECRET.split_at(9);
                s.write_all(format!("HTTP/1.1 400 Bad Request\r\nx-echo: key {SECRET}\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes()).await.unwrap();
                let first = format!("event: a\n\ndata: {a}");
                s.write_all(format!("{:x}\r\n{first}\r\n", first.len()).as_bytes()).await.unwrap();
                go.notified().await;
                let second = format!("{b} quoted\n\n");
                s.write_all(format!("{:x}\r\n{second}\r\n0\r\n\r\n", second.len()).as_bytes()).await.unwrap();
            }
        })
        .await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        client
            .write_all(
                format!(
                    "POST /v1/messages HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        // What precedes the split reaches the client before the rest exists.
        let mut got = read_until(&mut client, "event: a\n\n").await;
        split.notify_one();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        let got = String::from_utf8(got).unwrap();
        assert!(
            !got.contains(SECRET) && !got.contains(&SECRET[..9]),
            "{got}"
        );
        let stars = "*".repeat(SECRET.len());
        assert_eq!(
            header(&got, "x-echo"),
            Some(format!("key {stars}").as_str())
        );
        // The held-back start of the secret comes masked with the rest, in the next chunk.
        assert!(got.contains("data: \r\n"), "{got}");
        assert!(got.contains(&format!("{stars} quoted\n\n")), "{got}");
    }

    /// An https upstream on hyper (keep-alive, like the real API) answering every request with
    /// 200; counts the TCP connections it accepts.
    async fn pooled_tls_upstream(
        dir: &Path,
    ) -> (u16, PathBuf, Arc<std::sync::atomic::AtomicUsize>) {
        let (acceptor, pem) = localhost_acceptor(dir);
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let port = upstream(move |tcp| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let acceptor = acceptor.clone();
            async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(Response::new(full("ok")))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            }
        })
        .await;
        (port, pem, accepted)
    }

    #[tokio::test]
    async fn upstream_connections_are_reused_across_requests() {
        let dir = tempfile::tempdir().unwrap();
        let (port, pem, accepted) = pooled_tls_upstream(dir.path()).await;
        let relay = relay_to(&format!("https://localhost:{port}"), &[pem]).unwrap();
        let request =
            format!("POST /v1/messages HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n");
        for _ in 0..20 {
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
