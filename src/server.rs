//! The unix-socket servers a session reaches the engine's side through — the model gateway
//! ([`crate::gateway`]), and the sandbox's egress proxy and telemetry forwarder
//! ([`crate::sandbox`]): a listener whose socket only its owner may connect to, each connection
//! on its own task under a cap and an idle clock, and the HTTP plumbing they speak through hyper
//! (hop-by-hop headers, bodies, a bounded head). A foundation (the inbound counterpart of
//! [`crate::https`]), so that the gateway and the sandbox above it share it without either
//! importing the other's.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
#[cfg(unix)]
pub(crate) use tokio::net::{UnixListener, UnixStream};
// Windows has no unix sockets and runs no session sandbox (`ERR_SANDBOX_UNAVAILABLE` before
// anything starts): binding fails there, and TCP types stand in so the servers' code stays one.
#[cfg(not(unix))]
pub(crate) use tokio::net::{TcpListener as UnixListener, TcpStream as UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{AdapterError, ErrorCode, Result};

/// Longest HTTP message head read before the message is refused.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Bound on reading a request head or SOCKS handshake, on resolving and on connecting upstream.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds on a [`UnixServer`]'s connections.
pub(crate) struct Limits {
    /// Open at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// A connection with no byte read or written by its client for this long is closed
    /// (with what it started: a tunnel, an upstream request). Only counted on streams wrapped
    /// in [`Tracked`].
    pub idle: Option<Duration>,
}

/// One accepted connection: its place under the server's cap, the token that ends it (and
/// every task serving it), and its idle clock.
pub(crate) struct Conn {
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
    pub(crate) async fn bound(&self, work: impl Future<Output = ()>) {
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
pub(crate) struct UnixServer {
    path: PathBuf,
    stop: CancellationToken,
}

impl UnixServer {
    /// `what` names the server in the error when the socket cannot be bound; `on_full` is
    /// called for each connection refused under the cap.
    pub(crate) fn start<F, Fut>(
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
pub(crate) struct Tracked<S> {
    inner: S,
    prefix: Option<u8>,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, prefix: Option<u8>, conn: Arc<Conn>) -> Self {
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
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
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
pub(crate) type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body of `text`.
pub(crate) fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// hyper's HTTP/1.1 server settings for a unix-socket client: a bounded head, read in time.
pub(crate) fn http1_server() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(STEP_TIMEOUT)
        .max_header_size(MAX_HEAD);
    builder
}

/// Reading HTTP heads off raw streams, for the tests of the proxy, the relay and the forwarder
/// (unix only, like them).
#[cfg(all(test, unix))]
pub(crate) mod test_io {
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
