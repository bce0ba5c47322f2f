//! The gateway's part of the session's budget, its HTTP side: every successful response is
//! read as it streams back to the CLI for its `usage` (by [`crate::spend::UsageReader`], which
//! knows where each format carries it), which is counted on the session's [`SpendMeter`] when
//! the response ends (or when the CLI stops reading it: what was used so far counts); once the
//! spend has passed the budget, every further request is refused with an API error the CLI
//! shows, and nothing more reaches the API. What is counted, at what price and against which
//! budget is [`crate::spend`]'s; here is only the wrapper a response passes through.

use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};

use super::api_error;
use super::trace::Exchange;
use crate::server::Body;
use crate::spend::{Hold, SpendMeter, UsageReader};

/// The refusal of a request once the budget is spent (`None` while it is not, or without a
/// meter).
pub(super) fn refusal(meter: Option<&SpendMeter>) -> Option<Response<Body>> {
    meter.filter(|m| m.exceeded()).map(budget_refusal)
}

/// The refusal of a request the budget has no room for (counted on `meter`).
pub(super) fn budget_refusal(meter: &SpendMeter) -> Response<Body> {
    meter.refuse();
    let spent = meter.describe();
    tracing::warn!("model relay: refused a request: the session's budget is spent: {spent}");
    api_error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        &format!("the session's model budget is spent: {spent}; the session is being ended"),
    )
}

/// `response` with its usage counted on `meter` as it passes (unchanged without a meter, and
/// for a response that is not a success).
pub(super) fn metered(
    meter: Option<&Arc<SpendMeter>>,
    response: Response<Body>,
    exchange: Exchange,
) -> Response<Body> {
    let Some(meter) = meter.filter(|_| response.status().is_success()) else {
        exchange.answered(None, None);
        return response;
    };
    let (mut parts, body) = response.into_parts();
    // The request's reservation, settled once its usage is counted (module docs of `spend`).
    let hold = parts.extensions.remove::<Hold>();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let counting = Counting {
        reader: UsageReader::new(content_type, length),
        meter: meter.clone(),
        exchange: Some(exchange),
        _hold: hold,
    };
    let frames = futures::stream::unfold(Some((body, counting)), |state| async move {
        let (mut body, mut counting) = state?;
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    counting.reader.push(data);
                    if let Some(exchange) = &mut counting.exchange {
                        exchange.saw(data);
                    }
                    // Counted before the message's last bytes go on: the CLI's next request
                    // (which may need refusing) cannot come before its count.
                    if counting.reader.ended() {
                        counting.count();
                    }
                }
                Some((Ok(frame), Some((body, counting))))
            }
            // `counting` is dropped here, and counts what came.
            Some(Err(e)) => Some((Err(e), None)),
            None => None,
        }
    });
    Response::from_parts(parts, BodyExt::boxed(StreamBody::new(frames)))
}

/// Counts what its reader found when dropped: at the response's end, or when the CLI stopped
/// reading it (a cut or interrupted stream was still billed for what it used).
struct Counting {
    reader: UsageReader,
    meter: Arc<SpendMeter>,
    /// The request's span and metrics, ended with the first count.
    exchange: Option<Exchange>,
    /// Its reservation against the budget: released after the count (fields drop after
    /// `Drop::drop`, which counts).
    _hold: Option<Hold>,
}

impl Counting {
    /// Counts what was found, once (the reader gives its usage away).
    fn count(&mut self) {
        let found = self.reader.finish();
        let counted = found.as_ref().map(|(model, usage)| {
            let cost = self.meter.record(model.as_deref(), usage);
            tracing::debug!(
                ?model,
                ?usage,
                cost,
                "model relay: a response's usage counted"
            );
            (model.as_deref(), usage, cost)
        });
        if let Some(exchange) = self.exchange.take() {
            match counted {
                Some((model, usage, cost)) => exchange.answered(model, Some((usage, cost))),
                None => exchange.answered(None, None),
            }
        }
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spend::usage::tests::STREAM;
    use crate::spend::Prices;

    #[tokio::test]
    async fn a_metered_response_counts_when_read_and_once_spent_requests_are_refused() {
        let meter = SpendMeter::new(Some(0.001), Prices::default());
        assert!(refusal(Some(&meter)).is_none());
        let mut response = Response::new(crate::server::full(STREAM));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, "text/event-stream".parse().unwrap());
        let body = metered(Some(&meter), response, Exchange::begin(None, None)).into_body();
        assert_eq!(
            meter.stats().requests,
            0,
            "counted when the response has passed"
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(bytes, STREAM.as_bytes(), "passed on unchanged");
        assert_eq!(meter.stats().requests, 1);
        // Sonnet: 120 in, 42 out, 30k cache reads, 2k cache writes.
        let usd = (120.0 * 3.0 + 42.0 * 15.0 + 30_000.0 * 0.3 + 2_000.0 * 3.75) / 1e6;
        assert!((meter.stats().usd - usd).abs() < 1e-12);
        assert!(meter.exceeded());
        let refused = refusal(Some(&meter)).expect("refused once spent");
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let text = refused.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&text);
        assert!(
            text.contains("budget is spent: $0.0175 of maxBudgetUsd $0.001 (1 model request)"),
            "{text}"
        );
        assert_eq!(meter.stats().refused, 1);
    }

    /// Sends `request` to the relay's socket and returns the whole answer.
    #[cfg(unix)]
    async fn send(socket: &std::path::Path, request: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut client = tokio::net::UnixStream::connect(socket).await.unwrap();
        client.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_relay_with_a_meter_counts_each_answer_and_sends_nothing_whose_worst_case_would_pass_the_budget(
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // An upstream answering every request with STREAM (Sonnet, $0.01749), counting them.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1024];
                    // The head, and the small body with it.
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = s.read(&mut b).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&b[..n]);
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{STREAM}",
                        STREAM.len()
                    );
                    s.write_all(answer.as_bytes()).await.unwrap();
                });
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("model.sock");
        let meter = SpendMeter::new(Some(0.03), Prices::default());
        let mut plan = super::super::RelayPlan::anthropic(
            &format!("http://127.0.0.1:{port}"),
            vec![("sk-ant-placeholder".into(), "sk-ant-secret".into())],
        );
        plan.spend = Some(meter.clone());
        let _relay = super::super::ModelRelay::start_plan(&socket, plan)
            .await
            .unwrap();
        // Its worst case: 1,000 output tokens at Sonnet's $15 per million, $0.015 (and its few
        // bytes of input).
        let body = r#"{"model":"claude-sonnet-4-5","max_tokens":1000}"#;
        let request = format!("POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-ant-placeholder\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        // The first fits ($0 + $0.0151) and costs $0.0175; the second would fit only if its
        // answer cost less than its worst case allows ($0.0175 + $0.0151 > $0.03): refused
        // before it is sent, and the budget is spent.
        let answer = send(&socket, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(!meter.exceeded());
        let answer = send(&socket, &request).await;
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
        assert!(answer.contains("the session's model budget is spent: $0.0175 of maxBudgetUsd $0.03 (1 model request); the next request's worst case ($0.0151) does not fit what is left"), "{answer}");
        assert!(meter.exceeded());
        assert_eq!(
            served.load(Ordering::SeqCst),
            1,
            "the refused request never went upstream"
        );
        let s = meter.stats();
        assert_eq!((s.requests, s.refused), (1, 1));
        assert!(s.usd <= 0.03);
    }

    #[tokio::test]
    async fn an_error_response_and_a_response_dropped_unread_count_nothing_and_what_was_read() {
        let meter = SpendMeter::new(None, Prices::default());
        let mut error = Response::new(crate::server::full("{}"));
        *error.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        drop(
            metered(Some(&meter), error, Exchange::begin(None, None))
                .into_body()
                .collect()
                .await,
        );
        assert_eq!(meter.stats().requests, 0);
        // A response the CLI stopped reading after message_start still counts its input.
        let cut = &STREAM[..STREAM.find("event: content_block_delta").unwrap()];
        let (tx, rx) = futures::channel::mpsc::unbounded::<
            Result<hyper::body::Frame<bytes::Bytes>, crate::https::BoxError>,
        >();
        tx.unbounded_send(Ok(hyper::body::Frame::data(bytes::Bytes::from(cut))))
            .unwrap();
        let mut response = Response::new(BodyExt::boxed(StreamBody::new(rx)));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, "text/event-stream".parse().unwrap());
        let mut body = metered(Some(&meter), response, Exchange::begin(None, None)).into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        let s = meter.stats();
        assert_eq!(s.requests, 1);
        assert!(
            (s.usd - (120.0 * 3.0 + 15.0 + 30_000.0 * 0.3 + 2_000.0 * 3.75) / 1e6).abs() < 1e-12
        );
    }
}
