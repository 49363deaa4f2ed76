//! The BGP prefix budget, a property of the Services: every Service is announced over every
//! BGP session, so a session carries one prefix per Service. With `bgpPrefixLimit`, the oldest
//! Services within the limit are handed to the load balancer and the rest are refused. The
//! Service controller withholds a refused Service's IP annotation; the BGP controller gives it no
//! MetalLB pool.
//!
//! ```text
//!  every Service's facts (read once per pass) ──► candidates: managed, not being deleted
//!      ──► admit(limit): oldest first (creation time, then key) ──► Admission { admitted, refused }
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::plan::{Scope, ServiceFacts, scope_excluding};

/// A Service that may be announced: its key and creation time (seconds), for the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `namespace/name`.
    pub key: String,
    /// `metadata.creationTimestamp`, seconds since the epoch (0 when unknown).
    pub created: i64,
}

/// Which Services fit the per-session prefix budget.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Admission {
    /// Announced.
    pub admitted: BTreeSet<String>,
    /// Refused (in order): each gets a Warning Event instead.
    pub refused: Vec<String>,
}

impl Admission {
    /// Whether the Service `key` is refused.
    pub fn refuses(&self, key: &str) -> bool {
        self.refused.iter().any(|k| k == key)
    }
}

/// The prefix budget: every Service is announced over every session, so a session carries one
/// prefix per Service. With `limit`, the oldest `limit` Services (creation time, then key) are
/// announced and the rest refused — a new Service never pushes an announced one out, and the
/// router's max-prefix limit is never reached (which would tear the session down and withdraw
/// everything).
pub fn admit(mut candidates: Vec<Candidate>, limit: Option<u32>) -> Admission {
    candidates.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
    candidates.dedup_by(|a, b| a.key == b.key);
    let limit = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut out = Admission::default();
    for (i, c) in candidates.into_iter().enumerate() {
        if i < limit {
            out.admitted.insert(c.key);
        } else {
            out.refused.push(c.key);
        }
    }
    out
}

/// The budget over every Service's `facts`: the managed LoadBalancer Services not being deleted,
/// oldest first (see [`admit`]). `mirror` is the mirror Service (`namespace`, `name`); a Service
/// asking for one of the `never_announced` addresses (control-plane FIPs, FIPs the cloud routes
/// to a server: [`super::plan::FipRoles::never_announced`]) is never announced, so it takes no
/// slot; nor does a Service whose request for an address is refused and that has no FIP of its
/// own to keep (`refused`, keys: [`super::admission::Handoff::Refused`]).
pub fn admitted(
    facts: &[ServiceFacts],
    mirror: (&str, &str),
    never_announced: &BTreeSet<IpAddr>,
    refused: &BTreeSet<String>,
    limit: Option<u32>,
) -> Admission {
    let candidates = facts
        .iter()
        .filter(|f| !f.deleting && scope_excluding(f, mirror, never_announced, None) == Scope::Managed)
        .filter(|f| !refused.contains(&f.key()))
        .map(|f| Candidate {
            key: f.key(),
            created: f.created,
        })
        .collect();
    admit(candidates, limit)
}

#[cfg(test)]
mod tests;
