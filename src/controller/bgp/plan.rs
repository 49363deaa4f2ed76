//! The pure part of the BGP controller: what a node's BGP session looks like, the node
//! annotations that describe it, and the MetalLB objects that configure it.
//!
//! ```text
//!  cloud Server + project ASN ──► node_bgp() ──► NodeBgp ──► desired_node_annotations()
//!                                                  │            └► node_annotation_patch()  (sets + stale nulls)
//!  Services within the prefix budget (service::budget) ──► LbService ─┐
//!                                                  └───────┴► desired_metallb_objects(mode)
//!                                                              IPAddressPool per IP, BGPAdvertisement,
//!                                                              BGPPeers per node (native) / region (frr)
//!  existing objects (labelled or not) ──► metallb_actions() ──► Apply | Delete | Conflict
//! ```
//!
//! No I/O here: everything is a function of plain values, unit-tested in `tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use baton_cloud::model::{IpType, Server};
use baton_core::LabelSelector;
use baton_core::load_balancer::BgpPeerMode;
use baton_core::selector::Requirement;
use serde_json::{Value, json};

use crate::config::Annotations;

/// The label on every object baton owns; objects without it are never modified or deleted.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "baton";
/// The label cloud-provider-cherry (and CPEM before it) puts on every MetalLB object it writes.
/// baton adopts such objects on a switch from the CCM ([`adoptable`]).
pub const CCM_LABEL: (&str, &str) = ("cloud-provider", "equinix-metal");

/// Whether baton may modify or delete a MetalLB object with these labels: its own, or one
/// cloud-provider-cherry left (baton replaces the CCM; its pools of the same name are taken
/// over in place, its advertisement and pools baton does not want are deleted after baton's own
/// objects are applied).
pub fn adoptable(labels: &BTreeMap<String, String>) -> bool {
    labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
        || labels.get(CCM_LABEL.0).map(String::as_str) == Some(CCM_LABEL.1)
}

/// On an IPAddressPool: the namespace of the Service it serves.
pub const SERVICE_NAMESPACE_LABEL: &str = "baton.dev/service-namespace";
/// On an IPAddressPool: the name of the Service it serves.
pub const SERVICE_NAME_LABEL: &str = "baton.dev/service-name";
/// The node label MetalLB's native-mode peers select on.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The region label (set by baton's node controller from `region.slug`).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The BGP port of Cherry's route servers.
pub const BGP_PORT: u16 = 179;
/// The hold time the Cherry CCM configures.
pub const HOLD_TIME: &str = "30s";
/// MetalLB's API group.
pub const METALLB_GROUP: &str = "metallb.io";

/// One node's BGP session facts (the Cherry CCM's `NodeBGPInfo`: from the server's `bgp` and
/// its region's route servers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBgp {
    /// The Kubernetes node name.
    pub node: String,
    /// The project's ASN (`project.bgp.local_asn`).
    pub local_asn: u32,
    /// The route servers' ASN (`server.region.bgp.asn`).
    pub peer_asn: u32,
    /// The route servers (`server.region.bgp.hosts`), sorted.
    pub peers: Vec<IpAddr>,
    /// The server's first public IPv4 (`primary-ip`).
    pub src_ip: IpAddr,
    /// The server's region slug.
    pub region: String,
}

/// Why a server's BGP facts are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeBgpError {
    /// The server has no region (with BGP route servers).
    #[error("server {0} has no region with BGP route servers")]
    NoRegion(String),
    /// A route server address does not parse.
    #[error("server {server}: route server address {address:?} is not an IP address")]
    BadPeer { server: String, address: String },
    /// No public IPv4 to peer from.
    #[error("server {0} has no public IPv4 address (primary-ip) to peer from")]
    NoSourceIp(String),
    /// The project has no ASN (BGP not enabled on it).
    #[error("the project has no local ASN (Local BGP is not enabled)")]
    NoLocalAsn,
}

/// A node's BGP facts from its server, as the Cherry CCM reads them: peers are the region's
/// route servers (sorted), the source is the first `primary-ip` IPv4.
pub fn node_bgp(node: &str, server: &Server, local_asn: u32) -> Result<NodeBgp, NodeBgpError> {
    if local_asn == 0 {
        return Err(NodeBgpError::NoLocalAsn);
    }
    let sid = server.id.to_string();
    let region = server
        .region
        .as_ref()
        .filter(|r| !r.bgp.hosts.is_empty() && r.bgp.asn != 0)
        .ok_or_else(|| NodeBgpError::NoRegion(sid.clone()))?;
    let mut peers = Vec::new();
    for host in &region.bgp.hosts {
        peers.push(host.trim().parse::<IpAddr>().map_err(|_| NodeBgpError::BadPeer {
            server: sid.clone(),
            address: host.clone(),
        })?);
    }
    peers.sort();
    peers.dedup();
    let src_ip = server
        .first_ipv4(&IpType::PrimaryIp)
        .ok_or(NodeBgpError::NoSourceIp(sid))?;
    Ok(NodeBgp {
        node: node.to_owned(),
        local_asn,
        peer_asn: region.bgp.asn,
        peers,
        src_ip,
        region: region.slug.clone(),
    })
}

fn indexed(pattern: &str, n: usize) -> String {
    pattern.replace("{{n}}", &n.to_string())
}

/// The node annotations for `bgp` (cloud-provider-cherry's node annotations): per peer index `n`, from 0 in
/// peer order, the node ASN, peer ASN, peer IP, source IP and multi-hop (`"true"`, as the Cherry
/// CCM writes it for kube-vip).
pub fn desired_node_annotations(bgp: &NodeBgp, names: &Annotations) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (n, peer) in bgp.peers.iter().enumerate() {
        out.insert(indexed(&names.local_asn, n), bgp.local_asn.to_string());
        out.insert(indexed(&names.peer_asn, n), bgp.peer_asn.to_string());
        out.insert(indexed(&names.peer_ip, n), peer.to_string());
        out.insert(indexed(&names.src_ip, n), bgp.src_ip.to_string());
        out.insert(indexed(&names.multi_hop, n), "true".to_owned());
    }
    out
}

/// Whether `key` is an instance of `pattern` (`…{{n}}…` with `n` a decimal number).
fn is_instance(pattern: &str, key: &str) -> bool {
    let Some((before, after)) = pattern.split_once("{{n}}") else {
        return false;
    };
    key.len() > before.len() + after.len()
        && key.starts_with(before)
        && key.ends_with(after)
        && key[before.len()..key.len() - after.len()]
            .bytes()
            .all(|b| b.is_ascii_digit())
}

/// Whether `key` is one of the peer annotations baton writes (any index).
pub fn is_peer_annotation(key: &str, names: &Annotations) -> bool {
    [
        &names.local_asn,
        &names.peer_asn,
        &names.peer_ip,
        &names.src_ip,
        &names.multi_hop,
    ]
    .iter()
    .any(|p| is_instance(p, key))
}

/// The merge patch taking a node's annotations from `current` to `desired`: values to set, and
/// `None` for peer annotations of indexes that are no longer wanted (the Cherry CCM never removes
/// them). Empty when nothing changes.
pub fn node_annotation_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    names: &Annotations,
) -> BTreeMap<String, Option<String>> {
    let mut patch: BTreeMap<String, Option<String>> = desired
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    for key in current.keys() {
        if !desired.contains_key(key) && is_peer_annotation(key, names) {
            patch.insert(key.clone(), None);
        }
    }
    patch
}

/// A Service handed to MetalLB: its key and the IP it announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbService {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The address.
    pub ip: IpAddr,
}

/// The MetalLB kinds baton writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `IPAddressPool` (`metallb.io/v1beta1`).
    IpAddressPool,
    /// `BGPAdvertisement` (`metallb.io/v1beta1`).
    BgpAdvertisement,
    /// `BGPPeer` (`metallb.io/v1beta2`).
    BgpPeer,
}

impl Kind {
    /// Every kind, in apply order (pools before the advertisement that names them).
    pub const ALL: [Self; 3] = [Self::IpAddressPool, Self::BgpAdvertisement, Self::BgpPeer];

    /// The kind's name.
    pub fn kind(self) -> &'static str {
        match self {
            Self::IpAddressPool => "IPAddressPool",
            Self::BgpAdvertisement => "BGPAdvertisement",
            Self::BgpPeer => "BGPPeer",
        }
    }

    /// The API version baton writes.
    pub fn version(self) -> &'static str {
        match self {
            Self::IpAddressPool | Self::BgpAdvertisement => "v1beta1",
            Self::BgpPeer => "v1beta2",
        }
    }

    /// The resource (plural).
    pub fn plural(self) -> &'static str {
        match self {
            Self::IpAddressPool => "ipaddresspools",
            Self::BgpAdvertisement => "bgpadvertisements",
            Self::BgpPeer => "bgppeers",
        }
    }
}

/// A MetalLB object baton wants to exist.
#[derive(Debug, Clone, PartialEq)]
pub struct MetalLbObject {
    /// Its kind.
    pub kind: Kind,
    /// Its name (in the configured MetalLB namespace).
    pub name: String,
    /// Its labels (always including [`MANAGED_BY_LABEL`]).
    pub labels: BTreeMap<String, String>,
    /// Its `spec`.
    pub spec: Value,
}

fn owned_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())])
}

/// The IPAddressPool name of a Service: `<namespace>.<name>`, as the Cherry CCM names it (both
/// parts are DNS labels, so the result is a valid object name).
pub fn pool_name(namespace: &str, name: &str) -> String {
    format!("{namespace}.{name}")
}

/// The BGPAdvertisement name.
pub fn advertisement_name(prefix: &str) -> String {
    format!("{prefix}-bgp-adv")
}

/// A valid object name from free text (a region slug): lower case, `[a-z0-9-]`, trimmed.
fn dns_name(text: &str) -> String {
    let s: String = text
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.trim_matches('-').to_owned()
}

fn host_prefix(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

fn selector_terms(selector: Option<&LabelSelector>) -> (BTreeMap<String, String>, Vec<Value>) {
    let mut labels = BTreeMap::new();
    let mut expressions = Vec::new();
    for r in selector.map(LabelSelector::requirements).unwrap_or_default() {
        match r {
            Requirement::Equals(k, v) => {
                labels.insert(k.clone(), v.clone());
            }
            Requirement::NotEquals(k, v) => {
                expressions.push(json!({"key": k, "operator": "NotIn", "values": [v]}));
            }
            Requirement::In(k, vs) => expressions.push(json!({"key": k, "operator": "In", "values": vs})),
            Requirement::NotIn(k, vs) => {
                expressions.push(json!({"key": k, "operator": "NotIn", "values": vs}));
            }
            Requirement::Exists(k) => expressions.push(json!({"key": k, "operator": "Exists"})),
            Requirement::DoesNotExist(k) => {
                expressions.push(json!({"key": k, "operator": "DoesNotExist"}));
            }
        }
    }
    (labels, expressions)
}

/// Everything baton wants in MetalLB's namespace (what cloud-provider-cherry writes for MetalLB):
/// - one IPAddressPool per announced address (`<ns>.<name>` of the first Service using it),
///   `addresses: [<ip>/32]`, `autoAssign: false`;
/// - one BGPAdvertisement `<prefix>-bgp-adv` naming every pool (none when there is no pool: an
///   advertisement with an empty pool list would announce *every* pool of the cluster);
/// - BGPPeers: `native`, one per node and route server (`<node>-<i>`, selecting the node by
///   hostname, sourced from its public IP); `frr`, one per region and route server
///   (`<region>-<i>`, multi-hop, selecting the BGP nodes of the region: FRR refuses two peers
///   with one address); `none`, no peer.
pub fn desired_metallb_objects(
    services: &[LbService],
    nodes: &[NodeBgp],
    peer_mode: BgpPeerMode,
    prefix: &str,
    node_selector: Option<&LabelSelector>,
) -> Vec<MetalLbObject> {
    let mut out = Vec::new();
    // One pool per address: MetalLB rejects overlapping pools (Services sharing an IP).
    let mut by_ip: BTreeMap<IpAddr, &LbService> = BTreeMap::new();
    for svc in services {
        by_ip
            .entry(svc.ip)
            .and_modify(|cur| {
                if (svc.namespace.as_str(), svc.name.as_str()) < (cur.namespace.as_str(), cur.name.as_str()) {
                    *cur = svc;
                }
            })
            .or_insert(svc);
    }
    let mut pools: Vec<String> = Vec::new();
    for (ip, svc) in &by_ip {
        let name = pool_name(&svc.namespace, &svc.name);
        let mut labels = owned_labels();
        labels.insert(SERVICE_NAMESPACE_LABEL.to_owned(), svc.namespace.clone());
        labels.insert(SERVICE_NAME_LABEL.to_owned(), svc.name.clone());
        out.push(MetalLbObject {
            kind: Kind::IpAddressPool,
            name: name.clone(),
            labels,
            spec: json!({
                "addresses": [host_prefix(*ip)],
                "autoAssign": false,
                "avoidBuggyIPs": false,
            }),
        });
        pools.push(name);
    }
    pools.sort();
    if !pools.is_empty() {
        out.push(MetalLbObject {
            kind: Kind::BgpAdvertisement,
            name: advertisement_name(prefix),
            labels: owned_labels(),
            spec: json!({ "ipAddressPools": pools }),
        });
    }
    match peer_mode {
        BgpPeerMode::None => {}
        BgpPeerMode::Native => {
            for node in nodes {
                for (i, peer) in node.peers.iter().enumerate() {
                    out.push(MetalLbObject {
                        kind: Kind::BgpPeer,
                        name: format!("{}-{i}", node.node),
                        labels: owned_labels(),
                        spec: json!({
                            "myASN": node.local_asn,
                            "peerASN": node.peer_asn,
                            "peerAddress": peer.to_string(),
                            "sourceAddress": node.src_ip.to_string(),
                            "peerPort": BGP_PORT,
                            "holdTime": HOLD_TIME,
                            "nodeSelectors": [{"matchLabels": {HOSTNAME_LABEL: node.node}}],
                        }),
                    });
                }
            }
        }
        BgpPeerMode::Frr => {
            // One set of peers per region; ASNs and route servers are the region's.
            let mut regions: BTreeMap<&str, &NodeBgp> = BTreeMap::new();
            for node in nodes {
                regions.entry(node.region.as_str()).or_insert(node);
            }
            let (base_labels, expressions) = selector_terms(node_selector);
            for (region, node) in regions {
                let mut match_labels = base_labels.clone();
                match_labels.insert(REGION_LABEL.to_owned(), region.to_owned());
                let mut selector = json!({ "matchLabels": match_labels });
                if !expressions.is_empty() {
                    selector["matchExpressions"] = Value::Array(expressions.clone());
                }
                for (i, peer) in node.peers.iter().enumerate() {
                    out.push(MetalLbObject {
                        kind: Kind::BgpPeer,
                        name: format!("{}-{i}", dns_name(region)),
                        labels: owned_labels(),
                        spec: json!({
                            "myASN": node.local_asn,
                            "peerASN": node.peer_asn,
                            "peerAddress": peer.to_string(),
                            "peerPort": BGP_PORT,
                            "holdTime": HOLD_TIME,
                            "ebgpMultiHop": true,
                            "nodeSelectors": [selector],
                        }),
                    });
                }
            }
        }
    }
    out
}

/// An object found in MetalLB's namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Existing {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Whether baton may change it: its label, or cloud-provider-cherry's ([`adoptable`]).
    pub ours: bool,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its `spec`.
    pub spec: Value,
}

/// What to do to one MetalLB object.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create or update it (server-side apply).
    Apply(MetalLbObject),
    /// Delete baton's object that is no longer wanted.
    Delete(Kind, String),
    /// An object of that name exists and is not baton's: left alone, reported.
    Conflict(Kind, String),
    /// An object whose spec already means what baton wants (cloud-provider-cherry's, say) but
    /// lacks baton's labels: only the labels are added (a merge patch), its spec is not touched —
    /// a changed BGPPeer spec makes MetalLB's speaker close and reopen the session, withdrawing
    /// every route for a moment.
    Label(Kind, String, BTreeMap<String, String>),
}

/// The selector cloud-provider-cherry appends to a BGPPeer's `nodeSelectors` per Service using it
/// (`nomatch.cherryservers.com/service-namespace`, `…/service-name`): it matches no node.
const CCM_NOMATCH_PREFIX: &str = "nomatch.cherryservers.com/";

/// `spec` without the CCM's never-matching node selectors (they select no node, so a peer means
/// the same without them).
fn without_nomatch(kind: Kind, spec: &Value) -> Value {
    let mut spec = spec.clone();
    if kind == Kind::BgpPeer
        && let Some(selectors) = spec.get_mut("nodeSelectors").and_then(Value::as_array_mut)
    {
        selectors.retain(|sel| {
            let never = sel
                .get("matchLabels")
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty() && m.keys().all(|k| k.starts_with(CCM_NOMATCH_PREFIX)))
                && sel
                    .get("matchExpressions")
                    .is_none_or(|e| e.as_array().is_none_or(Vec::is_empty));
            !never
        });
    }
    spec
}

/// Whether `want` is a subset of `have` (objects read back carry defaults and other fields).
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        (Value::Number(h), Value::Number(w)) => h.as_f64() == w.as_f64(),
        _ => have == want,
    }
}

/// The writes that take `existing` to `desired`: apply what is missing or different, delete
/// baton's objects that are not wanted, and never touch an object without baton's label.
pub fn metallb_actions<'a>(
    desired: &[MetalLbObject],
    existing: impl IntoIterator<Item = &'a Existing> + Clone,
) -> Vec<Action> {
    let found: BTreeMap<(Kind, &str), &Existing> = existing
        .clone()
        .into_iter()
        .map(|e| ((e.kind, e.name.as_str()), e))
        .collect();
    let mut actions = Vec::new();
    let mut wanted: BTreeSet<(Kind, &str)> = BTreeSet::new();
    for d in desired {
        wanted.insert((d.kind, d.name.as_str()));
        match found.get(&(d.kind, d.name.as_str())) {
            Some(e) if !e.ours => actions.push(Action::Conflict(d.kind, d.name.clone())),
            // The spec means what baton wants (a CCM peer's never-matching selectors aside): at
            // most the labels are added, the spec is never rewritten for nothing.
            Some(e) if contains(&without_nomatch(d.kind, &e.spec), &d.spec) => {
                if !d.labels.iter().all(|(k, v)| e.labels.get(k) == Some(v)) {
                    actions.push(Action::Label(d.kind, d.name.clone(), d.labels.clone()));
                }
            }
            _ => actions.push(Action::Apply(d.clone())),
        }
    }
    for e in existing {
        if e.ours && !wanted.contains(&(e.kind, e.name.as_str())) {
            actions.push(Action::Delete(e.kind, e.name.clone()));
        }
    }
    actions
}
