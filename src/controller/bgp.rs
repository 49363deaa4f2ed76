//! BGP and the load-balancer hand-off, as cloud-provider-cherry does it: Local BGP on the project
//! and on each selected server, the node annotations kube-vip reads, and MetalLB's objects.
//!
//! ```text
//!  watch Nodes, Services ──► (debounced) pass()          leader only; level-triggered
//!     1. project: enable Local BGP once, read the local ASN
//!     2. nodes matching bgpNodeSelector with a provider ID:
//!          server BGP on (GET, PUT if off) ─► NodeBgp (cached, refreshed every RESYNC)
//!          node annotations <prefix>/bgp-peers-{{n}}-…   (merge patch; stale indexes nulled)
//!     3. metallb:///<ns>/?bgp-peer-mode=… only:
//!          Services (managed, within the prefix budget, with an address they may use
//!          (trust::address: this cluster's, their namespace allowed) that is neither a
//!          control-plane FIP nor routed to a server by the cloud) ─► desired objects
//!          list IPAddressPools / BGPAdvertisements / BGPPeers in <ns>
//!          metallb_actions(): server-side apply (manager "baton") | delete ours | leave others'
//! ```
//!
//! kube-vip and empty need nothing more than the node annotations and the Service IP annotation
//! (written by the Service controller, which also enforces the prefix budget on the Service).
//! Everything baton writes to MetalLB carries `app.kubernetes.io/managed-by: baton`; an object
//! without that label is never modified or deleted, even when its name is one baton wants —
//! except cloud-provider-cherry's (`cloud-provider: equinix-metal`), which baton adopts on a
//! switch from the CCM: the same names are taken over in place, the rest (its
//! `equinix-metal-bgp-adv`, a pool for the control-plane FIP) deleted once baton's own apply.

mod plan;

pub use plan::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::CloudError;
use baton_cloud::model::{Server, ServerId};
use baton_core::{LoadBalancerMode, ProviderId};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;

use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::context::object_ref;
use super::kit::{KubeCallError, NotLeader, timed};
use super::service::admission::{self, Handoff, Judge};
use super::service::{FipRoles, Scope, ServiceFacts, budget, facts_of, ip_annotation, scope_excluding};
use super::trust::address::{AddressPolicy, AddressRefusal};
use super::watches::{Cache, Watches, any_changed};
use super::{Context, FIELD_MANAGER, mirror};

/// How often everything is recomputed without a change, and how long a server's BGP facts are
/// trusted before they are read again.
pub const RESYNC: Duration = Duration::from_secs(600);
/// Changes arriving within this window are handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Retry delay after a failed pass.
const RETRY: Duration = Duration::from_secs(5);
/// How long the MetalLB objects as listed (with baton's own writes since applied to them) serve
/// before they are listed again. A pass reads them from memory, so what a pass costs the API
/// server does not grow with the pools (one per Service address: 10,000 at 10,000 Services).
/// Listed again sooner in a new term, and after a failed pass.
const METALLB_RELIST: Duration = Duration::from_secs(60);

/// The MetalLB objects (of the configured namespace) as listed at `at` in `term`, with baton's
/// own writes since.
struct Listed {
    at: Instant,
    term: Option<u64>,
    objects: BTreeMap<(Kind, String), Existing>,
}

/// Errors of one BGP pass; each names the failed step and the object.
#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    /// A cloud call failed.
    #[error("{step}: {source}")]
    Cloud {
        step: String,
        #[source]
        source: Box<CloudError>,
    },
    /// A Kubernetes call failed or timed out.
    #[error(transparent)]
    Kube(#[from] KubeCallError),
    /// The MetalLB CRDs are not installed.
    #[error("MetalLB's CRDs ({0}.metallb.io) are not installed: install MetalLB v0.13.2 or later")]
    NoCrds(&'static str),
    /// This replica lost the lease mid-pass.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}

impl BgpError {
    /// A stable category (log field and metric label).
    pub fn category(&self) -> &'static str {
        match self {
            Self::Cloud { source, .. } => source.category(),
            Self::Kube(e) => e.category(),
            Self::NoCrds(_) => "no_crds",
            Self::NotLeader(_) => "not_leader",
        }
    }
}

/// The `ApiResource` of a MetalLB kind.
pub fn api_resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(METALLB_GROUP, kind.version(), kind.kind()),
        kind.plural(),
    )
}

struct Cached {
    provider_id: String,
    fetched: Instant,
    bgp: NodeBgp,
}

/// The BGP controller's state between passes.
struct Bgp {
    ctx: Arc<Context>,
    mode: LoadBalancerMode,
    nodes: Cache<Node>,
    services: Cache<Service>,
    /// Every Namespace, for their labels (only with `serviceAllocationNamespaceSelector`).
    namespaces: Option<Cache<Namespace>>,
    /// Which addresses a Service may ask for ([`super::trust::address`]).
    policy: AddressPolicy,
    local_asn: Option<u32>,
    cache: HashMap<String, Cached>,
    /// Warnings already published (Event + log), so a steady problem is reported once.
    reported: HashSet<String>,
    /// Service addresses (shown in their ingress) the cached IP list did not show, already
    /// looked for in a fresh list.
    rechecked: HashSet<IpAddr>,
    /// The MetalLB objects ([`METALLB_RELIST`]).
    listed: Option<Listed>,
}

/// The BGP controller on the shared Node and Service watches, running until `shutdown`
/// resolves. Without a `loadbalancer`, BGP is off and the future ends at once.
pub fn run_bgp(
    ctx: Arc<Context>,
    watches: &mut Watches,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let mut changes = vec![watches.node_changes(), watches.service_changes()];
    // A namespace selector reads the Namespaces' labels; none: no Namespace is watched.
    let namespaces = ctx
        .config
        .service_allocation
        .namespace_selector
        .is_some()
        .then(|| {
            changes.push(watches.namespace_changes());
            watches.namespaces()
        });
    let inputs = (watches.nodes(), watches.services(), namespaces, changes);
    run(ctx, inputs, shutdown)
}

/// What the BGP controller reads: the Nodes, the Services, the Namespaces (only with a namespace
/// selector), and their change counters.
type Inputs = (
    Cache<Node>,
    Cache<Service>,
    Option<Cache<Namespace>>,
    Vec<watch::Receiver<u64>>,
);

async fn run(
    ctx: Arc<Context>,
    (nodes, services, namespaces, mut changes): Inputs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let Some(mode) = ctx.config.load_balancer.clone() else {
        info!("no loadbalancer configured: BGP is off");
        return;
    };
    let policy = AddressPolicy::new(&ctx.config, &ctx.cluster_id);
    let mut bgp = Bgp {
        ctx,
        mode,
        nodes,
        services,
        namespaces,
        policy,
        local_asn: None,
        cache: HashMap::new(),
        reported: HashSet::new(),
        rechecked: HashSet::new(),
        listed: None,
    };
    // Each pass is a unit of work (`/health`); waiting for the watches, leadership or a change
    // is idle time.
    let heartbeat = bgp.ctx.heartbeats.start_loop("bgp");
    let work = async move {
        let ready = async {
            bgp.nodes.wait_until_ready().await.is_ok()
                && bgp.services.wait_until_ready().await.is_ok()
                && match &bgp.namespaces {
                    Some(namespaces) => namespaces.wait_until_ready().await.is_ok(),
                    None => true,
                }
        };
        if !heartbeat.idle(ready).await {
            return;
        }
        let mut leader = bgp.ctx.leader.clone();
        loop {
            heartbeat.idle(leader.wait()).await;
            let next = match bgp.pass().await {
                Ok(()) => {
                    bgp.ctx.metrics.reconciled("bgp");
                    RESYNC
                }
                Err(error) => {
                    bgp.ctx.metrics.reconcile_failed("bgp", error.category());
                    warn!(%error, category = error.category(), "BGP pass failed; retrying");
                    // Installing MetalLB takes a person: do not spin on it.
                    if matches!(error, BgpError::NoCrds(_)) {
                        Duration::from_secs(60)
                    } else {
                        RETRY
                    }
                }
            };
            heartbeat
                .idle(async {
                    let _ = tokio::time::timeout(next, any_changed(&mut changes)).await;
                    tokio::time::sleep(DEBOUNCE).await;
                })
                .await;
        }
    };
    tokio::select! {
        () = shutdown => {}
        () = work => {}
    }
}

impl Bgp {
    /// One level-triggered pass over every selected node and (MetalLB) every Service.
    async fn pass(&mut self) -> Result<(), BgpError> {
        let local_asn = self.local_asn().await?;
        let mut peered = Vec::new();
        let mut failed = None;
        let selected = self.selected_nodes();
        // Forget the servers of Nodes that are gone or no longer selected.
        self.cache
            .retain(|name, _| selected.iter().any(|n| n.metadata.name.as_deref() == Some(name)));
        // Servers whose facts are due are read with one list call when there are several (an
        // idle cluster's cost then does not grow with its Nodes), else one by one.
        let due: Vec<&Arc<Node>> = selected.iter().filter(|n| self.due(n)).collect();
        let mut listed: HashMap<ServerId, Server> = HashMap::new();
        if due.len() > 1 {
            let servers = self.ctx.cloud.servers().await.map_err(|source| BgpError::Cloud {
                step: "listing the project's servers".into(),
                source: Box::new(source),
            })?;
            listed = servers.into_iter().map(|s| (s.id, s)).collect();
        }
        for node in selected {
            match self.node(&node, local_asn, &mut listed).await {
                Ok(Some(bgp)) => peered.push(bgp),
                Ok(None) => {}
                Err(e @ BgpError::NotLeader(_)) => return Err(e),
                Err(e) => {
                    warn!(node = %node.name_any(), error = %e, "BGP for the node failed");
                    failed = Some(e);
                }
            }
        }
        peered.sort_by(|a, b| a.node.cmp(&b.node));
        if let LoadBalancerMode::MetalLb { namespace, peer_mode } = self.mode.clone() {
            self.metallb(&namespace, peer_mode, &peered).await?;
        }
        failed.map_or(Ok(()), Err)
    }

    /// Enables Local BGP on the project (once) and returns its ASN.
    async fn local_asn(&mut self) -> Result<u32, BgpError> {
        if let Some(asn) = self.local_asn {
            return Ok(asn);
        }
        self.ctx.leader.ensure("enabling Local BGP on the project")?;
        let project = self
            .ctx
            .cloud
            .enable_project_bgp()
            .await
            .map_err(|source| BgpError::Cloud {
                step: "enabling Local BGP on the project".into(),
                source: Box::new(source),
            })?;
        info!(
            local_asn = project.bgp.local_asn,
            "Local BGP is enabled on the project"
        );
        self.local_asn = Some(project.bgp.local_asn);
        Ok(project.bgp.local_asn)
    }

    fn selected_nodes(&self) -> Vec<Arc<Node>> {
        let selector = self.ctx.config.bgp_node_selector.as_ref();
        let mut nodes: Vec<Arc<Node>> = self
            .nodes
            .state()
            .into_iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter(|n| selector.is_none_or(|s| s.matches(n.labels())))
            .collect();
        nodes.sort_by_key(|n| n.name_any());
        nodes
    }

    async fn report(&mut self, node: &Node, key: String, reason: &str, message: String) {
        if self.reported.insert(key) {
            warn!(node = %node.name_any(), reason, "{message}");
            self.ctx
                .event(node, EventType::Warning, reason, "ConfigureBGP", message)
                .await;
        }
    }

    /// Server BGP on, the node's session facts, and its annotations. `None`: the node cannot
    /// peer yet (no provider ID, or unusable facts, reported by an Event).
    /// Whether `node`'s server facts must be read (it has a provider ID and none fresh cached).
    fn due(&self, node: &Node) -> bool {
        let Some(provider_id) = provider_id(node) else {
            return false;
        };
        !self
            .cache
            .get(&node.name_any())
            .is_some_and(|c| c.provider_id == provider_id && c.fetched.elapsed() < RESYNC)
    }

    async fn node(
        &mut self,
        node: &Node,
        local_asn: u32,
        listed: &mut HashMap<ServerId, Server>,
    ) -> Result<Option<NodeBgp>, BgpError> {
        let name = node.name_any();
        let Some(provider_id) = provider_id(node) else {
            debug!(node = %name, "no provider ID yet; BGP waits for node initialisation");
            return Ok(None);
        };
        let id = match provider_id.parse::<ProviderId>() {
            Ok(id) => ServerId(id.server_id()),
            Err(e) => {
                self.report(
                    node,
                    format!("{name}/provider-id/{provider_id}"),
                    "InvalidProviderID",
                    format!("cannot enable BGP: provider ID {provider_id:?}: {e}"),
                )
                .await;
                return Ok(None);
            }
        };
        let fresh = self
            .cache
            .get(&name)
            .filter(|c| c.provider_id == provider_id && c.fetched.elapsed() < RESYNC)
            .map(|c| c.bgp.clone());
        let bgp = if let Some(bgp) = fresh {
            bgp
        } else {
            let cloud_err = |step: &str| {
                let step = format!("node {name}: {step}");
                move |source| BgpError::Cloud {
                    step,
                    source: Box::new(source),
                }
            };
            let mut server = match listed.remove(&id) {
                Some(server) => server,
                None => self
                    .ctx
                    .cloud
                    .server(id)
                    .await
                    .map_err(cloud_err("reading its server"))?,
            };
            if !server.bgp.enabled {
                self.ctx.leader.ensure("enabling BGP on a server")?;
                let ips = std::mem::take(&mut server.ip_addresses);
                server = self
                    .ctx
                    .cloud
                    .update_server_bgp(id, true)
                    .await
                    .map_err(cloud_err("enabling BGP on its server"))?;
                if server.ip_addresses.is_empty() {
                    server.ip_addresses = ips;
                }
                info!(node = %name, server = %id, "BGP enabled on the server");
            }
            match node_bgp(&name, &server, local_asn) {
                Ok(bgp) => {
                    self.cache.insert(
                        name.clone(),
                        Cached {
                            provider_id: provider_id.clone(),
                            fetched: Instant::now(),
                            bgp: bgp.clone(),
                        },
                    );
                    bgp
                }
                Err(e) => {
                    self.report(node, format!("{name}/facts/{e}"), "BGPUnavailable", e.to_string())
                        .await;
                    return Ok(None);
                }
            }
        };
        let desired = desired_node_annotations(&bgp, &self.ctx.config.annotations);
        let patch = node_annotation_patch(node.annotations(), &desired, &self.ctx.config.annotations);
        if !patch.is_empty() {
            self.ctx.leader.ensure("annotating a node")?;
            let body = json!({"metadata": {"annotations": patch}});
            let api = Api::<Node>::all(self.ctx.client.clone());
            timed(
                format!("annotating node {name}"),
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await?;
            debug!(node = %name, peers = bgp.peers.len(), "node BGP annotations written");
            let message = format!("{} BGP session annotations written", patch.len());
            let (ok, action) = (EventType::Normal, "ConfigureBGP");
            self.ctx.event(node, ok, "BGPAnnotated", action, message).await;
        }
        Ok(Some(bgp))
    }

    /// Every namespace's labels, when a namespace selector needs them (`None` otherwise).
    fn namespace_labels(&self) -> Option<BTreeMap<String, BTreeMap<String, String>>> {
        let namespaces = self.namespaces.as_ref()?;
        Some(
            namespaces
                .state()
                .iter()
                .map(|ns| (ns.name_any(), ns.labels().clone()))
                .collect(),
        )
    }

    /// The Services whose address MetalLB may announce, judged on the IP list `ips`: managed,
    /// not being deleted, within the prefix budget, with an address they may use
    /// ([`admission::Handoff`]: one they ask for that is this cluster's and that their namespace
    /// may ask for, else their own recorded FIP) that is neither a control-plane FIP nor a FIP the
    /// cloud routes to a server (`roles`; logged once per Service and address), and that their
    /// ingress shows. MetalLB's speaker announces only ingress addresses anyway; waiting for the
    /// ingress means a pool follows the Service controller's decision, which it takes on a fresh
    /// read of the cloud (a FIP routed since the shared list was read never gets a pool). A
    /// refused request is logged once (its Service gets the Service controller's Warning Event).
    ///
    /// Also returns the addresses the ingress shows that `ips` does not hold (a FIP reserved or
    /// tagged since the list was read): [`Self::lb_services`] looks for them in a fresher list.
    fn lb_candidates(
        &mut self,
        roles: &FipRoles,
        ips: &[Arc<baton_cloud::model::IpAddress>],
        labels: Option<&BTreeMap<String, BTreeMap<String, String>>>,
    ) -> (Vec<LbService>, HashSet<IpAddr>) {
        let facts: Vec<ServiceFacts> = self.services.state().iter().map(|s| facts_of(s)).collect();
        let mirror_name = mirror::service_name(&self.ctx.config.prefix);
        let judge = Judge::new(&self.policy, ips, labels, &facts);
        // Each Service judged once.
        let handoffs: Vec<Handoff> = facts.iter().map(|f| judge.handoff(f, &self.mode)).collect();
        let refused = admission::refused_of(facts.iter().zip(handoffs.iter().cloned()));
        let admitted = budget::admitted(
            &facts,
            ("kube-system", &mirror_name),
            &roles.never_announced(),
            &refused,
            self.ctx.config.bgp_prefix_limit,
        );
        let mut out: Vec<LbService> = Vec::new();
        let mut missing = HashSet::new();
        for (f, handoff) in facts.iter().zip(handoffs) {
            // Never a control-plane FIP, whatever the Service's name (CPEM #258).
            let managed = scope_excluding(
                f,
                ("kube-system", &mirror_name),
                &roles.control_plane,
                Some(ip_annotation(&self.mode)),
            ) == Scope::Managed;
            if !managed {
                continue;
            }
            let shown = |ip: IpAddr| f.ingress_ips.iter().any(|i| i.parse() == Ok(ip));
            let ip = match handoff {
                Handoff::Nothing => continue,
                Handoff::Address(ip) => ip,
                Handoff::Refused { refusal, keeps } => {
                    let address = refusal.address();
                    if matches!(*refusal, AddressRefusal::NotInProject { .. }) && shown(address) {
                        missing.insert(address);
                    }
                    if self.reported.insert(format!("refused/{}/{address}", f.key())) {
                        info!(service = %f.key(), %address, reason = refusal.reason(), "the address the Service asks for is refused: no MetalLB pool for it");
                    }
                    match keeps {
                        Some(ip) => ip,
                        None => continue,
                    }
                }
            };
            // The cloud routes this FIP to one server: announcing it from the BGP nodes too
            // would fight that route (docs/services.md, "Bring your own routed FIP").
            if let Some(server) = roles.routed_to(ip) {
                if self.reported.insert(format!("routed/{}/{ip}", f.key())) {
                    info!(service = %f.key(), %ip, server, "the Service's Floating IP is routed to a server by the cloud: no MetalLB pool for it");
                }
                continue;
            }
            if shown(ip) && admitted.admitted.contains(&f.key()) {
                out.push(LbService {
                    namespace: f.namespace.clone(),
                    name: f.name.clone(),
                    ip,
                });
            }
        }
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        (out, missing)
    }

    /// The Services MetalLB announces: [`Self::lb_candidates`]. An address a Service's ingress
    /// shows that the cached IP list does not hold is looked for in a fresh list once (a FIP the
    /// user reserved a moment ago); still missing, it gets no pool.
    async fn lb_services(
        &mut self,
        roles: &FipRoles,
        ips: baton_cloud::model::IpList,
    ) -> Result<Vec<LbService>, BgpError> {
        let read = |source| BgpError::Cloud {
            step: "listing Floating IPs".into(),
            source: Box::new(source),
        };
        let labels = self.namespace_labels();
        let (mut services, mut missing) = self.lb_candidates(roles, &ips, labels.as_ref());
        if missing.iter().any(|ip| !self.rechecked.contains(ip)) {
            // First the shared list as it is now: the Services were read after it, and a FIP
            // baton reserved in between is in it already (a write's answer goes straight in).
            // Only an address still missing costs a fresh list.
            let now = self.ctx.cloud.ips().await.map_err(read)?;
            (services, missing) = self.lb_candidates(roles, &now, labels.as_ref());
        }
        if missing.iter().any(|ip| !self.rechecked.contains(ip)) {
            self.rechecked.extend(missing.iter().copied());
            self.ctx.cloud.invalidate_ips();
            let fresh = self.ctx.cloud.ips().await.map_err(read)?;
            (services, missing) = self.lb_candidates(roles, &fresh, labels.as_ref());
        }
        for ip in missing {
            debug!(%ip, "an address a Service's ingress shows is not the project's: no pool for it");
        }
        Ok(services)
    }

    /// Every IPAddressPool, BGPAdvertisement and BGPPeer in MetalLB's namespace.
    async fn existing_metallb_objects(&self, namespace: &str) -> Result<Vec<Existing>, BgpError> {
        let mut existing = Vec::new();
        for kind in Kind::ALL {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.ctx.client.clone(), namespace, &api_resource(kind));
            let list = match api.list(&ListParams::default()).await {
                Ok(list) => list,
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Err(BgpError::NoCrds(kind.plural()));
                }
                Err(source) => {
                    return Err(KubeCallError::failed(
                        format!("listing {} in {namespace}", kind.plural()),
                        source,
                    )
                    .into());
                }
            };
            for obj in list.items {
                let labels = obj.labels().clone();
                existing.push(Existing {
                    kind,
                    name: obj.name_any(),
                    ours: adoptable(&labels),
                    labels,
                    spec: obj.data.get("spec").cloned().unwrap_or_default(),
                });
            }
        }
        Ok(existing)
    }

    async fn metallb(
        &mut self,
        namespace: &str,
        peer_mode: baton_core::BgpPeerMode,
        nodes: &[NodeBgp],
    ) -> Result<(), BgpError> {
        // The control-plane FIPs and the FIPs the cloud routes to a server (from the shared IP
        // list): never in a pool. Without the list nothing is changed (failing closed: no pool
        // for an address that may be one).
        let ips = self.ctx.cloud.ips().await.map_err(|source| BgpError::Cloud {
            step: "listing Floating IPs".into(),
            source: Box::new(source),
        })?;
        let all: Vec<ServiceFacts> = self.services.state().iter().map(|s| facts_of(s)).collect();
        let mirror_name = mirror::service_name(&self.ctx.config.prefix);
        let roles = FipRoles::of(
            self.ctx.config.fip_tag.as_ref(),
            &ips,
            &all,
            ("kube-system", &mirror_name),
        );
        let services = self.lb_services(&roles, ips).await?;
        let desired = desired_metallb_objects(
            &services,
            nodes,
            peer_mode,
            &self.ctx.config.prefix,
            self.ctx.config.bgp_node_selector.as_ref(),
        );
        let term = self.ctx.leader.in_term();
        let relist = self
            .listed
            .as_ref()
            .is_none_or(|l| l.term != term || l.at.elapsed() >= METALLB_RELIST);
        if relist {
            let at = Instant::now();
            let objects = self.existing_metallb_objects(namespace).await?;
            self.listed = Some(Listed {
                at,
                term,
                objects: objects
                    .into_iter()
                    .map(|e| ((e.kind, e.name.clone()), e))
                    .collect(),
            });
        }
        let actions = match &self.listed {
            Some(listed) => metallb_actions(&desired, listed.objects.values()),
            None => Vec::new(),
        };
        let done = self.metallb_act(namespace, actions).await;
        if done.is_err() {
            // What the failed write did is unknown: the next pass lists again.
            self.listed = None;
        }
        done
    }

    /// Carries out `actions`, and keeps [`Listed`] as they leave the objects.
    async fn metallb_act(&mut self, namespace: &str, actions: Vec<Action>) -> Result<(), BgpError> {
        for action in actions {
            match action {
                Action::Apply(obj) => {
                    self.apply_metallb(namespace, &obj).await?;
                    self.seen(Existing {
                        kind: obj.kind,
                        name: obj.name,
                        ours: true,
                        labels: obj.labels,
                        spec: obj.spec,
                    });
                }
                Action::Delete(kind, name) => {
                    self.ctx.leader.ensure("deleting a MetalLB object")?;
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(self.ctx.client.clone(), namespace, &api_resource(kind));
                    let step = format!("deleting {} {namespace}/{name}", kind.kind());
                    match timed(step, api.delete(&name, &DeleteParams::default())).await {
                        Ok(_) => {
                            info!(kind = kind.kind(), %name, %namespace, "MetalLB object deleted");
                            let note = format!(
                                "{} {name} deleted by baton: no Service, node or peer it manages needs it any more",
                                kind.kind()
                            );
                            self.metallb_event(kind, namespace, &name, EventType::Normal, "Deleted", note)
                                .await;
                        }
                        Err(e) if e.status() == Some(404) => {}
                        Err(e) => return Err(e.into()),
                    }
                    if let Some(listed) = self.listed.as_mut() {
                        listed.objects.remove(&(kind, name));
                    }
                }
                Action::Label(kind, name, labels) => {
                    self.ctx.leader.ensure("labelling a MetalLB object")?;
                    let api: Api<DynamicObject> =
                        Api::namespaced_with(self.ctx.client.clone(), namespace, &api_resource(kind));
                    let patch = json!({"metadata": {"labels": labels}});
                    timed(
                        format!("labelling {} {namespace}/{name}", kind.kind()),
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
                    )
                    .await?;
                    info!(kind = kind.kind(), %name, %namespace, "MetalLB object adopted (labelled; its spec already means baton's)");
                    if let Some(e) = self
                        .listed
                        .as_mut()
                        .and_then(|l| l.objects.get_mut(&(kind, name.clone())))
                    {
                        e.labels.extend(labels.clone());
                        e.ours = true;
                    }
                    let note = format!(
                        "{} {name} adopted by baton: its spec already means what baton wants, so only baton's label was added (a rewritten BGPPeer would reset its BGP session)",
                        kind.kind()
                    );
                    self.metallb_event(kind, namespace, &name, EventType::Normal, "Adopted", note)
                        .await;
                }
                Action::Conflict(kind, name) => {
                    if self.reported.insert(format!("conflict/{kind:?}/{name}")) {
                        let note = format!(
                            "baton needs this name but the object lacks label {MANAGED_BY_LABEL}={MANAGED_BY}; it is left alone"
                        );
                        self.metallb_event(kind, namespace, &name, EventType::Warning, "NotOwned", note)
                            .await;
                        warn!(
                            kind = kind.kind(),
                            %name,
                            %namespace,
                            "an object of this name exists without label {MANAGED_BY_LABEL}={MANAGED_BY} (or cloud-provider-cherry's {}={}); it is not baton's and is left alone",
                            CCM_LABEL.0,
                            CCM_LABEL.1
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// An object as baton just wrote it, in [`Listed`].
    fn seen(&mut self, existing: Existing) {
        if let Some(listed) = self.listed.as_mut() {
            listed
                .objects
                .insert((existing.kind, existing.name.clone()), existing);
        }
    }

    /// Applies one of baton's MetalLB objects (server-side apply) and says so on it.
    async fn apply_metallb(&self, namespace: &str, obj: &MetalLbObject) -> Result<(), BgpError> {
        self.ctx.leader.ensure("applying a MetalLB object")?;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.ctx.client.clone(), namespace, &api_resource(obj.kind));
        let body = json!({
            "apiVersion": format!("{METALLB_GROUP}/{}", obj.kind.version()),
            "kind": obj.kind.kind(),
            "metadata": {"name": obj.name, "namespace": namespace, "labels": obj.labels},
            "spec": obj.spec,
        });
        timed(
            format!("applying {} {namespace}/{}", obj.kind.kind(), obj.name),
            api.patch(
                &obj.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            ),
        )
        .await?;
        info!(kind = obj.kind.kind(), name = %obj.name, %namespace, "MetalLB object applied");
        let note = format!("{} {} applied by baton", obj.kind.kind(), obj.name);
        self.metallb_event(obj.kind, namespace, &obj.name, EventType::Normal, "Applied", note)
            .await;
        Ok(())
    }

    async fn metallb_event(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let api_version = format!("{METALLB_GROUP}/{}", kind.version());
        let reference = object_ref(&api_version, kind.kind(), Some(namespace), name);
        self.ctx
            .event_on(&reference, None, type_, reason, "ConfigureMetalLB", note)
            .await;
    }
}

/// A Node's provider ID, if it has a non-blank one.
fn provider_id(node: &Node) -> Option<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .filter(|p| !p.trim().is_empty())
}

#[cfg(test)]
mod tests;
