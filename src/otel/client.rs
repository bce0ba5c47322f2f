//! The OTLP exporter's HTTP client: the adapter's https connector ([`crate::https`]) on a
//! runtime of its own.
//!
//! The SDK's batch span processor and periodic metric reader export from threads of their own,
//! outside any tokio runtime, blocking on the export; hyper needs one. So each export is
//! spawned on a one-thread runtime that exists only once exporting is configured, and bounded
//! by the exporter's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`), so a collector that never answers
//! cannot wedge the export thread or `shutdown()`.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use opentelemetry_http::{HttpClient, HttpError};

use crate::error::Result;
use crate::https::{extra_roots, Connector};

/// A collector's answer is a small status message; anything larger is refused unread.
const MAX_ANSWER: usize = 1024 * 1024;

pub(super) struct ExportClient {
    client: Client<Connector, Full<Bytes>>,
    timeout: Duration,
}

impl std::fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportClient")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ExportClient {
    /// An https endpoint is verified against the webpki roots, `SSL_CERT_FILE`,
    /// `NODE_EXTRA_CA_CERTS` and `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    pub(super) fn new(timeout: Duration) -> Result<ExportClient> {
        let mut roots = extra_roots();
        roots.extend(
            std::env::var_os("OTEL_EXPORTER_OTLP_CERTIFICATE")
                .filter(|v| !v.is_empty())
                .map(Into::into),
        );
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(Connector::new(&roots, true, timeout)?);
        Ok(ExportClient { client, timeout })
    }
}

fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("cra-otel-export")
        .enable_all()
        .build()?;
    Ok(RUNTIME.get_or_init(|| rt))
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> std::result::Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let exchange = async move {
            let (parts, body) = request.into_parts();
            let answer = client
                .request(Request::from_parts(parts, Full::new(body)))
                .await?;
            let (parts, body) = answer.into_parts();
            let body = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| -> HttpError { e })?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let bounded = async move {
            match tokio::time::timeout(timeout, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err(format!("the collector did not answer within {timeout:?}").into()),
            }
        };
        runtime()?.spawn(bounded).await?
    }
}
