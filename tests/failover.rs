//! `baton controller` against three real API servers and the simulator: the control-plane FIP
//! follows a healthy API server. On the path real nodes have (`common::routed`): three lab nodes
//! (each its own network namespace and API server), `baton agent` on each, the simulator routing
//! the FIP to its holder as the cloud does, and the replicas inside the nodes, each talking to
//! its own node's API server unless a test says otherwise. "The FIP answers" is `/readyz`
//! through the FIP from the lab host, which is no node: the packets crossed the cloud's route
//! and were accepted by the holder's agent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::time::Duration;

use baton_cloud::Cloud;
use baton_sim::{Faults, SimHandle};
use baton_testbed::{ADMIN_TOKEN, lab};
use common::routed::{CP, Routed};
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;

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

async fn holder(bed: &Routed) -> Option<u64> {
    bed.cloud.ip(&bed.fip.id).await.unwrap().target().map(|s| s.0)
}

/// Whether a `FloatingIPMoved` Event is in `kube-system`.
async fn moved_event(client: &kube::Client) -> bool {
    Api::<Event>::namespaced(client.clone(), "kube-system")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("FloatingIPMoved"))
}

/// One replica on cp-1, authenticating as the shipped RBAC's service account (`manifests/rbac.yaml`
/// creates `kube-system/baton`; its token comes from the API server, as the kubelet gets a pod's
/// projected token; tests/bootstrap.rs and tests/pods.rs run the same RBAC in real pods).
///
/// Short hiccups of the holder's API server (300 ms frozen, about one probe: fewer failures than
/// the fall threshold of 3, five times over) do not move the FIP. Killing it does: the FIP
/// answers again from a healthy node after one retarget, an Event says so, and the controller
/// met no RBAC denial on the way.
#[test]
fn a_hiccup_keeps_the_fip_and_a_killed_holder_api_server_moves_it_once_with_the_shipped_rbac() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let client = bed.cp.client(1).unwrap();
        common::apply_shipped_manifests(&client, &["rbac.yaml"]).await;
        let sa_token = common::service_account_token(&client, "kube-system", "baton").await;
        let _c = bed
            .replica(1)
            .identity("replica-a")
            .token(&sa_token)
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();

        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        common::wait_for("the FIP answers through cp-0", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Hiccups: the FIP never moves.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(bed.cp.apiserver_pid(0).unwrap()).unwrap());
        for _ in 0..5 {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(holder(&bed).await, Some(CP[0]), "a hiccup is not a failure");
        let puts = bed.sim.log(0).into_iter().filter(|e| e.method == "PUT").count();
        assert_eq!(puts, 1, "only the test's own assignment");

        // The holder's API server is killed: the FIP moves, once.
        let stopped = Instant::now();
        bed.cp.kill_apiserver(0).await;
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            bed.fip_answers()
        })
        .await;
        let recovered = stopped.elapsed();
        let now = holder(&bed).await;
        assert!(
            matches!(now, Some(id) if id == CP[1] || id == CP[2]),
            "moved to a healthy server: {now:?}"
        );
        eprintln!("failover: FIP answered again {recovered:?} after the holder's API server was killed");
        assert_eq!(ip_puts(&bed.sim).len(), 2, "the test's own assignment + one move");

        // An Event on the mirror Service says what happened.
        common::wait_for("the FloatingIPMoved Event", Duration::from_secs(10), || {
            moved_event(&client)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let text = bed.log("replica-a");
        // kube-apiserver's denials all say "forbidden" ("… is forbidden: User …", reason
        // Forbidden); a bare "403" would also match timestamps such as 18:22:41.403450Z.
        assert!(
            !text.to_lowercase().contains("forbidden"),
            "the controller hit RBAC denials:\n{text}"
        );
    });
}

/// Waits (up to 30 s) until `identity` holds the Lease, as `observer` reads it.
async fn leads(observer: &kube::Client, identity: &str) {
    common::wait_for(
        &format!("{identity} to lead"),
        Duration::from_secs(30),
        || async { lease_holder(observer).await.as_deref() == Some(identity) },
    )
    .await;
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    lease(client).await.and_then(|(h, _)| h)
}

/// The Lease's holder and transitions.
async fn lease(client: &kube::Client) -> Option<(Option<String>, i32)> {
    let spec = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-controller")
        .await
        .ok()
        .flatten()?
        .spec?;
    Some((spec.holder_identity, spec.lease_transitions.unwrap_or(0)))
}

/// A slow API server, seen by the leader: every write (its renewals included) is held 450 ms,
/// longer than the 300 ms after which a renew attempt used to be abandoned. The leader keeps
/// leading in one term, the follower never takes over, the FIP stays. Each replica runs on its
/// node (cp-1, cp-2) and talks to a slow proxy in front of that node's API server, made in the
/// node's namespace.
#[test]
fn leadership_rides_out_api_writes_slower_than_the_old_renew_attempt_limit() {
    use baton_testbed::{Profile, SlowApi};
    lab::run(|| async {
        let bed = bed(100).await;
        let slow_a = SlowApi::start(&bed.cp, 1, Profile::fixed(Duration::from_millis(450)))
            .await
            .unwrap();
        let slow_b = SlowApi::start(&bed.cp, 2, Profile::fixed(Duration::from_millis(450)))
            .await
            .unwrap();
        let observer = bed.cp.client(0).unwrap();
        let kubeconfig = bed.cp.write_kubeconfig_for(&slow_a.url(), ADMIN_TOKEN).unwrap();
        let _a = bed
            .replica(1)
            .identity("replica-a")
            .kubeconfig(&kubeconfig)
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        leads(&observer, "replica-a").await;
        let kubeconfig = bed.cp.write_kubeconfig_for(&slow_b.url(), ADMIN_TOKEN).unwrap();
        let _b = bed
            .replica(2)
            .identity("replica-b")
            .kubeconfig(&kubeconfig)
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        // The start's own writes (Events, the mirror Service) are behind us.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = lease(&observer).await.unwrap();
        let writes_before = slow_a.stats().writes;

        tokio::time::sleep(Duration::from_secs(10)).await;
        let after = lease(&observer).await.unwrap();
        let renewals = slow_a.stats().writes - writes_before;
        let a_log = bed.log("replica-a");
        eprintln!(
            "Lease before {before:?}, after {after:?}; {renewals} writes of replica-a in 10 s, each held 450 ms"
        );
        assert!(
            renewals >= 10,
            "the leader renewed through the slow API server: {renewals} writes"
        );
        let b_log = bed.log("replica-b");
        assert_eq!(
            after, before,
            "the same holder, no transition; replica-a:\n{a_log}\nreplica-b:\n{b_log}"
        );
        assert_eq!(after.0.as_deref(), Some("replica-a"));
        assert!(!a_log.contains("lost the lease"), "replica-a's log:\n{a_log}");
        assert_eq!(ip_writes(&bed.sim), 1, "the FIP stayed where the test put it");
    });
}

/// SIGTERM while the leader's retarget is on its way (the cloud takes 4 s to answer): the
/// leader keeps the Lease until the answer is in, then releases it. The next leader takes over
/// after that answer, and finds the FIP moved: one retarget, not two. The replicas run on cp-1
/// and cp-2; the holder's (cp-0's) API server dies.
#[test]
fn a_graceful_stop_waits_for_the_retarget_on_its_way_before_the_next_leader_acts() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let mut a = bed
            .replica(1)
            .identity("replica-a")
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        let observer = bed.cp.client(2).unwrap();
        leads(&observer, "replica-a").await;
        let _b = bed
            .replica(2)
            .identity("replica-b")
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut faults = Faults {
            latency_ms: 100.into(),
            ..Faults::none()
        };
        faults.routes.insert(
            "PUT /v1/ips/{id}".to_owned(),
            baton_sim::RouteFaults {
                latency_ms: Some(4000.into()),
                ..baton_sim::RouteFaults::default()
            },
        );
        bed.sim.set_faults(faults).unwrap();

        // The holder's API server dies; replica-a starts the move, and is told to stop.
        bed.cp.kill_apiserver(0).await;
        common::wait_for("replica-a to send the retarget", Duration::from_secs(10), || {
            let log = bed.log("replica-a");
            async move { log.contains("moving the control-plane FIP") }
        })
        .await;
        let stop = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(a.id().unwrap()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        leads(&observer, "replica-b").await;
        let took_over = stop.elapsed();
        let status = tokio::time::timeout(Duration::from_secs(20), a.wait()).await;
        let exited = stop.elapsed();
        eprintln!("replica-a exited {exited:?} after SIGTERM: {status:?}");
        assert!(
            matches!(status, Ok(Ok(s)) if s.success()) && exited < took_over + Duration::from_secs(3),
            "replica-a exits (0) soon after it released the Lease ({took_over:?}), not after its tasks' time limit: {exited:?}, {status:?}"
        );
        let log = bed.log("replica-a");
        let puts = ip_puts(&bed.sim);
        eprintln!("replica-b led {took_over:?} after SIGTERM; retargets: {puts:?}");
        assert!(
            log.contains("waited for writes on their way before giving up the lease")
                && log.contains("released the lease"),
            "replica-a waited for its retarget, then released:\n{log}"
        );
        let moved = puts.last().unwrap();
        assert_eq!(moved.status, 200, "the retarget was answered: {moved:?}");
        assert!(
            took_over >= Duration::from_millis(2500),
            "replica-b led {took_over:?} after SIGTERM, before the 4 s retarget could be answered"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let puts = ip_puts(&bed.sim).len();
        assert_eq!(
            puts, 2,
            "the test's own assignment and one move: replica-b did not move it again"
        );
        let now = holder(&bed).await;
        assert!(matches!(now, Some(id) if id == CP[1] || id == CP[2]), "{now:?}");
    });
}

/// The retargets (PUTs of an IP) the simulator logged.
fn ip_puts(sim: &SimHandle) -> Vec<baton_sim::LogEntry> {
    sim.log(0)
        .into_iter()
        .filter(|e| e.method == "PUT" && e.path.starts_with("/v1/ips/"))
        .collect()
}

fn ip_writes(sim: &SimHandle) -> usize {
    sim.log(0)
        .into_iter()
        .filter(|e| matches!(e.method.as_str(), "PUT" | "POST" | "DELETE") && e.path.starts_with("/v1/ips/"))
        .count()
}

/// The holder's node loses its API server and its replica, which leads, at the same moment.
///
/// The replicas run without `NODE_NAME`: a replica that knows its Node hands the Lease off the
/// FIP holder's node once things are quiet (tests/placement.rs), so the leader would no longer
/// be the replica on the holder's node when the failure comes. Without it they behave as baton
/// before the hand-off, and as a Deployment whose leader is on the holder's node in the seconds
/// before a hand-off: the follower must wait for the dead leader's Lease, then move the FIP once.
#[test]
fn losing_the_holder_and_the_leader_together_still_moves_the_fip_exactly_once() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        // Replica A runs on the holder's node and talks to its API server (the worst case),
        // replica B on cp-1 to cp-1's.
        let mut a = bed
            .replica(0)
            .identity("replica-a")
            .without_node_name()
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        let observer = bed.cp.client(2).unwrap();
        leads(&observer, "replica-a").await;
        let _b = bed
            .replica(1)
            .identity("replica-b")
            .without_node_name()
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        common::wait_for("the FIP answers through cp-0", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            ip_writes(&bed.sim),
            1,
            "before the failure: only the test's own assignment"
        );
        assert_eq!(lease_holder(&observer).await.as_deref(), Some("replica-a"));

        // The holder's API server and the leader replica die at the same moment.
        bed.cp.kill_apiserver(0).await;
        a.kill().await.unwrap();
        common::wait_for("the FIP to answer again", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        assert_eq!(lease_holder(&observer).await.as_deref(), Some("replica-b"));
        let now = holder(&bed).await;
        assert!(matches!(now, Some(id) if id == CP[1] || id == CP[2]), "{now:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(ip_writes(&bed.sim), 2, "exactly one move: one writer");
    });
}

/// Nodes cp-0…cp-2 registered (then only Nodes are candidates), one replica on cp-1: cordoning
/// the holder's Node moves the FIP away; cordoning its new Node moves it again, and each move
/// has its own Event.
#[test]
fn cordoning_the_holder_moves_the_fip_away() {
    lab::run(|| async {
        let bed = bed(0).await;
        let client = bed.cp.client(1).unwrap();
        common::register_cp_nodes(&client, &CP).await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let _c = bed
            .replica(1)
            .identity("replica-a")
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(holder(&bed).await, Some(CP[0]));

        let cordon = |name: String| {
            let nodes = nodes.clone();
            async move {
                let patch = serde_json::json!({"spec": {"unschedulable": true}});
                nodes
                    .patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                    .unwrap();
            }
        };
        cordon("cp-0".into()).await;
        common::wait_for(
            "the FIP to leave the cordoned node",
            Duration::from_secs(15),
            || async { holder(&bed).await != Some(CP[0]) },
        )
        .await;
        common::wait_for(
            "the FIP answers from its new node",
            Duration::from_secs(10),
            || bed.fip_answers(),
        )
        .await;

        // Its new node is cordoned too: the FIP moves again, and a second Event says where to
        // (not the first one counted again, with the first move's message).
        let first = holder(&bed).await.unwrap();
        let i = CP.iter().position(|&c| c == first).unwrap();
        // Past the hold-down that follows a move (5 s).
        tokio::time::sleep(Duration::from_secs(5)).await;
        cordon(format!("cp-{i}")).await;
        common::wait_for(
            "the FIP to leave the second cordoned node",
            Duration::from_secs(15),
            || async { holder(&bed).await.is_some_and(|h| h != CP[0] && h != first) },
        )
        .await;
        let last = holder(&bed).await.unwrap();
        common::wait_for(
            "a FloatingIPMoved Event per move",
            Duration::from_secs(10),
            || {
                let client = client.clone();
                async move {
                    let events = Api::<Event>::namespaced(client, "kube-system")
                        .list(&ListParams::default())
                        .await
                        .unwrap()
                        .items;
                    let moved: Vec<String> = events
                        .iter()
                        .filter(|e| e.reason.as_deref() == Some("FloatingIPMoved"))
                        .filter_map(|e| e.message.clone())
                        .collect();
                    moved.iter().any(|m| m.contains(&format!("(server {first})")))
                        && moved.iter().any(|m| m.contains(&format!("(server {last})")))
                }
            },
        )
        .await;
        common::wait_for(
            "the FIP answers from its last node",
            Duration::from_secs(10),
            || bed.fip_answers(),
        )
        .await;
    });
}

/// The worst placement: the only replica runs on the FIP holder's node and talks to its API
/// server first (`--api-servers` lists all three). When that API server dies, the replica's
/// client fails over to cp-1/cp-2 and it moves the FIP well inside its lease: it never lost
/// leadership.
#[test]
fn a_controller_whose_api_server_is_the_holder_fails_over_on_the_client_side() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let urls: Vec<String> = (0..3).map(|i| bed.cp.url(i)).collect();
        let _c = bed
            .replica(0)
            .identity("replica-a")
            .args(&["--api-servers", &urls.join(",")])
            .env("BATON_API_RATE_LIMIT", "4")
            .spawn();
        let observer = bed.cp.client(2).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        common::wait_for("the FIP answers through cp-0", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        let stopped = Instant::now();
        bed.cp.kill_apiserver(0).await;
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            bed.fip_answers()
        })
        .await;
        // Well inside the lease duration: the replica never lost leadership.
        assert!(
            stopped.elapsed() < Duration::from_secs(4),
            "took {:?}",
            stopped.elapsed()
        );
        // Past the 5 s after a move in which another move is held back: a second move would
        // show by now.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(
            lease_holder(&observer).await.as_deref(),
            Some("replica-a"),
            "kept the lease through cp-1/cp-2"
        );
        assert_eq!(
            ip_writes(&bed.sim),
            2,
            "exactly one move\n{}\n--- agent on cp-0:\n{}",
            bed.logs(),
            common::routed::tail(&bed.logs.path().join("agent-0.log"), 20)
        );
    });
}
