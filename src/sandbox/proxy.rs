//! The per-session egress proxy. Claude Code's sandbox sends every network connection of an
//! agent command to one local HTTP proxy and one SOCKS5 proxy; its own proxy approves hosts
//! outside `allowedDomains` in bypassPermissions mode (observed on 2.1.330), so the adapter
//! points both ports (`sandbox.network.httpProxyPort` / `socksProxyPort`) at this proxy instead,
//! which admits only the configured hosts and reports every attempt.
//!
//! One listener on a unix socket serves both protocols (the sandbox, which has no network of
//! its own, reaches it through a loopback port bridged to the socket): a SOCKS5 client's first
//! byte is 5, an HTTP request's is a method letter. HTTP (hyper): `CONNECT host:port` tunnels
//! and absolute-form requests (`GET http://host/path`, whose `Host` must name the same target)
//! are forwarded. The proxy stops when its [`EgressProxy`] is dropped.
//!
//! What is admitted: a host `sandbox.allowedDomains` names, on ports 80 and 443, or on the
//! port of a `host:port` entry. A name is resolved here, once, and every address it resolves to
//! is vetted: loopback, private (RFC 1918, ULA, CGNAT), link-local (cloud metadata included),
//! unspecified, multicast and reserved addresses are refused — a DNS answer must not turn an
//! allowed name into a door to the host's own services. Only an entry that is the IP literal
//! itself admits such an address. The connection goes to exactly the vetted address. Per
//! session, the open connections are capped and an idle one (tunnels included) is closed.
//!
//! What is admitted is [`super::allowlist`]'s; the unix-socket server (its cap and idle clock)
//! is [`crate::server`], shared with the model-API relay.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HOST};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::allowlist::{is_public, normal_host, Admission, DomainAllowlist};
use crate::error::Result;
use crate::server::{
    full, http1_server, strip_hop_by_hop, Body, Conn, Limits, Tracked, UnixServer, UnixStream,
    STEP_TIMEOUT,
};

/// Connections a session's egress proxy carries at once (a package manager opens a few dozen).
const MAX_PROXY_CONNECTIONS: usize = 128;
/// A proxy connection, or tunnel, with no byte either way for this long is closed.
const PROXY_IDLE: Duration = Duration::from_secs(300);

/// One connection attempt by an agent command, allowed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAttempt {
    /// `"connect"` (HTTP CONNECT tunnel), `"http"` (forwarded plain request), `"socks5"`, or
    /// `"connection"` for a connection refused before its request was read (the cap).
    pub protocol: &'static str,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// Why it was refused (`None` when allowed).
    pub reason: Option<String>,
}

/// Where attempts are reported (the session's transcript / the engine's log).
pub type EgressSink = Arc<dyn Fn(&EgressAttempt) + Send + Sync>;

/// A running proxy; dropping it stops the listener and every connection it carries and removes
/// its socket file.
pub struct EgressProxy {
    _server: UnixServer,
}

impl EgressProxy {
    /// Listens on the unix socket `socket` (which must not exist yet) and serves until
    /// dropped. Needs a tokio runtime.
    pub async fn start(
        allow: DomainAllowlist,
        sink: Option<EgressSink>,
        socket: &Path,
    ) -> Result<EgressProxy> {
        let limits = Limits {
            max_connections: MAX_PROXY_CONNECTIONS,
            idle: Some(PROXY_IDLE),
        };
        Self::start_limited(allow, sink, socket, limits)
    }

    fn start_limited(
        allow: DomainAllowlist,
        sink: Option<EgressSink>,
        socket: &Path,
        limits: Limits,
    ) -> Result<EgressProxy> {
        let ctx = Arc::new(Ctx { allow, sink });
        let full = ctx.clone();
        let max = limits.max_connections;
        let on_full = move || {
            full.report(EgressAttempt {
                protocol: "connection",
                host: String::new(),
                port: 0,
                allowed: false,
                reason: Some(format!(
                    "the session's {max} proxy connections are all open"
                )),
            })
        };
        let server = UnixServer::start(
            socket,
            "the egress proxy",
            limits,
            on_full,
            move |stream, conn| serve(stream, conn, ctx.clone()),
        )?;
        Ok(EgressProxy { _server: server })
    }
}

struct Ctx {
    allow: DomainAllowlist,
    sink: Option<EgressSink>,
}

/// Why a connection was not made.
enum Refusal {
    /// Not allowed; the reason was reported.
    Forbidden(String),
    /// Allowed, but the target could not be reached.
    Unreachable,
}

impl Ctx {
    fn report(&self, attempt: EgressAttempt) {
        let (protocol, host, port) = (attempt.protocol, &attempt.host, attempt.port);
        match &attempt.reason {
            None => tracing::info!(protocol, host, port, "sandbox egress allowed"),
            Some(reason) => {
                tracing::warn!(protocol, host, port, "sandbox egress blocked: {reason}")
            }
        }
        if let Some(sink) = &self.sink {
            sink(&attempt);
        }
    }

    fn refuse(&self, protocol: &'static str, host: &str, port: u16, reason: String) -> Refusal {
        self.report(EgressAttempt {
            protocol,
            host: host.to_string(),
            port,
            allowed: false,
            reason: Some(reason.clone()),
        });
        Refusal::Forbidden(reason)
    }

    /// Decides on `host:port`, reports the decision, and connects to a vetted address.
    async fn open(
        &self,
        protocol: &'static str,
        host: &str,
        port: u16,
    ) -> std::result::Result<TcpStream, Refusal> {
        let vet = match self.allow.admit(host, port) {
            Admission::Allowed { vet } => vet,
            Admission::Refused(reason) => return Err(self.refuse(protocol, host, port, reason)),
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let resolved = match bare.parse::<IpAddr>() {
            Ok(ip) => Ok(vec![SocketAddr::new(ip, port)]),
            Err(_) => {
                match tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((bare, port)))
                    .await
                {
                    Ok(Ok(addrs)) => Ok(addrs.collect::<Vec<_>>()),
                    Ok(Err(e)) => Err(format!("cannot resolve {bare}: {e}")),
                    Err(_) => Err(format!("resolving {bare} timed out")),
                }
            }
        };
        let addrs = match resolved {
            Ok(addrs) if !vet => addrs,
            Ok(addrs) => {
                let (public, other): (Vec<SocketAddr>, Vec<SocketAddr>) =
                    addrs.into_iter().partition(|a| is_public(a.ip()));
                if public.is_empty() {
                    let shown: Vec<String> = other.iter().map(|a| a.ip().to_string()).collect();
                    let reason = format!(
                        "{bare} resolves to {}, not a public address (only an allowedDomains entry that is the IP literal admits it)",
                        shown.join(", ")
                    );
                    return Err(self.refuse(protocol, host, port, reason));
                }
                public
            }
            Err(reason) => {
                tracing::warn!(protocol, host, port, "sandbox egress: {reason}");
                Vec::new()
            }
        };
        self.report(EgressAttempt {
            protocol,
            host: host.to_string(),
            port,
            allowed: true,
            reason: None,
        });
        // The vetted addresses themselves: no second resolution between the check and the use.
        for addr in addrs {
            if let Ok(Ok(tcp)) = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await
            {
                let _ = tcp.set_nodelay(true);
                return Ok(tcp);
            }
        }
        Err(Refusal::Unreachable)
    }
}

async fn serve(mut stream: UnixStream, conn: Arc<Conn>, ctx: Arc<Ctx>) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(STEP_TIMEOUT, stream.read(&mut first)).await {
        Ok(Ok(1)) if first[0] == 5 => socks5(Tracked::new(stream, None, conn), &ctx).await,
        Ok(Ok(1)) => {
            http(
                Tracked::new(stream, Some(first[0]), conn.clone()),
                conn,
                ctx,
            )
            .await
        }
        _ => {}
    }
}

// ------------------------------------------------------------------------------------- HTTP

fn answer(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

fn refusal_answer(refusal: Refusal) -> Response<Body> {
    match refusal {
        Refusal::Forbidden(reason) => answer(
            StatusCode::FORBIDDEN,
            format!("blocked by the claude-runtime-adapter sandbox: {reason}\n"),
        ),
        Refusal::Unreachable => answer(StatusCode::BAD_GATEWAY, String::new()),
    }
}

async fn http(client: Tracked<UnixStream>, conn: Arc<Conn>, ctx: Arc<Ctx>) {
    let service = hyper::service::service_fn(move |req| {
        let (ctx, conn) = (ctx.clone(), conn.clone());
        async move { Ok::<_, Infallible>(handle(req, &ctx, conn).await) }
    });
    let _ = http1_server()
        .serve_connection(TokioIo::new(client), service)
        .with_upgrades()
        .await;
}

async fn handle(req: Request<Incoming>, ctx: &Ctx, conn: Arc<Conn>) -> Response<Body> {
    if req.method() == Method::CONNECT {
        return connect(req, ctx, conn).await;
    }
    let Some((host, port)) = http_target(req.uri()) else {
        return answer(
            StatusCode::BAD_REQUEST,
            "the proxy forwards CONNECT and absolute-form http:// requests only\n".into(),
        );
    };
    if let Err(reason) = host_matches(req.headers(), &host, port) {
        return refusal_answer(ctx.refuse("http", &host, port, reason));
    }
    let tcp = match ctx.open("http", &host, port).await {
        Ok(tcp) => tcp,
        Err(refusal) => return refusal_answer(refusal),
    };
    let (mut sender, upstream) =
        match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
            Ok(pair) => pair,
            Err(_) => return refusal_answer(Refusal::Unreachable),
        };
    // The upstream connection lives as long as the client's: the server's stop and the idle
    // clock end it too.
    tokio::spawn(async move {
        conn.bound(async {
            let _ = upstream.await;
        })
        .await
    });
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"));
    if !parts.headers.contains_key(HOST) {
        if let Ok(v) = http::HeaderValue::from_str(&authority(&host, port, 80)) {
            parts.headers.insert(HOST, v);
        }
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(Into::into).boxed())
        }
        Err(_) => refusal_answer(Refusal::Unreachable),
    }
}

/// `host[:port]` as a `Host` header names it (the port left out when it is the default).
fn authority(host: &str, port: u16, default_port: u16) -> String {
    match port == default_port {
        true => host.to_string(),
        false => format!("{host}:{port}"),
    }
}

/// The host and port of an absolute-form `http://` target.
fn http_target(uri: &Uri) -> Option<(String, u16)> {
    if !uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("http"))
    {
        return None;
    }
    let host = uri.host().filter(|h| !h.is_empty())?;
    Some((host.to_string(), uri.port_u16().unwrap_or(80)))
}

/// A plain-HTTP request's `Host` must name its target: an upstream behind one address may
/// serve other names (virtual hosts), which the allowlist did not admit.
fn host_matches(headers: &HeaderMap, host: &str, port: u16) -> std::result::Result<(), String> {
    let values: Vec<_> = headers.get_all(HOST).iter().collect();
    let value = match values[..] {
        [] => return Ok(()),
        [one] => one,
        _ => return Err("more than one Host header".into()),
    };
    let named = value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<http::uri::Authority>().ok())
        .filter(|a| !a.as_str().contains('@'));
    let same = named.is_some_and(|a| {
        normal_host(a.host()) == normal_host(host) && a.port_u16().unwrap_or(80) == port
    });
    match same {
        true => Ok(()),
        false => Err(format!(
            "the Host header {:?} does not name the request's target {}",
            String::from_utf8_lossy(value.as_bytes()),
            authority(host, port, 80)
        )),
    }
}

async fn connect(req: Request<Incoming>, ctx: &Ctx, conn: Arc<Conn>) -> Response<Body> {
    let Some(target) = req.uri().authority().filter(|a| !a.host().is_empty()) else {
        return answer(StatusCode::BAD_REQUEST, "CONNECT needs host:port\n".into());
    };
    let (host, port) = (target.host().to_string(), target.port_u16().unwrap_or(443));
    let mut upstream = match ctx.open("connect", &host, port).await {
        Ok(tcp) => tcp,
        Err(refusal) => return refusal_answer(refusal),
    };
    tokio::spawn(async move {
        conn.bound(async {
            // The client's stream, handed over by hyper once the 200 below is sent.
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                let mut client = TokioIo::new(upgraded);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        })
        .await
    });
    Response::new(full(Bytes::new()))
}

// ------------------------------------------------------------------------------------ SOCKS5

/// The version byte (5) has been read already.
async fn socks5(mut client: Tracked<UnixStream>, ctx: &Ctx) {
    let handshake = async {
        let mut count = [0u8; 1];
        client.read_exact(&mut count).await.ok()?;
        let mut methods = vec![0u8; count[0] as usize];
        client.read_exact(&mut methods).await.ok()?;
        // No authentication: only processes inside this session's sandbox reach the port.
        client.write_all(&[5, 0]).await.ok()?;
        let mut req = [0u8; 4];
        client.read_exact(&mut req).await.ok()?;
        let host = match req[3] {
            1 => {
                let mut a = [0u8; 4];
                client.read_exact(&mut a).await.ok()?;
                Ipv4Addr::from(a).to_string()
            }
            3 => {
                let mut len = [0u8; 1];
                client.read_exact(&mut len).await.ok()?;
                let mut name = vec![0u8; len[0] as usize];
                client.read_exact(&mut name).await.ok()?;
                String::from_utf8(name).ok()?
            }
            4 => {
                let mut a = [0u8; 16];
                client.read_exact(&mut a).await.ok()?;
                Ipv6Addr::from(a).to_string()
            }
            _ => return None,
        };
        let mut port = [0u8; 2];
        client.read_exact(&mut port).await.ok()?;
        Some((req[1], host, u16::from_be_bytes(port)))
    };
    let Ok(Some((cmd, host, port))) = tokio::time::timeout(STEP_TIMEOUT, handshake).await else {
        return;
    };
    // Reply codes: 0 success, 2 not allowed by ruleset, 4 host unreachable, 7 command unsupported.
    let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
    if cmd != 1 {
        let _ = client.write_all(&reply(7)).await;
        return;
    }
    let mut upstream = match ctx.open("socks5", &host, port).await {
        Ok(tcp) => tcp,
        Err(Refusal::Forbidden(_)) => {
            let _ = client.write_all(&reply(2)).await;
            return;
        }
        Err(Refusal::Unreachable) => {
            let _ = client.write_all(&reply(4)).await;
            return;
        }
    };
    if client.write_all(&reply(0)).await.is_ok() {
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::sync::Mutex;

    use tokio::net::TcpListener;

    use super::super::allowlist::NOT_LISTED;
    use super::*;
    use crate::server::test_io::read_head;
    use crate::server::MAX_HEAD;

    /// An echo server on 127.0.0.1; returns its port.
    async fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    /// An HTTP server on 127.0.0.1 answering each request with its own head as the body.
    async fn head_echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (head, _) = read_head(&mut s).await;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
                        head.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                });
            }
        });
        port
    }

    type Seen = (&'static str, String, u16, bool, Option<String>);

    struct Running {
        dir: tempfile::TempDir,
        proxy: EgressProxy,
        attempts: Arc<Mutex<Vec<EgressAttempt>>>,
    }

    impl Running {
        async fn start(allow: DomainAllowlist) -> Running {
            let limits = Limits {
                max_connections: MAX_PROXY_CONNECTIONS,
                idle: Some(PROXY_IDLE),
            };
            Self::start_limited(allow, limits).await
        }

        async fn start_limited(allow: DomainAllowlist, limits: Limits) -> Running {
            let dir = tempfile::tempdir().unwrap();
            let attempts = Arc::new(Mutex::new(Vec::new()));
            let seen = attempts.clone();
            let sink: EgressSink = Arc::new(move |a| seen.lock().unwrap().push(a.clone()));
            let socket = dir.path().join("egress.sock");
            let proxy = EgressProxy::start_limited(allow, Some(sink), &socket, limits).unwrap();
            Running {
                dir,
                proxy,
                attempts,
            }
        }

        async fn connect(&self) -> UnixStream {
            UnixStream::connect(self.dir.path().join("egress.sock"))
                .await
                .unwrap()
        }

        fn attempts(&self) -> Vec<Seen> {
            let attempts = self.attempts.lock().unwrap();
            attempts
                .iter()
                .map(|a| {
                    (
                        a.protocol,
                        a.host.clone(),
                        a.port,
                        a.allowed,
                        a.reason.clone(),
                    )
                })
                .collect()
        }

        /// The answer to a `CONNECT target` (its head).
        async fn connect_to(&self, target: &str) -> (UnixStream, String) {
            let mut c = self.connect().await;
            c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let (head, _) = read_head(&mut c).await;
            (c, head)
        }
    }

    fn allow(entries: &[String]) -> DomainAllowlist {
        DomainAllowlist::new(entries)
    }

    #[tokio::test]
    async fn connect_tunnels_to_allowed_hosts_over_the_unix_socket() {
        let port = echo_server().await;
        let proxy = Running::start(allow(&[format!("127.0.0.1:{port}")])).await;
        let (mut c, head) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        c.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        c.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");

        let (_, head) = proxy.connect_to("example.com:443").await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        assert_eq!(
            proxy.attempts(),
            [
                ("connect", "127.0.0.1".to_string(), port, true, None),
                (
                    "connect",
                    "example.com".to_string(),
                    443,
                    false,
                    Some(NOT_LISTED.into())
                )
            ]
        );
    }

    #[tokio::test]
    async fn absolute_form_requests_are_forwarded_in_origin_form_and_huge_heads_refused() {
        let port = head_echo_server().await;
        let proxy = Running::start(allow(&[format!("127.0.0.1:{port}")])).await;
        let mut c = proxy.connect().await;
        let request = format!(
            "GET http://127.0.0.1:{port}/a?b HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: p\r\nConnection: close\r\nx-kept: 1\r\n\r\n"
        );
        c.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        let (_, upstream_saw) = answer.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            upstream_saw,
            format!("GET /a?b HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nx-kept: 1\r\n\r\n")
        );

        let mut c = proxy.connect().await;
        let huge = format!(
            "GET http://127.0.0.1/ HTTP/1.1\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        c.write_all(huge.as_bytes()).await.unwrap();
        // The proxy closes with the rest unread, so the answer may end in a reset.
        let mut answer = Vec::new();
        let mut chunk = [0u8; 1024];
        while let Ok(n @ 1..) = c.read(&mut chunk).await {
            answer.extend_from_slice(&chunk[..n]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    #[tokio::test]
    async fn socks5_connects_allowed_hosts_and_refuses_others() {
        let port = echo_server().await;
        let proxy = Running::start(allow(&[format!("127.0.0.1:{port}")])).await;
        let mut c = proxy.connect().await;
        let mut reply = [0u8; 10];
        c.write_all(&[5, 1, 0]).await.unwrap();
        c.read_exact(&mut reply[..2]).await.unwrap();
        assert_eq!(reply[..2], [5, 0]);
        let [hi, lo] = port.to_be_bytes();
        c.write_all(&[5, 1, 0, 1, 127, 0, 0, 1, hi, lo])
            .await
            .unwrap();
        c.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], 0, "success");
        c.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        c.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");

        let mut c = proxy.connect().await;
        c.write_all(&[5, 1, 0]).await.unwrap();
        c.read_exact(&mut reply[..2]).await.unwrap();
        c.write_all(&[&[5, 1, 0, 3, 11][..], b"example.com", &[0, 80]].concat())
            .await
            .unwrap();
        c.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], 2, "not allowed by ruleset");
        let seen: Vec<_> = proxy
            .attempts()
            .into_iter()
            .map(|a| (a.0, a.1, a.3))
            .collect();
        assert_eq!(
            seen,
            [
                ("socks5", "127.0.0.1".to_string(), true),
                ("socks5", "example.com".to_string(), false)
            ]
        );
    }

    #[tokio::test]
    async fn an_allowed_name_resolving_to_loopback_is_refused_unless_the_entry_is_the_ip_literal() {
        let port = echo_server().await;
        let proxy = Running::start(allow(&[format!("localhost:{port}")])).await;
        let (_, head) = proxy.connect_to(&format!("localhost:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        let mut c = proxy.connect().await;
        c.write_all(&[5, 1, 0]).await.unwrap();
        let mut reply = [0u8; 10];
        c.read_exact(&mut reply[..2]).await.unwrap();
        let [hi, lo] = port.to_be_bytes();
        c.write_all(&[&[5, 1, 0, 3, 9][..], b"localhost", &[hi, lo]].concat())
            .await
            .unwrap();
        c.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], 2, "not allowed by ruleset");
        for (protocol, _, _, allowed, reason) in proxy.attempts() {
            let reason = reason.unwrap();
            assert!(
                !allowed && reason.contains("not a public address"),
                "{protocol}: {reason}"
            );
            assert!(
                reason.contains("127.0.0.1") || reason.contains("::1"),
                "{reason}"
            );
        }
        // The model API's endpoint is the adapter's own configuration: not vetted.
        let proxy =
            Running::start(DomainAllowlist::default().with_endpoint("localhost", port)).await;
        let (_, head) = proxy.connect_to(&format!("localhost:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    }

    #[tokio::test]
    async fn a_plain_request_whose_host_header_names_another_host_is_refused() {
        let port = head_echo_server().await;
        let proxy = Running::start(allow(&[format!("127.0.0.1:{port}")])).await;
        for host in [
            "Host: internal.example",
            "Host: 127.0.0.1:1",
            "Host: 127.0.0.1:1\r\nHost: 127.0.0.1:2",
        ] {
            let mut c = proxy.connect().await;
            let request = format!(
                "GET http://127.0.0.1:{port}/ HTTP/1.1\r\n{host}\r\nConnection: close\r\n\r\n"
            );
            c.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            c.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 403 "), "{host}: {answer}");
            assert!(answer.contains("Host"), "{answer}");
        }
        let attempts = proxy.attempts();
        assert_eq!(attempts.len(), 3);
        assert!(attempts
            .iter()
            .all(|a| !a.3 && a.4.as_ref().unwrap().contains("Host")));
    }

    #[tokio::test]
    async fn ports_other_than_80_and_443_need_a_host_port_entry() {
        let port = echo_server().await;
        let proxy = Running::start(allow(&["127.0.0.1".into()])).await;
        let (_, head) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
        let reason = proxy.attempts()[0].4.clone().unwrap();
        assert!(
            reason.contains(&format!("port {port} not allowed")),
            "{reason}"
        );

        let a = allow(&["example.com".into(), "*.example.org:8443".into()]);
        assert_eq!(
            a.admit("example.com", 443),
            Admission::Allowed { vet: true }
        );
        assert_eq!(a.admit("example.com", 80), Admission::Allowed { vet: true });
        assert!(matches!(a.admit("example.com", 22), Admission::Refused(_)));
        assert_eq!(
            a.admit("a.example.org", 8443),
            Admission::Allowed { vet: true }
        );
        assert!(matches!(
            a.admit("a.example.org", 443),
            Admission::Refused(_)
        ));
        let endpoint = DomainAllowlist::default().with_endpoint("127.0.0.1", 8080);
        assert_eq!(
            endpoint.admit("127.0.0.1", 8080),
            Admission::Allowed { vet: false }
        );
        assert_eq!(
            endpoint.admit("127.0.0.1", 80),
            Admission::Refused(NOT_LISTED.into())
        );
        let ip = allow(&["169.254.169.254".into()]);
        assert_eq!(
            ip.admit("169.254.169.254", 80),
            Admission::Allowed { vet: false }
        );
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_closed_and_reported() {
        let port = echo_server().await;
        let limits = Limits {
            max_connections: 2,
            idle: None,
        };
        let proxy = Running::start_limited(allow(&[format!("127.0.0.1:{port}")]), limits).await;
        let (_a, head_a) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        let (_b, head_b) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        assert!(head_a.starts_with("HTTP/1.1 200 ") && head_b.starts_with("HTTP/1.1 200 "));
        let mut third = proxy.connect().await;
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "the third connection is closed at once");
        let last = proxy.attempts().pop().unwrap();
        assert_eq!((last.0, last.3), ("connection", false));
        assert!(last.4.unwrap().contains("2 proxy connections"));
        // A slot frees when a tunnel ends.
        drop(_a);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (_c, head) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    }

    #[tokio::test]
    async fn an_idle_tunnel_is_closed_and_a_busy_one_is_not() {
        let port = echo_server().await;
        let limits = Limits {
            max_connections: 8,
            idle: Some(Duration::from_millis(400)),
        };
        let proxy = Running::start_limited(allow(&[format!("127.0.0.1:{port}")]), limits).await;
        let (mut busy, _) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        let (mut idle, _) = proxy.connect_to(&format!("127.0.0.1:{port}")).await;
        let mut echo = [0u8; 4];
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            busy.write_all(b"ping").await.unwrap();
            busy.read_exact(&mut echo).await.unwrap();
        }
        let mut buf = [0u8; 4];
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .expect("the idle tunnel is closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
        busy.write_all(b"pong").await.unwrap();
        busy.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"pong");
    }

    #[tokio::test]
    async fn the_socket_file_goes_with_the_proxy() {
        let proxy = Running::start(DomainAllowlist::default()).await;
        let socket = proxy.dir.path().join("egress.sock");
        assert!(socket.exists());
        drop(proxy.proxy);
        assert!(!socket.exists());
    }

    #[test]
    fn targets_are_parsed_with_default_ports() {
        let t = |s: &str| http_target(&s.parse().unwrap());
        assert_eq!(t("http://u:p@Host:81/a?b"), Some(("Host".into(), 81)));
        assert_eq!(t("http://h/x"), Some(("h".into(), 80)));
        assert_eq!(t("http://[::1]:9/"), Some(("[::1]".into(), 9)));
        assert_eq!(t("https://h/x"), None);
        assert_eq!(t("/relative"), None);
    }
}
