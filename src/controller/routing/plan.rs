//! The pure part of Service FIP routing: which node each Service FIP should be routed to.
//!
//! ```text
//!  Nodes ──► candidate()   ready, not leaving, not excluded, its server known ──► Candidate
//!  kube-proxy /healthz ──► Health per candidate (rise/fall)
//!  FIPs (id, routed to) + candidates ──► plan() ──► moves: (FIP, server, why)
//! ```
//!
//! A FIP stays where it is while its node is healthy (no rebalancing: a move costs the flows on
//! it). A FIP that is routed nowhere, or to a server that is no candidate (its node left, is
//! excluded or gone) or whose node's health check says down, goes to the healthy candidate
//! routed the fewest FIPs (ties: the lowest server id, so replicas agree). A node whose health
//! is not known yet (a new leader's first probes) keeps its FIPs. No healthy candidate: nothing
//! moves.

use std::collections::BTreeMap;

use baton_cloud::model::{IpId, ServerId};
use baton_core::health::Health;
use k8s_openapi::api::core::v1::Node;

/// The label that keeps a node out of external load balancers (Kubernetes' service controller
/// honours it, and so does baton).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Why a FIP moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Routed to no server.
    Unrouted,
    /// Routed to a server that is no candidate (its Node left, is excluded, or never was one).
    NotACandidate,
    /// Routed to a node whose health check fails.
    NodeDown,
}

impl Why {
    /// For logs and Events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unrouted => "routed nowhere",
            Self::NotACandidate => "its node is no candidate",
            Self::NodeDown => "its node's health check fails",
        }
    }
}

/// A node that may hold Service FIPs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its server.
    pub server: ServerId,
    /// The Node's name.
    pub node: String,
    /// Its health check's verdict.
    pub health: Health,
}

/// One move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The FIP.
    pub fip: IpId,
    /// Where it goes.
    pub to: ServerId,
    /// Where it was routed (if anywhere).
    pub from: Option<ServerId>,
    /// Why.
    pub why: Why,
}

/// Whether `node` may hold Service FIPs at all: Ready, not being deleted, not cordoned for
/// deletion by the autoscaler, not excluded from load balancers.
pub fn is_eligible(node: &Node) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_LABEL))
    {
        return false;
    }
    let spec = node.spec.as_ref();
    if spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
    {
        return false;
    }
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The moves that put every FIP of `fips` (id, routed to) on a healthy candidate.
pub fn plan(fips: &[(IpId, Option<ServerId>)], candidates: &[Candidate]) -> Vec<Move> {
    let by_server: BTreeMap<ServerId, &Candidate> = candidates.iter().map(|c| (c.server, c)).collect();
    // FIPs per healthy candidate, counting the ones that stay.
    let mut load: BTreeMap<ServerId, usize> = candidates
        .iter()
        .filter(|c| c.health == Health::Up)
        .map(|c| (c.server, 0))
        .collect();
    let mut pending = Vec::new();
    for (id, at) in fips {
        let why = match at.and_then(|s| by_server.get(&s)) {
            None if at.is_none() => Some(Why::Unrouted),
            None => Some(Why::NotACandidate),
            Some(c) if c.health == Health::Down => Some(Why::NodeDown),
            Some(c) => {
                if let Some(n) = load.get_mut(&c.server) {
                    *n += 1;
                }
                None
            }
        };
        if let Some(why) = why {
            pending.push((id, *at, why));
        }
    }
    let mut moves = Vec::new();
    for (id, from, why) in pending {
        // The least loaded healthy candidate; ties: the lowest server id.
        let Some((&to, n)) = load.iter_mut().min_by_key(|(server, n)| (**n, **server)) else {
            break;
        };
        *n += 1;
        moves.push(Move {
            fip: id.clone(),
            to,
            from,
            why,
        });
    }
    moves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(server: u64, health: Health) -> Candidate {
        Candidate {
            server: ServerId(server),
            node: format!("n{server}"),
            health,
        }
    }

    fn fip(id: &str, at: Option<u64>) -> (IpId, Option<ServerId>) {
        (IpId::from(id), at.map(ServerId))
    }

    #[test]
    fn a_fip_on_a_healthy_node_stays_and_new_ones_spread_over_the_least_loaded() {
        let candidates = [c(1, Health::Up), c(2, Health::Up), c(3, Health::Up)];
        let fips = [
            fip("a", Some(1)),
            fip("b", Some(1)),
            fip("c", None),
            fip("d", None),
        ];
        let moves = plan(&fips, &candidates);
        let to: Vec<(String, u64)> = moves.iter().map(|m| (m.fip.to_string(), m.to.0)).collect();
        assert_eq!(to, [("c".to_owned(), 2), ("d".to_owned(), 3)]);
        assert!(moves.iter().all(|m| m.why == Why::Unrouted));
    }

    #[test]
    fn a_down_node_loses_its_fips_an_unknown_one_keeps_them() {
        let candidates = [c(1, Health::Down), c(2, Health::Unknown), c(3, Health::Up)];
        let fips = [fip("a", Some(1)), fip("b", Some(2)), fip("c", Some(3))];
        let moves = plan(&fips, &candidates);
        assert_eq!(
            moves,
            [Move {
                fip: IpId::from("a"),
                to: ServerId(3),
                from: Some(ServerId(1)),
                why: Why::NodeDown,
            }]
        );
    }

    #[test]
    fn a_fip_on_a_server_that_is_no_candidate_moves_and_without_a_healthy_node_nothing_does() {
        let moves = plan(&[fip("a", Some(9))], &[c(1, Health::Up)]);
        assert_eq!(moves[0].why, Why::NotACandidate);
        assert_eq!(moves[0].to, ServerId(1));
        assert!(plan(&[fip("a", Some(1)), fip("b", None)], &[c(1, Health::Down)]).is_empty());
        assert!(plan(&[fip("a", None)], &[]).is_empty());
    }

    #[test]
    fn eligibility_follows_readiness_deletion_exclusion_and_the_autoscalers_taint() {
        let ready: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(is_eligible(&ready));
        let mut excluded = ready.clone();
        excluded.metadata.labels = Some([(EXCLUDE_LABEL.to_owned(), String::new())].into());
        assert!(!is_eligible(&excluded));
        let tainted: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(!is_eligible(&tainted));
        let not_ready: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        assert!(!is_eligible(&not_ready));
    }
}
