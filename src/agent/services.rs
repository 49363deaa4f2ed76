//! Which Floating IPs a control-plane node accepts, read from Services (pure: no I/O).
//!
//! ```text
//!  every Service ─► is it a control-plane endpoint?  annotation baton.dev/control-plane-endpoint: "true"
//!                                                    or spec.loadBalancerClass baton.dev/control-plane
//!                                                    or kube-system/<prefix>-kubernetes-external
//!                 ─► its addresses: spec.loadBalancerIP, status.loadBalancer.ingress[].ip
//!                 ─► FipSet { fips, problems }   (an address that does not parse is a problem,
//!                                                 named with its Service and field, and skipped)
//! ```
//!
//! These are the Services whose FIP `baton controller` routes to a healthy control-plane node
//! (docs/controller.md); workload Services' FIPs are announced by BGP and reach the nodes
//! through kube-proxy or the load-balancer implementation, not through this agent.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;

use crate::names::{CONTROL_PLANE_CLASS, CONTROL_PLANE_ENDPOINT_ANNOTATION};

/// The FIPs of the control-plane endpoint Services, and what was wrong with some of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FipSet {
    pub fips: BTreeSet<IpAddr>,
    pub problems: Vec<Problem>,
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

/// The FIPs of every control-plane endpoint among `services` (`mirror`: the mirror Service's
/// name, see [`mirror_name`]).
pub fn control_plane_fips(services: &[Arc<Service>], mirror: &str) -> FipSet {
    let mut out = FipSet::default();
    for svc in services.iter().filter(|s| is_control_plane_endpoint(s, mirror)) {
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
                    out.fips.insert(ip);
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
    }
    out
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
