//! Whether a managed Service may use the address it asks for, and so what it hands to the load
//! balancer: the trust rule of [`crate::controller::trust::address`] applied to Services as the
//! controllers read them. Pure; shared by the Service controller (ingress, IP annotation), the
//! BGP controller (MetalLB pools, the prefix budget) and `baton status`.
//!
//! ```text
//!  ServiceFacts ──► requested()      (field, address) where the implementation reads it
//!       │                                   │
//!       │         Judge::admit() ◄──────────┘  AddressPolicy + the project's IPs (indexed)
//!       │                                      + namespace labels + the Services (siblings)
//!       ▼
//!  Judge::handoff() ──► Nothing | Address(ip) | Refused { refusal, keeps: its own FIP, if any }
//! ```

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use baton_cloud::model::IpAddress;
use baton_cloud::tags::service_tag_on;
use baton_core::LoadBalancerMode;

use super::plan::{Record, ServiceFacts, requested};
use crate::controller::trust::address::{AddressPolicy, AddressRefusal, Ask, ProjectAddresses};

/// What a managed Service hands to the load balancer, as far as the address it asks for goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// It asks for no address (it waits for its own FIP), or its request cannot be read and it
    /// has no FIP of its own recorded.
    Nothing,
    /// This address: the one it asks for, admitted (its own FIP among them), or, when its
    /// request cannot be read (a typo), the FIP baton recorded for it.
    Address(IpAddr),
    /// The address it asks for is refused; it keeps the FIP baton recorded for it, if any
    /// (`keeps`), as a typo does.
    Refused {
        /// Why.
        refusal: Box<AddressRefusal>,
        /// The Service's own recorded FIP, still its address.
        keeps: Option<IpAddr>,
    },
}

impl Handoff {
    /// The address to hand over, if any.
    pub fn address(&self) -> Option<IpAddr> {
        match self {
            Self::Nothing => None,
            Self::Address(ip) => Some(*ip),
            Self::Refused { keeps, .. } => *keeps,
        }
    }
}

/// The addresses of the project and what the policy needs to know about namespaces and
/// Services, for judging many Services' requests against one read of each.
pub struct Judge<'a> {
    policy: &'a AddressPolicy,
    project: ProjectAddresses<'a>,
    /// Every namespace's labels (`None`: not read, as without a namespace selector).
    namespaces: Option<&'a BTreeMap<String, BTreeMap<String, String>>>,
    /// The Services a FIP reserved for another Service may be shared with (its namespace's).
    services: &'a [ServiceFacts],
    /// `service` tag → namespace of each of `services`, computed once when first needed.
    owners: OnceCell<HashMap<String, String>>,
    /// Each Service's `service` tag (`ns/name` → tag), computed once (a SHA-256 each).
    tags: RefCell<HashMap<String, String>>,
}

impl std::fmt::Debug for Judge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judge")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<'a> Judge<'a> {
    /// A judge over the project's `ips`, the namespaces' labels and the `services` (at least
    /// those of the namespaces whose requests it judges).
    pub fn new<B: std::borrow::Borrow<IpAddress>>(
        policy: &'a AddressPolicy,
        ips: &'a [B],
        namespaces: Option<&'a BTreeMap<String, BTreeMap<String, String>>>,
        services: &'a [ServiceFacts],
    ) -> Self {
        Self {
            policy,
            project: ProjectAddresses::of(ips),
            namespaces,
            services,
            owners: OnceCell::new(),
            tags: RefCell::new(HashMap::new()),
        }
    }

    fn tag(&self, namespace: &str, name: &str) -> String {
        self.tags
            .borrow_mut()
            .entry(format!("{namespace}/{name}"))
            .or_insert_with(|| service_tag_on(self.policy.cloud, namespace, name))
            .clone()
    }

    /// Whether the Service `f` may use `address`, asked for in `field`.
    pub fn admit(
        &self,
        f: &ServiceFacts,
        field: &str,
        address: IpAddr,
    ) -> Result<&'a IpAddress, Box<AddressRefusal>> {
        let own = self.tag(&f.namespace, &f.name);
        let sibling = |tag: &str| {
            self.owners
                .get_or_init(|| {
                    self.services
                        .iter()
                        .map(|s| (self.tag(&s.namespace, &s.name), s.namespace.clone()))
                        .collect()
                })
                .get(tag)
                .is_some_and(|ns| *ns == f.namespace)
        };
        let ask = Ask {
            namespace: &f.namespace,
            namespace_labels: self.namespaces.and_then(|n| n.get(&f.namespace)),
            service_tag: &own,
            field,
            address,
            sibling: &sibling,
        };
        self.policy.admit(&ask, &self.project)
    }

    /// Whether `ip` is the FIP reserved for `f` (its three tags: what baton records on a
    /// Service is only a hint, anyone who may edit the Service may edit it too).
    fn is_own(&self, f: &ServiceFacts, ip: IpAddr) -> bool {
        self.project.find(ip).is_some_and(|fip| {
            fip.address == ip && self.policy.is_reserved_for(fip, &self.tag(&f.namespace, &f.name))
        })
    }

    /// What the managed Service `f` hands to the load balancer under `mode`.
    pub fn handoff(&self, f: &ServiceFacts, mode: &LoadBalancerMode) -> Handoff {
        let recorded = Record::read(f)
            .and_then(|r| r.address)
            .filter(|ip| self.is_own(f, *ip));
        match requested(f, mode) {
            Ok(Some(asked)) => match self.admit(f, &asked.field, asked.ip) {
                Ok(_) => Handoff::Address(asked.ip),
                Err(refusal) => Handoff::Refused {
                    refusal,
                    keeps: recorded.filter(|ip| *ip != asked.ip),
                },
            },
            Ok(None) => Handoff::Nothing,
            // A typo: the Service keeps its FIP (the Service controller warns).
            Err(_) => recorded.map_or(Handoff::Nothing, Handoff::Address),
        }
    }
}

/// The keys of the Services of `facts` whose request is refused with no FIP of their own to
/// keep: they hand nothing to the load balancer, so they take no slot of the prefix budget.
pub fn refused(
    judge: &Judge<'_>,
    facts: &[ServiceFacts],
    mode: &LoadBalancerMode,
) -> std::collections::BTreeSet<String> {
    refused_of(facts.iter().map(|f| (f, judge.handoff(f, mode))))
}

/// [`refused`] of handoffs already judged.
pub fn refused_of<'f>(
    handoffs: impl IntoIterator<Item = (&'f ServiceFacts, Handoff)>,
) -> std::collections::BTreeSet<String> {
    handoffs
        .into_iter()
        .filter(|(_, h)| matches!(h, Handoff::Refused { keeps: None, .. }))
        .map(|(f, _)| f.key())
        .collect()
}

#[cfg(test)]
mod tests;
