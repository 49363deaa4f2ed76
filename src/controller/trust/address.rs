//! Which address a workload Service may ask for (pure: no I/O).
//!
//! ```text
//!  Service asks for an address   spec.loadBalancerIP, the implementation's IP annotation
//!      │ the FIP baton (or cloud-provider-cherry) reserved for this very Service ──► Ok, whatever
//!      ▼                                                  its namespace (its three tags say so)
//!  namespace allowed?        serviceAllocationNamespaces · serviceAllocationNamespaceSelector
//!      ▼                     (MetalLB's serviceAllocation; both unset: every namespace)
//!  a Floating IP of the project (or inside one of its subnets)?
//!      ▼
//!  this cluster's?           tag (label) cluster=<kube-system UID> · adoptFips
//!      ▼
//!  reserved for another Service (its `service` tag)?  only a Service of the same namespace
//!      ▼                                               may share it
//!  Ok(the FIP)  or  AddressRefusal: a Warning Event naming the address and the rule; no
//!                   ingress, no IP annotation, no MetalLB pool, no route, no cloud write
//! ```
//!
//! A project often holds several clusters' FIPs, and namespace admins create Services: a
//! Service's request is never a reason to announce (MetalLB, kube-vip), route (Hetzner Cloud) or
//! accept (kube-proxy, through the ingress) an address that is not this cluster's, nor one the
//! operator did not open to its namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

pub use crate::config::ServiceAllocation;
use baton_cloud::CloudKind;
use baton_cloud::model::{IpAddress, IpType, each_ip};
use baton_cloud::tags::{CLUSTER_KEY, SERVICE_KEY, USAGE_KEY, USAGE_VALUE};

/// What decides whether a workload Service may use the address it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPolicy {
    /// The cloud (the form of the `service` tag, and "tag" or "label" in messages).
    pub cloud: CloudKind,
    /// The UID of namespace `kube-system`: the `cluster` tag of this cluster's FIPs.
    pub cluster_id: String,
    /// `adoptFips`: addresses that are this cluster's although untagged.
    pub adopted: BTreeSet<IpAddr>,
    /// The namespaces that may ask for an address.
    pub allocation: ServiceAllocation,
}

/// One Service's request.
pub struct Ask<'a> {
    /// The Service's namespace.
    pub namespace: &'a str,
    /// The namespace's labels; `None` when not known (then no namespace selector matches).
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The Service's own `service` tag (on this cloud): the FIPs reserved for it carry it.
    pub service_tag: &'a str,
    /// Where it asks (`spec.loadBalancerIP`, or the annotation's key), for messages.
    pub field: &'a str,
    /// The address.
    pub address: IpAddr,
    /// Whether a Service with this `service` tag lives in the same namespace (may share the
    /// FIP reserved for it).
    pub sibling: &'a dyn Fn(&str) -> bool,
}

impl std::fmt::Debug for Ask<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ask")
            .field("namespace", &self.namespace)
            .field("field", &self.field)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Why a Service may not use the address it asks for. Its text names the field, the address
/// and the rule; [`AddressRefusal::reason`] is the Warning Event's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressRefusal {
    #[error(
        "{field} {address}: namespace {namespace} may not ask for an address (allowed: {allowed}; settings serviceAllocationNamespaces, serviceAllocationNamespaceSelector): it is not used (no ingress, no announcement, no route, nothing sent to the cloud)"
    )]
    NamespaceNotAllowed {
        field: String,
        address: IpAddr,
        namespace: String,
        allowed: String,
    },
    #[error(
        "{field} {address} is not a Floating IP of the project, nor inside one of its subnets: it is not used (no ingress, no announcement, no route, nothing sent to the cloud)"
    )]
    NotInProject { field: String, address: IpAddr },
    #[error(
        "{field} {address}: Floating IP {id} is not this cluster's: {whose}, not {word} cluster={cluster_id}, and it is not named in adoptFips; it is not used (no ingress, no announcement, no route, nothing sent to the cloud). {remedy}"
    )]
    NotOwned {
        field: String,
        address: IpAddr,
        id: String,
        cluster_id: String,
        word: &'static str,
        /// The `cluster` tag it carries (another cluster's), if any.
        tagged_for: Option<String>,
        /// "its tag is cluster=…" or "it carries no cluster tag".
        whose: String,
        /// What would make it this cluster's.
        remedy: String,
    },
    #[error(
        "{field} {address}: Floating IP {id} was reserved for a Service of another namespace (its {word} service={service_tag}); it is not used (no ingress, no announcement, no route, nothing sent to the cloud)"
    )]
    AnotherService {
        field: String,
        address: IpAddr,
        id: String,
        service_tag: String,
        word: &'static str,
    },
}

impl AddressRefusal {
    /// The Warning Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NamespaceNotAllowed { .. } => "AddressNamespaceNotAllowed",
            Self::NotInProject { .. } => "AddressNotInProject",
            Self::NotOwned { .. } => "FloatingIPNotOwned",
            Self::AnotherService { .. } => "FloatingIPOfAnotherService",
        }
    }

    /// The address refused.
    pub fn address(&self) -> IpAddr {
        match self {
            Self::NamespaceNotAllowed { address, .. }
            | Self::NotInProject { address, .. }
            | Self::NotOwned { address, .. }
            | Self::AnotherService { address, .. } => *address,
        }
    }

    /// The FIP refused as not this cluster's and carrying no `cluster` tag at all (an operator's
    /// reservation, perhaps this cluster's): what `adoptFips` would adopt.
    pub fn untagged(&self) -> bool {
        matches!(self, Self::NotOwned { tagged_for: None, .. })
    }

    /// Whether a fresher view of the cloud could change the verdict (the address is not in the
    /// list, or its tags say it is not this cluster's): the caller reads it again once.
    pub fn may_be_stale(&self) -> bool {
        !matches!(self, Self::NamespaceNotAllowed { .. })
    }
}

/// The project's addresses, indexed for [`AddressPolicy::admit`]: a pass asks about every
/// Service's address, so a lookup must not walk the list.
#[derive(Debug, Default)]
pub struct ProjectAddresses<'a> {
    fips: HashMap<IpAddr, &'a IpAddress>,
    subnets: Vec<(ipnet::IpNet, &'a IpAddress)>,
}

impl<'a> ProjectAddresses<'a> {
    /// Indexes `ips` (one pass).
    pub fn of<B: std::borrow::Borrow<IpAddress>>(ips: &'a [B]) -> Self {
        let mut out = Self::default();
        for ip in each_ip(ips) {
            match ip.ip_type {
                IpType::FloatingIp => {
                    out.fips.insert(ip.address, ip);
                }
                IpType::Subnet => {
                    if let Ok(net) = ip.cidr.trim().parse::<ipnet::IpNet>() {
                        out.subnets.push((net, ip));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The Floating IP at `address`, else the subnet holding it.
    pub fn find(&self, address: IpAddr) -> Option<&'a IpAddress> {
        self.fips.get(&address).copied().or_else(|| {
            self.subnets
                .iter()
                .find(|(net, _)| net.contains(&address))
                .map(|(_, ip)| *ip)
        })
    }
}

impl AddressPolicy {
    /// The policy of a cluster with this configuration (`adoptFips`, `serviceAllocation*`) and
    /// id. The bootstrap's recorded FIPs are the control-plane endpoints', never a workload's.
    pub fn new(config: &crate::config::Config, cluster_id: &str) -> Self {
        Self {
            cloud: config.cloud,
            cluster_id: cluster_id.to_owned(),
            adopted: config.adopt_fips.clone(),
            allocation: config.service_allocation.clone(),
        }
    }

    /// "tag" on Cherry Servers, "label" on Hetzner Cloud.
    fn word(&self) -> &'static str {
        match self.cloud {
            CloudKind::Cherry => "tag",
            CloudKind::Hetzner => "label",
        }
    }

    fn tag<'i>(ip: &'i IpAddress, key: &str) -> Option<&'i str> {
        ip.tags.get(key).map(String::as_str)
    }

    /// Whether `ip` carries this cluster's `cluster` tag.
    fn is_clusters(&self, ip: &IpAddress) -> bool {
        !self.cluster_id.is_empty() && Self::tag(ip, CLUSTER_KEY) == Some(self.cluster_id.as_str())
    }

    /// Whether `ip` is the FIP reserved for the Service whose `service` tag is `service_tag`:
    /// all three tags, as baton and cloud-provider-cherry put them.
    pub fn is_reserved_for(&self, ip: &IpAddress, service_tag: &str) -> bool {
        ip.ip_type == IpType::FloatingIp
            && self.is_clusters(ip)
            && Self::tag(ip, USAGE_KEY) == Some(USAGE_VALUE)
            && Self::tag(ip, SERVICE_KEY) == Some(service_tag)
    }

    /// The FIP (or subnet) the Service of `ask` may use at its address, or why not (boxed: the
    /// refusal carries its message's parts, and most answers are yes).
    pub fn admit<'a>(
        &self,
        ask: &Ask<'_>,
        project: &ProjectAddresses<'a>,
    ) -> Result<&'a IpAddress, Box<AddressRefusal>> {
        let field = || ask.field.to_owned();
        let found = project.find(ask.address);
        // The Service's own FIP, in any namespace: baton wrote its address into the IP
        // annotation itself.
        if let Some(ip) = found.filter(|ip| ip.address == ask.address)
            && self.is_reserved_for(ip, ask.service_tag)
        {
            return Ok(ip);
        }
        if !self.allocation.allows(ask.namespace, ask.namespace_labels) {
            return Err(Box::new(AddressRefusal::NamespaceNotAllowed {
                field: field(),
                address: ask.address,
                namespace: ask.namespace.to_owned(),
                allowed: self.allocation.describe(),
            }));
        }
        let Some(ip) = found else {
            return Err(Box::new(AddressRefusal::NotInProject {
                field: field(),
                address: ask.address,
            }));
        };
        if !self.is_clusters(ip) && !self.adopted.contains(&ask.address) {
            let word = self.word();
            let tagged_for = Self::tag(ip, CLUSTER_KEY).map(str::to_owned);
            let (whose, remedy) = match &tagged_for {
                Some(other) => (
                    format!("its {word} is cluster={other} (another cluster's)"),
                    "Another cluster announces or routes it: ask for an address of this cluster".to_owned(),
                ),
                None => (
                    format!("it carries no cluster {word}"),
                    format!(
                        "If it is this cluster's, {word} it cluster={} or add it to adoptFips",
                        self.cluster_id
                    ),
                ),
            };
            return Err(Box::new(AddressRefusal::NotOwned {
                field: field(),
                address: ask.address,
                id: ip.id.0.clone(),
                cluster_id: self.cluster_id.clone(),
                word,
                tagged_for,
                whose,
                remedy,
            }));
        }
        // Reserved for another Service (baton's or the CCM's): that Service's, shared only
        // within its namespace (MetalLB's allow-shared-ip, say).
        if let Some(owner) = Self::tag(ip, SERVICE_KEY)
            && Self::tag(ip, USAGE_KEY) == Some(USAGE_VALUE)
            && !(ask.sibling)(owner)
        {
            return Err(Box::new(AddressRefusal::AnotherService {
                field: field(),
                address: ask.address,
                id: ip.id.0.clone(),
                service_tag: owner.to_owned(),
                word: self.word(),
            }));
        }
        Ok(ip)
    }
}

#[cfg(test)]
mod tests;
