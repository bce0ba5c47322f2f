//! The real model API behind the relay: its base URL parsed once, its pooled connections
//! (hyper's client over rustls on ring, every connection's setup bounded), the roots an https
//! upstream is verified against, and its failures in words.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use crate::error::{AdapterError, ErrorCode, Result};
use crate::sandbox::server::{Body, STEP_TIMEOUT};

/// How long an idle upstream connection stays in the pool (the model API closes its own).
const POOL_IDLE: Duration = Duration::from_secs(60);

/// The PEM files of extra trusted roots: `SSL_CERT_FILE` and `NODE_EXTRA_CA_CERTS`.
pub(in crate::sandbox) fn extra_roots() -> Vec<PathBuf> {
    ["SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The connector to the upstream with a bound on the whole connection setup (TCP and TLS).
#[derive(Clone)]
pub(in crate::sandbox) struct Connector(HttpsConnector<HttpConnector>);

pub(in crate::sandbox) type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Connector {
    /// http or https (verified against the webpki roots and `extra_roots`), every connection's
    /// setup bounded; `http2`: HTTP/2 offered by ALPN too (and spoken in clear where the client
    /// asks for it alone).
    pub(in crate::sandbox) fn new(extra_roots: &[PathBuf], http2: bool) -> Result<Connector> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(STEP_TIMEOUT));
        // Small writes (a streamed request's chunks) go out at once.
        http.set_nodelay(true);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(extra_roots)?)
            .https_or_http();
        let tls = match http2 {
            true => builder.enable_http1().enable_http2().wrap_connector(http),
            false => builder.enable_http1().wrap_connector(http),
        };
        Ok(Connector(tls))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = MaybeHttpsStream<TokioIo<TcpStream>>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            match tokio::time::timeout(STEP_TIMEOUT, connecting).await {
                Ok(connected) => connected,
                Err(_) => Err("timed out".into()),
            }
        })
    }
}

/// The real model API, parsed once from its base URL, with its connection pool.
pub(super) struct Upstream {
    /// `scheme://authority`, for messages and as the prefix of every request URI.
    pub origin: String,
    /// The base URL's path without its trailing slash, prefixed to every request target.
    pub base_path: String,
    pub client: Client<Connector, Body>,
}

impl Upstream {
    pub(super) fn new(url: &str, extra_roots: &[PathBuf]) -> Result<Upstream> {
        let invalid = |why: &str| {
            AdapterError::invalid_params(format!(
                "the model API base URL {url:?} is not usable by the sandbox's relay: {why}"
            ))
        };
        let uri: Uri = url.parse().map_err(|_| invalid("not an http(s) URL"))?;
        let https = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("the scheme must be http or https")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| invalid("no host"))?
            .as_str()
            .to_string();
        if authority.contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        if uri.host().is_none_or(str::is_empty)
            || (authority
                .rsplit_once(':')
                .is_some_and(|(_, p)| !p.contains(']'))
                && uri.port_u16().is_none())
        {
            return Err(invalid("no host, or a port that is not a number"));
        }
        if uri.query().is_some() || url.contains('#') {
            return Err(invalid("a base URL has no query, fragment or whitespace"));
        }
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(Connector::new(extra_roots, false)?);
        Ok(Upstream {
            origin: format!("{}://{authority}", if https { "https" } else { "http" }),
            base_path: uri.path().trim_end_matches('/').to_string(),
            client,
        })
    }
}

/// rustls on ring, trusting the webpki roots and every certificate in `extra_roots`' PEM files.
fn tls_config(extra_roots: &[PathBuf]) -> Result<ClientConfig> {
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
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| {
            AdapterError::new(ErrorCode::Internal, "cannot configure TLS for the relay")
                .with_cause(e)
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The messages of `e`'s sources, outermost first.
pub(in crate::sandbox) fn sources<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = String> + 'a {
    std::iter::successors(e.source(), |s| s.source()).map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

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
