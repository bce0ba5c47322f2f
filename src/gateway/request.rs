//! A CLI's request on its way in, up to its sending ([`super::send`]): its target and route
//! (only the CLI's), the placeholders it holds put right or refused (module docs of
//! [`super`]), the body read whole within the session's memory and checked for the server
//! tools it may use, the head fixed as it will be signed, and its worst case reserved against
//! the budget. Each step's refusal is an API error the CLI shows; nothing of a refused request
//! goes upstream.

use http::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_LENGTH, HOST,
    TRANSFER_ENCODING,
};
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;

use super::body::HeldBody;
use super::mask::find;
use super::route::Route;
use super::send::Asks;
use super::trace::Exchange;
use super::upstream::Upstream;
use super::{api_error, metering, reach, Relay};
use crate::server::{strip_hop_by_hop, Body};
use crate::spend::Hold;

/// What a request header holds of the placeholders.
enum Credential {
    /// No placeholder.
    None,
    /// A placeholder where it belongs: this is the header's value with the secret.
    Substituted(HeaderValue),
    /// A placeholder anywhere else.
    Misplaced,
}

/// A refusal: the answer the CLI gets instead of the request being sent (boxed, so that every
/// step's `Result` is not as large as a response).
type Refusal = Box<Response<Body>>;

impl Relay {
    /// Takes the CLI's request in and sends it (`exchange`: its span, held, not entered, so
    /// that its name can still take the model, and its audit). `Err`: refused before it was
    /// sent, with the answer the CLI gets.
    pub(super) async fn handle(
        &self,
        req: Request<Incoming>,
        exchange: &Exchange,
    ) -> Result<Response<Body>, Refusal> {
        let (mut parts, body) = req.into_parts();
        let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
        let target = self.target(&parts.uri, &method, &path)?;
        let route = self.route(&method, &path)?;
        let upstream = &self.upstreams[route.upstream];
        self.upstream_headers(&mut parts.headers, &method, &path)?;
        parts.uri = upstream_uri(upstream, &target)?;
        // Held until the request is sent: its share of the engine's memory ([`super::body`]).
        let body = self.body(body, &parts.headers, &method, &path).await?;
        let bytes = body.bytes.clone();
        signed_as_sent(&mut parts, bytes.len());
        // Read once: its model for the record and the pace, whether it streams for its bound.
        let asks = Asks::of(&bytes);
        exchange.requested(method.as_str(), &path, &bytes, asks.model.as_deref());
        let hold = self.reserve(&asks, bytes.len()).await?;
        let mut response = self
            .send(upstream, parts, bytes, &asks, &exchange.span)
            .await;
        if let Some(hold) = hold {
            response.extensions_mut().insert(hold);
        }
        Ok(response)
    }

    /// The request's target, which goes after the upstream's base URL: origin-form
    /// (`/v1/...`) only, and without a placeholder.
    fn target(&self, uri: &Uri, method: &Method, path: &str) -> Result<String, Refusal> {
        let target = match uri.path_and_query() {
            Some(t) if uri.scheme().is_none() && t.as_str().starts_with('/') => {
                t.as_str().to_string()
            }
            _ => {
                return Err(api_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the relay takes origin-form requests (/v1/...) only",
                )
                .into())
            }
        };
        if self.holds_placeholder(target.as_bytes()) {
            return Err(self.misplaced(method, path, "the request target"));
        }
        Ok(target)
    }

    /// The route the request takes: only those the CLI uses are forwarded.
    fn route(&self, method: &Method, path: &str) -> Result<&Route, Refusal> {
        self.routes
            .iter()
            .find(|r| r.matches(method, path))
            .ok_or_else(|| {
                tracing::warn!("model relay: refused {method} {path}: not a route the CLI uses");
                api_error(
                    StatusCode::NOT_FOUND,
                    "not_found_error",
                    &format!(
                        "{method} {path} is not a {} route the sandbox relays",
                        self.api
                    ),
                )
                .into()
            })
    }

    /// The request's headers as they go upstream: the connection's own and `Host` dropped,
    /// the placeholders' secrets put in where they belong (a misplaced one refuses the
    /// request), the user's gateway headers added.
    fn upstream_headers(
        &self,
        headers: &mut HeaderMap,
        method: &Method,
        path: &str,
    ) -> Result<(), Refusal> {
        strip_hop_by_hop(headers);
        headers.remove(HOST);
        for (name, value) in headers.iter_mut() {
            match self.credential(name, value) {
                Credential::None => {}
                Credential::Substituted(secret) => *value = secret,
                Credential::Misplaced => {
                    return Err(self.misplaced(method, path, &format!("the {name} header")))
                }
            }
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        // Plain bytes back, so the masking of the answer sees the secret if it is there.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        Ok(())
    }

    /// The whole body (a provider's signature covers it, and the length is fixed with it),
    /// refused when the session's memory cannot take it ([`super::body`]) or it asks for a
    /// server tool the session may not use ([`reach`]).
    async fn body(
        &self,
        body: Incoming,
        headers: &HeaderMap,
        method: &Method,
        path: &str,
    ) -> Result<HeldBody, Refusal> {
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = match self.bodies.read(body, declared).await {
            Ok(body) => body,
            Err(refused) => {
                tracing::warn!("model relay: refused {method} {path}: {}", refused.message);
                return Err(
                    api_error(refused.status, "invalid_request_error", &refused.message).into(),
                );
            }
        };
        if let Some(why) = reach::refusal(self.server_tools.as_deref(), &body.bytes) {
            tracing::warn!("model relay: refused {method} {path}: {why}");
            return Err(api_error(StatusCode::BAD_REQUEST, "invalid_request_error", &why).into());
        }
        Ok(body)
    }

    /// The request's worst case reserved against the session's budget until its answer is
    /// counted ([`metering::metered`] takes the hold from the response); refused when the
    /// budget has no room for it. `None`: no meter.
    async fn reserve(&self, asks: &Asks, body_bytes: usize) -> Result<Option<Hold>, Refusal> {
        let Some(meter) = &self.spend else {
            return Ok(None);
        };
        let worst = meter.worst_case(asks.model.as_deref(), body_bytes, asks.max_tokens);
        match meter.admit(worst).await {
            Some(hold) => Ok(Some(hold)),
            None => Err(metering::budget_refusal(meter).into()),
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

    fn misplaced(&self, method: &Method, path: &str, place: &str) -> Refusal {
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
        .into()
    }
}

/// The upstream's URL for `target`: its origin and base path, then the target.
fn upstream_uri(upstream: &Upstream, target: &str) -> Result<Uri, Refusal> {
    format!("{}{}{target}", upstream.origin, upstream.base_path)
        .parse()
        .map_err(|_| {
            api_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad target",
            )
            .into()
        })
}

/// What is signed is what is sent: the host and the length are fixed here, before a
/// provider signs the head ([`super::provider_spec::Authenticate`]).
fn signed_as_sent(parts: &mut http::request::Parts, length: usize) {
    if let Some(host) = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    {
        parts.headers.insert(HOST, host);
    }
    parts.headers.remove(TRANSFER_ENCODING);
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(length));
}
