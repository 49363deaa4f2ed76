//! The candidates a FIP may move to: the API servers `default/kubernetes` lists and every FIP
//! holder, matched to their server and Node, with their API server's health and (with
//! `sniRouterPort`) their SNI router's ([`RouterProbes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use baton_cloud::model::{IpType, Server};
use baton_core::failover::Candidate;
use baton_core::health::Health;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt as _;

use super::EndpointRef;
use crate::controller::Context;
use crate::probe::{ProbeError, ProbeSettings, Prober};

/// What the API server prober probes: every candidate, and each FIP unless `useHostIP`.
pub(super) fn probe_targets(
    ctx: &Context,
    probe_addrs: &[SocketAddr],
    endpoints: &[EndpointRef],
) -> Vec<SocketAddr> {
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
pub(super) struct RouterProbes {
    port: u16,
    prober: Option<Prober>,
}

impl RouterProbes {
    pub(super) fn new(port: u16, settings: &ProbeSettings) -> Self {
        let prober = (port != 0)
            .then(|| Prober::with_check(settings.clone(), Arc::new(()), crate::sni::health::router_check()));
        Self { port, prober }
    }

    pub(super) fn is_on(&self) -> bool {
        self.prober.is_some()
    }

    /// Health changes (none when off: do not wait on it then).
    pub(super) fn subscribe(&self) -> tokio::sync::watch::Receiver<BTreeMap<SocketAddr, Health>> {
        match &self.prober {
            Some(p) => p.subscribe(),
            None => tokio::sync::watch::channel(BTreeMap::new()).1,
        }
    }

    /// Probes the router on each candidate API server's address.
    pub(super) fn follow(&mut self, candidates: &[SocketAddr]) -> Result<(), ProbeError> {
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

/// The API servers listed by `default/kubernetes` (ready or without conditions), as address:port.
pub(super) fn api_server_addresses(slices: &[Arc<EndpointSlice>]) -> Vec<SocketAddr> {
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
pub(super) fn probe_addresses(
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
pub(super) fn candidates(
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

/// The Node of `server`: by provider ID (`cherryservers://<id>`, a bare `<id>`, or Hetzner's
/// `hcloud://<id>`: the cloud is the one configured), or (not yet initialised) by name = hostname,
/// as the node controller matches them.
pub(super) fn node_of<'a>(nodes: &'a [Arc<Node>], server: &Server) -> Option<&'a Arc<Node>> {
    let names_server = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| p.parse::<baton_core::ProviderId>().ok())
            .is_some_and(|p| p.server_id() == server.id.0)
    };
    nodes.iter().find(|n| names_server(n)).or_else(|| {
        nodes.iter().find(|n| {
            n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_none()
                && !server.hostname.is_empty()
                && n.metadata.name.as_deref() == Some(server.hostname.as_str())
        })
    })
}

pub(super) fn server_by_ip(servers: &[Server], ip: IpAddr) -> Option<&Server> {
    servers.iter().find(|s| {
        s.ip_addresses
            .iter()
            .any(|a| a.address == ip && matches!(a.ip_type, IpType::PrimaryIp | IpType::PrivateIp))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
