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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::cluster::{
    Cluster, Orphan, Pod, ANNOTATION_SALVAGED, ANNOTATION_SWEEPER, ANNOTATION_WORK,
};
use super::image::{inspect_image, pod_env};
use super::layout::MUX;
use super::open_shell;
use super::work::{read_work, WorkAt, WorkRecord};
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

/// Saves the work of this host's dead engines' pods (with `engine`, of the identity's other
/// processes: [`Cluster::orphans`]) and deletes them (the module docs); returns the names
/// deleted.
pub(super) async fn sweep(cluster: &Cluster, engine: Option<&str>) -> Result<Vec<String>> {
    let orphans = cluster.orphans(engine).await?;
    let retired = orphans.into_iter().map(|o| retire(cluster, o));
    Ok(futures::future::join_all(retired)
        .await
        .into_iter()
        .flatten()
        .collect())
}

/// One dead engine's pod: its work saved (when it has any to read), then deleted. `None` when
/// it is kept (its work could not be read, another sweep has it) or the deletion failed.
async fn retire(cluster: &Cluster, orphan: Orphan) -> Option<String> {
    let pod = Arc::new(orphan.pod.clone());
    let record = orphan
        .work
        .as_deref()
        .map(serde_json::from_str::<WorkRecord>);
    match (record, &orphan.salvaged) {
        (Some(Ok(record)), None) if orphan.running => {
            match cluster.claim_orphan(&orphan).await {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => {
                    tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not mark a dead engine's pod for reading its work; kept for the next sweep");
                    return None;
                }
            }
            let label = orphan.session_id.as_deref().unwrap_or(&pod.name);
            let salvaged = tokio::time::timeout(SALVAGE_TIMEOUT, salvage(&pod, &record, label))
                .await
                .unwrap_or_else(|_| {
                    Err(AdapterError::extract(format!(
                        "not within {} s",
                        SALVAGE_TIMEOUT.as_secs()
                    )))
                });
            match salvaged {
                Ok(Some(patch)) => {
                    tracing::info!(pod = %pod.name, session = %label, patch = %patch.display(), "sweep: saved the work of a dead engine's pod");
                    let at = patch.to_string_lossy();
                    if let Err(e) = pod.annotate(ANNOTATION_SALVAGED, Some(&at)).await {
                        tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not note on the pod where its work was saved");
                    }
                }
                Ok(None) => {
                    tracing::info!(pod = %pod.name, session = %label, "sweep: a dead engine's pod held no work");
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.name, session = %label, error = %e.message, "sweep: could not read the work out of a dead engine's pod; kept for the next sweep");
                    // Passed to the next sweep, whichever process runs it.
                    let _ = pod.annotate(ANNOTATION_SWEEPER, None).await;
                    return None;
                }
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
        Ok(()) => Some(pod.name.clone()),
        Err(e) => {
            tracing::warn!(pod = %pod.name, error = %e.message, "sweep: could not delete a dead engine's pod");
            None
        }
    }
}

/// Reads the work out of `pod` over a new mux stream and saves it in its repository: where,
/// or `None` when the agent changed nothing.
async fn salvage(pod: &Arc<Pod>, record: &WorkRecord, label: &str) -> Result<Option<PathBuf>> {
    let mux: Vec<String> = MUX.iter().map(|s| s.to_string()).collect();
    let shell = open_shell(pod, pod.exec(&mux).await?).await?;
    let read = async {
        let image = inspect_image(&shell, &pod.image).await?;
        // Only what the extraction's git needs: the session's own environment (its egress,
        // its placeholders) is not needed, and nothing of it is kept.
        let env = pod_env(&[], &[], &image);
        read_work(&WorkAt {
            shell: &shell,
            env: &env,
            record,
            pod: &pod.name,
        })
        .await
    };
    let patch = read.await;
    if let Err(e) = shell.shutdown().await {
        tracing::debug!(pod = %pod.name, error = %e, "the sweep's stream ended before Bye");
    }
    let patch = patch?;
    if patch.is_empty() {
        return Ok(None);
    }
    save_salvaged(&record.repository, &patch, label)
        .await
        .map(Some)
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
        };
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains("\"trustBefore\":1700000000"), "{json}");
        assert_eq!(serde_json::from_str::<WorkRecord>(&json).unwrap(), record);
    }
}
