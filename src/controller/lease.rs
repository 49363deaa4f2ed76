//! Leader election on a `coordination.k8s.io` Lease, sized for sub-second takeover.
//!
//! ```text
//!  holder:    renew every `renew_interval` ──► "leader until attempt start + renew_deadline"
//!                                              published on a watch channel (LeaderGate, and the
//!                                              cloud client's write fence read it per request)
//!  followers: watch the Lease; every change is stamped with the follower's own clock
//!             ──► take over at (first sight of the current record) + duration, to the millisecond
//! ```
//!
//! **Why two replicas never act at once.** The holder's deadline is counted from the moment it
//! *started* its last successful renew, before the write reached the API server; a follower's
//! clock starts when it *saw* that write, which is later. The follower takes over `duration`
//! after that, the holder stops `renew_deadline` after its start, and `renew_deadline <
//! duration`: the holder has stopped before anyone may take over, whatever the network delays
//! (both measure intervals on their own monotonic clocks, so wall-clock skew does not matter).
//! A takeover is a `replace` under the resourceVersion of a fresh read, so two followers cannot
//! both win, and a follower whose watch is late only takes over later. The difference
//! `duration − renew_deadline` is the margin for a write that left just before the holder's
//! deadline to reach the cloud.
//!
//! `leaseDurationSeconds` is whole seconds; the exact duration travels in the annotation
//! `baton.dev/lease-duration-ms` (followers fall back to the seconds field). On shutdown the
//! holder releases the Lease so a follower takes over at once.
//!
//! **Hand-off** ([`super::succession`]). Followers that know their Node beat in the Lease's
//! `baton.dev/peers` annotation every few seconds. When the endpoint controller asks, the holder
//! ends its term, waits for its writes on their way (as a release does), and writes the chosen
//! follower as `holderIdentity` with a fresh `renewTime`; that follower, watching, sees itself
//! named and takes the Lease at once. A hand-off to a replica that died meanwhile costs one lease
//! duration without a leader, as a dead leader does.

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use baton_cloud::{InFlight, Lead};

use super::LeaderGate;
use super::context::Handover;
use super::health::{Heartbeat, LogThrottle};
use super::kit::Backoff;
use super::succession::{self, HandOff, PEER_BEAT, PeerEntry, Succession};

/// The annotation carrying the exact lease duration in milliseconds.
pub const DURATION_ANNOTATION: &str = "baton.dev/lease-duration-ms";

/// How long a graceful release keeps the Lease for writes already sent: the cloud client's
/// whole-request timeout (a write's answer comes by then, or never).
pub const RELEASE_WAIT: Duration = Duration::from_secs(15);

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// The Node it runs on (`spec.nodeName`): followers that know it offer themselves for a
    /// hand-off.
    pub node: Option<String>,
    /// How long a Lease stays valid without renewal (followers' takeover delay).
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_interval: Duration,
    /// The holder stops acting this long after the start of its last successful renew.
    pub renew_deadline: Duration,
}

/// Lease settings that cannot work.
#[derive(Debug, thiserror::Error)]
#[error(
    "lease timings must satisfy leaseRenewInterval ({interval:?}) < leaseRenewDeadline ({deadline:?}) < leaseDuration ({duration:?})"
)]
pub struct LeaseTimingError {
    interval: Duration,
    deadline: Duration,
    duration: Duration,
}

impl LeaseConfig {
    /// Defaults for `identity`: 1.7 s lease, renewed every 200 ms, 1.3 s renew deadline (the
    /// measured choice in docs/controller.md: an etcd stall of 1.5 s costs neither the Lease nor
    /// leaderless time, and a dead leader's node is replaced in under 2 s).
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            node: None,
            duration: Duration::from_millis(1700),
            renew_interval: Duration::from_millis(200),
            renew_deadline: Duration::from_millis(1300),
        }
    }

    /// Checks `renew_interval < renew_deadline < duration` (the safety argument needs it).
    pub fn validate(&self) -> Result<(), LeaseTimingError> {
        if self.renew_interval.is_zero()
            || self.renew_interval >= self.renew_deadline
            || self.renew_deadline >= self.duration
        {
            return Err(LeaseTimingError {
                interval: self.renew_interval,
                deadline: self.renew_deadline,
                duration: self.duration,
            });
        }
        Ok(())
    }

    /// How long one renew attempt may take before it is abandoned: two lease durations. The new
    /// deadline counts from the attempt's *start*, so a slow answer is never unsafe, and
    /// abandoning buys nothing against a slow API server (it applies the write anyway, and the
    /// next attempt meets a conflict and a re-read); it only helps against a hung one, whose
    /// client then tries the next API server.
    fn renew_timeout(&self) -> Duration {
        self.duration * 2
    }

    /// How long one acquisition attempt (a read and a write) may take: one lease duration.
    fn acquire_timeout(&self) -> Duration {
        self.duration
    }
}

/// Starts the election; returns the gate reflecting this replica's leadership and the task.
pub fn spawn(
    client: kube::Client,
    cfg: LeaseConfig,
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
) -> (LeaderGate, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let (handover_tx, handover_rx) = watch::channel(None);
    let succession = Succession::new(cfg.node.clone());
    let gate = LeaderGate::new(rx, handover_rx)
        .with_lease(cfg.duration, cfg.renew_deadline)
        .with_succession(succession.clone());
    let in_flight = gate.in_flight().clone();
    let task = tokio::spawn(run(
        client,
        cfg,
        (tx, in_flight),
        (handover_tx, succession),
        heartbeat,
        shutdown,
    ));
    (gate, task)
}

/// The part of the Lease record whose change proves its holder alive.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    holder: Option<String>,
    renew: Option<MicroTime>,
    duration: Option<Duration>,
}

impl Record {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        let exact = lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DURATION_ANNOTATION))
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis);
        let seconds = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs);
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew: spec.and_then(|s| s.renew_time.clone()),
            duration: exact.or(seconds),
        }
    }
}

/// A record and when this replica first saw it (its own clock).
#[derive(Debug, Clone)]
struct Observed {
    record: Record,
    at: Instant,
}

/// Remembers `record` unless it is the one already seen; returns whether it was new.
fn observe(seen: &mut Option<Observed>, record: Record) -> bool {
    if seen.as_ref().is_some_and(|o| o.record == record) {
        return false;
    }
    *seen = Some(Observed {
        record,
        at: Instant::now(),
    });
    true
}

async fn run(
    client: kube::Client,
    cfg: LeaseConfig,
    (tx, in_flight): (watch::Sender<Option<Lead>>, InFlight),
    (handover, succession): (watch::Sender<Option<Handover>>, Succession),
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    // Every change of the Lease, stamped on arrival: the takeover clock of a follower.
    let (seen_tx, mut seen_rx) = watch::channel::<Option<Observed>>(None);
    let (latest_tx, latest) = watch::channel::<Option<Lease>>(None);
    let watch_task = tokio::spawn(watch_lease(
        api.clone(),
        (cfg.name.clone(), cfg.identity.clone()),
        (seen_tx.clone(), latest_tx),
        succession.clone(),
    ));
    let mut requests = succession.requests();
    let mut election = Election {
        api: &api,
        cfg: &cfg,
        tx: &tx,
        seen: &seen_tx,
        succession: &succession,
        mine: None,
        term: 0,
        failures: 0,
        throttle: LogThrottle::new(Duration::from_secs(10)),
    };
    let mut next = Instant::now();
    // A failed attempt is not retried at once (an API server that refuses must not be hammered):
    // a follower backs off from renew_interval / 2, doubling, up to 2 s.
    let mut last_io: Option<Instant> = None;
    // A follower that knows its Node beats in the Lease (the first beat soon after the start).
    let mut beat_at = Instant::now() + cfg.renew_interval;
    loop {
        // Every pass starts here, at least every renew interval (or the follower's backoff of at
        // most 2 s): its age on `/health` is one pass, bounded by the attempt's time limit.
        heartbeat.beat();
        // A follower also wakes exactly when the record it saw expires.
        let (foreign, named) = {
            let seen = seen_rx.borrow_and_update();
            let holder = seen.as_ref().and_then(|o| o.record.holder.as_deref());
            let foreign = seen.as_ref().and_then(|o| {
                holder.is_some_and(|h| h != cfg.identity).then(|| Handover {
                    holder_stopped: o.at + cfg.renew_deadline,
                    takeover: o.at + o.record.duration.unwrap_or(cfg.duration),
                })
            });
            // Handed the Lease by its holder: take it at once.
            (
                foreign,
                holder == Some(cfg.identity.as_str()) && election.mine.is_none(),
            )
        };
        handover.send_if_modified(|v| {
            let changed = *v != foreign;
            *v = foreign;
            changed
        });
        let expiry = foreign.map(|h| h.takeover);
        let mut wake = expiry.map_or(next, |e| e.min(next));
        let beating = election.mine.is_none() && cfg.node.is_some();
        if beating {
            wake = wake.min(beat_at);
        }
        if let Some(t) = last_io {
            wake = wake.max(t + election.retry_gap());
        }
        if named && election.failures == 0 {
            wake = Instant::now();
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {}
            _ = seen_rx.changed() => continue,
            Ok(()) = requests.changed() => {
                let request = requests.borrow_and_update().clone();
                if let Some(request) = request {
                    election.hand_off(&request, &in_flight).await;
                    last_io = Some(Instant::now());
                }
                continue;
            }
        }
        if beating && Instant::now() >= beat_at {
            let written = election.beat(&latest).await;
            // A conflict (the holder renewed meanwhile) is tried again soon, on the newer version.
            beat_at = Instant::now() + if written { PEER_BEAT } else { cfg.renew_interval };
        }
        if Instant::now() >= next {
            next = Instant::now() + cfg.renew_interval;
        }
        if election.round().await {
            last_io = Some(Instant::now());
        }
    }
    watch_task.abort();
    election.release(&in_flight).await;
}

/// Feeds every version of the Lease into `seen` (its record) and `latest` (the object), and its
/// followers' entries into the roster.
async fn watch_lease(
    api: Api<Lease>,
    (name, identity): (String, String),
    (seen, latest): (watch::Sender<Option<Observed>>, watch::Sender<Option<Lease>>),
    succession: Succession,
) {
    let stream = watcher(
        api,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .backoff(super::watches::WatchBackoff::default())
    .touched_objects();
    let mut stream = std::pin::pin!(stream);
    let errors = super::watches::StreamErrors::new(format!("leader Lease {name}"));
    while let Some(item) = stream.next().await {
        match item {
            Ok(lease) => {
                let record = Record::of(&lease);
                {
                    let mut roster = succession.lock();
                    roster.observe(succession::entries(&lease), &identity, Instant::now());
                    roster.holder_wrote(record.holder.as_deref(), record.renew.as_ref());
                }
                seen.send_if_modified(|s| observe(s, record));
                latest.send_replace(Some(lease));
            }
            Err(error) => errors.warn(&error),
        }
    }
}

struct Election<'a> {
    api: &'a Api<Lease>,
    cfg: &'a LeaseConfig,
    tx: &'a watch::Sender<Option<Lead>>,
    seen: &'a watch::Sender<Option<Observed>>,
    succession: &'a Succession,
    /// The Lease as this replica last wrote it while holding it.
    mine: Option<Lease>,
    /// The number of this replica's current (or last) term.
    term: u64,
    /// Failed attempts in a row, and how loudly they are logged.
    failures: u32,
    throttle: LogThrottle,
}

impl Election<'_> {
    /// The least time between two attempts after the last one.
    fn retry_gap(&self) -> Duration {
        let first = self.cfg.renew_interval / 2;
        if self.failures == 0 || self.mine.is_some() {
            return first;
        }
        Backoff {
            base: first,
            cap: Duration::from_secs(2),
            jitter: false,
        }
        .delay(self.failures.saturating_add(1))
    }

    fn leading(&self) -> bool {
        self.tx.borrow().is_some_and(|l| Instant::now() < l.until)
    }

    /// Ends the current term (lost, expired or released): queued writes of it are dropped.
    fn end_term(&mut self, why: &str) {
        self.mine = None;
        let identity = &self.cfg.identity;
        self.tx.send_if_modified(|v| {
            let changed = v.is_some();
            if changed {
                tracing::warn!(%identity, why, "lost the lease");
            }
            *v = None;
            changed
        });
    }

    /// One round: renew (holder), or take over an expired or free Lease (follower). Returns
    /// whether it talked to the API server.
    ///
    /// A renew in flight is not abandoned while the lease may still be saved
    /// ([`LeaseConfig::renew_timeout`]): a slow API server answers late but answers, and the
    /// renew's start, not its answer, dates the new deadline. Past the renew deadline writes
    /// pause. The term goes on until a renew finds the Lease written by someone else: a renew
    /// that succeeds replaced this replica's own last version, so nobody else held the Lease in
    /// between (an abandoned renew that landed anyway is found by the conflict and its re-read).
    async fn round(&mut self) -> bool {
        let attempt = Instant::now();
        let (timeout, outcome) = if self.mine.is_some() {
            let timeout = self.cfg.renew_timeout();
            (timeout, tokio::time::timeout(timeout, self.renew()).await)
        } else {
            if !self.expired() {
                return false;
            }
            let timeout = self.cfg.acquire_timeout();
            (timeout, tokio::time::timeout(timeout, self.try_acquire()).await)
        };
        match outcome {
            Ok(Ok(true)) => {
                self.failures = 0;
                let until = attempt + self.cfg.renew_deadline;
                let identity = &self.cfg.identity;
                let held = *self.tx.borrow();
                let term = if let Some(lead) = held {
                    if lead.until <= attempt {
                        tracing::info!(%identity, late_ms = attempt.saturating_duration_since(lead.until).as_millis(), "renewed late: writes resume in the same term");
                    }
                    lead.term
                } else {
                    self.term += 1;
                    tracing::info!(%identity, term = self.term, "became leader");
                    self.term
                };
                self.tx.send_replace(Some(Lead { term, until }));
            }
            Ok(Ok(false)) => {
                self.failures = 0;
                self.end_term("another replica holds it");
            }
            Ok(Err(error)) => {
                self.failures = self.failures.saturating_add(1);
                if let Some(repeats) = self.throttle.allow() {
                    tracing::warn!(%error, lease = %self.cfg.name, leading = self.leading(), repeats, "lease update failed");
                }
            }
            Err(_) => {
                self.failures = self.failures.saturating_add(1);
                if let Some(repeats) = self.throttle.allow() {
                    tracing::warn!(lease = %self.cfg.name, leading = self.leading(), timeout_ms = timeout.as_millis(), repeats, "lease update timed out");
                }
            }
        }
        true
    }

    /// Whether a follower may try to take over: the Lease is free, or the record it saw has not
    /// changed for its duration.
    fn expired(&self) -> bool {
        match self.seen.borrow().as_ref() {
            // Not seen yet: read it (creating it if missing).
            None => true,
            Some(o) if o.record.holder.is_none() => true,
            Some(o) if o.record.holder.as_deref() == Some(self.cfg.identity.as_str()) => true,
            Some(o) => o.at.elapsed() >= o.record.duration.unwrap_or(self.cfg.duration),
        }
    }

    fn stamp(&self, lease: &mut Lease, acquire: bool) {
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                DURATION_ANNOTATION.to_owned(),
                self.cfg.duration.as_millis().to_string(),
            );
        // The holder keeps the followers' entries tidy: its own and the long-silent ones go.
        let peers = succession::entries(lease);
        let kept: std::collections::BTreeMap<_, _> = {
            let roster = self.succession.lock();
            let now = Instant::now();
            peers
                .iter()
                .filter(|(id, _)| **id != self.cfg.identity && !roster.forgotten(id, now))
                .map(|(id, e)| (id.clone(), e.clone()))
                .collect()
        };
        if kept != peers {
            succession::set_entries(lease, &kept);
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.lease_duration_seconds = Some(whole_secs(self.cfg.duration));
        spec.renew_time = Some(now());
        if acquire {
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
    }

    /// Renews from the last written version (no read first); a conflict re-reads.
    async fn renew(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.mine.clone() else {
            return Ok(false);
        };
        self.stamp(&mut lease, false);
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                self.mine = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Someone else wrote (or an earlier, timed-out renew of ours did): look.
                let current = self.api.get_opt(&self.cfg.name).await?;
                match current {
                    Some(lease)
                        if Record::of(&lease).holder.as_deref() == Some(self.cfg.identity.as_str()) =>
                    {
                        self.mine = Some(lease);
                        Box::pin(self.renew()).await
                    }
                    Some(lease) => {
                        self.seen.send_if_modified(|s| observe(s, Record::of(&lease)));
                        Ok(false)
                    }
                    None => Ok(false),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the Lease afresh and takes it if it is free, ours, or unchanged since this replica
    /// first saw that record `duration` ago.
    async fn try_acquire(&mut self) -> Result<bool, kube::Error> {
        let pp = PostParams::default();
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            self.stamp(&mut lease, true);
            return match self.api.create(&pp, &lease).await {
                Ok(written) => {
                    self.mine = Some(written);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let record = Record::of(&lease);
        let ours = record.holder.as_deref() == Some(self.cfg.identity.as_str());
        if record.holder.is_some() && !ours {
            // The fresh read may show a newer record than the watch did: then the clock restarts.
            self.seen.send_if_modified(|s| observe(s, record.clone()));
            if !self.expired() {
                return Ok(false);
            }
        }
        self.stamp(&mut lease, !ours);
        match self.api.replace(&self.cfg.name, &pp, &lease).await {
            Ok(written) => {
                self.mine = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A follower's beat: its entry in the Lease's peers, written on the latest version seen.
    /// Returns whether it was written (a conflict means the holder renewed in between).
    async fn beat(&self, latest: &watch::Receiver<Option<Lease>>) -> bool {
        let (Some(node), Some(mut lease)) = (self.cfg.node.as_ref(), latest.borrow().clone()) else {
            return false;
        };
        if Record::of(&lease).holder.as_deref() == Some(self.cfg.identity.as_str()) {
            // Named holder (a hand-off): the round takes it; no beat.
            return true;
        }
        let mut peers = succession::entries(&lease);
        let beat = u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
        peers.insert(
            self.cfg.identity.clone(),
            PeerEntry {
                node: node.clone(),
                beat,
            },
        );
        succession::set_entries(&mut lease, &peers);
        let pp = PostParams::default();
        let write = self.api.replace(&self.cfg.name, &pp, &lease);
        match tokio::time::timeout(self.cfg.acquire_timeout(), write).await {
            Ok(Ok(_)) => true,
            Ok(Err(error)) => {
                tracing::debug!(%error, "writing this replica's beat into the Lease failed");
                false
            }
            Err(_) => false,
        }
    }

    /// Hands the Lease to `request.to`, if this replica still holds `request.term`: ends the
    /// term (nothing more is sent, queued writes are dropped), waits for the writes on their way
    /// as a release does, then writes the follower as the holder with a fresh renew time. On
    /// any failure the term is over anyway: the Lease, still naming this replica, is taken
    /// again by its next round (or by anyone once it lapses).
    async fn hand_off(&mut self, request: &HandOff, in_flight: &InFlight) {
        let held = *self.tx.borrow();
        if held.is_none_or(|l| l.term != request.term) || self.mine.is_none() {
            return;
        }
        let cfg = self.cfg;
        let (identity, to) = (&cfg.identity, &request.to);
        tracing::info!(%identity, to = %to.identity, node = %to.node, term = request.term, "handing the lease over");
        self.tx.send_replace(None);
        let started = Instant::now();
        self.wait_for_writes(in_flight).await;
        for _ in 0..3 {
            let Some(mut lease) = self.mine.take() else {
                return;
            };
            let renew = now();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(to.identity.clone());
            spec.renew_time = Some(renew.clone());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            let pp = PostParams::default();
            let write = self.api.replace(&cfg.name, &pp, &lease);
            match tokio::time::timeout(cfg.acquire_timeout(), write).await {
                Ok(Ok(_)) => {
                    self.succession.lock().handed(to.identity.clone(), Some(renew));
                    tracing::info!(%identity, to = %to.identity, node = %to.node, took_ms = started.elapsed().as_millis(), "handed the lease over");
                    return;
                }
                // A follower's beat landed in between: look again.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => match self.api.get_opt(&cfg.name).await {
                    Ok(Some(fresh)) if Record::of(&fresh).holder.as_deref() == Some(identity.as_str()) => {
                        self.mine = Some(fresh);
                    }
                    _ => return,
                },
                Ok(Err(error)) => {
                    tracing::warn!(%error, to = %to.identity, "handing the lease over failed");
                    return;
                }
                Err(_) => {
                    tracing::warn!(to = %to.identity, "handing the lease over timed out");
                    return;
                }
            }
        }
    }

    /// Keeps renewing while writes already sent are on their way (at most [`RELEASE_WAIT`]),
    /// so no follower acts before their answers are in. The term has ended already.
    async fn wait_for_writes(&mut self, in_flight: &InFlight) {
        let waiting = in_flight.count();
        if waiting == 0 {
            return;
        }
        let started = Instant::now();
        let mut settled = false;
        while self.mine.is_some() && started.elapsed() < RELEASE_WAIT {
            if in_flight.settled(self.cfg.renew_interval).await {
                settled = true;
                break;
            }
            if let Ok(Ok(false)) = tokio::time::timeout(self.cfg.renew_timeout(), self.renew()).await {
                break;
            }
        }
        tracing::info!(identity = %self.cfg.identity, waiting, settled, waited_ms = started.elapsed().as_millis(), "waited for writes on their way before giving up the lease");
    }

    /// Graceful stop: ends the term (nothing more is sent, queued writes are dropped), waits for
    /// the writes on their way ([`Self::wait_for_writes`]), then frees the Lease so a follower
    /// takes over at once.
    async fn release(&mut self, in_flight: &InFlight) {
        if self.tx.borrow().is_none() {
            return;
        }
        self.tx.send_replace(None);
        self.wait_for_writes(in_flight).await;
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        if self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
            .is_ok()
        {
            tracing::info!(identity = %self.cfg.identity, "released the lease");
        }
    }
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// Whole seconds for `leaseDurationSeconds`, rounded up (at least 1).
fn whole_secs(d: Duration) -> i32 {
    let ms = d.as_millis().max(1);
    i32::try_from(ms.div_ceil(1000)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe_and_invalid_timings_are_refused() {
        let cfg = LeaseConfig::new("kube-system", "baton-controller", "a");
        cfg.validate().unwrap();
        assert!(cfg.renew_deadline < cfg.duration);
        let mut bad = cfg.clone();
        bad.renew_deadline = bad.duration;
        assert!(
            bad.validate().is_err(),
            "a holder acting as long as a follower waits is unsafe"
        );
        let mut bad = cfg;
        bad.renew_interval = bad.renew_deadline;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn the_exact_duration_wins_over_whole_seconds() {
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: Some([(DURATION_ANNOTATION.to_owned(), "1200".to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("a".into()),
                lease_duration_seconds: Some(2),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(Record::of(&lease).duration, Some(Duration::from_millis(1200)));
        assert_eq!(whole_secs(Duration::from_millis(1200)), 2);
        assert_eq!(whole_secs(Duration::from_secs(1)), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_seen_again_keeps_its_first_sighting() {
        let record = Record {
            holder: Some("a".into()),
            renew: None,
            duration: None,
        };
        let mut seen = None;
        assert!(observe(&mut seen, record.clone()));
        let first = seen.as_ref().unwrap().at;
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            !observe(&mut seen, record.clone()),
            "the same record does not restart the clock"
        );
        assert_eq!(seen.as_ref().unwrap().at, first);
        let renewed = Record {
            renew: Some(now()),
            ..record
        };
        assert!(observe(&mut seen, renewed));
        assert_eq!(seen.as_ref().unwrap().at, first + Duration::from_millis(500));
    }
}
