//! The relay end to end, over its unix socket: a client speaking raw HTTP/1.1 to it and a
//! fake upstream behind it (plain or TLS), for the placeholders, routes, bodies, masking,
//! pooling, and the holds through an outage.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::send::is_anthropic_api;
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
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
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
        let request = format!("{refused} HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n");
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
async fn the_secret_is_masked_in_response_headers_and_streamed_bodies_even_split_across_chunks() {
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
            format!("POST /v1/messages HTTP/1.1\r\nx-api-key: {PH}\r\nContent-Length: 0\r\n\r\n")
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
async fn pooled_tls_upstream(dir: &Path) -> (u16, PathBuf, Arc<std::sync::atomic::AtomicUsize>) {
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
