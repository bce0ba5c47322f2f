//! Errors the API reports inside a successful answer. A streamed answer's head is `200`; the
//! Messages API (and Vertex AI, Foundry) report a failure after it as an SSE `error` event —
//! an overload, an internal error, a rate limit — as Anthropic's streaming documentation says
//! errors after the head arrive. The relay treats those as the API failures they are:
//!
//! - Before any content: the answer's first events (`message_start`, `ping`) are held until the
//!   first content event, which costs the first token nothing measurable (they come together,
//!   see docs/benchmarks.md). An `error` event there means the API did not answer, and the
//!   request is held and sent again like a `529` ([`Head::Failed`]); nothing of it reached the
//!   CLI.
//! - After content began: it is an answer cut, as a dropped connection is ([`ErrorScan`]): the
//!   CLI sees it, and the lifecycle may continue its conversation.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::pacing::Answer;

/// The most of an answer's head held back before it goes to the CLI regardless (the events
/// before content are a few hundred bytes).
const MAX_HELD: usize = 64 * 1024;

/// The API's error types that say it did not serve the request, not that the request was wrong,
/// and how the fleet's pace takes each.
fn retryable(kind: &str) -> Option<Answer> {
    match kind {
        "overloaded_error" | "api_error" | "timeout_error" => Some(Answer::Failing),
        "rate_limit_error" => Some(Answer::RateLimited),
        _ => None,
    }
}

/// What the head of a streamed answer said.
pub(super) enum Head {
    /// Content (or something the relay does not hold for) came: the held bytes go first.
    Content(Bytes, Incoming),
    /// The API reported a retryable error before any content: `reason` names it, `bytes` are
    /// what came (the CLI gets them if the relay gives up), `answer` is how the pace takes it.
    Failed {
        reason: String,
        answer: Answer,
        bytes: Bytes,
    },
    /// The body failed (a cut) while the head was read: what came, and the error.
    Cut(Bytes, hyper::Error),
}

/// Reads an SSE answer's events up to its first content event or error.
pub(super) async fn read(mut body: Incoming) -> Head {
    let mut held = BytesMut::new();
    let mut scanned = 0;
    loop {
        // Whole events only: each ends with a blank line.
        while let Some(end) = find_blank_line(&held[scanned..]) {
            let event = &held[scanned..scanned + end];
            scanned += end + 2;
            match classify(event) {
                Event::Preamble => {}
                Event::Error(kind, message) => match retryable(&kind) {
                    Some(answer) => {
                        return Head::Failed {
                            reason: format!("200 then {kind}: {message}"),
                            answer,
                            bytes: held.freeze(),
                        }
                    }
                    None => return Head::Content(held.freeze(), body),
                },
                Event::Content => return Head::Content(held.freeze(), body),
            }
        }
        if held.len() > MAX_HELD {
            return Head::Content(held.freeze(), body);
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    held.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Head::Cut(held.freeze(), e),
            None => return Head::Content(held.freeze(), body),
        }
    }
}

enum Event {
    /// `message_start`, `ping`: what comes before content.
    Preamble,
    Error(String, String),
    Content,
}

/// One SSE event's kind: its `event:` line, or its data's `type` (the API sends both).
fn classify(event: &[u8]) -> Event {
    let text = String::from_utf8_lossy(event);
    let mut name = None;
    let mut data = String::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.trim_start());
        }
    }
    let parsed: Option<serde_json::Value> = serde_json::from_str(&data).ok();
    let kind = name.or_else(|| {
        parsed
            .as_ref()
            .and_then(|v| v.get("type")?.as_str().map(str::to_string))
    });
    match kind.as_deref() {
        Some("message_start" | "ping") | None => Event::Preamble,
        Some("error") => {
            let error = parsed.as_ref().and_then(|v| v.get("error"));
            let field = |k: &str| {
                error
                    .and_then(|e| e.get(k)?.as_str())
                    .unwrap_or("")
                    .to_string()
            };
            Event::Error(field("type"), field("message"))
        }
        Some(_) => Event::Content,
    }
}

fn find_blank_line(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\n\n")
}

/// Watches an answer as it streams to the CLI for an `error` event the API sent after content
/// began: each call with the next bytes says the reason once one is seen.
#[derive(Default)]
pub(super) struct ErrorScan {
    /// The bytes of the event under way, up to [`MAX_HELD`]: a longer one (a big text delta)
    /// is not an error event, and is only followed to its end.
    event: Vec<u8>,
    longer: bool,
    /// The byte before, for the blank line that ends an event across any split.
    last: u8,
    seen: bool,
}

impl ErrorScan {
    pub(super) fn push(&mut self, bytes: &[u8]) -> Option<String> {
        if self.seen {
            return None;
        }
        for &b in bytes {
            if self.event.len() < MAX_HELD {
                self.event.push(b);
            } else {
                self.longer = true;
            }
            let ended = self.last == b'\n' && b == b'\n';
            self.last = b;
            if ended {
                let event = std::mem::take(&mut self.event);
                if std::mem::take(&mut self.longer) {
                    continue;
                }
                if let Event::Error(kind, message) = classify(&event) {
                    if retryable(&kind).is_some() {
                        self.seen = true;
                        return Some(format!("the answer was cut by the API: {kind}: {message}"));
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n";
    const OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

    #[test]
    fn events_are_told_apart_by_their_name_or_type() {
        assert!(matches!(
            classify(START.trim_end().as_bytes()),
            Event::Preamble
        ));
        assert!(matches!(
            classify(b"event: ping\ndata: {\"type\": \"ping\"}"),
            Event::Preamble
        ));
        assert!(matches!(
            classify(b"data: {\"type\":\"content_block_start\"}"),
            Event::Content
        ));
        match classify(OVERLOADED.trim_end().as_bytes()) {
            Event::Error(kind, message) => assert_eq!(
                (kind.as_str(), message.as_str()),
                ("overloaded_error", "Overloaded")
            ),
            _ => panic!("an error event"),
        }
    }

    #[test]
    fn only_the_apis_own_failures_are_retryable() {
        assert!(matches!(
            retryable("overloaded_error"),
            Some(Answer::Failing)
        ));
        assert!(matches!(retryable("api_error"), Some(Answer::Failing)));
        assert!(matches!(
            retryable("rate_limit_error"),
            Some(Answer::RateLimited)
        ));
        assert!(retryable("invalid_request_error").is_none());
        assert!(retryable("").is_none());
    }

    #[test]
    fn an_error_after_content_is_seen_once_across_any_split() {
        let stream = format!("{START}event: content_block_start\ndata: {{}}\n\n{OVERLOADED}");
        for split in 1..stream.len() {
            let mut scan = ErrorScan::default();
            let (a, b) = stream.as_bytes().split_at(split);
            let seen: Vec<String> = [a, b].iter().filter_map(|part| scan.push(part)).collect();
            assert_eq!(
                seen,
                vec!["the answer was cut by the API: overloaded_error: Overloaded".to_string()],
                "split at {split}"
            );
            assert_eq!(scan.push(OVERLOADED.as_bytes()), None);
        }
        // After an event longer than the scan keeps, the next error is still seen.
        let mut scan = ErrorScan::default();
        let long = format!(
            "event: content_block_delta\ndata: {}\n\n",
            "x".repeat(MAX_HELD * 2)
        );
        assert_eq!(scan.push(long.as_bytes()), None);
        assert!(scan.push(OVERLOADED.as_bytes()).is_some());
        let mut scan = ErrorScan::default();
        let refused = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"no\"}}\n\n";
        assert_eq!(scan.push(refused.as_bytes()), None);
    }
}
