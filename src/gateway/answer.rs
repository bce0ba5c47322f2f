//! An answer on its way back to the CLI: every secret masked in its headers and body (a
//! secret split across chunks too, [`super::mask`]), the fleet's pace and the session's outage
//! told that it came, and a stream watched for the API's error events inside it and for its
//! cut, both recorded on the outage ([`super::stream_head::ErrorScan`]).

use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};

use super::mask::{mask_headers, Masker};
use super::outage::ApiOutage;
use super::pacing::{self, Pace};
use super::stream_head;
use super::{api_error, Relay};
use crate::https::BoxError;
use crate::server::{strip_hop_by_hop, Body};

/// What the CLI gets of a failed attempt when the relay gives up on it.
pub(super) enum Failure {
    /// The API's error answer.
    Answer(Response<Incoming>),
    /// A streamed answer's head and the error event the API sent in it.
    Held(http::response::Parts, Bytes),
    /// No connection: the relay's own error.
    Unreached(String),
}

impl Relay {
    /// What the CLI gets of a failed attempt the relay gives up on.
    pub(super) fn failed(&self, failure: Failure) -> Response<Body> {
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

    /// An answer came (its head, and for a stream its first events, `held`): the fleet's pace
    /// and the outage learn it, and it goes to the CLI.
    pub(super) fn came(
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

/// A streamed answer (`text/event-stream`): the Messages API's, Vertex AI's, Foundry's.
pub(super) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}
