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

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{IpAddress, IpList, IpType, Server, ServerId, each_ip};
use baton_core::failover::{
    Candidate, Decision, LastMove, Observation, Reason, avoid, decide, shared_failure_held, storm_held,
};
use baton_core::health::Health;
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::{TAKEOVER_MARGIN, object_ref};
use super::health::Heartbeat;
use super::mirror::{self, CONTROL_PLANE_ENDPOINT_ANNOTATION, MirrorSpec};
use super::trust::{EndpointPolicy, Refusal};
use super::watches::{Cache, Subset, Watches};
use super::{Context, LeaderGate, metrics::Metrics};
use crate::names::{
    CCM_MIRROR_SERVICE, FIP_HOLDER_ADDRESS_ANNOTATION, FIP_HOLDER_ANNOTATION, FIP_LAST_MOVE_ANNOTATION,
    FIP_TABLE_KEY, FipEntry, FipTable,
};
use crate::probe::{ProbeError, ProbeSettings, Prober};

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

/// Who the cloud routes a FIP to, as the endpoint Service's annotations tell the nodes
/// ([`FIP_HOLDER_ANNOTATION`], [`FIP_HOLDER_ADDRESS_ANNOTATION`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    /// The Node's name, else the server's hostname.
    name: String,
    /// The server's primary address.
    address: IpAddr,
}

impl Holder {
    /// The holder of `fip`, if it is routed to a server this loop knows.
    fn of(fip: &IpAddress, servers: &[Server], nodes: &[Arc<Node>]) -> Option<Self> {
        let id = fip.target()?;
        let server = servers.iter().find(|s| s.id == id)?;
        let address = server.first_ipv4(&IpType::PrimaryIp)?;
        let name = node_of(nodes, server).map_or_else(|| server.hostname.clone(), |n| n.name_any());
        Some(Self { name, address })
    }

    /// What `svc`'s annotations say now.
    fn annotated(svc: &Service) -> Option<Self> {
        let a = svc.metadata.annotations.as_ref()?;
        Some(Self {
            name: a.get(FIP_HOLDER_ANNOTATION)?.clone(),
            address: a.get(FIP_HOLDER_ADDRESS_ANNOTATION)?.parse().ok()?,
        })
    }
}

/// How long the FIP must fail while its holder answers directly before that is a reason to act.
const FIP_GRACE: Duration = Duration::from_millis(800);

/// After a move, a FIP that does not answer through the cloud's route (while its holder answers
/// directly) is not moved again at once: the route may still be propagating, or the path may be
/// broken only from this replica's vantage point, and moving would not mend it — it would move
/// the FIP every few hundred milliseconds. Any move holds such moves for [`HoldDown::SETTLE`];
/// a move *because* the FIP was unreachable holds them for [`HoldDown::BASE`], doubling with
/// each such move within [`HoldDown::MAX`] of the previous one, up to `MAX`. A holder that fails
/// its direct probes is moved at once, unless its failure began with the move to it
/// ([`storm_held`]).
///
/// Every replica keeps one per FIP, and they agree through the record of the last move on the
/// endpoint Service ([`MoveRecord`]): the replica that moves writes it, every replica takes in
/// a record newer than the last move it knows ([`HoldDown::seed`]).
#[derive(Debug, Default)]
struct HoldDown {
    until: Option<Instant>,
    /// The last move for an unreachable FIP, and the hold it started.
    last: Option<(Instant, Duration)>,
    /// The last move: when, from which server, to which.
    last_move: Option<(Instant, Option<u64>, u64)>,
    /// The record of the last move (its time, and the annotation's text): this replica's own
    /// after it moved, else the one read.
    record: Option<(Timestamp, String)>,
    /// Whether the current hold was already reported.
    reported: bool,
}

impl HoldDown {
    const SETTLE: Duration = Duration::from_secs(5);
    const BASE: Duration = Duration::from_secs(30);
    const MAX: Duration = Duration::from_secs(300);

    /// Records a move at `clocks` from `from` to `to` for `reason`, and the record every replica
    /// reads.
    fn moved(&mut self, clocks: Clocks, from: Option<u64>, to: u64, reason: Reason) {
        let now = clocks.now;
        let hold = if reason == Reason::FipUnreachable {
            let hold = match self.last {
                Some((at, prev)) if now.saturating_duration_since(at) < Self::MAX => {
                    (prev * 2).min(Self::MAX)
                }
                _ => Self::BASE,
            };
            self.last = Some((now, hold));
            hold
        } else {
            Self::SETTLE
        };
        let until = self.until.map_or(now + hold, |u| u.max(now + hold));
        self.until = Some(until);
        self.last_move = Some((now, from, to));
        self.reported = false;
        let record = MoveRecord {
            at: stamp(clocks.wall),
            from,
            to,
            reason: reason.as_str().to_owned(),
            hold_until: stamp(clocks.wall_of(until)),
            unreachable: self.last.map(|(at, hold)| UnreachableRecord {
                at: stamp(clocks.wall_of(at)),
                hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
            }),
        };
        self.record = serde_json::to_string(&record).ok().map(|raw| (clocks.wall, raw));
    }

    /// Takes in the record `raw` (read as `rec`) of a move, unless this replica already knows
    /// it or a later one: its hold, its doubling history and the move itself then count here as
    /// if this replica had made it. Times are converted through the wall clock (`clocks`); a
    /// time ahead of it (a clock skewed ahead) counts as now, and no hold reaches further than
    /// [`Self::MAX`] from now.
    fn seed(&mut self, clocks: Clocks, raw: &str, rec: &Recorded) {
        if self
            .record
            .as_ref()
            .is_some_and(|(at, known)| known == raw || *at >= rec.at)
        {
            return;
        }
        let now = clocks.now;
        self.last_move = clocks
            .instant_of(rec.at)
            .map(|at| (at.min(now), rec.from, rec.to));
        if let Some(until) = clocks.instant_of(rec.hold_until).map(|u| u.min(now + Self::MAX))
            && until > now
        {
            self.until = Some(self.until.map_or(until, |u| u.max(until)));
        }
        if let Some((at, hold)) = rec.unreachable
            && let Some(at) = clocks.instant_of(at).map(|at| at.min(now))
            && self.last.is_none_or(|(known, _)| known < at)
        {
            self.last = Some((at, hold.min(Self::MAX)));
        }
        self.reported = false;
        self.record = Some((rec.at, raw.to_owned()));
    }

    /// The last move, as the rules against ping-pong see it at `now`.
    fn last_move(&self, now: Instant) -> Option<LastMove> {
        self.last_move.map(|(at, from, to)| LastMove {
            from,
            to,
            ago: now.saturating_duration_since(at),
        })
    }

    /// The text [`FIP_LAST_MOVE_ANNOTATION`] should have, once this replica knows of a move.
    fn record_text(&self) -> Option<&str> {
        self.record.as_ref().map(|(_, raw)| raw.as_str())
    }

    /// Records that the FIP's route changed at `now` without this replica moving it. Until the
    /// nodes have learnt the new holder (its annotations), the FIP may not answer from every
    /// vantage point (the holder's own packets for its FIP need its agent's rule), so the change
    /// settles like any move.
    fn route_changed(&mut self, now: Instant) {
        let until = now + Self::SETTLE;
        if self.until.is_none_or(|u| u <= now) {
            self.reported = false;
        }
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
    }

    /// Whether a move for `reason` is held back at `now`.
    fn holds(&self, now: Instant, reason: Reason) -> bool {
        reason == Reason::FipUnreachable && self.until.is_some_and(|u| now < u)
    }
}

/// The last move of a FIP and the hold-down it started, as [`FIP_LAST_MOVE_ANNOTATION`] says it
/// (JSON; times RFC 3339 in UTC, to the millisecond).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MoveRecord {
    /// When the move was made.
    at: String,
    /// The server id it moved the FIP away from (absent: the FIP was unassigned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    from: Option<u64>,
    /// The server id it moved the FIP to.
    to: u64,
    /// Why (`HolderDown`, `FipUnreachable`, …: the Event's and the metrics' reason).
    reason: String,
    /// Until when a move of an unreachable FIP is held back.
    hold_until: String,
    /// The last move *because* the FIP was unreachable and the hold it started (the next such
    /// move within 5 minutes doubles it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unreachable: Option<UnreachableRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UnreachableRecord {
    at: String,
    hold_ms: u64,
}

/// A [`MoveRecord`] read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    at: Timestamp,
    from: Option<u64>,
    to: u64,
    hold_until: Timestamp,
    unreachable: Option<(Timestamp, Duration)>,
}

impl Recorded {
    /// Reads the annotation's text; the error names the field that is wrong.
    fn parse(raw: &str) -> Result<Self, String> {
        let rec: MoveRecord = serde_json::from_str(raw).map_err(|e| format!("not a move record: {e}"))?;
        let time = |field: &str, v: &str| {
            v.parse::<Timestamp>()
                .map_err(|e| format!("{field} {v:?} is no RFC 3339 time: {e}"))
        };
        Ok(Self {
            at: time("at", &rec.at)?,
            from: rec.from,
            to: rec.to,
            hold_until: time("holdUntil", &rec.hold_until)?,
            unreachable: match rec.unreachable {
                Some(u) => Some((time("unreachable.at", &u.at)?, Duration::from_millis(u.hold_ms))),
                None => None,
            },
        })
    }
}

/// A wall-clock time as the record writes it: RFC 3339, UTC, milliseconds.
fn stamp(t: Timestamp) -> String {
    format!(
        "{:.3}",
        t.round(k8s_openapi::jiff::Unit::Millisecond).unwrap_or(t)
    )
}

/// One moment on both clocks: the record's wall-clock times become this process's monotonic
/// ones through it (so another node's clock enters only as its skew from this one).
#[derive(Debug, Clone, Copy)]
struct Clocks {
    now: Instant,
    wall: Timestamp,
}

impl Clocks {
    fn now() -> Self {
        Self {
            now: Instant::now(),
            wall: Timestamp::now(),
        }
    }

    fn wall_of(self, t: Instant) -> Timestamp {
        let moved = if t >= self.now {
            self.wall.checked_add(t - self.now)
        } else {
            self.wall.checked_sub(self.now - t)
        };
        moved.unwrap_or(self.wall)
    }

    /// `None`: further in the past than this process's monotonic clock reaches.
    fn instant_of(self, t: Timestamp) -> Option<Instant> {
        let d = t.duration_since(self.wall);
        if d.is_negative() {
            self.now.checked_sub(d.unsigned_abs())
        } else {
            Some(self.now + d.unsigned_abs())
        }
    }
}

impl EndpointState {
    /// Reads the record of the FIP's last move on its Service (each text once): a move another
    /// replica made, a previous leader's hold, count here too. A garbled record is ignored (and
    /// logged once); the leader writes its own over it after its next move.
    fn read_record(&mut self, svc: &Service, clocks: Clocks, fip: IpAddr) {
        let Some(raw) = svc.annotations().get(FIP_LAST_MOVE_ANNOTATION) else {
            self.record_seen = None;
            return;
        };
        if self.record_seen.as_deref() == Some(raw.as_str()) {
            return;
        }
        self.record_seen = Some(raw.clone());
        match Recorded::parse(raw) {
            Ok(rec) => self.hold.seed(clocks, raw, &rec),
            Err(error) => {
                tracing::warn!(%fip, %error, annotation = FIP_LAST_MOVE_ANNOTATION, "ignoring the garbled record of the FIP's last move");
            }
        }
    }
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

    // Decide nothing before the first full lists: a half-filled store would look like a
    // vanished holder.
    for ready in [
        slices.wait_until_ready().boxed(),
        nodes.wait_until_ready().boxed(),
        all_services.wait_until_ready().boxed(),
    ] {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = heartbeat.idle(ready) => {}
        }
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
    let mut counted = Counted::default();
    let mut takeover = Takeover::default();
    let mut leader = ctx.leader.clone();
    let mut finalizer = Finalizer::default();
    let mut unknown_fips = UnknownFips::default();
    let (mut refusals, mut fip_table) = (Refusals::default(), FipTablePublisher::default());

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
    }
}

/// The Warning Events of refused control-plane endpoint Services ([`Refusal`]): one per
/// Service and refusal text, published by the leader beside the loop (never in its way).
#[derive(Default)]
struct Refusals {
    /// `namespace/name` → the refusal reported for it.
    reported: BTreeMap<String, String>,
}

impl Refusals {
    /// Reports each new refusal (leader only; a follower forgets: the next leader reports
    /// afresh).
    fn report(&mut self, ctx: &Context, refused: &[(Arc<Service>, Refusal)]) {
        if !ctx.leader.is_leader() {
            self.reported.clear();
            return;
        }
        let mut now = BTreeMap::new();
        for (svc, refusal) in refused {
            let (key, text) = (key_of(svc), refusal.to_string());
            if self.reported.get(&key) != Some(&text) {
                tracing::warn!(service = %key, reason = refusal.reason(), "{text}");
                let (ctx, svc, reason, note) = (ctx.clone(), Arc::clone(svc), refusal.reason(), text.clone());
                tokio::spawn(async move {
                    ctx.event(
                        &*svc,
                        EventType::Warning,
                        reason,
                        "AdmitControlPlaneEndpoint",
                        note,
                    )
                    .await;
                });
            }
            now.insert(key, text);
        }
        self.reported = now;
    }
}

fn key_of(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// The table the node agents read: every admitted endpoint's FIP, with the primary address of
/// the server the cloud routes it to (when that server is known).
fn fip_table_of(endpoints: &[EndpointRef], servers: &[Server], nodes: &[Arc<Node>]) -> FipTable {
    let rows: BTreeSet<FipEntry> = endpoints
        .iter()
        .map(|ep| FipEntry {
            address: ep.fip.address,
            holder: Holder::of(&ep.fip, servers, nodes).map(|h| h.address),
        })
        .collect();
    FipTable {
        fips: rows.into_iter().collect(),
    }
}

/// Writes the FIP table ConfigMap ([`crate::names::fip_table_name`]) when it changes, on a new
/// term, after a failed write (5 s later) and every [`Self::REPAIR`] (an edit is undone).
/// Leader only; the write runs beside the decision loop, one at a time.
#[derive(Default)]
struct FipTablePublisher {
    /// The table last written, and when.
    written: Option<(FipTable, Instant)>,
    running: Option<(FipTable, tokio::task::JoinHandle<bool>)>,
    retry_at: Option<Instant>,
}

impl FipTablePublisher {
    const REPAIR: Duration = Duration::from_secs(60);

    fn publish(&mut self, ctx: &Context, opts: &EndpointOptions, table: FipTable) {
        if let Some((_, task)) = &self.running {
            if !task.is_finished() {
                return;
            }
            if let Some((sent, task)) = self.running.take() {
                if task.now_or_never().and_then(Result::ok).unwrap_or(false) {
                    self.written = Some((sent, Instant::now()));
                } else {
                    self.retry_at = Some(Instant::now() + Duration::from_secs(5));
                }
            }
        }
        if !ctx.leader.is_leader() {
            // The next term writes afresh: another leader may have written since.
            self.written = None;
            return;
        }
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let current = self
            .written
            .as_ref()
            .is_some_and(|(t, at)| *t == table && at.elapsed() < Self::REPAIR);
        if current {
            return;
        }
        self.retry_at = None;
        let name = crate::names::fip_table_name(&ctx.config.prefix);
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(ctx.client.clone(), &opts.fip_table_namespace);
        let text = match serde_json::to_string(&table) {
            Ok(t) => t,
            Err(error) => {
                tracing::error!(%error, "encoding the FIP table failed");
                return;
            }
        };
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": opts.fip_table_namespace,
                "labels": {"app.kubernetes.io/managed-by": "baton"},
            },
            "data": {FIP_TABLE_KEY: text},
        });
        let fips = table.fips.len();
        let task = tokio::spawn(async move {
            let pp = kube::api::PatchParams::apply(super::FIELD_MANAGER).force();
            match super::kit::timed(
                format!("writing the FIP table ConfigMap {name}"),
                api.patch(&name, &pp, &kube::api::Patch::Apply(&body)),
            )
            .await
            {
                Ok(_) => {
                    tracing::debug!(fips, "FIP table written");
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "writing the FIP table for the node agents failed; again in 5 s");
                    false
                }
            }
        });
        self.running = Some((table, task));
    }
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

/// What the API server prober probes: every candidate, and each FIP unless `useHostIP`.
fn probe_targets(ctx: &Context, probe_addrs: &[SocketAddr], endpoints: &[EndpointRef]) -> Vec<SocketAddr> {
    let mut targets = probe_addrs.to_vec();
    if !ctx.config.health_check.use_host_ip {
        targets.extend(
            endpoints
                .iter()
                .map(|e| SocketAddr::new(e.fip.address, e.fip_port)),
        );
    }
    targets
}

/// The SNI routers' health, a signal of its own beside the API servers' (`sniRouterPort`): the
/// router on every candidate's address is probed with its own health check (a ClientHello for
/// `health.baton.invalid`, answered by the router itself), with the API servers' interval,
/// timeout and rise/fall. Off (`None` for every candidate) while the port is 0.
struct RouterProbes {
    port: u16,
    prober: Option<Prober>,
}

impl RouterProbes {
    fn new(port: u16, settings: &ProbeSettings) -> Self {
        let prober = (port != 0)
            .then(|| Prober::with_check(settings.clone(), Arc::new(()), crate::sni::health::router_check()));
        Self { port, prober }
    }

    fn is_on(&self) -> bool {
        self.prober.is_some()
    }

    /// Health changes (none when off: do not wait on it then).
    fn subscribe(&self) -> tokio::sync::watch::Receiver<BTreeMap<SocketAddr, Health>> {
        match &self.prober {
            Some(p) => p.subscribe(),
            None => tokio::sync::watch::channel(BTreeMap::new()).1,
        }
    }

    /// Probes the router on each candidate API server's address.
    fn follow(&mut self, candidates: &[SocketAddr]) -> Result<(), ProbeError> {
        let port = self.port;
        match &mut self.prober {
            Some(p) => p.set_targets(
                &candidates
                    .iter()
                    .map(|a| SocketAddr::new(a.ip(), port))
                    .collect::<Vec<_>>(),
            ),
            None => Ok(()),
        }
    }

    /// The router's health on `ip` (`None`: routers are not probed).
    fn health(&self, ip: IpAddr) -> Option<Health> {
        self.prober
            .as_ref()
            .map(|p| p.health(&SocketAddr::new(ip, self.port)))
    }
}

/// The project's servers, as the endpoint loop knows them: read at start, every
/// `servers_refresh` on the leader, and soon when an API server has no known server. Followers do
/// not poll it.
struct ServerList {
    servers: Vec<Server>,
    at: Option<Instant>,
    /// How long an API server address without a known server waits for the next list (5 s,
    /// doubling up to `servers_refresh`): an address that is no server of the project (a
    /// bootstrap host elsewhere) must not cost a list call every few seconds.
    unknown_wait: Duration,
}

impl Default for ServerList {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            at: None,
            unknown_wait: Self::UNKNOWN_FIRST_WAIT,
        }
    }
}

impl ServerList {
    const UNKNOWN_FIRST_WAIT: Duration = Duration::from_secs(5);

    async fn refresh(
        &mut self,
        opts: &EndpointOptions,
        api_servers: &[SocketAddr],
        leading: bool,
    ) -> &[Server] {
        let unknown = api_servers
            .iter()
            .any(|a| server_by_ip(&self.servers, a.ip()).is_none());
        if !unknown {
            self.unknown_wait = Self::UNKNOWN_FIRST_WAIT;
        }
        let due = self.at.is_none_or(|t| {
            (leading && t.elapsed() > opts.servers_refresh) || (unknown && t.elapsed() > self.unknown_wait)
        });
        if due {
            if self.at.is_some() && unknown {
                self.unknown_wait = (self.unknown_wait * 2).min(opts.servers_refresh);
            }
            // Urgent, like the move itself: a queue of Service FIP work must not delay failover;
            // and with a list to go on, a slow cloud holds the loop up at most a second.
            let read = opts.urgent_cloud.servers();
            let result = if self.servers.is_empty() {
                Some(read.await)
            } else {
                tokio::time::timeout(CloudView::READ_LIMIT, read).await.ok()
            };
            match result {
                Some(Ok(s)) => self.servers = s,
                Some(Err(error)) => tracing::warn!(%error, "listing servers failed"),
                None => tracing::warn!("listing servers is slow: going on with the last list"),
            }
            self.at = Some(Instant::now());
        }
        &self.servers
    }
}

/// A new leader must not act on a holder the previous leader changed a moment before it
/// stopped: the shared IP store makes the first read of a new term wait for a list fetched after
/// the previous holder stopped writing (`baton_cloud::Leadership`). That read costs a cloud round
/// trip (and a slot of the rate limit) on the failover path when the previous leader's node died.
/// So a follower makes it *before* it takes over: once the holder has not renewed for
/// `leaseRenewDeadline` + [`TAKEOVER_MARGIN`], the holder has stopped writing (its fence) and its
/// last writes have landed; the list read then is as good as one read at the takeover, 250 ms
/// later, and the store takes it for the new term. Without such a read (a graceful release, say),
/// the new leader's first read fetches the list.
#[derive(Default)]
struct Takeover {
    leading: bool,
    /// For which holder's stop the list was read ahead.
    prefetched: Option<Instant>,
}

impl Takeover {
    /// When to read the list ahead, if a takeover is coming and it has not been read for it.
    fn prefetch_at(&self, leader: &LeaderGate) -> Option<Instant> {
        let h = leader.handover()?;
        let at = h.holder_stopped + TAKEOVER_MARGIN;
        (!self.leading && at < h.takeover && self.prefetched != Some(h.holder_stopped)).then_some(at)
    }

    /// Follows leadership; returns whether the IP list is to be read now (ahead of a takeover).
    fn step(&mut self, ctx: &Context) -> bool {
        let mut read_now = false;
        let now_leading = ctx.leader.is_leader();
        if !now_leading
            && let Some(h) = ctx.leader.handover()
            && self
                .prefetch_at(&ctx.leader)
                .is_some_and(|at| Instant::now() >= at)
        {
            tracing::debug!("the leader has stopped renewing: reading the FIP list ahead of a takeover");
            ctx.cloud.invalidate_ips();
            read_now = true;
            self.prefetched = Some(h.holder_stopped);
        }
        if now_leading && !self.leading {
            self.prefetched = None;
        }
        self.leading = now_leading;
        read_now
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The last IP list read from the cloud, kept for decisions while the cloud cannot be read.
#[derive(Default)]
struct CloudView {
    last: Option<(IpList, Instant)>,
    failing_since: Option<Instant>,
    reported: bool,
}

impl CloudView {
    /// After this long without a successful read, the operator is told (Event, log).
    const REPORT_AFTER: Duration = Duration::from_secs(10);

    /// The last list read, if any.
    fn last_list(&self) -> Option<IpList> {
        self.last.as_ref().map(|(ips, _)| Arc::clone(ips))
    }

    fn read(&mut self, ips: &IpList, metrics: &Metrics) {
        if self.failing_since.take().is_some() {
            tracing::info!("the cloud API answers again");
            metrics.cloud_stale(false);
        }
        self.reported = false;
        self.last = Some((Arc::clone(ips), Instant::now()));
    }

    /// The list to go on after a failed read, if there is one.
    fn stale(&mut self, error: &baton_cloud::CloudError, metrics: &Metrics) -> Option<IpList> {
        if self.failing_since.is_none() {
            tracing::warn!(%error, "the cloud API cannot be read; deciding from the last IP list read");
            metrics.cloud_stale(true);
        }
        self.failing_since.get_or_insert_with(Instant::now);
        self.last.as_ref().map(|(ips, _)| Arc::clone(ips))
    }

    /// How long a read of the IP list may hold up the loop when an earlier list exists: a slow
    /// cloud (or a list fetch shared with a Service reconcile, retrying) must not delay a
    /// failover; the decision is made from the last list read, and the read is tried again on
    /// the next pass.
    const READ_LIMIT: Duration = Duration::from_secs(1);

    /// Reads the IP list, or falls back on the last one read (and tells the operator).
    async fn fetch(
        &mut self,
        ctx: &Context,
        metrics: &Metrics,
        services: &[Arc<Service>],
        api_servers: &[SocketAddr],
    ) -> Option<IpList> {
        let read = ctx.cloud.ips();
        let result = if self.last.is_some() {
            if let Ok(result) = tokio::time::timeout(Self::READ_LIMIT, read).await {
                result
            } else {
                tracing::debug!(
                    limit_ms = Self::READ_LIMIT.as_millis(),
                    "the IP list read is slow: deciding from the last list read"
                );
                return self.last_list();
            }
        } else {
            read.await
        };
        let error = match result {
            Ok(ips) => {
                self.read(&ips, metrics);
                return Some(ips);
            }
            Err(error) => error,
        };
        let Some(ips) = self.stale(&error, metrics) else {
            tracing::warn!(%error, "listing IPs failed (no earlier list to go on)");
            return None;
        };
        if self.should_report() && ctx.leader.is_leader() {
            self.reported = true;
            for ep in discover(ctx, services, &ips, api_servers).0 {
                if let Some(svc) = service_of(services, &ep.service) {
                    ctx.event(
                        &*svc,
                        EventType::Warning,
                        "CloudUnavailable",
                        "Failover",
                        format!(
                            "the cloud API cannot be read ({}); deciding from the IP list read {} s ago",
                            error.category(),
                            self.age_secs()
                        ),
                    )
                    .await;
                }
            }
        }
        Some(ips)
    }

    fn should_report(&self) -> bool {
        !self.reported
            && self
                .failing_since
                .is_some_and(|t| t.elapsed() >= Self::REPORT_AFTER)
    }

    fn age_secs(&self) -> u64 {
        self.last.as_ref().map_or(0, |(_, at)| at.elapsed().as_secs())
    }

    /// A move this replica made: its own list must not show the old holder any more.
    fn moved(&mut self, ip: IpAddress) {
        if let Some((ips, _)) = self.last.as_mut() {
            let list = Arc::make_mut(ips);
            if let Some(entry) = list.iter_mut().find(|i| i.id == ip.id) {
                *entry = Arc::new(ip);
            }
        }
    }
}

/// What one endpoint's decision goes on.
struct Observed {
    obs: Observation,
    /// The last move of its FIP (this replica's or recorded by another).
    last_move: Option<LastMove>,
    /// How long the holder has failed its direct probes (zero: it does not).
    holder_failing_for: Duration,
}

/// What handling one endpoint did.
#[derive(Debug, Default)]
struct Outcome {
    /// The FIP as the cloud answered a move of it.
    moved: Option<IpAddress>,
    /// Run the loop again at once.
    again: bool,
}

/// One iteration's view, shared by the endpoints handled in it.
struct Step<'a> {
    ctx: &'a Context,
    opts: &'a EndpointOptions,
    metrics: &'a Metrics,
    services: &'a [Arc<Service>],
    candidates: &'a [(Candidate, SocketAddr)],
    api_servers: &'a [SocketAddr],
    servers: &'a [Server],
    nodes: &'a [Arc<Node>],
}

impl Step<'_> {
    /// Nothing moved, and the loop should run again at once (with a fresh FIP list).
    const AGAIN: Outcome = Outcome {
        moved: None,
        again: true,
    };

    /// Handles every endpoint; returns whether the loop should run again at once.
    async fn all(
        &self,
        endpoints: &[EndpointRef],
        states: &mut BTreeMap<String, EndpointState>,
        prober: &mut Prober,
        cloud_view: &mut CloudView,
    ) -> Result<bool, EndpointError> {
        let mut again = false;
        for ep in endpoints {
            let state = states.entry(ep.fip.id.as_str().to_owned()).or_default();
            let outcome = self.endpoint(ep, state, prober).await?;
            if let Some(moved) = outcome.moved {
                cloud_view.moved(moved);
            }
            again |= outcome.again;
        }
        Ok(again)
    }

    /// What `decide` and the rules against ping-pong go on for one endpoint, after reading the
    /// record of its last move on its Service (another replica's, a previous leader's, holds
    /// here too).
    fn observe(
        &self,
        ep: &EndpointRef,
        state: &mut EndpointState,
        prober: &Prober,
        clocks: Clocks,
    ) -> Observed {
        if let Some(svc) = service_of(self.services, &ep.service) {
            state.read_record(&svc, clocks, ep.fip.address);
        }
        let holder = ep.fip.target().map(|s| s.0);
        let last_move = state.hold.last_move(clocks.now);
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let obs = Observation {
            holder,
            via_fip: if self.ctx.config.health_check.use_host_ip {
                Health::Unknown
            } else {
                prober.health(&fip_target)
            },
            candidates: self.candidates.iter().map(|(c, _)| c.clone()).collect(),
            left: avoid(last_move.as_ref(), holder),
        };
        let holder_failing_for = holder
            .and_then(|h| self.probed_at(h))
            .and_then(|a| prober.failing_since(a))
            .map_or(Duration::ZERO, |t| clocks.now.saturating_duration_since(t));
        Observed {
            obs,
            last_move,
            holder_failing_for,
        }
    }

    /// The address candidate `server` is probed at.
    fn probed_at(&self, server: u64) -> Option<&SocketAddr> {
        self.candidates
            .iter()
            .find(|(c, _)| c.server_id == server)
            .map(|(_, a)| a)
    }

    /// Why a move `decision` makes waits, if it does (the rules against moving too soon), on
    /// what this pass observed.
    fn held(
        &self,
        state: &EndpointState,
        clocks: Clocks,
        decision: &Decision,
        seen: &Observed,
        prober: &Prober,
    ) -> Option<&'static str> {
        let Decision::Move { to, reason } = *decision else {
            return None;
        };
        let (holder, holder_failing_for) = (seen.obs.holder, seen.holder_failing_for);
        if state.hold.holds(clocks.now, reason) {
            return Some(
                "the FIP does not answer through its route but moved recently; holding it where it is",
            );
        }
        if storm_held(seen.last_move.as_ref(), holder, reason, holder_failing_for) {
            return Some(
                "the FIP's new holder fails its probes since the FIP moved to it; moving it only if that lasts",
            );
        }
        let target_ok_for = self
            .probed_at(to)
            .and_then(|a| prober.last_failure(a))
            .map(|t| clocks.now.saturating_duration_since(t));
        shared_failure_held(reason, holder_failing_for, target_ok_for).then_some(
            "the FIP's holder failed its probes, but so did the other servers until a moment ago (a shared failure, e.g. etcd), or it answers again; moving it only if the holder goes on failing alone",
        )
    }

    /// Decides and acts for one endpoint, then keeps its Service's status and endpoints current.
    async fn endpoint(
        &self,
        ep: &EndpointRef,
        ep_state: &mut EndpointState,
        prober: &mut Prober,
    ) -> Result<Outcome, EndpointError> {
        let Self { ctx, metrics, .. } = *self;
        let state = ep_state;
        let clocks = Clocks::now();
        let seen = self.observe(ep, state, prober, clocks);
        let obs = &seen.obs;
        // A route that changed since the previous pass (a move by someone else, seen in a
        // fresh list) starts a new episode, and settles before "unreachable" means anything.
        if state.seen && state.seen_holder != obs.holder {
            state.hold.route_changed(Instant::now());
            state.unreachable_since = None;
            state.route_checked = false;
        }
        (state.seen, state.seen_holder) = (true, obs.holder);
        let decision = decide(obs);
        let held = self.held(state, clocks, &decision, &seen, prober);
        let mut moved = None;
        if !matches!(
            decision,
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            }
        ) {
            state.unreachable_since = None;
        }
        match decision {
            Decision::Keep => {
                state.down_since = None;
                state.stuck_reported = false;
                state.route_checked = false;
            }
            // The FIP does not answer but the holder we know of does. A holder that is failing
            // often fails through the FIP a probe earlier than directly: give it a moment to
            // show as down (then it moves at once, for that reason).
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            } if state.unreachable_since.get_or_insert_with(Instant::now).elapsed() < FIP_GRACE => {}
            // Still so: first make sure we know the holder (someone may have moved the FIP since
            // the list was read), once per episode.
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            } if !state.route_checked => {
                state.route_checked = true;
                ctx.cloud.invalidate_ips();
                tracing::debug!(fip = %ep.fip.address, "the FIP does not answer through its route: reading its holder afresh");
                return Ok(Step::AGAIN);
            }
            Decision::Stuck { reason } => {
                state.down_since.get_or_insert_with(Instant::now);
                if !state.stuck_reported && ctx.leader.is_leader() {
                    state.stuck_reported = true;
                    metrics.stuck(reason.as_str());
                    tracing::warn!(fip = %ep.fip.address, reason = reason.as_str(), "no healthy control-plane server to move the FIP to");
                    if let Some(svc) = service_of(self.services, &ep.service) {
                        ctx.event(
                            &*svc,
                            EventType::Warning,
                            "NoHealthyControlPlane",
                            "Failover",
                            if reason == Reason::RouterDown {
                                format!("FIP {} should move ({}) but no other control-plane node's API server and SNI router are both healthy; keeping it", ep.fip.address, reason.as_str())
                            } else {
                                format!("FIP {} should move ({}) but no control-plane API server is healthy; keeping it", ep.fip.address, reason.as_str())
                            },
                        )
                        .await;
                    }
                }
            }
            // Held: by the hold-down; or the holder the FIP just moved to fails from the moment
            // it got it (the reconnect storm the move sent there may pass, it moves if it
            // lasts); or the target failed too while the holder was failing (it moves if the
            // holder goes on failing alone).
            Decision::Move { reason, .. } if held.is_some() => {
                if !state.hold.reported && ctx.leader.is_leader() {
                    state.hold.reported = true;
                    metrics.failover_held();
                    tracing::warn!(fip = %ep.fip.address, reason = reason.as_str(), failing_ms = seen.holder_failing_for.as_millis(), "{}", held.unwrap_or_default());
                }
            }
            Decision::Move { to, reason } => {
                // Only the current lease holder writes to the cloud; the cloud client's fence
                // checks again right before the request leaves.
                if !ctx.leader.is_leader() {
                    return Ok(Outcome::default());
                }
                moved = self.move_fip(ep, state, prober, to, reason).await?;
                state.route_checked = false;
            }
        }
        self.keep_status(ep, state).await;
        if moved.is_none() {
            self.keep_holder(ep, state);
        }
        Ok(Outcome { moved, again: false })
    }

    /// Tells the nodes who holds the FIP: the endpoint Service's holder annotations, written
    /// when they differ from the cloud's `targeted_to` (after a move, on a new term, after an
    /// edit); and tells the other replicas of the last move and its hold-down
    /// ([`FIP_LAST_MOVE_ANNOTATION`]) when this replica knows a later one than the Service says.
    /// Leader only; the write runs beside the decision loop, never in its way (a failed one is
    /// made again 5 s later).
    fn keep_holder(&self, ep: &EndpointRef, state: &mut EndpointState) {
        let ctx = self.ctx;
        if let Some((_, task)) = &state.holder_write {
            if !task.is_finished() {
                return;
            }
            if let Some((holder, task)) = state.holder_write.take()
                && !task.now_or_never().and_then(Result::ok).unwrap_or(false)
            {
                tracing::debug!(fip = %ep.fip.address, holder = %holder.name, "writing the FIP holder annotations failed");
                state.holder_retry_at = Some(Instant::now() + Duration::from_secs(5));
            }
        }
        if !ctx.leader.is_leader() || state.holder_retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let Some(svc) = service_of(self.services, &ep.service) else {
            return;
        };
        let want = Holder::of(&ep.fip, self.servers, self.nodes);
        // The record of the last move, when this replica knows a later one than the Service
        // says (its own move; or the Service's is garbled).
        let record = state
            .hold
            .record_text()
            .filter(|r| {
                svc.annotations()
                    .get(FIP_LAST_MOVE_ANNOTATION)
                    .map(String::as_str)
                    != Some(*r)
            })
            .map(str::to_owned);
        if Holder::annotated(&svc) == want && record.is_none() {
            return;
        }
        let mut annotations = serde_json::json!({
            FIP_HOLDER_ANNOTATION: want.as_ref().map(|h| h.name.clone()),
            FIP_HOLDER_ADDRESS_ANNOTATION: want.as_ref().map(|h| h.address.to_string()),
        });
        if let Some(record) = record {
            annotations[FIP_LAST_MOVE_ANNOTATION] = record.into();
        }
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let api: kube::Api<Service> = kube::Api::namespaced(ctx.client.clone(), &ep.service.namespace);
        let name = ep.service.name.clone();
        let fip = ep.fip.address;
        let task = tokio::spawn(async move {
            let pp = kube::api::PatchParams {
                field_manager: Some(super::FIELD_MANAGER.to_owned()),
                ..kube::api::PatchParams::default()
            };
            match super::kit::timed(
                format!("annotating the FIP holder on Service {name}"),
                api.patch(&name, &pp, &kube::api::Patch::Merge(&patch)),
            )
            .await
            {
                Ok(_) => true,
                Err(error) => {
                    tracing::warn!(%error, %fip, "writing the FIP holder annotations failed");
                    false
                }
            }
        });
        state.holder_retry_at = None;
        state.holder_write = Some((
            want.unwrap_or(Holder {
                name: String::new(),
                address: IpAddr::from([0, 0, 0, 0]),
            }),
            task,
        ));
    }

    /// Status (ingress, ipMode Proxy) and mirrored endpoints, when their inputs change (and
    /// every 30 s, to repair edits). Leader only.
    async fn keep_status(&self, ep: &EndpointRef, state: &mut EndpointState) {
        let ctx = self.ctx;
        let inputs = (
            ep.service.clone(),
            self.api_servers.iter().copied().collect::<BTreeSet<_>>(),
        );
        let outdated = state.last_applied.as_ref() != Some(&inputs)
            || state
                .last_applied_at
                .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let backing_off = state.retry_at.is_some_and(|t| Instant::now() < t);
        if outdated && !backing_off && ctx.leader.is_leader() {
            let changed = state.last_applied.as_ref() != Some(&inputs);
            let reference = object_ref("v1", "Service", Some(&ep.service.namespace), &ep.service.name);
            match mirror::reconcile(&ctx.client, &ep.service).await {
                Ok(()) => {
                    ctx.metrics.reconciled("endpoints");
                    if changed {
                        let servers: Vec<String> = inputs.1.iter().map(ToString::to_string).collect();
                        ctx.event_on(
                            &reference,
                            None,
                            EventType::Normal,
                            "EndpointsUpdated",
                            "UpdateEndpoints",
                            format!("ingress {}, endpoints {}", ep.fip.address, servers.join(", ")),
                        )
                        .await;
                    }
                    state.last_applied = Some(inputs);
                    state.last_applied_at = Some(Instant::now());
                    state.retry_at = None;
                    // Looked for each time the mirror is re-applied (every 30 s at most): a
                    // cloud-provider-cherry still running during a switch may recreate it.
                    if ep.service.manage_spec {
                        match mirror::remove_ccm_leftover(&ctx.client, &ep.service).await {
                            Ok(false) => {}
                            Ok(true) => {
                                let removed =
                                    object_ref("v1", "Service", Some("kube-system"), CCM_MIRROR_SERVICE);
                                ctx.event_on(
                                    &reference,
                                    Some(removed),
                                    EventType::Normal,
                                    "LeftoverRemoved",
                                    "RemoveLeftover",
                                    format!(
                                        "removed cloud-provider-cherry's mirror Service kube-system/{CCM_MIRROR_SERVICE} \
                                         of {}; this Service replaces it, the FIP stays where it is",
                                        ep.fip.address
                                    ),
                                )
                                .await;
                            }
                            Err(error) => {
                                tracing::warn!(%error, "removing cloud-provider-cherry's leftover mirror Service failed");
                            }
                        }
                    }
                }
                Err(error) => {
                    ctx.metrics.reconcile_failed("endpoints", error.category());
                    if state.retry_at.is_none() {
                        ctx.event_on(
                            &reference,
                            None,
                            EventType::Warning,
                            "EndpointsUpdateFailed",
                            "UpdateEndpoints",
                            error.to_string(),
                        )
                        .await;
                    }
                    state.retry_at = Some(Instant::now() + Duration::from_secs(5));
                    tracing::warn!(%error, service = %ep.service.name, "updating the endpoint Service failed");
                }
            }
        }
    }

    /// Retargets the FIP to `to` in one call (urgent priority), reads it back, and reports.
    async fn move_fip(
        &self,
        ep: &EndpointRef,
        state: &mut EndpointState,
        prober: &mut Prober,
        to: u64,
        reason: Reason,
    ) -> Result<Option<IpAddress>, EndpointError> {
        let Self {
            ctx,
            opts,
            metrics,
            candidates,
            ..
        } = *self;
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let from = ep.fip.target();
        // The episode began with the first failed probe of the holder (or through the FIP),
        // not with this decision: that is what a client saw.
        let holder_addr = from.and_then(|h| {
            candidates
                .iter()
                .find(|(c, _)| c.server_id == h.0)
                .map(|(_, a)| *a)
        });
        let since = [
            state.down_since,
            holder_addr.and_then(|a| prober.failing_since(&a)),
            prober.failing_since(&fip_target),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(Instant::now);
        state.down_since.get_or_insert(since);
        tracing::info!(fip = %ep.fip.address, ?from, to, reason = reason.as_str(), "moving the control-plane FIP");
        let moved = match opts.urgent_cloud.retarget_ip(&ep.fip.id, ServerId(to)).await {
            Ok(ip) => {
                let recovered = since.elapsed();
                metrics.failover(reason.as_str(), recovered);
                state.down_since = None;
                state.stuck_reported = false;
                state.hold.moved(Clocks::now(), from.map(|s| s.0), to, reason);
                (state.seen, state.seen_holder) = (true, ip.target().map(|s| s.0));
                // The FIP's probe history belongs to the old holder: start afresh.
                prober.reset(&fip_target)?;
                let confirmed = ip.target() == Some(ServerId(to));
                tracing::info!(fip = %ep.fip.address, to, confirmed, recovered_ms = recovered.as_millis(), "control-plane FIP moved");
                Some(ip)
            }
            Err(error) if error.is_fenced() => {
                metrics.failover_fenced();
                tracing::warn!(%error, fip = %ep.fip.address, to, "not moving the FIP: this replica's leadership ended first");
                None
            }
            Err(error) => {
                metrics.failover_error();
                tracing::warn!(%error, fip = %ep.fip.address, to, "retargeting the FIP failed");
                None
            }
        };
        let result = moved.clone();
        let moved = moved.is_some();
        // The Event and the read-back run aside, the read-back at normal priority: another FIP
        // on the same failed holder must not wait for them (the Event may go through a
        // failing-over API client; the read-back would take the next urgent slot).
        let to_name = candidates
            .iter()
            .find(|(c, _)| c.server_id == to)
            .map_or_else(|| "?".to_owned(), |(c, _)| c.node.clone());
        let service = service_of(self.services, &ep.service);
        let (ctx, cloud, fip) = (ctx.clone(), Arc::clone(&ctx.cloud), ep.fip.clone());
        tokio::spawn(async move {
            if moved && let Some(svc) = service {
                // The node it moved to is the Event's related object: repeated moves to other
                // nodes are separate Events, not one series with the first move's note.
                let node = object_ref("v1", "Node", None, &to_name);
                ctx.event_related(
                    &*svc,
                    Some(node),
                    EventType::Normal,
                    "FloatingIPMoved",
                    "Failover",
                    format!(
                        "moved FIP {} from server {} to {to_name} (server {to}): {}",
                        fip.address,
                        from.map_or_else(|| "none".to_owned(), |s| s.to_string()),
                        reason.as_str()
                    ),
                )
                .await;
            }
            // Read back what the cloud now says (the write's own response already did once).
            match cloud.ip(&fip.id).await {
                Ok(ip) if ip.target() == Some(ServerId(to)) => {}
                Ok(ip) => {
                    tracing::warn!(fip = %fip.address, to, now = ?ip.target(), "the FIP is not where it was moved");
                }
                Err(error) => tracing::debug!(%error, "reading the FIP back failed"),
            }
        });
        Ok(result)
    }
}

/// The API servers listed by `default/kubernetes` (ready or without conditions), as address:port.
fn api_server_addresses(slices: &[Arc<EndpointSlice>]) -> Vec<SocketAddr> {
    let mut out = BTreeSet::new();
    for s in slices {
        let Some(port) = s
            .ports
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for e in &s.endpoints {
            if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    out.insert(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The API servers default/kubernetes lists, plus every FIP holder: a holder missing from that
/// list (not yet added, or just removed) is probed directly rather than presumed gone.
fn probe_addresses(
    api_servers: &[SocketAddr],
    endpoints: &[EndpointRef],
    servers: &[Server],
) -> Vec<SocketAddr> {
    let api_port = api_servers.first().map_or(6443, SocketAddr::port);
    let mut out = api_servers.to_vec();
    for ep in endpoints {
        if let Some(holder) = ep.fip.target()
            && let Some(server) = servers.iter().find(|s| s.id == holder)
            && let Some(ip) = server.first_ipv4(&IpType::PrimaryIp)
            && !out
                .iter()
                .any(|a| server_by_ip(servers, a.ip()).is_some_and(|s| s.id == holder))
        {
            out.push(SocketAddr::new(ip, api_port));
        }
    }
    out
}

/// The candidates behind the probed API server addresses: their server (by IP) and Node (by
/// provider ID, or hostname before it is initialised), with current health.
///
/// Once any of these servers is a registered Node, only servers that are Nodes stay candidates:
/// an API server without a Node is the bootstrap host (it serves only until the handoff), so the
/// FIP is never moved there, and a FIP that is there is moved to a Node ([`Reason::HolderGone`]).
/// Before any kubelet has registered, every listed API server is a candidate.
///
/// [`Reason::HolderGone`]: baton_core::failover::Reason::HolderGone
fn candidates(
    addrs: &[SocketAddr],
    servers: &[Server],
    nodes: &[Arc<Node>],
    prober: &Prober,
    routers: &RouterProbes,
) -> Vec<(Candidate, SocketAddr)> {
    let backed: Vec<(SocketAddr, &Server, Option<&Arc<Node>>)> = addrs
        .iter()
        .filter_map(|addr| {
            let server = server_by_ip(servers, addr.ip())?;
            Some((*addr, server, node_of(nodes, server)))
        })
        .collect();
    let any_node = backed.iter().any(|(_, _, node)| node.is_some());
    backed
        .into_iter()
        .filter(|(_, _, node)| node.is_some() || !any_node)
        .map(|(addr, server, node)| {
            let candidate = Candidate {
                server_id: server.id.0,
                node: node.map_or_else(|| server.hostname.clone(), |n| n.name_any()),
                health: prober.health(&addr),
                schedulable: !node
                    .and_then(|n| n.spec.as_ref())
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                deleting: node.is_some_and(|n| n.metadata.deletion_timestamp.is_some()),
                router: routers.health(addr.ip()),
            };
            (candidate, addr)
        })
        .collect()
}

/// The Node of `server`: by provider ID, or (not yet initialised) by name = hostname, as the
/// node controller matches them.
fn node_of<'a>(nodes: &'a [Arc<Node>], server: &Server) -> Option<&'a Arc<Node>> {
    let provider_id = server.provider_id();
    nodes
        .iter()
        .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(&provider_id))
        .or_else(|| {
            nodes.iter().find(|n| {
                n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_none()
                    && !server.hostname.is_empty()
                    && n.metadata.name.as_deref() == Some(server.hostname.as_str())
            })
        })
}

fn server_by_ip(servers: &[Server], ip: IpAddr) -> Option<&Server> {
    servers.iter().find(|s| {
        s.ip_addresses
            .iter()
            .any(|a| a.address == ip && matches!(a.ip_type, IpType::PrimaryIp | IpType::PrivateIp))
    })
}

/// The `loadBalancerIP`s of live annotated endpoint Services that are no FIP in `ips`.
fn unknown_endpoint_ips<B: Borrow<IpAddress>>(
    policy: &EndpointPolicy,
    services: &[Arc<Service>],
    ips: &[B],
) -> BTreeSet<IpAddr> {
    services
        .iter()
        .filter(|s| {
            s.metadata.deletion_timestamp.is_none()
                && policy.allows_namespace(s.metadata.namespace.as_deref().unwrap_or_default())
                && s.annotations()
                    .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
                    .is_some_and(|v| v == "true")
        })
        .filter_map(|s| lb_ip(s))
        .filter(|ip| !each_ip(ips).any(|f| f.address == *ip && f.ip_type == IpType::FloatingIp))
        .collect()
}

/// When to read the IP list again for endpoint addresses it does not show: at once when the set
/// of unknown addresses changes, then after [`Self::FIRST_WAIT`], doubling up to [`Self::MAX_WAIT`].
#[derive(Debug)]
struct UnknownFips {
    last: BTreeSet<IpAddr>,
    at: Option<Instant>,
    wait: Duration,
}

impl Default for UnknownFips {
    fn default() -> Self {
        Self {
            last: BTreeSet::new(),
            at: None,
            wait: Self::FIRST_WAIT,
        }
    }
}

impl UnknownFips {
    const FIRST_WAIT: Duration = Duration::from_secs(5);
    const MAX_WAIT: Duration = Duration::from_secs(600);

    /// Whether the list should be read again now, given the addresses it does not show.
    fn due(&mut self, unknown: &BTreeSet<IpAddr>) -> bool {
        if unknown.is_empty() {
            *self = Self::default();
            return false;
        }
        let now = Instant::now();
        if !unknown.is_subset(&self.last) {
            self.last.clone_from(unknown);
            self.at = Some(now);
            self.wait = Self::FIRST_WAIT;
            return true;
        }
        self.last.clone_from(unknown);
        match self.at {
            Some(at) if now.duration_since(at) < self.wait => false,
            _ => {
                self.at = Some(now);
                self.wait = (self.wait * 2).min(Self::MAX_WAIT);
                true
            }
        }
    }
}

/// The finalizer that keeps an annotated control-plane endpoint Service until its FIP is
/// unassigned (DESIGN.md: deleting the Service stops routing the FIP, never deletes it).
pub const ENDPOINT_FINALIZER: &str = "baton.dev/control-plane-fip";

/// A finalizer write for a control-plane endpoint Service.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FinalizerStep {
    /// Add the finalizer (a live endpoint whose `loadBalancerIP` is a FIP of the project).
    Add {
        namespace: String,
        name: String,
        version: String,
    },
    /// The Service is being deleted: unassign its FIP (`Some(id)`: still routed, no other
    /// endpoint uses it, not the `fipTag` FIP), then remove the finalizer.
    Release {
        namespace: String,
        name: String,
        version: String,
        unassign: Option<Box<IpAddress>>,
    },
}

fn lb_ip(svc: &Service) -> Option<IpAddr> {
    svc.spec
        .as_ref()?
        .load_balancer_ip
        .as_deref()
        .and_then(|v| v.trim().parse().ok())
}

/// The finalizer writes for the control-plane endpoint Services (annotated, not the mirror):
/// add it to live ones whose `loadBalancerIP` is a FIP of the project; on deletion unassign the
/// FIP unless it is the `fipTag` FIP or another live endpoint Service (the mirror included) uses
/// it. The FIP itself is never deleted: it belongs to whoever reserved it.
fn finalizer_plan<B: Borrow<IpAddress>>(
    services: &[Arc<Service>],
    ips: &[B],
    policy: &EndpointPolicy,
    mirror_name: &str,
) -> Vec<FinalizerStep> {
    let is_mirror =
        |s: &Service| s.namespace().as_deref() == Some("kube-system") && s.name_any() == mirror_name;
    let annotated = |s: &Service| {
        s.annotations()
            .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
            .is_some_and(|v| v == "true")
    };
    // Only an endpoint the policy admits (an allowed namespace, this cluster's FIP) gets the
    // finalizer, and only such a one's FIP is unassigned when it goes: a refused Service never
    // causes a cloud call, also when it carries the finalizer from an earlier version.
    let admitted = |s: &Service| {
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        lb_ip(s).and_then(|ip| policy.admit(ns, ip, each_ip(ips)).ok())
    };
    let mut out = Vec::new();
    for svc in services {
        let has = svc.finalizers().iter().any(|f| f == ENDPOINT_FINALIZER);
        let deleting = svc.metadata.deletion_timestamp.is_some();
        let namespace = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let version = svc.resource_version().unwrap_or_default();
        if is_mirror(svc) || (!annotated(svc) && !has) {
            continue;
        }
        if !deleting {
            if !has && admitted(svc).is_some() {
                out.push(FinalizerStep::Add {
                    namespace,
                    name,
                    version,
                });
            }
            continue;
        }
        if !has {
            continue;
        }
        let unassign = admitted(svc).filter(|fip| {
            let tagged = policy
                .fip_tag
                .as_ref()
                .is_some_and(|t| t.matches(fip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
            let shared = services.iter().any(|o| {
                !Arc::ptr_eq(o, svc)
                    && o.metadata.deletion_timestamp.is_none()
                    && (annotated(o) || is_mirror(o))
                    && lb_ip(o) == Some(fip.address)
            });
            fip.target().is_some() && !tagged && !shared
        });
        out.push(FinalizerStep::Release {
            namespace,
            name,
            version,
            unassign: unassign.cloned().map(Box::new),
        });
    }
    out
}

/// Carries out [`finalizer_plan`] (leader only). Failures are logged and tried again on a later
/// iteration; the FIP is unassigned before the finalizer goes, so a crash in between repeats a
/// harmless unassign.
/// The finalizer passes over the endpoint Services, run aside of the decision loop (one at a
/// time): their cloud and API calls never hold up a failover decision.
#[derive(Default)]
struct Finalizer {
    /// The resourceVersion each finalizer write was last made for (no repeat before the watch
    /// shows its result).
    done: Arc<tokio::sync::Mutex<BTreeMap<String, String>>>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Finalizer {
    /// Starts a pass on this view unless one is still running.
    fn start(&mut self, ctx: &Context, services: &[Arc<Service>], ips: &IpList, mirror_name: &str) {
        if self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (ctx, services, ips) = (ctx.clone(), services.to_vec(), Arc::clone(ips));
        let (mirror_name, done) = (mirror_name.to_owned(), Arc::clone(&self.done));
        self.running = Some(tokio::spawn(async move {
            finalize(&ctx, &services, &ips, &mirror_name, &mut *done.lock().await).await;
        }));
    }
}

async fn finalize(
    ctx: &Context,
    services: &[Arc<Service>],
    ips: &[Arc<IpAddress>],
    mirror_name: &str,
    done: &mut BTreeMap<String, String>,
) {
    let plan = finalizer_plan(services, ips, &ctx.endpoints.current(), mirror_name);
    done.retain(|key, _| {
        plan.iter().any(|step| match step {
            FinalizerStep::Add { namespace, name, .. } | FinalizerStep::Release { namespace, name, .. } => {
                *key == format!("{namespace}/{name}")
            }
        })
    });
    for step in plan {
        let (FinalizerStep::Add {
            namespace,
            name,
            version,
        }
        | FinalizerStep::Release {
            namespace,
            name,
            version,
            ..
        }) = &step;
        let key = format!("{namespace}/{name}");
        if done.get(&key) == Some(version) || !ctx.leader.is_leader() {
            continue;
        }
        let api: kube::Api<Service> = kube::Api::namespaced(ctx.client.clone(), namespace);
        let Some(svc) = services
            .iter()
            .find(|s| s.namespace().as_deref() == Some(namespace.as_str()) && s.name_any() == *name)
        else {
            continue;
        };
        let mut finalizers: Vec<String> = svc.finalizers().to_vec();
        if let FinalizerStep::Release {
            unassign: Some(fip), ..
        } = &step
        {
            match ctx.cloud.unassign_ip(&fip.id).await {
                Ok(_) => {
                    tracing::info!(service = %key, fip = %fip.address, "control-plane endpoint Service deleted: its Floating IP is unassigned (kept reserved)");
                    ctx.event(
                        &**svc,
                        EventType::Normal,
                        "FloatingIPUnassigned",
                        "ReleaseControlPlaneEndpoint",
                        format!(
                            "the Service is being deleted: Floating IP {} ({}) no longer routed to a server; the reservation is kept",
                            fip.address, fip.id
                        ),
                    )
                    .await;
                }
                Err(e) if e.is_not_found() => {}
                Err(error) => {
                    tracing::warn!(%error, service = %key, fip = %fip.address, "unassigning the Floating IP of a deleted control-plane endpoint failed");
                    continue;
                }
            }
        }
        match &step {
            FinalizerStep::Add { .. } => finalizers.push(ENDPOINT_FINALIZER.to_owned()),
            FinalizerStep::Release { .. } => finalizers.retain(|f| f != ENDPOINT_FINALIZER),
        }
        // resourceVersion makes the patch conditional on the list it was computed from.
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers, "resourceVersion": version}});
        let pp = kube::api::PatchParams::default();
        match super::kit::timed(
            format!("updating the finalizers of Service {key}"),
            api.patch(name, &pp, &kube::api::Patch::Merge(&patch)),
        )
        .await
        {
            Ok(_) => {
                done.insert(key, version.clone());
            }
            Err(error) => {
                tracing::debug!(%error, service = %key, "finalizer write failed; tried again later");
            }
        }
    }
}

/// The Services that can be control-plane endpoints: the mirror Service and every Service
/// annotated as one.
fn endpoint_services(services: &[Arc<Service>], mirror_name: &str) -> Vec<Arc<Service>> {
    services
        .iter()
        .filter(|s| {
            // Read in place: this runs over every Service whenever one changes.
            (s.metadata.namespace.as_deref() == Some("kube-system")
                && s.metadata.name.as_deref() == Some(mirror_name))
                || s.annotations()
                    .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
                    .is_some_and(|v| v == "true")
        })
        .cloned()
        .collect()
}

fn service_of(services: &[Arc<Service>], spec: &MirrorSpec) -> Option<Arc<Service>> {
    services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(spec.namespace.as_str())
                && s.metadata.name.as_deref() == Some(spec.name.as_str())
        })
        .cloned()
}

/// The control-plane endpoints: the `fipTag` FIP with the mirror Service, and every annotated
/// Service whose `loadBalancerIP` is a FIP of the project.
/// `baton_fips_owned`: the control-plane endpoints routed, and this cluster's Service FIPs in
/// `ips` (counted once per list read, not once per tick, and at most every [`COUNT_EVERY`]:
/// during a burst of creates the list changes at every tick, and a count walks all of it).
fn count_owned(ctx: &Context, metrics: &Metrics, endpoints: usize, ips: &IpList, counted: &mut Counted) {
    metrics.set_fips_owned("control_plane", endpoints);
    let list = Arc::downgrade(ips);
    if !counted.list.ptr_eq(&list) && counted.at.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
        *counted = Counted {
            list,
            at: Some(Instant::now()),
        };
        let owned = ips
            .iter()
            .filter(|ip| super::service::is_cluster_service_fip(ip, &ctx.cluster_id))
            .count();
        metrics.set_fips_owned("service", owned);
    }
}

/// How often `baton_fips_owned{kind="service"}` may be counted again.
const COUNT_EVERY: Duration = Duration::from_secs(5);

/// The IP list `baton_fips_owned` last counted, and when.
#[derive(Default)]
struct Counted {
    list: std::sync::Weak<Vec<Arc<IpAddress>>>,
    at: Option<Instant>,
}

fn discover<B: Borrow<IpAddress>>(
    ctx: &Context,
    services: &[Arc<Service>],
    ips: &[B],
    api_servers: &[SocketAddr],
) -> (Vec<EndpointRef>, Vec<(Arc<Service>, Refusal)>) {
    let api_port = api_servers.first().map_or(6443, SocketAddr::port);
    let policy = ctx.endpoints.current();
    let mut out = Vec::new();
    let mut refused = Vec::new();
    if let Some(tag) = &ctx.config.fip_tag {
        if let Some(fip) = each_ip(ips).find(|ip| {
            ip.ip_type == IpType::FloatingIp
                && tag.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        }) {
            {
                let fip_port = if ctx.config.api_server_port == 0 {
                    api_port
                } else {
                    ctx.config.api_server_port
                };
                out.push(EndpointRef {
                    fip: fip.clone(),
                    fip_port,
                    service: MirrorSpec::new(&ctx.config.prefix, fip.address, ctx.config.api_server_port),
                });
            }
        } else {
            tracing::warn!(%tag, "floating IP not found: create one with this tag");
        }
    }
    let mirror_name = mirror::service_name(&ctx.config.prefix);
    for svc in services {
        let annotated = svc
            .annotations()
            .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
            .is_some_and(|v| v == "true");
        let ns = svc.namespace().unwrap_or_default();
        // A Service being deleted is no endpoint any more: its FIP is unassigned, never moved
        // again ([`finalizer_plan`]).
        if !annotated
            || (ns == "kube-system" && svc.name_any() == mirror_name)
            || svc.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let Some(spec) = svc.spec.as_ref() else { continue };
        let Some(lb_ip) = spec
            .load_balancer_ip
            .as_deref()
            .and_then(|v| v.parse::<IpAddr>().ok())
        else {
            tracing::debug!(service = %svc.name_any(), "control-plane endpoint without a loadBalancerIP");
            continue;
        };
        let fip = match policy.admit(&ns, lb_ip, each_ip(ips)) {
            Ok(fip) => fip,
            Err(refusal) => {
                refused.push((Arc::clone(svc), refusal));
                continue;
            }
        };
        let fip_port = spec
            .ports
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|p| u16::try_from(p.port).ok())
            .unwrap_or(api_port);
        out.push(EndpointRef {
            fip: fip.clone(),
            fip_port,
            service: MirrorSpec::existing(&ns, &svc.name_any(), fip.address),
        });
    }
    (out, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fip_at(address: &str, target: Option<u64>, tags: &[(&str, &str)]) -> IpAddress {
        serde_json::from_value(serde_json::json!({
            "id": format!("id-{address}"),
            "address": address,
            "type": "floating-ip",
            "targeted_to": target.map(|t| serde_json::json!({"id": t})),
            "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
        }))
        .unwrap()
    }

    #[test]
    fn the_holder_is_the_node_of_the_targeted_server_else_its_hostname() {
        let server: Server = serde_json::from_value(serde_json::json!({
            "id": 600_102, "hostname": "cp-1",
            "ip_addresses": [
                {"id": "p", "address": "192.0.2.12", "type": "private-ip"},
                {"id": "q", "address": "198.51.100.12", "type": "primary-ip"},
            ],
        }))
        .unwrap();
        let fip = fip_at("203.0.113.5", Some(600_102), &[]);
        let want = Holder {
            name: "cp-1".into(),
            address: "198.51.100.12".parse().unwrap(),
        };
        // No Node yet: the server's hostname.
        assert_eq!(
            Holder::of(&fip, std::slice::from_ref(&server), &[]),
            Some(want.clone())
        );
        // A Node with the server's provider ID, whatever its name.
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-b"}, "spec": {"providerID": "cherryservers://600102"},
        }))
        .unwrap();
        assert_eq!(
            Holder::of(&fip, std::slice::from_ref(&server), &[Arc::new(node)]).map(|h| h.name),
            Some("node-b".to_owned())
        );
        // Unassigned, or routed to a server this loop does not know: no holder.
        assert_eq!(
            Holder::of(
                &fip_at("203.0.113.5", None, &[]),
                std::slice::from_ref(&server),
                &[]
            ),
            None
        );
        assert_eq!(
            Holder::of(
                &fip_at("203.0.113.5", Some(9), &[]),
                std::slice::from_ref(&server),
                &[]
            ),
            None
        );
        // What a Service's annotations say, and garbage in them.
        let mut svc = Service::default();
        assert_eq!(Holder::annotated(&svc), None);
        svc.metadata.annotations = Some(BTreeMap::from([
            (FIP_HOLDER_ANNOTATION.to_owned(), "cp-1".to_owned()),
            (
                FIP_HOLDER_ADDRESS_ANNOTATION.to_owned(),
                "198.51.100.12".to_owned(),
            ),
        ]));
        assert_eq!(Holder::annotated(&svc), Some(want));
        svc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(FIP_HOLDER_ADDRESS_ANNOTATION.to_owned(), "not-an-ip".to_owned());
        assert_eq!(Holder::annotated(&svc), None, "rewritten when garbled");
    }

    fn endpoint_svc(
        ns: &str,
        name: &str,
        lb_ip: &str,
        finalizer: bool,
        deleting: bool,
        annotated: bool,
    ) -> Arc<Service> {
        let mut meta = serde_json::json!({
            "name": name, "namespace": ns, "resourceVersion": "7",
            "annotations": if annotated { serde_json::json!({CONTROL_PLANE_ENDPOINT_ANNOTATION: "true"}) } else { serde_json::json!({}) },
        });
        if finalizer {
            meta["finalizers"] = serde_json::json!([ENDPOINT_FINALIZER]);
        }
        if deleting {
            meta["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
        }
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": meta,
                "spec": {"type": "LoadBalancer", "loadBalancerIP": lb_ip},
            }))
            .unwrap(),
        )
    }

    fn unassigned(plan: &[FinalizerStep]) -> Vec<(String, Option<String>)> {
        plan.iter()
            .filter_map(|s| match s {
                FinalizerStep::Release { name, unassign, .. } => {
                    Some((name.clone(), unassign.as_ref().map(|f| f.address.to_string())))
                }
                FinalizerStep::Add { .. } => None,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_address_the_list_does_not_show_rereads_it_at_once_then_ever_more_rarely() {
        let mut u = UnknownFips::default();
        let none = BTreeSet::new();
        let one: BTreeSet<IpAddr> = BTreeSet::from(["203.0.113.9".parse().unwrap()]);
        let two: BTreeSet<IpAddr> =
            BTreeSet::from(["203.0.113.9".parse().unwrap(), "203.0.113.10".parse().unwrap()]);
        assert!(!u.due(&none));
        assert!(u.due(&one), "a new unknown address: at once");
        assert!(!u.due(&one));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(u.due(&one), "then after 5 s");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!u.due(&one), "then after 10 s");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(u.due(&one));
        assert!(u.due(&two), "another new address: at once again");
        assert!(!u.due(&one), "one of the known ones going is no reason");
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(600)).await;
            assert!(u.due(&one));
        }
        assert_eq!(u.wait, UnknownFips::MAX_WAIT);
        assert!(!u.due(&none));
        assert!(u.due(&one), "known again, then unknown: at once");
    }

    /// This cluster's id in the tests' `cluster` tags.
    const CLUSTER: &str = "uid-1";

    /// Endpoints allowed in `kube-system` and `default`; FIPs tagged `cluster=uid-1` are ours.
    fn policy(fip_tag: Option<&str>) -> EndpointPolicy {
        EndpointPolicy {
            namespaces: ["kube-system".to_owned(), "default".to_owned()].into(),
            cluster_id: CLUSTER.to_owned(),
            fip_tag: fip_tag.map(|t| t.parse().unwrap()),
            adopted: BTreeSet::new(),
        }
    }

    #[test]
    fn unknown_endpoint_ips_are_live_annotated_services_addresses_missing_from_the_list() {
        let ips = vec![fip_at("203.0.113.1", Some(1), &[])];
        let services = vec![
            endpoint_svc("default", "api", "203.0.113.1", false, false, true),
            endpoint_svc("default", "new", "203.0.113.2", false, false, true),
            endpoint_svc("default", "going", "203.0.113.3", true, true, true),
            endpoint_svc("default", "plain", "203.0.113.4", false, false, false),
            // A namespace that may not hold endpoints costs no list read.
            endpoint_svc("tenant", "probe", "203.0.113.5", false, false, true),
        ];
        assert_eq!(
            unknown_endpoint_ips(&policy(None), &services, &ips),
            BTreeSet::from(["203.0.113.2".parse().unwrap()])
        );
    }

    #[test]
    fn a_deleted_control_plane_endpoint_unassigns_its_fip_and_never_anothers() {
        let ours = [("cluster", CLUSTER)];
        let ips = vec![
            fip_at("203.0.113.1", Some(1), &ours),
            fip_at("203.0.113.2", Some(1), &ours),
            fip_at("203.0.113.3", Some(1), &[("cluster", "my-cp")]),
            fip_at("203.0.113.4", None, &ours),
            // Another cluster's, and an untagged one: never this cluster's to unassign.
            fip_at("203.0.113.5", Some(9), &[("cluster", "uid-other")]),
            fip_at("203.0.113.6", Some(9), &[]),
        ];
        let services = vec![
            // Live, no finalizer yet, its IP a FIP of the project: gets one.
            endpoint_svc("default", "api", "203.0.113.1", false, false, true),
            // Live, IP not a FIP of the project: none.
            endpoint_svc("default", "elsewhere", "192.0.2.9", false, false, true),
            // Deleted: its FIP is unassigned.
            endpoint_svc("default", "gone", "203.0.113.2", true, true, true),
            // Deleted, but api still uses 203.0.113.1: kept routed.
            endpoint_svc("default", "api-int", "203.0.113.1", true, true, true),
            // Deleted, the fipTag FIP: kept routed (the mirror serves it).
            endpoint_svc("default", "tagged", "203.0.113.3", true, true, true),
            // Deleted, its FIP already unassigned: only the finalizer goes.
            endpoint_svc("default", "idle", "203.0.113.4", true, true, true),
            // The mirror Service never gets the finalizer.
            endpoint_svc(
                "kube-system",
                "baton-kubernetes-external",
                "203.0.113.3",
                false,
                false,
                true,
            ),
            // Deleted without baton's finalizer: nothing to do.
            endpoint_svc("default", "foreign", "203.0.113.2", false, true, true),
            // Live, naming another cluster's FIP, an untagged one, or in a namespace that may not
            // hold endpoints: no finalizer.
            endpoint_svc("default", "theirs", "203.0.113.5", false, false, true),
            endpoint_svc("default", "untagged", "203.0.113.6", false, false, true),
            endpoint_svc("tenant", "api", "203.0.113.1", false, false, true),
            // Deleted with the finalizer (given by an earlier version), naming another cluster's
            // FIP or in a tenant's namespace: the finalizer goes, the FIP is not unassigned.
            endpoint_svc("default", "theirs-gone", "203.0.113.5", true, true, true),
            endpoint_svc("tenant", "gone", "203.0.113.2", true, true, true),
        ];
        let plan = finalizer_plan(
            &services,
            &ips,
            &policy(Some("cluster=my-cp")),
            "baton-kubernetes-external",
        );
        assert_eq!(
            plan.iter()
                .filter(|s| matches!(s, FinalizerStep::Add { .. }))
                .count(),
            1
        );
        assert!(plan.contains(&FinalizerStep::Add {
            namespace: "default".into(),
            name: "api".into(),
            version: "7".into()
        }));
        assert_eq!(
            unassigned(&plan),
            vec![
                ("gone".into(), Some("203.0.113.2".into())),
                ("api-int".into(), None),
                ("tagged".into(), None),
                ("idle".into(), None),
                ("theirs-gone".into(), None),
                ("gone".into(), None),
            ]
        );
        // Without the fipTag, the tagged FIP is no FIP of this cluster's: not unassigned.
        let plan = finalizer_plan(&services, &ips, &policy(None), "baton-kubernetes-external");
        assert!(unassigned(&plan).contains(&("tagged".into(), None)));
    }

    fn ip(id: &str, target: Option<u64>) -> IpAddress {
        serde_json::from_value(serde_json::json!({
            "id": id,
            "address": "203.0.113.1",
            "type": "floating-ip",
            "targeted_to": target.map(|t| serde_json::json!({"id": t})),
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_cloud_cannot_be_read_decisions_use_the_last_list_and_its_own_moves() {
        let metrics = Metrics::default();
        let mut view = CloudView::default();
        let error = baton_cloud::CloudError::Config("outage".into());
        assert!(
            view.stale(&error, &metrics).is_none(),
            "nothing read yet: nothing to go on"
        );

        let list: IpList = Arc::new(vec![Arc::new(ip("a", Some(1))), Arc::new(ip("b", Some(2)))]);
        view.read(&list, &metrics);
        let stale = view.stale(&error, &metrics).expect("the last list");
        assert_eq!(stale.len(), 2);
        assert!(metrics.encode().contains("baton_cloud_ip_list_stale 1"));
        assert!(!view.should_report(), "a short outage is not reported");
        tokio::time::advance(CloudView::REPORT_AFTER).await;
        assert!(view.should_report(), "a long one is");

        // A move made during the outage is part of the list decisions use.
        view.moved(ip("a", Some(3)));
        let stale = view.stale(&error, &metrics).unwrap();
        assert_eq!(stale[0].target().map(|s| s.0), Some(3));
        assert_eq!(stale[1].target().map(|s| s.0), Some(2));

        view.read(&list, &metrics);
        assert!(metrics.encode().contains("baton_cloud_ip_list_stale 0"));
        assert!(!view.should_report());
    }

    /// Both clocks of one replica in a test: the monotonic one (paused tokio time) and a wall
    /// clock `skew` ahead of the shared one.
    fn clocks_at(now: Instant, origin: Instant, skew_ms: i64) -> Clocks {
        let wall0 = Timestamp::from_second(1_795_000_000).unwrap();
        Clocks {
            now,
            wall: wall0
                .checked_add(now - origin)
                .unwrap()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(skew_ms))
                .unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_fip_is_held_after_a_move_and_the_hold_doubles() {
        let origin = Instant::now();
        let c = |t: Instant| clocks_at(t, origin, 0);
        let mut hold = HoldDown::default();
        let t0 = Instant::now();
        assert!(
            !hold.holds(t0, Reason::FipUnreachable),
            "nothing held before any move"
        );

        // Any move settles first: a route still propagating is not a reason to move again.
        hold.moved(c(t0), Some(1), 2, Reason::HolderDown);
        assert!(hold.holds(t0 + Duration::from_secs(4), Reason::FipUnreachable));
        assert!(
            !hold.holds(t0 + Duration::from_secs(4), Reason::HolderDown),
            "a dead holder always moves"
        );
        assert!(!hold.holds(t0 + HoldDown::SETTLE, Reason::FipUnreachable));

        // A move because the FIP was unreachable holds the next one 30 s, then 60 s, …
        let t1 = t0 + Duration::from_secs(10);
        hold.moved(c(t1), Some(2), 3, Reason::FipUnreachable);
        assert!(hold.holds(t1 + Duration::from_secs(29), Reason::FipUnreachable));
        assert!(!hold.holds(t1 + HoldDown::BASE, Reason::FipUnreachable));
        let t2 = t1 + Duration::from_secs(31);
        hold.moved(c(t2), Some(3), 1, Reason::FipUnreachable);
        assert!(hold.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert!(!hold.holds(t2 + Duration::from_secs(60), Reason::FipUnreachable));

        // … capped at 5 minutes, and back to 30 s after a quiet 5 minutes.
        let mut t = t2;
        for _ in 0..6 {
            t += Duration::from_secs(1);
            hold.moved(c(t), Some(1), 2, Reason::FipUnreachable);
        }
        assert!(hold.holds(t + HoldDown::MAX - Duration::from_secs(1), Reason::FipUnreachable));
        assert!(!hold.holds(t + HoldDown::MAX, Reason::FipUnreachable));
        let later = t + HoldDown::MAX + Duration::from_secs(1);
        hold.moved(c(later), Some(2), 3, Reason::FipUnreachable);
        assert!(!hold.holds(later + HoldDown::BASE, Reason::FipUnreachable));

        // A move someone else made settles too (the nodes learn the new holder from this
        // replica's annotations), never shortening a hold already running.
        let mut hold = HoldDown::default();
        let t3 = Instant::now();
        hold.route_changed(t3);
        assert!(hold.holds(t3 + Duration::from_secs(4), Reason::FipUnreachable));
        assert!(!hold.holds(t3, Reason::HolderDown), "a dead holder always moves");
        assert!(!hold.holds(t3 + HoldDown::SETTLE, Reason::FipUnreachable));
        hold.moved(c(t3), Some(1), 2, Reason::FipUnreachable);
        hold.route_changed(t3 + Duration::from_secs(1));
        assert!(hold.holds(
            t3 + HoldDown::BASE - Duration::from_secs(1),
            Reason::FipUnreachable
        ));
    }

    /// Reads `hold`'s record as another replica would.
    fn record_of(hold: &HoldDown) -> (String, Recorded) {
        let raw = hold.record_text().expect("a record after a move").to_owned();
        let rec = Recorded::parse(&raw).unwrap();
        (raw, rec)
    }

    #[tokio::test(start_paused = true)]
    async fn another_replica_holds_as_the_one_that_moved_and_doubles_its_hold() {
        let origin = Instant::now();
        let (a, b) = (
            |t: Instant| clocks_at(t, origin, 0),
            |t: Instant| clocks_at(t, origin, 0),
        );
        let t0 = Instant::now();
        // Replica A moves the FIP because it was unreachable: 30 s.
        let mut hold_a = HoldDown::default();
        hold_a.moved(a(t0), Some(1), 2, Reason::FipUnreachable);
        let (raw, rec) = record_of(&hold_a);
        let json: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(json["from"], 1);
        assert_eq!(json["to"], 2);
        assert_eq!(json["reason"], "FipUnreachable");
        assert_eq!(json["at"], "2026-11-18T11:06:40.000Z", "RFC 3339, UTC, ms");
        assert_eq!(json["holdUntil"], "2026-11-18T11:07:10.000Z");
        assert_eq!(json["unreachable"]["holdMs"], 30_000);

        // Replica B reads it 3 s later (it becomes leader): the same hold, the same last move.
        let t1 = t0 + Duration::from_secs(3);
        let mut hold_b = HoldDown::default();
        hold_b.seed(b(t1), &raw, &rec);
        assert!(hold_b.holds(t0 + Duration::from_secs(29), Reason::FipUnreachable));
        assert!(!hold_b.holds(t0 + HoldDown::BASE, Reason::FipUnreachable));
        assert_eq!(
            hold_b.last_move(t1),
            Some(LastMove {
                from: Some(1),
                to: 2,
                ago: Duration::from_secs(3)
            })
        );
        assert_eq!(hold_b.record_text(), Some(raw.as_str()), "nothing to write back");
        // Its own next unreachable move doubles A's hold: 60 s.
        let t2 = t0 + HoldDown::BASE + Duration::from_secs(1);
        hold_b.moved(b(t2), Some(2), 3, Reason::FipUnreachable);
        assert!(hold_b.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert!(!hold_b.holds(t2 + Duration::from_secs(60), Reason::FipUnreachable));

        // A reads B's record back: its hold follows; an older record (its own) changes nothing.
        hold_a.seed(a(t2), &record_of(&hold_b).0, &record_of(&hold_b).1);
        assert!(hold_a.holds(t2 + Duration::from_secs(59), Reason::FipUnreachable));
        assert_eq!(hold_a.last_move(t2).map(|m| m.to), Some(3));
        hold_a.seed(a(t2), &raw, &rec);
        assert_eq!(
            hold_a.last_move(t2).map(|m| m.to),
            Some(3),
            "an older record is no news"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_skewed_clock_shifts_a_shared_hold_by_its_skew_and_never_past_the_maximum() {
        let origin = Instant::now();
        let t0 = Instant::now();
        let mut writer = HoldDown::default();
        writer.moved(clocks_at(t0, origin, 0), Some(1), 2, Reason::FipUnreachable);
        let (raw, rec) = record_of(&writer);
        // A reader whose clock runs 2 s ahead sees the hold end 2 s early, and the move 2 s
        // older than it is.
        let mut ahead = HoldDown::default();
        ahead.seed(clocks_at(t0, origin, 2_000), &raw, &rec);
        assert!(ahead.holds(t0 + Duration::from_secs(27), Reason::FipUnreachable));
        assert!(!ahead.holds(t0 + Duration::from_secs(28), Reason::FipUnreachable));
        assert_eq!(ahead.last_move(t0).map(|m| m.ago), Some(Duration::from_secs(2)));
        // One running 2 s behind, 2 s late; the move, in its future, counts as made now.
        let mut behind = HoldDown::default();
        behind.seed(clocks_at(t0, origin, -2_000), &raw, &rec);
        assert!(behind.holds(t0 + Duration::from_secs(31), Reason::FipUnreachable));
        assert!(!behind.holds(t0 + Duration::from_secs(32), Reason::FipUnreachable));
        assert_eq!(behind.last_move(t0).map(|m| m.ago), Some(Duration::ZERO));
        // A clock an hour behind would hold for an hour: capped at the longest hold.
        let mut far = HoldDown::default();
        far.seed(clocks_at(t0, origin, -3_600_000), &raw, &rec);
        assert!(far.holds(
            t0 + HoldDown::MAX - Duration::from_secs(1),
            Reason::FipUnreachable
        ));
        assert!(!far.holds(t0 + HoldDown::MAX, Reason::FipUnreachable));
    }

    #[rstest::rstest]
    #[case("", "not a move record")]
    #[case("{", "not a move record")]
    #[case(
        r#"{"at":"2026-11-18T21:46:40.000Z","to":2,"reason":"HolderDown"}"#,
        "holdUntil"
    )]
    #[case(
        r#"{"at":"yesterday","to":2,"reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z"}"#,
        "at \"yesterday\""
    )]
    #[case(r#"{"at":"2026-11-18T21:46:40.000Z","to":"cp-2","reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z"}"#, "not a move record")]
    #[case(r#"{"at":"2026-11-18T21:46:40.000Z","to":2,"reason":"HolderDown","holdUntil":"2026-11-18T21:46:45.000Z","unreachable":{"at":"x","holdMs":1}}"#, "unreachable.at")]
    fn a_garbled_record_is_refused_naming_the_field(#[case] raw: &str, #[case] names: &str) {
        let error = Recorded::parse(raw).unwrap_err();
        assert!(error.contains(names), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_garbled_record_on_the_service_is_ignored() {
        let origin = Instant::now();
        let mut state = EndpointState::default();
        let mut svc = Service::default();
        svc.metadata.annotations = Some(BTreeMap::from([(
            FIP_LAST_MOVE_ANNOTATION.to_owned(),
            "{garbage".to_owned(),
        )]));
        let ip: IpAddr = "203.0.113.5".parse().unwrap();
        state.read_record(&svc, clocks_at(Instant::now(), origin, 0), ip);
        assert!(state.hold.last_move(Instant::now()).is_none());
        assert!(!state.hold.holds(Instant::now(), Reason::FipUnreachable));
        assert_eq!(
            state.hold.record_text(),
            None,
            "nothing of it kept, nothing to write"
        );
        // A valid one later is read.
        let mut writer = HoldDown::default();
        writer.moved(
            clocks_at(Instant::now(), origin, 0),
            Some(1),
            2,
            Reason::HolderDown,
        );
        svc.metadata.annotations.as_mut().unwrap().insert(
            FIP_LAST_MOVE_ANNOTATION.to_owned(),
            writer.record_text().unwrap().to_owned(),
        );
        state.read_record(&svc, clocks_at(Instant::now(), origin, 0), ip);
        assert_eq!(state.hold.last_move(Instant::now()).map(|m| m.to), Some(2));
    }

    /// A stand-in for `baton sni serve`'s health answer on `addr`'s port; dropped, it is gone.
    async fn answering_router() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    // Answer like the router: once the ClientHello names the health check.
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                        if let Ok(crate::sni::hello::Hello::Complete { sni }) =
                            crate::sni::hello::parse(&got, 16_384)
                        {
                            if sni.as_deref() == Some(crate::sni::router::HEALTH_NAME) {
                                let _ = s.write_all(&crate::sni::router::UNRECOGNIZED_NAME).await;
                            }
                            return;
                        }
                    }
                });
            }
        });
        (addr, task)
    }

    #[tokio::test]
    async fn router_probes_follow_the_candidates_and_see_a_router_stop() {
        let settings = ProbeSettings {
            path: "/readyz".into(),
            server_name: "kubernetes.default.svc".into(),
            ca_der: Vec::new(),
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
            thresholds: baton_core::health::Thresholds { rise: 2, fall: 3 },
        };
        let off = RouterProbes::new(0, &settings);
        assert!(!off.is_on());
        assert_eq!(off.health("127.0.0.1".parse().unwrap()), None, "not watched");

        let (router, task) = answering_router().await;
        let mut on = RouterProbes::new(router.port(), &settings);
        let mut rx = on.subscribe();
        // The candidate is the API server's address (port 6443): the router on the same IP.
        on.follow(&[SocketAddr::new(router.ip(), 6443)]).unwrap();
        router_health(&on, &mut rx, router.ip(), Health::Up).await;
        task.abort(); // the router stops accepting
        let _ = task.await;
        router_health(&on, &mut rx, router.ip(), Health::Down).await;
    }

    async fn router_health(
        on: &RouterProbes,
        rx: &mut tokio::sync::watch::Receiver<BTreeMap<SocketAddr, Health>>,
        ip: IpAddr,
        want: Health,
    ) {
        while on.health(ip) != Some(want) {
            tokio::time::timeout(Duration::from_secs(5), rx.changed())
                .await
                .unwrap_or_else(|_| panic!("router never {want:?}"))
                .unwrap();
        }
    }
}
