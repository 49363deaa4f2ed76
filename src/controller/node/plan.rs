//! The pure part of the node controller: what a Node should look like given its server
//! (addresses, labels, taints) and what to do with a Node whose server is gone or shut down.
//!
//! No I/O here: everything is a function of plain values, unit-tested in `tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use baton_cloud::model::{IpType, Server};
use baton_core::ProviderId;
use baton_core::provider_id::ProviderIdError;
use k8s_openapi::api::core::v1::NodeAddress;

/// The taint kubelet sets with `--cloud-provider=external` until a cloud controller initialises
/// the Node.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The taint a cloud controller sets on a Node whose server is shut down.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// The instance type label (`plan.slug`).
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The legacy instance type label.
pub const LEGACY_INSTANCE_TYPE_LABEL: &str = "beta.kubernetes.io/instance-type";
/// The region label (`region.slug`).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The legacy region label.
pub const LEGACY_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
/// Set by kubelet from `--node-ip` when it runs with an external cloud provider.
pub const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// How often an initialised, Ready Node is looked at again (no cloud call).
pub const RESYNC: Duration = Duration::from_secs(600);
/// How often a Node that is not Ready has its server checked.
pub const NOT_READY_RECHECK: Duration = Duration::from_secs(30);

/// What the controller reads off a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Name.
    pub name: String,
    /// `spec.providerID`.
    pub provider_id: Option<String>,
    /// `spec.taints[*].key`.
    pub taints: Vec<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// kubelet's `--node-ip` (annotation).
    pub provided_node_ip: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeFacts {
    /// Whether the Node waits for a cloud controller.
    pub fn uninitialized(&self) -> bool {
        self.taints.iter().any(|t| t == UNINITIALIZED_TAINT)
    }

    /// Whether the shut-down taint is set.
    pub fn shutdown_tainted(&self) -> bool {
        self.taints.iter().any(|t| t == SHUTDOWN_TAINT)
    }
}

/// What the controller needs of a server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// Server id.
    pub id: u64,
    /// Hostname.
    pub hostname: String,
    /// `active`, `inactive`, ...
    pub state: String,
    /// `plan.slug`.
    pub plan: Option<String>,
    /// `region.slug`.
    pub region: Option<String>,
    /// Public IPv4 addresses (`primary-ip`).
    pub public: Vec<IpAddr>,
    /// Private IPv4 addresses (`private-ip`).
    pub private: Vec<IpAddr>,
}

impl ServerFacts {
    /// From the API's server object.
    pub fn of(server: &Server) -> Self {
        let v4 = |kind: IpType| -> Vec<IpAddr> {
            server
                .ip_addresses
                .iter()
                .filter(|ip| ip.ip_type == kind && ip.address.is_ipv4())
                .map(|ip| ip.address)
                .collect()
        };
        Self {
            id: server.id.0,
            hostname: server.hostname.clone(),
            state: server.state.clone(),
            plan: server
                .plan
                .as_ref()
                .map(|p| p.slug.clone())
                .filter(|s| !s.is_empty()),
            region: server
                .region
                .as_ref()
                .map(|r| r.slug.clone())
                .filter(|s| !s.is_empty()),
            public: v4(IpType::PrimaryIp),
            private: v4(IpType::PrivateIp),
        }
    }

    /// Whether the server is shut down (the CCM's `InstanceShutdown`).
    pub fn is_shut_down(&self) -> bool {
        self.state == "inactive"
    }
}

fn address(type_: &str, address: String) -> NodeAddress {
    NodeAddress {
        type_: type_.to_owned(),
        address,
    }
}

/// The Node's addresses from the cloud: Hostname, then every public IPv4 as ExternalIP, every
/// private IPv4 as InternalIP (the Cherry CCM's `NodeAddresses`).
pub fn cloud_addresses(node_name: &str, server: &ServerFacts) -> Vec<NodeAddress> {
    let hostname = if server.hostname.is_empty() {
        node_name
    } else {
        &server.hostname
    };
    std::iter::once(address("Hostname", hostname.to_owned()))
        .chain(
            server
                .public
                .iter()
                .map(|ip| address("ExternalIP", ip.to_string())),
        )
        .chain(
            server
                .private
                .iter()
                .map(|ip| address("InternalIP", ip.to_string())),
        )
        .collect()
}

/// Why kubelet's `--node-ip` cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIpError {
    /// The annotation is not a (comma-separated list of) IP address(es).
    #[error("annotation {PROVIDED_NODE_IP_ANNOTATION}={0:?} is not an IP address")]
    Invalid(String),
    /// The cloud does not know that address for this server.
    #[error(
        "--node-ip {ip} (annotation {PROVIDED_NODE_IP_ANNOTATION}) is none of the server's addresses {known:?}"
    )]
    Unknown {
        /// The address kubelet was given.
        ip: String,
        /// The server's addresses.
        known: Vec<String>,
    },
}

/// Honours kubelet's `--node-ip` as the cloud-provider library does
/// (`GetNodeAddressesFromNodeIP`): each given IP must be one of the cloud's addresses; matching
/// addresses come first, and they are the only addresses of their type; the rest follow.
pub fn honour_node_ip(provided: &str, cloud: Vec<NodeAddress>) -> Result<Vec<NodeAddress>, NodeIpError> {
    let mut node_ips = Vec::new();
    for part in provided.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        node_ips.push(
            part.parse::<IpAddr>()
                .map_err(|_| NodeIpError::Invalid(provided.to_owned()))?,
        );
    }
    if node_ips.is_empty() {
        return Err(NodeIpError::Invalid(provided.to_owned()));
    }
    let same = |a: &NodeAddress, ip: &IpAddr| a.address.parse::<IpAddr>().ok().as_ref() == Some(ip);
    let mut first = Vec::new();
    for ip in &node_ips {
        let Some(found) = cloud.iter().find(|a| a.type_ != "Hostname" && same(a, ip)) else {
            return Err(NodeIpError::Unknown {
                ip: ip.to_string(),
                known: cloud
                    .iter()
                    .filter(|a| a.type_ != "Hostname")
                    .map(|a| a.address.clone())
                    .collect(),
            });
        };
        first.push(found.clone());
    }
    let claimed: Vec<String> = first.iter().map(|a| a.type_.clone()).collect();
    let rest = cloud.into_iter().filter(|a| !claimed.contains(&a.type_));
    Ok(first.into_iter().chain(rest).collect())
}

/// The labels a cloud controller sets.
pub fn cloud_labels(server: &ServerFacts) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if let Some(plan) = &server.plan {
        labels.insert(INSTANCE_TYPE_LABEL.to_owned(), plan.clone());
        labels.insert(LEGACY_INSTANCE_TYPE_LABEL.to_owned(), plan.clone());
    }
    if let Some(region) = &server.region {
        labels.insert(REGION_LABEL.to_owned(), region.clone());
        labels.insert(LEGACY_REGION_LABEL.to_owned(), region.clone());
    }
    labels
}

/// How the Node names its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerRef {
    /// By provider ID.
    Id(ProviderId),
    /// No provider ID: by hostname (= the Node's name).
    Hostname(String),
}

/// The server reference of a Node, or why it is not a Cherry Servers Node.
pub fn server_ref(node: &NodeFacts) -> Result<ServerRef, ProviderIdError> {
    match node.provider_id.as_deref().map(str::trim) {
        None | Some("") => Ok(ServerRef::Hostname(node.name.clone())),
        Some(p) => p.parse().map(ServerRef::Id),
    }
}

/// Reads that must agree a Node's server is gone before the Node is deleted.
pub const GONE_READS: u32 = 3;
/// The least time from the first to the last of those reads.
pub const GONE_SPAN: Duration = Duration::from_secs(60);
/// How often a Node whose server looks gone is checked again.
pub const GONE_RECHECK: Duration = Duration::from_secs(20);

/// What one check of a not-Ready Node's missing server (its look-up by id answered 404) found,
/// from the project's server list read right after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sighting {
    /// The project's list was read, shows servers of this cluster, and not this one.
    Gone,
    /// The list shows the server: the 404 was not the truth (a transient error).
    Present,
    /// The project cannot be read: its list failed, or shows none of this cluster's other
    /// servers (an API key or project ID for another project, a project being migrated). Nothing
    /// can be concluded, and nothing is deleted.
    Unreadable,
}

/// The sighting of `server` (whose look-up answered 404), given the project's server ids
/// (`None`: the list failed) and the servers of the cluster's other Nodes.
pub fn sighting(listed: Option<&[u64]>, server: u64, others: &BTreeSet<u64>) -> Sighting {
    let Some(listed) = listed else {
        return Sighting::Unreadable;
    };
    if listed.contains(&server) {
        return Sighting::Present;
    }
    if !listed.iter().any(|id| others.contains(id)) {
        return Sighting::Unreadable;
    }
    Sighting::Gone
}

/// Whether a Node whose server looks gone is deleted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneVerdict {
    /// [`GONE_READS`] sightings in a row across at least [`GONE_SPAN`] agree: delete it.
    Delete,
    /// Not yet (or no longer): check again after [`GONE_RECHECK`].
    Wait {
        /// Consecutive [`Sighting::Gone`] so far.
        reads: u32,
    },
}

/// The sightings of one Node's server since they started agreeing it is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GoneReads {
    first: Option<Instant>,
    reads: u32,
}

impl GoneReads {
    /// Counts `sighting` at `now`: a [`Sighting::Gone`] adds to the run, anything else ends it.
    pub fn observe(&mut self, sighting: Sighting, now: Instant) -> GoneVerdict {
        if sighting != Sighting::Gone {
            *self = Self::default();
            return GoneVerdict::Wait { reads: 0 };
        }
        let first = *self.first.get_or_insert(now);
        self.reads += 1;
        if self.reads >= GONE_READS && now.duration_since(first) >= GONE_SPAN {
            GoneVerdict::Delete
        } else {
            GoneVerdict::Wait { reads: self.reads }
        }
    }
}

/// What to do with an initialised Node, given its server as the cloud shows it (`None`: 404).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// Nothing.
    Keep,
    /// The server looks gone: delete the Node once that is confirmed ([`GoneReads`]).
    Delete,
    /// The server is shut down: taint the Node.
    MarkShutdown,
    /// The server runs again: remove the shut-down taint.
    ClearShutdown,
}

/// The lifecycle decision (the CCM's node lifecycle controller): a Node whose server is gone is
/// deleted (after [`GoneReads`] confirms it); a shut-down server taints its Node, and the taint
/// goes when it runs again.
pub fn lifecycle(node: &NodeFacts, server: Option<&ServerFacts>) -> Lifecycle {
    match server {
        None => Lifecycle::Delete,
        Some(s) if s.is_shut_down() && !node.shutdown_tainted() => Lifecycle::MarkShutdown,
        Some(s) if !s.is_shut_down() && node.shutdown_tainted() => Lifecycle::ClearShutdown,
        Some(_) => Lifecycle::Keep,
    }
}
