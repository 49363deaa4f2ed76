//! The FIP table watch: one ConfigMap, `<prefix>-control-plane-fips` in the controller's
//! namespace, through the node's own API server (the manifest points `KUBERNETES_SERVICE_HOST`
//! at the node's address, never at the FIP), reduced to the control-plane FIPs and their holders.
//!
//! ```text
//!  watch ConfigMaps (kube-runtime watcher, one namespace, fieldSelector metadata.name=<table>:
//!     │   RBAC grants the agent that one object and nothing else)
//!     │ Init / InitApply / InitDone: a (re)list; until a table is seen, what the kernel
//!     │   held at the agent's start stays (an upgrade drops no rule before the controller
//!     │   writes its first table)
//!     │ Apply: the table changed (the leader wrote it); one that cannot be read at all is
//!     │         kept as it was, with a warning (no FIP's rules dropped for a garbled write)
//!     │ Delete: kept as it was (a warning): the leader writes it again, and dropping every
//!     │         rule meanwhile would cut the FIPs' traffic
//!     ▼
//!  table::fip_set ─► watch::Sender<Option<FipSet>>  (None until a table is seen)   ─► reconcile
//!  WatchStatus: listed? last watch error?                                            ─► /ready
//! ```
//!
//! After a failover the controller's leader rewrites the holder of the moved FIP: that write
//! reaches the agent as one Apply, and the reconcile loop acts on it at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::table::{FipSet, Problem, fip_set};
use crate::names::FIP_TABLE_KEY;

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
    /// `None` when the table was listed and the last watch request succeeded; else why not.
    pub fn not_ready(&self) -> Option<String> {
        let s = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match (&s.error, s.listed) {
            (Some(e), _) => Some(format!("watching the FIP table: {e}")),
            (None, false) => Some("the FIP table not listed yet".to_owned()),
            (None, true) => None,
        }
    }

    fn set(&self, f: impl FnOnce(&mut StatusInner)) {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The table as the watch last showed it. `None` until a table was seen: the controller has not
/// written one yet (a new cluster, or an upgrade from a version whose agent read Services), and
/// the agent keeps what the kernel held at its start rather than drop every FIP's rules.
#[derive(Debug, Default)]
struct Index {
    current: Option<FipSet>,
    /// The table the relist in progress (between Init and InitDone) found, if any.
    next: Option<FipSet>,
}

impl Index {
    /// The set `cm` gives, on top of `before`: a table that cannot be read at all (no key, not
    /// JSON) keeps `before`'s FIPs and holders, with the problem, as a deleted one does.
    fn of(cm: &ConfigMap, before: Option<&FipSet>) -> FipSet {
        let set = fip_set(
            cm.data
                .as_ref()
                .and_then(|d| d.get(FIP_TABLE_KEY))
                .map(String::as_str),
        );
        if set
            .problems
            .iter()
            .any(|p| matches!(p, Problem::NoTable | Problem::NotATable(_)))
        {
            return FipSet {
                problems: set.problems,
                ..before.cloned().unwrap_or_default()
            };
        }
        set
    }

    /// Applies one event; true when the published set may have changed.
    fn apply(&mut self, ev: Event<ConfigMap>) -> bool {
        match ev {
            Event::Init => {
                self.next = None;
                false
            }
            Event::InitApply(cm) => {
                self.next = Some(Self::of(&cm, self.current.as_ref()));
                false
            }
            Event::InitDone => {
                // A relist without the table (deleted while the watch was down) keeps it, as a
                // deletion does.
                if let Some(next) = self.next.take() {
                    self.current = Some(next);
                }
                true
            }
            Event::Apply(cm) => {
                self.current = Some(Self::of(&cm, self.current.as_ref()));
                true
            }
            Event::Delete(_) => {
                warn!(
                    "the FIP table was deleted; the FIPs it named stay accepted until the controller writes it again"
                );
                false
            }
        }
    }

    /// The FIPs and holders (without the problems); `None` until a table was seen.
    fn fips(&self) -> Option<FipSet> {
        self.current.as_ref().map(|c| FipSet {
            problems: Vec::new(),
            ..c.clone()
        })
    }

    fn problems(&self) -> BTreeSet<String> {
        self.current
            .iter()
            .flat_map(|c| c.problems.iter().map(Problem::to_string))
            .collect()
    }
}

/// Watches the FIP table `namespace/name` until `shutdown`, publishing its FIPs and holders on
/// `tx` after the first full list and after every change.
pub async fn watch_table(
    client: kube::Client,
    namespace: String,
    name: String,
    tx: watch::Sender<Option<FipSet>>,
    status: Arc<WatchStatus>,
    shutdown: CancellationToken,
) {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut index = Index::default();
    let mut listed = false;
    let mut reported = BTreeSet::new();
    loop {
        let ev = tokio::select! {
            () = shutdown.cancelled() => return,
            ev = events.next() => ev,
        };
        let Some(ev) = ev else {
            warn!("the FIP table watch ended");
            return;
        };
        let ev = match ev {
            Ok(ev) => {
                status.set(|s| s.error = None);
                ev
            }
            Err(error) => {
                warn!(%error, table = %format!("{namespace}/{name}"), "watching the FIP table failed; retrying");
                status.set(|s| s.error = Some(error.to_string()));
                continue;
            }
        };
        let done = matches!(ev, Event::InitDone);
        if !index.apply(ev) {
            continue;
        }
        if done && !listed {
            listed = true;
            status.set(|s| s.listed = true);
            info!(table = %format!("{namespace}/{name}"), "FIP table listed");
        }
        if !listed {
            continue;
        }
        let problems = index.problems();
        for p in problems.difference(&reported) {
            warn!(problem = %p, "FIP table row skipped");
        }
        reported = problems;
        // No table yet: the kernel's state at the start stays (`None`), the agent is ready.
        let fips = index.fips();
        tx.send_if_modified(|cur| {
            let changed = *cur != fips;
            if changed {
                *cur = fips;
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests;
