//! The control-plane endpoint manager: keeps each control-plane FIP routed to a healthy API server.
//!
//! ```text
//!  default/kubernetes EndpointSlices ─┐            cloud: IPs (cached), servers
//!  Nodes (cordon / deletion)          ├─ watch ─►  candidates: API server address ─► server id
//!  Services (control-plane endpoints) ┘                 │
//!                                                       ▼
//!  Prober: /readyz on every candidate and every FIP ─► health (rise/fall) ─► core::failover::decide
//!  RouterProbes (sniRouterPort ≠ 0): the SNI router on ─► Candidate::router ─┘   │ Move (leader only,
//!    every candidate, its own health check                                      ▼  hold-down)
//!                           one retarget call (urgent priority, fenced by the lease), read back, Event
//! ```
//!
//! Endpoints are the FIP named by `fipTag` (with the mirror Service
//! `kube-system/<prefix>-kubernetes-external`) and every Service annotated
//! `baton.dev/control-plane-endpoint: "true"` (the API Services `baton bootstrap` creates), whose
//! `loadBalancerIP` is its FIP. Who holds a FIP is read from the cloud (`targeted_to`), never
//! guessed from Node addresses.
//!
//! The hold-down after a move is shared: the leader records each move and the hold it started on
//! the endpoint Service ([`FIP_LAST_MOVE_ANNOTATION`], written beside the holder annotations,
//! off the decision loop), and every replica reads it back each pass into its own [`HoldDown`],
//! so a new leader holds the FIP as the one that moved it would have.
//!
//! One file per job: this one runs the loop ([`run`]); `discover` finds the endpoints (and
//! reports refused Services), `candidates` the servers a FIP may move to and their health,
//! `cloud_view` reads the cloud (servers, the IP list, the read ahead of a takeover), `step`
//! decides and moves each FIP, `record` keeps the hold-down every replica shares, `publish`
//! tells the nodes and the other replicas (holder annotations, status, the FIP table), and
//! `finalizer` releases a deleted endpoint Service's FIP, and `handoff` moves the leader off a
//! FIP holder's node.
//!
//! [`FIP_LAST_MOVE_ANNOTATION`]: crate::names::FIP_LAST_MOVE_ANNOTATION

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::IpAddress;
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::EventType;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::health::Heartbeat;
use super::mirror::{self, MirrorSpec};
use super::watches::{Cache, Subset, Watches};
use crate::probe::{ProbeError, ProbeSettings, Prober};

mod candidates;
mod cloud_view;
mod discover;
mod finalizer;
#[cfg(test)]
mod fixtures;
mod handoff;
mod publish;
mod record;
mod step;

use candidates::{RouterProbes, api_server_addresses, candidates, probe_addresses, probe_targets};
use cloud_view::{
    CloudView, Counted, ServerList, Takeover, UnknownFips, count_owned, sleep_until_opt, unknown_endpoint_ips,
};
use discover::{Refusals, discover, endpoint_services};
pub use finalizer::ENDPOINT_FINALIZER;
use finalizer::Finalizer;
use handoff::HandOffs;
use publish::{FipTablePublisher, Holder, fip_table_of};
use record::HoldDown;
use step::Step;

/// Settings of the endpoint manager.
#[derive(Clone)]
pub struct EndpointOptions {
    pub probe: ProbeSettings,
    /// The cloud client with urgent priority: a failover's calls go ahead of queued work.
    pub urgent_cloud: Arc<dyn Cloud>,
    /// The namespace of the FIP table the node agents read ([`crate::names::fip_table_name`]):
    /// the controller's own (its Lease's).
    pub fip_table_namespace: String,
    /// How often the decision loop runs when nothing changes.
    pub tick: Duration,
    /// How often the server list is refreshed from the cloud.
    pub servers_refresh: Duration,
}

/// Errors of the endpoint manager.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// One control-plane endpoint: a FIP and the Service that represents it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EndpointRef {
    fip: IpAddress,
    /// The port probed on the FIP.
    fip_port: u16,
    service: MirrorSpec,
}

/// Per-endpoint memory between iterations.
#[derive(Debug, Default)]
struct EndpointState {
    /// When the holder was first seen failing in the current episode.
    down_since: Option<Instant>,
    /// Whether a "stuck" Event was already published in the current episode.
    stuck_reported: bool,
    /// Inputs of the last successful status/endpoints write.
    last_applied: Option<(MirrorSpec, BTreeSet<SocketAddr>)>,
    last_applied_at: Option<Instant>,
    /// After a failed write, when to try again (no hammering of a refusing API server).
    retry_at: Option<Instant>,
    /// Holds back moves for an unreachable FIP right after a move (no flapping).
    hold: HoldDown,
    /// The last text of the Service's [`FIP_LAST_MOVE_ANNOTATION`] read (each text is read,
    /// and a garbled one logged, once).
    ///
    /// [`FIP_LAST_MOVE_ANNOTATION`]: crate::names::FIP_LAST_MOVE_ANNOTATION
    record_seen: Option<String>,
    /// The holder the previous pass saw (once `seen` is set), to notice a move this replica
    /// did not make: another replica's, an operator's, the cloud's.
    seen_holder: Option<u64>,
    seen: bool,
    /// Whether the holder was read afresh in the current unreachable-FIP episode.
    route_checked: bool,
    /// Since when the FIP has been unreachable while its holder answers directly.
    unreachable_since: Option<Instant>,
    /// The holder annotations being written (off the decision loop), and what they say.
    holder_write: Option<(Holder, tokio::task::JoinHandle<bool>)>,
    /// After a failed holder write, when to try again.
    holder_retry_at: Option<Instant>,
}

/// The endpoint manager on the shared watches (the API servers' EndpointSlices, Nodes,
/// Services), running until `shutdown`.
pub fn run(
    ctx: Context,
    watches: &mut Watches,
    opts: EndpointOptions,
    shutdown: CancellationToken,
) -> impl Future<Output = Result<(), EndpointError>> + Send + 'static {
    let inputs = Inputs {
        slices: watches.api_slices(),
        nodes: watches.nodes(),
        services: watches.services(),
        endpoint_candidates: watches.services_where(super::service::may_be_control_plane),
        service_changes: watches.service_changes(),
        heartbeat: ctx.heartbeats.start_loop("endpoints"),
    };
    async move {
        // The version floor: below Kubernetes 1.30 no control-plane endpoint is managed.
        if !above_floor(&ctx, &opts, &inputs.heartbeat, &shutdown).await {
            return Ok(());
        }
        run_on(ctx, inputs, opts, shutdown).await
    }
}

/// What the endpoint loop reads from the shared watches.
struct Inputs {
    slices: Cache<EndpointSlice>,
    nodes: Cache<Node>,
    services: Cache<Service>,
    /// The Services that may be control-plane endpoints (a few, out of perhaps thousands).
    endpoint_candidates: Subset<Service>,
    service_changes: tokio::sync::watch::Receiver<u64>,
    /// `/health`: a unit of work per pass (its wait, at most a tick, included); idle until the
    /// watches' first lists.
    heartbeat: Heartbeat,
}

async fn run_on(
    ctx: Context,
    Inputs {
        slices,
        nodes,
        services: all_services,
        endpoint_candidates,
        mut service_changes,
        heartbeat,
    }: Inputs,
    opts: EndpointOptions,
    shutdown: CancellationToken,
) -> Result<(), EndpointError> {
    let metrics = Arc::clone(&ctx.metrics);
    if !first_lists((&slices, &nodes, &all_services), &heartbeat, &shutdown).await {
        return Ok(());
    }
    // The control-plane endpoint Services, picked again only when a Service changed, and out
    // of the few that may be endpoints (kept from the watch's events), not every Service: the
    // loop runs several times a second, and during a burst of creates a Service changes at
    // every tick.
    let mirror_name = mirror::service_name(&ctx.config.prefix);
    let mut services = endpoint_services(&endpoint_candidates.objects(), &mirror_name);
    let mut prober = Prober::new(opts.probe.clone(), Arc::clone(&metrics) as _);
    let mut health_rx = prober.subscribe();
    let mut routers = RouterProbes::new(ctx.config.health_check.sni_router_port, &opts.probe);
    let mut router_rx = routers.subscribe();
    let mut server_list = ServerList::default();
    let mut states: BTreeMap<String, EndpointState> = BTreeMap::new();
    let mut tick = tokio::time::interval(opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut cloud_view = CloudView::default();
    // The IP list whose Service FIPs `baton_fips_owned` last counted, and when.
    let (mut counted, mut takeover) = (Counted::default(), Takeover::default());
    let mut leader = ctx.leader.clone();
    let mut finalizer = Finalizer::default();
    let mut unknown_fips = UnknownFips::default();
    let (mut refusals, mut fip_table) = (Refusals::default(), FipTablePublisher::default());
    let mut handoffs = HandOffs::default();

    let mut again = false;
    loop {
        let prefetch_at = takeover.prefetch_at(&ctx.leader);
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = std::future::ready(()), if std::mem::take(&mut again) => {}
            _ = tick.tick() => {}
            _ = health_rx.changed() => {}
            _ = router_rx.changed(), if routers.is_on() => {}
            // A new leader acts at once, not at the next tick.
            () = leader.changed() => {}
            () = sleep_until_opt(prefetch_at) => {}
        }
        heartbeat.beat();
        if service_changes.has_changed().unwrap_or(false) {
            service_changes.mark_unchanged();
            services = endpoint_services(&endpoint_candidates.objects(), &mirror_name);
        }
        let read_now = takeover.step(&ctx);
        let leading = ctx.leader.is_leader();
        let api_servers = api_server_addresses(&slices.state());
        if api_servers.is_empty() {
            tracing::debug!("default/kubernetes lists no API server yet");
            continue;
        }
        let servers = server_list.refresh(&opts, &api_servers, leading).await;
        // The IP list: the leader reads the shared, cached list (fetched in the urgent lane,
        // whoever asks first; re-read when older than the cache's lifetime). A follower reads it
        // at start and ahead of a takeover only, and otherwise decides nothing from it: it only
        // keeps probing. While the cloud cannot be read, decisions go on from the last list read.
        let ips = if leading || read_now {
            cloud_view.fetch(&ctx, &metrics, &services, &api_servers).await
        } else {
            match cloud_view.last_list() {
                Some(ips) => Some(ips),
                None => cloud_view.fetch(&ctx, &metrics, &services, &api_servers).await,
            }
        };
        let Some(ips) = ips else {
            continue;
        };
        // An endpoint Service naming a FIP the cached list does not show yet (reserved a moment
        // ago): read the list again now, then after 5 s, doubling up to 10 minutes while it stays
        // unknown (an address that is no FIP of the project must not cost a list every second).
        if leading && unknown_fips.due(&unknown_endpoint_ips(&ctx.endpoints.current(), &services, &ips)) {
            ctx.cloud.invalidate_ips();
            again = true;
            continue;
        }
        if leading {
            finalizer.start(&ctx, &services, &ips, &mirror_name);
        }
        let (endpoints, refused) = discover(&ctx, &services, &ips, &api_servers);
        if leading {
            count_owned(&ctx, &metrics, endpoints.len(), &ips, &mut counted);
        }
        refusals.report(&ctx, &refused);
        // Candidates are the API servers default/kubernetes lists, plus every FIP holder: a
        // holder missing from that list (not yet added, or just removed) is probed directly
        // rather than presumed gone.
        let probe_addrs = probe_addresses(&api_servers, &endpoints, servers);
        prober.set_targets(&probe_targets(&ctx, &probe_addrs, &endpoints))?;
        routers.follow(&probe_addrs)?;

        let node_list = nodes.state();
        let candidates = candidates(&probe_addrs, servers, &node_list, &prober, &routers);
        fip_table.publish(&ctx, &opts, fip_table_of(&endpoints, servers, &node_list));

        let step = Step {
            ctx: &ctx,
            opts: &opts,
            metrics: &metrics,
            services: &services,
            candidates: &candidates,
            api_servers: &api_servers,
            servers,
            nodes: &node_list,
        };
        again = step
            .all(&endpoints, &mut states, &mut prober, &mut cloud_view)
            .await?;
        handoffs.consider(
            &ctx,
            (&endpoints, &states),
            &candidates,
            &prober,
            leading && !again,
        );
    }
}

/// Waits for the watches' first full lists (a half-filled store would look like a vanished
/// holder: nothing is decided before); false on shutdown.
async fn first_lists(
    (slices, nodes, services): (&Cache<EndpointSlice>, &Cache<Node>, &Cache<Service>),
    heartbeat: &Heartbeat,
    shutdown: &CancellationToken,
) -> bool {
    for ready in [
        slices.wait_until_ready().boxed(),
        nodes.wait_until_ready().boxed(),
        services.wait_until_ready().boxed(),
    ] {
        tokio::select! {
            () = shutdown.cancelled() => return false,
            _ = heartbeat.idle(ready) => {}
        }
    }
    true
}

/// Whether the API server is at or above the version floor ([`crate::kube::version`]); below
/// it, says why and waits for shutdown ([`refuse_endpoints`]); false also on shutdown.
async fn above_floor(
    ctx: &Context,
    opts: &EndpointOptions,
    heartbeat: &Heartbeat,
    shutdown: &CancellationToken,
) -> bool {
    let version = tokio::select! {
        () = shutdown.cancelled() => return false,
        v = heartbeat.idle(crate::kube::version::read_and_check(&ctx.client)) => v,
    };
    match version {
        Ok(()) => true,
        Err(too_old) => {
            refuse_endpoints(ctx, opts, &too_old, heartbeat, shutdown).await;
            false
        }
    }
}

/// Below the version floor: says why (an error log, `/ready`, and a Warning Event on the
/// leader Lease from the leader), then waits for shutdown, managing no endpoint.
async fn refuse_endpoints(
    ctx: &Context,
    opts: &EndpointOptions,
    too_old: &crate::kube::version::TooOld,
    heartbeat: &Heartbeat,
    shutdown: &CancellationToken,
) {
    let why = too_old.to_string();
    tracing::error!("{why}");
    ctx.heartbeats.refuse(why.clone());
    let lease = super::context::object_ref(
        "coordination.k8s.io/v1",
        "Lease",
        Some(&opts.fip_table_namespace),
        &format!("{}-controller", ctx.config.prefix),
    );
    let mut leader = ctx.leader.clone();
    let mut told = false;
    loop {
        if !told && ctx.leader.is_leader() {
            told = true;
            ctx.event_on(
                &lease,
                None,
                EventType::Warning,
                "KubernetesTooOld",
                "Refuse",
                why.clone(),
            )
            .await;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = heartbeat.idle(leader.changed()) => {}
        }
    }
}
