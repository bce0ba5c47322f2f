//! A dead engine's pods: their agents' work saved, then the pods deleted.
//!
//! When an engine dies, `cra-pod mux` sees its stream end and kills the CLI; the pod idles on
//! (`cra-pod idle`), its checkout intact. A new adapter on the same host lists the pods of its
//! host's dead engines ([`Cluster::orphans`], the local sweep's owner rule) and, for an
//! Implementor's ([`ANNOTATION_WORK`], written before its agent started), opens a new mux
//! stream and reads the work out exactly as the session's own end would have
//! ([`work::read_work`]: the same script in the same jail, the same patch), then saves it where
//! the local sweep saves a dead checkout's: `<git common dir>/claude-runtime-adapter/salvaged/
//! <session id>-<unix ms>.patch` of the repository the pod records.
//!
//! - Two adapters sweeping at once: each marks a pod before reading it ([`ANNOTATION_SWEEPER`],
//!   on the version it listed), so only one reads it; a sweeper that dies is passed over.
//! - Saved, the pod records where ([`ANNOTATION_SALVAGED`]), so a deletion failing after it
//!   does not save the work twice.
//! - A pod whose work cannot be read (its container ended, the stream or the extraction failed,
//!   past [`SALVAGE_TIMEOUT`]) is kept for the next sweep and the failure logged: its
//!   `activeDeadlineSeconds` still ends it. A pod no longer running has nothing to read: deleted.
//! - An interrupted Implementor's pod the next dispatch on its branch may continue
//!   ([`super::resume`], [`super::interruption`]) is kept until `resumeInterrupted` has passed since its conversation's
//!   last write, or a continuation would no longer fit in the pod's life, whichever comes
//!   first ([`Swept::next`]: the backend sweeps again then), and then saved and deleted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::cluster::{
    Cluster, Orphan, Pod, ANNOTATION_SALVAGED, ANNOTATION_SWEEPER, ANNOTATION_WORK,
};
use super::image::{inspect_image, pod_env, ImageFacts};
use super::interruption::{self, AgentRecord, Times};
use super::layout::MUX;
use super::session_setup::open_shell;
use super::work::{read_work, WorkAt, WorkRecord};
use crate::clock::now_ms;
use crate::environment::remote::RemoteShell;
use crate::error::{AdapterError, ErrorCode, Result};
use crate::git::sweep::save_salvaged;

/// The bound on reading one dead pod's work out (its stream, the extraction, the patch).
const SALVAGE_TIMEOUT: Duration = Duration::from_secs(300);

/// Records on `pod` what reading its work needs ([`ANNOTATION_WORK`]).
pub(super) async fn record_work(pod: &Pod, record: &WorkRecord) -> Result<()> {
    let json = serde_json::to_string(record)
        .map_err(|e| AdapterError::new(ErrorCode::Internal, format!("{e}")))?;
    pod.annotate(ANNOTATION_WORK, Some(&json)).await
}

/// What a sweep did: the pods it deleted, and until when (Unix ms) the earliest of those it
/// kept for a continuation may wait ([`super::resume`]): the next sweep is due then.
#[derive(Default)]
pub(super) struct Swept {
    pub deleted: Vec<String>,
    pub next: Option<u64>,
}

impl Swept {
    /// Adds what another sweep did: both's deletions, the earlier of their next sweeps.
    pub(super) fn merge(&mut self, other: Swept) {
        self.deleted.extend(other.deleted);
        self.next = self.next.into_iter().chain(other.next).min();
    }
}

/// How long an interrupted session's pod waits for the next dispatch on its branch
/// (`resumeInterrupted`) and the times deciding whether it still fits in the pod's life.
pub(super) struct Keep<'a> {
    pub within: Duration,
    pub times: &'a Times,
}

/// What became of one dead engine's pod.
enum Retired {
    Deleted(String),
    /// Kept for a continuation until then (Unix ms).
    Waiting(u64),
    /// Kept for the next sweep (its work could not be read, another sweep has it) or its
    /// deletion failed.
    Kept,
}

/// Saves the work of this host's dead engines' pods (with `engine`, of the identity's other
/// processes: [`Cluster::orphans`]) and deletes them (the module docs), but for those an
/// interrupted session's next dispatch may still continue (`keep`).
pub(super) async fn sweep(
    cluster: &Cluster,
    engine: Option<&str>,
    keep: Option<&Keep<'_>>,
) -> Result<Swept> {
    let orphans = cluster.orphans(engine).await?;
    let retired = orphans.into_iter().map(|o| retire(cluster, o, keep));
    let mut swept = Swept::default();
    for r in futures::future::join_all(retired).await {
        match r {
            Retired::Deleted(name) => swept.deleted.push(name),
            Retired::Waiting(until) => swept.merge(Swept {
                deleted: Vec::new(),
                next: Some(until),
            }),
            Retired::Kept => {}
        }
    }
    Ok(swept)
}

/// One dead engine's pod: kept while its session may be continued, else its work saved (when
/// it has any to read), then deleted.
async fn retire(cluster: &Cluster, orphan: Orphan, keep: Option<&Keep<'_>>) -> Retired {
    let pod = Arc::new(orphan.pod.clone());
    let record = orphan
        .work
        .as_deref()
        .map(serde_json::from_str::<WorkRecord>);
    match (record, &orphan.salvaged) {
        (Some(Ok(record)), None) if orphan.running => {
            let label = orphan.session_id.as_deref().unwrap_or(&pod.name);
            let (shell, env) = match open(&pod).await {
                Ok((shell, image)) => (shell, pod_env(&[], &[], &image)),
                Err(e) => {
                    tracing::warn!(pod = %pod.name, session = %label, error = %e.message, "sweep: a dead engine's pod does not answer; kept for the next sweep");
                    return Retired::Kept;
                }
            };
            // Read before any mark: a dispatch taking the pod over meanwhile (on the version
            // listed) must not find it marked as another's.
            if let Some(until) = waits(&orphan, &shell, &env, keep).await {
                tracing::info!(pod = %pod.name, session = %label, "sweep: a dead engine's pod is kept for the next session on its branch to continue (resumeInterrupted)");
                close(&pod, shell).await;
                return Retired::Waiting(until);
            }
            match cluster.claim_orphan(&orphan).await {
                Ok(true) => {}
                Ok(false) => {
                    close(&pod, shell).await;
                    return Retired::Kept;
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not mark a dead engine's pod for reading its work; kept for the next sweep");
                    close(&pod, shell).await;
                    return Retired::Kept;
                }
            }
            let saved = save_work(&shell, &env, &pod, &record, label).await;
            close(&pod, shell).await;
            if let Err(e) = saved {
                return unread(&pod, label, &e).await;
            }
        }
        (Some(Ok(_)), None) => {
            tracing::warn!(pod = %pod.name, "sweep: a dead engine's pod no longer runs: its work cannot be read");
        }
        (Some(Err(e)), _) => {
            tracing::warn!(pod = %pod.name, error = %e, "sweep: a dead engine's pod's work record cannot be read: its work cannot be read");
        }
        _ => {}
    }
    match pod.delete().await {
        Ok(()) => Retired::Deleted(pod.name.clone()),
        Err(e) => {
            tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not delete a dead engine's pod");
            Retired::Kept
        }
    }
}

/// A pod whose work could not be read: kept, and passed to the next sweep, whichever process
/// runs it.
async fn unread(pod: &Pod, label: &str, e: &AdapterError) -> Retired {
    tracing::warn!(pod = %pod.name, session = %label, error = %e.message, "sweep: could not read the work out of a dead engine's pod; kept for the next sweep");
    let _ = pod.annotate(ANNOTATION_SWEEPER, None).await;
    Retired::Kept
}

/// Until when `orphan` waits for a continuation: its session recorded its agent, its
/// conversation was written within the bound, and a continuation still fits in its life.
async fn waits(
    orphan: &Orphan,
    shell: &RemoteShell,
    env: &[(String, String)],
    keep: Option<&Keep<'_>>,
) -> Option<u64> {
    let keep = keep?;
    let agent: AgentRecord = serde_json::from_str(orphan.agent.as_deref()?).ok()?;
    let conversation = interruption::conversation(shell, env, &agent.cli_session, false)
        .await
        .ok()?;
    let interrupted = now_ms().saturating_sub(conversation.age.as_millis() as u64);
    let used = Duration::from_millis(interrupted.saturating_sub(agent.started_ms));
    let until = keep
        .times
        .keep_until(orphan.ends_ms(), used, conversation.age, keep.within);
    (until > now_ms()).then_some(until)
}

/// A new mux stream into `pod`, and its image's facts: reading its work needs only the
/// environment they make (`pod_env` of nothing: the session's own, its egress and placeholders,
/// is not needed, and nothing of it is kept).
pub(super) async fn open(pod: &Arc<Pod>) -> Result<(RemoteShell, ImageFacts)> {
    let mux: Vec<String> = MUX.iter().map(|s| s.to_string()).collect();
    let shell = open_shell(pod, pod.exec(&mux).await?).await?;
    match inspect_image(&shell, &pod.image).await {
        Ok(image) => Ok((shell, image)),
        Err(e) => {
            close(pod, shell).await;
            Err(e)
        }
    }
}

/// Ends a stream [`open`] opened.
pub(super) async fn close(pod: &Pod, shell: RemoteShell) {
    if let Err(e) = shell.shutdown().await {
        tracing::debug!(pod = %pod.name, error = %e, "the sweep's stream ended before Bye");
    }
}

/// Reads the work out of `pod` over `shell` (bounded: [`SALVAGE_TIMEOUT`]) and saves it in its
/// repository, noting on the pod where ([`ANNOTATION_SALVAGED`]); where, or `None` when the
/// agent changed nothing.
pub(super) async fn save_work(
    shell: &RemoteShell,
    env: &[(String, String)],
    pod: &Pod,
    record: &WorkRecord,
    label: &str,
) -> Result<Option<PathBuf>> {
    let at = WorkAt {
        shell,
        env,
        record,
        pod: &pod.name,
    };
    let patch = tokio::time::timeout(SALVAGE_TIMEOUT, read_work(&at))
        .await
        .unwrap_or_else(|_| {
            Err(AdapterError::extract(format!(
                "not within {} s",
                SALVAGE_TIMEOUT.as_secs()
            )))
        })?;
    if patch.is_empty() {
        tracing::info!(pod = %pod.name, session = %label, "sweep: a dead engine's pod held no work");
        return Ok(None);
    }
    let saved = save_salvaged(&record.repository, &patch, label).await?;
    tracing::info!(pod = %pod.name, session = %label, patch = %saved.display(), "sweep: saved the work of a dead engine's pod");
    let at = saved.to_string_lossy();
    if let Err(e) = pod.annotate(ANNOTATION_SALVAGED, Some(&at)).await {
        tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not note on the pod where its work was saved");
    }
    Ok(Some(saved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_record_reads_back_as_written() {
        let record = WorkRecord {
            repository: "/srv/repo".into(),
            base: "a".repeat(40),
            snapshot: "b".repeat(40),
            trust_before: 1_700_000_000,
            sandboxed: true,
            layered_end: false,
            node_base: None,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains("\"trustBefore\":1700000000"), "{json}");
        // A record of before `nodeBase` (a pod of an older adapter) reads as none.
        assert!(!json.contains("nodeBase"), "{json}");
        assert_eq!(serde_json::from_str::<WorkRecord>(&json).unwrap(), record);
    }
}
