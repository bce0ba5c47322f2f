//! The real model API behind the relay: its base URL parsed once, and its pooled connections
//! (the adapter's https connector, [`crate::https`]).

use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::error::{AdapterError, Result};
use crate::https::Connector;
use crate::server::{Body, STEP_TIMEOUT};

/// How long an idle upstream connection stays in the pool (the model API closes its own).
const POOL_IDLE: Duration = Duration::from_secs(60);

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
            .build(Connector::new(extra_roots, false, STEP_TIMEOUT)?);
        Ok(Upstream {
            origin: format!("{}://{authority}", if https { "https" } else { "http" }),
            base_path: uri.path().trim_end_matches('/').to_string(),
            client,
        })
    }
}
