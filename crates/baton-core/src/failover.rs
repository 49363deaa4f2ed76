//! Where the control-plane Floating IP should be: a pure decision from what the controller
//! observed (who holds the FIP according to the cloud, and the health of the FIP and of every
//! candidate probed directly). The controller turns a [`Decision`] into one retarget call.
//!
//! One more input stands apart from the API server's health: [`Candidate::router`], the health
//! of the SNI router on the node (`baton sni serve`, when the shared FIP also carries tenant
//! clusters). It is `None` unless the controller watches routers; then a holder whose router
//! is Down moves ([`Reason::RouterDown`]) to a node whose API server and router are both Up,
//! and every other move prefers such a node.
//!
//! Two more pure rules keep a FIP from ping-ponging after a move ([`LastMove`]): the server it
//! just left is chosen again only when no other candidate is as good ([`avoid`], via
//! [`Observation::left`]), and a failure of the new holder that begins right after the move (the
//! reconnect storm the move itself sends there) moves it only once it has lasted
//! [`STORM_CONFIRM`] ([`storm_held`]). The controller keeps the last move where every replica
//! reads it, so the rules survive a change of leader.
//!
//! A last rule keeps a failure shared by every API server (an etcd stall) from moving the FIP
//! when it ends: the holder counts as down only once it has failed alone ([`shared_failure_held`]).

use std::time::Duration;

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
    /// The server the FIP was just moved away from ([`avoid`]): chosen again only when no
    /// other healthy candidate is as good.
    pub left: Option<u64>,
    /// The Node of the replica that decides (the leader), if known: a move prefers another node,
    /// so that the leader is not on the FIP's holder when that node fails.
    pub leader_node: Option<String>,
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
    // Best first: a schedulable node with a serving router, then a schedulable one, then a
    // serving router; within each, one the FIP did not just leave; then one without the leader;
    // then the given order (`min_by_key` keeps the first of equals).
    let best = others
        .filter(|c| c.health == Health::Up && !c.deleting)
        .filter(|c| reason != Reason::RouterDown || c.router == Some(Health::Up))
        .min_by_key(|c| {
            (
                !(c.schedulable && c.router_ok()),
                !c.schedulable,
                !c.router_ok(),
                Some(c.server_id) == obs.left,
                obs.leader_node.as_deref() == Some(c.node.as_str()),
            )
        });
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

/// The last move of a FIP the controller made (or another replica made and recorded), as the
/// rules against ping-pong see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastMove {
    /// The server the FIP was moved away from (`None`: it was unassigned).
    pub from: Option<u64>,
    /// The server it was moved to.
    pub to: u64,
    /// How long ago the move was made.
    pub ago: Duration,
}

/// A failure of the FIP's new holder that begins within this long of the move to it may be the
/// move's own doing: every client whose connections broke with the old holder reconnects to the
/// new one at once.
pub const STORM_ONSET: Duration = Duration::from_secs(2);

/// Such a failure moves the FIP only once the holder has failed its probes for this long (a dead
/// holder is marked down 0.4–0.9 s after its first failed probe with the default probes).
pub const STORM_CONFIRM: Duration = Duration::from_secs(2);

/// For this long after a move, the server the FIP left is chosen again only when no other
/// healthy candidate is as good.
pub const AVOID_LEFT: Duration = Duration::from_secs(30);

/// The server a move should avoid ([`Observation::left`]): the one the FIP left in `last`, while
/// the FIP is still where that move put it and for [`AVOID_LEFT`] after it. Not held back: a
/// move goes there when it is the only healthy candidate.
pub fn avoid(last: Option<&LastMove>, holder: Option<u64>) -> Option<u64> {
    let last = last?;
    if holder != Some(last.to) || last.ago >= AVOID_LEFT {
        return None;
    }
    last.from
}

/// Whether a move for `reason` is held back as a possible reconnect storm: the holder is the
/// server `last` moved the FIP to, its current run of failed probes (`failing_for` long) began
/// within [`STORM_ONSET`] of that move, and has not lasted [`STORM_CONFIRM`] yet. Only
/// [`Reason::HolderDown`] is held; a holder that keeps failing moves at most
/// `STORM_ONSET + STORM_CONFIRM` after the move to it, a failure that begins later at once.
pub fn storm_held(
    last: Option<&LastMove>,
    holder: Option<u64>,
    reason: Reason,
    failing_for: Duration,
) -> bool {
    let Some(last) = last else { return false };
    if reason != Reason::HolderDown || holder != Some(last.to) {
        return false;
    }
    // When the failure began, counted from the move (0: it was failing already).
    let onset = last.ago.saturating_sub(failing_for);
    onset < STORM_ONSET && failing_for < STORM_CONFIRM
}

/// After a failure shared with other candidates, the holder must fail alone this long before it
/// counts as down ([`shared_failure_held`]).
pub const SHARED_CONFIRM: Duration = Duration::from_secs(1);

/// Whether a move for `reason` is held back because the holder's failure may be one it shared
/// with the target: the target failed a probe after the holder's current run of failed probes
/// began (`target_ok_for`, the time since the target's last failed probe, is shorter than
/// `holder_failing_for`), and the holder has not yet failed alone for [`SHARED_CONFIRM`] since.
///
/// A failure every API server meets at once (etcd stalling, every server restarting) ends at
/// slightly different moments on each: the first to answer again must not take the FIP from a
/// holder that answers a probe later. A holder whose latest probe succeeded (`holder_failing_for`
/// zero, while its health still says `Down`: both came back in the same instant) is held too.
/// Only [`Reason::HolderDown`] is held; a target that has never failed (`None`) or failed only
/// before the holder did is not.
pub fn shared_failure_held(
    reason: Reason,
    holder_failing_for: Duration,
    target_ok_for: Option<Duration>,
) -> bool {
    reason == Reason::HolderDown
        && (holder_failing_for.is_zero()
            || target_ok_for.is_some_and(|ok_for| ok_for < holder_failing_for && ok_for < SHARED_CONFIRM))
}

/// A follower the leader could hand the Lease to: its identity and its Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Follower {
    pub identity: String,
    pub node: String,
}

/// Whom a leader on `leader_node` hands the Lease to, if anyone: only a leader on the Node of
/// a FIP's holder (`holder_nodes`) hands off, to a live follower on a Node that holds no FIP and
/// whose API server answers (`healthy_nodes`: a replica talks to its own node's API server). The
/// first such follower by Node, then identity. A follower on another holder's Node would only
/// move the problem: none then.
///
/// Why: a leader on the holder's node must wait for its own Lease to lapse when that node dies
/// before anyone may move the FIP, and it reaches the FIP through its node's own shortcut, so its
/// probes cannot see a broken route.
pub fn successor<'a>(
    leader_node: &str,
    holder_nodes: &[&str],
    followers: &'a [Follower],
    healthy_nodes: &[&str],
) -> Option<&'a Follower> {
    if !holder_nodes.contains(&leader_node) {
        return None;
    }
    followers
        .iter()
        .filter(|f| {
            f.node != leader_node
                && !holder_nodes.contains(&f.node.as_str())
                && healthy_nodes.contains(&f.node.as_str())
        })
        .min_by(|a, b| (&a.node, &a.identity).cmp(&(&b.node, &b.identity)))
}

#[cfg(test)]
mod tests;
