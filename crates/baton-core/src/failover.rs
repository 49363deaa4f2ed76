//! Where the control-plane Floating IP should be: a pure decision from what the controller
//! observed (who holds the FIP according to the cloud, and the health of the FIP and of every
//! candidate probed directly). The controller turns a [`Decision`] into one retarget call.
//!
//! One more input stands apart from the API server's health: [`Candidate::router`], the health
//! of the SNI router on the node (`baton sni serve`, when the shared FIP also carries tenant
//! clusters). It is `None` unless the controller watches routers; then a holder whose router
//! is Down moves ([`Reason::RouterDown`]) to a node whose API server and router are both Up,
//! and every other move prefers such a node.

use crate::health::Health;

/// A control-plane server that may hold the FIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The cloud's server id (from the Node's provider ID).
    pub server_id: u64,
    /// The Node name, for Events and logs.
    pub node: String,
    /// Health of its API server, probed directly.
    pub health: Health,
    /// False when the Node is cordoned.
    pub schedulable: bool,
    /// True when the Node is being deleted.
    pub deleting: bool,
    /// Health of the node's SNI router, probed directly; `None`: routers are not watched.
    pub router: Option<Health>,
}

impl Candidate {
    /// Whether the node's router serves (or routers are not watched).
    fn router_ok(&self) -> bool {
        self.router.is_none_or(|h| h == Health::Up)
    }
}

/// What the controller knows about one control-plane endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The server the cloud says the FIP is targeted to (`targeted_to`), if any.
    pub holder: Option<u64>,
    /// Health of the API through the FIP itself (`Unknown` when not probed, e.g. `useHostIP`).
    pub via_fip: Health,
    /// Every candidate, in a stable order.
    pub candidates: Vec<Candidate>,
}

/// Why the FIP moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The FIP is not targeted to any server.
    Unassigned,
    /// The holder's API server failed its direct probes.
    HolderDown,
    /// The holder is not (or no longer) a control-plane candidate.
    HolderGone,
    /// The holder answers directly but not through the FIP: the route is broken.
    FipUnreachable,
    /// The holder is cordoned or being deleted: move away before it goes.
    HolderDraining,
    /// The holder's SNI router failed its direct probes (its API server answers).
    RouterDown,
}

impl Reason {
    /// Every reason (metrics export each from the start).
    pub const ALL: [Self; 6] = [
        Self::Unassigned,
        Self::HolderDown,
        Self::HolderGone,
        Self::FipUnreachable,
        Self::HolderDraining,
        Self::RouterDown,
    ];

    /// A stable label for metrics and Event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unassigned => "Unassigned",
            Self::HolderDown => "HolderDown",
            Self::HolderGone => "HolderGone",
            Self::FipUnreachable => "FipUnreachable",
            Self::HolderDraining => "HolderDraining",
            Self::RouterDown => "RouterDown",
        }
    }
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Leave the FIP where it is.
    Keep,
    /// Retarget the FIP to `to`.
    Move { to: u64, reason: Reason },
    /// The FIP should move (for `reason`) but no candidate is healthy: keep it, and say so.
    Stuck { reason: Reason },
}

/// Decides where the FIP should be. Only candidates known `Up` are ever chosen; among them
/// those whose router is Up (when routers are watched) are preferred, then schedulable,
/// not-deleting ones, then the candidates' given order. A move because of the holder's router
/// only goes to a node whose router is Up.
pub fn decide(obs: &Observation) -> Decision {
    let holder = obs
        .holder
        .and_then(|id| obs.candidates.iter().find(|c| c.server_id == id));
    let reason = match (obs.holder, holder) {
        (None, _) => Reason::Unassigned,
        (Some(_), None) => Reason::HolderGone,
        (Some(_), Some(h)) if h.health == Health::Down => Reason::HolderDown,
        (Some(_), Some(h)) if h.health == Health::Up && h.router == Some(Health::Down) => Reason::RouterDown,
        (Some(_), Some(h)) if h.health == Health::Up && obs.via_fip == Health::Down => Reason::FipUnreachable,
        (Some(_), Some(h)) if h.deleting || !h.schedulable => Reason::HolderDraining,
        _ => return Decision::Keep,
    };
    let others = obs.candidates.iter().filter(|c| Some(c.server_id) != obs.holder);
    let mut healthy: Vec<&Candidate> = others
        .filter(|c| c.health == Health::Up && !c.deleting)
        .filter(|c| reason != Reason::RouterDown || c.router == Some(Health::Up))
        .collect();
    // Stable: a serving router first, the given order otherwise kept.
    healthy.sort_by_key(|c| !c.router_ok());
    let best = healthy
        .iter()
        .find(|c| c.schedulable && c.router_ok())
        .or_else(|| healthy.iter().find(|c| c.schedulable))
        .or_else(|| healthy.first());
    match (best, reason) {
        // Draining: only move to a schedulable node; otherwise the holder is as good as any.
        (Some(c), Reason::HolderDraining) if !c.schedulable => Decision::Keep,
        (None, Reason::HolderDraining) => Decision::Keep,
        (Some(c), reason) => Decision::Move {
            to: c.server_id,
            reason,
        },
        (None, reason) => Decision::Stuck { reason },
    }
}

#[cfg(test)]
mod tests;
