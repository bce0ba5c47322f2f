//! Every engine callback made during context assembly is awaited here, so that each one is
//! bounded in time, abandoned on cancellation, and counted against one concurrency limit.
//! The `Deps` implementations only make the call (see `deps.rs`); putting the policy here means
//! a binding cannot forget it, and the planner's fan-out over all work items (lesson 12) cannot
//! turn into one provider call per item at the same instant.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::deps::Deps;
use crate::domain::{EngineState, ReviewHistory, RevisionFile};
use crate::error::{AdapterError, ErrorCode, Result};

pub const DEFAULT_CONCURRENCY: usize = 16;
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

// The names the engine knows these callbacks by, so an error message points at the JS side.
pub const GET_STATE: &str = "getState";
pub const GET_WORK_ITEM_BODY: &str = "workItemReader.getWorkItemBody";
pub const GET_REVISION_FILES: &str = "revisionReader.getRevisionFiles";
pub const GET_REVIEW_HISTORY: &str = "getReviewHistory";

#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Calls in flight at once for one assembly. 0 is treated as 1: a zero-permit semaphore
    /// would wait forever.
    pub concurrency: usize,
    /// How long one callback may take once it has been made (time spent queued behind the
    /// concurrency limit does not count: a slow queue is not a misbehaving callback).
    pub call_timeout: Duration,
    pub cancel: CancellationToken,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            concurrency: DEFAULT_CONCURRENCY,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            cancel: CancellationToken::new(),
        }
    }
}

impl FetchOptions {
    pub fn with_cancel(cancel: CancellationToken) -> Self {
        FetchOptions {
            cancel,
            ..FetchOptions::default()
        }
    }
}

/// The guarded view of `Deps` for one prompt assembly. The semaphore is per assembly: the
/// bound is on what one `startAgent` asks of the provider at once.
pub struct Fetcher {
    deps: Arc<dyn Deps>,
    permits: Arc<Semaphore>,
    concurrency: usize,
    call_timeout: Duration,
    cancel: CancellationToken,
}

impl Fetcher {
    pub fn new(deps: &Arc<dyn Deps>, opts: &FetchOptions) -> Self {
        let concurrency = opts.concurrency.max(1);
        Fetcher {
            deps: Arc::clone(deps),
            permits: Arc::new(Semaphore::new(concurrency)),
            concurrency,
            call_timeout: opts.call_timeout,
            cancel: opts.cancel.clone(),
        }
    }

    pub async fn state(&self) -> Result<EngineState> {
        let deps = Arc::clone(&self.deps);
        self.call(GET_STATE, None, move || deps.get_state()).await
    }

    pub async fn work_item_body(&self, id: &str) -> Result<String> {
        let deps = Arc::clone(&self.deps);
        let owned = id.to_owned();
        self.call(GET_WORK_ITEM_BODY, Some(id), move || {
            deps.get_work_item_body(owned)
        })
        .await
    }

    pub async fn revision_files(&self, revision_id: &str) -> Result<Vec<RevisionFile>> {
        let deps = Arc::clone(&self.deps);
        let owned = revision_id.to_owned();
        self.call(GET_REVISION_FILES, Some(revision_id), move || {
            deps.get_revision_files(owned)
        })
        .await
    }

    pub async fn review_history(&self, revision_id: &str) -> Result<ReviewHistory> {
        let deps = Arc::clone(&self.deps);
        let owned = revision_id.to_owned();
        self.call(GET_REVIEW_HISTORY, Some(revision_id), move || {
            deps.get_review_history(owned)
        })
        .await
    }

    /// Bodies in the order of `ids`, whatever order they settle in. The first failure ends the
    /// whole fetch and drops the calls still pending.
    pub async fn work_item_bodies(&self, ids: &[String]) -> Result<Vec<String>> {
        // `buffered` keeps at most `concurrency` futures alive (bounded memory for huge
        // states); the semaphore is what bounds calls actually in flight.
        // Owned ids: a closure over `&String` would make the future's Send-ness depend on a
        // higher-ranked lifetime rustc cannot prove, and the binding needs a Send future.
        futures::stream::iter(ids.iter().cloned())
            .map(|id| async move { self.work_item_body(&id).await })
            .buffered(self.concurrency)
            .try_collect()
            .await
    }

    async fn call<T, F>(&self, callback: &'static str, id: Option<&str>, make: F) -> Result<T>
    where
        F: FnOnce() -> BoxFuture<'static, Result<T>>,
    {
        let what = describe(callback, id);
        let _permit = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(cancelled(&what)),
            permit = self.permits.acquire() => permit.map_err(|_| {
                AdapterError::context(format!("{what}: the fetch limiter was closed"))
            })?,
        };
        // The callback is invoked only once a permit is held: in the binding, creating the
        // future is what calls into JS.
        let fut = make();
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(cancelled(&what)),
            settled = tokio::time::timeout(self.call_timeout, fut) => match settled {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(err)) => Err(name_call(err, callback, &what)),
                Err(_) => Err(AdapterError::context(format!(
                    "{what} did not settle within {}",
                    format_duration(self.call_timeout)
                ))),
            },
        }
    }
}

fn describe(callback: &str, id: Option<&str>) -> String {
    match id {
        Some(id) => format!("{callback}({id:?})"),
        None => format!("{callback}()"),
    }
}

fn cancelled(what: &str) -> AdapterError {
    AdapterError::new(
        ErrorCode::Cancelled,
        format!("context assembly cancelled while waiting for {what}"),
    )
}

/// Keeps the implementation's code and cause; only makes sure the message says which call
/// (and for which id) failed, since the JS error alone rarely does.
fn name_call(mut err: AdapterError, callback: &str, what: &str) -> AdapterError {
    if !err.message.contains(callback) {
        err.message = if err.message.is_empty() {
            format!("{what} failed")
        } else {
            format!("{what} failed: {}", err.message)
        };
    }
    err
}

fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}
