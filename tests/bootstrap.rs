//! `baton bootstrap` end to end, in a lab: a real bootstrap API server (198.51.100.10, the
//! simulator's `bootstrap` server) and three control-plane API servers (198.51.100.11–13, the
//! simulator's cp-0..2) on one etcd, the Cherry Servers simulator, and the `baton` binary.
//!
//! In the end-to-end test the control-plane servers are lab nodes with real kubelets
//! (`Options::kubelets`): the handoff applies the shipped manifests, and the Deployment's two
//! pods (the image `scripts/build-image` builds) route the FIPs of the API Services the
//! bootstrap creates. The other scenarios run `baton controller` as a process next to it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // a scenario reads best as one story

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::model::{IpAddress, IpType, Tags};
use baton_sim::{Faults, Sim, SimHandle, TopoFip, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use hickory_net::client::{Client, ClientHandle as _};
use hickory_net::runtime::TokioRuntimeProvider;
use hickory_net::udp::UdpClientStream;
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

/// A distinctive API key, to check that it never leaks into output, state or summary.
const API_KEY: &str = "sim-secret-key-0b4c7a19e2";
const BOOTSTRAP: &str = "198.51.100.10";
/// The FIP the "installer" reserved for `api` (tagged `cluster=<infraId>-api`).
const API_FIP: &str = "203.0.113.50";
/// The simulator's control-plane servers cp-0..2 (198.51.100.11–13).
const CP: [u64; 3] = [600_101, 600_102, 600_103];

/// The heavy lab tests share the 2-core machine badly; run them one at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The simulator on loopback, for a lab without nodes: it splices the FIP's port 6443 to its
/// holder (no node could accept a routed FIP there).
async fn start_sim(infra: &str) -> SimHandle {
    start_sim_on(infra, "127.0.0.1:0").await
}

/// The simulator on `listen`; on the lab host's bridge address (for the pods on lab nodes to
/// reach) it routes FIPs to their holders as the cloud does, elsewhere it splices.
async fn start_sim_on(infra: &str, listen: &str) -> SimHandle {
    let routed = listen.starts_with(&baton_testbed::node::LAB_HOST.to_string());
    let topology = Topology {
        forward_ports: if routed { Vec::new() } else { vec![6443] },
        api_key: API_KEY.into(),
        floating_ips: vec![TopoFip {
            id: None,
            address: Some(API_FIP.parse().unwrap()),
            region: "LT-Siauliai".into(),
            tags: Tags::from([("cluster".to_owned(), format!("{infra}-api"))]),
            targeted_to: None,
        }],
        ..Topology::default()
    };
    let mut sim = Sim::builder().topology(topology).faults(Faults::none());
    if routed {
        sim = sim.route_fips(baton_testbed::node::BRIDGE);
    }
    sim.bind(listen.parse().unwrap()).await.expect("simulator")
}

/// `path`, opened for appending (a rerun adds to the same log).
fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// The bootstrap API server and three lab nodes cp-0..2, each with a kubelet (containerd +
/// runc) holding baton's image, kube-controller-manager and kube-scheduler.
async fn start_cluster() -> ControlPlane {
    ControlPlane::start(Options {
        servers: vec![
            lab::public_ip(10),
            lab::public_ip(11),
            lab::public_ip(12),
            lab::public_ip(13),
        ],
        kubelets: true,
        images: vec![baton_testbed::baton_image().expect("baton's image (scripts/build-image)")],
        ..Options::default()
    })
    .await
    .expect("control plane with lab nodes")
}

async fn start_control_plane() -> ControlPlane {
    ControlPlane::start(Options {
        servers: vec![
            lab::public_ip(10),
            lab::public_ip(11),
            lab::public_ip(12),
            lab::public_ip(13),
        ],
        ..Options::default()
    })
    .await
    .expect("control plane")
}

/// One bootstrap scenario's files.
struct Scenario {
    dir: tempfile::TempDir,
    namespace: String,
    dns: SocketAddr,
}

impl Scenario {
    fn config(&self) -> PathBuf {
        self.dir.path().join("bootstrap.yaml")
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }
    fn status(&self) -> PathBuf {
        self.dir.path().join("status.json")
    }
}

fn scenario(cp: &ControlPlane, sim: &SimHandle, infra: &str, namespace: &str, dns_port: u16) -> Scenario {
    let dns = SocketAddr::new(lab::private_ip(10), dns_port);
    scenario_with_dns(
        cp,
        sim,
        infra,
        namespace,
        dns,
        &format!(r#"{{mode: embedded, listen: ["{dns}"], ttl: 1}}"#),
    )
}

fn scenario_with_dns(
    cp: &ControlPlane,
    sim: &SimHandle,
    infra: &str,
    namespace: &str,
    dns: SocketAddr,
    dns_yaml: &str,
) -> Scenario {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
    std::fs::write(
        dir.path().join("handoff.yaml"),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}-system\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: baton-handoff\n  namespace: {namespace}-system\n\
             data:\n  handed-off: \"true\"\n"
        ),
    )
    .unwrap();
    let config = format!(
        r"# written by tests/bootstrap.rs
cluster: {{name: baton, baseDomain: test, infraId: {infra}}}
bootstrapHost: {{publicAddress: {BOOTSTRAP}, privateAddress: 192.0.2.10}}
cloud:
  apiKey: {API_KEY}
  projectID: {project}
  region: LT-Siauliai
  base-url: {base}
  apiRateLimit: 0
  healthCheckInterval: 100ms
  healthCheckTimeout: 500ms
kubernetes:
  kubeconfig: {kubeconfig}
  clusterCA: {ca}
endpoints:
  - name: api
    fip: {{tag: cluster={infra}-api}}
    service: {{namespace: {namespace}, name: api}}
  - name: api-int
    fip: {{reserve: true}}
    service: {{namespace: {namespace}, name: api-int, ports: [{{name: https, port: 6443}}]}}
dns: {dns_yaml}
timeouts: {{bootstrapApi: 60s, handoff: 60s, servicesReady: 120s}}
handoff: {{manifests: [handoff.yaml]}}
",
        project = sim.project_id(),
        base = sim.base_url(),
        kubeconfig = kubeconfig.display(),
        ca = cp.dir().join("ca.crt").display(),
    );
    std::fs::write(dir.path().join("bootstrap.yaml"), config).unwrap();
    Scenario {
        dir,
        namespace: namespace.to_owned(),
        dns,
    }
}

fn baton_bootstrap(s: &Scenario, log: &Path) -> Child {
    let log = append(log);
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args([
            "bootstrap",
            "--output",
            "json",
            "--exit-when-complete",
            "--config",
        ])
        .arg(s.config())
        .arg("--state-file")
        .arg(s.state())
        .arg("--status-file")
        .arg(s.status())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("BATON_LOG", "info,baton=debug,hickory_server=warn,kube=warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn baton")
}

/// Reads the child's JSON events until it exits; returns them and the exit code.
async fn run_to_end(mut child: Child, limit: Duration) -> (Vec<serde_json::Value>, Option<i32>) {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut events = Vec::new();
    let read = async {
        while let Ok(Some(line)) = lines.next_line().await {
            events.push(serde_json::from_str::<serde_json::Value>(&line).unwrap_or(json!({"raw": line})));
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .expect("baton bootstrap did not finish in time");
    let status = child.wait().await.unwrap();
    (events, status.code())
}

/// The in-cluster `baton controller` (one replica) for `sim`, talking to cp-0's API server. It
/// routes the FIPs of the annotated API Services the bootstrap creates.
fn baton_controller(cp: &ControlPlane, sim: &SimHandle, log: &Path) -> Child {
    let kubeconfig = cp.write_kubeconfig(1, ADMIN_TOKEN).unwrap();
    let log = append(log);
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["controller", "--no-leader-election", "--admin-listen", "off"])
        .args(["--identity", "in-cluster", "--kubeconfig"])
        .arg(kubeconfig)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CHERRY_API_KEY", API_KEY)
        .env("CHERRY_PROJECT_ID", sim.project_id().to_string())
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .env("BATON_API_RATE_LIMIT", "0")
        .env("BATON_LOG", "info,baton=debug,kube=warn")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn baton controller")
}

/// True once the simulator has retargeted a FIP (the controller routed it).
fn routed(sim: &SimHandle) -> bool {
    sim.log(0)
        .iter()
        .any(|e| e.method == "PUT" && e.path.starts_with("/v1/ips/") && e.status < 300)
}

fn dns_client(addr: SocketAddr) -> Client<TokioRuntimeProvider> {
    let stream = UdpClientStream::builder(addr, TokioRuntimeProvider::default())
        .with_timeout(Some(Duration::from_millis(200)))
        .build();
    let (client, bg) = Client::<TokioRuntimeProvider>::from_sender(stream);
    tokio::spawn(bg);
    client
}

/// The A records of `name`, sorted; `None` when the server does not answer.
async fn resolve(client: &mut Client<TokioRuntimeProvider>, name: &str) -> Option<BTreeSet<IpAddr>> {
    let resp = client
        .query(Name::from_ascii(name).unwrap(), DNSClass::IN, RecordType::A)
        .await
        .ok()?;
    Some(
        resp.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect(),
    )
}

async fn floating_ips(sim: &SimHandle) -> Vec<IpAddress> {
    common::cloud_ips(sim)
        .await
        .into_iter()
        .filter(|i| i.ip_type == IpType::FloatingIp)
        .collect()
}

/// The cloud and the cluster hold exactly one FIP per endpoint and one of each object.
async fn assert_no_duplicates(sim: &SimHandle, client: &kube::Client, s: &Scenario, infra: &str) {
    let fips = floating_ips(sim).await;
    assert_eq!(fips.len(), 2, "one FIP per endpoint: {fips:#?}");
    let reserved: Vec<_> = fips
        .iter()
        .filter(|f| f.tags.get("infra-id").map(String::as_str) == Some(infra))
        .collect();
    assert_eq!(reserved.len(), 1, "one reserved FIP for api-int: {fips:#?}");
    assert_eq!(
        reserved[0].tags.get("endpoint").map(String::as_str),
        Some("api-int")
    );
    let services = Api::<Service>::namespaced(client.clone(), &s.namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let names: BTreeSet<String> = services.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(services.len(), 2, "{names:?}");
    assert_eq!(names, BTreeSet::from(["api".to_owned(), "api-int".to_owned()]));
    for svc in &services {
        let lb = svc.spec.as_ref().unwrap().load_balancer_ip.clone().unwrap();
        assert!(
            fips.iter().any(|f| f.address.to_string() == lb),
            "{lb} is one of the FIPs"
        );
    }
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &format!("{}-system", s.namespace))
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(
        cms.iter()
            .filter(|c| c.metadata.name.as_deref() == Some("baton-handoff"))
            .count(),
        1
    );
}

#[test]
fn bootstrap_carries_the_endpoint_from_the_bootstrap_host_to_the_fip() {
    lab::run(|| async {
        let _heavy = HEAVY.lock().await;
        let infra = "e2e";
        let started = tokio::time::Instant::now();
        let mut cp = start_cluster().await;
        eprintln!(
            "cluster with lab nodes {:?} Ready in {:.1}s",
            cp.node_names(),
            started.elapsed().as_secs_f64()
        );
        let sim = start_sim_on(infra, &format!("{}:0", baton_testbed::node::LAB_HOST)).await;
        let sim = Arc::new(sim);
        let s = scenario(&cp, &sim, infra, "e2e-api", 5353);
        with_shipped_manifests(&s, &sim);
        let log = s.dir.path().join("baton.log");

        let child = baton_bootstrap(&s, &log);
        let t_bootstrap = tokio::time::Instant::now();
        // Watch what DNS answers for api while the bootstrap runs.
        let watching = CancellationToken::new();
        let watcher = {
            let (watching, sim, addr) = (watching.clone(), Arc::clone(&sim), s.dns);
            tokio::spawn(async move {
                let mut client = dns_client(addr);
                let mut seen: Vec<(BTreeSet<IpAddr>, bool)> = Vec::new();
                while !watching.is_cancelled() {
                    // An empty answer after the first one is recorded too (it must never come).
                    if let Some(a) = resolve(&mut client, "api.baton.test.").await
                        && (!a.is_empty() || !seen.is_empty())
                        && seen.last().map(|(l, _)| l) != Some(&a)
                    {
                        seen.push((a, routed(&sim)));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                seen
            })
        };
        let (events, code) = run_to_end(child, Duration::from_secs(240)).await;
        let bootstrap_s = t_bootstrap.elapsed().as_secs_f64();
        watching.cancel();
        let seen = watcher.await.unwrap();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            code,
            Some(0),
            "exit code; events:\n{events:#?}\nstderr:\n{stderr}\npods:\n{:#?}",
            common::pod_logs(&cp)
        );
        eprintln!("baton bootstrap complete in {bootstrap_s:.1}s (the pods scheduled and started within it)");
        let client = cp.client(1).unwrap();
        assert_pods_did_the_work(&cp, &client).await;
        eprintln!("api.baton.test answered, in order (routed at the time): {seen:?}");
        for e in &events {
            eprintln!("{e}");
        }

        // DNS: the bootstrap host, then bootstrap + FIP (once the FIP routes), then (once the
        // Services are Ready) the FIP only.
        let (b, f) = (ip(BOOTSTRAP), ip(API_FIP));
        let sets: Vec<&BTreeSet<IpAddr>> = seen.iter().map(|(s, _)| s).collect();
        assert_eq!(
            sets[0],
            &BTreeSet::from([b]),
            "the first answer is the bootstrap host alone: {sets:?}"
        );
        assert!(sets.iter().all(|s| !s.is_empty()), "an empty answer: {sets:?}");
        assert_overlap_then_fip_alone(&events);
        assert_eq!(
            sets.last().unwrap(),
            &&BTreeSet::from([f]),
            "the FIP alone at the end: {sets:?}"
        );
        let first_fip_only = sets.iter().position(|s| **s == BTreeSet::from([f])).unwrap();
        assert!(
            sets[first_fip_only..].iter().all(|s| !s.contains(&b)),
            "the bootstrap address never comes back: {sets:?}"
        );
        // The FIP is never handed out before it routes to a healthy API server.
        for (set, was_routed) in &seen {
            assert!(
                !set.contains(&f) || *was_routed,
                "FIP served before it routed: {seen:?}"
            );
        }

        // The API answers through the FIP.
        let http = baton_testbed::http_client(Some(cp.ca_der())).unwrap();
        let body = http
            .get(format!("https://{API_FIP}:6443/readyz"))
            .send()
            .await
            .expect("/readyz through the FIP")
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");
        // The controller routed every endpoint FIP to a control-plane Node, never to the
        // bootstrap host, so stopping the bootstrap API server loses nothing.
        for fip in floating_ips(&sim).await {
            let target = fip.target().map(|t| t.0);
            assert!(
                target.is_some_and(|t| CP.contains(&t)),
                "{} targets {target:?}, not a control-plane server",
                fip.address
            );
        }
        cp.kill_apiserver(0).await;
        let readyz = http
            .get(format!("https://{API_FIP}:6443/readyz"))
            .send()
            .await
            .expect("/readyz through the FIP with the bootstrap API server stopped");
        assert!(readyz.status().is_success());

        // Exactly one FIP per endpoint; the objects exist once.
        assert_no_duplicates(&sim, &client, &s, infra).await;

        // Output: step events in order, a complete summary, the status file, the state file.
        let steps: Vec<&str> = events
            .iter()
            .filter(|e| e["event"] == "step")
            .filter_map(|e| e["step"].as_str())
            .collect();
        assert_eq!(
            steps,
            [
                "reserve-fips",
                "publish-dns",
                "wait-for-api",
                "handoff",
                "wait-for-services",
                "drop-bootstrap",
                "drain",
                "complete"
            ]
        );
        let summary = events.last().unwrap();
        assert_eq!(summary["event"], "summary", "{summary:#}");
        assert_eq!(summary["result"], "complete");
        assert_eq!(summary["exitCode"], 0);
        assert_eq!(summary["endpoints"][0]["fip"], API_FIP);
        assert_eq!(summary["dns"]["records"]["api.baton.test"], json!([API_FIP]));
        let status: serde_json::Value = serde_json::from_slice(&std::fs::read(s.status()).unwrap()).unwrap();
        assert_eq!(status["step"], "complete");
        assert_eq!(status["result"], "complete");
        let state = std::fs::read_to_string(s.state()).unwrap();
        assert!(state.contains("completedAt"), "{state}");
        let all_output = format!("{events:?}{stderr}{state}{status}");
        assert!(!all_output.contains(API_KEY), "the API key leaked");

        // A rerun after completion changes nothing and completes at once.
        let (events, code) = run_to_end(baton_bootstrap(&s, &log), Duration::from_secs(60)).await;
        assert_eq!(code, Some(0), "{events:#?}");
        assert_no_duplicates(&sim, &client, &s, infra).await;

        common::assert_pod_logs_clean(&cp, "baton controller starting", 2, API_KEY);
    });
}

/// Bootstrap + FIP answered together before the FIP alone. The overlap lasts from the FIP's
/// first healthy answer to the last Service becoming Ready, which can be milliseconds (shorter
/// than the 50 ms between a DNS watcher's queries; seen): the bootstrap's own `dns` events say
/// what it published, in order.
fn assert_overlap_then_fip_alone(events: &[serde_json::Value]) {
    let served: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "dns" && e["name"] == "api.baton.test")
        .filter_map(|e| e["message"].as_str())
        .collect();
    let together = served
        .iter()
        .position(|m| m.ends_with(&format!("answers {BOOTSTRAP}, {API_FIP}")))
        .unwrap_or_else(|| panic!("bootstrap + FIP never answered together: {served:?}"));
    let alone = served
        .iter()
        .position(|m| m.ends_with(&format!("answers {API_FIP}")))
        .unwrap_or_else(|| panic!("the FIP never answered alone: {served:?}"));
    assert!(together < alone, "{served:?}");
}

/// Adds the shipped in-cluster manifests to the scenario's handoff: `manifests/rbac.yaml`,
/// `manifests/agent.yaml` (every control-plane node accepts the FIPs),
/// `manifests/deployment.yaml` (unchanged) and the Secret of `manifests/secret.yaml` filled in
/// for `sim`.
fn with_shipped_manifests(s: &Scenario, sim: &SimHandle) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for f in ["rbac.yaml", "agent.yaml", "deployment.yaml"] {
        std::fs::copy(repo.join("manifests").join(f), s.dir.path().join(f)).unwrap();
    }
    let cloud_sa = json!({
        "apiKey": API_KEY,
        "projectID": sim.project_id(),
        "region": "LT-Siauliai",
        "base-url": sim.base_url().as_str(),
        "apiRateLimit": 0,
    });
    std::fs::write(
        s.dir.path().join("secret.yaml"),
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: cherry-cloud-config, namespace: kube-system}}\n\
             stringData:\n  cloud-sa.json: '{cloud_sa}'\n"
        ),
    )
    .unwrap();
    // The API Services live in the scenario's namespace: baton writes their endpoints there, by
    // the RoleBinding manifests/rbac.yaml says to add for such a namespace.
    std::fs::write(
        s.dir.path().join("rbac-endpoints.yaml"),
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: baton-endpoints, namespace: {ns}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: baton-endpoints}}\n\
             subjects: [{{kind: ServiceAccount, name: baton, namespace: kube-system}}]\n",
            ns = s.namespace
        ),
    )
    .unwrap();
    let config = std::fs::read_to_string(s.config()).unwrap().replace(
        "handoff: {manifests: [handoff.yaml]}",
        "handoff: {manifests: [handoff.yaml, rbac.yaml, rbac-endpoints.yaml, secret.yaml, agent.yaml, deployment.yaml]}",
    );
    std::fs::write(s.config(), config).unwrap();
}

/// The Deployment's two pods run on two control-plane nodes, as uid 65532 on a read-only root
/// filesystem; one of them holds the Lease; the nodes were initialised (by the pods: nothing
/// else runs baton here).
async fn assert_pods_did_the_work(cp: &ControlPlane, client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let pods = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=baton"))
        .await
        .unwrap()
        .items;
    let running: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.spec.as_ref().unwrap().node_name.clone().unwrap(),
            )
        })
        .collect();
    eprintln!("baton pods: {running:?}");
    assert_eq!(running.len(), 2, "two baton pods Running: {pods:#?}");
    let nodes: BTreeSet<&String> = running.iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 2, "on two nodes (anti-affinity): {running:?}");
    let lease = Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get("baton-controller")
        .await
        .unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(
        running.iter().any(|(p, _)| *p == holder),
        "the Lease is held by a pod: {holder}"
    );
    // The container's process, seen from the node: uid 65532, root filesystem read-only. (The
    // agent DaemonSet's `baton agent` runs on the node too, as root with NET_ADMIN.)
    for node in &nodes {
        let procs: Vec<i32> = cp
            .node_processes(node)
            .into_iter()
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "baton"))
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"controller"))
            })
            .collect();
        if procs.len() != 1 {
            let statuses: Vec<_> = pods
                .iter()
                .map(|p| (&p.metadata.name, p.status.as_ref().map(|s| &s.container_statuses)))
                .collect();
            let logs: Vec<_> = common::pod_logs(cp)
                .into_iter()
                .filter(|(p, _)| p.parent().and_then(|d| d.file_name()) == Some("baton".as_ref()))
                .collect();
            panic!(
                "{} baton controller processes on {node}, expected one\ncontainers: {statuses:#?}\nlogs: {logs:#?}",
                procs.len()
            );
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", procs[0])).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(
            uid.split_whitespace().skip(1).collect::<Vec<_>>(),
            ["65532"; 4],
            "{node}: {uid}"
        );
        let mountinfo = std::fs::read_to_string(format!("/proc/{}/mountinfo", procs[0])).unwrap();
        let root = mountinfo
            .lines()
            .rfind(|l| l.split_whitespace().nth(4) == Some("/"))
            .unwrap();
        let opts = root.split_whitespace().nth(5).unwrap();
        assert!(opts.split(',').any(|o| o == "ro"), "{node}: root mounted {opts}");
    }
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let name = n.metadata.name.clone().unwrap();
        let spec = n.spec.unwrap_or_default();
        assert!(spec.provider_id.is_some(), "{name} initialised (provider ID)");
        assert!(
            !spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized"),
            "{name}: the uninitialized taint is removed"
        );
    }
}

/// Where a run is killed.
#[derive(Debug, Clone, Copy)]
enum KillPoint {
    /// As soon as this event (a step name, or `fip`) is reported.
    Event(&'static str),
    /// After this long.
    After(Duration),
}

#[test]
fn a_killed_bootstrap_continues_without_duplicates() {
    lab::run(|| async {
        let _heavy = HEAVY.lock().await;
        let cp = start_control_plane().await;
        let client = cp.client(1).unwrap();
        cp.register_nodes(CP.len()).await.unwrap();
        let seed: u64 = std::env::var("BATON_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        eprintln!("crash test seed: {seed} (BATON_CRASH_SEED to repeat)");
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        let mut points: Vec<KillPoint> = [
            "started",
            "reserve-fips",
            "fip",
            "publish-dns",
            "dns-started",
            "wait-for-api",
            "handoff",
            "wait-for-services",
            "drop-bootstrap",
            "drain",
            "complete",
        ]
        .into_iter()
        .map(KillPoint::Event)
        .collect();
        // A whole run takes ~2 s here (most of it the 1 s drain); the first steps take ~200 ms,
        // so half of the random points fall in those.
        for i in 0..13 {
            let range = if i % 2 == 0 { 0..250 } else { 250..1800 };
            points.push(KillPoint::After(Duration::from_millis(rand::Rng::random_range(
                &mut rng, range,
            ))));
        }
        let mut killed_at = BTreeMap::new();
        for (i, point) in points.iter().enumerate() {
            let infra = format!("crash-{i}");
            let sim = start_sim(&infra).await;
            let s = scenario(
                &cp,
                &sim,
                &infra,
                &format!("crash-{i}"),
                5400 + u16::try_from(i).unwrap(),
            );
            let log = s.dir.path().join("baton.log");
            let mut controller = baton_controller(&cp, &sim, &s.dir.path().join("controller.log"));

            // First run: killed (SIGKILL) at the kill point.
            let mut child = baton_bootstrap(&s, &log);
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let mut last_step = String::from("(none)");
            match point {
                KillPoint::Event(name) => {
                    let wait = async {
                        while let Ok(Some(line)) = lines.next_line().await {
                            let e: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                            if let Some(step) = e["step"].as_str() {
                                last_step = step.to_owned();
                            }
                            if e["event"] == *name || (e["event"] == "step" && e["step"] == *name) {
                                return;
                            }
                        }
                    };
                    tokio::time::timeout(Duration::from_secs(120), wait)
                        .await
                        .unwrap_or_else(|_| panic!("run {i}: event {name} never came"));
                }
                KillPoint::After(d) => {
                    let read = async {
                        while let Ok(Some(line)) = lines.next_line().await {
                            let e: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                            if let Some(step) = e["step"].as_str() {
                                last_step = step.to_owned();
                            }
                        }
                    };
                    let _ = tokio::time::timeout(*d, read).await;
                }
            }
            child.start_kill().unwrap();
            let _ = child.wait().await;
            killed_at.insert(i, format!("{point:?} (in step {last_step})"));

            // Second run: completes, continuing where the first stopped.
            let (events, code) = run_to_end(baton_bootstrap(&s, &log), Duration::from_secs(180)).await;
            assert_eq!(
                code,
                Some(0),
                "run {i} ({point:?}): rerun failed; events:\n{events:#?}\nlog:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            assert_eq!(
                events.last().unwrap()["result"],
                "complete",
                "run {i} ({point:?}): events:\n{events:#?}"
            );
            assert_no_duplicates(&sim, &client, &s, &infra).await;
            controller.kill().await.unwrap();
            // Every run's simulator hands out the same addresses: remove this run's Services
            // so the next run's controller does not route them too.
            let services: Api<Service> = Api::namespaced(client.clone(), &s.namespace);
            services
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
                .unwrap();
        }
        eprintln!("killed at: {killed_at:#?}");
        assert!(killed_at.len() >= 20);
    });
}

#[test]
fn bad_configs_exit_non_zero_naming_the_field_or_cause() {
    lab::run(|| async {
        let infra = "bad";
        let sim = start_sim(infra).await;
        let dir = tempfile::tempdir().unwrap();
        // A real CA file (any certificate parses) and a kubeconfig of an API server that is
        // not there.
        let ca = rcgen::generate_simple_self_signed(vec!["api-int.baton.test".into()]).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            baton_testbed::control_plane::kubeconfig("https://198.51.100.99:6443", &ca.cert.pem(), "t"),
        )
        .unwrap();
        let good = format!(
            r"
cluster: {{name: baton, baseDomain: test, infraId: {infra}}}
bootstrapHost: {{publicAddress: {BOOTSTRAP}}}
cloud: {{apiKey: {API_KEY}, projectID: {project}, region: LT-Siauliai, base-url: {base}, apiRateLimit: 0}}
kubernetes: {{kubeconfig: kubeconfig, clusterCA: ca.crt}}
endpoints:
  - {{name: api, fip: {{reserve: true}}, service: {{namespace: default, name: api}}}}
dns: {{mode: none}}
timeouts: {{bootstrapApi: 2s}}
stateFile: state.json
",
            project = sim.project_id(),
            base = sim.base_url(),
        );
        let cases: [(&str, String, u8, &[&str]); 5] = [
            (
                "missing field",
                good.replace(", infraId: bad", ""),
                2,
                &["cluster.infraId: required"],
            ),
            (
                "bad address",
                good.replace("publicAddress: 198.51.100.10", "publicAddress: 198.51.100.300"),
                2,
                &["bootstrapHost.publicAddress", "198.51.100.300"],
            ),
            (
                "unknown region",
                good.replace("region: LT-Siauliai", "region: XX-Nowhere"),
                2,
                &["cloud.region", "unknown region \"XX-Nowhere\""],
            ),
            (
                "missing API key",
                good.replace(&format!("apiKey: {API_KEY}, "), ""),
                2,
                &["apiKey", "CHERRY_API_KEY"],
            ),
            (
                "unreachable API",
                good.clone(),
                4,
                &[
                    "timed out after 2s",
                    "/readyz",
                    "https://198.51.100.99:6443/",
                    "Connection refused",
                ],
            ),
        ];
        for (what, yaml, want_code, wants) in cases {
            std::fs::write(dir.path().join("bootstrap.yaml"), &yaml).unwrap();
            let _ = std::fs::remove_file(dir.path().join("state.json"));
            let out = Command::new(env!("CARGO_BIN_EXE_baton"))
                .args([
                    "bootstrap",
                    "--output",
                    "plain",
                    "--exit-when-complete",
                    "--config",
                ])
                .arg(dir.path().join("bootstrap.yaml"))
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .output()
                .await
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                out.status.code(),
                Some(i32::from(want_code)),
                "{what}: exit code\nstderr:\n{stderr}\nstdout:\n{stdout}"
            );
            for w in wants {
                assert!(stderr.contains(w), "{what}: want {w:?} in stderr:\n{stderr}");
            }
            let summary: serde_json::Value =
                serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{what}: summary: {e}\n{stdout}"));
            assert_eq!(summary["result"], "failed", "{what}");
            assert_eq!(summary["exitCode"], want_code, "{what}");
            assert!(
                !stdout.contains(API_KEY) && !stderr.contains(API_KEY),
                "{what}: the API key leaked"
            );
        }
        // --check-config accepts the good config (cloud reachable, region known, kubeconfig
        // loads) without touching anything.
        std::fs::write(dir.path().join("bootstrap.yaml"), &good).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["bootstrap", "--check-config", "--output", "plain", "--config"])
            .arg(dir.path().join("bootstrap.yaml"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["result"], "valid");
        // The unreachable-API run reserved the FIP and recorded it; nothing else was reserved.
        assert_eq!(floating_ips(&sim).await.len(), 2);
    });
}

/// A real BIND 9 (Debian `bind9`) on 127.0.0.1:`port` in the lab, primary for `baton.test`,
/// accepting updates signed with the key in `<dir>/key.conf`. Killed on drop.
struct Named {
    child: std::process::Child,
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_named(dir: &Path, port: u16) -> Named {
    let key = std::process::Command::new("tsig-keygen")
        .args(["-a", "hmac-sha256", "baton-bootstrap"])
        .output()
        .expect("tsig-keygen (Debian bind9-utils)");
    std::fs::write(dir.join("key.conf"), &key.stdout).unwrap();
    std::fs::write(
        dir.join("baton.test.zone"),
        "$TTL 1\n@ IN SOA ns1.baton.test. hostmaster.baton.test. 1 3600 600 86400 1\n\
         @ IN NS ns1.baton.test.\nns1 IN A 127.0.0.1\n",
    )
    .unwrap();
    let d = dir.display();
    std::fs::write(
        dir.join("named.conf"),
        format!(
            r#"options {{ directory "{d}"; pid-file "{d}/named.pid"; session-keyfile "{d}/session.key";
  managed-keys-directory "{d}"; listen-on port {port} {{ 127.0.0.1; }}; listen-on-v6 {{ none; }};
  recursion no; dnssec-validation no; notify no; }};
controls {{ }};
include "{d}/key.conf";
zone "baton.test" {{ type primary; file "{d}/baton.test.zone"; allow-update {{ key "baton-bootstrap"; }}; }};
"#
        ),
    )
    .unwrap();
    // named drops to the `bind` user when started as root.
    std::process::Command::new("chown")
        .args(["-R", "bind:bind"])
        .arg(dir)
        .status()
        .unwrap();
    let child = std::process::Command::new("/usr/sbin/named")
        .args(["-g", "-4", "-n", "1", "-u", "bind", "-c"])
        .arg(dir.join("named.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("named (Debian bind9)");
    let named = Named { child };
    let mut client = dns_client(SocketAddr::from(([127, 0, 0, 1], port)));
    for _ in 0..100 {
        if let Ok(r) = client
            .query(
                Name::from_ascii("baton.test.").unwrap(),
                DNSClass::IN,
                RecordType::SOA,
            )
            .await
            && !r.answers.is_empty()
        {
            return named;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("named did not start serving baton.test on port {port}");
}

#[test]
fn in_rfc2136_mode_the_same_changes_are_pushed_to_the_sites_dns_server() {
    lab::run(|| async {
        let _heavy = HEAVY.lock().await;
        let infra = "rfc";
        let cp = start_control_plane().await;
        let sim = start_sim(infra).await;
        let named_dir = tempfile::tempdir().unwrap();
        let port = 5300;
        let _named = start_named(named_dir.path(), port).await;
        let server = SocketAddr::from(([127, 0, 0, 1], port));
        let s = scenario_with_dns(
            &cp,
            &sim,
            infra,
            "rfc-api",
            server,
            &format!(
                "{{mode: rfc2136, server: \"{server}\", tsigKeyFile: {}, ttl: 1}}",
                named_dir.path().join("key.conf").display()
            ),
        );
        let log = s.dir.path().join("baton.log");
        cp.register_nodes(CP.len()).await.unwrap();
        let _controller = baton_controller(&cp, &sim, &s.dir.path().join("controller.log"));
        let watching = CancellationToken::new();
        let watcher = {
            let watching = watching.clone();
            tokio::spawn(async move {
                let mut client = dns_client(server);
                let mut seen: Vec<BTreeSet<IpAddr>> = Vec::new();
                while !watching.is_cancelled() {
                    if let Some(a) = resolve(&mut client, "api.baton.test.").await
                        && !a.is_empty()
                        && seen.last() != Some(&a)
                    {
                        seen.push(a);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                seen
            })
        };
        let (events, code) = run_to_end(baton_bootstrap(&s, &log), Duration::from_secs(240)).await;
        watching.cancel();
        let seen = watcher.await.unwrap();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(code, Some(0), "events:\n{events:#?}\nstderr:\n{stderr}");
        eprintln!("BIND answered for api.baton.test, in order: {seen:?}");
        let (b, f) = (ip(BOOTSTRAP), ip(API_FIP));
        assert_eq!(seen.first(), Some(&BTreeSet::from([b])), "{seen:?}");
        assert_overlap_then_fip_alone(&events);
        assert_eq!(seen.last(), Some(&BTreeSet::from([f])), "{seen:?}");
        // The site's server keeps the final records after baton exits.
        let mut client = dns_client(server);
        assert_eq!(
            resolve(&mut client, "api.baton.test.").await,
            Some(BTreeSet::from([f]))
        );
        let summary = events.last().unwrap();
        assert_eq!(summary["dns"]["mode"], "rfc2136");
    });
}
