//! `baton controller` on Hetzner Cloud: the same routed bed as tests/failover.rs (three lab
//! nodes, each its own network namespace and API server, `baton agent` on each), with the
//! simulator speaking Hetzner Cloud's API: a Floating IP moves by an assign action that runs for
//! 500 ms, and its route changes only when the action succeeds. "The FIP answers" is `/readyz`
//! through the FIP from the lab host, which is no node.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::time::Duration;

use baton_sim::{Faults, HetznerSettings};
use baton_testbed::lab;
use common::routed::Routed;
use tokio::time::Instant;

async fn bed(action_ms: u64) -> Routed {
    Routed::start_on(
        Some(HetznerSettings {
            action_ms: action_ms.into(),
            ..HetznerSettings::default()
        }),
        BATON,
        3,
        Faults::none(),
        "lab-cp",
    )
    .await
}

/// Requests of `route` (`METHOD /v1/template`) sent by controller replicas from log sequence `from`.
fn sent(bed: &Routed, from: u64, route: &str) -> usize {
    bed.sim
        .log(from)
        .iter()
        .filter(|e| format!("{} {}", e.method, e.route) == route && e.user_agent.contains("controller/"))
        .count()
}

/// Two replicas (on cp-1 and cp-2) with the token in `HCLOUD_TOKEN`. The holder's API server is
/// killed: the FIP answers again from a healthy node after exactly one assign action (no
/// unassign), sent by the leader; then the new holder's node is powered off (its link down,
/// every process on it dead) and the FIP moves once more, again by one assign.
#[test]
fn the_control_plane_fip_moves_by_one_assign_action_per_failure() {
    lab::run(|| async {
        let mut bed = bed(500).await;
        let _a = bed.replica(1).identity("replica-a").spawn();
        let _b = bed.replica(2).identity("replica-b").spawn();
        common::wait_for("the FIP answers through cp-0", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        bed.leader_off_the_holder(Duration::from_secs(2)).await;
        let from = bed.next_seq();

        // The holder's API server dies.
        let t0 = Instant::now();
        bed.cp.kill_apiserver(0).await;
        bed.wait_fip_answers_from_other_than(0).await;
        let first = t0.elapsed();
        let holder = bed.holder().unwrap();
        assert_eq!(
            bed.moves(from).len(),
            1,
            "one assign for one failure\n{}",
            bed.logs()
        );
        assert_eq!(
            sent(&bed, from, "POST /v1/floating_ips/{id}/actions/unassign"),
            0,
            "a move is never an unassign then an assign"
        );
        assert!(
            sent(&bed, from, "GET /v1/actions") >= 1,
            "the action was followed to its end"
        );
        eprintln!("hetzner: the FIP answered again {first:?} after the holder's API server was killed");

        // The new holder's node is powered off.
        bed.leader_off_the_holder(Duration::from_secs(2)).await;
        let from = bed.next_seq();
        let t1 = Instant::now();
        bed.cp.kill_node(&format!("cp-{holder}")).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if bed.holder().is_some_and(|h| h != holder && h != 0) && bed.fip_answers().await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the FIP did not move off cp-{holder}\n{}",
                bed.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "hetzner: the FIP answered again {:?} after cp-{holder} was powered off",
            t1.elapsed()
        );
        assert_eq!(
            bed.moves(from).len(),
            1,
            "one assign for one failure\n{}",
            bed.logs()
        );
        assert!(
            bed.nonleader_writes(1_700).is_empty(),
            "{:?}",
            bed.nonleader_writes(1_700)
        );
        assert_eq!(bed.sim.stats().with_status(429), 0);
    });
}
