//! `/health`, `/ready` and the client's time limits of the real `baton controller` binary against
//! real API servers that hang (SIGSTOP): an API server that accepts connections and never answers.
//!
//! On the path real nodes have (`common::routed`): lab nodes, each its own network namespace and
//! API server, `baton agent` on each, the simulator routing the control-plane FIP to its holder.
//! The replica runs on cp-0 and talks to cp-0's API server; its admin server listens where the
//! shipped manifests put it, on the node's loopback (`127.0.0.1:9590`, where the kubelet probes
//! a host-network pod), and the test reads it there, with curl in the node's namespaces.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)] // in tests a panic is the failure report

mod common;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");

use std::time::Duration;

use baton_cloud::Cloud;
use baton_sim::{Faults, SimHandle};
use baton_testbed::{ControlPlane, lab};
use common::routed::{CP, Replica, Routed};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;

/// The admin server's address on its node (the default of `--admin-listen`).
const ADMIN: &str = "127.0.0.1:9590";

async fn bed(nodes: u8) -> Routed {
    Routed::start(BATON, nodes, Faults::none(), "lab-cp").await
}

/// `baton controller` `identity` on cp-0, talking to cp-0's API server, admin server on
/// [`ADMIN`].
fn controller<'a>(bed: &'a Routed, identity: &str) -> Replica<'a> {
    bed.replica(0)
        .identity(identity)
        .admin_listen(ADMIN)
        .env("BATON_API_RATE_LIMIT", "4")
}

/// SIGSTOPs a process; SIGCONTs it when dropped (also when the test fails).
struct Frozen(Pid);

impl Frozen {
    fn apiserver(cp: &ControlPlane, i: usize) -> Self {
        let pid = Pid::from_raw(i32::try_from(cp.apiserver_pid(i).unwrap()).unwrap());
        kill(pid, Signal::SIGSTOP).unwrap();
        Self(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

/// Status and body of `GET http://ADMIN/<path>` on cp-0, by curl in the node's namespaces
/// (`None`: no answer).
async fn admin(bed: &Routed, path: &str) -> Option<(u16, String)> {
    let out = bed
        .cp
        .node_command("cp-0", "curl")
        .unwrap()
        .args(["-s", "-m", "2", "-w", "\n%{http_code}"])
        .arg(format!("http://{ADMIN}{path}"))
        .output()
        .await
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_owned()))
}

async fn status(bed: &Routed, path: &str) -> Option<u16> {
    admin(bed, path).await.map(|(s, _)| s)
}

/// The sum of metric `name`'s samples on the admin port (`name{…}` picks one series).
async fn metric(bed: &Routed, name: &str) -> Option<f64> {
    let (_, text) = admin(bed, "/metrics").await?;
    common::metric_sum(&text, name)
}

async fn healthy(bed: &Routed) -> bool {
    admin(bed, "/health")
        .await
        .is_some_and(|(s, t)| s == 200 && t.starts_with("ok\n"))
}

#[test]
fn ready_fails_while_the_only_api_server_hangs_and_recovers_when_it_is_back() {
    lab::run(|| async {
        let bed = bed(1).await;
        let _c = controller(&bed, "replica-a").spawn();
        common::wait_for("/ready", Duration::from_secs(30), || async {
            status(&bed, "/ready").await == Some(200)
        })
        .await;
        assert!(healthy(&bed).await);
        // Let the lease and the watches settle on their connections first.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(status(&bed, "/ready").await, Some(200));
        // The only replica leads: there is a leader.
        assert_eq!(metric(&bed, "baton_leaderless_seconds").await, Some(0.0));

        let frozen = Frozen::apiserver(&bed.cp, 0);
        let hung = Instant::now();
        common::wait_for("/ready to fail", Duration::from_secs(20), || async {
            status(&bed, "/ready").await == Some(503)
        })
        .await;
        let took = hung.elapsed();
        eprintln!("/ready failed {took:?} after the API server hung");
        // READY_WINDOW is 8 s: not before it, and not much after.
        assert!(took >= Duration::from_secs(7), "too early: {took:?}");
        let (_, why) = admin(&bed, "/ready").await.unwrap();
        assert!(why.contains("no API server answered"), "{why}");
        assert_eq!(metric(&bed, "baton_api_server_reachable").await, Some(0.0));
        assert!(
            metric(&bed, "baton_api_requests_failed_total")
                .await
                .unwrap_or(0.0)
                >= 1.0
        );
        // Its renewals cannot reach the API server: its Lease lapsed a second after the hang
        // and nobody has led since.
        let leaderless = metric(&bed, "baton_leaderless_seconds").await.unwrap();
        assert!(
            leaderless >= took.as_secs_f64() - 2.0 && leaderless <= took.as_secs_f64() + 1.0,
            "{leaderless} s without a leader, {took:?} after the hang"
        );
        // An unreachable API server is not a dead task: liveness stays good.
        assert!(healthy(&bed).await);

        drop(frozen);
        let back = Instant::now();
        common::wait_for("/ready to recover", Duration::from_secs(20), || async {
            status(&bed, "/ready").await == Some(200)
        })
        .await;
        eprintln!(
            "/ready recovered {:?} after the API server resumed",
            back.elapsed()
        );
        assert_eq!(metric(&bed, "baton_api_server_reachable").await, Some(1.0));
        common::wait_for("a leader again", Duration::from_secs(10), || async {
            metric(&bed, "baton_leaderless_seconds").await == Some(0.0)
        })
        .await;
    });
}

/// A replica started while its API server does not answer, and then refuses it (its RBAC not
/// there yet: in a fresh cluster the handoff's bindings reach each API server's cache a moment
/// later), waits for both instead of exiting: it serves `/health` meanwhile, and leads once the
/// binding exists.
///
/// Then (the same replica, ready and leading) its ServiceAccount goes: its token no longer
/// authenticates, every request is answered 401, an answer that does not count as reaching the
/// API server: it is no longer ready, and keeps running.
#[test]
fn a_replica_waits_for_its_api_server_and_its_rbac_and_is_not_ready_once_its_token_is_invalid() {
    lab::run(|| async {
        let bed = bed(1).await;
        let admin_client = bed.cp.client(0).unwrap();
        let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "baton", "namespace": "kube-system"}
        }))
        .unwrap();
        Api::<ServiceAccount>::namespaced(admin_client.clone(), "kube-system")
            .create(&kube::api::PostParams::default(), &sa)
            .await
            .unwrap();
        let token = common::service_account_token(&admin_client, "kube-system", "baton").await;

        let frozen = Frozen::apiserver(&bed.cp, 0);
        let mut c = controller(&bed, "replica-a").token(&token).spawn();
        common::wait_for(
            "/health while the API server hangs",
            Duration::from_secs(10),
            || healthy(&bed),
        )
        .await;
        // Past the client's connect and request limits (1 s, 3 s): the first reads failed.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            c.try_wait().unwrap().is_none(),
            "the controller exited while its API server hung"
        );
        assert_ne!(status(&bed, "/ready").await, Some(200));

        drop(frozen);
        common::wait_for("/ready to name the refusal", Duration::from_secs(30), || async {
            admin(&bed, "/ready")
                .await
                .is_some_and(|(s, t)| s == 503 && t.contains("the last answer was HTTP 403"))
        })
        .await;
        assert!(
            c.try_wait().unwrap().is_none(),
            "the controller exited on HTTP 403"
        );
        let text = bed.log("replica-a");
        assert!(
            text.contains("cannot read the cluster id yet") && text.contains("forbidden"),
            "no warning naming the refusal:\n{text}"
        );

        common::apply_shipped_manifests(&admin_client, &["rbac.yaml"]).await;
        common::wait_for("/ready once allowed", Duration::from_secs(30), || async {
            status(&bed, "/ready").await == Some(200)
        })
        .await;
        common::wait_for("the replica leads", Duration::from_secs(20), || async {
            lease(&admin_client)
                .await
                .is_some_and(|(holder, _)| holder == "replica-a")
        })
        .await;
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");

        // The ServiceAccount goes.
        Api::<ServiceAccount>::namespaced(admin_client.clone(), "kube-system")
            .delete("baton", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        let gone = Instant::now();
        // The API server keeps a token it authenticated for 10 s (its token cache), then
        // READY_WINDOW (8 s): about 18 s.
        common::wait_for("/ready to fail", Duration::from_secs(45), || async {
            status(&bed, "/ready").await == Some(503)
        })
        .await;
        let took = gone.elapsed();
        eprintln!("/ready failed {took:?} after the token stopped being valid");
        // READY_WINDOW (8 s) after the last successful answer.
        assert!(took >= Duration::from_secs(6), "too early: {took:?}");
        let (_, why) = admin(&bed, "/ready").await.unwrap();
        assert!(why.contains("the last answer was HTTP 401"), "{why}");
        assert!(
            metric(&bed, "baton_api_requests_failed_total{reason=\"unauthorized\"}")
                .await
                .unwrap_or(0.0)
                >= 1.0
        );
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
    });
}

/// `/health` names what is wrong inside a running replica, and only that: first a supervised
/// task that died (the rest keeps running and stays ready), then, in a new replica, a loop held
/// in a cloud call (not ready-affecting; healthy again once the call returns).
#[test]
fn health_fails_naming_a_controller_task_that_died_or_a_loop_held_in_a_cloud_call() {
    lab::run(|| async {
        let bed = bed(1).await;

        // The hidden test hook: the supervised "nodes" task panics a second after it started.
        let mut c = controller(&bed, "replica-a")
            .env("BATON_TEST_FAIL_TASK", "nodes")
            .spawn();
        common::wait_for("/health to fail", Duration::from_secs(30), || async {
            status(&bed, "/health").await == Some(503)
        })
        .await;
        let (_, why) = admin(&bed, "/health").await.unwrap();
        assert!(why.contains("task nodes panicked"), "{why}");
        assert_eq!(metric(&bed, "baton_task_up{task=\"nodes\"}").await, Some(0.0));
        assert_eq!(metric(&bed, "baton_task_up{task=\"services\"}").await, Some(1.0));
        assert_eq!(metric(&bed, "baton_task_up{task=\"lease\"}").await, Some(1.0));
        // The rest keeps running: the process is up, the API answers.
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
        common::wait_for("/ready", Duration::from_secs(10), || async {
            status(&bed, "/ready").await == Some(200)
        })
        .await;
        let text = bed.log("replica-a");
        assert!(
            text.contains("controller task stopped unexpectedly"),
            "no error line:\n{text}"
        );
        c.kill().await.unwrap();

        // The cloud holds every request until the client gives up (10 s a try here); the
        // endpoint loop's first cloud read is one of them. A 3 s stall limit instead of 150 s.
        bed.sim
            .set_faults(Faults {
                hang_rate: 1.0,
                ..Faults::none()
            })
            .unwrap();
        let mut c = controller(&bed, "replica-b")
            .args(&["--api-timeout", "10s", "--loop-stall-limit", "3s"])
            .spawn();
        common::wait_for("/health to fail", Duration::from_secs(30), || async {
            status(&bed, "/health").await == Some(503)
        })
        .await;
        let (_, why) = admin(&bed, "/health").await.unwrap();
        eprintln!("/health while the cloud holds the call:\n{why}");
        assert!(
            why.contains("loop endpoints stalled: ") && why.contains("in one unit of work (limit 3s)"),
            "{why}"
        );
        assert!(!why.contains("loop lease stalled"), "{why}");
        let age = metric(&bed, "baton_loop_heartbeat_age_seconds{loop=\"endpoints\"}")
            .await
            .unwrap();
        assert!(age > 3.0, "{age}");
        // A stuck loop is not an unreachable API server: the replica stays ready.
        assert_eq!(status(&bed, "/ready").await, Some(200));

        // The cloud answers again: the held attempt times out, the retry is answered, the loop
        // goes on and beats.
        bed.sim.set_faults(Faults::none()).unwrap();
        let back = Instant::now();
        common::wait_for("/health to recover", Duration::from_secs(30), || async {
            status(&bed, "/health").await == Some(200)
        })
        .await;
        eprintln!(
            "/health recovered {:?} after the cloud answered again",
            back.elapsed()
        );
        let (_, text) = admin(&bed, "/health").await.unwrap();
        assert!(text.starts_with("ok\n"), "{text}");
        assert!(text.contains("loop endpoints: heartbeat age "), "{text}");
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
    });
}

async fn lease(client: &kube::Client) -> Option<(String, String)> {
    let spec = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get_opt("baton-controller")
        .await
        .ok()
        .flatten()?
        .spec?;
    Some((
        spec.holder_identity?,
        serde_json::to_string(&spec.renew_time?).ok()?,
    ))
}

fn ip_writes(sim: &SimHandle) -> usize {
    sim.log(0)
        .into_iter()
        .filter(|e| matches!(e.method.as_str(), "PUT" | "POST" | "DELETE") && e.path.starts_with("/v1/ips/"))
        .count()
}

async fn holder(bed: &Routed) -> Option<u64> {
    bed.cloud.ip(&bed.fip.id).await.unwrap().target().map(|s| s.0)
}

/// The worst placement: the only replica runs on the FIP holder's node (cp-0) and uses its API
/// server first (`--api-servers` lists all three). Unlike a killed one, a hung API server
/// accepts connections and never answers.
#[test]
fn a_controller_whose_first_api_server_hangs_keeps_working_through_the_next() {
    lab::run(|| async {
        let bed = bed(3).await;
        let urls: Vec<String> = (0..3).map(|i| bed.cp.url(i)).collect();
        let observer = bed.cp.client(2).unwrap();
        common::register_cp_nodes(&observer, &CP).await;
        let _c = controller(&bed, "replica-a")
            .args(&["--api-servers", &urls.join(",")])
            .spawn();
        common::wait_for("replica-a to lead", Duration::from_secs(30), || async {
            lease(&observer).await.is_some_and(|(h, _)| h == "replica-a")
        })
        .await;
        common::wait_for("/ready", Duration::from_secs(30), || async {
            status(&bed, "/ready").await == Some(200)
        })
        .await;
        common::wait_for("the FIP answers through cp-0", Duration::from_secs(30), || {
            bed.fip_answers()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(ip_writes(&bed.sim), 1, "only the test's own assignment");

        let _frozen = Frozen::apiserver(&bed.cp, 0);
        let hung = Instant::now();

        // Lease renewals continue through cp-1/cp-2: renewTime keeps advancing, same holder.
        let mut renewals = 0;
        let mut last = lease(&observer).await.unwrap().1;
        while hung.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let (holder, renew) = lease(&observer).await.unwrap();
            assert_eq!(holder, "replica-a", "kept the lease");
            if renew != last {
                renewals += 1;
                last = renew;
            }
        }
        eprintln!("{renewals} renewals seen in the first 8 s of the hang");
        assert!(renewals >= 4, "only {renewals} renewals seen in 8 s");

        // The FIP left the hung holder (probes fail, the leader acts through another server).
        common::wait_for("the FIP to answer again", Duration::from_secs(20), || {
            bed.fip_answers()
        })
        .await;
        let moved_to = holder(&bed).await;
        assert!(
            matches!(moved_to, Some(id) if id == CP[1] || id == CP[2]),
            "{moved_to:?}"
        );
        assert_eq!(
            ip_writes(&bed.sim),
            2,
            "exactly one move\n{}\n--- agent on cp-0:\n{}",
            bed.logs(),
            common::routed::tail(&bed.logs.path().join("agent-0.log"), 20)
        );

        // The watches left the hung API server too (they were opened on it): cordoning the new
        // holder is seen only through the Node watch, and moves the FIP to the last healthy one.
        let name = if moved_to == Some(CP[1]) { "cp-1" } else { "cp-2" };
        let cordoned = Instant::now();
        Api::<Node>::all(observer.clone())
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
            )
            .await
            .unwrap();
        common::wait_for(
            "the FIP to leave the cordoned node",
            Duration::from_secs(15),
            || async {
                let now = holder(&bed).await;
                now.is_some() && now != moved_to
            },
        )
        .await;
        eprintln!(
            "cordon seen {:?} after it was made, {:?} after the hang",
            cordoned.elapsed(),
            hung.elapsed()
        );
        assert_ne!(holder(&bed).await, Some(CP[0]), "never to the hung API server");
        assert_eq!(lease(&observer).await.unwrap().0, "replica-a");
        common::wait_for(
            "the FIP answers from the last healthy node",
            Duration::from_secs(10),
            || bed.fip_answers(),
        )
        .await;
    });
}
