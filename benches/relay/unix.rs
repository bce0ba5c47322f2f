//! The bench itself (unix: the relay listens on a unix socket): the upstream connections per
//! session, and the first token of a streamed answer with and without the relay holding the
//! answer's head until its first content event (issue 49: an overload reported inside a `200`
//! stream is held and sent again only if none of it reached the CLI).

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use claude_runtime_adapter::gateway::outage::ApiOutage;
use claude_runtime_adapter::gateway::{placeholder, ModelRelay, RelayPlan};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A TLS upstream on 127.0.0.1 for `localhost` answering every request with a small message;
/// returns its port, its certificate and the count of TCP connections it accepted.
async fn upstream(dir: &Path) -> (u16, rcgen::CertifiedKey<rcgen::KeyPair>, Arc<AtomicUsize>) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::write(dir.join("ca.pem"), cert.cert.pem()).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    let body = r#"{"type":"message","content":[{"type":"text","text":"ok"}]}"#;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, cert, accepted)
}

/// One request through the relay on a fresh unix connection, read to the relay's close.
async fn through_relay(socket: &Path, request: &[u8]) {
    let mut client = UnixStream::connect(socket).await.unwrap();
    client.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{answer:?}");
}

/// The peer: one request on a new TCP + TLS connection of its own.
async fn fresh_connection(port: u16, tls: &TlsConnector) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let stream = tls.connect(name, tcp).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::post("/v1/messages")
        .header("host", format!("localhost:{port}"))
        .header("connection", "close")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert!(response.status().is_success());
    response.into_body().collect().await.unwrap();
}

/// A plain-http upstream streaming SSE answers as the Messages API does: `message_start`, then
/// after `gap` the first content event, then the rest.
async fn streaming_upstream(gap: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| async move {
                    let (tx, rx) = tokio::sync::mpsc::channel::<
                        Result<hyper::body::Frame<Bytes>, Infallible>,
                    >(4);
                    tokio::spawn(async move {
                        let event = |name: &str| {
                            Ok(hyper::body::Frame::data(Bytes::from(format!(
                                "event: {name}\ndata: {{\"type\":\"{name}\"}}\n\n"
                            ))))
                        };
                        let _ = tx.send(event("message_start")).await;
                        tokio::time::sleep(gap).await;
                        let _ = tx.send(event("content_block_start")).await;
                        let _ = tx.send(event("message_stop")).await;
                    });
                    let body = http_body_util::StreamBody::new(tokio_stream_of(rx));
                    let mut response = Response::new(body);
                    response
                        .headers_mut()
                        .insert("content-type", "text/event-stream".parse().unwrap());
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    port
}

/// The receiver as a stream (no tokio-stream in the tree).
fn tokio_stream_of<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// Time from a request's first byte to the first content event of its answer at the client.
async fn first_token(socket: &Path, request: &[u8]) -> Duration {
    let started = Instant::now();
    let mut client = UnixStream::connect(socket).await.unwrap();
    client.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while !got.windows(19).any(|w| w == b"content_block_start") {
        let n = client.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the answer ended before its content: {got:?}");
        got.extend_from_slice(&chunk[..n]);
    }
    started.elapsed()
}

/// The relay to `port` (plain http), holding through outages (`hold`) or not.
fn streaming_relay(dir: &Path, port: u16, hold: bool, key: &str) -> ModelRelay {
    let socket = dir.join(if hold { "held.sock" } else { "plain.sock" });
    let mut plan = RelayPlan::anthropic(
        &format!("http://127.0.0.1:{port}"),
        vec![(key.to_string(), "sk-ant-bench-secret".into())],
    );
    let tolerance = if hold {
        Duration::from_secs(1800)
    } else {
        Duration::ZERO
    };
    plan.outage = Some(ApiOutage::new(
        tolerance,
        Default::default(),
        Box::new(|_| {}),
    ));
    futures::executor::block_on(ModelRelay::start_plan(&socket, plan)).unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// First-token latency of streamed answers through the relay, holding their heads or not, for
/// a gap of 0 and of 20 ms between `message_start` and the first content (the real API's first
/// content follows its `message_start` within the same read, mostly).
async fn first_token_bench(dir: &Path, n: usize) {
    let key = placeholder();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:3129\r\nx-api-key: {key}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    println!(
        "\nfirst token of a streamed answer through the relay, {n} requests each, alternating:"
    );
    for gap in [Duration::ZERO, Duration::from_millis(20)] {
        let port = streaming_upstream(gap).await;
        let held = streaming_relay(dir, port, true, &key);
        let plain = streaming_relay(dir, port, false, &key);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for i in 0..n {
            for hold in if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            } {
                let socket = dir.join(if hold { "held.sock" } else { "plain.sock" });
                let t = first_token(&socket, request.as_bytes()).await;
                if hold {
                    with.push(t)
                } else {
                    without.push(t)
                }
            }
        }
        drop((held, plain));
        let (w, wo) = (median(with), median(without));
        println!(
            "  gap {:>2} ms: head held {:.3} ms, not held {:.3} ms (medians), ratio {:.3}×",
            gap.as_millis(),
            w.as_secs_f64() * 1e3,
            wo.as_secs_f64() * 1e3,
            w.as_secs_f64() / wo.as_secs_f64()
        );
    }
}

fn per_request(total: Duration, n: usize) -> String {
    format!("{:.2} ms", total.as_secs_f64() * 1e3 / n as f64)
}

pub fn main() {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let (port, cert, accepted) = upstream(dir.path()).await;
        // The relay trusts the upstream's certificate as a corporate root would be trusted.
        std::env::set_var("SSL_CERT_FILE", dir.path().join("ca.pem"));
        let socket = dir.path().join("model.sock");
        let key = placeholder();
        let relay = ModelRelay::start(
            &socket,
            &format!("https://localhost:{port}"),
            vec![(key.clone(), "sk-ant-bench-secret".into())],
        )
        .await
        .unwrap();
        let request = format!(
            "POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:3129\r\nx-api-key: {key}\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let start = Instant::now();
        for _ in 0..turns {
            through_relay(&socket, request.as_bytes()).await;
        }
        let relay_time = start.elapsed();
        let relay_connections = accepted.swap(0, Ordering::SeqCst);
        drop(relay);

        let mut roots = RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = TlsConnector::from(Arc::new(config));
        let start = Instant::now();
        for _ in 0..turns {
            fresh_connection(port, &tls).await;
        }
        let peer_time = start.elapsed();
        let peer_connections = accepted.load(Ordering::SeqCst);

        println!("model relay, a session of {turns} requests to a local TLS upstream:");
        println!(
            "  relay (pooled):               {relay_connections:>3} upstream connections, {} per request",
            per_request(relay_time, turns)
        );
        println!(
            "  peer (a connection each):     {peer_connections:>3} upstream connections, {} per request",
            per_request(peer_time, turns)
        );
        println!(
            "  ratio relay/peer: connections {:.3}×, time per request {:.2}×",
            relay_connections as f64 / peer_connections as f64,
            relay_time.as_secs_f64() / peer_time.as_secs_f64()
        );
        let n = std::env::var("BENCH_FIRST_TOKEN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        first_token_bench(dir.path(), n).await;
    });
}
