//! The Service watch: every Service of the cluster, through the node's own API server (the
//! manifest points `KUBERNETES_SERVICE_HOST` at the node's address, never at the FIP), reduced to
//! the control-plane FIPs and their holders.
//!
//! ```text
//!  watch Services (kube-runtime watcher, all namespaces, its default backoff)
//!     │ Init / InitApply / InitDone: a (re)list builds a new index, swapped in at InitDone
//!     │ Apply / Delete: one entry updated
//!     ▼
//!  index: namespace/name ─► services::control_plane_fips(that Service)   (only endpoints kept)
//!     │ union (FIPs, holder addresses), after every change once listed
//!     ▼
//!  watch::Sender<Option<FipSet>>  (None until the first full list)  ─► the reconcile loop
//!  WatchStatus: listed? last watch error?                          ─► /ready
//! ```
//!
//! Only the control-plane endpoints' addresses are kept, not the Services themselves, so the
//! agent's memory does not grow with the cluster's workload Services. The controller's leader
//! rewrites an endpoint's holder annotations after a failover: that update reaches the agent as
//! one more Apply, and the reconcile loop acts on it at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::services::{FipSet, Problem, control_plane_fips};

/// How the watch is doing, for `/ready`.
#[derive(Debug, Default)]
pub struct WatchStatus {
    inner: Mutex<StatusInner>,
}

#[derive(Debug, Default)]
struct StatusInner {
    listed: bool,
    error: Option<String>,
}

impl WatchStatus {
    /// `None` when the Services were listed and the last watch request succeeded; else why not.
    pub fn not_ready(&self) -> Option<String> {
        let s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match (&s.error, s.listed) {
            (Some(e), _) => Some(format!("watching Services: {e}")),
            (None, false) => Some("Services not listed yet".to_owned()),
            (None, true) => None,
        }
    }

    fn set(&self, f: impl FnOnce(&mut StatusInner)) {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The control-plane FIPs of the cluster's Services, by Service.
#[derive(Debug, Default)]
struct Index {
    current: BTreeMap<String, FipSet>,
    /// A relist in progress (between Init and InitDone).
    next: Option<BTreeMap<String, FipSet>>,
}

impl Index {
    fn key(svc: &Service) -> String {
        format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
    }

    fn entry(svc: &Service, mirror: &str) -> FipSet {
        control_plane_fips(&[Arc::new(svc.clone())], mirror)
    }

    fn put(map: &mut BTreeMap<String, FipSet>, svc: &Service, mirror: &str) {
        let set = Self::entry(svc, mirror);
        if set == FipSet::default() {
            map.remove(&Self::key(svc));
        } else {
            map.insert(Self::key(svc), set);
        }
    }

    /// Applies one event; true when the published set may have changed.
    fn apply(&mut self, ev: Event<Service>, mirror: &str) -> bool {
        match ev {
            Event::Init => {
                self.next = Some(BTreeMap::new());
                false
            }
            Event::InitApply(svc) => {
                let next = self.next.get_or_insert_with(BTreeMap::new);
                Self::put(next, &svc, mirror);
                false
            }
            Event::InitDone => {
                if let Some(next) = self.next.take() {
                    self.current = next;
                }
                true
            }
            Event::Apply(svc) => {
                Self::put(&mut self.current, &svc, mirror);
                true
            }
            Event::Delete(svc) => {
                self.current.remove(&Self::key(&svc));
                true
            }
        }
    }

    /// The FIPs and holders of every control-plane endpoint (without the problems).
    fn fips(&self) -> FipSet {
        let mut all = FipSet::default();
        for set in self.current.values() {
            all.merge(set);
        }
        all.problems.clear();
        all
    }

    fn problems(&self) -> BTreeSet<String> {
        self.current
            .values()
            .flat_map(|s| s.problems.iter().map(Problem::to_string))
            .collect()
    }
}

/// Watches Services until `shutdown`, publishing the control-plane FIPs and their holders on
/// `tx` after the first full list and after every change.
pub async fn watch_services(
    client: kube::Client,
    mirror: String,
    tx: watch::Sender<Option<FipSet>>,
    status: Arc<WatchStatus>,
    shutdown: CancellationToken,
) {
    let api: kube::Api<Service> = kube::Api::all(client);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut index = Index::default();
    let mut listed = false;
    let mut reported = BTreeSet::new();
    loop {
        let ev = tokio::select! {
            () = shutdown.cancelled() => return,
            ev = events.next() => ev,
        };
        let Some(ev) = ev else {
            warn!("the Service watch ended");
            return;
        };
        let ev = match ev {
            Ok(ev) => {
                status.set(|s| s.error = None);
                ev
            }
            Err(error) => {
                warn!(%error, "watching Services failed; retrying");
                status.set(|s| s.error = Some(error.to_string()));
                continue;
            }
        };
        let done = matches!(ev, Event::InitDone);
        if !index.apply(ev, &mirror) {
            continue;
        }
        if done && !listed {
            listed = true;
            status.set(|s| s.listed = true);
            info!("Services listed");
        }
        if !listed {
            continue;
        }
        let problems = index.problems();
        for p in problems.difference(&reported) {
            warn!(problem = %p, "control-plane endpoint Service address skipped");
        }
        reported = problems;
        let fips = index.fips();
        tx.send_if_modified(|cur| {
            let changed = cur.as_ref() != Some(&fips);
            if changed {
                *cur = Some(fips);
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests;
