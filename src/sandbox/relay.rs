//! The model-API credential relay. The CLI runs in a sandbox without network and without the
//! real model-API credential: it gets `ANTHROPIC_BASE_URL=http://127.0.0.1:<port>` (a loopback
//! port bridged to this relay's unix socket) and a [`placeholder`] in place of the key or token.
//! The relay forwards each plain HTTP/1.1 request to the real upstream base URL (http or https,
//! possibly with a path prefix), putting the real secret where the placeholder is in any header
//! value (`x-api-key`, `authorization: Bearer …`), so the secret never exists inside the sandbox.
//!
//! One request per client connection: the request goes upstream with `Connection: close` on a
//! fresh connection and the response comes back with `Connection: close`, so both ends see where
//! a message ends by the close, and nothing here parses body framing. Bodies pass through as
//! they arrive, in either direction (a streamed response's events reach the CLI one by one).
//! The client reconnects for its next request, as HTTP/1.1 clients do after `Connection: close`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use super::proxy::{
    read_head, refuse, split_host_port, ByteStream, HeadError, UnixServer, UnixStream, BAD_REQUEST,
    HEAD_TOO_LARGE, STEP_TIMEOUT,
};
use crate::error::{AdapterError, ErrorCode, Result};

/// Request headers that belong to one connection and so are not forwarded (RFC 9110 7.6.1);
/// the relay sets `Host` and `Connection` itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "host",
];

/// A running relay; dropping it stops the listener and every connection it carries and removes
/// its socket file.
pub struct ModelRelay {
    _server: UnixServer,
}

impl ModelRelay {
    /// Listens on the unix socket `socket` (which must not exist yet) and relays to `upstream`,
    /// the real base URL; `substitutions` are (placeholder, secret) pairs. An https upstream is
    /// verified against the webpki roots plus the certificates in the PEM files named by
    /// `SSL_CERT_FILE` and `NODE_EXTRA_CA_CERTS` (a corporate proxy's root). Needs a tokio
    /// runtime.
    pub async fn start(
        socket: &Path,
        upstream: &str,
        substitutions: Vec<(String, String)>,
    ) -> Result<ModelRelay> {
        let extra_roots: Vec<PathBuf> = ["SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"]
            .iter()
            .filter_map(std::env::var_os)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .collect();
        Self::start_with_roots(socket, upstream, substitutions, &extra_roots)
    }

    fn start_with_roots(
        socket: &Path,
        upstream: &str,
        substitutions: Vec<(String, String)>,
        extra_roots: &[PathBuf],
    ) -> Result<ModelRelay> {
        if substitutions
            .iter()
            .any(|(placeholder, _)| placeholder.is_empty())
        {
            return Err(AdapterError::invalid_params(
                "the model relay's credential placeholder is empty",
            ));
        }
        let relay = Arc::new(Relay {
            upstream: Upstream::new(upstream, extra_roots)?,
            substitutions,
        });
        let server = UnixServer::start(socket, "the model-API relay", move |stream| {
            let relay = relay.clone();
            async move { relay.serve(stream).await }
        })?;
        Ok(ModelRelay { _server: server })
    }
}

/// A fresh random placeholder credential for the CLI inside the sandbox: unguessable and
/// unrelated to the secret, shaped like an Anthropic key so the CLI's own checks accept it.
pub fn placeholder() -> String {
    format!(
        "sk-ant-sandbox-placeholder-{}",
        uuid::Uuid::new_v4().simple()
    )
}

/// The real model API, parsed once from its base URL.
struct Upstream {
    /// Without brackets around an IPv6 literal, for connecting.
    host: String,
    port: u16,
    /// The `Host` header value: the URL's authority.
    authority: String,
    /// The base URL's path without its trailing slash, prefixed to every request target.
    base_path: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Upstream {
    fn new(url: &str, extra_roots: &[PathBuf]) -> Result<Upstream> {
        let invalid = |why: &str| {
            AdapterError::invalid_params(format!(
                "the model API base URL {url:?} is not usable by the sandbox's relay: {why}"
            ))
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("not an http(s) URL"))?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err(invalid("the scheme must be http or https")),
        };
        if rest
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '?' || c == '#')
        {
            return Err(invalid("a base URL has no query, fragment or whitespace"));
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        let (host, port) = split_host_port(authority, if https { 443 } else { 80 })
            .ok_or_else(|| invalid("no host, or a port that is not a number"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let tls = match https {
            false => None,
            true => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|_| invalid("the host is not a valid TLS server name"))?;
                Some((TlsConnector::from(tls_config(extra_roots)?), name))
            }
        };
        Ok(Upstream {
            host,
            port,
            authority: authority.to_string(),
            base_path: path.trim_end_matches('/').to_string(),
            tls,
        })
    }

    /// A fresh connection (TLS established for https), or why not, for the 502.
    async fn connect(&self) -> std::result::Result<Box<dyn ByteStream>, String> {
        let authority = &self.authority;
        let tcp = match tokio::time::timeout(
            STEP_TIMEOUT,
            TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => return Err(format!("cannot connect to {authority}: {e}")),
            Err(_) => return Err(format!("connecting to {authority} timed out")),
        };
        // Small writes (a streamed request's chunks) go out at once.
        let _ = tcp.set_nodelay(true);
        let Some((connector, name)) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        match tokio::time::timeout(STEP_TIMEOUT, connector.connect(name.clone(), tcp)).await {
            Ok(Ok(tls)) => Ok(Box::new(tls)),
            Ok(Err(e)) => Err(format!("TLS handshake with {authority} failed: {e}")),
            Err(_) => Err(format!("TLS handshake with {authority} timed out")),
        }
    }
}

/// rustls on ring, trusting the webpki roots and every certificate in `extra_roots`' PEM files.
fn tls_config(extra_roots: &[PathBuf]) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for path in extra_roots {
        let unusable = |why: String| {
            AdapterError::invalid_params(format!(
                "the CA certificate file {} is not usable: {why}",
                path.display()
            ))
        };
        let pem = std::fs::read(path).map_err(|e| unusable(e.to_string()))?;
        // A system bundle may hold certificates webpki cannot use; those are skipped.
        let (added, _) = roots
            .add_parsable_certificates(CertificateDer::pem_slice_iter(&pem).filter_map(|c| c.ok()));
        if added == 0 {
            return Err(unusable("it holds no PEM certificate".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            AdapterError::new(ErrorCode::Internal, "cannot configure TLS for the relay")
                .with_cause(e)
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The relay speaks HTTP/1.1 on both sides.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

struct Relay {
    upstream: Upstream,
    substitutions: Vec<(String, String)>,
}

impl Relay {
    async fn serve(&self, mut client: UnixStream) {
        let head = tokio::time::timeout(STEP_TIMEOUT, read_head(&mut client, Vec::new())).await;
        let (head, rest) = match head {
            Ok(Ok(read)) => read,
            Ok(Err(HeadError::TooLarge)) => return refuse(client, HEAD_TOO_LARGE).await,
            Ok(Err(HeadError::Closed)) | Err(_) => return,
        };
        let Some(head) = self.rewrite_request(&head) else {
            return refuse(client, BAD_REQUEST).await;
        };
        let upstream = match self.upstream.connect().await {
            Ok(upstream) => upstream,
            Err(reason) => {
                tracing::warn!("model relay: {reason}");
                let _ = client.write_all(&bad_gateway(&reason)).await;
                return;
            }
        };
        exchange(client, upstream, head, rest).await;
    }

    /// The request head as it goes upstream (it holds the secret: never log it), or `None` for
    /// a malformed head.
    fn rewrite_request(&self, head: &str) -> Option<String> {
        let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
        // A bare CR or LF inside a line may end it for the upstream, smuggling in a header
        // (a second Host) that the checks below never saw.
        if head
            .trim_end_matches("\r\n")
            .split("\r\n")
            .any(|l| l.chars().any(|c| c.is_control() && c != '\t'))
        {
            return None;
        }
        let mut parts = lines.next()?.split(' ');
        let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some()
            || method.is_empty()
            || !target.starts_with('/')
            || !version.starts_with("HTTP/1.")
        {
            return None;
        }
        let mut out = format!("{method} {}{target} {version}\r\n", self.upstream.base_path);
        // Obsolete line folding (a line starting with blank space) is refused as RFC 9112 5.2
        // allows, and so is blank space in a name: `Host :` must not pass as another header.
        let fields: Vec<(&str, &str)> = lines.map(|l| l.split_once(':')).collect::<Option<_>>()?;
        if fields
            .iter()
            .any(|(name, _)| name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()))
        {
            return None;
        }
        // Headers the client's `Connection` names are hop-by-hop too.
        let named: Vec<String> = fields
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        for (name, value) in fields {
            let lower = name.to_ascii_lowercase();
            if HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower) {
                continue;
            }
            let value = self
                .substitutions
                .iter()
                .fold(value.to_string(), |v, (placeholder, secret)| {
                    v.replace(placeholder.as_str(), secret)
                });
            out.push_str(&format!("{name}:{value}\r\n"));
        }
        out.push_str(&format!(
            "Host: {}\r\nConnection: close\r\n\r\n",
            self.upstream.authority
        ));
        Some(out)
    }
}

/// Sends the request upstream and the response back, both as they arrive, until the upstream
/// closes after its response or the client goes away (then the upstream connection is dropped,
/// which tells the upstream to stop working on the request).
async fn exchange(
    mut client: UnixStream,
    upstream: Box<dyn ByteStream>,
    head: String,
    body_start: Vec<u8>,
) {
    let (mut client_rd, mut client_wr) = client.split();
    let (mut up_rd, mut up_wr) = tokio::io::split(upstream);
    let upload = async {
        let start = [head.as_bytes(), &body_start].concat();
        let mut buf = vec![0u8; 16 * 1024];
        let mut next: &[u8] = &start;
        loop {
            // Flushed at once: a TLS stream holds written bytes until then.
            if up_wr.write_all(next).await.is_err() || up_wr.flush().await.is_err() {
                // The upstream stopped reading; the response it may have sent still counts.
                return std::future::pending().await;
            }
            match client_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => next = &buf[..n],
            }
        }
    };
    let download = async {
        let mut pending = Vec::new();
        loop {
            let (head, rest) = match read_head(&mut up_rd, pending).await {
                Ok(read) => read,
                Err(e) => {
                    let reason = match e {
                        HeadError::TooLarge => "the upstream's response head is too large",
                        HeadError::Closed => {
                            "the upstream closed the connection without a response"
                        }
                    };
                    tracing::warn!("model relay: {reason}");
                    let _ = client_wr.write_all(&bad_gateway(reason)).await;
                    return;
                }
            };
            // Interim responses (100 Continue) go through as they are; the final one follows.
            let code = status(&head);
            if (100..200).contains(&code) && code != 101 {
                if client_wr.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                pending = rest;
                continue;
            }
            if client_wr
                .write_all(rewrite_response(&head).as_bytes())
                .await
                .is_ok()
                && client_wr.write_all(&rest).await.is_ok()
            {
                let _ = tokio::io::copy(&mut up_rd, &mut client_wr).await;
            }
            let _ = client_wr.shutdown().await;
            return;
        }
    };
    tokio::select! {
        _ = upload => {}
        _ = download => {}
    }
}

/// The status code of a response head (0 when there is none).
fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The response head with `Connection: close`, which tells the client to reconnect for its
/// next request.
fn rewrite_response(head: &str) -> String {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let mut out = format!("{}\r\n", lines.next().unwrap_or_default());
    for line in lines {
        let name = line.split(':').next().unwrap_or_default();
        if !(name.eq_ignore_ascii_case("connection") || name.eq_ignore_ascii_case("keep-alive")) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

/// The relay's own answer when the upstream cannot be reached: a 502 whose body has the
/// Anthropic API's error shape, so the CLI shows the reason.
fn bad_gateway(reason: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "type": "error",
        "error": {
            "type": "api_error",
            "message": format!("claude-runtime-adapter relay: {reason}"),
        },
    })
    .to_string();
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(all(test, unix))]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream, UnixStream};
    use tokio::sync::{mpsc, Notify};
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio_rustls::rustls::ServerConfig;
    use tokio_rustls::TlsAcceptor;

    use super::*;

    const PH: &str = "sk-ant-sandbox-placeholder-test";
    const SECRET: &str = "sk-ant-real-secret";

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
        let (head, mut body) = read_head(stream, Vec::new()).await.unwrap();
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
        let relay = ModelRelay::start_with_roots(&socket, url, subs, extra_roots)?;
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
        assert_eq!(header(&head, "connection"), Some("close"));
        assert_eq!(header(&head, "x-hop"), None);
        assert_eq!(
            head.matches("Host:").count() + head.matches("host:").count(),
            1
        );
        assert!(!head.contains(PH));
        assert_eq!(body, b"{}");
    }

    #[tokio::test]
    async fn each_connection_carries_one_request_and_the_client_reconnects() {
        let (port, mut seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let request = format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\n\r\n");
        for _ in 0..2 {
            // `send` reads to the end: the relay closed the connection after the response.
            let answer = send(&relay.socket, request.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert_eq!(header(&answer, "connection"), Some("close"));
            let (head, _) = seen.recv().await.unwrap();
            assert!(head.starts_with("GET /v1/models HTTP/1.1\r\n"), "{head}");
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
                s.write_all(b"13\r\nevent: a\ndata: one\n\n\r\n").await.unwrap();
                // The second event only once the client has the first.
                go.notified().await;
                s.write_all(b"13\r\nevent: b\ndata: two\n\n\r\n0\r\n\r\n").await.unwrap();
            }
        })
        .await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let mut client = UnixStream::connect(&relay.socket).await.unwrap();
        client
            .write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("data: one") {
            let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut chunk))
                .await
                .expect("the first event arrives before the second is sent")
                .unwrap();
            assert!(n > 0);
            got.extend_from_slice(&chunk[..n]);
        }
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
        let body: Vec<u8> = (0..1024 * 1024).map(|i| (i * 31 % 251) as u8).collect();
        let mut request = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let answer = send(&relay.socket, &request).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(seen.recv().await.unwrap().1 == body);

        let chunked = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let answer = send(&relay.socket, chunked).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert_eq!(seen.recv().await.unwrap().1, b"3\r\nabc\r\n0\r\n\r\n");
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
        let answer = send(&relay.socket, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
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
    async fn oversized_and_malformed_heads_are_refused() {
        let (port, _seen) = recording_upstream().await;
        let relay = relay_to(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
        let big = format!("GET / HTTP/1.1\r\nx-big: {}\r\n\r\n", "a".repeat(70 * 1024));
        let answer = send(&relay.socket, big.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        for bad in [
            "GET http://evil/ HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nno colon\r\n\r\n",
            "GET / HTTP/1.1\r\nx: a\r\n folded: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : evil\r\n\r\n",
            "GET / HTTP/1.1\r\nx: a\nHost: evil\r\n\r\n",
            "GET / HTTP/1.1\r\nx: a\rHost: evil\r\n\r\n",
        ] {
            let answer = send(&relay.socket, bad.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 400 "), "{bad:?}: {answer}");
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
            "http://127.0.0.1:1",
            vec![(String::new(), SECRET.into())],
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

    /// An https upstream on 127.0.0.1 with a self-signed certificate for `localhost`; returns
    /// its port and the certificate's PEM file.
    async fn tls_upstream(dir: &Path) -> (u16, PathBuf) {
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
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let port = upstream(move |tcp| {
            let acceptor = acceptor.clone();
            async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (head, _) = read_request(&mut tls).await;
                let body = format!(
                    "{}|{}",
                    header(&head, "x-api-key").unwrap_or(""),
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
            format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nx-api-key: {PH}\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(
            answer.ends_with(&format!("\r\n\r\n{SECRET}|GET /gw/v1/models HTTP/1.1")),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn an_https_upstream_with_an_unknown_issuer_answers_502() {
        let dir = tempfile::tempdir().unwrap();
        let (port, _) = tls_upstream(dir.path()).await;
        let relay = relay_to(&format!("https://localhost:{port}"), &[]).unwrap();
        let answer = send(&relay.socket, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 502 "), "{answer}");
        assert!(answer.contains("TLS handshake with localhost"), "{answer}");
        assert!(answer.contains("UnknownIssuer"), "{answer}");
    }

    #[test]
    fn an_extra_root_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        for roots in [vec![empty], vec![dir.path().join("missing.pem")]] {
            let e = tls_config(&roots).err().unwrap();
            assert_eq!(e.code, ErrorCode::InvalidParams);
        }
    }
}
