//! The control-plane endpoint manager: keeps each control-plane FIP routed to a healthy API server.
//!
//! ```text
//!  default/kubernetes EndpointSlices ─┐            cloud: IPs (cached), servers
//!  Nodes (cordon / deletion)          ├─ watch ─►  candidates: API server address ─► server id
//!  Services (control-plane endpoints) ┘                 │
//!                                                       ▼
//!  Prober: /readyz on every candidate and every FIP ─► health (rise/fall) ─► core::failover::decide
//!                                                                               │ Move (leader only,
//!                                                                               ▼  lease re-checked)
//!                                               one retarget call (urgent priority), read back, Event
//! ```
//!
//! Endpoints are the FIP named by `fipTag` (with the mirror Service
//! `kube-system/<prefix>-kubernetes-external`) and every Service annotated
//! `baton.dev/control-plane-endpoint: "true"` (the API Services `baton bootstrap` creates), whose
//! `loadBalancerIP` is its FIP. Who holds a FIP is read from the cloud (`targeted_to`), never
//! guessed from Node addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{IpAddress, IpType, Server, ServerId};
use baton_core::failover::{Candidate, Decision, Observation, decide};
use baton_core::health::Health;
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::mirror::{self, CONTROL_PLANE_ENDPOINT_ANNOTATION, MirrorSpec};
use super::probe::{ProbeError, ProbeSettings, Prober};
use super::{Context, metrics::Metrics};

/// Settings of the endpoint manager.
#[derive(Clone)]
pub struct EndpointOptions {
    pub probe: ProbeSettings,
    /// The cloud client with urgent priority: a failover's calls go ahead of queued work.
    pub urgent_cloud: Arc<dyn Cloud>,
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
}

/// Runs until `shutdown`.
pub async fn run(
    ctx: Context,
    opts: EndpointOptions,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), EndpointError> {
    let slices = reflect::<EndpointSlice>(
        Api::namespaced(ctx.client.clone(), "default"),
        watcher::Config::default().labels(&format!("{}=kubernetes", mirror::SERVICE_NAME_LABEL)),
        &shutdown,
    );
    let nodes = reflect::<Node>(
        Api::all(ctx.client.clone()),
        watcher::Config::default(),
        &shutdown,
    );
    let services = reflect::<Service>(
        Api::all(ctx.client.clone()),
        watcher::Config::default(),
        &shutdown,
    );

    // Decide nothing before the first full lists: a half-filled store would look like a
    // vanished holder.
    for ready in [
        slices.wait_until_ready().boxed(),
        nodes.wait_until_ready().boxed(),
        services.wait_until_ready().boxed(),
    ] {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = ready => {}
        }
    }
    let mut prober = Prober::new(opts.probe.clone(), Arc::clone(&metrics) as _);
    let mut health_rx = prober.subscribe();
    let mut servers: Vec<Server> = Vec::new();
    let mut servers_at: Option<Instant> = None;
    let mut states: BTreeMap<String, EndpointState> = BTreeMap::new();
    let mut tick = tokio::time::interval(opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leading = false;

    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = tick.tick() => {}
            _ = health_rx.changed() => {}
        }
        // A follower's cached IP list may predate the previous leader's last move: a new
        // leader reads the cloud afresh before deciding anything.
        let now_leading = ctx.leader.is_leader();
        if now_leading && !leading {
            ctx.cloud.invalidate_ips();
            servers_at = None;
        }
        leading = now_leading;
        let api_servers = api_server_addresses(&slices.state());
        if api_servers.is_empty() {
            tracing::debug!("default/kubernetes lists no API server yet");
            continue;
        }
        // Refresh the server list slowly, or at once when an API server has no known server.
        let unknown = api_servers
            .iter()
            .any(|a| server_by_ip(&servers, a.ip()).is_none());
        if servers_at.is_none_or(|t| {
            t.elapsed() > opts.servers_refresh || (unknown && t.elapsed() > Duration::from_secs(5))
        }) {
            // Urgent, like the move itself: a queue of Service FIP work must not delay failover.
            match opts.urgent_cloud.servers().await {
                Ok(s) => servers = s,
                Err(error) => tracing::warn!(%error, "listing servers failed"),
            }
            servers_at = Some(Instant::now());
        }
        // The shared IP list is always fetched in the urgent lane (baton-cloud's cache), whoever
        // asks first.
        let ips = match ctx.cloud.ips().await {
            Ok(ips) => ips,
            Err(error) => {
                tracing::warn!(%error, "listing IPs failed");
                continue;
            }
        };
        let endpoints = discover(&ctx, &services.state(), &ips, &api_servers);
        // Candidates are the API servers default/kubernetes lists, plus every FIP holder: a
        // holder missing from that list (not yet added, or just removed) is probed directly
        // rather than presumed gone.
        let probe_addrs = probe_addresses(&api_servers, &endpoints, &servers);
        let mut targets: Vec<SocketAddr> = probe_addrs.clone();
        if !ctx.config.health_check.use_host_ip {
            targets.extend(
                endpoints
                    .iter()
                    .map(|e| SocketAddr::new(e.fip.address, e.fip_port)),
            );
        }
        prober.set_targets(&targets)?;

        let candidates = candidates(&probe_addrs, &servers, &nodes.state(), &prober);

        let services_now = services.state();
        for ep in &endpoints {
            let state = states.entry(ep.fip.id.as_str().to_owned()).or_default();
            let step = Step {
                ctx: &ctx,
                opts: &opts,
                metrics: &metrics,
                services: &services_now,
                candidates: &candidates,
                api_servers: &api_servers,
            };
            step.endpoint(ep, state, &mut prober).await?;
        }
    }
}

/// One iteration's view, shared by the endpoints handled in it.
struct Step<'a> {
    ctx: &'a Context,
    opts: &'a EndpointOptions,
    metrics: &'a Metrics,
    services: &'a [Arc<Service>],
    candidates: &'a [(Candidate, SocketAddr)],
    api_servers: &'a [SocketAddr],
}

impl Step<'_> {
    /// Decides and acts for one endpoint, then keeps its Service's status and endpoints current.
    async fn endpoint(
        &self,
        ep: &EndpointRef,
        ep_state: &mut EndpointState,
        prober: &mut Prober,
    ) -> Result<(), EndpointError> {
        let Self {
            ctx,
            metrics,
            candidates,
            api_servers,
            ..
        } = *self;
        let state = ep_state;
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let obs = Observation {
            holder: ep.fip.target().map(|s| s.0),
            via_fip: if ctx.config.health_check.use_host_ip {
                Health::Unknown
            } else {
                prober.health(&fip_target)
            },
            candidates: candidates.iter().map(|(c, _)| c.clone()).collect(),
        };
        let decision = decide(&obs);
        match decision {
            Decision::Keep => {
                state.down_since = None;
                state.stuck_reported = false;
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
                            format!("FIP {} should move ({}) but no control-plane API server is healthy; keeping it", ep.fip.address, reason.as_str()),
                        )
                        .await;
                    }
                }
            }
            Decision::Move { to, reason } => {
                // Fencing: only the current lease holder writes to the cloud.
                if !ctx.leader.is_leader() {
                    return Ok(());
                }
                self.move_fip(ep, state, prober, to, reason).await?;
            }
        }
        // Status (ingress, ipMode Proxy) and mirrored endpoints, when their inputs change
        // (and every 30 s, to repair edits). Leader only.
        let inputs = (
            ep.service.clone(),
            api_servers.iter().copied().collect::<BTreeSet<_>>(),
        );
        let outdated = state.last_applied.as_ref() != Some(&inputs)
            || state
                .last_applied_at
                .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        let backing_off = state.retry_at.is_some_and(|t| Instant::now() < t);
        if outdated && !backing_off && ctx.leader.is_leader() {
            match mirror::reconcile(&ctx.client, &ep.service).await {
                Ok(()) => {
                    state.last_applied = Some(inputs);
                    state.last_applied_at = Some(Instant::now());
                    state.retry_at = None;
                }
                Err(error) => {
                    state.retry_at = Some(Instant::now() + Duration::from_secs(5));
                    tracing::warn!(%error, service = %ep.service.name, "updating the endpoint Service failed");
                }
            }
        }
        Ok(())
    }
    /// Retargets the FIP to `to` in one call (urgent priority), reads it back, and reports.
    async fn move_fip(
        &self,
        ep: &EndpointRef,
        state: &mut EndpointState,
        prober: &mut Prober,
        to: u64,
        reason: baton_core::failover::Reason,
    ) -> Result<(), EndpointError> {
        let Self {
            ctx,
            opts,
            metrics,
            candidates,
            ..
        } = *self;
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let since = *state.down_since.get_or_insert_with(Instant::now);
        let from = ep.fip.target();
        tracing::info!(fip = %ep.fip.address, ?from, to, reason = reason.as_str(), "moving the control-plane FIP");
        let moved = match opts.urgent_cloud.retarget_ip(&ep.fip.id, ServerId(to)).await {
            Ok(ip) => {
                let recovered = since.elapsed();
                metrics.failover(reason.as_str(), recovered);
                state.down_since = None;
                state.stuck_reported = false;
                // The FIP's probe history belongs to the old holder: start afresh.
                prober.reset(&fip_target)?;
                let confirmed = ip.target() == Some(ServerId(to));
                tracing::info!(fip = %ep.fip.address, to, confirmed, recovered_ms = recovered.as_millis(), "control-plane FIP moved");
                true
            }
            Err(error) => {
                metrics.failover_error();
                tracing::warn!(%error, fip = %ep.fip.address, to, "retargeting the FIP failed");
                false
            }
        };
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
                ctx.event(
                    &*svc,
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
        Ok(())
    }
}

fn reflect<K>(api: Api<K>, cfg: watcher::Config, shutdown: &CancellationToken) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, cfg)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let token = shutdown.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // A persistent error (an RBAC denial) must be seen, but not flood the log: a warning at
        // most every 30 s per watched kind, the repeats in between at debug.
        let mut throttle = super::health::LogThrottle::new(Duration::from_secs(30));
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                item = stream.next() => match item {
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        if let Some(repeats) = throttle.allow() {
                            tracing::warn!(%error, kind = %K::kind(&()), repeats, "watch error (retrying)");
                        } else {
                            tracing::debug!(%error, kind = %K::kind(&()), "watch error (retrying)");
                        }
                    }
                    None => return,
                },
            }
        }
    });
    reader
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

fn service_of(services: &[Arc<Service>], spec: &MirrorSpec) -> Option<Arc<Service>> {
    services
        .iter()
        .find(|s| s.namespace().as_deref() == Some(spec.namespace.as_str()) && s.name_any() == spec.name)
        .cloned()
}

/// The control-plane endpoints: the `fipTag` FIP with the mirror Service, and every annotated
/// Service whose `loadBalancerIP` is a FIP of the project.
fn discover(
    ctx: &Context,
    services: &[Arc<Service>],
    ips: &[IpAddress],
    api_servers: &[SocketAddr],
) -> Vec<EndpointRef> {
    let api_port = api_servers.first().map_or(6443, SocketAddr::port);
    let mut out = Vec::new();
    if let Some(tag) = &ctx.config.fip_tag {
        if let Some(fip) = ips.iter().find(|ip| {
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
    let mirror_name = format!("{}-kubernetes-external", ctx.config.prefix);
    for svc in services {
        let annotated = svc
            .annotations()
            .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
            .is_some_and(|v| v == "true");
        let ns = svc.namespace().unwrap_or_default();
        if !annotated || (ns == "kube-system" && svc.name_any() == mirror_name) {
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
        let Some(fip) = ips
            .iter()
            .find(|ip| ip.address == lb_ip && ip.ip_type == IpType::FloatingIp)
        else {
            tracing::debug!(service = %svc.name_any(), %lb_ip, "loadBalancerIP is not a FIP of the project");
            continue;
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
    out
}
