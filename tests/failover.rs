//! `baton controller` against three real API servers and the simulator, in a lab: the
//! control-plane FIP follows a healthy API server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_cloud::model::IpAddress;
use baton_cloud::{CherryClient, Cloud};
use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Event, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];

struct Bed {
    cp: ControlPlane,
    sim: SimHandle,
    cloud: CherryClient,
    fip: IpAddress,
}

async fn bed(latency_ms: u64) -> Bed {
    bed_with(latency_ms, Options::servers(3)).await
}

async fn bed_with(latency_ms: u64, opts: Options) -> Bed {
    let cp = ControlPlane::start(opts).await.unwrap();
    let sim = common::sim(
        Faults {
            latency_ms: latency_ms.into(),
            ..Faults::none()
        },
        common::spliced(Topology::default()),
    )
    .await;
    let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), CP[0]).await;
    Bed { cp, sim, cloud, fip }
}

/// Starts `baton controller` as a process talking to API server `apiserver`.
fn controller(bed: &Bed, apiserver: usize, identity: &str, log: &Path) -> Child {
    controller_as(bed, apiserver, identity, log, ADMIN_TOKEN)
}

fn controller_as(bed: &Bed, apiserver: usize, identity: &str, log: &Path, token: &str) -> Child {
    controller_with(bed, apiserver, identity, log, token, &[])
}

fn controller_with(
    bed: &Bed,
    apiserver: usize,
    identity: &str,
    log: &Path,
    token: &str,
    extra: &[String],
) -> Child {
    let kubeconfig = bed.cp.write_kubeconfig(apiserver, token).unwrap();
    controller_on(bed, &kubeconfig, identity, log, extra)
}

/// Starts `baton controller` with `kubeconfig` (e.g. one naming a slow API server).
fn controller_on(bed: &Bed, kubeconfig: &Path, identity: &str, log: &Path, extra: &[String]) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("controller")
        .args(extra)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--identity", identity, "--admin-listen", "off"])
        .env("CHERRY_API_KEY", "sim-token")
        .env("CHERRY_PROJECT_ID", "123456")
        .env("CHERRY_FIP_TAG", "cluster=lab-cp")
        .env("CHERRY_BASE_URL", bed.sim.base_url().as_str())
        .env("BATON_API_RATE_LIMIT", "4")
        .env("BATON_LOG", "info,baton=debug")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn holder(bed: &Bed) -> Option<u64> {
    bed.cloud.ip(&bed.fip.id).await.unwrap().target().map(|s| s.0)
}

#[test]
fn stopping_the_holders_api_server_moves_the_fip_to_a_healthy_one() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let logs = tempfile::tempdir().unwrap();
        let _c = controller(&bed, 1, "replica-a", &logs.path().join("a.log"));
        let client = bed.cp.client(1).unwrap();
        let ca = bed.cp.ca_der().to_vec();
        let fip = SocketAddr::new(bed.fip.address, 6443);

        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        assert!(common::readyz(&ca, fip).await, "the FIP answers through cp-0");
        // Steady state: the healthy holder keeps the FIP (probes run for a few seconds).
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            holder(&bed).await,
            Some(CP[0]),
            "no move while the holder is healthy"
        );

        let stopped = Instant::now();
        bed.cp.kill_apiserver(0).await;
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            common::readyz(&ca, fip)
        })
        .await;
        let recovered = stopped.elapsed();
        let now = holder(&bed).await;
        assert!(
            matches!(now, Some(id) if id == CP[1] || id == CP[2]),
            "moved to a healthy server: {now:?}"
        );
        eprintln!("failover: FIP answered again {recovered:?} after the holder's API server was killed");

        // Exactly one retarget call for the move (the simulator counts writes).
        let puts = ip_puts(&bed.sim).len();
        assert_eq!(puts, 2, "the test's own assignment + one move");

        // An Event on the mirror Service says what happened.
        common::wait_for("the FloatingIPMoved Event", Duration::from_secs(10), || {
            let client = client.clone();
            async move {
                Api::<Event>::namespaced(client, "kube-system")
                    .list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("FloatingIPMoved"))
            }
        })
        .await;
        drop(logs);
    });
}

#[test]
fn a_short_hiccup_of_the_holder_does_not_move_the_fip() {
    lab::run(|| async {
        let bed = bed(0).await;
        let logs = tempfile::tempdir().unwrap();
        let _c = controller(&bed, 1, "replica-a", &logs.path().join("a.log"));
        let client = bed.cp.client(1).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Freeze the holder's API server for 300 ms (about one probe: fewer failures than the
        // fall threshold of 3), five times over, then watch for 3 s: the FIP never moves.
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
        drop(logs);
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
/// leading in one term, the follower never takes over, the FIP stays.
#[test]
fn leadership_rides_out_api_writes_slower_than_the_old_renew_attempt_limit() {
    use baton_testbed::{Profile, SlowApi};
    lab::run(|| async {
        let bed = bed(100).await;
        let logs = tempfile::tempdir().unwrap();
        let slow_a = SlowApi::start(&bed.cp, 1, Profile::fixed(Duration::from_millis(450)))
            .await
            .unwrap();
        let slow_b = SlowApi::start(&bed.cp, 2, Profile::fixed(Duration::from_millis(450)))
            .await
            .unwrap();
        let observer = bed.cp.client(0).unwrap();
        let kubeconfig = bed.cp.write_kubeconfig_for(&slow_a.url(), ADMIN_TOKEN).unwrap();
        let _a = controller_on(&bed, &kubeconfig, "replica-a", &logs.path().join("a.log"), &[]);
        leads(&observer, "replica-a").await;
        let kubeconfig = bed.cp.write_kubeconfig_for(&slow_b.url(), ADMIN_TOKEN).unwrap();
        let _b = controller_on(&bed, &kubeconfig, "replica-b", &logs.path().join("b.log"), &[]);
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
        let a_log = std::fs::read_to_string(logs.path().join("a.log")).unwrap();
        eprintln!(
            "Lease before {before:?}, after {after:?}; {renewals} writes of replica-a in 10 s, each held 450 ms"
        );
        assert!(
            renewals >= 10,
            "the leader renewed through the slow API server: {renewals} writes"
        );
        let b_log = std::fs::read_to_string(logs.path().join("b.log")).unwrap();
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
/// after that answer, and finds the FIP moved: one retarget, not two.
#[test]
fn a_graceful_stop_waits_for_the_retarget_on_its_way_before_the_next_leader_acts() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let logs = tempfile::tempdir().unwrap();
        let a_log = logs.path().join("a.log");
        let mut a = controller(&bed, 1, "replica-a", &a_log);
        let observer = bed.cp.client(2).unwrap();
        leads(&observer, "replica-a").await;
        let _b = controller(&bed, 2, "replica-b", &logs.path().join("b.log"));
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
            let log = std::fs::read_to_string(&a_log).unwrap_or_default();
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
        let log = std::fs::read_to_string(&a_log).unwrap();
        let puts = ip_puts(&bed.sim);
        eprintln!("replica-b led {took_over:?} after SIGTERM; retargets: {puts:?}");
        assert!(
            log.contains("waited for writes on their way before releasing the lease")
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

#[test]
fn losing_the_holder_and_the_leader_together_still_moves_the_fip_exactly_once() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let logs = tempfile::tempdir().unwrap();
        // Replica A talks to the holder's own API server (the worst case), replica B to cp-1's.
        let mut a = controller(&bed, 0, "replica-a", &logs.path().join("a.log"));
        let observer = bed.cp.client(2).unwrap();
        leads(&observer, "replica-a").await;
        let _b = controller(&bed, 1, "replica-b", &logs.path().join("b.log"));
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            ip_writes(&bed.sim),
            1,
            "before the failure: only the test's own assignment"
        );

        // The holder's API server and the leader replica die at the same moment.
        let ca = bed.cp.ca_der().to_vec();
        let fip = SocketAddr::new(bed.fip.address, 6443);
        bed.cp.kill_apiserver(0).await;
        a.kill().await.unwrap();
        common::wait_for("the FIP to answer again", Duration::from_secs(30), || {
            common::readyz(&ca, fip)
        })
        .await;
        assert_eq!(lease_holder(&observer).await.as_deref(), Some("replica-b"));
        let now = holder(&bed).await;
        assert!(matches!(now, Some(id) if id == CP[1] || id == CP[2]), "{now:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(ip_writes(&bed.sim), 2, "exactly one move: one writer");
    });
}

#[test]
fn cordoning_the_holder_moves_the_fip_away() {
    lab::run(|| async {
        let bed = bed(0).await;
        let client = bed.cp.client(1).unwrap();
        common::register_cp_nodes(&client, &CP).await;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
        let logs = tempfile::tempdir().unwrap();
        let _c = controller(&bed, 1, "replica-a", &logs.path().join("a.log"));
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
        assert!(common::readyz(bed.cp.ca_der(), SocketAddr::new(bed.fip.address, 6443)).await);

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
    });
}

/// The shipped RBAC, with the real service account: `manifests/rbac.yaml` creates
/// `kube-system/baton`, and the controller authenticates with a token the API server issues
/// for it (TokenRequest, as the kubelet does for the pods' projected token). tests/bootstrap.rs
/// and tests/pods.rs run the same RBAC in real pods.
#[test]
fn the_shipped_rbac_is_enough_for_a_failover() {
    lab::run(|| async {
        let mut bed = bed_with(0, Options::servers(3)).await;
        let admin = bed.cp.client(1).unwrap();
        common::apply_shipped_manifests(&admin, &["rbac.yaml"]).await;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let sa_token = Api::<ServiceAccount>::namespaced(admin, "kube-system")
            .create_token_request("baton", &PostParams::default(), &request)
            .await
            .expect("a token for kube-system/baton")
            .status
            .expect("TokenRequest status")
            .token;
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("a.log");
        let _c = controller_as(&bed, 1, "replica-a", &log, &sa_token);
        let client = bed.cp.client(1).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&client)
        })
        .await;
        bed.cp.kill_apiserver(0).await;
        let ca = bed.cp.ca_der().to_vec();
        let fip = SocketAddr::new(bed.fip.address, 6443);
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            common::readyz(&ca, fip)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let text = std::fs::read_to_string(&log).unwrap();
        // kube-apiserver's denials all say "forbidden" ("… is forbidden: User …", reason
        // Forbidden); a bare "403" would also match timestamps such as 18:22:41.403450Z.
        assert!(
            !text.to_lowercase().contains("forbidden"),
            "the controller hit RBAC denials:\n{text}"
        );
    });
}

#[test]
fn a_controller_whose_api_server_is_the_holder_fails_over_on_the_client_side() {
    lab::run(|| async {
        let mut bed = bed(100).await;
        let logs = tempfile::tempdir().unwrap();
        // The worst placement: the only replica talks to the FIP holder's own API server first.
        let urls: Vec<String> = (0..3).map(|i| bed.cp.url(i)).collect();
        let extra = vec!["--api-servers".to_owned(), urls.join(",")];
        let _c = controller_with(
            &bed,
            0,
            "replica-a",
            &logs.path().join("a.log"),
            ADMIN_TOKEN,
            &extra,
        );
        let observer = bed.cp.client(2).unwrap();
        common::wait_for("the mirror Service's ingress", Duration::from_secs(30), || {
            common::mirror_has_ingress(&observer)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        let ca = bed.cp.ca_der().to_vec();
        let fip = SocketAddr::new(bed.fip.address, 6443);
        let stopped = Instant::now();
        bed.cp.kill_apiserver(0).await;
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            common::readyz(&ca, fip)
        })
        .await;
        // Well inside the lease duration: the replica never lost leadership.
        assert!(
            stopped.elapsed() < Duration::from_secs(4),
            "took {:?}",
            stopped.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            lease_holder(&observer).await.as_deref(),
            Some("replica-a"),
            "kept the lease through cp-1/cp-2"
        );
        assert_eq!(ip_writes(&bed.sim), 2);
    });
}
