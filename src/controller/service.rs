//! Service Floating IPs: a FIP for every Service of type LoadBalancer, tagged and published the
//! way cloud-provider-cherry does it.
//!
//! ```text
//!  watch Services ──► reconcile(svc) ── scope()? ──► ignored: release a FIP baton made, drop finalizer
//!                          │ managed
//!                          ▼
//!                 kube::runtime::finalizer("baton.dev/service-fip")
//!                   Apply:   FIP by tags: ctx.cloud.ips_tagged() (the shared IP store's index)
//!                            └─ decide(): Publish | Create (POST, tag-idempotent) | ByoIp | ReleaseForByoIp
//!                               (an address asked for: admit() first, trust::address — this
//!                                cluster's, its namespace allowed — else refuse(): Warning Event)
//!                            annotations: <implementation IP annotation>, baton.dev/fip-id, baton.dev/fip-address
//!                            status.loadBalancer.ingress[0].ip  (server-side apply, manager "baton")
//!                   Cleanup: every FIP carrying the Service's three tags is held (grace), then the finalizer goes
//!  release_held: a held FIP whose grace period is over and that is still unwanted ──► DELETE
//! ```
//!
//! Nothing irreversible on one signal ([`grace`]): a FIP no longer wanted (its Service deleted,
//! no longer a managed LoadBalancer, asking for another address, or gone without a cleanup) is
//! held for `fipReleaseGracePeriod` (default 10 minutes; the Service's
//! `baton.dev/fip-release-grace-period` wins, `0` releases at once) and released only if it is
//! still unwanted then: a Service deleted and re-created meanwhile finds it by its tags and keeps
//! its address. An IP annotation baton cannot parse is a Warning Event; the FIP stays.
//!
//! Crash safety: the finalizer is in place before any FIP is reserved; a FIP is found again by
//! its three tags (`usage`, `service`, `cluster`) whatever baton recorded, so a kill between the
//! create and the record, or a lost record, neither leaks nor duplicates (the Kuryr seed's
//! "rediscover, else recreate"). Kubernetes can delete a Service whose finalizer was added
//! concurrently with the delete (kubernetes/kubernetes#77988, found by the crash test): a publish
//! that finds the Service gone releases the FIP at once, and a sweep every [`RESYNC`] (the first
//! one [`SWEEP_QUIET`] into a term) releases FIPs of this cluster whose Service is gone
//! ([`orphans`]), each checked again right before its delete ([`sweep_decision`]). Only FIPs carrying all three tags, never targeted to a server and
//! never carrying the control-plane FIP tag, are ever deleted. Control-plane endpoints
//! (`baton.dev/control-plane-endpoint: "true"`, the mirror Service) and Services asking for a
//! control-plane FIP's address are never touched. A Service asking for an address gets it only
//! when [`super::trust::address`] admits it ([`admit`]: a FIP of this cluster, its namespace
//! allowed); anything else is refused ([`refuse`]: a Warning Event, no ingress, no annotation, no
//! cloud write; a Service with its own FIP keeps it). A Service asking for a FIP the cloud routes
//! to a server (bring-your-own routed FIP, [`FipRoles`]) gets its ingress like any admitted
//! bring-your-own address, and an Event saying it is not handed to the load balancer.
//!
//! Economy: reads come from the client's shared IP store (writes are applied to it, lookups use
//! its tag index), so a created Service costs one cloud write (the `POST`), no read of its own
//! and no pass over the list; a steady-state resync every [`RESYNC`] reads the store only.

pub mod admission;
pub mod budget;
pub mod grace;
mod plan;

pub use grace::GRACE_ANNOTATION;
pub use plan::*;

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_cloud::CloudError;
use baton_cloud::model::{CreateIpRequest, IpAddress, IpId, IpType, Tags};
use baton_cloud::tags::{
    CLUSTER_KEY, SERVICE_KEY, USAGE_KEY, USAGE_VALUE, matches_all, service_fip_tags_on, service_tag_on,
};
use baton_core::LoadBalancerMode;
use baton_core::duration::format_duration;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};

use kube::{Api, ResourceExt as _};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use self::admission::Judge;
use super::health::Heartbeat;
use super::kit::{self, KubeCallError, NotLeader, Queue, ReconcileError, Retries, Skipped};
use super::trust::address::{AddressPolicy, AddressRefusal};
use super::watches::{Cache, StreamErrors, Subset, Trigger, Watches};
use super::{Context, FIELD_MANAGER, mirror};

/// How often a settled Service is looked at again (reads the cached IP list only).
pub const RESYNC: Duration = Duration::from_secs(600);
/// Reconciles running at once. Cloud calls queue in the client's shared rate limiter anyway;
/// this bounds the load on the API server.
pub const CONCURRENCY: u16 = 64;
const REJECTED_RETRY: Duration = Duration::from_secs(300);
/// How often a Service refused by the BGP prefix budget is looked at again.
const BUDGET_RETRY: Duration = Duration::from_secs(30);

/// Errors of the Service FIP controller. Each names the Service and the failed step.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// An IP annotation (or `spec.loadBalancerIP`) cannot be used.
    #[error("Service {svc}: {source}")]
    InvalidField {
        svc: String,
        #[source]
        source: InvalidField,
    },
    /// No usable region for a new FIP.
    #[error("Service {svc}: {source}")]
    Region {
        svc: String,
        #[source]
        source: RegionError,
    },
    /// The cloud refused to reserve the FIP (400/422: an unknown region, or none left there).
    #[error("Service {svc}: the cloud refused a Floating IP in region {region:?} (from {from}): {source}")]
    CreateRejected {
        svc: String,
        region: String,
        from: RegionSource,
        #[source]
        source: Box<CloudError>,
    },
    /// A cloud call failed.
    #[error("Service {svc}: {step}: {source}")]
    Cloud {
        svc: String,
        step: &'static str,
        #[source]
        source: Box<CloudError>,
    },
    /// A Kubernetes call failed or timed out.
    #[error("Service {svc}: {source}")]
    Kube {
        svc: String,
        #[source]
        source: KubeCallError,
    },
    /// This replica does not lead; the write waits.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The finalizer helper failed (adding/removing the finalizer, or Apply/Cleanup).
    #[error(transparent)]
    Finalizer(#[from] Box<finalizer::Error<Self>>),
}

impl ServiceError {
    fn kube(facts: &ServiceFacts, source: KubeCallError) -> Self {
        Self::Kube {
            svc: facts.key(),
            source,
        }
    }
}

impl ReconcileError for ServiceError {
    /// A stable category: the failure metric label and the Event reason's source.
    fn category(&self) -> &'static str {
        match self {
            Self::InvalidField { .. } => "invalid_annotation",
            Self::Region { .. } => "no_region",
            Self::CreateRejected { .. } => "create_rejected",
            Self::Cloud { source, .. } => source.category(),
            Self::Kube { source, .. } => source.category(),
            Self::NotLeader(_) => "not_leader",
            Self::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.category(),
                _ => "finalizer",
            },
        }
    }

    /// Also a cloud write the fence stopped: the term ended before it could be sent, and the
    /// next term reconciles the Service (no backoff for it).
    fn is_not_leader(&self) -> bool {
        match self {
            Self::NotLeader(_) => true,
            Self::Cloud { source, .. } => source.is_fenced(),
            Self::Finalizer(e) => matches!(
                &**e,
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) if e.is_not_leader()
            ),
            _ => false,
        }
    }

    /// Whether only a change of the Service (or the configuration) can fix it: no retry.
    fn is_invalid_spec(&self) -> bool {
        match self {
            Self::InvalidField { .. } | Self::Region { .. } => true,
            Self::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.is_invalid_spec(),
                _ => false,
            },
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Cloud { source, .. } => source.retry_after(),
            // A typo in the region will not fix itself, but "no address left" may: try again
            // now and then (one request per Service per interval).
            Self::CreateRejected { .. } => Some(REJECTED_RETRY),
            Self::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.retry_after(),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The Service controller's context: the shared [`Context`], its retries, and every Service.
pub struct ServiceContext {
    /// What every reconciler shares.
    pub base: Arc<Context>,
    retries: Retries,
    /// Services waiting for a reconcile (`baton_queue_depth`).
    queue: Queue,
    mirror: (String, String),
    /// Every Service (the shared watch), for the BGP prefix budget and the orphan sweep.
    store: Cache<Service>,
    /// The Services that may be control-plane endpoints ([`may_be_control_plane`]).
    control_plane: Subset<Service>,
    /// Services whose reconcile was skipped while this replica did not lead.
    skipped: Arc<Skipped<Service>>,
    /// FIPs no longer wanted, kept for their grace period ([`grace`]).
    holds: std::sync::Mutex<grace::Holds>,
    /// Wakes the release loop when a hold starts.
    held: tokio::sync::Notify,
    /// Each reconcile, sweep and release pass is a unit of work of loop `services` (`/health`).
    heartbeat: Heartbeat,
    /// Services this replica wrote, and the versions its writes made old.
    ahead: std::sync::Mutex<OwnWrites>,
    /// Which addresses a Service may ask for ([`super::trust::address`]).
    policy: AddressPolicy,
    /// Every Namespace, for their labels (only with `serviceAllocationNamespaceSelector`).
    namespaces: Option<Cache<Namespace>>,
    /// Addresses refused on the shared list and read fresh, and when ([`admit`]).
    rechecked: std::sync::Mutex<HashMap<IpAddr, Instant>>,
}

/// How long a reconcile waits for the shared watch to show baton's own last write of a Service.
const AHEAD_WAIT: Duration = Duration::from_secs(10);

/// What baton last wrote to each Service: every `resourceVersion` its writes superseded (the
/// version it read, and each it wrote before the last), and when. A reconcile that reads one of
/// them reads a watch that has not caught up with baton's own writes yet: it would write again
/// what it has just written (the status after the annotations, as both answer separate watch
/// events). It waits for the watch instead (the write's own event wakes it), at most
/// [`AHEAD_WAIT`].
#[derive(Debug, Default)]
struct OwnWrites(HashMap<String, Ahead>);

#[derive(Debug)]
struct Ahead {
    superseded: Vec<String>,
    latest: String,
    at: Instant,
}

impl OwnWrites {
    /// A write of Service `key`, read at version `read`, made version `written`.
    fn wrote(&mut self, key: String, read: &str, written: &str, now: Instant) {
        if self.0.len() >= 4096 {
            self.0
                .retain(|_, a| now.saturating_duration_since(a.at) < AHEAD_WAIT);
        }
        let entry = self.0.entry(key).or_insert_with(|| Ahead {
            superseded: Vec::new(),
            latest: String::new(),
            at: now,
        });
        let before = std::mem::replace(&mut entry.latest, written.to_owned());
        for old in [before.as_str(), read] {
            if !old.is_empty() && old != written && !entry.superseded.iter().any(|v| v == old) {
                entry.superseded.push(old.to_owned());
            }
        }
        entry.at = now;
    }

    /// Whether Service `key` read at version `read` is older than baton's own last write of it;
    /// forgets the record once it is not.
    fn behind(&mut self, key: &str, read: &str, now: Instant) -> bool {
        let Some(a) = self.0.get(key) else { return false };
        if now.saturating_duration_since(a.at) < AHEAD_WAIT && a.superseded.iter().any(|v| v == read) {
            return true;
        }
        self.0.remove(key);
        false
    }
}

impl std::fmt::Debug for ServiceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceContext")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ServiceContext {
    /// Wraps the shared context.
    pub fn new(
        base: Arc<Context>,
        store: Cache<Service>,
        control_plane: Subset<Service>,
        namespaces: Option<Cache<Namespace>>,
    ) -> Self {
        let policy = AddressPolicy::new(&base.config, &base.cluster_id);
        let mirror = (
            "kube-system".to_owned(),
            mirror::service_name(&base.config.prefix),
        );
        Self {
            queue: Queue::new("services", Arc::clone(&base.metrics)),
            heartbeat: base.heartbeats.workers("services"),
            base,
            retries: Retries::new("services"),
            mirror,
            skipped: Arc::new(Skipped::new(store.store())),
            store,
            control_plane,
            holds: std::sync::Mutex::new(grace::Holds::default()),
            held: tokio::sync::Notify::new(),
            ahead: std::sync::Mutex::new(OwnWrites::default()),
            policy,
            namespaces,
            rechecked: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, grace::Holds> {
        self.holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The grace period of `svc`'s FIP: its annotation, else the setting. An annotation that is
    /// not a duration gets a Warning Event, and the setting applies.
    async fn grace_of(&self, svc: &Service, facts: &ServiceFacts) -> Duration {
        let default = self.base.config.fip_release_grace_period;
        match grace::grace_for(&facts.annotations, default) {
            Ok(grace) => grace,
            Err(source) => {
                let err = ServiceError::InvalidField {
                    svc: facts.key(),
                    source,
                };
                warn!(error = %err, "invalid grace period annotation");
                if !facts.deleting {
                    warn_event(self, svc, "InvalidAnnotation", &err).await;
                }
                default
            }
        }
    }

    fn mode(&self) -> Option<&LoadBalancerMode> {
        self.base.config.load_balancer.as_ref()
    }

    /// The cloud baton drives.
    fn cloud(&self) -> baton_cloud::CloudKind {
        self.base.config.cloud
    }

    /// What the planner reads off `svc`, on this cloud (on Hetzner only a Service of baton's class
    /// is baton's).
    fn facts(&self, svc: &Service) -> ServiceFacts {
        let mut facts = facts_of(svc);
        facts.needs_class = self.cloud() == baton_cloud::CloudKind::Hetzner;
        facts
    }

    /// Whether `ip` is routed to a server by someone other than baton. On Cherry Servers baton's
    /// Service FIPs are announced by BGP, never routed: a routed one was routed by an operator and
    /// is not baton's to release. On Hetzner Cloud baton routes its own Service FIPs to a node
    /// (their tags say whose they are), so being routed says nothing.
    fn routed_by_operator(&self, ip: &IpAddress) -> bool {
        self.cloud() == baton_cloud::CloudKind::Cherry && ip.target().is_some()
    }

    fn mirror(&self) -> (&str, &str) {
        (self.mirror.0.as_str(), self.mirror.1.as_str())
    }

    /// Records a write of `facts`' Service that made version `written` ([`OwnWrites`]).
    fn wrote(&self, facts: &ServiceFacts, written: Option<&str>) {
        if let Some(written) = written {
            self.ahead
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .wrote(facts.key(), &facts.resource_version, written, Instant::now());
        }
    }

    /// Whether the watch still shows a version of `svc` older than baton's own last write of it
    /// ([`OwnWrites`]).
    fn behind(&self, svc: &Service) -> bool {
        self.ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .behind(
                &key_of(svc),
                svc.metadata.resource_version.as_deref().unwrap_or_default(),
                Instant::now(),
            )
    }

    /// Every namespace's labels, when a namespace selector needs them (`None` otherwise). Waits
    /// for the watch's first list: no Service is judged on a partial one.
    async fn namespace_labels(&self) -> Option<BTreeMap<String, BTreeMap<String, String>>> {
        let cache = self.namespaces.as_ref()?;
        if cache.wait_until_ready().await.is_err() {
            return None;
        }
        Some(
            cache
                .state()
                .iter()
                .map(|ns| (ns.name_any(), ns.labels().clone()))
                .collect(),
        )
    }

    /// Whether `ip` may be read fresh now ([`RECHECK_EVERY`]); records that it is.
    fn recheck(&self, ip: IpAddr) -> bool {
        let now = Instant::now();
        let mut rechecked = self
            .rechecked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rechecked.retain(|_, at| now.saturating_duration_since(*at) < RECHECK_EVERY);
        if rechecked.contains_key(&ip) {
            return false;
        }
        rechecked.insert(ip, now);
        true
    }

    /// Whether the BGP prefix budget ([`budget`]) refuses the Service its hand-off to the load
    /// balancer. Waits for the watch's first full list, so that no Service is judged on a
    /// partial one.
    async fn refused_by_budget(&self, facts: &ServiceFacts) -> bool {
        let limit = self.base.config.bgp_prefix_limit;
        if limit.is_none() || self.mode().is_none() || self.store.wait_until_ready().await.is_err() {
            return false;
        }
        let all: Vec<ServiceFacts> = self.store.state().iter().map(|s| self.facts(s)).collect();
        // The shared, cached IP list; unreadable, every Service counts (the hand-off then waits
        // for the cloud anyway).
        let (never_announced, refused) = match (self.base.cloud.ips().await, self.mode()) {
            (Ok(ips), Some(mode)) => {
                let labels = self.namespace_labels().await;
                let judge = Judge::new(&self.policy, &ips, labels.as_ref(), &all);
                (
                    FipRoles::of(self.base.config.fip_tag.as_ref(), &ips, &all, self.mirror())
                        .never_announced(),
                    admission::refused(&judge, &all, mode),
                )
            }
            _ => (BTreeSet::new(), BTreeSet::new()),
        };
        budget::admitted(&all, self.mirror(), &never_announced, &refused, limit).refuses(&facts.key())
    }
}

/// The Service FIP controller on the shared Service watch, running until `shutdown` resolves
/// (subscribes at once; the watch runs once [`Watches::run`] does).
///
/// With no `loadbalancer` configured, live Services are left as they are; the controller still
/// runs so that a Service carrying baton's finalizer (from when it was configured) can be
/// deleted: its FIP is released and the finalizer removed.
pub fn run_services(
    ctx: Arc<Context>,
    watches: &mut Watches,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let store = watches.services();
    let trigger = watches.subscribe_services();
    let changes = watches.service_changes();
    let control_plane = watches.services_where(may_be_control_plane);
    // A namespace selector reads the Namespaces' labels; none: no Namespace is watched.
    let namespaces = ctx
        .config
        .service_allocation
        .namespace_selector
        .is_some()
        .then(|| (watches.namespaces(), watches.subscribe_namespaces()));
    run(
        ctx,
        (store, control_plane),
        trigger,
        changes,
        namespaces,
        shutdown,
    )
}

async fn run(
    ctx: Arc<Context>,
    (store, control_plane): (Cache<Service>, Subset<Service>),
    trigger: Trigger<Service>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    namespaces: Option<(Cache<Namespace>, Trigger<Namespace>)>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    if ctx.config.load_balancer.is_none() {
        info!("no loadbalancer configured: Service Floating IPs are off (only deletions are finished)");
    }
    let (namespace_cache, namespace_trigger) = namespaces.unzip();
    let svc_ctx = Arc::new(ServiceContext::new(
        ctx.clone(),
        store.clone(),
        control_plane,
        namespace_cache,
    ));
    let relabelled = relabelled(namespace_trigger, store.clone());
    let errors = Arc::new(StreamErrors::new("Service controller"));
    let queued = Arc::clone(&svc_ctx);
    let trigger = trigger.inspect(move |svc| queued.queue.add(key_of(svc)));
    let queued = Arc::clone(&svc_ctx);
    let skipped = Arc::clone(&svc_ctx.skipped)
        .on_election(ctx.leader.elected())
        .inspect(move |svc| {
            queued.queue.add(format!(
                "{}/{}",
                svc.namespace.as_deref().unwrap_or_default(),
                svc.name
            ));
        });
    let run = Controller::for_shared_stream(trigger, store.store())
        .with_config(controller::Config::default().concurrency(CONCURRENCY))
        // Followers do nothing; the moment this replica wins the Lease it reconciles every
        // Service it skipped while it did not lead — all of them at its first election — so
        // work that arrived while there was no leader does not wait for a resync.
        .reconcile_on(skipped)
        .reconcile_on(relabelled)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, svc_ctx.clone())
        .for_each(|result| {
            let errors = Arc::clone(&errors);
            let metrics = Arc::clone(&ctx.metrics);
            async move {
                match result {
                    Ok((obj, _)) => {
                        metrics.reconciled("services");
                        debug!(service = %obj, "reconciled");
                    }
                    Err(controller::Error::ReconcilerFailed(error, obj)) => {
                        debug!(service = %obj, category = error.category(), "reconcile failed");
                    }
                    Err(error) => errors.warn(&error),
                }
            }
        });
    let sweeper = {
        let changes = changes.clone();
        async {
            if svc_ctx.mode().is_none() || store.wait_until_ready().await.is_err() {
                return futures::future::pending().await;
            }
            Sweeper::new(&svc_ctx, &store, changes).run().await;
        }
    };
    // Every replica counts from its own store: the gauge does not depend on who leads.
    let pending = async {
        if store.wait_until_ready().await.is_err() {
            return futures::future::pending().await;
        }
        let mut seen = None;
        loop {
            // Counted again only when a Service changed: this reads every Service.
            let version = *changes.borrow_and_update();
            if seen == Some(version) {
                tokio::time::sleep(PENDING_EVERY).await;
                continue;
            }
            seen = Some(version);
            let mirror = svc_ctx.mirror();
            let all: Vec<ServiceFacts> = store.state().iter().map(|s| svc_ctx.facts(s)).collect();
            // The control-plane addresses the Services show (the mirror's and every endpoint
            // Service's loadBalancerIP), without a cloud read: a Service asking for one of them
            // (the CCM's leftover mirror, say) is never given an address, so it is not pending.
            let control_plane = control_plane_addresses::<IpAddress>(None, &[], &all, mirror);
            let extra = svc_ctx.mode().map(ip_annotation);
            let n = all
                .iter()
                .filter(|f| is_pending(f, mirror, &control_plane, extra))
                .count();
            svc_ctx.base.metrics.set_services_pending(n);
            tokio::time::sleep(PENDING_EVERY).await;
        }
    };
    tokio::select! {
        () = run => {}
        () = sweeper => {}
        () = pending => {}
        () = release_held(&svc_ctx, &store) => {}
    }
}

/// The Services to judge again when a Namespace's labels change (a namespace selector may select
/// it now, or no longer): every Service of that namespace, from `store`. Nothing without the
/// Namespace watch (no selector).
fn relabelled(
    namespaces: Option<Trigger<Namespace>>,
    store: Cache<Service>,
) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<Service>> + Send + 'static {
    let mut seen: HashMap<String, BTreeMap<String, String>> = HashMap::new();
    futures::stream::iter(namespaces)
        .flatten()
        .filter_map(move |ns| {
            let (name, labels) = (ns.name_any(), ns.labels().clone());
            let changed = seen.get(&name) != Some(&labels);
            seen.insert(name.clone(), labels);
            std::future::ready(changed.then_some(name))
        })
        .flat_map(move |relabelled| {
            let refs: Vec<_> = store
                .state()
                .iter()
                .filter(|s| s.namespace().as_deref() == Some(relabelled.as_str()))
                .map(|s| kube::runtime::reflector::ObjectRef::from_obj(s.as_ref()))
                .collect();
            futures::stream::iter(refs)
        })
}

/// Releases each held FIP once its grace period is over, if it is still unwanted then (its
/// Service gone, being deleted, not a managed LoadBalancer, or asking for another address); a
/// FIP wanted again is kept and its hold ends. Only the leader releases; holds live in its memory.
async fn release_held(ctx: &ServiceContext, store: &Cache<Service>) {
    let mut leader = ctx.base.leader.clone();
    loop {
        let next = ctx.holds().next_due();
        let wake = next.unwrap_or_else(|| tokio::time::Instant::now() + RELEASE_CHECK);
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = ctx.held.notified() => continue,
        }
        leader.wait().await;
        let due = ctx.holds().due(tokio::time::Instant::now());
        if due.is_empty() {
            continue;
        }
        if let Err(error) = release_due(ctx, store, &due).await {
            warn!(%error, "releasing Floating IPs whose grace period is over failed; trying again");
            tokio::time::sleep(RELEASE_RETRY).await;
        }
    }
}

/// How often the release loop looks when nothing is held (a hold wakes it at once).
const RELEASE_CHECK: Duration = Duration::from_secs(60);
/// How long the release loop waits after a failure.
const RELEASE_RETRY: Duration = Duration::from_secs(5);

async fn release_due(ctx: &ServiceContext, store: &Cache<Service>, due: &[String]) -> Result<(), CloudError> {
    let _working = ctx.heartbeat.work();
    let ips = ctx.base.cloud.ips().await?;
    let by_tag: BTreeMap<String, Arc<Service>> = store
        .state()
        .into_iter()
        .map(|svc| {
            let tag = service_tag_on(ctx.cloud(), &svc.namespace().unwrap_or_default(), &svc.name_any());
            (tag, svc)
        })
        .collect();
    for id in due {
        let Some(ip) = ips.iter().find(|ip| ip.id.as_str() == id) else {
            // Released elsewhere (by hand, or by an earlier leader).
            ctx.holds().wanted(id);
            continue;
        };
        let svc = ip.tags.get(SERVICE_KEY).and_then(|t| by_tag.get(t));
        let facts = svc.map(|s| ctx.facts(s));
        if !grace::still_unwanted(facts.as_ref(), ip.address, ctx.mode(), ctx.mirror()) {
            ctx.holds().wanted(id);
            info!(fip = %ip.id, address = %ip.address, "held Floating IP wanted again: kept");
            continue;
        }
        if !is_cluster_service_fip(ip, &ctx.base.cluster_id)
            || ctx.routed_by_operator(ip)
            || is_control_plane_fip(ctx, ip)
        {
            ctx.holds().wanted(id);
            warn!(fip = %ip.id, address = %ip.address, "not releasing a held Floating IP that is routed to a server or is not a Service FIP of this cluster");
            continue;
        }
        if !ctx.base.leader.is_leader() {
            return Ok(());
        }
        // A reconcile may have begun releasing it since the list was read.
        if !ctx.holds().is_due(id, tokio::time::Instant::now()) {
            continue;
        }
        match ctx.base.cloud.delete_ip(&ip.id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        ctx.holds().wanted(id);
        info!(fip = %ip.id, address = %ip.address, "Floating IP released: its grace period is over");
        if let Some(svc) = svc {
            ctx.base
                .event(
                    svc.as_ref(),
                    EventType::Normal,
                    "FloatingIPReleased",
                    "ReleaseFloatingIP",
                    format!(
                        "released Floating IP {} ({}): no longer used by this Service for its grace period",
                        ip.address, ip.id
                    ),
                )
                .await;
        }
    }
    Ok(())
}

/// How often `baton_services_pending` is counted.
const PENDING_EVERY: Duration = Duration::from_secs(5);

/// `namespace/name`: the key of a Service in the queue, the retry counts and logs.
fn key_of(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// Whether `ip` is a Service FIP of the cluster `cluster_id`: a FIP carrying the `usage` and
/// `cluster` tags the Service controller puts on (the orphan sweep, `baton_fips_owned`).
pub fn is_cluster_service_fip(ip: &IpAddress, cluster_id: &str) -> bool {
    ip.ip_type == IpType::FloatingIp
        && ip.tags.get(USAGE_KEY).map(String::as_str) == Some(USAGE_VALUE)
        && ip.tags.get(CLUSTER_KEY).map(String::as_str) == Some(cluster_id)
}

/// The orphan sweep: every [`RESYNC`], on the leader, releases the FIPs of this cluster whose
/// Service is gone ([`orphans`]). The candidates are picked from the shared IP list and the
/// Service store; each is then checked again right before its delete, against the live Service
/// store and the cloud (read by id), by [`sweep_decision`]: nothing in the first
/// [`SWEEP_QUIET`] of a term (a new leader's watch may not show every Service yet), nothing whose
/// Service exists or was seen within [`SWEEP_QUIET`], nothing routed or control-plane.
struct Sweeper<'a> {
    ctx: &'a ServiceContext,
    store: &'a Cache<Service>,
    /// Bumped by the shared watch whenever a Service changes.
    changes: tokio::sync::watch::Receiver<u64>,
    /// The `service` tags of the Services in the store, as of `indexed`.
    owners: std::collections::HashSet<String>,
    indexed: Option<u64>,
    /// When each `service` tag was last seen in the store (kept [`SWEEP_QUIET`]).
    last_seen: std::collections::HashMap<String, tokio::time::Instant>,
    term: TermClock,
}

/// Tells when this replica's current term began, from its leadership looked at often (at
/// least every second while the sweeper runs): a term is dated from the first look that saw its
/// number. A pause for a late renewal is the same term (no age while paused).
#[derive(Debug, Default)]
struct TermClock {
    /// The term last seen and the first look that saw it.
    seen: Option<(u64, tokio::time::Instant)>,
}

impl TermClock {
    /// Looks at the leadership; returns how long the current term has lasted (`None`: not
    /// leading, or writes paused).
    fn age(&mut self, lead: Option<baton_cloud::Lead>, now: tokio::time::Instant) -> Option<Duration> {
        let lead = lead?;
        let started = match self.seen {
            Some((term, started)) if term == lead.term => started,
            _ => self.seen.insert((lead.term, now)).1,
        };
        (lead.until > now).then(|| now.saturating_duration_since(started))
    }
}

impl<'a> Sweeper<'a> {
    fn new(
        ctx: &'a ServiceContext,
        store: &'a Cache<Service>,
        changes: tokio::sync::watch::Receiver<u64>,
    ) -> Self {
        Self {
            ctx,
            store,
            changes,
            owners: std::collections::HashSet::new(),
            indexed: None,
            last_seen: std::collections::HashMap::new(),
            term: TermClock::default(),
        }
    }

    fn term_age(&mut self) -> Option<Duration> {
        self.term
            .age(self.ctx.base.leader.lead(), tokio::time::Instant::now())
    }

    /// Sweeps every [`RESYNC`] while leading, never before a term is [`SWEEP_QUIET`] old.
    async fn run(mut self) {
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(age) = self.term_age() else {
                continue;
            };
            let due = last.is_none_or(|t| t.elapsed() >= RESYNC);
            if !due || age < SWEEP_QUIET {
                continue;
            }
            last = Some(tokio::time::Instant::now());
            let _working = self.ctx.heartbeat.work();
            if let Err(error) = self.sweep().await {
                warn!(%error, "sweeping orphaned Floating IPs failed");
            }
        }
    }

    /// The owners as the store shows them now (rebuilt only when a Service changed).
    fn refresh_owners(&mut self) {
        let version = *self.changes.borrow_and_update();
        if self.indexed == Some(version) {
            return;
        }
        self.indexed = Some(version);
        let now = tokio::time::Instant::now();
        self.owners = self
            .store
            .state()
            .iter()
            .map(|svc| {
                service_tag_on(
                    self.ctx.cloud(),
                    &svc.namespace().unwrap_or_default(),
                    &svc.name_any(),
                )
            })
            .collect();
        for tag in &self.owners {
            self.last_seen.insert(tag.clone(), now);
        }
        self.last_seen
            .retain(|_, seen| now.saturating_duration_since(*seen) < SWEEP_QUIET);
    }

    fn owner(&self, tag: &str) -> Owner {
        if self.owners.contains(tag) {
            Owner::Exists
        } else {
            self.last_seen
                .get(tag)
                .map_or(Owner::Unseen, |seen| Owner::SeenAgo(seen.elapsed()))
        }
    }

    /// One pass: candidates from the shared list, each checked again right before its delete.
    async fn sweep(&mut self) -> Result<(), CloudError> {
        let ctx = self.ctx;
        let ips = ctx.base.cloud.ips().await?;
        let cluster = &ctx.base.cluster_id;
        let tagged: Vec<TaggedFip> = ips
            .iter()
            .filter(|ip| is_cluster_service_fip(ip, cluster) && !ctx.routed_by_operator(ip))
            .filter_map(|ip| {
                Some(TaggedFip {
                    id: ip.id.to_string(),
                    service_tag: ip.tags.get(SERVICE_KEY)?.clone(),
                })
            })
            .collect();
        drop(ips);
        if tagged.is_empty() {
            return Ok(());
        }
        self.refresh_owners();
        let candidates = orphans(&tagged, &self.owners);
        let mut released = 0;
        for candidate in tagged.iter().filter(|f| candidates.contains(&f.id)) {
            let id = IpId::from(candidate.id.as_str());
            // Right before the delete: the cloud's view of the FIP (one read), the store's of
            // its Service, this replica's of its term.
            let fip = match ctx.base.cloud.ip(&id).await {
                Ok(ip) => Some(ip),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            };
            self.refresh_owners();
            let Some(term_age) = self.term_age() else {
                return Ok(());
            };
            let check = SweepCheck {
                term_age,
                fip: fip.as_ref().map(|ip| FipNow {
                    same_owner_tag: is_cluster_service_fip(ip, cluster)
                        && ip.tags.get(SERVICE_KEY) == Some(&candidate.service_tag),
                    routed: ctx.routed_by_operator(ip),
                    control_plane: is_control_plane_fip(ctx, ip),
                }),
                owner: self.owner(&candidate.service_tag),
            };
            match sweep_decision(&check) {
                Sweep::Keep(Kept::YoungTerm) => return Ok(()),
                Sweep::Keep(reason) => {
                    debug!(fip = %candidate.id, ?reason, "orphan candidate kept");
                }
                Sweep::Delete => {
                    if ctx
                        .base
                        .leader
                        .ensure("releasing an orphaned Floating IP")
                        .is_err()
                    {
                        return Ok(());
                    }
                    let address = fip.map(|ip| ip.address.to_string()).unwrap_or_default();
                    // Nothing irreversible on one signal: the orphan is held for the grace
                    // period first (docs/services.md).
                    let grace = ctx.base.config.fip_release_grace_period;
                    let held = ctx.holds().is_held(&candidate.id);
                    if let grace::Verdict::Keep { .. } =
                        ctx.holds()
                            .unwanted(&candidate.id, tokio::time::Instant::now(), grace)
                    {
                        if !held {
                            warn!(fip = %candidate.id, %address, grace = %format_duration(grace), "a Floating IP whose Service is gone is held for its grace period");
                            ctx.held.notify_one();
                        }
                        continue;
                    }
                    match ctx.base.cloud.delete_ip(&id).await {
                        Ok(()) => {
                            released += 1;
                            warn!(fip = %candidate.id, %address, "released a Floating IP whose Service is gone");
                        }
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(e),
                    }
                    ctx.holds().wanted(&candidate.id);
                }
            }
        }
        debug!(candidates = candidates.len(), released, "orphan sweep done");
        Ok(())
    }
}

fn is_control_plane_fip(ctx: &ServiceContext, ip: &IpAddress) -> bool {
    ctx.base
        .config
        .fip_tag
        .as_ref()
        .is_some_and(|t| t.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
}

/// Whether this replica holds a term (its writes may pause for a late renewal: they wait for
/// the fence); if not, `svc` is reconciled when it wins the Lease (`Skipped::on_election` in
/// `run`).
fn leads(ctx: &ServiceContext, svc: &Service) -> bool {
    let leads = ctx.base.leader.in_term().is_some();
    if !leads {
        ctx.skipped.record(svc);
    }
    leads
}

/// Reconciles one Service. The finalizer helper is the top-level action for managed Services
/// (and for any Service being deleted with baton's finalizer); a Service that stops being
/// managed has its FIP released and the finalizer removed here.
#[instrument(skip(svc, ctx), fields(service = %format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())))]
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<ServiceContext>) -> Result<Action, ServiceError> {
    ctx.queue.started(&key_of(&svc));
    let _working = ctx.heartbeat.work();
    if !leads(&ctx, &svc) {
        return Ok(Action::await_change());
    }
    if ctx.behind(&svc) {
        debug!("the watch has not shown baton's last write yet; waiting for it");
        return Ok(Action::requeue(AHEAD_WAIT));
    }
    let facts = ctx.facts(&svc);
    debug!(
        deleting = facts.deleting,
        finalizer = facts.has_finalizer,
        resource_version = svc.resource_version().unwrap_or_default(),
        "reconcile"
    );
    // cloud-provider-cherry's service controller left its cleanup finalizer: once baton's own
    // cleanup is done (and, for a Service baton would manage, the FIPs carrying its tags are
    // released, as the CCM's cleanup did), remove it so the deletion finishes.
    let has_ccm_finalizer = svc.finalizers().iter().any(|f| f == CCM_CLEANUP_FINALIZER);
    if clears_ccm_finalizer(&facts, has_ccm_finalizer, ctx.mirror()) {
        remove_ccm_finalizer(&svc, &ctx, &facts).await?;
        return Ok(Action::await_change());
    }
    // A Service asking for a control-plane FIP's address is a control-plane endpoint whatever
    // its name (CPEM #258); judged only while it lives, so a deletion always finishes.
    let roles = if facts.deleting {
        FipRoles::default()
    } else {
        roles_for(&ctx, &facts).await?
    };
    let extra = ctx.mode().map(ip_annotation);
    let result = match (
        scope_excluding(&facts, ctx.mirror(), &roles.control_plane, extra),
        ctx.mode(),
    ) {
        (Scope::Ignored(Ignored::ControlPlaneEndpoint), _) => {
            if scope(&facts, ctx.mirror()) == Scope::Managed {
                debug!("asks for a control-plane Floating IP; never handed to the load balancer");
                ctx.base
                    .event(
                        &*svc,
                        EventType::Normal,
                        "ControlPlaneAddress",
                        "HandOffToLoadBalancer",
                        "this Service asks for a control-plane Floating IP: it is never handed to the load balancer"
                            .to_owned(),
                    )
                    .await;
            }
            Ok(Action::await_change())
        }
        (Scope::Managed, Some(mode)) => {
            match requested(&facts, mode) {
                Err(source) if !facts.deleting => {
                    let err = ServiceError::InvalidField {
                        svc: facts.key(),
                        source,
                    };
                    warn_event(&ctx, &svc, "InvalidAnnotation", &err).await;
                    return Err(err);
                }
                // Bring-your-own IP, never managed by baton: no finalizer, no FIP; its ingress
                // shows the address, as the Cherry CCM sets it.
                // A FIP carrying the Service's tags (cloud-provider-cherry's, whose address the
                // CCM wrote into the IP annotation, or baton's with a lost record) is adopted by
                // the finalizer path instead.
                Ok(Some(asked))
                    if !facts.has_finalizer
                        && !facts.deleting
                        && Record::read(&facts).is_none()
                        && find_ours(&ctx, &facts, None).await?.is_empty() =>
                {
                    debug!(ip = %asked.ip, field = asked.field, "bring-your-own IP");
                    byo(&ctx, &svc, &facts, &asked).await?;
                    ctx.retries.succeeded(&facts.key());
                    // Looked at again: the rules read the cloud (a FIP tagged since, or no
                    // longer this cluster's).
                    return Ok(Action::requeue(RESYNC));
                }
                _ => {}
            }
            run_finalizer(&svc, &ctx).await
        }
        _ if facts.deleting && facts.has_finalizer => run_finalizer(&svc, &ctx).await,
        (Scope::Ignored(reason), _) if facts.has_finalizer => {
            info!(
                ?reason,
                "no longer a baton-managed LoadBalancer; releasing its Floating IP"
            );
            release_and_forget(&svc, &ctx, &facts).await
        }
        _ => Ok(Action::await_change()),
    };
    if result.is_ok() {
        ctx.retries.succeeded(&facts.key());
    }
    result
}

async fn run_finalizer(svc: &Arc<Service>, ctx: &Arc<ServiceContext>) -> Result<Action, ServiceError> {
    let ns = svc.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &ns);
    finalizer(&api, FINALIZER, svc.clone(), |event| async {
        match event {
            FinalizerEvent::Apply(svc) => apply(&svc, ctx).await,
            FinalizerEvent::Cleanup(svc) => cleanup(&svc, ctx).await.map(|_| Action::await_change()),
        }
    })
    .await
    .map_err(|e| ServiceError::Finalizer(Box::new(e)))
}

/// Retries ([`Retries::policy`]): spec errors wait for a change; a 429 waits its
/// `Retry-After`; a refused create is tried again after 5 minutes; other failures back off
/// exponentially per Service.
#[allow(clippy::needless_pass_by_value)] // the signature kube-runtime's Controller::run calls
pub fn error_policy(svc: Arc<Service>, error: &ServiceError, ctx: Arc<ServiceContext>) -> Action {
    let key = key_of(&svc);
    let action = ctx.retries.policy(&key, error, &ctx.base.metrics);
    if action != Action::await_change() {
        ctx.queue.add(key);
    }
    action
}

async fn warn_event(ctx: &ServiceContext, svc: &Service, reason: &str, err: &ServiceError) {
    ctx.base
        .event(
            svc,
            EventType::Warning,
            reason,
            "EnsureFloatingIP",
            err.to_string(),
        )
        .await;
}

/// The Service's three FIP tags.
fn tags_of(ctx: &ServiceContext, facts: &ServiceFacts) -> Tags {
    service_fip_tags_on(ctx.cloud(), &facts.namespace, &facts.name, &ctx.base.cluster_id)
}

fn is_ours(ip: &IpAddress, tags: &Tags) -> bool {
    ip.ip_type == IpType::FloatingIp && matches_all(&ip.tags, tags)
}

/// Every FIP carrying the Service's tags, from the shared IP list's tag index (no pass over the
/// list). A recorded id the list does not show is asked of the API once (it may be a FIP the list
/// cannot show: one created by an earlier leader whose answer this replica never saw, read by a
/// list older than the API's lag).
async fn find_ours(
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    record: Option<&Record>,
) -> Result<Vec<IpAddress>, ServiceError> {
    let tags = tags_of(ctx, facts);
    let cloud_err = |step| {
        let svc = facts.key();
        move |source| ServiceError::Cloud {
            svc,
            step,
            source: Box::new(source),
        }
    };
    let cloud = &ctx.base.cloud;
    let mut found = cloud
        .ips_tagged(&tags)
        .await
        .map_err(cloud_err("listing Floating IPs"))?;
    if let Some(record) = record
        && !found.iter().any(|ip| ip.id.as_str() == record.id)
    {
        let id = IpId::from(record.id.as_str());
        let listed = cloud
            .cached_ip(&id)
            .await
            .map_err(cloud_err("listing Floating IPs"))?;
        if listed.is_none() {
            match cloud.ip(&id).await {
                Ok(ip) if is_ours(&ip, &tags) => found.push(ip),
                Ok(_) => debug!(fip = %record.id, "the recorded FIP does not carry the Service's tags"),
                Err(e) if e.is_not_found() => debug!(fip = %record.id, "the recorded FIP is gone"),
                Err(e) => return Err(cloud_err("reading the recorded Floating IP")(e)),
            }
        }
    }
    Ok(found)
}

fn owned(ip: &IpAddress) -> OwnedFip {
    OwnedFip {
        id: ip.id.to_string(),
        address: ip.address,
    }
}

/// `ip`, a FIP of `svc` that it no longer wants (`why`), is released if its grace period is over
/// (or zero); otherwise it is held ([`grace::Holds`]): a Normal Event `FloatingIPHeld` says so
/// once, and the release loop releases it when the grace period ends, if it is still unwanted
/// then. Returns whether it was released now.
async fn release_or_hold(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    ip: &IpAddress,
    grace: Duration,
    why: &str,
) -> Result<bool, ServiceError> {
    let now = tokio::time::Instant::now();
    let id = ip.id.as_str();
    let was_held = ctx.holds().is_held(id);
    let verdict = ctx.holds().unwanted(id, now, grace);
    match verdict {
        grace::Verdict::Release => {
            ctx.holds().releasing(id);
            let released = release(ctx, svc, facts, ip).await;
            if released.is_ok() {
                ctx.holds().wanted(id);
            } else {
                ctx.holds().release_failed(id);
            }
            released
        }
        grace::Verdict::Keep { until } => {
            if !was_held {
                ctx.held.notify_one();
                let left = format_duration(until.saturating_duration_since(now));
                info!(fip = %ip.id, address = %ip.address, %left, why, "Floating IP held for its grace period");
                ctx.base
                    .event(
                        svc,
                        EventType::Normal,
                        "FloatingIPHeld",
                        "ReleaseFloatingIP",
                        format!(
                            "Floating IP {} ({}) is no longer used by this Service ({why}): it stays reserved for {left} (the grace period) and is released then unless the Service uses it again; annotate {GRACE_ANNOTATION}: \"0\" to release it at once",
                            ip.address, ip.id
                        ),
                    )
                    .await;
            }
            Ok(false)
        }
    }
}

/// Releases one FIP, after checking it is one baton may delete. Returns whether it was deleted.
async fn release(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    ip: &IpAddress,
) -> Result<bool, ServiceError> {
    let tags = tags_of(ctx, facts);
    if !is_ours(ip, &tags) || ctx.routed_by_operator(ip) || is_control_plane_fip(ctx, ip) {
        warn!(fip = %ip.id, address = %ip.address, "not releasing a Floating IP that is routed to a server or is not baton's");
        ctx.base
            .event(
                svc,
                EventType::Warning,
                "FloatingIPKept",
                "ReleaseFloatingIP",
                format!(
                    "Floating IP {} ({}) carries this Service's tags but is routed to a server or is the control-plane FIP; it is not released",
                    ip.address, ip.id
                ),
            )
            .await;
        return Ok(false);
    }
    ctx.base.leader.ensure("releasing a Floating IP")?;
    match ctx.base.cloud.delete_ip(&ip.id).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Ok(false),
        Err(source) => {
            return Err(ServiceError::Cloud {
                svc: facts.key(),
                step: "releasing the Floating IP",
                source: Box::new(source),
            });
        }
    }
    info!(fip = %ip.id, address = %ip.address, "Floating IP released");
    Ok(true)
}

/// Removes the cleanup finalizer cloud-provider-cherry's service controller left, after baton's
/// own cleanup of a Service it manages (the FIPs carrying its tags released, as the CCM's
/// cleanup did), so the deletion finishes; said in an Event on the Service.
async fn remove_ccm_finalizer(
    svc: &Service,
    ctx: &ServiceContext,
    facts: &ServiceFacts,
) -> Result<(), ServiceError> {
    if scope(facts, ctx.mirror()) == Scope::Managed {
        cleanup(svc, ctx).await?;
    }
    let finalizers: Vec<&String> = svc
        .finalizers()
        .iter()
        .filter(|f| *f != CCM_CLEANUP_FINALIZER)
        .collect();
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": svc.resource_version()}});
    merge_patch(
        ctx,
        facts,
        "removing cloud-provider-cherry's cleanup finalizer",
        &patch,
    )
    .await?;
    info!("removed the cleanup finalizer cloud-provider-cherry left (its cleanup is baton's now)");
    ctx.base
        .event(
            svc,
            EventType::Normal,
            "LeftoverRemoved",
            "RemoveLeftover",
            format!("removed the finalizer {CCM_CLEANUP_FINALIZER} cloud-provider-cherry left; its cleanup is baton's now"),
        )
        .await;
    Ok(())
}

/// Apply: make sure the Service has its FIP and shows it.
async fn apply(svc: &Service, ctx: &ServiceContext) -> Result<Action, ServiceError> {
    let facts = ctx.facts(svc);
    let Some(mode) = ctx.mode() else {
        return Ok(Action::await_change());
    };
    let asked = requested(&facts, mode).map_err(|source| ServiceError::InvalidField {
        svc: facts.key(),
        source,
    })?;
    let requested = asked.as_ref().map(|a| a.ip);
    let record = Record::read(&facts);
    let found = find_ours(ctx, &facts, record.as_ref()).await?;
    let (chosen, extras) = pick(found.iter().map(owned).collect(), record.as_ref(), requested);
    for extra in &extras {
        if let Some(ip) = found.iter().find(|f| f.id.as_str() == extra.id)
            && release(ctx, svc, &facts, ip).await?
        {
            ctx.base
                .event(
                    svc,
                    EventType::Warning,
                    "DuplicateFloatingIP",
                    "ReleaseFloatingIP",
                    format!("released duplicate Floating IP {} ({})", extra.address, extra.id),
                )
                .await;
        }
    }
    let handoff = !ctx.refused_by_budget(&facts).await;
    match decide(requested, record.as_ref(), chosen) {
        Decision::Publish(fip) => {
            // Wanted: a hold (the Service was re-created, or its type changed back) ends.
            if ctx.holds().wanted(&fip.id) {
                info!(fip = %fip.id, address = %fip.address, "a held Floating IP is used again: kept");
            }
            publish_or_release(ctx, svc, &facts, mode, &fip, handoff).await?;
            // No record of it on the Service: found by its tags (reserved by cloud-provider-cherry,
            // or by a baton that stopped before it wrote the record). Said once, when adopted.
            if record.is_none() {
                ctx.base
                    .event(
                        svc,
                        EventType::Normal,
                        "FloatingIPAdopted",
                        "EnsureFloatingIP",
                        format!(
                            "Floating IP {} ({}) found by this Service's tags and adopted; no address moved",
                            fip.address, fip.id
                        ),
                    )
                    .await;
            }
        }
        Decision::Create => {
            let fip = create(ctx, svc, &facts).await?;
            publish_or_release(ctx, svc, &facts, mode, &fip, handoff).await?;
        }
        Decision::ByoIp(ip) => {
            debug!(%ip, "bring-your-own IP");
            forget(ctx, &facts, false).await?;
            if let Some(asked) = &asked {
                byo(ctx, svc, &facts, asked).await?;
            }
        }
        // decide() releases only for an address asked for.
        Decision::ReleaseForByoIp { requested, ours } => {
            if let Some(asked) = &asked {
                match admit(ctx, &facts, asked).await? {
                    Ok(()) => release_for_byo_ip(ctx, svc, &facts, &found, requested, &ours).await?,
                    // A request the rules refuse takes nothing away, as a typo does: the
                    // Service keeps its FIP (not held, announced as before).
                    Err(refusal) => refuse(ctx, svc, &facts, &refusal, Some(&ours)).await?,
                }
            }
        }
    }
    if !handoff && requested.is_none() {
        let limit = ctx.base.config.bgp_prefix_limit.unwrap_or_default();
        ctx.base
            .event(
                svc,
                EventType::Warning,
                "BGPPrefixBudgetExceeded",
                "HandOffToLoadBalancer",
                format!(
                    "the BGP prefix budget (bgpPrefixLimit={limit} per session) is used by older Services: its Floating IP is reserved but not handed to the load balancer until a slot frees"
                ),
            )
            .await;
        return Ok(Action::requeue(BUDGET_RETRY));
    }
    Ok(Action::requeue(RESYNC))
}

/// The Service asks for `requested`, not baton's FIP `ours`: the FIP is released (or held for its
/// grace period: a typo in the annotation must not give the address away), baton's record goes,
/// and the ingress shows the address asked for.
async fn release_for_byo_ip(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    found: &[IpAddress],
    requested: IpAddr,
    ours: &OwnedFip,
) -> Result<(), ServiceError> {
    if let Some(ip) = found.iter().find(|f| f.id.as_str() == ours.id) {
        let grace = ctx.grace_of(svc, facts).await;
        if release_or_hold(ctx, svc, facts, ip, grace, &format!("it asks for {requested}")).await? {
            ctx.base
                .event(
                    svc,
                    EventType::Normal,
                    "FloatingIPReleased",
                    "ReleaseFloatingIP",
                    format!(
                        "released Floating IP {} ({}): the Service asks for {requested}",
                        ours.address, ours.id
                    ),
                )
                .await;
        }
    }
    forget(ctx, facts, false).await?;
    let roles = byo_roles(ctx, facts, requested).await?;
    byo_ingress(ctx, svc, facts, requested, &roles).await
}

/// Publishes the FIP; if the Service is gone (Kubernetes can delete it despite the finalizer,
/// kubernetes/kubernetes#77988), holds the FIP for its grace period (released then, unless a
/// Service of that name is back) instead of leaking it.
async fn publish_or_release(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    mode: &LoadBalancerMode,
    fip: &OwnedFip,
    handoff: bool,
) -> Result<(), ServiceError> {
    match publish(ctx, facts, mode, fip, handoff).await {
        Err(ServiceError::Kube { source, .. }) if source.status() == Some(404) => {
            warn!(fip = %fip.id, "the Service is gone (despite the finalizer); releasing its Floating IP");
            let ips = ctx.base.cloud.ips().await.map_err(|source| ServiceError::Cloud {
                svc: facts.key(),
                step: "listing Floating IPs",
                source: Box::new(source),
            })?;
            let ip = match ips.iter().find(|ip| ip.id.as_str() == fip.id) {
                Some(ip) => Some(IpAddress::clone(ip)),
                None => match ctx.base.cloud.ip(&IpId::from(fip.id.as_str())).await {
                    Ok(ip) => Some(ip),
                    Err(e) if e.is_not_found() => None,
                    Err(source) => {
                        return Err(ServiceError::Cloud {
                            svc: facts.key(),
                            step: "reading the Floating IP",
                            source: Box::new(source),
                        });
                    }
                },
            };
            if let Some(ip) = ip {
                let grace = ctx.grace_of(svc, facts).await;
                release_or_hold(ctx, svc, facts, &ip, grace, "the Service is gone").await?;
            }
            Ok(())
        }
        other => other,
    }
}

/// Reserves the Service's FIP (idempotent by its tags) in the chosen region.
async fn create(ctx: &ServiceContext, svc: &Service, facts: &ServiceFacts) -> Result<OwnedFip, ServiceError> {
    let choice = match choose_region(
        ctx.base.config.region.as_deref(),
        &ctx.base.config.annotations.fip_region,
        facts,
    ) {
        Ok(c) => c,
        Err(source) => {
            let reason = match source {
                RegionError::Missing { .. } => "NoRegion",
                RegionError::Invalid { .. } => "InvalidRegion",
            };
            let err = ServiceError::Region {
                svc: facts.key(),
                source,
            };
            warn_event(ctx, svc, reason, &err).await;
            return Err(err);
        }
    };
    ctx.base.leader.ensure("reserving a Floating IP")?;
    let request = CreateIpRequest {
        region: choice.region.clone(),
        tags: tags_of(ctx, facts),
        ..CreateIpRequest::default()
    };
    match ctx.base.cloud.create_ip(request).await {
        Ok(ip) => {
            info!(fip = %ip.id, address = %ip.address, region = %choice.region, "Floating IP reserved");
            ctx.base
                .event(
                    svc,
                    EventType::Normal,
                    "FloatingIPReserved",
                    "EnsureFloatingIP",
                    format!(
                        "reserved Floating IP {} ({}) in region {}",
                        ip.address, ip.id, choice.region
                    ),
                )
                .await;
            Ok(owned(&ip))
        }
        // The request carries only baton's tags and the region: a 400/422 is about the region
        // (unknown, or no address left in it); the API's message says which.
        Err(source) if matches!(source.status(), Some(400 | 422)) => {
            let err = ServiceError::CreateRejected {
                svc: facts.key(),
                region: choice.region,
                from: choice.source,
                source: Box::new(source),
            };
            warn_event(ctx, svc, "FloatingIPRejected", &err).await;
            Err(err)
        }
        Err(source) => Err(ServiceError::Cloud {
            svc: facts.key(),
            step: "reserving a Floating IP",
            source: Box::new(source),
        }),
    }
}

/// Writes what differs: the annotations (merge patch) and the status ingress (server-side apply).
/// Without `handoff` (refused by the prefix budget) only baton's record is written.
async fn publish(
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    mode: &LoadBalancerMode,
    fip: &OwnedFip,
    handoff: bool,
) -> Result<(), ServiceError> {
    let mut changes = publish_changes(facts, mode, fip);
    if !handoff {
        changes = withhold_handoff(changes, mode);
    }
    let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &facts.namespace);
    if !changes.annotations.is_empty() {
        let patch = json!({"metadata": {"annotations": changes.annotations}});
        merge_patch(ctx, facts, "annotating the Service", &patch).await?;
    }
    if changes.status {
        apply_ingress(&api, ctx, facts, fip.address).await?;
    }
    if !changes.annotations.is_empty() || changes.status {
        debug!(address = %fip.address, "Service shows its Floating IP");
    }
    Ok(())
}

/// `status.loadBalancer.ingress` = `[ip]` by server-side apply (manager "baton").
async fn apply_ingress(
    api: &Api<Service>,
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    ip: IpAddr,
) -> Result<(), ServiceError> {
    let status = json!({"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}});
    apply_status(api, ctx, facts, "setting the Service's ingress", Some(status)).await
}

/// Server-side applies baton's part of the Service's status (manager "baton"): `status`, or
/// nothing at all with `None`, which gives up every status field baton set.
async fn apply_status(
    api: &Api<Service>,
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    step: &'static str,
    status: Option<serde_json::Value>,
) -> Result<(), ServiceError> {
    ctx.base.leader.ensure(step)?;
    let mut body = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": facts.name, "namespace": facts.namespace},
    });
    if let Some(status) = status {
        body["status"] = status;
    }
    let written = kit::timed(
        step,
        api.patch_status(
            &facts.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await
    .map_err(|source| ServiceError::kube(facts, source))?;
    ctx.wrote(facts, written.metadata.resource_version.as_deref());
    Ok(())
}

/// A bring-your-own IP's ingress: the address the Service asks for, as the Cherry CCM reports
/// it (written only when it differs; VIP mode, no `ipMode`). Returns whether it was written.
async fn set_ingress(ctx: &ServiceContext, facts: &ServiceFacts, ip: IpAddr) -> Result<bool, ServiceError> {
    if facts.ingress_ips == [ip.to_string()] {
        return Ok(false);
    }
    let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &facts.namespace);
    apply_ingress(&api, ctx, facts, ip).await?;
    info!(%ip, "bring-your-own IP: ingress set");
    Ok(true)
}

/// [`set_ingress`], and when the address is a FIP the cloud routes to a server (a bring-your-own
/// routed FIP, [`FipRoles::routed`]) says once, as the ingress is written, that it is not handed
/// to the load balancer: the cloud delivers it to that server, where kube-proxy accepts it (the
/// ingress is in VIP mode); a BGP announcement from other nodes would fight the cloud's route.
async fn byo_ingress(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    ip: IpAddr,
    roles: &FipRoles,
) -> Result<(), ServiceError> {
    if set_ingress(ctx, facts, ip).await?
        && let Some(server) = roles.routed_to(ip)
    {
        info!(%ip, server, "bring-your-own Floating IP routed to a server by the cloud: not handed to the load balancer");
        ctx.base
            .event(
                svc,
                EventType::Normal,
                "RoutedFloatingIP",
                "HandOffToLoadBalancer",
                format!(
                    "Floating IP {ip} is routed to server {server} by the cloud: ingress set (VIP mode, kube-proxy accepts it on that server); it is not handed to the load balancer, a BGP announcement would fight the cloud's route"
                ),
            )
            .await;
    }
    Ok(())
}

/// A Service bringing its own address (`asked`): its ingress shows it when the rules admit it
/// ([`admit`]); otherwise [`refuse`].
async fn byo(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    asked: &Requested,
) -> Result<(), ServiceError> {
    match admit(ctx, facts, asked).await? {
        Ok(()) => {
            let roles = byo_roles(ctx, facts, asked.ip).await?;
            byo_ingress(ctx, svc, facts, asked.ip, &roles).await
        }
        Err(refusal) => refuse(ctx, svc, facts, &refusal, None).await,
    }
}

/// How long after a fresh read of an address the rules refused it is judged on the shared list
/// alone: a Service edited over and over costs the cloud one read a minute, not one an edit.
const RECHECK_EVERY: Duration = Duration::from_secs(60);

/// Whether the Service of `facts` may use the address it asks for ([`super::trust::address`]):
/// judged on the shared IP list and, when that says no for a reason a newer view could change
/// (a FIP reserved or tagged since the list was read), on the cloud's answer read fresh (by id,
/// or a new list), at most every [`RECHECK_EVERY`] per address.
async fn admit(
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    asked: &Requested,
) -> Result<Result<(), Box<AddressRefusal>>, ServiceError> {
    let cloud_err = |step| {
        let svc = facts.key();
        move |source| ServiceError::Cloud {
            svc,
            step,
            source: Box::new(source),
        }
    };
    let labels = ctx.namespace_labels().await;
    // The Services of its namespace: who may share a FIP reserved for one of them.
    let siblings: Vec<ServiceFacts> = ctx
        .store
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(facts.namespace.as_str()))
        .map(|s| ctx.facts(s))
        .collect();
    let judge = |ips: &[IpAddress]| {
        Judge::new(&ctx.policy, ips, labels.as_ref(), &siblings)
            .admit(facts, &asked.field, asked.ip)
            .map(|_| ())
    };
    let cloud = &ctx.base.cloud;
    let mut ips = cloud
        .ips_at(&BTreeSet::from([asked.ip]))
        .await
        .map_err(cloud_err("listing Floating IPs"))?;
    if !ips.iter().any(|ip| ip.ip_type == IpType::FloatingIp) {
        // Perhaps inside one of the project's subnets (few): those are in the whole list.
        ips = subnets_and(
            &cloud.ips().await.map_err(cloud_err("listing Floating IPs"))?,
            asked.ip,
        );
    }
    let verdict = judge(&ips);
    let stale = matches!(&verdict, Err(r) if r.may_be_stale());
    if !stale || !ctx.recheck(asked.ip) {
        return Ok(verdict);
    }
    let listed = ips
        .iter()
        .find(|ip| ip.address == asked.ip && ip.ip_type == IpType::FloatingIp)
        .map(|ip| ip.id.clone());
    let fresh = if let Some(id) = listed {
        match cloud.ip(&id).await {
            Ok(ip) => vec![ip],
            Err(e) if e.is_not_found() => {
                cloud.invalidate_ips();
                Vec::new()
            }
            Err(e) => return Err(cloud_err("reading the Floating IP the Service asks for")(e)),
        }
    } else {
        cloud.invalidate_ips();
        subnets_and(
            &cloud.ips().await.map_err(cloud_err("listing Floating IPs"))?,
            asked.ip,
        )
    };
    Ok(judge(&fresh))
}

/// The project's subnets and the IPs at `address`, of `ips`.
fn subnets_and(ips: &[Arc<IpAddress>], address: IpAddr) -> Vec<IpAddress> {
    ips.iter()
        .filter(|ip| ip.address == address || ip.ip_type == IpType::Subnet)
        .map(|ip| IpAddress::clone(ip))
        .collect()
}

/// A request the rules refuse: a Warning Event naming the field, the address and the rule, and
/// nothing else for the address (no ingress, no IP annotation, no cloud write). The ingress
/// baton set goes (one it set for the address before this version too: docs/services.md,
/// "Upgrading"), unless the Service keeps its own FIP (`keeps`), whose ingress it shows.
async fn refuse(
    ctx: &ServiceContext,
    svc: &Service,
    facts: &ServiceFacts,
    refusal: &AddressRefusal,
    keeps: Option<&OwnedFip>,
) -> Result<(), ServiceError> {
    let address = refusal.address();
    let shown = facts.ingress_ips.iter().any(|i| i.parse() == Ok(address));
    warn!(%address, reason = refusal.reason(), %refusal, "the address the Service asks for is refused");
    let mut note = refusal.to_string();
    match keeps {
        Some(own) => {
            let _ = write!(
                note,
                "; the Service keeps its Floating IP {} ({})",
                own.address, own.id
            );
        }
        None if shown => note.push_str("; its ingress, set for this address before, is withdrawn"),
        None => {}
    }
    ctx.base
        .event(
            svc,
            EventType::Warning,
            refusal.reason(),
            "EnsureFloatingIP",
            note,
        )
        .await;
    match keeps {
        Some(own) if facts.ingress_ips != [own.address.to_string()] => {
            let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &facts.namespace);
            apply_ingress(&api, ctx, facts, own.address).await?;
        }
        Some(_) => {}
        None => clear_ingress(ctx, facts).await?,
    }
    Ok(())
}

/// [`roles_for`] a Service bringing its own address `ip`, with the cloud's view of `ip` read
/// fresh where the shared list may be behind (it is up to its TTL old): an address the list
/// does not show (a FIP reserved since) has the list read again, and a FIP it shows unrouted is
/// read by id (the operator may have routed it since). So the ingress of a FIP routed to a
/// server is never written on a stale belief that it is announced by BGP, and the BGP
/// controller, which hands MetalLB only addresses the ingress shows, reads the same fresh list.
async fn byo_roles(ctx: &ServiceContext, facts: &ServiceFacts, ip: IpAddr) -> Result<FipRoles, ServiceError> {
    let cloud_err = |step| {
        let svc = facts.key();
        move |source| ServiceError::Cloud {
            svc,
            step,
            source: Box::new(source),
        }
    };
    let ips = ctx
        .base
        .cloud
        .ips()
        .await
        .map_err(cloud_err("listing Floating IPs"))?;
    let shown = ips
        .iter()
        .find(|x| x.address == ip && x.ip_type == IpType::FloatingIp)
        .map(|x| (x.id.clone(), x.target().is_some()));
    match shown {
        None => ctx.base.cloud.invalidate_ips(),
        Some((id, false)) => match ctx.base.cloud.ip(&id).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => ctx.base.cloud.invalidate_ips(),
            Err(e) => return Err(cloud_err("reading the Floating IP the Service asks for")(e)),
        },
        Some((_, true)) => {}
    }
    roles_for(ctx, facts).await
}

/// The roles of the cloud's FIPs ([`FipRoles`]) for the addresses the Service asks for (none,
/// without a cloud read, when it asks for none). Read without a pass over the IP list or the
/// Services, since it runs on every reconcile: the FIPs carrying `fipTag` and those at the asked
/// addresses come from the shared list's indexes, the control-plane Services from their subset.
/// So `routed` covers only the asked addresses; `control_plane` is whole.
async fn roles_for(ctx: &ServiceContext, facts: &ServiceFacts) -> Result<FipRoles, ServiceError> {
    let asked = asked_addresses(facts, ctx.mode().map(ip_annotation));
    if asked.is_empty() {
        return Ok(FipRoles::default());
    }
    let cloud_err = |source| ServiceError::Cloud {
        svc: facts.key(),
        step: "listing Floating IPs",
        source: Box::new(source),
    };
    let mut ips = match &ctx.base.config.fip_tag {
        Some(tag) => {
            let tags = Tags::from([(tag.key().to_owned(), tag.value().to_owned())]);
            ctx.base.cloud.ips_tagged(&tags).await.map_err(cloud_err)?
        }
        None => Vec::new(),
    };
    ips.extend(ctx.base.cloud.ips_at(&asked).await.map_err(cloud_err)?);
    let services: Vec<ServiceFacts> = ctx.control_plane.objects().iter().map(|s| ctx.facts(s)).collect();
    Ok(FipRoles::of(
        ctx.base.config.fip_tag.as_ref(),
        &ips,
        &services,
        ctx.mirror(),
    ))
}

/// Whether a Service may be a control-plane endpoint ([`is_control_plane_service`], whatever the
/// mirror's name: the mirror is in `kube-system`). Read in place, on every Service event.
pub(super) fn may_be_control_plane(svc: &Service) -> bool {
    svc.metadata.namespace.as_deref() == Some("kube-system")
        || svc
            .annotations()
            .contains_key(crate::names::CONTROL_PLANE_ENDPOINT_ANNOTATION)
        || svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref())
            == Some(crate::names::CONTROL_PLANE_CLASS)
}

fn annotation_nulls(
    facts: &ServiceFacts,
    mode: Option<&LoadBalancerMode>,
) -> serde_json::Map<String, serde_json::Value> {
    record_removals(facts, mode)
        .into_iter()
        .map(|k| (k, serde_json::Value::Null))
        .collect()
}

/// Drops baton's record (and its IP annotation, if it still holds baton's address), and with
/// `clear_status` baton's status ingress.
async fn forget(ctx: &ServiceContext, facts: &ServiceFacts, clear_status: bool) -> Result<(), ServiceError> {
    let nulls = annotation_nulls(facts, ctx.mode());
    if !nulls.is_empty() {
        let patch = json!({"metadata": {"annotations": nulls}});
        merge_patch(ctx, facts, "removing baton's annotations", &patch).await?;
    }
    if clear_status {
        clear_ingress(ctx, facts).await?;
    }
    Ok(())
}

/// A JSON merge patch of the Service, by the leader only, under the write timeout.
async fn merge_patch(
    ctx: &ServiceContext,
    facts: &ServiceFacts,
    step: &'static str,
    patch: &serde_json::Value,
) -> Result<(), ServiceError> {
    ctx.base.leader.ensure(step)?;
    let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &facts.namespace);
    let written = kit::timed(
        step,
        api.patch(&facts.name, &PatchParams::default(), &Patch::Merge(patch)),
    )
    .await
    .map_err(|source| ServiceError::kube(facts, source))?;
    ctx.wrote(facts, written.metadata.resource_version.as_deref());
    Ok(())
}

/// Gives up baton's status fields (applying no status): the ingress baton set goes.
async fn clear_ingress(ctx: &ServiceContext, facts: &ServiceFacts) -> Result<(), ServiceError> {
    if facts.ingress_ips.is_empty() || facts.deleting {
        return Ok(());
    }
    let api: Api<Service> = Api::namespaced(ctx.base.client.clone(), &facts.namespace);
    apply_status(&api, ctx, facts, "clearing the Service's ingress", None).await
}

/// Cleanup: release every FIP carrying the Service's tags, or hold it for its grace period
/// (tolerates an Apply that never ran: then there is nothing to release). Returns how many were
/// released.
async fn cleanup(svc: &Service, ctx: &ServiceContext) -> Result<usize, ServiceError> {
    let facts = ctx.facts(svc);
    let record = Record::read(&facts);
    let found = find_ours(ctx, &facts, record.as_ref()).await?;
    let grace = if found.is_empty() {
        Duration::ZERO
    } else {
        ctx.grace_of(svc, &facts).await
    };
    let why = if facts.deleting {
        "the Service is deleted"
    } else {
        "the Service is no longer a LoadBalancer baton manages"
    };
    let mut released = 0;
    for ip in &found {
        if release_or_hold(ctx, svc, &facts, ip, grace, why).await? {
            released += 1;
            ctx.base
                .event(
                    svc,
                    EventType::Normal,
                    "FloatingIPReleased",
                    "ReleaseFloatingIP",
                    format!("released Floating IP {} ({})", ip.address, ip.id),
                )
                .await;
        }
    }
    debug!(found = found.len(), released, "cleanup done");
    Ok(released)
}

/// A Service that is no longer baton's (type, class or opt-out changed) but carries baton's
/// finalizer: release its FIP, then drop baton's annotations and the finalizer in one patch, then
/// baton's ingress.
async fn release_and_forget(
    svc: &Arc<Service>,
    ctx: &Arc<ServiceContext>,
    facts: &ServiceFacts,
) -> Result<Action, ServiceError> {
    cleanup(svc, ctx).await?;
    let finalizers: Vec<&String> = svc.finalizers().iter().filter(|f| *f != FINALIZER).collect();
    // resourceVersion makes the patch conditional: a concurrent change of the finalizer list
    // fails it (409) and the next reconcile sees the new list.
    let patch = json!({"metadata": {
        "annotations": annotation_nulls(facts, ctx.mode()),
        "finalizers": finalizers,
        "resourceVersion": svc.resource_version(),
    }});
    merge_patch(ctx, facts, "removing the finalizer", &patch).await?;
    clear_ingress(ctx, facts).await?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests;
