//! What every reconciler of `baton controller` shares.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::events::{Event, EventType, Recorder, Reporter};
use baton_cloud::{Cloud, InFlight, Lead};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference};
use kube::{Api, Resource};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::metrics::Metrics;
use super::succession::Succession;
use super::trust::EndpointPolicy;
use crate::config::Config;
use crate::names::BOOTSTRAP_RECORD;

/// After the previous holder's fence (`Handover::holder_stopped`), a request it sent just before
/// may still be on its way: a list read this long after it shows the holder's last writes.
pub const TAKEOVER_MARGIN: Duration = Duration::from_millis(150);

/// Whether this replica may write to the cloud (and to status fields). Only the holder of the
/// leader Lease may; it re-checks right before each cloud write (fencing): the lease task
/// publishes this replica's term and until when the last successful renew lets it write.
///
/// A term lasts from acquiring the Lease to losing or releasing it. A renewal that comes late
/// does not end it: past the deadline writes pause ([`Self::is_leader`] is false), and the
/// late renewal resumes them in the same term ([`Self::in_term`] stays set), so controllers do
/// not reconcile everything again ([`Self::elected`] yields once per term).
#[derive(Clone, Debug)]
pub struct LeaderGate(
    watch::Receiver<Option<Lead>>,
    watch::Receiver<Option<Handover>>,
    InFlight,
    /// How long past its write deadline this replica's term may still be saved.
    Duration,
    /// The followers alive and the hand-off request.
    Succession,
);

/// What a follower knows of another replica's hold on the Lease, on its own clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handover {
    /// The holder has stopped writing by now unless it renewed (the current version of the
    /// Lease was first seen `leaseRenewDeadline` ago).
    pub holder_stopped: Instant,
    /// When this replica may take over unless the holder renews.
    pub takeover: Instant,
}

impl LeaderGate {
    /// A gate fed by the leader-election task (`controller::lease`): this replica's term and
    /// deadline, and what it knows of another holder.
    pub fn new(rx: watch::Receiver<Option<Lead>>, handover: watch::Receiver<Option<Handover>>) -> Self {
        Self(
            rx,
            handover,
            InFlight::default(),
            Duration::ZERO,
            Succession::default(),
        )
    }

    /// A gate that is always open: a single replica, or tests.
    pub fn always() -> Self {
        // A receiver keeps the last value after its sender is gone.
        let (_, rx) = watch::channel(Some(Lead {
            term: 1,
            until: Instant::now() + Duration::from_secs(10 * 365 * 24 * 3600),
        }));
        let (_, handover) = watch::channel(None);
        Self::new(rx, handover)
    }

    /// The gate of a replica whose followers and hand-off `succession` tracks.
    #[must_use]
    pub fn with_succession(mut self, succession: Succession) -> Self {
        self.4 = succession;
        self
    }

    /// Who could lead next, this replica's Node, and the hand-off request.
    pub fn succession(&self) -> &Succession {
        &self.4
    }

    /// The gate of a Lease of `duration` whose holder writes until `renew_deadline` after a
    /// renewal's start: a late renewal may still save its term for the difference.
    #[must_use]
    pub fn with_lease(mut self, duration: Duration, renew_deadline: Duration) -> Self {
        self.3 = duration.saturating_sub(renew_deadline);
        self
    }

    /// Until when this replica's term surely holds (its Lease cannot have expired for a
    /// follower yet): its write deadline plus the lease's grace.
    pub fn term_surely_held_until(&self) -> Option<Instant> {
        self.lead().map(|l| l.until + self.3)
    }

    /// The leader's writes on their way (cloud and Kubernetes): a graceful release waits for
    /// them before it clears the holder.
    pub fn in_flight(&self) -> &InFlight {
        &self.2
    }

    /// Another replica's hold on the Lease, if another replica holds it.
    pub fn handover(&self) -> Option<Handover> {
        *self.1.borrow()
    }

    /// Waits until this replica's leadership or what it knows of another holder changes (or
    /// 100 ms pass).
    pub async fn changed(&mut self) {
        // On this gate's own receivers, so that what was seen is marked seen: a fresh clone
        // would report every earlier change again, at once, forever (a busy loop).
        let Self(until, handover, ..) = self;
        tokio::select! {
            () = changed_or_tick(until) => {}
            Ok(()) = handover.changed() => {}
        }
    }

    /// Whether this replica may write right now: it holds a term and its deadline is ahead.
    pub fn is_leader(&self) -> bool {
        self.0.borrow().is_some_and(|l| Instant::now() < l.until)
    }

    /// The term this replica holds, also while its writes pause for a late renewal.
    pub fn in_term(&self) -> Option<u64> {
        self.0.borrow().map(|l| l.term)
    }

    /// The term and its deadline, as published.
    pub fn lead(&self) -> Option<Lead> {
        *self.0.borrow()
    }

    /// The channel behind the gate (the cloud client's fence reads it).
    pub fn receiver(&self) -> watch::Receiver<Option<Lead>> {
        self.0.clone()
    }

    /// Waits until this replica leads (checked at least every 100 ms).
    pub async fn wait(&mut self) {
        while !self.is_leader() {
            self.changed_or_tick().await;
        }
    }

    /// Waits for a change of the leadership record, at most 100 ms (also when the lease task
    /// is gone: then the value can no longer change but the deadline still passes).
    async fn changed_or_tick(&mut self) {
        changed_or_tick(&mut self.0).await;
    }

    /// Yields once each time this replica starts a term (and once at the start if it already
    /// holds one): controllers reconcile everything at that moment, so work that arrived while
    /// there was no leader is not left waiting for a resync or a backoff. A pause for a late
    /// renewal is not a new term: nobody else can have written in between (the renewal
    /// replaced this replica's own last version of the Lease).
    pub fn elected(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let gate = self.clone();
        // The term this replica was last seen holding.
        futures::stream::unfold((gate, None::<u64>), |(mut gate, mut last)| async move {
            loop {
                let term = gate.in_term();
                let new_term = term.is_some() && term != last;
                last = term;
                if new_term {
                    return Some(((), (gate, last)));
                }
                gate.changed_or_tick().await;
            }
        })
    }
}

/// What the cloud client's IP store needs to tell a new term: the term this replica holds (by
/// its number: a pause for a late renewal is not a new term), and while another replica holds the
/// Lease, when that one stopped writing (plus [`TAKEOVER_MARGIN`]).
impl baton_cloud::Leadership for LeaderGate {
    fn term(&self) -> Option<u64> {
        self.in_term()
    }

    fn holder_stopped(&self) -> Option<Instant> {
        self.handover().map(|h| h.holder_stopped + TAKEOVER_MARGIN)
    }
}

/// Waits for a change of `rx`, at most 100 ms (also when its sender is gone: then the value can
/// no longer change, but a deadline in it still passes).
async fn changed_or_tick(rx: &mut watch::Receiver<Option<Lead>>) {
    if let Ok(Err(_)) = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Shared state of the controller's reconcilers.
#[derive(Clone)]
pub struct Context {
    /// Kubernetes, reached through the local API server or every control-plane address — never
    /// through the FIP.
    pub client: kube::Client,
    /// The cloud (the Cherry Servers client, or the simulator through the same client).
    pub cloud: Arc<dyn Cloud>,
    /// The effective configuration.
    pub config: Arc<Config>,
    /// Publishes Kubernetes Events.
    pub recorder: Arc<Recorder>,
    /// The cluster's identity: the UID of namespace `kube-system` (the `cluster` FIP tag).
    pub cluster_id: String,
    /// Leadership.
    pub leader: LeaderGate,
    /// The process's metrics (served on the admin port).
    pub metrics: Arc<Metrics>,
    /// The heartbeats of the long-running loops (`/health`).
    pub heartbeats: super::health::Heartbeats,
    /// Which control-plane endpoint Services are acted on: allowed namespaces, this cluster's
    /// FIPs ([`super::trust`]); kept current as the bootstrap's record changes.
    pub endpoints: Policy,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("cluster_id", &self.cluster_id)
            .field("leader", &self.leader.is_leader())
            .finish_non_exhaustive()
    }
}

/// Errors building the context.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("reading namespace kube-system (for the cluster id): {0}")]
    ClusterId(#[source] kube::Error),
    #[error("namespace kube-system has no uid")]
    NoUid,
}

/// The endpoint policy ([`EndpointPolicy`]) as it is now: the settings, and the bootstrap's
/// record as last read (a controller may start before the bootstrap's handoff writes it).
#[derive(Clone, Debug)]
pub struct Policy(watch::Receiver<Arc<EndpointPolicy>>);

impl Policy {
    /// The policy now.
    pub fn current(&self) -> Arc<EndpointPolicy> {
        Arc::clone(&self.0.borrow())
    }
}

fn log_policy(p: &EndpointPolicy) {
    tracing::info!(
        namespaces = ?p.namespaces,
        adopted = ?p.adopted,
        "control-plane endpoints: accepted from these namespaces, with this cluster's FIPs"
    );
}

/// Follows the bootstrap's record (a watch on its name) into the policy, until every reader is
/// gone; `listed` fires after the first full list, so that the controller decides nothing before
/// it knows the record (or that there is none: a cluster baton did not bootstrap). A record
/// deleted later, or missing from a relist, changes nothing: what it named stays this
/// cluster's. A failed request is logged and retried (the watcher's backoff), as the cluster
/// id's read is: a refusal before the handoff's RBAC reaches the API server's cache passes.
async fn follow_bootstrap_record(
    client: kube::Client,
    config: Arc<Config>,
    cluster_id: String,
    tx: watch::Sender<Arc<EndpointPolicy>>,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    use futures::StreamExt as _;
    use kube::runtime::WatchStreamExt as _;
    use kube::runtime::watcher::{self, Event};
    let api = Api::<ConfigMap>::namespaced(client, "kube-system");
    let by_name = watcher::Config::default().fields(&format!("metadata.name={BOOTSTRAP_RECORD}"));
    let mut events = watcher::watcher(api, by_name).default_backoff().boxed();
    let mut listed = Some(listed);
    // The record a (re)list found, applied at its end.
    let mut found = None;
    loop {
        let ev = tokio::select! {
            () = tx.closed() => return,
            ev = events.next() => ev,
        };
        let record = match ev {
            None => return,
            Some(Ok(Event::Init)) => {
                found = None;
                continue;
            }
            Some(Ok(Event::InitApply(cm))) => {
                found = Some(cm.data.unwrap_or_default());
                continue;
            }
            Some(Ok(Event::InitDone)) => {
                if let Some(l) = listed.take() {
                    let _ = l.send(());
                }
                match found.take() {
                    Some(record) => record,
                    None => continue,
                }
            }
            Some(Ok(Event::Apply(cm))) => cm.data.unwrap_or_default(),
            Some(Ok(Event::Delete(_))) => continue,
            Some(Err(error)) => {
                tracing::warn!(%error, "cannot read the bootstrap's record kube-system/{BOOTSTRAP_RECORD} yet; retrying");
                continue;
            }
        };
        let policy = EndpointPolicy::new(&config, &cluster_id, &record);
        tx.send_if_modified(|cur| {
            let changed = **cur != policy;
            if changed {
                log_policy(&policy);
                *cur = Arc::new(policy);
            }
            changed
        });
    }
}

/// Retries of the cluster id read at start: 200 ms, doubling, at most 5 s, jittered.
const CLUSTER_ID_RETRY: super::kit::Backoff = super::kit::Backoff {
    base: Duration::from_millis(200),
    cap: Duration::from_secs(5),
    jitter: true,
};

/// The cluster's id, the UID of namespace `kube-system`. Every failure to read it is retried
/// (a warning each time, naming the error): a replica that starts while its API server is slow,
/// or before that server's RBAC cache has the binding the handoff just created, waits for it
/// instead of exiting and then waiting out the kubelet's crash back-off. Persistent refusals
/// stay visible, as the watches' do: the warnings, and `/ready` failing.
async fn read_cluster_id(client: &kube::Client) -> Result<String, ContextError> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let mut failures = 0u32;
    loop {
        match namespaces.get("kube-system").await {
            Ok(ns) => return ns.metadata.uid.ok_or(ContextError::NoUid),
            Err(e) => {
                failures = failures.saturating_add(1);
                let retry = CLUSTER_ID_RETRY.delay(failures);
                tracing::warn!(
                    error = %ContextError::ClusterId(e),
                    failures,
                    retry_in = ?retry,
                    "cannot read the cluster id yet"
                );
                tokio::time::sleep(retry).await;
            }
        }
    }
}

impl Context {
    /// Builds the context; reads the cluster id from `kube-system`, retrying until it is read
    /// ([`read_cluster_id`]: cancel the future to give up).
    pub async fn new(
        client: kube::Client,
        cloud: Arc<dyn Cloud>,
        config: Arc<Config>,
        leader: LeaderGate,
        metrics: Arc<Metrics>,
        reporter_instance: Option<String>,
    ) -> Result<Self, ContextError> {
        let cluster_id = read_cluster_id(&client).await?;
        // Until the record is listed: the settings alone (logged once the list shows more).
        let policy = EndpointPolicy::new(&config, &cluster_id, &BTreeMap::new());
        log_policy(&policy);
        let (tx, rx) = watch::channel(Arc::new(policy));
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        tokio::spawn(follow_bootstrap_record(
            client.clone(),
            Arc::clone(&config),
            cluster_id.clone(),
            tx,
            listed_tx,
        ));
        // Ends only by the task ending, which it does not before the list while `rx` lives.
        let _ = listed.await;
        let endpoints = Policy(rx);
        let reporter = Reporter {
            controller: "baton".into(),
            instance: reporter_instance,
        };
        Ok(Self {
            recorder: Arc::new(Recorder::new(client.clone(), reporter)),
            client,
            cloud,
            config,
            cluster_id,
            leader,
            metrics,
            heartbeats: super::health::Heartbeats::default(),
            endpoints,
        })
    }

    /// The context of a process that runs its controllers alone, with no election (always the
    /// leader), its own metrics and no reporter instance: `baton controller-services`.
    pub async fn unelected(
        client: kube::Client,
        cloud: Arc<dyn Cloud>,
        config: Arc<Config>,
    ) -> Result<Self, ContextError> {
        Self::new(client, cloud, config, LeaderGate::always(), Arc::default(), None).await
    }

    /// The same context reporting its loops' heartbeats to `heartbeats`.
    #[must_use]
    pub fn with_heartbeats(mut self, heartbeats: super::health::Heartbeats) -> Self {
        self.heartbeats = heartbeats;
        self
    }

    /// Publishes an Event on `obj`; failures are logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.event_related(obj, None, type_, reason, action, note).await;
    }

    /// Publishes an Event on `obj` that also names a `related` object. The recorder
    /// ([`crate::events`]) counts Events with the same object, reason, action and related object
    /// as one series and keeps the first one's note, so an Event whose note differs each time (a FIP moved to another
    /// node) names what differs as its related object.
    pub async fn event_related<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.event_on(&obj.object_ref(&()), related, type_, reason, action, note)
            .await;
    }

    /// Publishes an Event on the object `reference` names (one baton knows by name only, or of a
    /// kind without Rust type: a MetalLB object).
    pub async fn event_on(
        &self,
        reference: &ObjectReference,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: related,
        };
        if let Err(error) = self.recorder.publish(&ev, reference).await {
            tracing::warn!(%error, reason, "publishing an Event failed");
        }
    }
}

/// A reference to an object baton knows by kind and name only (for an Event on it, or as an
/// Event's related object). `namespace` is `None` for cluster-scoped kinds.
pub fn object_ref(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.to_owned()),
        kind: Some(kind.to_owned()),
        namespace: namespace.map(str::to_owned),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_late_renewal_pauses_writes_in_the_same_term_and_only_a_new_term_is_an_election() {
        use futures::StreamExt as _;
        let lease = Duration::from_secs(1);
        let lead = |term| {
            Some(Lead {
                term,
                until: Instant::now() + lease,
            })
        };
        let (tx, rx) = watch::channel(lead(1));
        let (_handover, handover_rx) = watch::channel(None);
        let gate = LeaderGate::new(rx, handover_rx);
        let mut elected = std::pin::pin!(gate.elected());
        assert_eq!(elected.next().await, Some(()), "leads at the start");
        // Renewed in time: the same term.
        tokio::time::advance(Duration::from_millis(500)).await;
        tx.send_replace(lead(1));
        let quiet = tokio::time::timeout(Duration::from_millis(300), elected.next()).await;
        assert!(quiet.is_err(), "a renewal in time is no election");
        // The deadline passes: writes pause, the term stays; the late renewal resumes it.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!gate.is_leader(), "no write past the deadline");
        assert_eq!(gate.in_term(), Some(1), "still the same term");
        tx.send_replace(lead(1));
        assert!(gate.is_leader());
        let quiet = tokio::time::timeout(Duration::from_millis(300), elected.next()).await;
        assert!(quiet.is_err(), "a late renewal is no election");
        // Lost, then acquired again: a new term, however short the gap.
        tx.send_replace(None);
        tx.send_replace(lead(2));
        let again = tokio::time::timeout(Duration::from_millis(150), elected.next()).await;
        assert_eq!(again, Ok(Some(())), "a new term is an election");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_the_other_holder_wakes_a_waiter_once_not_forever() {
        let (_until_tx, until_rx) = watch::channel(None);
        let (handover_tx, handover_rx) = watch::channel(None);
        let mut gate = LeaderGate::new(until_rx, handover_rx);
        let now = Instant::now();
        handover_tx.send_replace(Some(Handover {
            holder_stopped: now + Duration::from_millis(600),
            takeover: now + Duration::from_secs(1),
        }));
        // The change wakes the waiter at once…
        let woke = tokio::time::timeout(Duration::from_millis(10), gate.changed()).await;
        assert!(woke.is_ok(), "a change of the holder wakes the waiter");
        // …and once: with nothing new the next wait lasts until the 100 ms tick.
        let start = Instant::now();
        gate.changed().await;
        assert!(
            start.elapsed() >= Duration::from_millis(100),
            "woke after {:?} with nothing changed",
            start.elapsed()
        );
    }
}
