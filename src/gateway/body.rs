//! A request's body, read whole within the engine's memory budget. The relay reads every body
//! before it forwards it (a provider's signature covers it), in the engine's process, outside
//! any session's memory limit: so what it may hold is bounded twice, by a share per session
//! (a relay) and by one budget for the whole process. A body is counted at its declared length
//! (the largest allowed when it declares none) before a byte of it is read; past its share a
//! request waits, with its connection unread (the sender's writes block), until the session's
//! other bodies are gone or [`BODY_TIMEOUT`] passes, and is then refused. One agent holding
//! every upload it can open costs the engine its share, never the engine.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The largest request body the relay takes: the Messages API's own request limit (32 MB).
/// The CLI's requests are a few MiB at most (the conversation, capped by the model's context).
pub(super) const MAX_REQUEST_BODY: usize = 32_000_000;
/// What one session's bodies may hold at once: two requests of the largest size.
const SESSION_SHARE: usize = 2 * MAX_REQUEST_BODY;
/// What all sessions' bodies may hold at once, in the whole process.
const PROCESS_BUDGET: usize = 256 << 20;
/// How long a body may take to arrive, waits for the budget included.
const BODY_TIMEOUT: Duration = Duration::from_secs(120);
/// The budget's unit: permits are KiB (a semaphore counts in `u32` per acquire).
const UNIT: usize = 1024;

static PROCESS: LazyLock<Arc<Semaphore>> =
    LazyLock::new(|| Arc::new(Semaphore::new(PROCESS_BUDGET / UNIT)));

/// One session's share of the budget.
pub(super) struct BodyBudget {
    share: Arc<Semaphore>,
}

/// A body read whole, and the budget it holds until it is dropped (after it was sent).
pub(super) struct HeldBody {
    pub bytes: Bytes,
    _held: [OwnedSemaphorePermit; 2],
}

/// Why a body was not read, as the relay answers it.
pub(super) struct Refused {
    pub status: StatusCode,
    pub message: String,
}

impl BodyBudget {
    pub(super) fn new() -> BodyBudget {
        BodyBudget {
            share: Arc::new(Semaphore::new(SESSION_SHARE / UNIT)),
        }
    }

    /// `body` whole, refused at once when it declares more than [`MAX_REQUEST_BODY`].
    pub(super) async fn read(
        &self,
        body: Incoming,
        declared: Option<u64>,
    ) -> Result<HeldBody, Refused> {
        if declared.is_some_and(|n| n > MAX_REQUEST_BODY as u64) {
            return Err(too_large());
        }
        let mut waiting = false;
        match tokio::time::timeout(BODY_TIMEOUT, self.collect(body, declared, &mut waiting)).await {
            Ok(read) => read,
            Err(_) if waiting => Err(Refused {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "the session's request bodies held {} MB of the engine's memory for {} s; \
                     this one was not read",
                    SESSION_SHARE / 1_000_000,
                    BODY_TIMEOUT.as_secs()
                ),
            }),
            Err(_) => Err(Refused {
                status: StatusCode::REQUEST_TIMEOUT,
                message: "the request body did not arrive in time".into(),
            }),
        }
    }

    async fn collect(
        &self,
        mut body: Incoming,
        declared: Option<u64>,
        waiting: &mut bool,
    ) -> Result<HeldBody, Refused> {
        // The whole body's budget before its first byte is read: bodies reading side by side
        // and each holding part of the share would wait for each other for ever. A body
        // without a declared length (chunked) may be as large as any.
        let size = declared.map_or(MAX_REQUEST_BODY, |n| n as usize);
        let units = size.div_ceil(UNIT);
        *waiting = true;
        let held = [
            acquire(&self.share, units).await?,
            acquire(&PROCESS, units).await?,
        ];
        *waiting = false;
        // Pages of the capacity are only used as the bytes arrive.
        let mut bytes = Vec::with_capacity(size);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Refused {
                status: StatusCode::BAD_REQUEST,
                message: format!("the request body could not be read: {e}"),
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if bytes.len() + data.len() > MAX_REQUEST_BODY {
                return Err(too_large());
            }
            bytes.extend_from_slice(&data);
        }
        Ok(HeldBody {
            bytes: Bytes::from(bytes),
            _held: held,
        })
    }
}

/// `units` of `budget` (at most MAX_REQUEST_BODY / UNIT: within `u32`).
async fn acquire(budget: &Arc<Semaphore>, units: usize) -> Result<OwnedSemaphorePermit, Refused> {
    // The semaphores are never closed; were one, the body is refused, not read unbounded.
    budget
        .clone()
        .acquire_many_owned(units as u32)
        .await
        .map_err(|_| Refused {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the relay is shutting down".into(),
        })
}

fn too_large() -> Refused {
    Refused {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("a request body over {MAX_REQUEST_BODY} bytes (the API's own limit)"),
    }
}
