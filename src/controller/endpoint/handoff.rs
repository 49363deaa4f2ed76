//! The leader moves off the FIP holder's node: it hands the Lease to a live follower elsewhere
//! ([`crate::controller::succession`]) when all is quiet, so that the FIP never waits for the
//! leader's own Lease to lapse when the holder's node dies, and the leader's probes through the
//! FIP cross the cloud's route instead of its node's local delivery.
//!
//! A Lease move is invisible to clients; a FIP move resets every open connection. So the Lease
//! moves, not the FIP, and only when nothing else is going on:
//! - no FIP moved in the last [`QUIET`] (the hold-down's settle and the reconnect storm's
//!   windows), none is failing over, and every move's record is written (the next leader reads
//!   its hold from there);
//! - every candidate's API server has answered all its probes for [`QUIET`] (never during a
//!   shared failure, e.g. etcd stalling);
//! - no write of this replica is on its way;
//! - after a hand-off that did not keep the Lease away, backed off.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use baton_core::failover::{Candidate, Follower, successor};
use baton_core::health::Health;
use tokio::time::Instant;

use super::{EndpointRef, EndpointState};
use crate::controller::Context;
use crate::controller::health::LogThrottle;
use crate::probe::Prober;

/// How long everything must have been quiet before the Lease is handed over: at least the
/// hold-down's settle time (5 s) and the reconnect-storm window (2 s onset + 2 s confirm).
pub(super) const QUIET: Duration = Duration::from_secs(5);

/// The first wait after a hand-off before another, doubled for each in a row, up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(10);
const MAX_WAIT: Duration = Duration::from_secs(300);
/// A hand-off this long ago no longer counts for the backoff.
const FORGET: Duration = Duration::from_secs(600);
/// How often a leader that waits to hand over says why (debug).
const WHY_EVERY: Duration = Duration::from_secs(5);

/// What one endpoint shows of its recent past, for [`quiet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Calm {
    /// The FIP is routed to a server, and this replica has looked at it at least once.
    pub routed: bool,
    /// Time since its last move (this replica's or recorded by another), if any.
    pub last_move_ago: Option<Duration>,
    /// A failover episode is open (the holder or the FIP failing), or a move is held back.
    pub failing: bool,
    /// A write of the holder annotations or of the last-move record is pending or failed.
    pub unwritten: bool,
}

/// Whether the Lease may be handed over: every endpoint [`Calm`], every candidate answering
/// for [`QUIET`] (`candidates_ok_for`: per candidate, the time since its last failed probe,
/// `None` if never), and nothing in flight.
pub(super) fn quiet(endpoints: &[Calm], candidates_ok_for: &[Option<Duration>], in_flight: usize) -> bool {
    in_flight == 0
        && !endpoints.is_empty()
        && endpoints
            .iter()
            .all(|c| c.routed && !c.failing && !c.unwritten && c.last_move_ago.is_none_or(|ago| ago >= QUIET))
        && candidates_ok_for.iter().all(|ok| ok.is_none_or(|d| d >= QUIET))
}

/// The hand-off's memory between passes (the leader's).
#[derive(Debug)]
pub(super) struct HandOffs {
    /// The last request and how many came in a row before it ([`Self::in_a_row`]).
    last: Option<(Instant, u32)>,
    /// The term in which "no replica to hand over to" was logged.
    told: Option<u64>,
    /// How often "not yet" and why is logged (debug).
    waiting: LogThrottle,
}

impl Default for HandOffs {
    fn default() -> Self {
        Self {
            last: None,
            told: None,
            waiting: LogThrottle::new(WHY_EVERY),
        }
    }
}

impl HandOffs {
    /// The last request and its count in a row: unless it took (`took`: the replica handed
    /// to led; the Lease came back later for another reason, e.g. its node died), or a FIP
    /// moved after it (`moved_at`). Only hand-offs that did not take back off.
    fn in_a_row(&self, moved_at: Option<Instant>, took: bool) -> Option<(Instant, u32)> {
        self.last
            .filter(|(at, _)| !took && moved_at.is_none_or(|m| m <= *at))
    }

    /// When the next request may be made, the last FIP move at `moved_at`.
    fn next_at(&self, moved_at: Option<Instant>, took: bool) -> Option<Instant> {
        let (at, tries) = self.in_a_row(moved_at, took)?;
        let wait = FIRST_WAIT
            .saturating_mul(2u32.saturating_pow(tries.saturating_sub(1)))
            .min(MAX_WAIT);
        Some(at + wait)
    }

    /// Hands the Lease over if this replica leads from a FIP holder's node, all is quiet, and a
    /// live follower runs on a healthy node without a FIP. Once per pass (`settled`: a pass of
    /// the leader that left nothing to do).
    pub(super) fn consider(
        &mut self,
        ctx: &Context,
        (endpoints, states): (&[EndpointRef], &BTreeMap<String, EndpointState>),
        candidates: &[(Candidate, SocketAddr)],
        prober: &Prober,
        settled: bool,
    ) {
        if !settled {
            return;
        }
        let succession = ctx.leader.succession();
        let (Some(node), Some(term)) = (succession.node(), ctx.leader.in_term()) else {
            return;
        };
        if !ctx.leader.is_leader() {
            return;
        }
        let now = Instant::now();
        let node_of = |server: u64| {
            candidates
                .iter()
                .find(|(c, _)| c.server_id == server)
                .map(|(c, _)| c.node.as_str())
        };
        let holder_nodes: Vec<&str> = endpoints
            .iter()
            .filter_map(|ep| ep.fip.target().and_then(|s| node_of(s.0)))
            .collect();
        if !holder_nodes.contains(&node) {
            self.told = None;
            return;
        }
        let calm: Vec<Calm> = endpoints
            .iter()
            .map(|ep| calm_of(ep, states.get(ep.fip.id.as_str()), now))
            .collect();
        let ok_for: Vec<Option<Duration>> = candidates
            .iter()
            .map(|(c, addr)| {
                if c.health == Health::Up {
                    prober
                        .last_failure(addr)
                        .map(|t| now.saturating_duration_since(t))
                } else {
                    Some(Duration::ZERO)
                }
            })
            .collect();
        let in_flight = ctx.leader.in_flight().count();
        let moved_at = calm
            .iter()
            .filter_map(|c| c.last_move_ago)
            .min()
            .map(|ago| now.checked_sub(ago).unwrap_or(now));
        let took = succession.handoff_took();
        let next_at = self.next_at(moved_at, took);
        if !quiet(&calm, &ok_for, in_flight) || next_at.is_some_and(|at| now < at) {
            if self.waiting.allow().is_some() {
                tracing::debug!(%node, ?calm, ?ok_for, in_flight, next_at_in_ms = next_at.map(|at| at.saturating_duration_since(now).as_millis()), "on a FIP holder's node, not handing the Lease over yet");
            }
            return;
        }
        let healthy: Vec<&str> = candidates
            .iter()
            .filter(|(c, _)| c.health == Health::Up && !c.deleting)
            .map(|(c, _)| c.node.as_str())
            .collect();
        let followers: Vec<Follower> = succession
            .peers()
            .into_iter()
            .map(|p| Follower {
                identity: p.identity,
                node: p.node,
            })
            .collect();
        let Some(to) = successor(node, &holder_nodes, &followers, &healthy) else {
            if self.told != Some(term) {
                self.told = Some(term);
                tracing::warn!(
                    %node,
                    ?followers,
                    "this leader runs on a control-plane FIP holder's node and no live replica runs on another healthy node: if this node fails, the FIP moves only after this replica's Lease lapses, and its probes cannot see the FIP's route from here"
                );
            }
            return;
        };
        let tries = self
            .in_a_row(moved_at, took)
            .filter(|(at, _)| now.saturating_duration_since(*at) < FORGET)
            .map_or(1, |(_, n)| n.saturating_add(1));
        self.last = Some((now, tries));
        ctx.metrics.lease_handoff();
        tracing::info!(%node, to = %to.identity, to_node = %to.node, term, "the leader runs on a control-plane FIP holder's node: handing the Lease to a replica on another node");
        succession.hand_off(
            term,
            crate::controller::succession::Peer {
                identity: to.identity.clone(),
                node: to.node.clone(),
            },
        );
    }
}

/// What `state` shows of endpoint `ep` at `now`.
fn calm_of(ep: &EndpointRef, state: Option<&EndpointState>, now: Instant) -> Calm {
    let Some(state) = state else {
        return Calm {
            routed: false,
            last_move_ago: None,
            failing: false,
            unwritten: false,
        };
    };
    Calm {
        routed: ep.fip.target().is_some() && state.seen,
        last_move_ago: state.hold.last_move(now).map(|m| m.ago),
        failing: state.down_since.is_some() || state.unreachable_since.is_some(),
        // A failed write waits for its retry; past that time the next pass writes again (or
        // finds nothing left to write).
        unwritten: state.holder_retry_at.is_some_and(|t| now < t)
            || state.holder_write.as_ref().is_some_and(|(_, t)| !t.is_finished()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALM: Calm = Calm {
        routed: true,
        last_move_ago: None,
        failing: false,
        unwritten: false,
    };

    #[test]
    fn the_lease_moves_only_when_nothing_else_is_going_on() {
        let ok = [None, Some(QUIET)];
        assert!(quiet(&[CALM], &ok, 0));
        assert!(!quiet(&[CALM], &ok, 1), "a write on its way");
        assert!(!quiet(&[], &ok, 0), "no endpoint known yet");
        let moved = |ago| Calm {
            last_move_ago: Some(ago),
            ..CALM
        };
        assert!(
            !quiet(&[moved(Duration::from_secs(4))], &ok, 0),
            "a move in the settle window"
        );
        assert!(quiet(&[moved(QUIET)], &ok, 0));
        for busy in [
            Calm {
                failing: true,
                ..CALM
            },
            Calm {
                unwritten: true,
                ..CALM
            },
            Calm {
                routed: false,
                ..CALM
            },
        ] {
            assert!(!quiet(&[CALM, busy], &ok, 0), "{busy:?}");
        }
        assert!(
            !quiet(&[CALM], &[None, Some(Duration::from_secs(1))], 0),
            "a candidate failed a probe a second ago: maybe a shared failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hand_offs_that_did_not_take_back_off_up_to_five_minutes() {
        let mut h = HandOffs::default();
        assert_eq!(h.next_at(None, false), None);
        let t0 = Instant::now();
        let before = t0.checked_sub(Duration::from_secs(1));
        h.last = Some((t0, 1));
        assert_eq!(h.next_at(None, false), Some(t0 + FIRST_WAIT));
        assert_eq!(h.next_at(before, false), Some(t0 + FIRST_WAIT));
        h.last = Some((t0, 3));
        assert_eq!(h.next_at(before, false), Some(t0 + FIRST_WAIT * 4));
        h.last = Some((t0, 30));
        assert_eq!(h.next_at(before, false), Some(t0 + MAX_WAIT));
        assert_eq!(
            h.next_at(Some(t0 + Duration::from_secs(1)), false),
            None,
            "a FIP moved (onto this leader's node) since: a new reason, no wait"
        );
        assert_eq!(
            h.next_at(before, true),
            None,
            "the last hand-off took (the Lease came back later, e.g. its node died): no wait"
        );
    }
}
