//! Failover for the ways a control-plane node really fails, with three `baton controller`
//! replicas each running on its lab node and talking only to that node's API server (as the
//! shipped Deployment runs them, knowing their Node by `NODE_NAME` unless a test says why not):
//! a hung API server, the leader's own node dying, etcd stalling under every API server, a
//! deposed leader whose cloud calls are held back, work left while there was no leader, and
//! idle followers. The path is the routed one (`common::routed`): `baton agent` on every node,
//! the simulator routing the FIP to its holder as the cloud does; "the FIP answers" is
//! `/readyz` through it from the lab host. Every cloud write a replica sends is checked against
//! the Lease history at the simulator (its User-Agent names the replica).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::net::SocketAddr;
use std::time::Duration;

use baton_cloud::Cloud as _;
use baton_cloud::model::ServerId;
use baton_sim::Faults;
use baton_testbed::lab;
use common::routed::{CP, Routed, hub_nft};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;

/// The controller's default lease duration, in ms (a write later than this after its sender's
/// last renew could come after a takeover).
fn lease_ms() -> u64 {
    let d = baton::controller::lease::LeaseConfig::new("", "", "").duration;
    u64::try_from(d.as_millis()).unwrap()
}

async fn bed(latency_ms: u64) -> Routed {
    Routed::start(
        BATON,
        3,
        Faults {
            latency_ms: latency_ms.into(),
            ..Faults::none()
        },
        "lab-cp",
    )
    .await
}

/// The node replica `identity` runs on.
fn node(bed: &Routed, identity: &str) -> usize {
    bed.node_of(identity)
        .unwrap_or_else(|| panic!("no replica {identity}"))
}

/// Puts the FIP on node `i` (the test's own write) and waits until it answers there.
async fn place_fip(bed: &Routed, i: usize) {
    if bed.holder() != Some(i) {
        bed.cloud.retarget_ip(&bed.fip.id, ServerId(CP[i])).await.unwrap();
    }
    common::wait_for("the FIP to answer", Duration::from_secs(30), || bed.fip_answers()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
}

fn assert_only_leaders_wrote(bed: &Routed) {
    let bad = bed.nonleader_writes(lease_ms());
    assert!(
        bad.is_empty(),
        "writes from replicas not holding the Lease: {bad:#?}\n{}",
        bed.logs()
    );
}

/// Waits (up to `timeout`) until `identity` holds the Lease.
async fn leads(bed: &Routed, identity: &str, timeout: Duration) {
    common::wait_for(&format!("{identity} to lead"), timeout, || {
        let h = bed.history.holder();
        async move { h.as_deref() == Some(identity) }
    })
    .await;
}

fn signal(child: &Child, sig: Signal) {
    let pid = i32::try_from(child.id().expect("running")).unwrap();
    nix::sys::signal::kill(Pid::from_raw(pid), sig).unwrap();
}

/// A hung API server (SIGSTOP: the kernel still accepts TCP, nothing answers) on the FIP's
/// holder: the FIP moves once, to a healthy node, and only the leader writes.
///
/// Then the hold-down that move started outlives its leader (one cluster for both: the second
/// part starts where the first ends). The leader records the move on the mirror Service; the
/// replicas are replaced (a rolling update), the new one on the old leader's node, and when the
/// new holder fails a few seconds later, the next leader moves the FIP on to its own node, not
/// straight back to the node it just left, although that one is healthy again, comes first in
/// the candidates' order and runs no leader (what a leader that forgot the move would pick).
/// Last, the FIP stops answering through its route while its holder answers directly: the
/// leader moves it once and holds it (30 s); it is stopped too, and the next leader keeps
/// holding it rather than move it again 5 s after its takeover.
#[test]
fn a_hung_api_server_on_the_holder_moves_the_fip_exactly_once_and_the_next_leader_does_not_send_it_back() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let mut replicas: Vec<Child> = (0..3).map(|i| bed.replica(i).spawn()).collect();
        // The FIP stays on cp-0, the first node in the candidates' order (by address: cp-0,
        // cp-1, cp-2); a leader elected there hands the Lease to a replica on another node.
        let victim = 0;
        place_fip(&bed, victim).await;
        let leader_id = bed.leader_off_the_holder(Duration::from_secs(3)).await;
        let leader = node(&bed, &leader_id);
        let from = bed.next_seq();

        bed.cp.hang(victim).unwrap();
        bed.wait_fip_answers_from_other_than(victim).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/{leader_id}")),
            "{moves:#?}"
        );
        bed.cp.unhang(victim).unwrap();
        assert_only_leaders_wrote(&bed);

        // The move and its hold are on the mirror Service, for every replica.
        let to = bed.holder().unwrap();
        assert_ne!(
            to,
            leader,
            "a move prefers a node without the leader\n{}",
            bed.logs()
        );
        let third = 3 - victim - to;
        let addresses = bed.cp.addresses();
        assert!(
            addresses[victim] < addresses[third],
            "the test needs the node left first in the candidates' order (the FIP went from cp-{victim} to cp-{to})\n{}",
            bed.logs()
        );
        let observer = bed.cp.client(third).unwrap();
        let record = last_move_to(&observer, CP[to]).await;
        assert_eq!(record["from"], CP[victim], "{record}");
        assert_eq!(record["to"], CP[to], "{record}");
        assert_eq!(record["reason"], "HolderDown", "{record}");
        assert!(
            record["at"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some(),
            "{record}"
        );
        // The node left answers again, for every replica.
        let direct = SocketAddr::new(bed.cp.addresses()[victim], 6443);
        let ca = bed.cp.ca_der().to_vec();
        common::wait_for("the hung node to answer again", Duration::from_secs(30), || {
            common::readyz(&ca, direct)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;

        // A rolling update replaces the replicas; the new one lands on the old leader's node
        // (cp-{third}) and leads. Only it runs: the next failure is the holder's alone, not its
        // leader's (a leader losing its own API server is the leader-node class, below), and a
        // leader on cp-{victim} would send the FIP to cp-{third} anyway, for having no leader
        // on it: then nothing would show that the next leader read the record.
        stop_gracefully(&mut replicas.iter_mut().collect::<Vec<_>>()).await;
        let next_id = format!("cp-{third}-b");
        let mut next = bed.replica(third).identity(&next_id).spawn();
        leads(&bed, &next_id, Duration::from_secs(10)).await;
        let from = bed.next_seq();

        // The new holder dies: the FIP moves on, to the third node.
        bed.cp.kill_apiserver(to).await;
        bed.wait_fip_answers_from_other_than(to).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/{next_id}")),
            "moved by the next leader: {moves:#?}"
        );
        assert_eq!(
            bed.holder(),
            Some(third),
            "not straight back to cp-{victim}, which it just left\n{}",
            bed.logs()
        );
        let record = last_move_to(&observer, CP[third]).await;
        assert_eq!(
            record["from"], CP[to],
            "the next leader's move recorded: {record}"
        );
        assert_only_leaders_wrote(&bed);

        an_unreachable_fip_stays_held_across_a_leader_change(&bed, (&next_id, &mut next), &observer, victim)
            .await;
    });
}

/// The FIP (on a healthy node, with the leader `leader` on it) stops answering through its
/// route. A replica starts on `other` (the only other healthy node) and takes over from the
/// leader (stopped: a rolling update), so that the leader is not on the FIP's node and probes
/// it through the cloud; a replica starts on the FIP's node. The leader moves the FIP to
/// `other`, then holds it there for 30 s; it is stopped and the next one holds it too.
async fn an_unreachable_fip_stays_held_across_a_leader_change(
    bed: &Routed,
    (leader_id, leader): (&str, &mut Child),
    observer: &kube::Client,
    other: usize,
) {
    let fip_node = bed.holder().unwrap();
    let moving_id = format!("cp-{other}-c");
    let mut moving = bed.replica(other).identity(&moving_id).spawn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_gracefully(&mut [leader]).await;
    leads(bed, &moving_id, Duration::from_secs(10)).await;
    let next_id = format!("cp-{fip_node}-c");
    let _next = bed.replica(fip_node).identity(&next_id).spawn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_ne!(bed.history.holder().as_deref(), Some(leader_id));

    let from = bed.next_seq();
    // Every packet to the FIP's port dropped in the hub, on every route (the nodes still answer
    // directly).
    hub_nft(&format!(
        "table inet hold_test {{\n chain forward {{\n  type filter hook forward priority -10;\n  ip daddr {0} tcp dport 6443 drop\n }}\n chain output {{\n  type filter hook output priority -10;\n  ip daddr {0} tcp dport 6443 drop\n }}\n}}\n",
        bed.fip.address
    ))
    .await;
    common::wait_for("a move of the unreachable FIP", Duration::from_secs(30), || {
        let n = bed.moves(from).len();
        async move { n >= 1 }
    })
    .await;
    let moved_by = bed.history.holder().unwrap();
    assert_eq!(moved_by, moving_id, "{}", bed.logs());
    let record = last_move_to(observer, CP[other]).await;
    assert_eq!(record["reason"], "FipUnreachable", "{record}");
    let at: k8s_openapi::jiff::Timestamp = record["at"].as_str().unwrap().parse().unwrap();
    let until: k8s_openapi::jiff::Timestamp = record["holdUntil"].as_str().unwrap().parse().unwrap();
    assert_eq!(until.duration_since(at).as_secs(), 30, "{record}");
    assert_eq!(record["unreachable"]["holdMs"], 30_000, "{record}");

    // The leader that moved it stops; the next one (on the node the FIP left, so it probes the
    // FIP through the cloud and finds it unreachable) reads the hold from the record.
    stop_gracefully(&mut [&mut moving]).await;
    leads(bed, &next_id, Duration::from_secs(10)).await;
    // Without the record it would hold 5 s after its first list (the move it sees there), then
    // move the FIP again within a second.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let moves = bed.moves(from);
    assert_eq!(
        moves.len(),
        1,
        "the next leader ({next_id}) kept the hold: {moves:#?}\n{}",
        bed.logs()
    );
    assert_eq!(bed.holder(), Some(other));
    assert!(
        bed.log(&next_id)
            .contains("moved recently; holding it where it is"),
        "the next leader never held the FIP\n{}",
        bed.logs()
    );
    hub_nft("delete table inet hold_test").await;
    assert_only_leaders_wrote(bed);
}

/// SIGTERM to each of `replicas` at once, as a rolling update stops a replica (it releases the
/// Lease on its way out); one that has not exited 5 s later is killed (how long a replica takes
/// to exit is not what these tests are about).
async fn stop_gracefully(replicas: &mut [&mut Child]) {
    for r in replicas.iter() {
        if let Some(pid) = r.id() {
            nix::sys::signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGTERM).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for r in replicas.iter_mut() {
        if tokio::time::timeout_at(deadline, r.wait()).await.is_err() {
            eprintln!("a replica had not exited 5 s after SIGTERM: killed");
            r.kill().await.unwrap();
        }
    }
}

/// The record of the last move on the mirror Service, once it names a move to server `to`.
async fn last_move_to(client: &kube::Client, to: u64) -> serde_json::Value {
    let api = Api::<Service>::namespaced(client.clone(), "kube-system");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let svc = api.get("baton-kubernetes-external").await.unwrap();
        if let Some(raw) = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("baton.dev/fip-last-move"))
        {
            let record: serde_json::Value = serde_json::from_str(raw).expect("the record is JSON");
            if record["to"] == to {
                return record;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no baton.dev/fip-last-move to {to} on the mirror Service"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node of the leader replica dies while it holds the FIP (the CPEM #304/#319 case): a
/// follower takes over the Lease and moves the FIP once; nothing else writes.
///
/// These replicas run without `NODE_NAME`: a replica that knows its Node never stays leader
/// on the FIP holder's node (it hands the Lease to a replica on another node once things are
/// quiet), so this class needs the behaviour of baton before the hand-off, or of the seconds
/// before one. Then the same cluster, with the replicas as shipped (`NODE_NAME`): the first
/// one leads on the holder's node and hands the Lease off; that node dies, and the leader moves
/// the FIP once without a Lease change (no takeover to wait for).
#[test]
fn the_leaders_own_node_dying_moves_the_fip_exactly_once() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let mut replicas: Vec<Child> = (0..3)
            .map(|i| bed.replica(i).without_node_name().spawn())
            .collect();
        let leader_id = bed.leader().await;
        let leader = node(&bed, &leader_id);
        place_fip(&bed, leader).await;
        assert_eq!(bed.history.holder(), Some(leader_id.clone()));
        let from = bed.next_seq();

        bed.cp.blackhole(leader).await.unwrap();
        replicas[leader].kill().await.unwrap();
        bed.wait_fip_answers_from_other_than(leader).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        let new_leader = bed.history.holder().unwrap();
        assert_ne!(new_leader, leader_id);
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/{new_leader}")),
            "{moves:#?}"
        );
        assert_only_leaders_wrote(&bed);
        bed.cp.heal(leader).await.unwrap();
        for r in &mut replicas {
            let _ = r.kill().await;
        }

        // As shipped: the first replica leads on the holder's node until the others run, then
        // hands the Lease to one of them, without moving the FIP.
        let holder = bed.holder().unwrap();
        let from = bed.next_seq();
        let first = format!("cp-{holder}-b");
        let mut replicas = vec![(holder, bed.replica(holder).identity(&first).spawn())];
        leads(&bed, &first, Duration::from_secs(30)).await;
        place_fip(&bed, holder).await;
        for i in (0..3).filter(|&i| i != holder) {
            replicas.push((i, bed.replica(i).identity(&format!("cp-{i}-b")).spawn()));
        }
        let leader_id = bed.leader_off_the_holder(Duration::from_secs(2)).await;
        assert!(
            bed.moves(from).is_empty(),
            "a hand-off moves no FIP: {:#?}",
            bed.moves(from)
        );
        let handed_at = bed
            .history
            .versions()
            .iter()
            .filter(|v| v.holder == leader_id)
            .map(|v| v.resource_version)
            .min()
            .unwrap();

        // The holder's node (where the first leader was) dies.
        let from = bed.next_seq();
        let t0 = Instant::now();
        bed.cp.blackhole(holder).await.unwrap();
        replicas[0].1.kill().await.unwrap();
        bed.wait_fip_answers_from_other_than(holder).await;
        eprintln!(
            "after the hand-off, the FIP answered again {} ms after the holder's node died",
            t0.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/{leader_id}")),
            "moved by the leader the Lease was handed to: {moves:#?}"
        );
        let changes: Vec<_> = bed
            .history
            .versions()
            .into_iter()
            .filter(|v| v.resource_version > handed_at && v.holder != leader_id)
            .collect();
        assert!(
            changes.is_empty(),
            "the Lease left {leader_id} after the hand-off: {changes:#?}"
        );
        assert_only_leaders_wrote(&bed);
        bed.cp.heal(holder).await.unwrap();
    });
}

/// An etcd stall: every API server stops answering writes and `/readyz` at once, and answers
/// again a moment apart. That is no node failing: stalls of 0.7 and 1.5 s keep the Lease with
/// its holder, and no stall (3 s either) moves the FIP: the first API server to answer again
/// does not take it from the holder that answers a probe later. Only the leader ever writes.
#[test]
fn etcd_stalls_keep_the_lease_with_its_holder_and_the_fip_where_it_is() {
    lab::run(|| async {
        let bed = bed(100).await;
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i).spawn()).collect();
        place_fip(&bed, 0).await;
        // After the hand-off, if the first leader was elected on the holder's node.
        let leader = bed.leader_off_the_holder(Duration::from_secs(3)).await;
        let from = bed.next_seq();
        for stall_ms in [700, 1500, 1500, 3000] {
            bed.cp.stall_etcd(Duration::from_millis(stall_ms)).unwrap();
            tokio::time::sleep(Duration::from_millis(stall_ms) + Duration::from_secs(4)).await;
            if stall_ms <= 1500 {
                assert_eq!(
                    bed.history.holder(),
                    Some(leader.clone()),
                    "the Lease changed hands after a {stall_ms} ms etcd stall\n{}",
                    bed.logs()
                );
            }
            let moves = bed.moves(from);
            assert!(
                moves.is_empty(),
                "the FIP moved after a {stall_ms} ms etcd stall: {moves:#?}\n{}",
                bed.logs()
            );
        }
        assert_eq!(bed.holder(), Some(0));
        assert!(bed.fip_answers().await, "the FIP answers after the stalls");
        assert_only_leaders_wrote(&bed);
    });
}

/// Fencing at the write. The cloud answers every call 429 with `Retry-After: 3` while the
/// leader wants to move the FIP; then the leader's own API server becomes unreachable (its
/// node partitioned), so it loses the Lease while its moves are held back. No write of it may
/// reach the cloud after its lease could have expired; when the cloud recovers, the new leader
/// moves the FIP exactly once.
#[test]
fn a_deposed_leader_whose_calls_are_held_back_never_writes_after_its_lease() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i).spawn()).collect();
        let holder = 0;
        place_fip(&bed, holder).await;
        // After the hand-off, if the first leader was elected on the holder's node.
        let leader_id = bed.leader_off_the_holder(Duration::from_secs(3)).await;
        let leader = node(&bed, &leader_id);
        let from = bed.next_seq();

        // Every call refused with a Retry-After longer than any lease.
        bed.sim
            .set_faults(Faults {
                latency_ms: 100.into(),
                rate_limit: Some(0.01),
                retry_after_secs: Some(3),
                ..Faults::none()
            })
            .unwrap();
        // The simulator keeps a bucket per client address, each starting with one token: spend
        // every node's (a replica calls from its node's address, as curl does there).
        let url = format!("{}v1/ips/{}", bed.sim.base_url(), bed.fip.id.as_str());
        for i in 0..3 {
            let out = bed
                .cp
                .node_command(&format!("cp-{i}"), "curl")
                .unwrap()
                .args(["-s", "-o", "/dev/null", "-m", "5", "-w", "%{http_code}"])
                .args(["-H", &format!("Authorization: Bearer {}", bed.sim.api_key())])
                .arg(&url)
                .output()
                .await
                .unwrap();
            assert_eq!(out.stdout, b"200", "cp-{i}'s token spent on a GET");
        }
        bed.cp.kill_apiserver(holder).await;
        // The leader tries (and is refused) while it still leads …
        common::wait_for("the leader's first refused move", Duration::from_secs(10), || {
            let tried = bed
                .sim
                .log(from)
                .iter()
                .any(|e| e.method == "PUT" && e.user_agent.ends_with(&format!("controller/{leader_id}")));
            async move { tried }
        })
        .await;
        // … then loses its API server, and so the Lease, and keeps reaching the cloud.
        bed.cp.partition(leader).await.unwrap();
        common::wait_for(
            "another replica to take the Lease",
            Duration::from_secs(10),
            || {
                let h = bed.history.holder();
                let old = leader_id.clone();
                async move { h.is_some_and(|h| h != old) }
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        bed.sim
            .set_faults(Faults {
                latency_ms: 100.into(),
                ..Faults::none()
            })
            .unwrap();
        let survivors: Vec<usize> = (0..3).filter(|i| *i != leader && *i != holder).collect();
        bed.wait_fip_answers_from_other_than(holder).await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        let moves = bed.moves(from);
        assert_eq!(
            moves.len(),
            1,
            "exactly one successful retarget: {moves:#?}\n{}",
            bed.logs()
        );
        assert_eq!(bed.holder(), Some(survivors[0]), "the only healthy node");
        let refused = bed
            .sim
            .log(from)
            .iter()
            .filter(|e| e.method == "PUT" && e.status == 429)
            .count();
        let puts: Vec<String> = bed
            .sim
            .log(from)
            .iter()
            .filter(|e| e.method == "PUT")
            .map(|e| format!("{} {} {} {:?}", e.unix_ms, e.status, e.user_agent, e.fault))
            .collect();
        assert!(
            refused >= 1,
            "the storm held moves back ({refused} refused): {puts:#?}\n{}",
            bed.logs()
        );
        // The deposed leader's fence engaged: it gave moves up rather than wait past its lease.
        let deposed = bed.log(&leader_id);
        assert!(
            deposed.contains("this replica's leadership ended first"),
            "the deposed leader never gave a move up\n{}",
            bed.logs()
        );
        assert_only_leaders_wrote(&bed);
        bed.cp.heal(leader).await.unwrap();
    });
}

/// A Service created while no replica leads gets its FIP within 2 s of a replica winning the
/// Lease: the new leader reconciles every Service at once. The control-plane FIP is on cp-2,
/// where no replica runs, so no hand-off moves the Lease on its own.
#[test]
fn a_service_created_without_a_leader_gets_its_fip_within_2s_of_the_election() {
    lab::run(|| async {
        let bed = bed(0).await;
        bed.cloud.retarget_ip(&bed.fip.id, ServerId(CP[2])).await.unwrap();
        let lb = |r: common::routed::Replica<'_>| {
            r.env("CHERRY_REGION_NAME", "LT-Siauliai")
                .env("CHERRY_LOAD_BALANCER", "kube-vip://")
                .spawn()
        };
        let mut a = lb(bed.replica(0));
        let leader = bed.leader().await;
        assert_eq!(leader, "cp-0");
        let b = lb(bed.replica(1));
        tokio::time::sleep(Duration::from_secs(2)).await;

        // No leader: A frozen (its lease runs out), B frozen too.
        signal(&b, Signal::SIGSTOP);
        signal(&a, Signal::SIGSTOP);
        let client = bed.cp.client(2).unwrap();
        common::namespace(&client, "apps").await;
        Api::<Service>::namespaced(client.clone(), "apps")
            .create(
                &kube::api::PostParams::default(),
                &common::lb_service("apps", "web", &[]),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let svc = Api::<Service>::namespaced(client.clone(), "apps")
            .get("web")
            .await
            .unwrap();
        assert_eq!(
            common::ingress(&svc),
            None,
            "nobody leads: nothing may happen yet"
        );

        // A is gone for good; B wakes up and takes over.
        signal(&a, Signal::SIGCONT);
        a.kill().await.unwrap();
        signal(&b, Signal::SIGCONT);
        let deadline = Instant::now() + Duration::from_secs(20);
        let ingress_at = loop {
            let svc = Api::<Service>::namespaced(client.clone(), "apps")
                .get("web")
                .await
                .unwrap();
            if common::ingress(&svc).is_some() {
                break common::unix_ms();
            }
            assert!(Instant::now() < deadline, "no FIP\n{}", bed.logs());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let lease = Api::<Lease>::namespaced(client, "kube-system")
            .get("baton-controller")
            .await
            .unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("cp-1"));
        let won = u64::try_from(spec.acquire_time.unwrap().0.as_millisecond()).unwrap();
        let took = ingress_at.saturating_sub(won);
        assert!(
            took < 2000,
            "the Service got its FIP {took} ms after the election\n{}",
            bed.logs()
        );
        assert_only_leaders_wrote(&bed);
    });
}

#[test]
fn followers_do_not_poll_the_cloud_once_started() {
    lab::run(|| async {
        let bed = bed(0).await;
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i).spawn()).collect();
        place_fip(&bed, 0).await;
        // After the hand-off, if the first leader was elected on the holder's node (the new
        // leader reads the cloud at its takeover).
        let leader = bed.leader_off_the_holder(Duration::from_secs(3)).await;
        // Every replica reads the server and IP lists once at start; let that pass.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let from = bed.next_seq();
        // A minute and more of idleness (longer than the shared IP list's 60 s lifetime, after
        // which every replica used to read it again): a follower makes no cloud call at all;
        // the leader re-reads the IP list once or twice.
        tokio::time::sleep(Duration::from_secs(65)).await;
        assert_eq!(
            bed.history.holder(),
            Some(leader.clone()),
            "the Lease stayed with {leader}"
        );
        let calls = bed.sim.log(from);
        let by = |who: &str| {
            calls
                .iter()
                .filter(|e| e.user_agent.ends_with(&format!("controller/{who}")))
                .count()
        };
        for i in 0..3 {
            let id = format!("cp-{i}");
            if id == leader {
                continue;
            }
            assert_eq!(
                by(&id),
                0,
                "follower {id} called the cloud while idle: {:#?}\n{}",
                calls,
                bed.logs()
            );
        }
        assert!(
            by(&leader) <= 3,
            "the leader polls the cloud more than its IP list's lifetime asks: {calls:#?}"
        );
        assert_only_leaders_wrote(&bed);
    });
}
