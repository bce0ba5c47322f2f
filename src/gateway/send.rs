//! A request sent upstream: each attempt in its turn of the fleet's pace ([`super::pacing`]),
//! and sent again, held through the session's outage ([`super::outage`]), only while it
//! provably was not acted on ([`Relay::send`]). What comes back goes to the CLI through
//! [`super::answer`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::answer::{is_event_stream, Failure};
use super::outage::Hold;
use super::pacing::{self, Pace};
use super::stream_head::{self, Head};
use super::upstream::Upstream;
use super::{api_error, Relay};
use crate::https::sources;
use crate::server::{full, Body};

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
pub(super) struct Asks {
    #[serde(default)]
    stream: bool,
    pub(super) model: Option<String>,
    /// The output it may take: its worst case against the budget.
    pub(super) max_tokens: Option<u64>,
}

impl Asks {
    pub(super) fn of(body: &[u8]) -> Asks {
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

/// How one attempt ended.
enum Attempt {
    /// For the CLI, as it is: an answer that came, or a failure never to send again.
    Done(Response<Body>),
    /// A failure the request may be held through and sent again.
    Failed(Failed),
}

/// A failed attempt: its reason, how the pace takes it (`answer`), the answer's headers (for a
/// `retry-after`), and what the CLI gets if the relay gives up on it.
struct Failed {
    reason: String,
    answer: pacing::Answer,
    headers: Option<HeaderMap>,
    failure: Failure,
}

impl Failed {
    /// No answer: no connection made, or no head in time.
    fn unreached(reason: String) -> Failed {
        Failed {
            failure: Failure::Unreached(reason.clone()),
            reason,
            answer: pacing::Answer::Failing,
            headers: None,
        }
    }

    /// The API's error status.
    fn status(answer: pacing::Answer, response: Response<Incoming>) -> Failed {
        let status = response.status();
        let reason = format!(
            "{} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        Failed {
            reason: reason.trim().to_string(),
            answer,
            headers: Some(response.headers().clone()),
            failure: Failure::Answer(response),
        }
    }
}

impl Relay {
    /// Sends the request upstream, holding it through an outage ([`super::outage`]) under the
    /// fleet's pace ([`pacing`]). Sent again only when it provably was not acted on: the answer was a
    /// retryable error status (the API did not take it), or no connection was made. A request
    /// the upstream may have received is never sent again: the API may have acted on it and
    /// billed it (a cut stream included), and the CLI decides what to retry. hyper's pool itself
    /// retries only a request it never wrote, on a pooled connection found closed (a server's
    /// idle timeout racing the next turn).
    pub(super) async fn send(
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
                    None => return pace_outlasted(&method, &path),
                },
                None => None,
            };
            let sent = self.attempt(
                upstream,
                &template,
                &bytes,
                head_bound,
                permit,
                pace.as_deref(),
            );
            let failed = match sent.await {
                Attempt::Done(response) => return response,
                Attempt::Failed(failed) => failed,
            };
            // A rate limit is the account's, never one request's.
            let own = matches!(failed.failure, Failure::Answer(_))
                && failed.answer == pacing::Answer::Failing
                && pace.as_deref().is_some_and(|p| tries.own_failure(p));
            if own && tries.own >= OWN_FAILURES {
                return self.own_failure(&method, &path, failed, tries.own);
            }
            let wait = wait_after(pace.as_deref(), own, &failed, attempt);
            if !self.held(&method, &path, &failed.reason, wait).await {
                tracing::warn!("model relay: {method} {path}: {}", failed.reason);
                return self.failed(failed.failure);
            }
            attempt = attempt.saturating_add(1);
            span.record("cra.retries", i64::from(attempt));
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

    /// One attempt: the request made anew from `template` and `bytes`, authenticated (a
    /// provider's signature or token is fresh each time) and sent in its turn of the fleet's
    /// pace (`permit`, given back once the head came or did not), and what came of it.
    async fn attempt(
        &self,
        upstream: &Upstream,
        template: &http::request::Parts,
        bytes: &Bytes,
        head_bound: Duration,
        permit: Option<pacing::Permit>,
        pace: Option<&Pace>,
    ) -> Attempt {
        let mut request = Request::new(full(bytes.clone()));
        *request.method_mut() = template.method.clone();
        *request.uri_mut() = template.uri.clone();
        *request.version_mut() = template.version;
        *request.headers_mut() = template.headers.clone();
        let (mut parts, body) = request.into_parts();
        if let Some(auth) = &self.auth {
            if let Err(reason) = auth.authenticate(&mut parts, bytes).await {
                let reason = self.mask_text(&reason);
                tracing::warn!("model relay: cannot authenticate to the model provider: {reason}");
                return Attempt::Done(api_error(
                    StatusCode::BAD_GATEWAY,
                    "api_error",
                    &format!("cannot authenticate to the model provider: {reason}"),
                ));
            }
        }
        let sent = tokio::time::timeout(
            head_bound,
            upstream.client.request(Request::from_parts(parts, body)),
        )
        .await;
        drop(permit);
        match sent {
            Ok(Ok(response)) => self.answered(upstream, pace, response).await,
            // No head: a failure like a connection not made, held and sent again.
            Err(_) => Attempt::Failed(Failed::unreached(format!(
                "no answer from the model API within {} s",
                head_bound.as_secs()
            ))),
            Ok(Err(e)) if e.is_connect() => {
                Attempt::Failed(Failed::unreached(self.failure(upstream, &e)))
            }
            // Written, so perhaps acted on: never sent again (see [`Relay::send`]).
            Ok(Err(e)) => {
                let reason = self.failure(upstream, &e);
                tracing::warn!("model relay: {reason}");
                if let Some(o) = &self.outage {
                    o.cut(&reason);
                }
                Attempt::Done(api_error(StatusCode::BAD_GATEWAY, "api_error", &reason))
            }
        }
    }

    /// What an answer is: one that came goes to the CLI ([`Relay::came`]), a failing status is
    /// a failure the request may be held through. A stream is read up to its first content
    /// event where a failure would be held (an outage with a tolerance): an overload the API
    /// reports inside a `200` stream ([`stream_head`]) is a failure too.
    async fn answered(
        &self,
        upstream: &Upstream,
        pace: Option<&Pace>,
        response: Response<Incoming>,
    ) -> Attempt {
        let answer = self.answer_of(upstream, response.status());
        if answer != pacing::Answer::Came {
            return Attempt::Failed(Failed::status(answer, response));
        }
        let (parts, body) = response.into_parts();
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
            } => Attempt::Failed(Failed {
                reason,
                answer,
                headers: Some(parts.headers.clone()),
                failure: Failure::Held(parts, bytes),
            }),
            Head::Content(held, rest) => Attempt::Done(self.came(pace, parts, held, Ok(rest))),
            Head::Cut(held, e) => Attempt::Done(self.came(pace, parts, held, Err(e))),
        }
    }

    /// A failure that is the request's own, [`OWN_FAILURES`] times over: the outage is told
    /// that it is not an outage, and the CLI gets it.
    fn own_failure(&self, method: &Method, path: &str, failed: Failed, own: u32) -> Response<Body> {
        let reason = &failed.reason;
        if let Some(o) = &self.outage {
            o.not_an_outage(&format!("the model API answered this request {reason} {} times while it answered others: the request's failure, not an outage; the CLI gets it", own + 1));
        }
        tracing::warn!("model relay: {method} {path}: {reason}, the request's own");
        self.failed(failed.failure)
    }

    /// Whether the session's outage holds the request through its failure (`reason`, at
    /// least `wait` before it is sent again) and it is to be sent again; `false`: the relay
    /// gives up on it (no outage to hold it, past its tolerance, or the session stopped).
    async fn held(&self, method: &Method, path: &str, reason: &str, wait: Duration) -> bool {
        let Some(outage) = &self.outage else {
            return false;
        };
        match outage.failed(reason, wait) {
            Hold::Until(until) => {
                tracing::info!("model relay: {method} {path}: {reason}; held, sent again");
                outage.wait(until).await
            }
            Hold::GiveUp => false,
        }
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
}

/// The answer when the wait for the request's turn in the fleet's pace outlasted the session's
/// tolerance.
fn pace_outlasted(method: &Method, path: &str) -> Response<Body> {
    let reason = "the model API kept failing while the request waited its turn in the fleet's pace, past apiOutageTolerance";
    tracing::warn!("model relay: {method} {path}: {reason}");
    api_error(
        StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
        "overloaded_error",
        reason,
    )
}

/// How long before a failed request is sent again: what the fleet's pace learns of the
/// failure (a request's own failure teaches it nothing, [`OWN_FAILURES`]), else the answer's
/// `retry-after`, else a [`backoff`].
fn wait_after(pace: Option<&Pace>, own: bool, failed: &Failed, attempt: u32) -> Duration {
    match pace {
        Some(pace) if !own => pace.learn(failed.answer, failed.headers.as_ref()),
        _ => failed
            .headers
            .as_ref()
            .and_then(pacing::retry_after)
            .unwrap_or_else(|| backoff(attempt)),
    }
}

/// Whether `origin` (`scheme://host[:port]`) is Anthropic's own API.
pub(super) fn is_anthropic_api(origin: &str) -> bool {
    let host = origin.split("://").nth(1).unwrap_or(origin);
    let host = host.split(':').next().unwrap_or(host);
    host.eq_ignore_ascii_case("api.anthropic.com")
}

/// How long a request waits before it is sent again without the fleet's pace: doubling from
/// half a second to the probe interval's double (the API's recovery is seen within 2 s).
fn backoff(attempt: u32) -> Duration {
    (Duration::from_millis(500) * 2u32.saturating_pow(attempt.min(8)))
        .min(2 * pacing::PROBE_INTERVAL)
}
