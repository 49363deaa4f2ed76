//! Service FIP routing (Hetzner Cloud, no BGP): every Service FIP baton reserved is routed to a
//! healthy node, and moved when that node fails, like the control-plane FIP.
//!
//! ```text
//!  Nodes (watch) ── plan::is_eligible ── its server (provider ID hcloud://<id>, or name) ──┐
//!  kube-proxy http://<node address>:10256/healthz (rise/fall, every healthCheckInterval) ──┤
//!  the shared IP list: FIPs tagged usage + cluster ───────────────────────────────────────┤
//!                                                                                        ▼
//!                         plan::plan ──► retarget_ip (urgent when the node is down), leader only
//! ```
//!
//! The cloud delivers a routed FIP with its address as the destination; the Service's ingress
//! is that address in VIP mode, so kube-proxy (or its replacement) on the node forwards the
//! packets to the Service's endpoints. kube-proxy's `/healthz` (port 10256) is what cloud load
//! balancers check for the same purpose: it fails when the node stops forwarding, is tainted
//! for deletion, or is gone.

mod plan;

pub use plan::*;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{IpType, Server, ServerId, Tags};
use baton_cloud::tags::{CLUSTER_KEY, USAGE_KEY, USAGE_VALUE};
use baton_core::ProviderId;
use baton_core::health::{Health, Thresholds};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Context;
use super::watches::{Cache, Watches};
use crate::probe::{ProbeSettings, Prober};

/// kube-proxy's health port (`healthzBindAddress`, default `0.0.0.0:10256`).
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;
/// A pass runs at least this often (and at once when a probe's verdict changes).
const TICK: Duration = Duration::from_millis(250);
/// Moves sent at once (each waits for its action).
const MOVES_AT_ONCE: usize = 32;
/// The project's servers are read again this often (and when a Node names an unknown one).
const SERVERS_REFRESH: Duration = Duration::from_secs(600);

/// Runs until `shutdown`: routes the cluster's Service FIPs to healthy nodes while this replica
/// leads.
pub fn run_routing(
    ctx: Arc<Context>,
    urgent: Arc<dyn Cloud>,
    watches: &mut Watches,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let nodes = watches.nodes();
    async move {
        let hc = &ctx.config.health_check;
        let settings = ProbeSettings {
            path: "/healthz".into(),
            server_name: String::new(),
            ca_der: Vec::new(),
            interval: hc.interval,
            timeout: hc.timeout,
            thresholds: Thresholds {
                rise: hc.rise,
                fall: hc.fall,
            },
        };
        let check = match crate::probe::plain_http_check("/healthz", settings.timeout) {
            Ok(check) => check,
            Err(e) => {
                warn!(error = %e, "cannot build the nodes' health check; Service FIPs are not routed");
                return;
            }
        };
        let prober = Prober::with_check(settings.clone(), Arc::new(()), check);
        let mut routing = Routing {
            ctx,
            urgent,
            nodes,
            prober,
            servers: Vec::new(),
            servers_at: None,
            last_report: None,
        };
        let mut health = routing.prober.subscribe();
        loop {
            if let Err(e) = routing.pass().await {
                warn!(error = %e, "routing Service FIPs: the cloud cannot be read; trying again");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
                _ = health.changed() => {}
            }
        }
    }
}

struct Routing {
    ctx: Arc<Context>,
    urgent: Arc<dyn Cloud>,
    nodes: Cache<Node>,
    prober: Prober,
    servers: Vec<Server>,
    servers_at: Option<Instant>,
    /// What [`Routing::report`] said last.
    last_report: Option<String>,
}

impl Routing {
    /// One pass: probe the eligible nodes; as the leader, move what the plan says.
    async fn pass(&mut self) -> Result<(), baton_cloud::CloudError> {
        let eligible: Vec<Arc<Node>> = self
            .nodes
            .state()
            .into_iter()
            .filter(|n| is_eligible(n))
            .collect();
        let targets: BTreeMap<String, SocketAddr> = eligible
            .iter()
            .filter_map(|n| {
                Some((
                    n.name_any(),
                    SocketAddr::new(node_address(n)?, KUBE_PROXY_HEALTH_PORT),
                ))
            })
            .collect();
        let addrs: Vec<SocketAddr> = targets
            .values()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // Only the leader probes, and only while there are Service FIPs: a probe per node per
        // interval is cheap, but not for nothing (a new leader keeps every FIP where it is until
        // its first probes say a node is down).
        if !self.ctx.leader.is_leader() {
            self.probe(&[]);
            return Ok(());
        }
        let tags = Tags::from([
            (USAGE_KEY.to_owned(), USAGE_VALUE.to_owned()),
            (CLUSTER_KEY.to_owned(), self.ctx.cluster_id.clone()),
        ]);
        let fips: Vec<_> = self
            .ctx
            .cloud
            .ips_tagged(&tags)
            .await?
            .into_iter()
            .filter(|ip| ip.ip_type == IpType::FloatingIp && !self.is_control_plane(ip))
            .collect();
        if fips.is_empty() {
            self.probe(&[]);
            return Ok(());
        }
        self.probe(&addrs);
        self.refresh_servers(&eligible).await?;
        let candidates: Vec<Candidate> = eligible
            .iter()
            .filter_map(|n| {
                let server = server_of(n, &self.servers)?;
                let health = targets
                    .get(&n.name_any())
                    .map_or(Health::Unknown, |a| self.prober.health(a));
                Some(Candidate {
                    server,
                    node: n.name_any(),
                    health,
                })
            })
            .collect();
        let now: Vec<_> = fips.iter().map(|ip| (ip.id.clone(), ip.target())).collect();
        let moves = plan(&now, &candidates);
        self.report(&now, &candidates, &eligible, moves.len());
        // Concurrently: each move waits for its action (about half a second on Hetzner), and the
        // client polls every running action in one read.
        futures::stream::iter(moves)
            .for_each_concurrent(MOVES_AT_ONCE, |m| {
                let address = fips.iter().find(|ip| ip.id == m.fip).map(|ip| ip.address);
                let node = candidates
                    .iter()
                    .find(|c| c.server == m.to)
                    .map_or_else(|| "?".to_owned(), |c| c.node.clone());
                // A move off a failed node is a failover: the urgent lane.
                let cloud = if m.why == Why::NodeDown { &self.urgent } else { &self.ctx.cloud };
                async move {
                    match cloud.retarget_ip(&m.fip, m.to).await {
                        Ok(_) => info!(
                            fip = %m.fip,
                            address = ?address,
                            node,
                            server = m.to.0,
                            from = m.from.map(|s| s.0),
                            why = m.why.as_str(),
                            "Service Floating IP routed"
                        ),
                        Err(e) if e.is_fenced() => debug!(fip = %m.fip, "not routed: no longer the leader"),
                        Err(e) => {
                            warn!(fip = %m.fip, address = ?address, node, error = %e, "cannot route the Service Floating IP");
                        }
                    }
                }
            })
            .await;
        Ok(())
    }

    /// Probes exactly `targets` from now on.
    fn probe(&mut self, targets: &[SocketAddr]) {
        if let Err(e) = self.prober.set_targets(targets) {
            warn!(error = %e, "cannot probe the nodes");
        }
    }

    /// Says (once per change) what the nodes look like when a FIP needs a node and none is
    /// healthy: each candidate's health, and the eligible Nodes without a known server.
    fn report(
        &mut self,
        fips: &[(baton_cloud::model::IpId, Option<ServerId>)],
        candidates: &[Candidate],
        eligible: &[Arc<Node>],
        moves: usize,
    ) {
        let unplaced = fips
            .iter()
            .filter(|(_, at)| {
                at.is_none_or(|s| !candidates.iter().any(|c| c.server == s && c.health == Health::Up))
            })
            .count();
        // While every candidate's first probes are out (a new leader) there is nothing to say.
        let first_probes = !candidates.is_empty() && candidates.iter().all(|c| c.health == Health::Unknown);
        let view = if unplaced > moves && !first_probes {
            let nodes: Vec<String> = candidates
                .iter()
                .map(|c| format!("{}={:?}", c.node, c.health))
                .collect();
            let unknown: Vec<String> = eligible
                .iter()
                .filter(|n| server_of(n, &self.servers).is_none())
                .map(|n| n.name_any())
                .collect();
            Some(format!(
                "candidates [{}]; eligible Nodes with no server of the project: [{}]",
                nodes.join(", "),
                unknown.join(", ")
            ))
        } else {
            None
        };
        if view != self.last_report {
            if let Some(v) = &view {
                warn!(
                    waiting = unplaced - moves,
                    "Service Floating IPs wait for a healthy node: {v}"
                );
            }
            self.last_report = view;
        }
    }

    /// Whether `ip` is the control-plane FIP (the endpoint loop's, never this loop's).
    fn is_control_plane(&self, ip: &baton_cloud::model::IpAddress) -> bool {
        self.ctx
            .config
            .fip_tag
            .as_ref()
            .is_some_and(|t| t.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
    }

    /// Reads the project's servers when due, or when an eligible Node names none of them.
    async fn refresh_servers(&mut self, eligible: &[Arc<Node>]) -> Result<(), baton_cloud::CloudError> {
        let due = self.servers_at.is_none_or(|t| t.elapsed() >= SERVERS_REFRESH);
        let unknown = eligible.iter().any(|n| server_of(n, &self.servers).is_none());
        // An unknown Node rereads at most every 10 s.
        let may_reread = self
            .servers_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        if due || (unknown && may_reread) {
            self.servers = self.ctx.cloud.servers().await?;
            self.servers_at = Some(Instant::now());
            debug!(servers = self.servers.len(), "servers read");
        }
        Ok(())
    }
}

/// The Node's server: by the id its provider ID names, else by name (the server's name).
fn server_of(node: &Node, servers: &[Server]) -> Option<ServerId> {
    if let Some(id) = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(|p| p.parse::<ProviderId>().ok())
    {
        return servers.iter().find(|s| s.id.0 == id.server_id()).map(|s| s.id);
    }
    let name = node.name_any();
    servers.iter().find(|s| s.hostname == name).map(|s| s.id)
}

/// The address kube-proxy's health check is reached on: the Node's InternalIP, else ExternalIP.
fn node_address(node: &Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["InternalIP", "ExternalIP"].iter().find_map(|kind| {
        addresses
            .iter()
            .find(|a| a.type_ == *kind)
            .and_then(|a| a.address.parse().ok())
    })
}
