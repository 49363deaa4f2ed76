//! Which Floating IPs a control-plane node accepts, read from Services (pure: no I/O).
//!
//! ```text
//!  every Service ─► is it a control-plane endpoint?  annotation baton.dev/control-plane-endpoint: "true"
//!                                                    or spec.loadBalancerClass baton.dev/control-plane
//!                                                    or kube-system/<prefix>-kubernetes-external
//!                 ─► its addresses: spec.loadBalancerIP, status.loadBalancer.ingress[].ip
//!                 ─► its FIPs' holder: annotation baton.dev/fip-holder-address (the controller's)
//!                 ─► FipSet { fips, holders, problems }   (an address that does not parse is a
//!                                   problem, named with its Service and field, and skipped)
//! ```
//!
//! These are the Services whose FIP `baton controller` routes to a healthy control-plane node
//! (docs/controller.md); workload Services' FIPs are announced by BGP and reach the nodes
//! through kube-proxy or the load-balancer implementation, not through this agent.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;

use crate::names::{CONTROL_PLANE_CLASS, CONTROL_PLANE_ENDPOINT_ANNOTATION, FIP_HOLDER_ADDRESS_ANNOTATION};

/// The FIPs of the control-plane endpoint Services, who holds them, and what was wrong with
/// some of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FipSet {
    pub fips: BTreeSet<IpAddr>,
    /// FIP → the address of the server the cloud routes it to, as the Services' annotation
    /// `baton.dev/fip-holder-address` says (written by the controller's leader). A set: two
    /// Services with one FIP may disagree for a moment, while the leader rewrites both. Only
    /// addresses of the FIP's own family: the node's packets to an IPv6 FIP cannot be
    /// delivered to an IPv4 address.
    pub holders: BTreeMap<IpAddr, BTreeSet<IpAddr>>,
    pub problems: Vec<Problem>,
}

impl FipSet {
    /// Adds `other`'s FIPs, holders and problems.
    pub fn merge(&mut self, other: &Self) {
        self.fips.extend(other.fips.iter().copied());
        for (fip, holders) in &other.holders {
            self.holders
                .entry(*fip)
                .or_default()
                .extend(holders.iter().copied());
        }
        self.problems.extend(other.problems.iter().cloned());
    }
}

/// An address of a control-plane endpoint Service that cannot be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("Service {service}: {field} {value:?} is not an IP address")]
    NotAnAddress {
        service: String,
        field: String,
        value: String,
    },
    #[error("Service {service}: {field} {value} cannot be a Floating IP ({why})")]
    Unusable {
        service: String,
        field: String,
        value: IpAddr,
        why: &'static str,
    },
    #[error(
        "Service {service}: annotation {FIP_HOLDER_ADDRESS_ANNOTATION} {value} cannot be a server's address ({why})"
    )]
    UnusableHolder {
        service: String,
        value: IpAddr,
        why: &'static str,
    },
}

/// The name of the mirror Service the controller keeps for `prefix` (`kube-system`).
pub fn mirror_name(prefix: &str) -> String {
    format!("{prefix}-kubernetes-external")
}

/// Whether `svc` is a control-plane endpoint: annotated, of baton's control-plane class, or
/// the mirror Service `kube-system/<mirror>`.
pub fn is_control_plane_endpoint(svc: &Service, mirror: &str) -> bool {
    svc.annotations()
        .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
        .is_some_and(|v| v == "true")
        || svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()) == Some(CONTROL_PLANE_CLASS)
        || (svc.namespace().as_deref() == Some("kube-system") && svc.name_any() == mirror)
}

/// The FIPs of every control-plane endpoint among `services`, and their holders (`mirror`:
/// the mirror Service's name, see [`mirror_name`]).
pub fn control_plane_fips(services: &[Arc<Service>], mirror: &str) -> FipSet {
    let mut out = FipSet::default();
    for svc in services.iter().filter(|s| is_control_plane_endpoint(s, mirror)) {
        let mut own = BTreeSet::new();
        let service = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
        let spec_ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref())
            .map(|v| ("spec.loadBalancerIP".to_owned(), v));
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, ing)| {
                ing.ip
                    .as_deref()
                    .map(|v| (format!("status.loadBalancer.ingress[{i}].ip"), v))
            });
        for (field, value) in spec_ip.into_iter().chain(ingress) {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match check(value) {
                Ok(ip) => {
                    own.insert(ip);
                }
                Err(Bad::NotAnAddress) => out.problems.push(Problem::NotAnAddress {
                    service: service.clone(),
                    field,
                    value: value.to_owned(),
                }),
                Err(Bad::Unusable(ip, why)) => out.problems.push(Problem::Unusable {
                    service: service.clone(),
                    field,
                    value: ip,
                    why,
                }),
            }
        }
        if let Some(holder) = holder_address(svc, &service, &mut out.problems) {
            for fip in own.iter().filter(|fip| fip.is_ipv4() == holder.is_ipv4()) {
                out.holders.entry(*fip).or_default().insert(holder);
            }
        }
        out.fips.extend(own);
    }
    out
}

/// The Service's `baton.dev/fip-holder-address`, if it has a usable one; a bad one is a
/// problem named with the Service.
fn holder_address(svc: &Service, service: &str, problems: &mut Vec<Problem>) -> Option<IpAddr> {
    let value = svc.annotations().get(FIP_HOLDER_ADDRESS_ANNOTATION)?.trim();
    if value.is_empty() {
        return None;
    }
    match check(value) {
        Ok(ip) => Some(ip),
        Err(Bad::NotAnAddress) => {
            problems.push(Problem::NotAnAddress {
                service: service.to_owned(),
                field: format!("annotation {FIP_HOLDER_ADDRESS_ANNOTATION}"),
                value: value.to_owned(),
            });
            None
        }
        Err(Bad::Unusable(ip, why)) => {
            problems.push(Problem::UnusableHolder {
                service: service.to_owned(),
                value: ip,
                why,
            });
            None
        }
    }
}

enum Bad {
    NotAnAddress,
    Unusable(IpAddr, &'static str),
}

/// An address as a FIP: parsed, and one a packet from the cloud can carry as its destination.
fn check(value: &str) -> Result<IpAddr, Bad> {
    let ip: IpAddr = value.parse().map_err(|_| Bad::NotAnAddress)?;
    usable(ip).map_err(|why| Bad::Unusable(ip, why))
}

/// Whether `ip` can be a Floating IP; the reason when it cannot.
pub fn usable(ip: IpAddr) -> Result<IpAddr, &'static str> {
    let why = if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_multicast() {
        "multicast"
    } else if matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) {
        "broadcast"
    } else {
        return Ok(ip);
    };
    Err(why)
}

#[cfg(test)]
mod tests;
