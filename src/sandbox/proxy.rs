//! The per-session egress proxy. Claude Code's sandbox sends every network connection of an
//! agent command to one local HTTP proxy and one SOCKS5 proxy; its own proxy approves hosts
//! outside `allowedDomains` in bypassPermissions mode (observed on 2.1.330), so the adapter
//! points both ports (`sandbox.network.httpProxyPort` / `socksProxyPort`) at this proxy instead,
//! which admits only the configured hosts and reports every attempt.
//!
//! One listener on 127.0.0.1 serves both protocols: a SOCKS5 client's first byte is 5, an HTTP
//! request's is a method letter. HTTP: `CONNECT host:port` tunnels and absolute-form requests
//! (`GET http://host/path`) are forwarded. The proxy stops when its [`EgressProxy`] is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{AdapterError, ErrorCode, Result};

/// Longest HTTP request head the proxy reads before refusing the request.
const MAX_HEAD: usize = 64 * 1024;
/// Bound on reading a request head or SOCKS handshake, and on connecting upstream.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

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
#[derive(Debug, Clone, Default)]
pub struct DomainAllowlist {
    patterns: Vec<String>,
}

impl DomainAllowlist {
    pub fn new(patterns: &[String]) -> Self {
        DomainAllowlist {
            patterns: patterns.iter().map(|p| p.to_ascii_lowercase()).collect(),
        }
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

/// A running proxy; dropping it stops the listener and every connection it carries.
pub struct EgressProxy {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl EgressProxy {
    /// Binds 127.0.0.1 on a free port and serves until dropped. Needs a tokio runtime.
    pub async fn start(allow: DomainAllowlist, sink: Option<EgressSink>) -> Result<EgressProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| {
            AdapterError::new(
                ErrorCode::SandboxUnavailable,
                "cannot start the egress proxy",
            )
            .with_cause(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            AdapterError::new(ErrorCode::SandboxUnavailable, "egress proxy has no address")
                .with_cause(e)
        })?;
        let stop = CancellationToken::new();
        let ctx = Arc::new(Ctx { allow, sink });
        tokio::spawn(accept_loop(listener, ctx, stop.clone()).in_current_span());
        Ok(EgressProxy { addr, stop })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
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
            allowed: self.allow.allows(host),
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

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, stop: CancellationToken) {
    loop {
        let conn = tokio::select! {
            _ = stop.cancelled() => return,
            c = listener.accept() => c,
        };
        let Ok((stream, _)) = conn else { continue };
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = serve(stream, &ctx) => {}
                }
            }
            .in_current_span(),
        );
    }
}

async fn serve(client: TcpStream, ctx: &Ctx) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(STEP_TIMEOUT, client.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == 5 => socks5(client, ctx).await,
        Ok(Ok(1)) => http(client, ctx).await,
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

async fn pipe(mut a: TcpStream, mut b: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

// ------------------------------------------------------------------------------------- HTTP

const FORBIDDEN: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 82\r\n\r\nblocked by the claude-runtime-adapter sandbox: host not in sandbox.allowedDomains\n";
const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

/// Reads up to the end of the request head; returns the head and any bytes read past it.
async fn read_head(client: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(STEP_TIMEOUT, client.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// `host:port`, `[v6]:port` or `host` (then `default_port`).
fn split_host_port(s: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = match s.rfind(':') {
        Some(i) if !s[i..].contains(']') => (&s[..i], s[i + 1..].parse().ok()?),
        _ => (s, default_port),
    };
    (!host.is_empty()).then(|| (host.to_string(), port))
}

async fn http(mut client: TcpStream, ctx: &Ctx) {
    let Some((head, rest)) = read_head(&mut client).await else {
        return;
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

async fn socks5(mut client: TcpStream, ctx: &Ctx) {
    let handshake = async {
        let mut hdr = [0u8; 2];
        client.read_exact(&mut hdr).await.ok()?;
        let mut methods = vec![0u8; hdr[1] as usize];
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

#[cfg(test)]
mod tests {
    use super::*;

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
