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
//! The unix-socket server (its cap and idle clock) is shared with the model-API relay.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HOST};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
pub(super) use tokio::net::{UnixListener, UnixStream};
// Windows has no unix sockets and runs no session sandbox (`ERR_SANDBOX_UNAVAILABLE` before
// anything starts): binding fails there, and TCP types stand in so the servers' code stays one.
#[cfg(not(unix))]
pub(super) use tokio::net::{TcpListener as UnixListener, TcpStream as UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{AdapterError, ErrorCode, Result};

/// Longest HTTP message head read before the message is refused.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Bound on reading a request head or SOCKS handshake, on resolving and on connecting upstream.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The refusal reason of a host no entry names; the proxy's 403 says it too.
pub(super) const NOT_LISTED: &str = "host not in sandbox.allowedDomains";

/// Host patterns as Claude Code documents them for `allowedDomains`: `example.com` is that host
/// exactly, `*.example.com` any subdomain of it (not `example.com` itself); case-insensitive.
/// A bare entry admits ports 80 and 443; `host:port` admits that port only. Endpoints
/// (`host`, `port`) — the model API's, from the adapter's own configuration, not the agent's —
/// are allowed on that port, and their addresses are not vetted.
#[derive(Debug, Clone, Default)]
pub struct DomainAllowlist {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Lower case, without brackets or a trailing dot; `*.` kept for a wildcard.
    pattern: String,
    /// `None`: 80 and 443.
    port: Option<u16>,
    trusted: bool,
}

/// What an allowlist says about a target.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// Allowed; `vet` says whether the resolved addresses must be public.
    Allowed {
        vet: bool,
    },
    Refused(String),
}

/// `[v6]`, `Host.` → `v6`, `host`.
fn normal_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

impl DomainAllowlist {
    /// `patterns` as `sandbox.allowedDomains` holds them (validated by the config).
    pub fn new(patterns: &[String]) -> Self {
        let entries = patterns
            .iter()
            .map(|p| match p.rsplit_once(':') {
                Some((host, port)) if port.parse::<u16>().is_ok() => Entry {
                    pattern: normal_host(host),
                    port: port.parse().ok(),
                    trusted: false,
                },
                _ => Entry {
                    pattern: normal_host(p),
                    port: None,
                    trusted: false,
                },
            })
            .collect();
        DomainAllowlist { entries }
    }

    /// Also allows `host` on `port` (and nothing else of it), without vetting its addresses.
    pub fn with_endpoint(mut self, host: &str, port: u16) -> Self {
        self.entries.push(Entry {
            pattern: normal_host(host),
            port: Some(port),
            trusted: true,
        });
        self
    }

    fn admit(&self, host: &str, port: u16) -> Admission {
        let host = normal_host(host);
        let named: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| match e.pattern.strip_prefix("*.") {
                Some(base) => host.len() > base.len() + 1 && host.ends_with(&format!(".{base}")),
                None => e.pattern == host,
            })
            .collect();
        if named.is_empty() {
            return Admission::Refused(NOT_LISTED.into());
        }
        match named.iter().find(|e| match e.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        }) {
            // An IP literal is only ever named by an entry that is that literal.
            Some(e) => Admission::Allowed {
                vet: !e.trusted && host.parse::<IpAddr>().is_err(),
            },
            // The model API's endpoint names its port only: other ports of its host are as
            // unlisted as any host.
            None if named.iter().all(|e| e.trusted) => Admission::Refused(NOT_LISTED.into()),
            None => Admission::Refused(format!(
                "port {port} not allowed: ports 80 and 443 only, unless sandbox.allowedDomains lists {host}:{port}"
            )),
        }
    }
}

/// Whether an agent may reach `ip` through an allowed name: not the host itself, its private
/// networks, link-local (cloud metadata), multicast or reserved space.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            // IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) carry a v4 address.
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a, b, c, d));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || v6 == Ipv6Addr::from(1u128)) // ::1 spelled otherwise
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || a == 0 // "this network", 0.0.0.0 included
        || a >= 240 // reserved
        || (a == 100 && (64..128).contains(&b))) // CGNAT 100.64.0.0/10
}

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

/// Bounds on a [`UnixServer`]'s connections.
pub(super) struct Limits {
    /// Open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// A connection with no byte read or written by its client for this long is closed
    /// (with what it started: a tunnel, an upstream request). Only counted on streams wrapped
    /// in [`Tracked`].
    pub idle: Option<Duration>,
}

/// One accepted connection: its place under the server's cap, the token that ends it (and
/// every task serving it), and its idle clock.
pub(super) struct Conn {
    _permit: OwnedSemaphorePermit,
    stop: CancellationToken,
    idle: Option<Duration>,
    born: Instant,
    /// Milliseconds after `born` of the last byte moved.
    last: AtomicU64,
}

impl Conn {
    fn touch(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    /// Runs `work` until it ends, the connection is stopped (the server stops) or it has been
    /// idle too long (then everything serving it stops).
    pub(super) async fn bound(&self, work: impl Future<Output = ()>) {
        let idle = async {
            let Some(limit) = self.idle else {
                return std::future::pending().await;
            };
            loop {
                let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
                let quiet = self.born.elapsed().saturating_sub(last);
                if quiet >= limit {
                    return;
                }
                tokio::time::sleep(limit - quiet).await;
            }
        };
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = work => {}
            _ = idle => {
                tracing::info!("sandbox egress: an idle connection was closed");
                self.stop.cancel();
            }
        }
    }
}

/// A listener on a unix socket that serves each connection on its own task, at most
/// `max_connections` at once; dropping it stops the listener and every connection and removes
/// the socket file.
pub(super) struct UnixServer {
    path: PathBuf,
    stop: CancellationToken,
}

impl UnixServer {
    /// `what` names the server in the error when the socket cannot be bound; `on_full` is
    /// called for each connection refused under the cap.
    pub(super) fn start<F, Fut>(
        socket: &Path,
        what: &str,
        limits: Limits,
        on_full: impl Fn() + Send + 'static,
        serve: F,
    ) -> Result<UnixServer>
    where
        F: Fn(UnixStream, Arc<Conn>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let cannot = |e: std::io::Error| {
            AdapterError::new(
                ErrorCode::SandboxUnavailable,
                format!("cannot start {what} on {}", socket.display()),
            )
            .with_cause(e)
        };
        #[cfg(unix)]
        let bound = UnixListener::bind(socket);
        #[cfg(not(unix))]
        let bound: std::io::Result<UnixListener> = Err(std::io::ErrorKind::Unsupported.into());
        let listener = bound.map_err(cannot)?;
        let server = UnixServer {
            path: socket.to_path_buf(),
            stop: CancellationToken::new(),
        };
        // Owner only: whoever can connect gets the server's egress (and the relay's secret).
        set_owner_only(socket).map_err(cannot)?;
        let accept = accept_loop(listener, limits, on_full, serve, server.stop.clone());
        tokio::spawn(accept.in_current_span());
        Ok(server)
    }
}

#[cfg(unix)]
fn set_owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(not(unix))]
fn set_owner_only(_: &Path) -> std::io::Result<()> {
    Ok(())
}

impl Drop for UnixServer {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn accept_loop<F, Fut>(
    listener: UnixListener,
    limits: Limits,
    on_full: impl Fn(),
    serve: F,
    stop: CancellationToken,
) where
    F: Fn(UnixStream, Arc<Conn>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let conn = tokio::select! {
            _ = stop.cancelled() => return,
            c = listener.accept() => c,
        };
        let Ok((stream, _)) = conn else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!("sandbox: a connection over the session's cap was refused");
            on_full();
            continue;
        };
        let conn = Arc::new(Conn {
            _permit: permit,
            stop: stop.child_token(),
            idle: limits.idle,
            born: Instant::now(),
            last: AtomicU64::new(0),
        });
        let work = serve(stream, conn.clone());
        tokio::spawn(async move { conn.bound(work).await }.in_current_span());
    }
}

/// A client's stream: bytes already read from it come first, and each byte moved resets its
/// connection's idle clock.
pub(super) struct Tracked<S> {
    inner: S,
    prefix: Option<u8>,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, prefix: Option<u8>, conn: Arc<Conn>) -> Self {
        Tracked {
            inner,
            prefix,
            conn,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if buf.remaining() > 0 {
            if let Some(b) = self.prefix.take() {
                buf.put_slice(&[b]);
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Request headers that belong to one connection, never forwarded (RFC 9110 7.6.1), plus
/// whatever the request's own `Connection` names.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

/// A response body: a whole one of the server's own, or one streamed from upstream.
pub(super) type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body of `text`.
pub(super) fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// hyper's HTTP/1.1 server settings for a unix-socket client: a bounded head, read in time.
pub(super) fn http1_server() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(STEP_TIMEOUT)
        .max_header_size(MAX_HEAD);
    builder
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

/// Reading HTTP heads off raw streams, for the tests of the proxy and the relay (unix only,
/// like them).
#[cfg(all(test, unix))]
pub(super) mod test_io {
    use tokio::io::{AsyncRead, AsyncReadExt};

    /// Reads up to the end of an HTTP message head; returns the head (through its blank line)
    /// and the bytes read past it.
    pub async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> (String, Vec<u8>) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = buf.split_off(end + 4);
                return (String::from_utf8_lossy(&buf).into_owned(), rest);
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the stream ended before the head did: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::sync::Mutex;

    use tokio::net::TcpListener;

    use super::test_io::read_head;
    use super::*;

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

    #[test]
    fn only_public_addresses_pass_the_vetting() {
        for private in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc00::1",
            "ff02::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.1.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
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
    fn wildcard_matches_subdomains_only_and_exact_names_match_exactly() {
        let a = allow(&["*.Example.com".into(), "registry.npmjs.org".into()]);
        let allows = |h: &str| a.admit(h, 443) != Admission::Refused(NOT_LISTED.into());
        assert!(allows("api.example.com"));
        assert!(allows("a.b.EXAMPLE.com."));
        assert!(!allows("example.com"));
        assert!(!allows("evilexample.com"));
        assert!(allows("registry.npmjs.org"));
        assert!(!allows("registry.npmjs.org.evil.com"));
        assert!(matches!(
            DomainAllowlist::default().admit("localhost", 80),
            Admission::Refused(_)
        ));
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
