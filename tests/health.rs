//! `/health`, `/ready` and the client's time limits of the real `baton controller` binary against
//! real API servers that hang (SIGSTOP): an API server that accepts connections and never answers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use baton_cloud::{CherryClient, Cloud};
use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];
/// Each test has its own network namespace, so a fixed port is free.
const ADMIN: &str = "127.0.0.1:9590";

struct Bed {
    cp: ControlPlane,
    sim: SimHandle,
    cloud: CherryClient,
    fip: baton_cloud::model::IpAddress,
}

async fn bed(servers: u8) -> Bed {
    let cp = ControlPlane::start(Options::servers(servers)).await.unwrap();
    let sim = common::sim(Faults::none(), common::spliced(Topology::default())).await;
    let (cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), CP[0]).await;
    Bed { cp, sim, cloud, fip }
}

/// `baton controller` talking to API server 0 (plus `extra` flags), admin server on [`ADMIN`].
fn controller(bed: &Bed, log: &Path, extra: &[String], env: &[(&str, &str)]) -> Child {
    controller_as(bed, ADMIN_TOKEN, log, extra, env)
}

/// [`controller`] authenticating with `token`.
fn controller_as(bed: &Bed, token: &str, log: &Path, extra: &[String], env: &[(&str, &str)]) -> Child {
    let kubeconfig = bed.cp.write_kubeconfig(0, token).unwrap();
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("controller")
        .args(extra)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--identity", "replica-a", "--admin-listen", ADMIN])
        .env("CHERRY_API_KEY", "sim-token")
        .env("CHERRY_PROJECT_ID", "123456")
        .env("CHERRY_FIP_TAG", "cluster=lab-cp")
        .env("CHERRY_BASE_URL", bed.sim.base_url().as_str())
        .env("BATON_API_RATE_LIMIT", "4")
        .env("BATON_LOG", "info,baton=debug")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
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

/// Status and body of `GET http://ADMIN/<path>` (`None`: no answer).
async fn admin(path: &str) -> Option<(u16, String)> {
    let client = baton_testbed::http_client(None).unwrap();
    let r = client
        .get(format!("http://{ADMIN}{path}"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.text().await.ok()?))
}

async fn status(path: &str) -> Option<u16> {
    admin(path).await.map(|(s, _)| s)
}

/// The sum of metric `name`'s samples on the admin port (`name{…}` picks one series).
async fn metric(name: &str) -> Option<f64> {
    let (_, text) = admin("/metrics").await?;
    common::metric_sum(&text, name)
}

#[test]
fn ready_fails_while_the_only_api_server_hangs_and_recovers_when_it_is_back() {
    lab::run(|| async {
        let bed = bed(1).await;
        let logs = tempfile::tempdir().unwrap();
        let _c = controller(&bed, &logs.path().join("a.log"), &[], &[]);
        common::wait_for("/ready", Duration::from_secs(30), || async {
            status("/ready").await == Some(200)
        })
        .await;
        assert!(
            admin("/health")
                .await
                .is_some_and(|(s, t)| s == 200 && t.starts_with("ok\n"))
        );
        // Let the lease and the watches settle on their connections first.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(status("/ready").await, Some(200));
        // The only replica leads: there is a leader.
        assert_eq!(metric("baton_leaderless_seconds").await, Some(0.0));

        let frozen = Frozen::apiserver(&bed.cp, 0);
        let hung = Instant::now();
        common::wait_for("/ready to fail", Duration::from_secs(20), || async {
            status("/ready").await == Some(503)
        })
        .await;
        let took = hung.elapsed();
        eprintln!("/ready failed {took:?} after the API server hung");
        // READY_WINDOW is 8 s: not before it, and not much after.
        assert!(took >= Duration::from_secs(7), "too early: {took:?}");
        let (_, why) = admin("/ready").await.unwrap();
        assert!(why.contains("no API server answered"), "{why}");
        assert_eq!(metric("baton_api_server_reachable").await, Some(0.0));
        assert!(metric("baton_api_requests_failed_total").await.unwrap_or(0.0) >= 1.0);
        // Its renewals cannot reach the API server: its Lease lapsed a second after the hang
        // and nobody has led since.
        let leaderless = metric("baton_leaderless_seconds").await.unwrap();
        assert!(
            leaderless >= took.as_secs_f64() - 2.0 && leaderless <= took.as_secs_f64() + 1.0,
            "{leaderless} s without a leader, {took:?} after the hang"
        );
        // An unreachable API server is not a dead task: liveness stays good.
        assert!(
            admin("/health")
                .await
                .is_some_and(|(s, t)| s == 200 && t.starts_with("ok\n"))
        );

        drop(frozen);
        let back = Instant::now();
        common::wait_for("/ready to recover", Duration::from_secs(20), || async {
            status("/ready").await == Some(200)
        })
        .await;
        eprintln!(
            "/ready recovered {:?} after the API server resumed",
            back.elapsed()
        );
        assert_eq!(metric("baton_api_server_reachable").await, Some(1.0));
        common::wait_for("a leader again", Duration::from_secs(10), || async {
            metric("baton_leaderless_seconds").await == Some(0.0)
        })
        .await;
        drop(logs);
    });
}

/// A token of ServiceAccount `namespace/name` (TokenRequest, as a pod's projected token).
async fn sa_token(admin: &kube::Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

#[test]
fn a_replica_whose_token_is_no_longer_valid_is_not_ready() {
    lab::run(|| async {
        let bed = bed(1).await;
        let admin_client = bed.cp.client(0).unwrap();
        common::apply_shipped_manifests(&admin_client, &["rbac.yaml"]).await;
        let token = sa_token(&admin_client, "kube-system", "baton").await;
        let logs = tempfile::tempdir().unwrap();
        let mut c = controller_as(&bed, &token, &logs.path().join("a.log"), &[], &[]);
        common::wait_for("/ready", Duration::from_secs(30), || async {
            status("/ready").await == Some(200)
        })
        .await;

        // The ServiceAccount goes: its token no longer authenticates, every request is answered
        // 401. An answer, but not one that counts as reaching the API server.
        Api::<ServiceAccount>::namespaced(admin_client.clone(), "kube-system")
            .delete("baton", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        let gone = Instant::now();
        // The API server keeps a token it authenticated for 10 s (its token cache), then
        // READY_WINDOW (8 s): about 18 s.
        common::wait_for("/ready to fail", Duration::from_secs(45), || async {
            status("/ready").await == Some(503)
        })
        .await;
        let took = gone.elapsed();
        eprintln!("/ready failed {took:?} after the token stopped being valid");
        // READY_WINDOW (8 s) after the last successful answer.
        assert!(took >= Duration::from_secs(6), "too early: {took:?}");
        let (_, why) = admin("/ready").await.unwrap();
        assert!(why.contains("the last answer was HTTP 401"), "{why}");
        assert!(
            metric("baton_api_requests_failed_total{reason=\"unauthorized\"}")
                .await
                .unwrap_or(0.0)
                >= 1.0
        );
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
        drop(logs);
    });
}

#[test]
fn health_fails_naming_a_loop_held_in_a_cloud_call_and_recovers_when_it_returns() {
    lab::run(|| async {
        let bed = bed(1).await;
        let logs = tempfile::tempdir().unwrap();
        // The cloud holds every request until the client gives up (10 s a try here); the
        // endpoint loop's first cloud read is one of them. A 3 s stall limit instead of 150 s.
        bed.sim
            .set_faults(Faults {
                hang_rate: 1.0,
                ..Faults::none()
            })
            .unwrap();
        let extra: Vec<String> = ["--api-timeout", "10s", "--loop-stall-limit", "3s"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let mut c = controller(&bed, &logs.path().join("a.log"), &extra, &[]);
        common::wait_for("/health to fail", Duration::from_secs(30), || async {
            status("/health").await == Some(503)
        })
        .await;
        let (_, why) = admin("/health").await.unwrap();
        eprintln!("/health while the cloud holds the call:\n{why}");
        assert!(
            why.contains("loop endpoints stalled: ") && why.contains("in one unit of work (limit 3s)"),
            "{why}"
        );
        assert!(!why.contains("loop lease stalled"), "{why}");
        let age = metric("baton_loop_heartbeat_age_seconds{loop=\"endpoints\"}")
            .await
            .unwrap();
        assert!(age > 3.0, "{age}");
        // A stuck loop is not an unreachable API server: the replica stays ready.
        assert_eq!(status("/ready").await, Some(200));

        // The cloud answers again: the held attempt times out, the retry is answered, the loop
        // goes on and beats.
        bed.sim.set_faults(Faults::none()).unwrap();
        let back = Instant::now();
        common::wait_for("/health to recover", Duration::from_secs(30), || async {
            status("/health").await == Some(200)
        })
        .await;
        eprintln!(
            "/health recovered {:?} after the cloud answered again",
            back.elapsed()
        );
        let (_, text) = admin("/health").await.unwrap();
        assert!(text.starts_with("ok\n"), "{text}");
        assert!(text.contains("loop endpoints: heartbeat age "), "{text}");
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
        drop(logs);
    });
}

/// A replica started while its API server does not answer, and then refuses it (its RBAC not
/// there yet: in a fresh cluster the handoff's bindings reach each API server's cache a moment
/// later), waits for both instead of exiting: it serves `/health` meanwhile, and leads once the
/// binding exists.
#[test]
fn a_replica_started_before_its_api_server_answers_and_allows_it_waits_for_both() {
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
        let token = sa_token(&admin_client, "kube-system", "baton").await;
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("a.log");

        let frozen = Frozen::apiserver(&bed.cp, 0);
        let mut c = controller_as(&bed, &token, &log, &[], &[]);
        common::wait_for(
            "/health while the API server hangs",
            Duration::from_secs(10),
            || async {
                admin("/health")
                    .await
                    .is_some_and(|(s, t)| s == 200 && t.starts_with("ok\n"))
            },
        )
        .await;
        // Past the client's connect and request limits (1 s, 3 s): the first reads failed.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(
            c.try_wait().unwrap().is_none(),
            "the controller exited while its API server hung"
        );
        assert_ne!(status("/ready").await, Some(200));

        drop(frozen);
        common::wait_for("/ready to name the refusal", Duration::from_secs(30), || async {
            admin("/ready")
                .await
                .is_some_and(|(s, t)| s == 503 && t.contains("the last answer was HTTP 403"))
        })
        .await;
        assert!(
            c.try_wait().unwrap().is_none(),
            "the controller exited on HTTP 403"
        );
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("cannot read the cluster id yet") && text.contains("forbidden"),
            "no warning naming the refusal:\n{text}"
        );

        common::apply_shipped_manifests(&admin_client, &["rbac.yaml"]).await;
        common::wait_for("/ready once allowed", Duration::from_secs(30), || async {
            status("/ready").await == Some(200)
        })
        .await;
        common::wait_for("the replica leads", Duration::from_secs(20), || async {
            lease(&admin_client)
                .await
                .is_some_and(|(holder, _)| holder == "replica-a")
        })
        .await;
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
        drop(logs);
    });
}

#[test]
fn health_fails_naming_a_controller_task_that_died() {
    lab::run(|| async {
        let bed = bed(1).await;
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("a.log");
        // The hidden test hook: the supervised "nodes" task panics a second after it started.
        let mut c = controller(&bed, &log, &[], &[("BATON_TEST_FAIL_TASK", "nodes")]);
        common::wait_for("/health to fail", Duration::from_secs(30), || async {
            status("/health").await == Some(503)
        })
        .await;
        let (_, why) = admin("/health").await.unwrap();
        assert!(why.contains("task nodes panicked"), "{why}");
        assert_eq!(metric("baton_task_up{task=\"nodes\"}").await, Some(0.0));
        assert_eq!(metric("baton_task_up{task=\"services\"}").await, Some(1.0));
        assert_eq!(metric("baton_task_up{task=\"lease\"}").await, Some(1.0));
        // The rest keeps running: the process is up, the API answers.
        assert!(c.try_wait().unwrap().is_none(), "the controller exited");
        common::wait_for("/ready", Duration::from_secs(10), || async {
            status("/ready").await == Some(200)
        })
        .await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("controller task stopped unexpectedly"),
            "no error line:\n{text}"
        );
        drop(logs);
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

async fn holder(bed: &Bed) -> Option<u64> {
    bed.cloud.ip(&bed.fip.id).await.unwrap().target().map(|s| s.0)
}

#[test]
fn a_controller_whose_first_api_server_hangs_keeps_working_through_the_next() {
    lab::run(|| async {
        let bed = bed(3).await;
        let logs = tempfile::tempdir().unwrap();
        // The worst placement: the replica uses the FIP holder's API server first. Unlike a
        // killed one, a hung API server accepts connections and never answers.
        let urls: Vec<String> = (0..3).map(|i| bed.cp.url(i)).collect();
        let extra = vec!["--api-servers".to_owned(), urls.join(",")];
        let observer = bed.cp.client(2).unwrap();
        common::register_cp_nodes(&observer, &CP).await;
        let _c = controller(&bed, &logs.path().join("a.log"), &extra, &[]);
        common::wait_for("replica-a to lead", Duration::from_secs(30), || async {
            lease(&observer).await.is_some_and(|(h, _)| h == "replica-a")
        })
        .await;
        common::wait_for("/ready", Duration::from_secs(30), || async {
            status("/ready").await == Some(200)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(ip_writes(&bed.sim), 1, "only the test's own assignment");

        let ca = bed.cp.ca_der().to_vec();
        let fip = SocketAddr::new(bed.fip.address, 6443);
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
            common::readyz(&ca, fip)
        })
        .await;
        let moved_to = holder(&bed).await;
        assert!(
            matches!(moved_to, Some(id) if id == CP[1] || id == CP[2]),
            "{moved_to:?}"
        );
        assert_eq!(ip_writes(&bed.sim), 2, "exactly one move");

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
        drop(logs);
    });
}
