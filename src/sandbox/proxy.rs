//! The per-session egress proxy. Claude Code's sandbox sends every network connection of an
//! agent command to one local HTTP proxy and one SOCKS5 proxy; its own proxy approves hosts
//! outside `allowedDomains` in bypassPermissions mode (observed on 2.1.330), so the adapter
//! points both ports (`sandbox.network.httpProxyPort` / `socksProxyPort`) at this proxy instead,
//! which admits only the configured hosts and reports every attempt.
//!
//! One listener on a unix socket serves both protocols (the sandbox, which has no network of
//! its own, reaches it through a loopback port bridged to the socket): a SOCKS5 client's first
//! byte is 5, an HTTP request's is a method letter. HTTP: `CONNECT host:port` tunnels and
//! absolute-form requests (`GET http://host/path`) are forwarded. The proxy stops when its
//! [`EgressProxy`] is dropped.
//!
//! The unix-socket server and the request-head reading are shared with the model-API relay.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
#[cfg(unix)]
pub(super) use tokio::net::{UnixListener, UnixStream};
// Windows has no unix sockets and runs no session sandbox (`ERR_SANDBOX_UNAVAILABLE` before
// anything starts): binding fails there, and TCP types stand in so the servers' code stays one.
#[cfg(not(unix))]
pub(super) use tokio::net::{TcpListener as UnixListener, TcpStream as UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{AdapterError, ErrorCode, Result};

/// Longest HTTP message head read before the message is refused.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Bound on reading a request head or SOCKS handshake, and on connecting upstream.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// One connection attempt by an agent command, allowed or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressAttempt {
    /// `"connect"` (HTTP CONNECT tunnel), `"http"` (forwarded plain request) or `"socks5"`.
    pub protocol: &'static str,
    pub host: String,
    pub port: u16,
    pub allowed: bool,
}

/// Where attempts are reported (the session's transcript / the engine's log).
pub type EgressSink = Arc<dyn Fn(&EgressAttempt) + Send + Sync>;

/// Host patterns as Claude Code documents them for `allowedDomains`: `example.com` is that host
/// exactly, `*.example.com` any subdomain of it (not `example.com` itself); case-insensitive.
/// Endpoints (`host`, `port`) are allowed on that port only: the model API's.
#[derive(Debug, Clone, Default)]
pub struct DomainAllowlist {
    patterns: Vec<String>,
    endpoints: Vec<(String, u16)>,
}

impl DomainAllowlist {
    pub fn new(patterns: &[String]) -> Self {
        DomainAllowlist {
            patterns: patterns.iter().map(|p| p.to_ascii_lowercase()).collect(),
            endpoints: Vec::new(),
        }
    }

    /// Also allows `host` on `port` (and nothing else of it).
    pub fn with_endpoint(mut self, host: &str, port: u16) -> Self {
        self.endpoints.push((host.to_ascii_lowercase(), port));
        self
    }

    /// Whether a connection to `host:port` may go out.
    pub fn allows_at(&self, host: &str, port: u16) -> bool {
        self.allows(host)
            || self
                .endpoints
                .iter()
                .any(|(h, p)| *p == port && h.eq_ignore_ascii_case(host.trim_matches(['[', ']'])))
    }

    pub fn allows(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        self.patterns.iter().any(|p| match p.strip_prefix("*.") {
            Some(base) => host.len() > base.len() + 1 && host.ends_with(&format!(".{base}")),
            None => *p == host,
        })
    }
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
        let ctx = Arc::new(Ctx { allow, sink });
        let server = UnixServer::start(socket, "the egress proxy", move |stream| {
            let ctx = ctx.clone();
            async move { serve(stream, &ctx).await }
        })?;
        Ok(EgressProxy { _server: server })
    }
}

/// A listener on a unix socket that serves each connection on its own task; dropping it stops
/// the listener and every connection and removes the socket file.
pub(super) struct UnixServer {
    path: PathBuf,
    stop: CancellationToken,
}

impl UnixServer {
    /// `what` names the server in the error when the socket cannot be bound.
    pub(super) fn start<F, Fut>(socket: &Path, what: &str, serve: F) -> Result<UnixServer>
    where
        F: Fn(UnixStream) -> Fut + Send + 'static,
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
        tokio::spawn(accept_loop(listener, serve, server.stop.clone()).in_current_span());
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

struct Ctx {
    allow: DomainAllowlist,
    sink: Option<EgressSink>,
}

impl Ctx {
    fn decide(&self, protocol: &'static str, host: &str, port: u16) -> bool {
        let attempt = EgressAttempt {
            protocol,
            host: host.to_string(),
            port,
            allowed: self.allow.allows_at(host, port),
        };
        if attempt.allowed {
            tracing::info!(protocol, host, port, "sandbox egress allowed");
        } else {
            tracing::warn!(
                protocol,
                host,
                port,
                "sandbox egress blocked: host not in sandbox.allowedDomains"
            );
        }
        if let Some(sink) = &self.sink {
            sink(&attempt);
        }
        attempt.allowed
    }
}

async fn accept_loop<F, Fut>(listener: UnixListener, serve: F, stop: CancellationToken)
where
    F: Fn(UnixStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let conn = tokio::select! {
            _ = stop.cancelled() => return,
            c = listener.accept() => c,
        };
        let Ok((stream, _)) = conn else { continue };
        let (conn, stop) = (serve(stream), stop.clone());
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = conn => {}
                }
            }
            .in_current_span(),
        );
    }
}

/// A connection's byte stream: a client's unix socket, an upstream's TCP or TLS stream.
pub(super) trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ByteStream for T {}

async fn serve(mut client: impl ByteStream, ctx: &Ctx) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(STEP_TIMEOUT, client.read(&mut first)).await {
        Ok(Ok(1)) if first[0] == 5 => socks5(client, ctx).await,
        Ok(Ok(1)) => http(client, first.to_vec(), ctx).await,
        _ => {}
    }
}

async fn connect(host: &str, port: u16) -> Option<TcpStream> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect((host, port)))
        .await
        .ok()?
        .ok()
}

async fn pipe(mut a: impl ByteStream, mut b: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

// ------------------------------------------------------------------------------------- HTTP

const FORBIDDEN: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 82\r\n\r\nblocked by the claude-runtime-adapter sandbox: host not in sandbox.allowedDomains\n";
const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
pub(super) const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
pub(super) const HEAD_TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

/// Answers a request the server refuses before reading all of it. The unread rest is drained
/// for a moment first: closing a socket with unread input resets it, and the client would lose
/// the answer.
pub(super) async fn refuse(mut client: impl ByteStream, answer: &[u8]) {
    if client.write_all(answer).await.is_ok() && client.shutdown().await.is_ok() {
        let (mut rest, mut sink) = (client.take(16 * MAX_HEAD as u64), tokio::io::sink());
        let drain = tokio::io::copy(&mut rest, &mut sink);
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    }
}

/// Why no message head was read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeadError {
    /// The stream ended (or failed) before the head did.
    Closed,
    /// The head is longer than [`MAX_HEAD`].
    TooLarge,
}

/// Reads up to the end of an HTTP message head (`buf` holds bytes already read); returns the
/// head, up to and including its blank line, and any bytes read past it. No time bound: the
/// caller sets the one that fits (a response head may take as long as the upstream works).
pub(super) async fn read_head(
    stream: &mut (impl AsyncRead + Unpin),
    mut buf: Vec<u8>,
) -> std::result::Result<(String, Vec<u8>), HeadError> {
    let mut chunk = [0u8; 4096];
    let mut searched = 0;
    loop {
        if let Some(end) = buf[searched..].windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(searched + end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        // The terminator may straddle the next read.
        searched = buf.len().saturating_sub(3);
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(HeadError::Closed),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `host:port`, `[v6]:port` or `host` (then `default_port`).
pub(super) fn split_host_port(s: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = match s.rfind(':') {
        Some(i) if !s[i..].contains(']') => (&s[..i], s[i + 1..].parse().ok()?),
        _ => (s, default_port),
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

async fn http(mut client: impl ByteStream, first: Vec<u8>, ctx: &Ctx) {
    let (head, rest) = match tokio::time::timeout(STEP_TIMEOUT, read_head(&mut client, first)).await
    {
        Ok(Ok(read)) => read,
        Ok(Err(HeadError::TooLarge)) => return refuse(client, HEAD_TOO_LARGE).await,
        Ok(Err(HeadError::Closed)) | Err(_) => return,
    };
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(target, 443) else {
            let _ = client.write_all(BAD_REQUEST).await;
            return;
        };
        if !ctx.decide("connect", &host, port) {
            let _ = client.write_all(FORBIDDEN).await;
            return;
        }
        let Some(mut upstream) = connect(&host, port).await else {
            let _ = client.write_all(BAD_GATEWAY).await;
            return;
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
            || upstream.write_all(&rest).await.is_err()
        {
            return;
        }
        return pipe(client, upstream).await;
    }
    let Some((host, port, path)) = absolute_target(target) else {
        let _ = client.write_all(BAD_REQUEST).await;
        return;
    };
    if !ctx.decide("http", &host, port) {
        let _ = client.write_all(FORBIDDEN).await;
        return;
    }
    let Some(mut upstream) = connect(&host, port).await else {
        let _ = client.write_all(BAD_GATEWAY).await;
        return;
    };
    // Origin-form request line; the proxy's own headers stay here.
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("proxy-") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    if upstream.write_all(out.as_bytes()).await.is_ok() && upstream.write_all(&rest).await.is_ok() {
        pipe(client, upstream).await;
    }
}

/// `http://host[:port]/path` → (host, port, "/path").
fn absolute_target(target: &str) -> Option<(String, u16, String)> {
    let rest = target.strip_prefix("http://").or_else(|| {
        target
            .get(..7)
            .filter(|p| p.eq_ignore_ascii_case("http://"))
            .map(|_| &target[7..])
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = authority.rsplit('@').next()?;
    let (host, port) = split_host_port(authority, 80)?;
    Some((host, port, path.to_string()))
}

// ------------------------------------------------------------------------------------ SOCKS5

/// The version byte (5) has been read already.
async fn socks5(mut client: impl ByteStream, ctx: &Ctx) {
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
                std::net::Ipv4Addr::from(a).to_string()
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
                std::net::Ipv6Addr::from(a).to_string()
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
    if !ctx.decide("socks5", &host, port) {
        let _ = client.write_all(&reply(2)).await;
        return;
    }
    let Some(upstream) = connect(&host, port).await else {
        let _ = client.write_all(&reply(4)).await;
        return;
    };
    if client.write_all(&reply(0)).await.is_ok() {
        pipe(client, upstream).await;
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::sync::Mutex;

    use tokio::net::TcpListener;

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

    struct Running {
        dir: tempfile::TempDir,
        proxy: EgressProxy,
        attempts: Arc<Mutex<Vec<EgressAttempt>>>,
    }

    impl Running {
        async fn start() -> Running {
            let dir = tempfile::tempdir().unwrap();
            let attempts = Arc::new(Mutex::new(Vec::new()));
            let seen = attempts.clone();
            let sink: EgressSink = Arc::new(move |a| seen.lock().unwrap().push(a.clone()));
            let allow = DomainAllowlist::new(&["127.0.0.1".into()]);
            let proxy = EgressProxy::start(allow, Some(sink), &dir.path().join("egress.sock"))
                .await
                .unwrap();
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

        fn attempts(&self) -> Vec<(&'static str, String, bool)> {
            let attempts = self.attempts.lock().unwrap();
            attempts
                .iter()
                .map(|a| (a.protocol, a.host.clone(), a.allowed))
                .collect()
        }
    }

    async fn read_until_head_end(s: &mut UnixStream) -> String {
        read_head(s, Vec::new()).await.unwrap().0
    }

    #[tokio::test]
    async fn connect_tunnels_to_allowed_hosts_over_the_unix_socket() {
        let (proxy, port) = (Running::start().await, echo_server().await);
        let mut c = proxy.connect().await;
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        assert!(read_until_head_end(&mut c)
            .await
            .starts_with("HTTP/1.1 200 "));
        c.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        c.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");

        let mut c = proxy.connect().await;
        c.write_all(b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert!(read_until_head_end(&mut c)
            .await
            .starts_with("HTTP/1.1 403 "));
        assert_eq!(
            proxy.attempts(),
            [
                ("connect", "127.0.0.1".to_string(), true),
                ("connect", "example.com".to_string(), false)
            ]
        );
    }

    #[tokio::test]
    async fn absolute_form_requests_are_forwarded_in_origin_form_and_huge_heads_refused() {
        let (proxy, port) = (Running::start().await, echo_server().await);
        let mut c = proxy.connect().await;
        let request = format!(
            "GET http://127.0.0.1:{port}/a?b HTTP/1.1\r\nHost: x\r\nProxy-Authorization: p\r\n\r\n"
        );
        c.write_all(request.as_bytes()).await.unwrap();
        // The echo server returns what the proxy sent upstream.
        assert_eq!(
            read_until_head_end(&mut c).await,
            "GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n"
        );

        let mut c = proxy.connect().await;
        let huge = format!(
            "GET http://127.0.0.1/ HTTP/1.1\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        c.write_all(huge.as_bytes()).await.unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    }

    #[tokio::test]
    async fn socks5_connects_allowed_hosts_and_refuses_others() {
        let (proxy, port) = (Running::start().await, echo_server().await);
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
        assert_eq!(
            proxy.attempts(),
            [
                ("socks5", "127.0.0.1".to_string(), true),
                ("socks5", "example.com".to_string(), false)
            ]
        );
    }

    #[tokio::test]
    async fn the_socket_file_goes_with_the_proxy() {
        let proxy = Running::start().await;
        let socket = proxy.dir.path().join("egress.sock");
        assert!(socket.exists());
        drop(proxy.proxy);
        assert!(!socket.exists());
    }

    #[test]
    fn wildcard_matches_subdomains_only_and_exact_names_match_exactly() {
        let a = DomainAllowlist::new(&["*.Example.com".into(), "registry.npmjs.org".into()]);
        assert!(a.allows("api.example.com"));
        assert!(a.allows("a.b.EXAMPLE.com."));
        assert!(!a.allows("example.com"));
        assert!(!a.allows("evilexample.com"));
        assert!(a.allows("registry.npmjs.org"));
        assert!(!a.allows("registry.npmjs.org.evil.com"));
        assert!(!DomainAllowlist::default().allows("localhost"));
    }

    #[test]
    fn targets_are_parsed_with_default_ports() {
        assert_eq!(split_host_port("h:8080", 1), Some(("h".into(), 8080)));
        assert_eq!(split_host_port("h", 443), Some(("h".into(), 443)));
        assert_eq!(split_host_port("[::1]:9", 1), Some(("[::1]".into(), 9)));
        assert_eq!(
            absolute_target("http://u:p@Host:81/a?b"),
            Some(("Host".into(), 81, "/a?b".into()))
        );
        assert_eq!(absolute_target("/relative"), None);
    }
}
