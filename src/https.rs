//! The adapter's own outbound HTTP(S) connections (the model relay's upstream, the telemetry
//! forwarder's collector, the adapter's OpenTelemetry exporter): hyper's connector over rustls
//! on ring (no OpenSSL, nothing to find on the host at run time), every connection's setup
//! bounded, https verified against the webpki roots and the PEM files the engine names.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use crate::error::{AdapterError, ErrorCode, Result};

/// The PEM files of extra trusted roots: `SSL_CERT_FILE` and `NODE_EXTRA_CA_CERTS`.
pub fn extra_roots() -> Vec<PathBuf> {
    ["SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The connector to the upstream with a bound on the whole connection setup (TCP and TLS).
#[derive(Clone)]
pub struct Connector(HttpsConnector<HttpConnector>, Duration);

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Connector {
    /// http or https (verified against the webpki roots and `extra_roots`), every connection's
    /// setup bounded; `http2`: HTTP/2 offered by ALPN too (and spoken in clear where the client
    /// asks for it alone).
    pub fn new(extra_roots: &[PathBuf], http2: bool, setup: Duration) -> Result<Connector> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(setup));
        // Small writes (a streamed request's chunks) go out at once.
        http.set_nodelay(true);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(extra_roots)?)
            .https_or_http();
        let tls = match http2 {
            true => builder.enable_http1().enable_http2().wrap_connector(http),
            false => builder.enable_http1().wrap_connector(http),
        };
        Ok(Connector(tls, setup))
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
        let setup = self.1;
        Box::pin(async move {
            match tokio::time::timeout(setup, connecting).await {
                Ok(connected) => connected,
                Err(_) => Err("timed out".into()),
            }
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
        .map_err(|e| AdapterError::new(ErrorCode::Internal, "cannot configure TLS").with_cause(e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The messages of `e`'s sources, outermost first.
pub fn sources<'a>(e: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = String> + 'a {
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
