//! Failover for the ways a control-plane node really fails, with three `baton controller`
//! replicas each talking only to its own node's API server (as the shipped Deployment runs
//! them): a hung API server, the leader's own node dying, etcd stalling under every API server,
//! a deposed leader whose cloud calls are held back, and work left while there was no leader. Every cloud write a replica sends
//! is checked against the Lease history at the simulator (its User-Agent names the replica).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_cloud::CherryClient;
use baton_cloud::Cloud as _;
use baton_cloud::model::{IpAddress, ServerId};
use baton_sim::{Faults, LogEntry, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::leases::LeaseHistory;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];
/// The controller's default lease duration, in ms (a write later than this after its sender's
/// last renew could come after a takeover).
fn lease_ms() -> u64 {
    let d = baton::controller::lease::LeaseConfig::new("", "", "").duration;
    u64::try_from(d.as_millis()).unwrap()
}

struct Bed {
    cp: ControlPlane,
    sim: SimHandle,
    cloud: CherryClient,
    fip: IpAddress,
    history: LeaseHistory,
    logs: tempfile::TempDir,
}

async fn bed(latency_ms: u64) -> Bed {
    let cp = ControlPlane::start(Options::servers(3)).await.unwrap();
    let sim = common::sim(
        Faults {
            latency_ms: latency_ms.into(),
            ..Faults::none()
        },
        common::spliced(Topology::default()),
    )
    .await;
    let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), CP[0]).await;
    let history = LeaseHistory::record(
        (0..3).map(|i| cp.client(i).unwrap()).collect(),
        "baton-controller",
    );
    Bed {
        cp,
        sim,
        cloud,
        fip,
        history,
        logs: tempfile::tempdir().unwrap(),
    }
}

impl Bed {
    /// Replica `i` (identity cp-i) on node i: talks only to API server i.
    fn replica(&self, i: usize, extra_env: &[(&str, &str)]) -> Child {
        let kubeconfig = self.cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(i))
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
        cmd.arg("controller")
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--identity", &format!("cp-{i}"), "--admin-listen", "off"])
            .env("CHERRY_API_KEY", "sim-token")
            .env("CHERRY_PROJECT_ID", "123456")
            .env("CHERRY_FIP_TAG", "cluster=lab-cp")
            .env("CHERRY_BASE_URL", self.sim.base_url().as_str())
            .env("BATON_LOG", "info,baton=debug");
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn log(&self, i: usize) -> std::path::PathBuf {
        self.logs.path().join(format!("cp-{i}.log"))
    }

    fn logs(&self) -> String {
        (0..3)
            .map(|i| format!("--- cp-{i}:\n{}", tail(&self.log(i))))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn holder(&self) -> Option<usize> {
        let id = self.sim.peek_ip(self.fip.id.as_str())?.target()?.0;
        CP.iter().position(|&c| c == id)
    }

    async fn leader(&self) -> usize {
        common::wait_for("a leader", Duration::from_secs(30), || {
            let h = self.history.holder();
            async move { h.is_some() }
        })
        .await;
        self.history
            .holder()
            .unwrap()
            .strip_prefix("cp-")
            .unwrap()
            .parse()
            .unwrap()
    }

    /// Puts the FIP on node `i` (the test's own write) and waits until it answers there.
    async fn place_fip(&self, i: usize) {
        if self.holder() != Some(i) {
            self.cloud
                .retarget_ip(&self.fip.id, ServerId(CP[i]))
                .await
                .unwrap();
        }
        let ca = self.cp.ca_der().to_vec();
        let fip = SocketAddr::new(self.fip.address, 6443);
        common::wait_for("the FIP to answer", Duration::from_secs(30), || {
            common::readyz(&ca, fip)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    async fn wait_fip_answers_from_other_than(&self, victim: usize) {
        let ca = self.cp.ca_der().to_vec();
        let fip = SocketAddr::new(self.fip.address, 6443);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.holder().is_some_and(|h| h != victim) && common::readyz(&ca, fip).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the FIP never answered from another node\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Successful retargets of the FIP sent by replicas, from log sequence `from` on.
    fn moves(&self, from: u64) -> Vec<LogEntry> {
        let path = format!("/v1/ips/{}", self.fip.id.as_str());
        self.sim
            .log(from)
            .into_iter()
            .filter(|e| {
                e.method == "PUT" && e.path == path && e.status < 300 && e.user_agent.contains("controller/")
            })
            .collect()
    }

    fn next_seq(&self) -> u64 {
        self.sim.log(0).last().map_or(0, |e| e.seq + 1)
    }

    fn assert_only_leaders_wrote(&self) {
        let bad = self.history.nonleader_writes(&self.sim.log(0), lease_ms());
        assert!(
            bad.is_empty(),
            "writes from replicas not holding the Lease: {bad:#?}\n{}",
            self.logs()
        );
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(150)..].join("\n")
}

fn signal(child: &Child, sig: Signal) {
    let pid = i32::try_from(child.id().expect("running")).unwrap();
    nix::sys::signal::kill(Pid::from_raw(pid), sig).unwrap();
}

/// A hung API server (SIGSTOP: the kernel still accepts TCP, nothing answers) on the FIP's
/// holder: the FIP moves once, to a healthy node, and only the leader writes.
///
/// Then the hold-down that move started outlives its leader (one cluster for both: the second
/// part starts where the first ends). The leader records the move on the mirror Service; it is
/// stopped (with the replica on the new holder), and when the new holder fails a few seconds
/// later, the next leader moves the FIP on
/// to the third node, not straight back to the node it just left, although that one is healthy
/// again and comes first in the candidates' order (the order a leader that forgot the move
/// would pick from). Last, the FIP stops answering through its route while its holder answers
/// directly: the leader moves it once and holds it (30 s); it is stopped too, and the next leader
/// keeps holding it rather than move it again 5 s after its takeover.
#[test]
fn a_hung_api_server_on_the_holder_moves_the_fip_exactly_once_and_the_next_leader_does_not_send_it_back() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let mut replicas: Vec<Child> = (0..3).map(|i| bed.replica(i, &[])).collect();
        let leader = bed.leader().await;
        // The first node that is not the leader's: the node the FIP then goes to comes before
        // the third one in the candidates' order (by address: cp-0, cp-1, cp-2).
        let victim = usize::from(leader == 0);
        bed.place_fip(victim).await;
        let from = bed.next_seq();

        bed.cp.hang(victim).unwrap();
        bed.wait_fip_answers_from_other_than(victim).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/cp-{leader}")),
            "{moves:#?}"
        );
        bed.cp.unhang(victim).unwrap();
        bed.assert_only_leaders_wrote();

        // The move and its hold are on the mirror Service, for every replica.
        let to = bed.holder().unwrap();
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

        // The leader that moved it stops (a rolling update); another takes over. The replica on
        // the new holder stops too: the next failure is the holder's alone, not its leader's
        // (a leader losing its own API server is the leader-node class, tested below).
        let mut stopping: Vec<&mut Child> = replicas
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| *i == leader || *i == to)
            .map(|(_, r)| r)
            .collect();
        stop_gracefully(&mut stopping).await;
        common::wait_for("another replica to lead", Duration::from_secs(10), || {
            let h = bed.history.holder();
            let gone = [format!("cp-{leader}"), format!("cp-{to}")];
            async move { h.is_some_and(|h| !gone.contains(&h)) }
        })
        .await;
        let from = bed.next_seq();

        // The new holder dies: the FIP moves on, to the third node.
        bed.cp.kill_apiserver(to).await;
        bed.wait_fip_answers_from_other_than(to).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        assert!(
            !moves[0].user_agent.ends_with(&format!("controller/cp-{leader}")),
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
        bed.assert_only_leaders_wrote();

        // Three replicas again (the one on the dead API server cannot lead).
        for i in [leader, to] {
            replicas[i] = bed.replica(i, &[]);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        an_unreachable_fip_stays_held_across_a_leader_change(&bed, &mut replicas, &observer, victim).await;
    });
}

/// The FIP (on a healthy node) stops answering through its route: the leader moves it to
/// `expected` (the only other healthy node), then holds it there for 30 s; the leader is stopped
/// and the next one holds it too.
async fn an_unreachable_fip_stays_held_across_a_leader_change(
    bed: &Bed,
    replicas: &mut [Child],
    observer: &kube::Client,
    expected: usize,
) {
    let from = bed.next_seq();
    // Every packet to the FIP's port dropped, on every route (the nodes still answer directly).
    nft(&format!(
        "table inet hold_test {{\n chain input {{\n  type filter hook input priority -10;\n  ip daddr {} tcp dport 6443 drop\n }}\n}}\n",
        bed.fip.address
    ))
    .await;
    common::wait_for("a move of the unreachable FIP", Duration::from_secs(30), || {
        let n = bed.moves(from).len();
        async move { n >= 1 }
    })
    .await;
    let moved_by = bed.history.holder().unwrap();
    let record = last_move_to(observer, CP[expected]).await;
    assert_eq!(record["reason"], "FipUnreachable", "{record}");
    let at: k8s_openapi::jiff::Timestamp = record["at"].as_str().unwrap().parse().unwrap();
    let until: k8s_openapi::jiff::Timestamp = record["holdUntil"].as_str().unwrap().parse().unwrap();
    assert_eq!(until.duration_since(at).as_secs(), 30, "{record}");
    assert_eq!(record["unreachable"]["holdMs"], 30_000, "{record}");

    // The leader that moved it stops; the next one reads the hold from the record.
    let i: usize = moved_by.strip_prefix("cp-").unwrap().parse().unwrap();
    stop_gracefully(&mut [&mut replicas[i]]).await;
    common::wait_for("another replica to lead", Duration::from_secs(10), || {
        let h = bed.history.holder();
        let old = moved_by.clone();
        async move { h.is_some_and(|h| h != old) }
    })
    .await;
    let next = bed.history.holder().unwrap();
    // Without the record it would hold 5 s after its first list (the move it sees there), then
    // move the FIP again within a second.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let moves = bed.moves(from);
    assert_eq!(
        moves.len(),
        1,
        "the next leader ({next}) kept the hold: {moves:#?}\n{}",
        bed.logs()
    );
    assert_eq!(bed.holder(), Some(expected));
    let log = std::fs::read_to_string(bed.logs.path().join(format!("{next}.log"))).unwrap();
    assert!(
        log.contains("moved recently; holding it where it is"),
        "the next leader never held the FIP\n{}",
        bed.logs()
    );
    nft("delete table inet hold_test").await;
    bed.assert_only_leaders_wrote();
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

/// Runs an nftables script in the lab's network namespace.
async fn nft(script: &str) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("nft (Debian package nftables)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).await.unwrap();
    drop(stdin);
    assert!(child.wait().await.unwrap().success(), "nft -f - failed: {script}");
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
#[test]
fn the_leaders_own_node_dying_moves_the_fip_exactly_once() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let mut replicas: Vec<Child> = (0..3).map(|i| bed.replica(i, &[])).collect();
        let leader = bed.leader().await;
        bed.place_fip(leader).await;
        let from = bed.next_seq();

        bed.cp.blackhole(leader).await.unwrap();
        replicas[leader].kill().await.unwrap();
        bed.wait_fip_answers_from_other_than(leader).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = bed.moves(from);
        assert_eq!(moves.len(), 1, "exactly one retarget: {moves:#?}\n{}", bed.logs());
        let new_leader = bed.history.holder().unwrap();
        assert_ne!(new_leader, format!("cp-{leader}"));
        assert!(
            moves[0].user_agent.ends_with(&format!("controller/{new_leader}")),
            "{moves:#?}"
        );
        bed.assert_only_leaders_wrote();
        bed.cp.heal(leader).await.unwrap();
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
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i, &[])).collect();
        let leader = bed.leader().await;
        bed.place_fip(0).await;
        let from = bed.next_seq();
        for stall_ms in [700, 1500, 1500, 3000] {
            bed.cp.stall_etcd(Duration::from_millis(stall_ms)).unwrap();
            tokio::time::sleep(Duration::from_millis(stall_ms) + Duration::from_secs(4)).await;
            if stall_ms <= 1500 {
                assert_eq!(
                    bed.history.holder(),
                    Some(format!("cp-{leader}")),
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
        bed.assert_only_leaders_wrote();
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
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i, &[])).collect();
        let leader = bed.leader().await;
        let holder = (leader + 1) % 3;
        bed.place_fip(holder).await;
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
        // The bucket starts with one token (shared by every client on 127.0.0.1): spend it.
        bed.cloud.ip(&bed.fip.id).await.unwrap();
        bed.cp.kill_apiserver(holder).await;
        // The leader tries (and is refused) while it still leads …
        common::wait_for("the leader's first refused move", Duration::from_secs(10), || {
            let tried = bed
                .sim
                .log(from)
                .iter()
                .any(|e| e.method == "PUT" && e.user_agent.ends_with(&format!("controller/cp-{leader}")));
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
                let old = format!("cp-{leader}");
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
        let deposed = std::fs::read_to_string(bed.log(leader)).unwrap();
        assert!(
            deposed.contains("this replica's leadership ended first"),
            "the deposed leader never gave a move up\n{}",
            bed.logs()
        );
        bed.assert_only_leaders_wrote();
        bed.cp.heal(leader).await.unwrap();
    });
}

/// A Service created while no replica leads gets its FIP within 2 s of a replica winning the
/// Lease: the new leader reconciles every Service at once.
#[test]
fn a_service_created_without_a_leader_gets_its_fip_within_2s_of_the_election() {
    lab::run(|| async {
        let bed = bed(0).await;
        let lb = [
            ("CHERRY_REGION_NAME", "LT-Siauliai"),
            ("CHERRY_LOAD_BALANCER", "kube-vip://"),
        ];
        let mut a = bed.replica(0, &lb);
        let leader = bed.leader().await;
        assert_eq!(leader, 0);
        let b = bed.replica(1, &lb);
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
        bed.assert_only_leaders_wrote();
    });
}

#[test]
fn followers_do_not_poll_the_cloud_once_started() {
    lab::run(|| async {
        let bed = bed(0).await;
        bed.place_fip(0).await;
        let _replicas: Vec<Child> = (0..3).map(|i| bed.replica(i, &[])).collect();
        let leader = bed.leader().await;
        // Every replica reads the server and IP lists once at start; let that pass.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let from = bed.next_seq();
        // A minute and more of idleness (longer than the shared IP list's 60 s lifetime, after
        // which every replica used to read it again): a follower makes no cloud call at all;
        // the leader re-reads the IP list once or twice.
        tokio::time::sleep(Duration::from_secs(65)).await;
        let calls = bed.sim.log(from);
        let by = |who: &str| {
            calls
                .iter()
                .filter(|e| e.user_agent.ends_with(&format!("controller/{who}")))
                .count()
        };
        for i in (0..3).filter(|&i| i != leader) {
            assert_eq!(
                by(&format!("cp-{i}")),
                0,
                "follower cp-{i} called the cloud while idle: {:#?}\n{}",
                calls,
                bed.logs()
            );
        }
        assert!(
            by(&format!("cp-{leader}")) <= 3,
            "the leader polls the cloud more than its IP list's lifetime asks: {calls:#?}"
        );
        bed.assert_only_leaders_wrote();
    });
}
