//! The engine's identity across processes and hosts (`backend.kubernetes.engineId`).
//!
//! An engine that runs in the cluster comes back from a deploy, a crash or a drained node as a
//! new process, mostly on another node: the host rule of the sweep ([`Cluster::orphans`]) never
//! finds its old pods there. With an identity, every pod carries it
//! ([`super::cluster::LABEL_ENGINE`]) and one process at a time holds the identity's `Lease`
//! (`coordination.k8s.io/v1`, named `cra-engine-<id>`, its holder the process's [`Owner`]
//! record). The holder sweeps the identity's pods of every other process: a process that no
//! longer holds the Lease is gone.
//!
//! - **Taking it.** Free, already this process's, or held by a process of this host that is
//!   gone: taken at once. Held by another: taken once its holder has not renewed it for
//!   `engineLease` seconds, as this process's own clock measures it (from when it first saw
//!   that version of the Lease), so no two hosts' clocks are compared. Each write names the
//!   version it read: of two processes taking it at once, one wins.
//! - **Holding it.** Renewed every third of `engineLease` while the backend lives. A renewal
//!   that finds another holder (this process was cut off from the API server for longer than
//!   the lease) stops and says so: that process now sweeps this one's pods.
//! - **Giving it up.** `shutdown()` clears the holder, so a successor (a deploy's new process,
//!   started before the old one stops) takes it at once.
//! - Two live engines configured with one identity: the second waits for the Lease for as
//!   long as the first renews it (said once), and sweeps nothing of the identity meanwhile.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::cluster::{bounded, Cluster, Failure};
use crate::error::Result;
use crate::process::Owner;

/// What an observed Lease's holder means to this process.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// Nobody, or a process of this host that is gone: it may be taken now.
    Free,
    Ours,
    /// Another process, perhaps alive: taken only once it stops renewing.
    Other(String),
}

fn holder_of(record: Option<&str>, me: &Owner) -> Holder {
    let record = match record {
        None | Some("") => return Holder::Free,
        Some(r) => r,
    };
    match Owner::parse(record) {
        Some(o) if o == *me => Holder::Ours,
        Some(o) if o.host == me.host && !o.is_alive() => Holder::Free,
        _ => Holder::Other(record.to_string()),
    }
}

/// The identity's Lease, as this process holds it.
pub(super) struct EngineLease {
    api: Api<Lease>,
    name: String,
    me: Owner,
    duration: Duration,
    url: String,
}

impl EngineLease {
    pub(super) fn new(cluster: &Cluster, engine_id: &str, duration: Duration) -> EngineLease {
        EngineLease {
            api: cluster.leases(),
            name: format!("cra-engine-{engine_id}"),
            me: Owner::current(),
            duration,
            url: cluster.url().to_string(),
        }
    }

    fn failed(&self, what: &str, f: Failure) -> crate::error::AdapterError {
        super::cluster::failure(&self.url, &format!("{what} Lease {}", self.name), f)
    }

    /// `lease` (or a new one) as this process's from now.
    fn taken(&self, lease: Option<Lease>) -> Lease {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let mut lease = lease.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(&self.me.to_record()) {
            spec.holder_identity = Some(self.me.to_record());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.lease_duration_seconds = Some(self.duration.as_secs().min(i32::MAX as u64) as i32);
        spec.renew_time = Some(now);
        lease
    }

    /// Waits until this process holds the Lease (the module docs); the Lease as written.
    /// Unbounded while another live process renews it: the caller ends it (`shutdown()`).
    pub(super) async fn acquire(&self) -> Result<Lease> {
        // The version of another's Lease seen, and since when (this process's clock).
        let mut watched: Option<(Option<String>, Instant)> = None;
        let mut said = false;
        let params = PostParams::default();
        loop {
            let seen = match bounded(|| self.api.get_opt(&self.name)).await {
                Ok(seen) => seen,
                Err(f) => return Err(self.failed("read", f)),
            };
            let Some(lease) = seen else {
                let fresh = self.taken(None);
                match bounded(|| self.api.create(&params, &fresh)).await {
                    Ok(l) => return Ok(l),
                    // Made by another meanwhile (or by this create, sent again): read it.
                    Err(Failure::Api(s)) if s.code == 409 => continue,
                    Err(f) => return Err(self.failed("create", f)),
                }
            };
            let version = lease.metadata.resource_version.clone();
            let record = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
            let take = match holder_of(record.as_deref(), &self.me) {
                Holder::Free | Holder::Ours => true,
                Holder::Other(holder) => match &watched {
                    Some((v, since)) if *v == version => since.elapsed() >= self.duration,
                    _ => {
                        if watched.is_some() && !said {
                            said = true;
                            tracing::warn!(lease = %self.name, holder = %holder, "another engine process holds this engineId and renews it: its pods are its own; this one waits for the identity");
                        }
                        watched = Some((version, Instant::now()));
                        false
                    }
                },
            };
            if take {
                let renewed = self.taken(Some(lease.clone()));
                match bounded(|| self.api.replace(&self.name, &params, &renewed)).await {
                    Ok(l) => return Ok(l),
                    // Renewed or taken meanwhile: look again.
                    Err(Failure::Api(s)) if s.code == 409 => {
                        watched = None;
                        continue;
                    }
                    Err(f) => return Err(self.failed("take", f)),
                }
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews `lease` every third of its duration for as long as the future runs; returns
    /// when another process has taken it.
    pub(super) async fn hold(&self, mut lease: Lease) {
        let params = PostParams::default();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            let renewed = self.taken(Some(lease.clone()));
            match bounded(|| self.api.replace(&self.name, &params, &renewed)).await {
                Ok(l) => lease = l,
                Err(Failure::Api(s)) if s.code == 409 || s.is_not_found() => {
                    let seen = bounded(|| self.api.get_opt(&self.name)).await;
                    match seen {
                        // Still this process's (a renewal that went through unanswered), or
                        // free again: the next renewal writes it as this process's.
                        Ok(Some(l))
                            if !matches!(
                                holder_of(
                                    l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
                                    &self.me,
                                ),
                                Holder::Other(_)
                            ) =>
                        {
                            lease = l
                        }
                        Ok(Some(l)) => {
                            let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                            tracing::error!(lease = %self.name, holder = %holder, "this engine process lost its engineId to another (it did not renew it in time): that process now sweeps this one's pods");
                            return;
                        }
                        // Deleted (by hand): made again by the next renewal's create.
                        Ok(None) => {
                            let fresh = self.taken(None);
                            if let Ok(l) = bounded(|| self.api.create(&params, &fresh)).await {
                                lease = l;
                            }
                        }
                        Err(f) => {
                            tracing::warn!(error = %self.failed("read", f).message, "could not renew the engine's identity; trying again")
                        }
                    }
                }
                Err(f) => {
                    tracing::warn!(error = %self.failed("renew", f).message, "could not renew the engine's identity; trying again")
                }
            }
        }
    }
}

impl EngineLease {
    /// Gives the Lease up if this process holds it (`shutdown()`): its holder cleared, on the
    /// version read, so a successor takes it at once. A failure is logged: the Lease then
    /// lapses by itself.
    pub(super) async fn release(&self) {
        let released = async {
            let Some(mut lease) = bounded(|| self.api.get_opt(&self.name)).await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if holder_of(spec.holder_identity.as_deref(), &self.me) != Holder::Ours {
                return Ok(());
            }
            spec.holder_identity = None;
            let params = PostParams::default();
            bounded(|| self.api.replace(&self.name, &params, &lease))
                .await
                .map(drop)
        };
        if let Err(f) = released.await {
            tracing::warn!(error = %self.failed("release", f).message, "could not give the engine's identity up; it lapses by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_free_unheld_or_of_a_dead_process_of_this_host_and_another_hosts_holder_is_never_judged_dead(
    ) {
        let me = Owner::current();
        assert_eq!(holder_of(None, &me), Holder::Free);
        assert_eq!(holder_of(Some(""), &me), Holder::Free);
        assert_eq!(holder_of(Some(&me.to_record()), &me), Holder::Ours);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let gone = Owner::of_pid(child.id()).unwrap();
        assert_eq!(
            holder_of(Some(&gone.to_record()), &me),
            Holder::Other(gone.to_record()),
            "alive"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(holder_of(Some(&gone.to_record()), &me), Holder::Free);
        let elsewhere = Owner {
            host: format!("{}-elsewhere", gone.host),
            ..gone
        };
        assert!(matches!(
            holder_of(Some(&elsewhere.to_record()), &me),
            Holder::Other(_)
        ));
        // Not an owner record at all (a person's, another tool's): another's, waited out.
        assert!(matches!(holder_of(Some("someone"), &me), Holder::Other(_)));
    }
}
