use rstest::rstest;

use super::*;
use crate::health::Health::{Down, Unknown, Up};

fn cand(id: u64, health: Health) -> Candidate {
    Candidate {
        server_id: id,
        node: format!("cp-{id}"),
        health,
        schedulable: true,
        deleting: false,
        router: None,
    }
}

/// `c` with its node's SNI router watched and in health `h`.
fn router(mut c: Candidate, h: Health) -> Candidate {
    c.router = Some(h);
    c
}

fn cordoned(mut c: Candidate) -> Candidate {
    c.schedulable = false;
    c
}

fn deleting(mut c: Candidate) -> Candidate {
    c.deleting = true;
    c
}

fn obs(holder: Option<u64>, via_fip: Health, candidates: Vec<Candidate>) -> Observation {
    Observation {
        holder,
        via_fip,
        candidates,
        left: None,
        leader_node: None,
    }
}

/// `o` decided by a leader on the node of candidate `id`.
fn led_from(mut o: Observation, id: u64) -> Observation {
    o.leader_node = Some(format!("cp-{id}"));
    o
}

/// `o` right after a move away from `left`.
fn after_leaving(mut o: Observation, left: u64) -> Observation {
    o.left = Some(left);
    o
}

#[rstest]
// A healthy holder stays, whatever the others do.
#[case(obs(Some(1), Up, vec![cand(1, Up), cand(2, Down)]), Decision::Keep)]
// A holder not yet known (just started probing) stays.
#[case(obs(Some(1), Unknown, vec![cand(1, Unknown), cand(2, Up)]), Decision::Keep)]
// The holder fell: move to the first healthy other candidate.
#[case(obs(Some(1), Down, vec![cand(1, Down), cand(2, Unknown), cand(3, Up)]),
       Decision::Move { to: 3, reason: Reason::HolderDown })]
// No healthy candidate: keep the FIP, report it (no flapping to an unknown one).
#[case(obs(Some(1), Down, vec![cand(1, Down), cand(2, Down), cand(3, Unknown)]),
       Decision::Stuck { reason: Reason::HolderDown })]
// Unassigned FIP: assign to a healthy candidate, schedulable first.
#[case(obs(None, Unknown, vec![cordoned(cand(1, Up)), cand(2, Up)]),
       Decision::Move { to: 2, reason: Reason::Unassigned })]
#[case(obs(None, Unknown, vec![cand(1, Down)]), Decision::Stuck { reason: Reason::Unassigned })]
// Holder no longer a candidate (Node deleted / not control plane).
#[case(obs(Some(9), Up, vec![cand(1, Up)]), Decision::Move { to: 1, reason: Reason::HolderGone })]
// Cordoned or deleting holder: move away proactively, to a schedulable healthy node only.
#[case(obs(Some(1), Up, vec![cordoned(cand(1, Up)), cand(2, Up)]),
       Decision::Move { to: 2, reason: Reason::HolderDraining })]
#[case(obs(Some(1), Up, vec![deleting(cand(1, Up)), cand(2, Up)]),
       Decision::Move { to: 2, reason: Reason::HolderDraining })]
#[case(obs(Some(1), Up, vec![cordoned(cand(1, Up)), cordoned(cand(2, Up))]), Decision::Keep)]
#[case(obs(Some(1), Up, vec![cordoned(cand(1, Up)), cand(2, Down)]), Decision::Keep)]
// Holder answers directly but not through the FIP: the route is broken, move.
#[case(obs(Some(1), Down, vec![cand(1, Up), cand(2, Up)]),
       Decision::Move { to: 2, reason: Reason::FipUnreachable })]
// A failing holder prefers a schedulable target but takes a cordoned one over none.
#[case(obs(Some(1), Down, vec![cand(1, Down), cordoned(cand(2, Up))]),
       Decision::Move { to: 2, reason: Reason::HolderDown })]
// A deleting node is never a target.
#[case(obs(Some(1), Down, vec![cand(1, Down), deleting(cand(2, Up))]),
       Decision::Stuck { reason: Reason::HolderDown })]
// The holder's router failed (its API server answers): move to a node whose router serves.
#[case(obs(Some(1), Up, vec![router(cand(1, Up), Down), router(cand(2, Up), Unknown), router(cand(3, Up), Up)]),
       Decision::Move { to: 3, reason: Reason::RouterDown })]
// ... never to one whose router is not known Up, nor whose API server is down.
#[case(obs(Some(1), Up, vec![router(cand(1, Up), Down), router(cand(2, Up), Down), router(cand(3, Down), Up)]),
       Decision::Stuck { reason: Reason::RouterDown })]
// A holder whose router is Unknown (starting) or Up stays.
#[case(obs(Some(1), Up, vec![router(cand(1, Up), Unknown), router(cand(2, Up), Up)]), Decision::Keep)]
// A holder whose API server fell moves to a node with a serving router first ...
#[case(obs(Some(1), Down, vec![router(cand(1, Down), Up), router(cand(2, Up), Down), router(cand(3, Up), Up)]),
       Decision::Move { to: 3, reason: Reason::HolderDown })]
// ... but to any healthy API server rather than none.
#[case(obs(Some(1), Down, vec![router(cand(1, Down), Up), router(cand(2, Up), Down)]),
       Decision::Move { to: 2, reason: Reason::HolderDown })]
// The router's failure is the reason even when the FIP does not answer either.
#[case(obs(Some(1), Down, vec![router(cand(1, Up), Down), router(cand(2, Up), Up)]),
       Decision::Move { to: 2, reason: Reason::RouterDown })]
fn decides(#[case] o: Observation, #[case] want: Decision) {
    assert_eq!(decide(&o), want);
}

#[rstest]
// The new holder (2) falls right after the FIP left 1: not straight back, to 3 instead …
#[case(after_leaving(obs(Some(2), Down, vec![cand(1, Up), cand(2, Down), cand(3, Up)]), 1),
       Decision::Move { to: 3, reason: Reason::HolderDown })]
// … but back to 1 when it is the only healthy one (a dead holder always moves).
#[case(after_leaving(obs(Some(2), Down, vec![cand(1, Up), cand(2, Down), cand(3, Down)]), 1),
       Decision::Move { to: 1, reason: Reason::HolderDown })]
#[case(after_leaving(obs(Some(2), Down, vec![cand(1, Up), cand(2, Down)]), 1),
       Decision::Move { to: 1, reason: Reason::HolderDown })]
// Avoiding it comes after the other preferences: a schedulable node that was just left beats a
// cordoned one.
#[case(after_leaving(obs(Some(2), Down, vec![cand(1, Up), cand(2, Down), cordoned(cand(3, Up))]), 1),
       Decision::Move { to: 1, reason: Reason::HolderDown })]
// Any reason avoids it.
#[case(after_leaving(obs(Some(2), Up, vec![cand(1, Up), cordoned(cand(2, Up)), cand(3, Up)]), 1),
       Decision::Move { to: 3, reason: Reason::HolderDraining })]
// Not a candidate, or down: nothing changes.
#[case(after_leaving(obs(Some(2), Down, vec![cand(2, Down), cand(3, Up)]), 1),
       Decision::Move { to: 3, reason: Reason::HolderDown })]
fn the_server_just_left_is_the_last_choice(#[case] o: Observation, #[case] want: Decision) {
    assert_eq!(decide(&o), want);
}

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[allow(clippy::unnecessary_wraps)] // the cases' `last` is an Option
fn moved(from: Option<u64>, to: u64, ago: Duration) -> Option<LastMove> {
    Some(LastMove { from, to, ago })
}

#[rstest]
// No move recorded: nothing to avoid.
#[case(None, Some(2), None)]
// Right after 1 → 2, while 2 holds it: avoid 1.
#[case(moved(Some(1), 2, ms(500)), Some(2), Some(1))]
#[case(moved(Some(1), 2, ms(29_999)), Some(2), Some(1))]
// Long enough ago: no preference any more.
#[case(moved(Some(1), 2, AVOID_LEFT), Some(2), None)]
// Someone else moved the FIP since (the record is not about this holder).
#[case(moved(Some(1), 2, ms(500)), Some(3), None)]
#[case(moved(Some(1), 2, ms(500)), None, None)]
// It was unassigned before: nothing was left.
#[case(moved(None, 2, ms(500)), Some(2), None)]
fn the_server_to_avoid(
    #[case] last: Option<LastMove>,
    #[case] holder: Option<u64>,
    #[case] want: Option<u64>,
) {
    assert_eq!(avoid(last.as_ref(), holder), want);
}

#[rstest]
// The ping-pong the issue saw: 1 → 2; 2 fails from 100 ms after the move (the reconnect storm)
// and is marked down at its third failed probe, 0.5 s later. Held …
#[case(moved(Some(1), 2, ms(600)), Some(2), Reason::HolderDown, ms(500), true)]
// … for as long as it has failed less than STORM_CONFIRM …
#[case(moved(Some(1), 2, ms(2_000)), Some(2), Reason::HolderDown, ms(1_900), true)]
// … then it moves (a dead new holder moves at most STORM_ONSET + STORM_CONFIRM after the move).
#[case(
    moved(Some(1), 2, ms(2_100)),
    Some(2),
    Reason::HolderDown,
    STORM_CONFIRM,
    false
)]
#[case(moved(Some(1), 2, ms(3_900)), Some(2), Reason::HolderDown, ms(1_950), true)]
#[case(moved(Some(1), 2, ms(4_000)), Some(2), Reason::HolderDown, ms(1_999), false)]
// It was failing before the move reached it (a failure run longer than the move's age).
#[case(moved(Some(1), 2, ms(300)), Some(2), Reason::HolderDown, ms(900), true)]
// A failure that begins later than STORM_ONSET after the move is a failure of its own: at once.
#[case(moved(Some(1), 2, ms(3_000)), Some(2), Reason::HolderDown, ms(500), false)]
#[case(moved(Some(1), 2, ms(60_000)), Some(2), Reason::HolderDown, ms(500), false)]
// Only HolderDown waits; and only for the server the move went to.
#[case(moved(Some(1), 2, ms(600)), Some(2), Reason::FipUnreachable, ms(500), false)]
#[case(moved(Some(1), 2, ms(600)), Some(2), Reason::HolderDraining, ms(0), false)]
#[case(moved(Some(1), 2, ms(600)), Some(2), Reason::RouterDown, ms(0), false)]
#[case(moved(Some(1), 2, ms(600)), Some(3), Reason::HolderDown, ms(500), false)]
#[case(None, Some(2), Reason::HolderDown, ms(500), false)]
fn a_failure_of_the_new_holder_right_after_the_move_needs_a_longer_one(
    #[case] last: Option<LastMove>,
    #[case] holder: Option<u64>,
    #[case] reason: Reason,
    #[case] failing_for: Duration,
    #[case] want: bool,
) {
    assert_eq!(storm_held(last.as_ref(), holder, reason, failing_for), want);
}

#[rstest]
// A failure shared with the target (an etcd stall ends on one API server before another).
// The target failed after the holder began failing: held until the holder fails alone 1 s.
#[case(Reason::HolderDown, ms(3_000), Some(ms(100)), true)]
#[case(Reason::HolderDown, ms(3_000), Some(ms(999)), true)]
#[case(Reason::HolderDown, ms(3_000), Some(ms(1_000)), false)]
// The target's last failure came before the holder's began: the holder fails alone.
#[case(Reason::HolderDown, ms(500), Some(ms(600)), false)]
// A target that has never failed: a plain failover, not held.
#[case(Reason::HolderDown, ms(500), None, false)]
// The holder's latest probe succeeded (it came back in the same instant as the target).
#[case(Reason::HolderDown, ms(0), Some(ms(400)), true)]
#[case(Reason::HolderDown, ms(0), None, true)]
// Only HolderDown is held.
#[case(Reason::FipUnreachable, ms(3_000), Some(ms(100)), false)]
#[case(Reason::HolderGone, ms(0), Some(ms(100)), false)]
fn a_failure_shared_with_the_target_moves_only_once_the_holder_fails_alone(
    #[case] reason: Reason,
    #[case] holder_failing_for: Duration,
    #[case] target_ok_for: Option<Duration>,
    #[case] want: bool,
) {
    assert_eq!(
        shared_failure_held(reason, holder_failing_for, target_ok_for),
        want
    );
}

proptest::proptest! {
    /// Whatever is observed, a move only ever targets a healthy, non-deleting, other server,
    /// and a healthy, schedulable holder reachable through the FIP is never moved.
    #[test]
    fn moves_are_always_to_healthy_candidates(
        holder in proptest::option::of(0u64..5),
        via in 0u8..3,
        cands in proptest::collection::vec((0u8..3, proptest::bool::ANY, proptest::bool::ANY, 0u8..4), 0..5),
    ) {
        let h = |n: u8| [Unknown, Up, Down][usize::from(n)];
        let candidates: Vec<Candidate> = cands.iter().enumerate().map(|(i, (health, sched, del, router))| Candidate {
            server_id: i as u64, node: format!("n{i}"), health: h(*health), schedulable: *sched, deleting: *del,
            router: (*router < 3).then(|| h(*router)),
        }).collect();
        let o = obs(holder, h(via), candidates.clone());
        match decide(&o) {
            Decision::Move { to, reason } => {
                let c = candidates.iter().find(|c| c.server_id == to).expect("target is a candidate");
                proptest::prop_assert_eq!(c.health, Up);
                if reason == Reason::RouterDown {
                    proptest::prop_assert_eq!(c.router, Some(Up));
                }
                proptest::prop_assert!(!c.deleting);
                proptest::prop_assert_ne!(Some(to), holder);
            }
            Decision::Keep | Decision::Stuck { .. } => {}
        }
        if let Some(hc) = holder.and_then(|id| candidates.iter().find(|c| c.server_id == id))
            && hc.health == Up && hc.schedulable && !hc.deleting && h(via) != Down
            && hc.router != Some(Down)
        {
            proptest::prop_assert_eq!(decide(&o), Decision::Keep);
        }
    }
}

#[rstest]
// The holder fell: a healthy node without the leader first…
#[case(led_from(obs(Some(1), Down, vec![cand(1, Down), cand(2, Up), cand(3, Up)]), 2),
       Decision::Move { to: 3, reason: Reason::HolderDown })]
// …but the node the FIP just left goes last, after the leader's node.
#[case(led_from(after_leaving(obs(Some(1), Down, vec![cand(1, Down), cand(2, Up), cand(3, Up)]), 3), 2),
       Decision::Move { to: 2, reason: Reason::HolderDown })]
// The leader's node is taken when it is the only healthy one.
#[case(led_from(obs(Some(1), Down, vec![cand(1, Down), cand(2, Up), cand(3, Down)]), 2),
       Decision::Move { to: 2, reason: Reason::HolderDown })]
// A schedulable node still beats a cordoned one without the leader.
#[case(led_from(obs(Some(1), Down, vec![cand(1, Down), cand(2, Up), cordoned(cand(3, Up))]), 2),
       Decision::Move { to: 2, reason: Reason::HolderDown })]
fn a_move_prefers_a_node_without_the_leader_after_the_node_just_left(
    #[case] o: Observation,
    #[case] want: Decision,
) {
    assert_eq!(decide(&o), want);
}

fn follower(identity: &str, node: &str) -> Follower {
    Follower {
        identity: identity.into(),
        node: node.into(),
    }
}

#[rstest]
// The leader holds the FIP's node: to the follower on a healthy node without a FIP.
#[case("n1", &["n1"], &[("b", "n2")], &["n1", "n2"], Some("b"))]
// Not on a holder's node: no hand-off.
#[case("n2", &["n1"], &[("a", "n1"), ("c", "n3")], &["n1", "n2", "n3"], None)]
// The only follower shares the leader's node, or another holder's: none.
#[case("n1", &["n1"], &[("b", "n1")], &["n1"], None)]
#[case("n1", &["n1", "n2"], &[("b", "n2")], &["n1", "n2"], None)]
// A follower whose node's API server fails cannot lead: the other one.
#[case("n1", &["n1"], &[("b", "n2"), ("c", "n3")], &["n1", "n3"], Some("c"))]
// Several fit: the first by node, then identity (every replica would pick the same).
#[case("n1", &["n1"], &[("z", "n3"), ("y", "n2"), ("x", "n2")], &["n1", "n2", "n3"], Some("x"))]
fn the_lease_goes_to_a_live_follower_off_every_holders_node(
    #[case] leader: &str,
    #[case] holders: &[&str],
    #[case] followers: &[(&str, &str)],
    #[case] healthy: &[&str],
    #[case] want: Option<&str>,
) {
    let followers: Vec<_> = followers.iter().map(|(i, n)| follower(i, n)).collect();
    let got = successor(leader, holders, &followers, healthy).map(|f| f.identity.as_str());
    assert_eq!(got, want);
}
