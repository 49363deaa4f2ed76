//! The Service FIP and scaling benchmarks (run by `scripts/bench/services` and
//! `scripts/bench/scale`, ignored by `cargo test`). What ships runs: `BENCH_REPLICAS` (default 2)
//! `baton controller` processes (`BATON_BIN`, default the binary cargo built for this test) with
//! leader election, the endpoint loop, the BGP controller in MetalLB mode (MetalLB's CRDs are
//! installed, so MetalLB objects are written), against a real kube-apiserver and the Cherry
//! Servers simulator (API latency `BENCH_LATENCY_MS`, default 50 ms, or a distribution such as
//! `300,2000` for p50 300 ms / p99 2 s; per-client limit `BENCH_RATE` requests/s or `off`, which is
//! also baton's own limit).
//!
//! `services` mode: `BENCH_COUNT` Services are created at once; the time until all have an
//! ingress, the cloud and Kubernetes writes per Service; then every Service is deleted and the
//! time until every FIP is released is measured (baton releases a FIP as soon as its Service is
//! gone: no release grace period exists on this branch, so every release is due when its Service
//! is deleted). Last line:
//! `services count=<n> rate=<r|off> latency_ms=<spec> replicas=<n> all_ingress_s=<s> bound_s=<s> cloud_creates=<n> duplicate_fips=<n> list_calls=<n> cloud_writes=<n> cloud_requests=<n> got_429=<n> kube_writes_per_service=<x> release_s=<s> leaked=<n>`
//! `cloud_creates` counts the FIPs the simulator created while the Services were created
//! (whatever became of the answers), `duplicate_fips` the FIPs one Service had too many at some
//! moment, summed (the simulator's count: over the whole run, deletions included), and
//! `list_calls` the IP list calls while the Services were created.
//!
//! `scale` mode adds `BENCH_NODES` Node objects (kubelet-less, Ready, each with a server of the
//! simulator), then at that size: `BENCH_PROBES` more Services one at a time (create-to-ingress
//! p50/p99), the controllers' RSS and CPU seconds, the cloud calls of all replicas while idle over
//! `BENCH_IDLE_S` seconds (per hour), and the watch events handled. Last lines:
//! `scale services=<n> nodes=<n> all_ingress_s=<s> create_s=<s> burst_cpu_s=<s> cloud_creates=<n> duplicate_fips=<n> list_calls=<n> p50_create_to_ingress_ms=<n> p99_create_to_ingress_ms=<n> rss_mib=<n> cpu_s=<s> idle_cloud_calls_per_hour=<n> idle_cpu_pct=<n> watch_events=<n>`
//! (`burst_cpu_s`: both replicas' CPU seconds from the first create to the last ingress;
//! `create_s`: from the first create to the API server's answer to the last;
//! `cpu_s`: since they started, at the end).
//!
//! `BENCH_REPLICAS=0`: no controller at all; the same creates against the API server alone, to
//! tell its share of `all_ingress_s` from baton's. Last line:
//! `baseline services=<n> nodes=<n> create_s=<s>`
//! `footprint static_binary_mib=<n|unknown> rss_mib=<n> services=<n> nodes=<n>`
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark harness: a panic is the report
#![allow(clippy::too_many_lines, clippy::cast_precision_loss)] // scenario code reads top to bottom

mod common;
mod metallb;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use baton_sim::{Faults, Latency, SimHandle, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::{ingress, lb_service, namespace};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::process::Command;

const NS: &str = "bench";

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run's parameters.
#[derive(Clone)]
struct Params {
    count: usize,
    nodes: usize,
    rate: Option<f64>,
    latency: Latency,
    replicas: usize,
    probes: usize,
    idle_s: u64,
    bin: PathBuf,
}

impl Params {
    fn from_env() -> Self {
        let rate = match std::env::var("BENCH_RATE")
            .unwrap_or_else(|_| "off".into())
            .as_str()
        {
            "off" | "0" => None,
            r => Some(r.parse().expect("BENCH_RATE: a number or off")),
        };
        Self {
            count: env_or("BENCH_COUNT", 100),
            nodes: env_or("BENCH_NODES", 0),
            rate,
            latency: std::env::var("BENCH_LATENCY_MS").map_or(Latency::Fixed(50), |v| {
                v.parse().expect("BENCH_LATENCY_MS: N, P50,P99 or pNN:MS,..")
            }),
            replicas: env_or("BENCH_REPLICAS", 2),
            probes: env_or("BENCH_PROBES", 50),
            idle_s: env_or("BENCH_IDLE_S", 180),
            bin: std::env::var_os("BATON_BIN")
                .map_or_else(|| env!("CARGO_BIN_EXE_baton").into(), PathBuf::from),
        }
    }

    fn rate_shown(&self) -> String {
        self.rate.map_or_else(|| "off".to_owned(), |r| r.to_string())
    }
}

/// The simulator's servers: the default topology's, plus one worker per benchmark Node.
fn topology(nodes: usize) -> Topology {
    let mut topology = Topology {
        // Room for 10,000+ FIPs; Service FIPs are never targeted, so their addresses need not be
        // local to the lab.
        fip_pool: "198.18.0.0/16".into(),
        ..Topology::default()
    };
    for i in 0..nodes {
        let host = u8::try_from(100 + i).expect("at most 155 benchmark nodes");
        topology.servers.push(baton_sim::TopoServer {
            id: 700_000 + u64::try_from(i).unwrap(),
            hostname: format!("bench-node-{i:03}"),
            primary_ip: Ipv4Addr::new(198, 51, 100, host),
            private_ip: Some(Ipv4Addr::new(192, 0, 2, host)),
            ..baton_sim::TopoServer::default()
        });
    }
    topology
}

/// A Node as an initialised, Ready kubelet would leave it, for server `id`.
async fn create_node(api: &Api<Node>, name: &str, id: u64) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"providerID": format!("cherryservers://{id}")},
    }))
    .unwrap();
    api.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "benchmark",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// A LoadBalancer Service without NodePorts (kube-apiserver allocates NodePorts from one bitmap,
/// which slows thousands of concurrent creates for reasons unrelated to baton; BGP load
/// balancers do not need them).
fn bench_service(name: &str) -> Service {
    let mut svc = lb_service(NS, name, &[]);
    if let Some(spec) = svc.spec.as_mut() {
        spec.allocate_load_balancer_node_ports = Some(false);
    }
    svc
}

/// The `baton controller` replicas.
struct Replicas {
    procs: Vec<Proc>,
}

impl Replicas {
    fn start(cp: &ControlPlane, sim: &SimHandle, params: &Params) -> Self {
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let limit = params.rate.map_or_else(|| "0".to_owned(), |r| r.to_string());
        // BENCH_LOG: the replicas' log filter (default warn), to look into a run; BENCH_KEEP_LOGS
        // (a directory) keeps their logs.
        let log_level = std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".to_owned());
        let env = common::env_for(
            sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                (
                    "CHERRY_LOAD_BALANCER",
                    "metallb:///metallb-system/?bgp-peer-mode=native",
                ),
                ("BATON_API_RATE_LIMIT", &limit),
                ("BATON_LOG", &log_level),
            ],
        );
        let procs = (0..params.replicas)
            .map(|i| {
                let mut cmd = Command::new(&params.bin);
                cmd.arg("controller")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--identity", &format!("bench-{i}")])
                    .args(["--admin-listen", &format!("127.0.0.1:{}", 19_590 + i)])
                    .env_clear()
                    .envs(&env);
                Proc::spawn(&format!("controller-{i}"), cp.dir(), &mut cmd).unwrap()
            })
            .collect();
        Self { procs }
    }

    /// Waits until one replica holds the Lease; returns its index.
    async fn leader(&self, client: &kube::Client) -> usize {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        common::eventually(Duration::from_secs(30), "a leader", || async {
            let lease = leases.get_opt("baton-controller").await.ok()??;
            let holder = lease.spec?.holder_identity?;
            holder.strip_prefix("bench-")?.parse().ok()
        })
        .await
    }

    /// `/proc/<pid>/<file>` of replica `i`.
    fn proc_file(&self, i: usize, file: &str) -> String {
        let pid = self.procs[i].pid().expect("replica running");
        std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap()
    }

    /// Resident set size (MiB) and CPU seconds (user + system) of replica `i`.
    fn usage(&self, i: usize) -> (f64, f64) {
        let status = self.proc_file(i, "status");
        let rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        let stat = self.proc_file(i, "stat");
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5), in clock ticks (100 per second here).
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        (rss_kib / 1024.0, ticks / 100.0)
    }

    /// Where replica `i`'s resident memory is (anonymous, file-backed: the binary's touched
    /// pages), on stderr beside the summary line.
    fn explain_rss(&self, i: usize) {
        let status = self.proc_file(i, "status");
        let parts: Vec<&str> = status
            .lines()
            .filter(|l| {
                ["VmHWM:", "RssAnon:", "RssFile:", "Threads:"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .map(|l| l.split_once(':').map_or(l, |(_, v)| v).trim())
            .collect();
        eprintln!(
            "rss of replica {i}: hwm, anon, file, threads = {}",
            parts.join(", ")
        );
    }

    /// A metric's value summed over its series on replica `i`'s admin port.
    async fn metric(&self, i: usize, name: &str) -> f64 {
        let url = format!("http://127.0.0.1:{}/metrics", 19_590 + i);
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        common::metric_sum(&text, name).unwrap_or(0.0)
    }

    async fn stop(self) {
        for p in self.procs {
            p.terminate(Duration::from_secs(5)).await;
        }
    }
}

/// kube-apiserver's count of mutating requests on Services and Events (both replicas and the
/// harness; the harness's own creates and deletes are subtracted by the caller).
async fn kube_writes(client: &kube::Client) -> f64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            ["POST", "PATCH", "PUT", "DELETE", "APPLY"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter(|l| l.contains("resource=\"services\"") || l.contains("resource=\"events\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Creates `names` at once (32 in flight) and waits until each has an ingress; returns the
/// seconds from the first create to the last ingress, and to the last create's answer.
async fn create_all(api: &Api<Service>, names: &[String], timeout: Duration) -> (f64, f64) {
    let want: BTreeSet<String> = names.iter().cloned().collect();
    let progress = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let watch_api = api.clone();
    let seen = Arc::clone(&progress);
    let watch = tokio::spawn(async move {
        let mut with_ingress = BTreeSet::new();
        let mut stream = std::pin::pin!(
            watcher(watch_api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(event) = stream.next().await {
            let Ok(svc) = event else { continue };
            if ingress(&svc).is_some() && want.contains(&svc.name_any()) {
                with_ingress.insert(svc.name_any());
                seen.store(with_ingress.len(), Ordering::Relaxed);
                if with_ingress.len() == want.len() {
                    let _ = done_tx.send(tokio::time::Instant::now());
                    return;
                }
            }
        }
    });
    let started = tokio::time::Instant::now();
    let reporter = {
        let progress = Arc::clone(&progress);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                eprintln!(
                    "  {:>6.1}s: {} with ingress",
                    started.elapsed().as_secs_f64(),
                    progress.load(Ordering::Relaxed)
                );
            }
        })
    };
    create_only(api, names).await;
    let create_s = started.elapsed().as_secs_f64();
    eprintln!("  created {} Services in {create_s:.1}s", names.len());
    let finished = tokio::time::timeout(timeout, done_rx).await;
    reporter.abort();
    watch.abort();
    let finished = finished
        .unwrap_or_else(|_| {
            panic!(
                "not all Services got an ingress in {timeout:?}: {} did",
                progress.load(Ordering::Relaxed)
            )
        })
        .unwrap();
    (finished.duration_since(started).as_secs_f64(), create_s)
}

/// Creates `names`, 32 in flight, as [`create_all`] does, without waiting for anything else.
async fn create_only(api: &Api<Service>, names: &[String]) {
    futures::stream::iter(names.iter().cloned())
        .for_each_concurrent(32, |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &bench_service(&name))
                    .await
                    .unwrap();
            }
        })
        .await;
}

/// Deletes every Service of the namespace and waits until the simulator holds no Service FIP;
/// returns (seconds, FIPs left).
/// Copies the replicas' logs (`controller-*.log`) to `to`.
fn keep_logs(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("controller-") {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
    eprintln!("  replica logs kept in {}", to.display());
}

async fn delete_all(api: &Api<Service>, sim: &SimHandle, timeout: Duration) -> (f64, usize) {
    let started = tokio::time::Instant::now();
    let names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| {
            let api = api.clone();
            async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        })
        .await;
    let deadline = started + timeout;
    let period = Duration::from_millis(250);
    loop {
        // The simulator's own state, read in process: a look through the API would share
        // baton's per-client budget (same address), and a client's list may be one it kept.
        let ips = sim.peek_ips();
        let left = ips.iter().filter(|ip| common::is_service_fip(ip)).count();
        let services = api.list(&ListParams::default()).await.unwrap().items.len();
        if left == 0 && services == 0 {
            return (started.elapsed().as_secs_f64(), 0);
        }
        if tokio::time::Instant::now() > deadline {
            return (started.elapsed().as_secs_f64(), left);
        }
        tokio::time::sleep(period).await;
    }
}

/// The nearest-rank `p`-th percentile (`p` in 1..=100) of sorted values.
fn percentile(sorted_ms: &[f64], p: usize) -> f64 {
    if sorted_ms.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted_ms.len()).div_ceil(100);
    sorted_ms[rank.clamp(1, sorted_ms.len()) - 1]
}

#[test]
#[ignore = "benchmark: run by scripts/bench/services and scripts/bench/scale"]
fn bench_services() {
    let params = Params::from_env();
    let scale = std::env::var("BENCH_MODE").is_ok_and(|m| m == "scale");
    lab::run(move || async move {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client(0).unwrap();
        metallb::install_crds(&client).await;
        namespace(&client, "metallb-system").await;
        namespace(&client, NS).await;
        let sim = common::sim(
            Faults {
                latency_ms: params.latency.clone(),
                rate_limit: params.rate,
                retry_after_secs: Some(1),
                ..Faults::none()
            },
            topology(params.nodes),
        )
        .await;
        let nodes: Api<Node> = Api::all(client.clone());
        for i in 0..params.nodes {
            create_node(
                &nodes,
                &format!("bench-node-{i:03}"),
                700_000 + u64::try_from(i).unwrap(),
            )
            .await;
        }
        if params.replicas == 0 {
            // The API server alone: how long the same creates take with no controller writing.
            let api: Api<Service> = Api::namespaced(client.clone(), NS);
            let names: Vec<String> = (0..params.count).map(|i| format!("svc-{i:05}")).collect();
            let started = tokio::time::Instant::now();
            create_only(&api, &names).await;
            println!(
                "baseline services={} nodes={} create_s={:.2} (no baton replica running)",
                params.count,
                params.nodes,
                started.elapsed().as_secs_f64()
            );
            return;
        }
        let replicas = Replicas::start(&cp, &sim, &params);
        let leader = replicas.leader(&client).await;
        // Let the controllers settle on the empty cluster (BGP on the project and every node,
        // the first lists) before counting.
        tokio::time::sleep(Duration::from_secs(if params.nodes > 0 { 15 } else { 5 })).await;
        sim.reset_stats();
        let writes_before = kube_writes(&client).await;
        let cpu_before: f64 = (0..params.replicas).map(|i| replicas.usage(i).1).sum();

        let api: Api<Service> = Api::namespaced(client.clone(), NS);
        let names: Vec<String> = (0..params.count).map(|i| format!("svc-{i:05}")).collect();
        let timeout = Duration::from_secs_f64(
            120.0 + params.count as f64 / 20.0 + params.rate.map_or(0.0, |r| params.count as f64 / r * 2.0),
        );
        let (all_ingress_s, create_s) = create_all(&api, &names, timeout).await;
        let stats = sim.stats();
        let burst_cpu_s: f64 = (0..params.replicas).map(|i| replicas.usage(i).1).sum::<f64>() - cpu_before;
        let list_calls = stats.route("GET /v1/projects/{id}/ips");
        let cloud_creates = stats.fips_created;
        let kube_per_service =
            (kube_writes(&client).await - writes_before - params.count as f64) / params.count as f64;
        eprintln!(
            "  cloud: POST {} GET-list {} GET-servers {} PUT {} 429 {}",
            stats.route("POST /v1/projects/{id}/ips"),
            stats.route("GET /v1/projects/{id}/ips"),
            stats.route("GET /v1/projects/{id}/servers"),
            stats.writes - stats.route("POST /v1/projects/{id}/ips"),
            stats.with_status(429)
        );

        if scale {
            // One Service at a time while the cluster is at this size (unlimited or not, as set).
            let mut latencies = Vec::new();
            for i in 0..params.probes {
                let name = format!("probe-{i:03}");
                let started = tokio::time::Instant::now();
                api.create(&PostParams::default(), &bench_service(&name))
                    .await
                    .unwrap();
                common::eventually(Duration::from_secs(60), &format!("{name}'s ingress"), || async {
                    api.get(&name).await.ok().as_ref().and_then(ingress)
                })
                .await;
                latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            latencies.sort_by(f64::total_cmp);
            // Idle: nothing changes; every cloud call of every replica is counted.
            tokio::time::sleep(Duration::from_secs(10)).await;
            sim.reset_stats();
            let cpu_before: f64 = (0..params.replicas).map(|i| replicas.usage(i).1).sum();
            tokio::time::sleep(Duration::from_secs(params.idle_s)).await;
            let idle = sim.stats().requests;
            let cpu_idle: f64 = (0..params.replicas).map(|i| replicas.usage(i).1).sum::<f64>() - cpu_before;
            let idle_cpu_pct = cpu_idle / params.idle_s as f64 * 100.0;
            let per_hour = idle as f64 * 3600.0 / params.idle_s as f64;
            let (rss, _) = replicas.usage(leader);
            replicas.explain_rss(leader);
            let cpu: f64 = (0..params.replicas).map(|i| replicas.usage(i).1).sum();
            let events = replicas.metric(leader, "baton_watch_events_total").await;
            println!(
                "scale services={} nodes={} all_ingress_s={all_ingress_s:.2} create_s={create_s:.2} burst_cpu_s={burst_cpu_s:.1} cloud_creates={cloud_creates} duplicate_fips={} list_calls={list_calls} p50_create_to_ingress_ms={:.0} p99_create_to_ingress_ms={:.0} rss_mib={rss:.1} cpu_s={cpu:.1} idle_cloud_calls_per_hour={per_hour:.0} idle_cpu_pct={idle_cpu_pct:.1} watch_events={events:.0}",
                params.count,
                params.nodes,
                stats.duplicate_fips,
                percentile(&latencies, 50),
                percentile(&latencies, 99),
            );
            let static_mib = std::env::var("BATON_STATIC_BIN")
                .ok()
                .and_then(|p| std::fs::metadata(p).ok())
                .map_or_else(
                    || "unknown".to_owned(),
                    |m| format!("{:.1}", m.len() as f64 / 1_048_576.0),
                );
            println!(
                "footprint static_binary_mib={static_mib} rss_mib={rss:.1} services={} nodes={}",
                params.count, params.nodes
            );
        }

        let release_timeout = Duration::from_secs_f64(
            120.0 + params.count as f64 / 20.0 + params.rate.map_or(0.0, |r| params.count as f64 / r * 2.0),
        );
        let (release_s, leaked) = delete_all(&api, &sim, release_timeout).await;
        if let Ok(keep) = std::env::var("BENCH_KEEP_LOGS") {
            keep_logs(cp.dir(), Path::new(&keep));
        }
        // Over the whole run: a duplicate made while releasing counts too.
        let duplicate_fips = sim.stats().duplicate_fips.max(stats.duplicate_fips);
        if scale {
            eprintln!("  released every FIP in {release_s:.1}s, {leaked} left");
        } else {
            let bound_s = params.rate.map_or(0.0, |r| params.count as f64 / r);
            println!(
                "services count={} rate={} latency_ms={} replicas={} all_ingress_s={all_ingress_s:.2} bound_s={bound_s:.2} cloud_creates={cloud_creates} duplicate_fips={duplicate_fips} list_calls={list_calls} cloud_writes={} cloud_requests={} got_429={} kube_writes_per_service={kube_per_service:.2} release_s={release_s:.2} leaked={leaked}",
                params.count,
                params.rate_shown(),
                params.latency,
                params.replicas,
                stats.writes,
                stats.requests,
                stats.with_status(429),
            );
        }
        replicas.stop().await;
        assert_eq!(leaked, 0, "FIPs left after deleting every Service");
    });
}
