//! Who held the controller's Lease when: recorded from every API server at once (any of them
//! may be the one a test fails), and used to prove that every cloud write a controller replica
//! sent arrived while that replica held the Lease.

use std::sync::{Arc, Mutex};

use baton_sim::LogEntry;
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};

/// Every version of the Lease seen: (wall-clock ms of its renewTime, holder), and each version
/// whole ([`LeaseVersion`]).
#[derive(Clone, Default)]
pub struct LeaseHistory {
    entries: Arc<Mutex<Vec<(u64, String)>>>,
    versions: Arc<Mutex<Vec<LeaseVersion>>>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Drop for LeaseHistory {
    fn drop(&mut self) {
        if Arc::strong_count(&self.tasks) == 1 {
            for t in self.tasks.lock().unwrap().iter() {
                t.abort();
            }
        }
    }
}

/// One version of the Lease as written (the entries fold a version into its two times; this
/// keeps them apart, so a hand-off's write and its new holder's first renew can be told apart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseVersion {
    /// Its resourceVersion: the write order (the lab's API servers share one etcd, so one
    /// version has one resourceVersion whichever server it was read from).
    pub resource_version: u64,
    /// `holderIdentity`; empty when released.
    pub holder: String,
    /// Wall-clock ms of `acquireTime`.
    pub acquire_ms: Option<u64>,
    /// Wall-clock ms of `renewTime`.
    pub renew_ms: Option<u64>,
    /// `leaseTransitions`.
    pub transitions: i32,
}

fn millis(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> u64 {
    u64::try_from(t.0.as_millisecond()).unwrap_or(0)
}

impl LeaseHistory {
    /// Starts recording `kube-system/<name>` through each of `clients`.
    pub fn record(clients: Vec<kube::Client>, name: &str) -> Self {
        let history = Self::default();
        for client in clients {
            let entries = Arc::clone(&history.entries);
            let versions = Arc::clone(&history.versions);
            let api: Api<Lease> = Api::namespaced(client, "kube-system");
            let stream = watcher(
                api,
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff()
            .touched_objects();
            let task = tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    let Ok(lease) = item else { continue };
                    let resource_version = lease
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|v| v.parse::<u64>().ok());
                    let Some(spec) = lease.spec else { continue };
                    let holder = spec.holder_identity.unwrap_or_default();
                    if let Some(resource_version) = resource_version {
                        let mut v = versions.lock().unwrap();
                        if !v.iter().any(|v| v.resource_version == resource_version) {
                            v.push(LeaseVersion {
                                resource_version,
                                holder: holder.clone(),
                                acquire_ms: spec.acquire_time.as_ref().map(millis),
                                renew_ms: spec.renew_time.as_ref().map(millis),
                                transitions: spec.lease_transitions.unwrap_or(0),
                            });
                        }
                    }
                    let mut e = entries.lock().unwrap();
                    for t in [spec.acquire_time.as_ref(), spec.renew_time.as_ref()]
                        .into_iter()
                        .flatten()
                    {
                        let entry = (millis(t), holder.clone());
                        if !e.contains(&entry) {
                            e.push(entry);
                        }
                    }
                }
            });
            history.tasks.lock().unwrap().push(task);
        }
        history
    }

    /// The holder the Lease named last (by renew time; a release keeps its last renew time and
    /// names nobody, so at equal times nobody wins).
    pub fn holder(&self) -> Option<String> {
        let e = self.entries.lock().unwrap().clone();
        let last = e.iter().map(|(t, _)| *t).max()?;
        if e.iter().any(|(t, h)| *t == last && h.is_empty()) {
            return None;
        }
        e.iter().find(|(t, _)| *t == last).map(|(_, h)| h.clone())
    }

    /// Every version seen, by renew time: (wall-clock ms of its renewTime or acquireTime,
    /// holder; empty when released).
    pub fn entries(&self) -> Vec<(u64, String)> {
        let mut e = self.entries.lock().unwrap().clone();
        e.sort();
        e
    }

    /// Every version seen, in write order (by resourceVersion). A version a watch skipped (a
    /// relist after an error) is missing only if every API server's watch skipped it.
    pub fn versions(&self) -> Vec<LeaseVersion> {
        let mut v = self.versions.lock().unwrap().clone();
        v.sort_by_key(|v| v.resource_version);
        v
    }

    /// Cloud writes (POST/PUT/DELETE) sent by a controller replica (User-Agent `… controller/<id>`)
    /// that arrived when that replica did not hold the Lease: another replica had renewed or
    /// acquired it since this one's last renew, or more than `duration_ms` had passed since this
    /// one's last renew (its lease could have expired: a follower may have taken over).
    pub fn nonleader_writes(&self, log: &[LogEntry], duration_ms: u64) -> Vec<LogEntry> {
        let mut e = self.entries.lock().unwrap().clone();
        e.sort();
        log.iter()
            .filter(|w| matches!(w.method.as_str(), "POST" | "PUT" | "DELETE"))
            .filter_map(|w| {
                let id = w
                    .user_agent
                    .split("controller/")
                    .nth(1)?
                    .split_whitespace()
                    .next()?;
                let last = e.iter().rev().find(|(t, _)| *t <= w.unix_ms);
                let ok = matches!(last, Some((t, h)) if h == id && w.unix_ms <= t + duration_ms);
                (!ok).then(|| w.clone())
            })
            .collect()
    }
}
