//! The acceptance check of Service FIPs on Hetzner Cloud at scale: 1,000 Services of
//! `loadBalancerClass: baton.dev/floating-ip` on the simulator with Hetzner's own rate limit
//! (a 3,600-request bucket refilled at one a second): every Service gets exactly one Floating IP,
//! each routed to a healthy node, no request is answered 429, and deleting the Services releases
//! every FIP baton created and no other.
//!
//! What ships runs: two `baton controller` processes (the binary cargo built for this test) with
//! leader election, against a real kube-apiserver in a lab and the simulator speaking Hetzner's
//! API (default bucket, 500 ms assign actions, 50 ms latency on every request), FIPs released at
//! once (`BATON_FIP_RELEASE_GRACE_PERIOD=0`).
//!
//! ```text
//!  test ── 1,000 Services ──► kube-apiserver ◄── watch ── baton controller ×2 (one leads)
//!   │                                                       │ create, assign, poll, delete
//!   │  kube-proxy stand-ins  <node InternalIP>:10256 ◄ probe ┤
//!   │                                                       ▼
//!   └───────────── peek (no budget, not logged) ───── simulator (Hetzner dialect)
//! ```
//!
//! The Nodes are kubelet-less, as hcloud-cloud-controller-manager leaves them: Ready, provider ID
//! `hcloud://<server id>`, the server's private address as InternalIP. kube-proxy's health check
//! is a stand-in served by the test: in a lab without lab nodes every lab address is local (on
//! `lo`), so the test binds `<InternalIP>:10256` itself and the routing loop probes exactly the
//! address and port it probes in a cluster, over the same plain HTTP. Four stand-ins answer
//! `GET /healthz` with 200; a fifth Node's answers 503 (kube-proxy's answer when it is not
//! serving), so its server must get no FIP. Running real kube-proxies would need lab nodes with
//! kubelets (tests/hetzner_services.rs does, for one Service) and tells nothing more about 1,000
//! FIPs.
//!
//! Two FIPs exist before baton starts and are not its own: an operator's (other labels, assigned
//! to a server no Node has) and another cluster's (baton's usage label, another cluster's uid,
//! unassigned). Both must be exactly as they were at the end.
//!
//! Last line: `hetzner_scale services=<n> healthy_nodes=<n> all_ingress_s=<s> all_assigned_s=<s>
//! release_s=<s> requests=<n> creates=<n> assigns=<n> action_polls=<n> list_pages=<n>
//! deletes=<n> other=<n> got_429=<n> duplicate_fips=<n>` (every request of the whole run, the
//! replicas' start included).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines, clippy::cast_precision_loss)] // a scenario reads best as one story

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_cloud::model::{IpAddress, ServerId, Tags};
use baton_cloud::tags::{CLUSTER_KEY, USAGE_KEY, USAGE_VALUE};
use baton_sim::{Faults, HetznerSettings, Latency, Sim, SimHandle, TopoFip, TopoServer, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::{ingress, lb_service, namespace};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;
use tokio::time::Instant;

/// The acceptance number.
const COUNT: usize = 1_000;
const NS: &str = "scale";
const CLASS: &str = "baton.dev/floating-ip";
/// Where baton publishes a Service FIP's address on Hetzner (besides the ingress).
const ANNOTATION: &str = "baton.dev/floating-ips";
/// Nodes whose kube-proxy answers 200; one more answers 503.
const HEALTHY: usize = 4;
/// kube-proxy's health port.
const KUBE_PROXY_HEALTH_PORT: u16 = 10256;
/// Another cluster's `kube-system` uid.
const OTHER_CLUSTER: &str = "5a0c4b8e-2f61-4d2b-9c1e-7d3a9b6f0e42";
/// The operator's FIP's server: one no Node has (the default topology's `bootstrap`).
const OPERATOR_SERVER: u64 = 600_100;

/// Node `i`'s server id, name and addresses (public, private).
fn node(i: usize) -> (u64, String, Ipv4Addr, Ipv4Addr) {
    let host = u8::try_from(100 + i).unwrap();
    (
        700_000 + u64::try_from(i).unwrap(),
        format!("node-{i}"),
        Ipv4Addr::new(198, 51, 100, host),
        Ipv4Addr::new(192, 0, 2, host),
    )
}

/// The simulator's world: the lab's servers plus one per Node (the last one's kube-proxy answers
/// 503), room for the FIPs, and the two FIPs that are not baton's.
fn topology() -> Topology {
    let mut topology = Topology {
        // Room for thousands of FIPs; nothing connects to them (no routes, no splice).
        fip_pool: "198.18.0.0/16".into(),
        ..Topology::default()
    };
    for i in 0..=HEALTHY {
        let (id, name, public, private) = node(i);
        topology.servers.push(TopoServer {
            id,
            hostname: name,
            primary_ip: public,
            private_ip: Some(private),
            ..TopoServer::default()
        });
    }
    topology.floating_ips = vec![
        TopoFip {
            region: "LT-Siauliai".into(), // fsn1 in Hetzner's terms
            tags: Tags::from([
                ("owner".to_owned(), "ops".to_owned()),
                ("purpose".to_owned(), "bastion".to_owned()),
            ]),
            targeted_to: Some(OPERATOR_SERVER),
            ..TopoFip::default()
        },
        TopoFip {
            region: "LT-Siauliai".into(),
            tags: Tags::from([
                (USAGE_KEY.to_owned(), USAGE_VALUE.to_owned()),
                (CLUSTER_KEY.to_owned(), OTHER_CLUSTER.to_owned()),
                ("service".to_owned(), "ab".repeat(31)),
            ]),
            targeted_to: None,
            ..TopoFip::default()
        },
    ];
    topology
}

/// kube-proxy's health check, as the test stands in for it on `addr`: `GET /healthz` answers 200
/// (or 503 when not `healthy`), with a body shaped like kube-proxy's; anything else 404. Counts
/// the probes.
async fn kube_proxy_stand_in(addr: SocketAddr, healthy: bool, probes: Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("binding the kube-proxy stand-in on {addr}: {e}"));
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                continue;
            };
            let probes = Arc::clone(&probes);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head);
                let (status, body) = if !line.starts_with("GET /healthz ") {
                    ("404 Not Found", "404 page not found\n".to_owned())
                } else if healthy {
                    probes.fetch_add(1, Ordering::Relaxed);
                    (
                        "200 OK",
                        format!(
                            r#"{{"lastUpdated": "{0}","currentTime": "{0}"}}"#,
                            common::unix_ms()
                        ),
                    )
                } else {
                    probes.fetch_add(1, Ordering::Relaxed);
                    (
                        "503 Service Unavailable",
                        r#"{"lastUpdated": "","currentTime": ""}"#.to_owned(),
                    )
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
}

/// A Node as hcloud-cloud-controller-manager and a Ready kubelet leave it, for server `id`.
async fn create_node(api: &Api<Node>, name: &str, id: u64, public: Ipv4Addr, private: Ipv4Addr) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"providerID": format!("hcloud://{id}")},
    }))
    .unwrap();
    api.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "hetzner_scale",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
        "addresses": [
            {"type": "InternalIP", "address": private.to_string()},
            {"type": "ExternalIP", "address": public.to_string()},
            {"type": "Hostname", "address": name},
        ],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// A Service of baton's class, without NodePorts (kube-apiserver allocates them from one bitmap,
/// which slows a thousand concurrent creates for reasons unrelated to baton).
fn fip_service(name: &str) -> Service {
    let mut svc = lb_service(NS, name, &[]);
    if let Some(spec) = svc.spec.as_mut() {
        spec.load_balancer_class = Some(CLASS.to_owned());
        spec.allocate_load_balancer_node_ports = Some(false);
    }
    svc
}

/// The `baton controller` replicas (killed when dropped, e.g. on a failed assertion).
struct Replicas {
    procs: Vec<Proc>,
}

impl Replicas {
    fn start(cp: &ControlPlane, sim: &SimHandle) -> Self {
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let endpoint = format!("{}v1", sim.base_url());
        let env = [
            ("BATON_CLOUD", "hetzner"),
            ("HCLOUD_TOKEN", sim.api_key()),
            ("HCLOUD_ENDPOINT", endpoint.as_str()),
            ("CHERRY_REGION_NAME", "fsn1"),
            ("BATON_FIP_RELEASE_GRACE_PERIOD", "0"),
            ("BATON_LOG", "info"),
        ];
        let procs = (0..2)
            .map(|i| {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
                cmd.arg("controller")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--identity", &format!("scale-{i}")])
                    .args(["--admin-listen", &format!("127.0.0.1:{}", 19_590 + i)])
                    .env_clear()
                    .envs(env);
                Proc::spawn(&format!("controller-{i}"), cp.dir(), &mut cmd).unwrap()
            })
            .collect();
        Self { procs }
    }

    /// The last lines of both replicas' logs, for a failure message.
    fn tails(&self) -> String {
        self.procs
            .iter()
            .enumerate()
            .map(|(i, p)| format!("--- controller-{i} ---\n{}", p.log_tail(40)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Each replica's warnings and errors: how many, and the distinct beginnings, for the run's
    /// output.
    fn warnings(&self, dir: &std::path::Path) -> String {
        (0..self.procs.len())
            .map(|i| {
                let text =
                    std::fs::read_to_string(dir.join(format!("controller-{i}.log"))).unwrap_or_default();
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                    .collect();
                // After the level, up to 160 characters.
                let messages: BTreeSet<String> = lines
                    .iter()
                    .map(|l| l.split_once("Z ").map_or(*l, |(_, m)| m).trim())
                    .map(|m| m.chars().take(160).collect())
                    .collect();
                format!("controller-{i}: {} warnings/errors {messages:?}", lines.len())
            })
            .collect::<Vec<_>>()
            .join("\n  ")
    }

    async fn stop(self) {
        for p in self.procs {
            p.terminate(Duration::from_secs(5)).await;
        }
    }
}

/// What the test's watch of the Services saw: each Service's ingress and annotation, and when
/// every one of `COUNT` first had an ingress.
#[derive(Default)]
struct Seen {
    published: BTreeMap<String, (Option<String>, Option<String>)>,
    all_ingress_at: Option<Instant>,
}

impl Seen {
    fn with_ingress(&self) -> usize {
        self.published.values().filter(|(i, _)| i.is_some()).count()
    }
}

/// Watches the namespace's Services into `seen`.
fn watch_services(api: Api<Service>, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = stream.next().await {
            let Ok(svc) = event else { continue };
            let annotation = svc.annotations().get(ANNOTATION).cloned();
            let mut s = seen.lock().unwrap();
            s.published.insert(svc.name_any(), (ingress(&svc), annotation));
            if s.all_ingress_at.is_none() && s.with_ingress() == COUNT {
                s.all_ingress_at = Some(Instant::now());
            }
        }
    })
}

/// This cluster's Service FIPs as the simulator holds them now.
fn cluster_fips(sim: &SimHandle, cluster: &str) -> Vec<IpAddress> {
    sim.peek_ips()
        .into_iter()
        .filter(|ip| {
            ip.tags.get(USAGE_KEY).map(String::as_str) == Some(USAGE_VALUE)
                && ip.tags.get(CLUSTER_KEY).map(String::as_str) == Some(cluster)
        })
        .collect()
}

/// What a FIP is, for comparing before and after.
fn fingerprint(ip: &IpAddress) -> (String, IpAddr, Tags, Option<ServerId>) {
    (ip.id.to_string(), ip.address, ip.tags.clone(), ip.target())
}

#[test]
fn a_thousand_floating_ip_services_within_hetzners_rate_limit() {
    lab::run(|| async {
        let started = Instant::now();
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client(0).unwrap();
        namespace(&client, NS).await;
        let cluster = Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
            .unwrap()
            .uid()
            .unwrap();
        let settings = HetznerSettings {
            action_ms: Latency::Fixed(500),
            ..HetznerSettings::default()
        };
        assert_eq!(
            (settings.bucket, settings.refill_per_s),
            (3_600, 1.0),
            "Hetzner's default bucket"
        );
        let sim = Sim::builder()
            .cloud(baton_cloud::CloudKind::Hetzner)
            .hetzner(settings)
            .topology(topology())
            .faults(Faults {
                latency_ms: Latency::Fixed(50),
                ..Faults::none()
            })
            .log_capacity(100_000)
            .bind("127.0.0.1:0".parse().unwrap())
            .await
            .expect("simulator");
        let others: Vec<IpAddress> = sim.peek_ips();
        assert_eq!(others.len(), 2, "the operator's FIP and the other cluster's");

        // The Nodes and their kube-proxy stand-ins.
        let nodes: Api<Node> = Api::all(client.clone());
        let mut health_probes = Vec::new();
        for i in 0..=HEALTHY {
            let (id, name, public, private) = node(i);
            let count = Arc::new(AtomicU64::new(0));
            kube_proxy_stand_in(
                SocketAddr::new(private.into(), KUBE_PROXY_HEALTH_PORT),
                i < HEALTHY,
                Arc::clone(&count),
            )
            .await;
            health_probes.push(count);
            create_node(&nodes, &name, id, public, private).await;
        }
        let healthy: BTreeSet<ServerId> = (0..HEALTHY).map(|i| ServerId(node(i).0)).collect();

        let replicas = Replicas::start(&cp, &sim);
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        let leader = common::eventually(Duration::from_secs(30), "a leader", || async {
            leases
                .get_opt("baton-controller")
                .await
                .ok()??
                .spec?
                .holder_identity
        })
        .await;
        eprintln!(
            "{:>6.1}s: the lab is up, {leader} leads",
            started.elapsed().as_secs_f64()
        );

        // 1,000 Services at once (32 creates in flight).
        let api: Api<Service> = Api::namespaced(client.clone(), NS);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watch = watch_services(api.clone(), Arc::clone(&seen));
        let names: Vec<String> = (0..COUNT).map(|i| format!("svc-{i:04}")).collect();
        let t0 = Instant::now();
        futures::stream::iter(names.iter().cloned())
            .for_each_concurrent(32, |name| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &fip_service(&name))
                        .await
                        .unwrap();
                }
            })
            .await;
        eprintln!("  created {COUNT} Services in {:.1}s", t0.elapsed().as_secs_f64());

        // Until every Service has an ingress and every FIP is routed to a healthy node. Every FIP
        // that appears is baton's (the test creates none).
        let mut baton_fips: BTreeSet<String> = BTreeSet::new();
        let mut all_assigned_at = None;
        let mut last_report = Instant::now();
        let deadline = t0 + Duration::from_secs(300);
        let all_ingress_at = loop {
            let fips = cluster_fips(&sim, &cluster);
            baton_fips.extend(fips.iter().map(|ip| ip.id.to_string()));
            let assigned = fips
                .iter()
                .filter(|ip| ip.target().is_some_and(|s| healthy.contains(&s)))
                .count();
            if all_assigned_at.is_none() && fips.len() == COUNT && assigned == COUNT {
                all_assigned_at = Some(Instant::now());
            }
            let (with_ingress, all_ingress_at) = {
                let s = seen.lock().unwrap();
                (s.with_ingress(), s.all_ingress_at)
            };
            if let (Some(at), Some(_)) = (all_ingress_at, all_assigned_at) {
                break at;
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                let stats = sim.stats();
                eprintln!(
                    "  {:>6.1}s: {with_ingress} with ingress, {} FIPs, {assigned} assigned; {} requests, {} answered 429",
                    t0.elapsed().as_secs_f64(),
                    fips.len(),
                    stats.requests,
                    stats.with_status(429)
                );
            }
            assert!(
                Instant::now() < deadline,
                "not within {:?}: {with_ingress} Services with an ingress, {} FIPs, {assigned} routed to a healthy node\n{}",
                deadline - t0,
                fips.len(),
                replicas.tails()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let all_assigned_at = all_assigned_at.unwrap();
        let all_ingress_s = all_ingress_at.duration_since(t0).as_secs_f64();
        let all_assigned_s = all_assigned_at.duration_since(t0).as_secs_f64();
        watch.abort();
        eprintln!(
            "  every Service has an ingress after {all_ingress_s:.1}s, every FIP is routed after {all_assigned_s:.1}s"
        );

        // Each Service: one FIP of this cluster, its own, published in the ingress and the
        // annotation; each FIP homed in fsn1 and routed to a healthy node.
        let fips = cluster_fips(&sim, &cluster);
        assert_eq!(fips.len(), COUNT, "exactly one FIP per Service");
        let by_address: BTreeMap<IpAddr, &IpAddress> = fips.iter().map(|ip| (ip.address, ip)).collect();
        let services = api.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(services.len(), COUNT);
        let mut addresses = BTreeSet::new();
        for svc in &services {
            let name = svc.name_any();
            let address: IpAddr = ingress(svc)
                .unwrap_or_else(|| panic!("{name}: no ingress"))
                .parse()
                .unwrap();
            assert_eq!(
                svc.annotations().get(ANNOTATION).map(String::as_str),
                Some(address.to_string().as_str()),
                "{name}: the annotation names the ingress"
            );
            assert!(
                addresses.insert(address),
                "{name}: {address} is another Service's too"
            );
            let ip = by_address
                .get(&address)
                .unwrap_or_else(|| panic!("{name}: {address} is no FIP of this cluster"));
            assert!(
                ip.tags.contains_key("service"),
                "{name}: {address} names no Service"
            );
            assert_eq!(ip.region.as_ref().map(|r| r.slug.as_str()), Some("fsn1"));
        }
        let mut per_node: BTreeMap<u64, usize> = BTreeMap::new();
        for ip in &fips {
            let at = ip.target().expect("routed");
            assert!(
                healthy.contains(&at),
                "{} is on {at:?}, no healthy node",
                ip.address
            );
            *per_node.entry(at.0).or_default() += 1;
        }
        let probed: Vec<u64> = health_probes.iter().map(|p| p.load(Ordering::Relaxed)).collect();
        assert!(
            probed.iter().all(|&n| n > 0),
            "every stand-in was probed: {probed:?}"
        );
        let routed_stats = sim.stats();
        eprintln!("  FIPs per server: {per_node:?}; probes per node: {probed:?}");

        // Deleting every Service releases every FIP baton created.
        let t1 = Instant::now();
        futures::stream::iter(names.iter().cloned())
            .for_each_concurrent(32, |name| {
                let api = api.clone();
                async move {
                    api.delete(&name, &DeleteParams::default()).await.unwrap();
                }
            })
            .await;
        let deadline = t1 + Duration::from_secs(300);
        let mut last_report = Instant::now();
        loop {
            let left = cluster_fips(&sim, &cluster).len();
            if left == 0 && api.list(&ListParams::default()).await.unwrap().items.is_empty() {
                break;
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                eprintln!(
                    "  {:>6.1}s: {left} FIPs left; {} requests",
                    t1.elapsed().as_secs_f64(),
                    sim.stats().requests
                );
            }
            assert!(
                Instant::now() < deadline,
                "not released within {:?}: {left} FIPs left\n{}",
                deadline - t1,
                replicas.tails()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let release_s = t1.elapsed().as_secs_f64();
        // A moment more: nothing else is deleted or moved afterwards.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let stats = sim.stats();
        let tails = replicas.tails();
        eprintln!("  {}", replicas.warnings(cp.dir()));
        replicas.stop().await;
        // HETZNER_SCALE_KEEP_LOGS=<dir>: the replicas' logs are copied there (the lab's directory
        // goes with the control plane).
        if let Some(keep) = std::env::var_os("HETZNER_SCALE_KEEP_LOGS") {
            let keep = std::path::Path::new(&keep);
            std::fs::create_dir_all(keep).unwrap();
            for i in 0..2 {
                let name = format!("controller-{i}.log");
                std::fs::copy(cp.dir().join(&name), keep.join(&name)).unwrap();
            }
            eprintln!("  the replicas' logs are in {}", keep.display());
        }

        let now: BTreeMap<String, IpAddress> = sim
            .peek_ips()
            .into_iter()
            .map(|ip| (ip.id.to_string(), ip))
            .collect();
        let gone: Vec<&String> = baton_fips.iter().filter(|id| now.contains_key(*id)).collect();
        assert!(gone.is_empty(), "FIPs baton created are left: {gone:?}");
        let before: Vec<_> = others.iter().map(fingerprint).collect();
        let after: Vec<_> = now.values().map(fingerprint).collect();
        assert_eq!(after, before, "the FIPs that are not baton's, as they were");

        let route = |r: &str| stats.route(r);
        let creates = route("POST /v1/floating_ips");
        let assigns = route("POST /v1/floating_ips/{id}/actions/assign");
        let polls = route("GET /v1/actions");
        let lists = route("GET /v1/floating_ips");
        let deletes = route("DELETE /v1/floating_ips/{id}");
        let other = stats.requests - creates - assigns - polls - lists - deletes;
        eprintln!("  answers per status: {:?}", stats.status);
        eprintln!(
            "  requests per route: {:?}",
            stats
                .routes
                .iter()
                .map(|(k, v)| (k, v.count))
                .collect::<BTreeMap<_, _>>()
        );
        eprintln!(
            "  until every FIP was routed: {} requests; the release: {}",
            routed_stats.requests,
            stats.requests - routed_stats.requests
        );
        println!(
            "hetzner_scale services={COUNT} healthy_nodes={HEALTHY} all_ingress_s={all_ingress_s:.1} all_assigned_s={all_assigned_s:.1} release_s={release_s:.1} requests={} creates={creates} assigns={assigns} action_polls={polls} list_pages={lists} deletes={deletes} other={other} got_429={} duplicate_fips={}",
            stats.requests,
            stats.with_status(429),
            stats.duplicate_fips,
        );
        assert_eq!(
            (stats.with_status(429), stats.rate_limited),
            (0, 0),
            "no request answered 429\n{tails}"
        );
        assert_eq!(stats.duplicate_fips, 0, "no Service ever had two FIPs\n{tails}");
        assert_eq!(
            (stats.fips_created, stats.fips_deleted),
            (COUNT as u64, COUNT as u64),
            "one FIP created per Service, each deleted\n{tails}"
        );
        assert_eq!(baton_fips.len(), COUNT, "the FIPs seen are the FIPs created");
        assert_eq!(
            (assigns, deletes),
            (COUNT as u64, COUNT as u64),
            "one assign and one delete per Service: none sent twice\n{tails}"
        );
    });
}
