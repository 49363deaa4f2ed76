//! The leader never shares the control-plane FIP holder's node (docs/controller.md,
//! "Placement"), on the path real nodes have: three lab nodes (each its own network namespace
//! and API server), `baton agent` on each, the simulator routing the FIP to its holder as the
//! cloud does, and two `baton controller` replicas (the shipped Deployment's count) that know
//! their Node.
//!
//! The leader starts on the FIP's holder cp-0. It hands the Lease to the replica on cp-1 without
//! moving the FIP. Then the cloud's route to cp-0 breaks (packets for the FIP forwarded towards
//! cp-0 are dropped, cp-0 itself is fine): the leader, probing from cp-1 through the cloud,
//! sees it and moves the FIP — to cp-2, the healthy node without the leader. A leader left on
//! cp-0 (baton before the hand-off) reaches the FIP through its own node's local delivery and
//! never sees the broken route. Last, the leader's node dies while it holds no FIP: the other
//! replica takes the Lease and the FIP stays where it is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::time::Duration;

use baton_sim::Faults;
use baton_testbed::lab;
use common::routed::Routed;

/// The FIP's PUTs in the simulator's log from sequence `from` on, whatever their sender or
/// answer (stricter than `Routed::moves`: a failed or foreign PUT counts too).
fn puts(bed: &Routed, from: u64) -> Vec<baton_sim::LogEntry> {
    let path = format!("/v1/ips/{}", bed.fip.id.as_str());
    bed.sim
        .log(from)
        .into_iter()
        .filter(|e| e.method == "PUT" && e.path == path)
        .collect()
}

#[test]
fn a_leader_on_the_holders_node_hands_over_then_sees_a_broken_route_and_moves_the_fip() {
    lab::run(|| async {
        let mut bed = Routed::start(BATON, 3, Faults::none(), "placement").await;
        let controller = |bed: &Routed, i| {
            common::node::controller(&bed.cp, BATON, &bed.sim, i, "cluster=placement", bed.logs.path())
        };
        let history = bed.history.clone();

        // The replica on the holder's node leads first (as after a rollout that placed it there).
        let mut replicas = vec![controller(&bed, 0)];
        common::wait_for("cp-0 to lead", Duration::from_secs(30), || {
            let h = history.holder();
            async move { h.as_deref() == Some("cp-0") }
        })
        .await;
        common::wait_for("the FIP answers", Duration::from_secs(60), || bed.fip_answers()).await;
        let seq = bed.next_seq();
        replicas.push(controller(&bed, 1));

        // The hand-off: the Lease moves to cp-1, the FIP stays on cp-0.
        common::wait_for("the Lease handed to cp-1", Duration::from_secs(30), || {
            let h = history.holder();
            async move { h.as_deref() == Some("cp-1") }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            history.holder().as_deref(),
            Some("cp-1"),
            "the Lease stays with the replica off the holder's node: {:?}",
            history.entries()
        );
        assert!(
            puts(&bed, seq).is_empty(),
            "a hand-off moves no FIP: {:?}",
            puts(&bed, seq)
        );
        assert_eq!(bed.holder(), Some(0));
        assert!(bed.fip_answers().await, "the FIP answers after the hand-off");

        // The cloud's route to cp-0 breaks: packets for the FIP forwarded towards cp-0 are lost.
        // cp-0's API server stays healthy (its direct probes pass).
        let seq = bed.next_seq();
        let t0 = tokio::time::Instant::now();
        common::routed::hub_nft(&format!(
            "table ip broken_route {{\n chain forward {{\n  type filter hook forward priority -10;\n  ip daddr {} rt ip nexthop {} drop\n }}\n}}\n",
            bed.fip.address,
            bed.cp.addresses()[0]
        ))
        .await;
        common::wait_for(
            "the FIP moved off the broken route",
            Duration::from_secs(30),
            || {
                let h = bed.holder();
                async move { h.is_some_and(|h| h != 0) }
            },
        )
        .await;
        eprintln!(
            "the broken route was seen and the FIP moved {} ms after it broke",
            t0.elapsed().as_millis()
        );
        // The simulator logs a request when it has answered it, a moment after the route
        // changed; then no second move may follow.
        common::wait_for("the move in the simulator's log", Duration::from_secs(5), || {
            let n = puts(&bed, seq).len();
            async move { n >= 1 }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let moved = puts(&bed, seq);
        assert_eq!(moved.len(), 1, "one move: {moved:?}");
        assert!(
            moved[0].user_agent.ends_with("controller/cp-1"),
            "moved by the leader on cp-1: {:?}",
            moved[0].user_agent
        );
        assert_eq!(
            bed.holder(),
            Some(2),
            "moved to cp-2, the healthy node without the leader"
        );
        common::wait_for("the FIP answers from cp-2", Duration::from_secs(10), || {
            bed.fip_answers()
        })
        .await;

        // The leader's node dies, and it holds no FIP: the Lease moves, the FIP does not.
        let seq = bed.next_seq();
        bed.cp.blackhole(1).await.unwrap();
        let _ = replicas[1].kill().await;
        common::wait_for("cp-0 to lead again", Duration::from_secs(10), || {
            let h = history.holder();
            async move { h.as_deref() == Some("cp-0") }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            puts(&bed, seq).is_empty(),
            "the leader's node died, not the holder's: no move: {:?}",
            puts(&bed, seq)
        );
        assert_eq!(bed.holder(), Some(2));
        assert!(bed.fip_answers().await, "the FIP answers throughout");
        common::routed::hub_nft("delete table ip broken_route\n").await;
        bed.cp.heal(1).await.unwrap();
    });
}
