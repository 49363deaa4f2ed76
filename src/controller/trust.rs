//! Which control-plane endpoint Services baton acts on (pure: no I/O).
//!
//! ```text
//!  Service annotated baton.dev/control-plane-endpoint ─► namespace allowed?   controlPlaneNamespaces
//!                                                      │                      + the bootstrap's record
//!                                                      ▼
//!                         spec.loadBalancerIP ─► a Floating IP of the project?
//!                                                      ▼
//!                                        this cluster's?  fipTag · cluster=<kube-system UID>
//!                                                      │  · adoptFips · the bootstrap's record
//!                                                      ▼
//!                               Ok(the FIP)  or  Refusal (a Warning Event on the Service; no
//!                               ingress, no finalizer, no cloud call, no row for the node agents)
//! ```
//!
//! A project often holds several clusters' FIPs, and tenants may create Services: a Service is
//! never a reason to move, unassign or route a FIP that is not this cluster's, nor to make the
//! node agents accept an address. Workload Services follow the same rule for the addresses they
//! ask for: [`address`].

pub mod address;

use std::collections::BTreeSet;
use std::net::IpAddr;

use baton_cloud::model::{IpAddress, IpType};
use baton_core::FipTag;

/// The tag key baton (and cloud-provider-cherry) gives the Service FIPs it creates: the UID of
/// namespace `kube-system`.
pub const CLUSTER_TAG: &str = "cluster";

/// What makes a control-plane endpoint acceptable: its namespace, and its FIP's ownership.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Namespaces that may hold control-plane endpoint Services.
    pub namespaces: BTreeSet<String>,
    /// The UID of namespace `kube-system` (the `cluster` tag of this cluster's FIPs).
    pub cluster_id: String,
    /// `fipTag`: the control-plane FIP of the CCM's scheme.
    pub fip_tag: Option<FipTag>,
    /// FIPs named in configuration: `adoptFips`, and the bootstrap's record.
    pub adopted: BTreeSet<IpAddr>,
}

/// Why a control-plane endpoint Service is not acted on. Its text names the address and the
/// rule; [`Refusal::reason`] is the Event's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "namespace {namespace} may not hold control-plane endpoints (allowed: {allowed}; setting controlPlaneNamespaces): its loadBalancerIP {address} is not routed and no node accepts it"
    )]
    NamespaceNotAllowed {
        namespace: String,
        address: String,
        allowed: String,
    },
    #[error(
        "loadBalancerIP {address} is not a Floating IP of the project: no node accepts it and nothing is sent to the cloud"
    )]
    NotAFloatingIp { address: IpAddr },
    #[error(
        "Floating IP {address} ({id}) is not this cluster's: it carries neither the fipTag, nor the tag cluster={cluster_id}, and is not named in adoptFips or the bootstrap's record; it is not routed, unassigned or accepted by any node (to adopt it, add it to adoptFips)"
    )]
    NotOwned {
        address: IpAddr,
        id: String,
        cluster_id: String,
    },
}

impl Refusal {
    /// The Warning Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NamespaceNotAllowed { .. } => "ControlPlaneNamespaceNotAllowed",
            Self::NotAFloatingIp { .. } => "NotAFloatingIP",
            Self::NotOwned { .. } => "FloatingIPNotOwned",
        }
    }
}

/// The part of [`EndpointPolicy::owns`] that needs no cluster id (`baton claim` decides with it
/// before the cluster exists): `fip` carries the `fipTag`, or `adopted` names it.
pub fn tagged_or_adopted(fip_tag: Option<&FipTag>, adopted: &BTreeSet<IpAddr>, fip: &IpAddress) -> bool {
    fip_tag.is_some_and(|t| t.matches(fip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        || adopted.contains(&fip.address)
}

impl EndpointPolicy {
    /// The policy of a cluster with this configuration (`controlPlaneNamespaces`, `fipTag`,
    /// `adoptFips`), id and bootstrap record ([`crate::names::BOOTSTRAP_RECORD`]'s data; empty
    /// when there is none). A record's value that is no address is skipped, with a warning.
    pub fn new(
        config: &crate::config::Config,
        cluster_id: &str,
        record: &std::collections::BTreeMap<String, String>,
    ) -> Self {
        let items = |key: &str| {
            record
                .get(key)
                .map(|v| crate::config::items(v).map(str::to_owned).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let recorded_fips = items(crate::names::BOOTSTRAP_FIPS_KEY)
            .into_iter()
            .filter_map(|a| {
                let ip = a.parse::<IpAddr>().ok();
                if ip.is_none() {
                    tracing::warn!(value = %a, "the bootstrap's record: {} holds no IP address; skipped", crate::names::BOOTSTRAP_FIPS_KEY);
                }
                ip
            });
        Self {
            namespaces: config
                .control_plane_namespaces
                .iter()
                .cloned()
                .chain(items(crate::names::BOOTSTRAP_NAMESPACES_KEY))
                .collect(),
            cluster_id: cluster_id.to_owned(),
            fip_tag: config.fip_tag.clone(),
            adopted: config.adopt_fips.iter().copied().chain(recorded_fips).collect(),
        }
    }

    /// Whether `fip` is this cluster's: the `fipTag`, the `cluster` tag with this cluster's id,
    /// or an adopted address. Anything else belongs to someone else (another cluster, a
    /// workload, an operator's reservation) and is never moved, unassigned or deleted.
    pub fn owns(&self, fip: &IpAddress) -> bool {
        tagged_or_adopted(self.fip_tag.as_ref(), &self.adopted, fip)
            || (!self.cluster_id.is_empty()
                && fip.tags.get(CLUSTER_TAG).map(String::as_str) == Some(self.cluster_id.as_str()))
    }

    /// Whether `namespace` may hold control-plane endpoint Services.
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }

    /// The FIP a control-plane endpoint Service in `namespace` asking for `address` may use:
    /// the namespace is allowed, `address` is a Floating IP of the project (in `ips`), and that
    /// FIP is this cluster's.
    pub fn admit<'a>(
        &self,
        namespace: &str,
        address: IpAddr,
        mut ips: impl Iterator<Item = &'a IpAddress>,
    ) -> Result<&'a IpAddress, Refusal> {
        if !self.allows_namespace(namespace) {
            return Err(Refusal::NamespaceNotAllowed {
                namespace: namespace.to_owned(),
                address: address.to_string(),
                allowed: self.namespaces.iter().cloned().collect::<Vec<_>>().join(","),
            });
        }
        let fip = ips
            .find(|ip| ip.address == address && ip.ip_type == IpType::FloatingIp)
            .ok_or(Refusal::NotAFloatingIp { address })?;
        if !self.owns(fip) {
            return Err(Refusal::NotOwned {
                address,
                id: fip.id.0.clone(),
                cluster_id: self.cluster_id.clone(),
            });
        }
        Ok(fip)
    }
}

#[cfg(test)]
mod tests;
