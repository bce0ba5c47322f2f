//! The running sessions of one adapter, keyed by the id the engine sees, so
//! `cancelAgent(handle.sessionID)` always reaches its session and `sessions()` lists them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::claude::session::{StopReason, StopSignal};
use crate::clock::now_ms;
use crate::domain::{Role, StartParams};
use crate::error::{AdapterError, ErrorCode, Result};

/// What `adapter.sessions()` reports of a running session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub session_id: String,
    pub role: Role,
    pub work_item_id: Option<String>,
    pub branch_name: Option<String>,
    /// Epoch milliseconds.
    pub started_at: f64,
    /// The CLI's pid once it runs.
    pub pid: Option<u32>,
}

struct Entry {
    stop: StopSignal,
    info: SessionInfo,
    done: watch::Receiver<bool>,
}

#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, Entry>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `id` (and an Implementor's branch): `ERR_DUPLICATE_SESSION` while either is taken.
    pub fn register(
        self: &Arc<Self>,
        id: &str,
        params: &StartParams,
        stop: &StopSignal,
    ) -> Result<Registration> {
        let branch = match params {
            StartParams::Implementor { branch_name, .. } => Some(branch_name.clone()),
            _ => None,
        };
        let mut sessions = self.lock();
        if sessions.contains_key(id) {
            return Err(AdapterError::new(
                ErrorCode::DuplicateSession,
                format!("a session with sessionID {id:?} is running"),
            ));
        }
        if let Some(b) = &branch {
            let mut same = sessions
                .values()
                .filter(|e| e.info.branch_name.as_ref() == Some(b));
            if let Some(other) = same.next() {
                return Err(AdapterError::new(
                    ErrorCode::DuplicateSession,
                    format!(
                        "branch {b:?} is in use by running session {:?}; its worktree is live",
                        other.info.session_id
                    ),
                ));
            }
        }
        let (done_tx, done_rx) = watch::channel(false);
        let started_at = now_ms() as f64;
        let info = SessionInfo {
            session_id: id.to_string(),
            role: params.role(),
            work_item_id: params.work_item_id().map(str::to_string),
            branch_name: branch,
            started_at,
            pid: None,
        };
        sessions.insert(
            id.to_string(),
            Entry {
                stop: stop.clone(),
                info,
                done: done_rx,
            },
        );
        Ok(Registration {
            registry: self.clone(),
            id: id.to_string(),
            done: Some(done_tx),
        })
    }

    pub fn cancel(&self, id: &str) {
        if let Some(e) = self.lock().get(id) {
            e.stop.stop(StopReason::Cancelled);
        }
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let mut out: Vec<SessionInfo> = self.lock().values().map(|e| e.info.clone()).collect();
        out.sort_by(|a, b| a.started_at.total_cmp(&b.started_at));
        out
    }

    fn waits(&self) -> Vec<watch::Receiver<bool>> {
        self.lock().values().map(|e| e.done.clone()).collect()
    }

    /// Lets running sessions finish for up to `grace`, then cancels the rest; resolves once
    /// every session has settled and been cleaned up.
    pub async fn stop_all(&self, grace: Duration) {
        let all_done = async {
            for mut done in self.waits() {
                let _ = done.wait_for(|d| *d).await;
            }
        };
        if !grace.is_zero() {
            let _ = tokio::time::timeout(grace, all_done).await;
        }
        for e in self.lock().values() {
            e.stop.stop_for_shutdown();
        }
        for mut done in self.waits() {
            let _ = done.wait_for(|d| *d).await;
        }
    }
}

/// A session's claim on its id. Released explicitly after cleanup; dropping it (a start that
/// was abandoned) releases it too, so an id is never held by a session that no longer exists.
pub struct Registration {
    registry: Arc<Registry>,
    id: String,
    done: Option<watch::Sender<bool>>,
}

impl Registration {
    pub fn set_pid(&self, pid: u32) {
        if let Some(e) = self.registry.lock().get_mut(&self.id) {
            e.info.pid = Some(pid);
        }
    }

    pub fn release(&mut self) {
        if let Some(done) = self.done.take() {
            self.registry.lock().remove(&self.id);
            let _ = done.send(true);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.release();
    }
}
