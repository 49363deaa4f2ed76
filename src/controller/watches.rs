//! One watch per resource kind, shared by every controller of the process (kube-runtime's
//! shared reflectors): Services and Nodes are each watched once, however many controllers read
//! them, and the API servers are asked for each kind's changes once.
//!
//! ```text
//!                        ┌─► Store<K>            read by any controller (endpoint loop, BGP, …)
//!  watch K ─► reflector ─┼─► subscribe_K()       objects applied, for a kube Controller's trigger
//!  (WatchBackoff)        ├─► changes_K()         a counter bumped on every event, deletes too
//!                        └─► services_where()    the Services passing a filter, kept from the
//!                                                events (no pass over the store per read)
//! ```
//!
//! Objects are stored without their `managedFields` (no controller reads them; they are often
//! most of an object's size).
//!
//! Watched kinds: Services (all namespaces), Nodes, the EndpointSlices of
//! `default/kubernetes` (the API servers), and Namespaces (only with
//! `serviceAllocationNamespaceSelector`: their labels). A kind nobody asked for is not watched, so a process
//! that runs only some controllers needs only their permissions.
//!
//! Subscriptions are taken before [`Watches::run`], which consumes the set: a subscriber made
//! later would miss the objects already listed.
//!
//! A subscription is a channel of the objects themselves, fed by the watch after the store
//! took each event ([`Trigger`]). kube-runtime's own (`reflect_shared`'s `ReflectHandle`) sends
//! references and looks each one up when it is read; when the object was deleted in between it
//! returns `Pending` without a wake-up, and the controller reading it sleeps until something else
//! wakes it. Under Service churn that stopped the Service controller, then (its buffer full) the
//! shared watch and every store on it.
//!
//! Readiness (the first full list) is published on a `tokio::sync::watch` channel ([`Cache`]):
//! kube's `Store::wait_until_ready` wakes only the last task that polled it, so two tasks
//! waiting on one shared store could wait forever.

use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt as _;
use futures::StreamExt as _;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{WatchStreamExt as _, reflector::store::Writer};
use tokio::sync::watch;

use super::health::LogThrottle;
use super::kit::Backoff;
use super::metrics::Metrics;
use super::mirror::SERVICE_NAME_LABEL;

/// How many objects a subscription may lag behind before the watch waits for it. Every
/// subscriber is a kube Controller, which takes its trigger in even while all its reconciles
/// run.
const BUFFER: usize = 1024;

/// The annotation `kubectl apply` keeps a full copy of the object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The objects of one kind as the shared watch applies them: each Apply, and every object after
/// a (re)list, read by a kube `Controller` (`for_shared_stream`). Deletes are not sent, as with
/// kube-runtime's own subscriptions.
pub type Trigger<K> = mpsc::Receiver<Arc<K>>;

/// Which objects a [`Subset`] keeps.
type Filter<K> = fn(&K) -> bool;

/// One kind's shared watch, before it runs.
struct Kind<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    /// Every subscription's sending end.
    subscribers: Vec<mpsc::Sender<Arc<K>>>,
    changes: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    used: bool,
    /// Drops what no controller reads, before the object is stored.
    trim: fn(&mut K),
    /// Subsets kept from the events, each with its filter.
    subsets: Vec<(Filter<K>, Subset<K>)>,
}

impl<K> Kind<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    fn new(api: Api<K>, config: watcher::Config, trim: fn(&mut K)) -> Self {
        Self {
            api,
            config,
            writer: reflector::store().1,
            subscribers: Vec::new(),
            changes: watch::channel(0).0,
            ready: watch::channel(false).0,
            used: false,
            trim,
            subsets: Vec::new(),
        }
    }

    fn subset(&mut self, keep: fn(&K) -> bool) -> Subset<K> {
        self.used = true;
        let subset = Subset::default();
        self.subsets.push((keep, subset.clone()));
        subset
    }

    fn cache(&mut self) -> Cache<K> {
        self.used = true;
        Cache {
            store: self.writer.as_reader(),
            ready: self.ready.subscribe(),
        }
    }

    fn subscribe(&mut self) -> Trigger<K> {
        self.used = true;
        let (tx, rx) = mpsc::channel(BUFFER);
        self.subscribers.push(tx);
        rx
    }

    fn changes(&mut self) -> watch::Receiver<u64> {
        self.used = true;
        self.changes.subscribe()
    }

    /// Drives the watch until the stream ends (never, with a backoff); errors are logged, events
    /// counted.
    async fn run(self, metrics: Option<Arc<Metrics>>) {
        if !self.used {
            return std::future::pending().await;
        }
        let events = watcher(self.api.clone(), self.config.clone()).backoff(WatchBackoff::default());
        self.drive(events, metrics).await;
    }

    /// Applies `events` to the store, then passes each on: to the subsets, the change counter,
    /// readiness, and the subscriptions (waiting for a subscription whose buffer is full).
    async fn drive(
        self,
        events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
        metrics: Option<Arc<Metrics>>,
    ) {
        let kind = K::kind(&());
        let errors = StreamErrors::new(kind.clone());
        let (changes, ready, subsets, mut subscribers) =
            (self.changes, self.ready, self.subsets, self.subscribers);
        let reader = self.writer.as_reader();
        let trim = self.trim;
        let events = events
            // No controller reads managedFields or kubectl's copy of the last applied object;
            // together they are often most of an object's size.
            .modify(move |obj: &mut K| {
                let meta = obj.meta_mut();
                meta.managed_fields = None;
                if let Some(annotations) = meta.annotations.as_mut() {
                    annotations.remove(LAST_APPLIED);
                }
                trim(obj);
            })
            .reflect(self.writer);
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    errors.warn(&error);
                    continue;
                }
            };
            for (keep, subset) in &subsets {
                subset.apply(&event, *keep);
            }
            if let (Some(m), false) = (&metrics, matches!(event, watcher::Event::Init)) {
                m.watch_event(&kind);
            }
            let sent = match event {
                watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                // The store as listed: every object is news after a relist.
                watcher::Event::InitDone => {
                    ready.send_if_modified(|r| !std::mem::replace(r, true));
                    reader.state()
                }
                watcher::Event::Apply(obj) => vec![Arc::new(obj)],
                watcher::Event::Delete(_) => Vec::new(),
            };
            changes.send_modify(|n| *n = n.wrapping_add(1));
            for obj in sent {
                for subscriber in &mut subscribers {
                    // A subscriber that is gone (its controller stopped) is skipped.
                    let _ = subscriber.send(Arc::clone(&obj)).await;
                }
            }
        }
    }
}

/// A shared watch's store, and whether its first full list has arrived.
#[derive(Clone)]
pub struct Cache<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    ready: watch::Receiver<bool>,
}

impl<K> Cache<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Every object, as last seen.
    pub fn state(&self) -> Vec<std::sync::Arc<K>> {
        self.store.state()
    }

    /// Waits for the first full list (any number of tasks may wait). `Err` once the watch is
    /// gone without one.
    pub async fn wait_until_ready(&self) -> Result<(), watch::error::RecvError> {
        self.ready.clone().wait_for(|ready| *ready).await.map(|_| ())
    }

    /// The kube store behind the cache (for a kube `Controller`).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }
}

/// The objects of one kind that pass a filter, kept from the watch's events as they come (no
/// pass over the store): for a reader that needs a few objects out of many on every reconcile.
/// A relist replaces the subset when it is complete, as the store is replaced.
pub struct Subset<K> {
    inner: Arc<std::sync::Mutex<SubsetState<K>>>,
}

struct SubsetState<K> {
    live: std::collections::BTreeMap<(String, String), Arc<K>>,
    /// Gathered during a relist, in force at its end.
    relist: Option<std::collections::BTreeMap<(String, String), Arc<K>>>,
}

impl<K> Default for Subset<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(std::sync::Mutex::new(SubsetState {
                live: std::collections::BTreeMap::new(),
                relist: None,
            })),
        }
    }
}

impl<K> Clone for Subset<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: kube::Resource + Clone> Subset<K> {
    /// The objects in the subset now, in namespace and name order.
    pub fn objects(&self) -> Vec<Arc<K>> {
        self.lock().live.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubsetState<K>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn apply(&self, event: &watcher::Event<K>, keep: fn(&K) -> bool) {
        let key = |obj: &K| {
            let meta = obj.meta();
            (
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            )
        };
        let mut state = self.lock();
        match event {
            watcher::Event::Init => state.relist = Some(std::collections::BTreeMap::new()),
            watcher::Event::InitApply(obj) => {
                if keep(obj) {
                    state
                        .relist
                        .get_or_insert_default()
                        .insert(key(obj), Arc::new(obj.clone()));
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = state.relist.take() {
                    state.live = listed;
                }
            }
            watcher::Event::Apply(obj) => {
                if keep(obj) {
                    state.live.insert(key(obj), Arc::new(obj.clone()));
                } else {
                    state.live.remove(&key(obj));
                }
            }
            watcher::Event::Delete(obj) => {
                state.live.remove(&key(obj));
            }
        }
    }
}

/// The shared watches of one process.
pub struct Watches {
    services: Kind<Service>,
    nodes: Kind<Node>,
    api_slices: Kind<EndpointSlice>,
    namespaces: Kind<Namespace>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("services", &self.services.used)
            .field("nodes", &self.nodes.used)
            .field("api_slices", &self.api_slices.used)
            .field("namespaces", &self.namespaces.used)
            .field("counted", &self.metrics.is_some())
            .finish()
    }
}

impl Watches {
    /// The watches through `client`; nothing runs until [`run`](Self::run).
    pub fn new(client: &kube::Client) -> Self {
        Self {
            services: Kind::new(Api::all(client.clone()), watcher::Config::default(), |_| {}),
            // A kubelet lists every image on its node in the status: often the largest part
            // of a Node, and nothing here reads it.
            nodes: Kind::new(Api::all(client.clone()), watcher::Config::default(), |node| {
                if let Some(status) = node.status.as_mut() {
                    status.images = None;
                }
            }),
            api_slices: Kind::new(
                Api::namespaced(client.clone(), "default"),
                watcher::Config::default().labels(&format!("{SERVICE_NAME_LABEL}=kubernetes")),
                |_| {},
            ),
            // Only their labels are read (a namespace selector).
            namespaces: Kind::new(Api::all(client.clone()), watcher::Config::default(), |ns| {
                ns.spec = None;
                ns.status = None;
                if let Some(annotations) = ns.metadata.annotations.as_mut() {
                    annotations.clear();
                }
            }),
            metrics: None,
        }
    }

    /// Counts every object event in `metrics` (`baton_watch_events_total{kind}`).
    #[must_use]
    pub fn counted(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Every Service.
    pub fn services(&mut self) -> Cache<Service> {
        self.services.cache()
    }

    /// Services as they are applied (a Controller's trigger).
    pub fn subscribe_services(&mut self) -> Trigger<Service> {
        self.services.subscribe()
    }

    /// The Services that pass `keep`, kept from the events (see [`Subset`]).
    pub fn services_where(&mut self, keep: fn(&Service) -> bool) -> Subset<Service> {
        self.services.subset(keep)
    }

    /// Bumped on every change of a Service (deletes too).
    pub fn service_changes(&mut self) -> watch::Receiver<u64> {
        self.services.changes()
    }

    /// Every Node.
    pub fn nodes(&mut self) -> Cache<Node> {
        self.nodes.cache()
    }

    /// Nodes as they are applied (a Controller's trigger).
    pub fn subscribe_nodes(&mut self) -> Trigger<Node> {
        self.nodes.subscribe()
    }

    /// Bumped on every change of a Node (deletes too).
    pub fn node_changes(&mut self) -> watch::Receiver<u64> {
        self.nodes.changes()
    }

    /// The EndpointSlices of `default/kubernetes`.
    pub fn api_slices(&mut self) -> Cache<EndpointSlice> {
        self.api_slices.cache()
    }

    /// Every Namespace (for their labels).
    pub fn namespaces(&mut self) -> Cache<Namespace> {
        self.namespaces.cache()
    }

    /// Namespaces as they are applied.
    pub fn subscribe_namespaces(&mut self) -> Trigger<Namespace> {
        self.namespaces.subscribe()
    }

    /// Bumped on every change of a Namespace (deletes too).
    pub fn namespace_changes(&mut self) -> watch::Receiver<u64> {
        self.namespaces.changes()
    }

    /// Runs every watch something asked for, until `shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => {}
            () = self.services.run(self.metrics.clone()) => {}
            () = self.nodes.run(self.metrics.clone()) => {}
            () = self.api_slices.run(self.metrics.clone()) => {}
            () = self.namespaces.run(self.metrics) => {}
        }
    }
}

/// Waits until something changed on any of `changes` (a closed channel never wakes).
pub async fn any_changed(changes: &mut [watch::Receiver<u64>]) {
    let waits = changes.iter_mut().map(|rx| {
        Box::pin(async move {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    });
    futures::future::select_all(waits).await;
}

/// Errors of one long-lived watch or controller stream, logged at warn at most once per 30 s
/// (an RBAC denial repeats on every retry), with the count of repeats in between.
#[derive(Debug)]
pub struct StreamErrors {
    what: String,
    throttle: std::sync::Mutex<LogThrottle>,
}

impl StreamErrors {
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            throttle: std::sync::Mutex::new(LogThrottle::new(Duration::from_secs(30))),
        }
    }

    /// Logs `error` unless one was logged in the last 30 s.
    pub fn warn(&self, error: &dyn std::fmt::Display) {
        let allowed = self
            .throttle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .allow();
        if let Some(repeats) = allowed {
            tracing::warn!(%error, what = %self.what, repeats, "watch error (retrying)");
        } else {
            tracing::debug!(%error, what = %self.what, "watch error (retrying)");
        }
    }
}

/// Retry delays of a watch that failed: 100 ms, doubling, at most 2 s; back to 100 ms after any
/// success. kube-runtime's default (800 ms doubling to 30 s) means a replica whose API server was
/// unreachable for a few seconds goes on without its watches for up to 30 s after it is back —
/// too long for a follower that must see the leader's Lease change to take over on time.
#[derive(Debug, Clone, Default)]
pub struct WatchBackoff {
    failures: u32,
}

impl WatchBackoff {
    const RULE: Backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(2),
        jitter: false,
    };
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Self::Item> {
        self.failures = self.failures.saturating_add(1);
        Some(Self::RULE.delay(self.failures))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[test]
    fn watch_retries_stay_within_two_seconds_and_start_over_after_a_success() {
        let mut b = WatchBackoff::default();
        let first: Vec<u128> = b.by_ref().take(7).map(|d| d.as_millis()).collect();
        assert_eq!(first, [100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next().map(|d| d.as_millis()), Some(100));
    }
}

#[cfg(test)]
mod subset_tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;

    use super::Subset;

    fn svc(namespace: &str, name: &str, kept: bool) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                labels: kept.then(|| [("kept".to_owned(), String::new())].into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    fn kept(svc: &Service) -> bool {
        svc.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("kept"))
    }

    fn names(subset: &Subset<Service>) -> Vec<String> {
        subset
            .objects()
            .iter()
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_subset_follows_applies_deletes_and_a_relist() {
        let subset = Subset::default();
        let apply = |event| subset.apply(&event, kept);
        apply(Event::Init);
        apply(Event::InitApply(svc("a", "one", true)));
        apply(Event::InitApply(svc("a", "two", false)));
        assert!(names(&subset).is_empty(), "a relist counts once it is complete");
        apply(Event::InitDone);
        assert_eq!(names(&subset), ["one"]);
        apply(Event::Apply(svc("b", "three", true)));
        apply(Event::Apply(svc("a", "two", true)));
        assert_eq!(names(&subset), ["one", "two", "three"]);
        // No longer passing the filter, or deleted: out.
        apply(Event::Apply(svc("a", "one", false)));
        apply(Event::Delete(svc("b", "three", true)));
        assert_eq!(names(&subset), ["two"]);
        // A relist replaces the subset: what it does not list is gone.
        apply(Event::Init);
        apply(Event::InitApply(svc("c", "four", true)));
        assert_eq!(names(&subset), ["two"]);
        apply(Event::InitDone);
        assert_eq!(names(&subset), ["four"]);
    }
}

#[cfg(test)]
mod trigger_tests {
    use std::time::Duration;

    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::{self, Event};

    use super::Kind;

    fn svc(name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    /// A kind whose watch is fed by the test; the client is never used (it points at a port
    /// nothing listens on).
    fn kind() -> Kind<Service> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        Kind::new(kube::Api::all(client), watcher::Config::default(), |_| {})
    }

    fn names(objs: &[std::sync::Arc<Service>]) -> Vec<String> {
        objs.iter()
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[tokio::test]
    async fn a_subscription_gets_every_applied_object_even_one_deleted_before_it_is_read() {
        let mut kind = kind();
        let trigger = kind.subscribe();
        let events: Vec<watcher::Result<Event<Service>>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(svc("listed"))),
            Ok(Event::InitDone),
            // Created and deleted before the subscriber reads: kube-runtime's ReflectHandle
            // looked it up, missed, and returned Pending with no wake-up, stalling the reader.
            Ok(Event::Apply(svc("churned"))),
            Ok(Event::Delete(svc("churned"))),
            Ok(Event::Apply(svc("after"))),
        ];
        kind.drive(futures::stream::iter(events), None).await;
        let got: Vec<_> = tokio::time::timeout(Duration::from_secs(5), trigger.collect())
            .await
            .expect("the subscription delivers everything and ends with the watch");
        assert_eq!(names(&got), ["listed", "churned", "after"]);
    }

    #[tokio::test]
    async fn a_relist_sends_the_store_as_listed_and_counts_changes() {
        let mut kind = kind();
        let trigger = kind.subscribe();
        let mut changes = kind.changes();
        let events: Vec<watcher::Result<Event<Service>>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(svc("a"))),
            Ok(Event::InitDone),
            Ok(Event::Init),
            Ok(Event::InitApply(svc("b"))),
            Ok(Event::InitApply(svc("c"))),
            Ok(Event::InitDone),
        ];
        kind.drive(futures::stream::iter(events), None).await;
        let mut got = names(&trigger.collect::<Vec<_>>().await);
        got[1..].sort();
        assert_eq!(got, ["a", "b", "c"], "what the relist dropped is not sent");
        assert_eq!(*changes.borrow_and_update(), 2, "one change per completed list");
    }
}
