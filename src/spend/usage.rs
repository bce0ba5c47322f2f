//! A response's `usage`, read from its bytes as they pass ([`UsageReader`]): what the budget
//! counts ([`super::SpendMeter::record`], at [`super::prices`]). The model gateway feeds it each
//! successful response on its way back to the CLI (`gateway::metering`); the reading is here, with
//! the meter and the prices, so that what a response is counted at is read in one place.
//!
//! Where the usage is, per response format:
//! - streamed (`text/event-stream`, the Messages API, Vertex AI, Foundry): `message_start`'s
//!   `message.usage` (input and cache tokens, the model), then each `message_delta`'s `usage`,
//!   whose fields are running totals (the last one stands);
//! - Bedrock's stream (`application/vnd.amazon.eventstream`): the same events, each JSON event
//!   base64-encoded in a frame's `{"bytes":"…"}` payload;
//! - anything else is one JSON message whose `usage` and `model` are read at its end.
//!
//! A response with no usage (an error, `count_tokens`) counts nothing; a model the response
//! does not name is priced as an unknown one.

use serde_json::Value;

/// The tokens one response reports in its `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    /// Every cache write (`cache_creation_input_tokens`), the one-hour ones among them.
    pub cache_creation: u64,
    pub cache_creation_1h: u64,
    /// Web searches a server tool made (`server_tool_use.web_search_requests`).
    pub web_searches: u64,
}

/// The longest SSE line or Bedrock frame kept whole to look for usage in (the events that
/// carry it are small; a text delta of the real API too, the fake API's reach 256 KiB). A
/// longer one is passed on unread.
const MAX_HELD: usize = 1024 * 1024;
/// Of a JSON message longer than twice this, only its first and last this many bytes are kept:
/// its `model` comes first, its `usage` last. The relay's memory stays bounded per response.
const JSON_EDGE: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Sse,
    EventStream,
    Json,
}

/// Finds the usage in a response's bytes as they come.
pub struct UsageReader {
    format: Format,
    held: Vec<u8>,
    /// The rest of an over-long line or message is skipped.
    skipping: bool,
    model: Option<String>,
    usage: Option<Usage>,
    /// The JSON message's declared length, the bytes of it seen, and its first [`JSON_EDGE`]
    /// bytes once it is too long to keep whole (`held` keeps its last ones).
    length: Option<usize>,
    seen: usize,
    head: Vec<u8>,
    /// The stream's `message_stop` came.
    stopped: bool,
}

impl UsageReader {
    /// A reader of a response of `content_type` and, when declared, `length` bytes.
    pub fn new(content_type: &str, length: Option<usize>) -> UsageReader {
        let ct = content_type.to_ascii_lowercase();
        let format = if ct.starts_with("text/event-stream") {
            Format::Sse
        } else if ct.starts_with("application/vnd.amazon.eventstream") {
            Format::EventStream
        } else {
            Format::Json
        };
        UsageReader {
            format,
            held: Vec::new(),
            skipping: false,
            model: None,
            usage: None,
            length,
            seen: 0,
            head: Vec::new(),
            stopped: false,
        }
    }

    /// True once the whole message has come: a stream's `message_stop`, or a JSON message's
    /// declared length (otherwise its end is the body's).
    pub fn ended(&self) -> bool {
        match self.format {
            Format::Sse | Format::EventStream => self.stopped,
            Format::Json => self.length == Some(self.seen),
        }
    }

    /// Reads the response's next bytes.
    pub fn push(&mut self, data: &[u8]) {
        match self.format {
            Format::Sse => self.push_lines(data),
            Format::EventStream => {
                self.held.extend_from_slice(data);
                self.event_stream_frames();
            }
            Format::Json => {
                self.seen += data.len();
                self.held.extend_from_slice(data);
                if self.held.len() > 2 * JSON_EDGE {
                    if self.head.is_empty() {
                        self.head = self.held[..JSON_EDGE].to_vec();
                    }
                    let cut = self.held.len() - JSON_EDGE;
                    self.held.drain(..cut);
                }
            }
        }
    }

    /// The model and usage found (`None`: the response reported no usage).
    pub fn finish(&mut self) -> Option<(Option<String>, Usage)> {
        let rest = std::mem::take(&mut self.held);
        match self.format {
            Format::Sse if !self.skipping => self.line(&rest),
            Format::Json if self.head.is_empty() => {
                if let Ok(v) = serde_json::from_slice::<Value>(&rest) {
                    self.take_model(&v);
                    self.merge(v.get("usage"));
                }
            }
            Format::Json => {
                let head = std::mem::take(&mut self.head);
                if let Some(model) = value_after(&head, b"\"model\"", false) {
                    self.take_model(&serde_json::json!({ "model": model }));
                }
                self.merge(value_after(&rest, b"\"usage\"", true).as_ref());
            }
            _ => {}
        }
        self.usage.take().map(|u| (self.model.take(), u))
    }

    fn push_lines(&mut self, mut data: &[u8]) {
        while let Some(end) = data.iter().position(|&b| b == b'\n') {
            let (line, rest) = data.split_at(end);
            data = &rest[1..];
            if self.skipping {
                self.skipping = false;
                continue;
            }
            if self.held.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.held);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
        }
        if self.skipping {
            return;
        }
        if self.held.len() + data.len() > MAX_HELD {
            self.skipping = true;
            self.held = Vec::new();
        } else {
            self.held.extend_from_slice(data);
        }
    }

    /// One SSE line: only `data:` lines that mention usage are parsed (text deltas, the bulk
    /// of a stream, are not).
    fn line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if find(data, b"\"usage\"").is_none() && find(data, b"\"message_stop\"").is_none() {
            return;
        }
        if let Ok(event) = serde_json::from_slice::<Value>(data.trim_ascii()) {
            self.event(&event);
        }
    }

    /// Every whole `{"bytes":"<base64>"}` payload held, decoded and read as an event.
    fn event_stream_frames(&mut self) {
        const KEY: &[u8] = b"\"bytes\":\"";
        let mut consumed = 0;
        while let Some(at) = find(&self.held[consumed..], KEY) {
            let start = consumed + at + KEY.len();
            let Some(len) = self.held[start..].iter().position(|&b| b == b'"') else {
                // The payload's end has not come yet.
                consumed += at;
                break;
            };
            let end = start + len;
            if let Some(json) = base64_decode(&self.held[start..end]) {
                if let Ok(event) = serde_json::from_slice::<Value>(&json) {
                    self.event(&event);
                }
            }
            consumed = end + 1;
        }
        if find(&self.held[consumed..], KEY).is_none() {
            // Keep only what could be the start of the next key.
            consumed = consumed.max(self.held.len().saturating_sub(KEY.len()));
        }
        self.held.drain(..consumed);
        if self.held.len() > MAX_HELD {
            self.held.clear();
        }
    }

    fn event(&mut self, event: &Value) {
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                let message = event.get("message").unwrap_or(&Value::Null);
                self.take_model(message);
                self.merge(message.get("usage"));
            }
            Some("message_delta") => self.merge(event.get("usage")),
            Some("message_stop") => self.stopped = true,
            _ => {}
        }
    }

    fn take_model(&mut self, message: &Value) {
        if let Some(m) = message.get("model").and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
    }

    /// The fields `usage` has replace what was known: each is a running total.
    fn merge(&mut self, usage: Option<&Value>) {
        let Some(u) = usage.filter(|u| u.is_object()) else {
            return;
        };
        let known = self.usage.get_or_insert_with(Usage::default);
        for (key, field) in [
            ("/input_tokens", &mut known.input),
            ("/output_tokens", &mut known.output),
            ("/cache_read_input_tokens", &mut known.cache_read),
            ("/cache_creation_input_tokens", &mut known.cache_creation),
            (
                "/cache_creation/ephemeral_1h_input_tokens",
                &mut known.cache_creation_1h,
            ),
            (
                "/server_tool_use/web_search_requests",
                &mut known.web_searches,
            ),
        ] {
            if let Some(n) = u.pointer(key).and_then(Value::as_u64) {
                *field = n;
            }
        }
    }
}

/// The JSON value after the first (or `last`) `key` in `bytes`, a part of a JSON text.
fn value_after(bytes: &[u8], key: &[u8], last: bool) -> Option<Value> {
    let at = if last {
        bytes.windows(key.len()).rposition(|w| w == key)?
    } else {
        find(bytes, key)?
    };
    let rest = bytes[at + key.len()..].trim_ascii_start();
    let rest = rest.strip_prefix(b":")?;
    serde_json::Deserializer::from_slice(rest)
        .into_iter::<Value>()
        .next()?
        .ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Standard base64 (padding optional); `None` for anything else.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    ANY_PADDING.decode(text).ok()
}

/// The usage tests' streams and figures, which the gateway's metering tests read too.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn read(content_type: &str, chunks: &[&[u8]]) -> Option<(Option<String>, Usage)> {
        let mut r = UsageReader::new(content_type, None);
        for c in chunks {
            r.push(c);
        }
        r.finish()
    }

    /// A `Usage` of these four counts (no one-hour writes, no searches).
    pub(crate) fn usage(input: u64, output: u64, cache_read: u64, cache_creation: u64) -> Usage {
        Usage {
            input,
            output,
            cache_read,
            cache_creation,
            ..Usage::default()
        }
    }

    #[test]
    fn one_hour_cache_writes_and_web_searches_are_read_from_the_usage() {
        let body = r#"{"id":"m","type":"message","model":"claude-sonnet-4-5","content":[],"usage":{"input_tokens":5,"output_tokens":6,"cache_read_input_tokens":0,"cache_creation_input_tokens":700,"cache_creation":{"ephemeral_5m_input_tokens":200,"ephemeral_1h_input_tokens":500},"server_tool_use":{"web_search_requests":2}}}"#;
        let (_, u) = read("application/json", &[body.as_bytes()]).unwrap();
        assert_eq!(
            (u.cache_creation, u.cache_creation_1h, u.web_searches),
            (700, 500, 2)
        );
    }

    /// A streamed Sonnet answer: 120 in, 42 out, 30k cache reads, 2k cache writes.
    pub(crate) const STREAM: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1","model":"claude-sonnet-4-5-20250929","usage":{"input_tokens":120,"cache_creation_input_tokens":2000,"cache_read_input_tokens":30000,"output_tokens":1}}}"#,
        "\n\nevent: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the usage is"}}"#,
        "\n\nevent: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
        "\n\nevent: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":42}}"#,
        "\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    #[test]
    fn a_stream_counts_message_start_usage_then_the_last_message_delta_totals() {
        let got = read("text/event-stream; charset=utf-8", &[STREAM.as_bytes()]);
        assert_eq!(
            got,
            Some((
                Some("claude-sonnet-4-5-20250929".into()),
                usage(120, 42, 30000, 2000)
            ))
        );
    }

    #[test]
    fn a_message_has_ended_at_message_stop_or_its_declared_length() {
        let mut r = UsageReader::new("text/event-stream", None);
        let before_stop = STREAM.find("event: message_stop").unwrap();
        r.push(&STREAM.as_bytes()[..before_stop]);
        assert!(!r.ended());
        r.push(&STREAM.as_bytes()[before_stop..]);
        assert!(r.ended());
        let body = br#"{"model":"m","usage":{"input_tokens":1}}"#;
        let mut r = UsageReader::new("application/json", Some(body.len()));
        r.push(&body[..10]);
        assert!(!r.ended());
        r.push(&body[10..]);
        assert!(r.ended());
        assert!(r.finish().is_some());
    }

    #[test]
    fn a_stream_split_anywhere_reads_the_same() {
        let bytes = STREAM.as_bytes();
        for size in [1, 2, 7, 64, 333] {
            let chunks: Vec<&[u8]> = bytes.chunks(size).collect();
            assert_eq!(
                read("text/event-stream", &chunks),
                read("text/event-stream", &[bytes]),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn a_stream_cut_after_message_start_counts_its_input() {
        let cut = &STREAM[..STREAM.find("event: content_block_delta").unwrap()];
        let (_, u) = read("text/event-stream", &[cut.as_bytes()]).unwrap();
        assert_eq!(u, usage(120, 1, 30000, 2000));
    }

    #[test]
    fn a_message_delta_with_input_and_cache_totals_replaces_them() {
        let stream = concat!(
            r#"data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":5,"output_tokens":1}}}"#,
            "\n",
            r#"data: {"type":"message_delta","usage":{"input_tokens":9,"output_tokens":3,"cache_read_input_tokens":4,"cache_creation_input_tokens":2}}"#,
            "\n"
        );
        let (_, u) = read("text/event-stream", &[stream.as_bytes()]).unwrap();
        assert_eq!(u, usage(9, 3, 4, 2));
    }

    #[test]
    fn a_json_message_counts_its_usage_and_model() {
        let body = r#"{"id":"msg_1","type":"message","model":"claude-haiku-4-5","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":10,"output_tokens":20,"cache_read_input_tokens":30,"cache_creation_input_tokens":40}}"#;
        let (a, b) = body.split_at(17);
        assert_eq!(
            read("application/json", &[a.as_bytes(), b.as_bytes()]),
            Some((Some("claude-haiku-4-5".into()), usage(10, 20, 30, 40)))
        );
    }

    #[test]
    fn a_long_json_message_is_read_from_its_first_and_last_bytes() {
        let text = "x".repeat(3 * JSON_EDGE);
        let body = format!(
            r#"{{"id":"msg_1","type":"message","model":"claude-opus-4-1","content":[{{"type":"text","text":"{text}"}}],"usage":{{"input_tokens":3,"output_tokens":4}}}}"#
        );
        let mut r = UsageReader::new("application/json", Some(body.len()));
        for chunk in body.as_bytes().chunks(1000) {
            r.push(chunk);
        }
        assert!(r.ended());
        assert!(r.held.len() <= 2 * JSON_EDGE && r.head.len() == JSON_EDGE);
        assert_eq!(
            r.finish(),
            Some((Some("claude-opus-4-1".into()), usage(3, 4, 0, 0)))
        );
    }

    #[test]
    fn responses_without_usage_count_nothing() {
        assert_eq!(read("application/json", &[br#"{"input_tokens":12}"#]), None);
        assert_eq!(read("application/json", &[b"not json"]), None);
        assert_eq!(
            read("text/event-stream", &[b"event: ping\ndata: {}\n\n"]),
            None
        );
    }

    /// `json` as Bedrock streams it: a binary frame whose payload is `{"bytes":"<base64>"}`.
    fn bedrock_frame(json: &str) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut b64 = String::new();
        for chunk in json.as_bytes().chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, &c)| n | (c as u32) << (16 - 8 * i));
            for i in 0..4 {
                if i <= chunk.len() {
                    b64.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    b64.push('=');
                }
            }
        }
        let mut frame = vec![0, 0, 1, 2, 0, 0, 0, 80, 1, 2, 3, 4, 11];
        frame.extend_from_slice(b":event-type\x07\x00\x05chunk");
        frame.extend_from_slice(format!(r#"{{"bytes":"{b64}","p":"abc"}}"#).as_bytes());
        frame.extend_from_slice(&[9, 9, 9, 9]);
        frame
    }

    #[test]
    fn a_bedrock_event_stream_is_read_from_its_base64_payloads() {
        let mut stream = bedrock_frame(
            r#"{"type":"message_start","message":{"model":"claude-3-5-haiku-20241022","usage":{"input_tokens":7,"output_tokens":1}}}"#,
        );
        stream.extend(bedrock_frame(
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        ));
        stream.extend(bedrock_frame(
            r#"{"type":"message_delta","usage":{"output_tokens":11}}"#,
        ));
        for size in [1, 5, 100, stream.len()] {
            let chunks: Vec<&[u8]> = stream.chunks(size).collect();
            assert_eq!(
                read("application/vnd.amazon.eventstream", &chunks),
                Some((Some("claude-3-5-haiku-20241022".into()), usage(7, 11, 0, 0))),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64_decode(b"aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode(b"aGk").unwrap(), b"hi");
        assert_eq!(base64_decode(b"aGV5").unwrap(), b"hey");
        assert!(base64_decode(b"a").is_none());
        assert!(base64_decode(b"a*==").is_none());
    }
}
