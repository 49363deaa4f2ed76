//! Failover benchmark (run through `scripts/bench/failover`), one failure class at a time.
//!
//! In a lab with nodes: three control-plane lab nodes cp-0..2 (each its own network namespace on
//! the lab bridge, with a real API server on one shared etcd and a real kube-proxy), the
//! simulator with added API latency routing the FIP to its holder as the cloud does (the packets
//! keep the FIP as their destination), and on every node what ships there: `baton agent` (the
//! node accepts the control-plane FIPs) and one `baton controller` replica (the binary in
//! `BATON_BIN`) talking only to its node's API server, as the shipped Deployment does
//! (hostNetwork, `KUBERNETES_SERVICE_HOST` = its host). The clients that measure run on the lab
//! host, which is no node. Each run fails one node in the chosen class and measures from that
//! moment until `https://<FIP>:6443/readyz` answers from another node; then it heals the node and
//! lets the replicas see it healthy again.
//!
//! Classes (the node that fails is the *victim*):
//! - `kill`: the FIP holder's API server is SIGKILLed (connections refused);
//! - `hang`: the holder's API server is SIGSTOPped (TCP accepted by the kernel, nothing answers);
//! - `blackhole`: every packet to and from the holder's addresses is dropped;
//! - `dead-node`: blackhole, and the holder's baton replica is killed;
//! - `leader-node`: the same, on the node whose replica holds the Lease (CPEM #304/#319);
//! - `partition`: the holder's API server is unreachable for everyone (TCP to it is dropped, and
//!   so are etcd's answers to it, so its own replica cannot use it either), its replica (the
//!   leader) still reaches the cloud — the deposed leader must not write after its lease;
//! - `busy`: `kill` while the simulator enforces 4 requests/s and LoadBalancer Services are
//!   created (and deleted 40 behind) at 4/s, so the controller's Service work always has more
//!   queued cloud calls than the limit lets through.
//!
//! The victim is always the node holding the FIP. For kill/hang/blackhole/dead-node/busy the
//! leader must be elsewhere, for leader-node and partition on the victim: the benchmark restarts
//! the leading replica gracefully (it hands the Lease over) until that holds. Every cloud write a replica sends is attributed by its User-Agent
//! (`controller/<identity>`) and checked against the Lease history: `nonleader_writes` counts
//! writes that arrived when their sender did not hold the Lease. A client that keeps one HTTP/2
//! connection open through the FIP and sends a request every 100 ms reports its longest gap.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// a benchmark harness: a panic is the report
// Plot arithmetic on small counts (runs, pixels): the casts cannot lose anything that matters.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    clippy::cast_possible_wrap,
    clippy::many_single_char_names,
    clippy::too_many_lines
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_cloud::model::IpAddress;
use baton_sim::{Faults, SimHandle, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::leases::LeaseHistory;
use tokio::process::Child;
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];
const CLASSES: [&str; 7] = [
    "kill",
    "hang",
    "blackhole",
    "dead-node",
    "leader-node",
    "partition",
    "busy",
];
/// The controller's default lease duration: a write later than this after its sender's last
/// renew could come after a takeover.
const LEASE_MS: u64 = 1000;

#[derive(Clone)]
struct Args {
    classes: Vec<String>,
    runs: usize,
    /// The cloud API's latency: `N` ms, or `P50,P99` (a log-normal draw per request, as
    /// `baton sim --latency-ms` takes it; the simulator applies each write when it receives it,
    /// whether the client still waits or not).
    latency: baton_sim::Latency,
    svg_dir: Option<String>,
    bin: String,
    /// Draw the plots again from a log of an earlier run (its per-run lines), run nothing.
    replot: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        classes: vec!["kill".into()],
        runs: 30,
        latency: 100.into(),
        svg_dir: None,
        bin: std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into()),
        replot: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().expect("flag value");
        match flag.as_str() {
            "--class" => {
                let c = value();
                a.classes = if c == "all" {
                    CLASSES.iter().map(|s| (*s).to_owned()).collect()
                } else {
                    assert!(
                        CLASSES.contains(&c.as_str()),
                        "unknown class {c}; one of {CLASSES:?} or all"
                    );
                    vec![c]
                };
            }
            "--runs" => a.runs = value().parse().expect("--runs N"),
            "--latency-ms" => a.latency = value().parse().expect("--latency-ms N or P50,P99"),
            "--svg-dir" => a.svg_dir = Some(value()),
            "--bin" => a.bin = value(),
            "--replot" => a.replot = Some(value()),
            other => panic!(
                "unknown flag {other}; flags: --class CLASS|all --runs N --latency-ms N|P50,P99 --svg-dir DIR --bin PATH --replot LOG"
            ),
        }
    }
    if a.replot.is_some() {
        return a;
    }
    // The replicas start inside the nodes' namespaces (nsenter), where a relative path would
    // not resolve.
    a.bin = std::fs::canonicalize(&a.bin)
        .unwrap_or_else(|e| panic!("{}: {e}", a.bin))
        .display()
        .to_string();
    a
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The runs' failure → answer times: p50, p99 and the longest.
fn p50_p99_max(runs: &[Run]) -> (f64, f64, f64) {
    let mut sorted: Vec<f64> = runs.iter().map(|r| r.total_ms).collect();
    sorted.sort_by(f64::total_cmp);
    (
        percentile(&sorted, 50.0),
        percentile(&sorted, 99.0),
        sorted.last().copied().unwrap_or_default(),
    )
}

/// One failure and its recovery.
#[derive(Debug, Clone, Default)]
struct Run {
    /// Failure → FIP answers from another node.
    total_ms: f64,
    /// Failure → the retarget arrived at the cloud (detection, Lease takeover, decision, queue).
    to_call_ms: f64,
    /// The retarget call at the cloud.
    call_ms: f64,
    /// Longest gap between two answers of the HTTP/2 client around this failure.
    client_gap_ms: f64,
    retargets: usize,
}

#[derive(Debug, Default)]
struct Report {
    runs: Vec<Run>,
    false_moves: usize,
    retargets: usize,
    nonleader_writes: usize,
    extra: String,
}

fn main() {
    let a = args();
    if let Some(log) = &a.replot {
        replot(log, a.svg_dir.as_deref().unwrap_or("."));
        return;
    }
    for class in a.classes.clone() {
        let a2 = a.clone();
        let c = class.clone();
        let report = lab::run(move || run_class(c, a2));
        let (p50, p99, max) = p50_p99_max(&report.runs);
        let gap = report.runs.iter().map(|r| r.client_gap_ms).fold(0.0, f64::max);
        let mean = |f: fn(&Run) -> f64| report.runs.iter().map(f).sum::<f64>() / report.runs.len() as f64;
        for (i, r) in report.runs.iter().enumerate() {
            eprintln!(
                "{class} run {:2}: {:6.0} ms (to call {:4.0}, call {:4.0}, after {:4.0}; client gap {:5.0}; retargets {})",
                i + 1,
                r.total_ms,
                r.to_call_ms,
                r.call_ms,
                r.total_ms - r.to_call_ms - r.call_ms,
                r.client_gap_ms,
                r.retargets
            );
        }
        eprintln!(
            "{class}: mean to call {:.0} ms, call {:.0} ms, after the call {:.0} ms; longest client gap {gap:.0} ms",
            mean(|r| r.to_call_ms),
            mean(|r| r.call_ms),
            mean(|r| r.total_ms - r.to_call_ms - r.call_ms)
        );
        if let Some(dir) = &a.svg_dir {
            let path = format!("{dir}/failover-{class}.svg");
            std::fs::write(&path, svg(&class, &report.runs, p50, p99)).unwrap();
            eprintln!("wrote {path}");
        }
        println!(
            "failover class={class} p50_ms={p50:.0} p99_ms={p99:.0} max_ms={max:.0} runs={} false_moves={} retargets={} nonleader_writes={} client_gap_max_ms={gap:.0}{}",
            report.runs.len(),
            report.false_moves,
            report.retargets,
            report.nonleader_writes,
            report.extra
        );
    }
}

/// Successful PUTs of `fip` sent by a controller replica, from log sequence `from` on.
fn retargets(sim: &SimHandle, fip: &IpAddress, from: u64) -> Vec<baton_sim::LogEntry> {
    let path = format!("/v1/ips/{}", fip.id.as_str());
    sim.log(from)
        .into_iter()
        .filter(|e| {
            e.method == "PUT" && e.path == path && e.status < 300 && e.user_agent.contains("controller/")
        })
        .collect()
}

fn next_seq(sim: &SimHandle) -> u64 {
    sim.log(0).last().map_or(0, |e| e.seq + 1)
}

fn holder_of(sim: &SimHandle, fip: &IpAddress) -> Option<usize> {
    let id = sim.peek_ip(fip.id.as_str())?.target()?.0;
    CP.iter().position(|&c| c == id)
}

async fn run_class(class: String, a: Args) -> Report {
    let busy = class == "busy";
    let mut cp = ControlPlane::start(Options {
        nodes: true,
        ..Options::servers(3)
    })
    .await
    .unwrap();
    let sim = common::routed_sim(
        Faults {
            latency_ms: a.latency.clone(),
            rate_limit: busy.then_some(4.0),
            ..Faults::none()
        },
        Topology::default(),
    )
    .await;
    let _agents: Vec<Child> = (0..3).map(|i| start_agent(&cp, &a.bin, i)).collect();
    let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "bench-cp"), CP[0]).await;
    let history = LeaseHistory::record(
        (0..3).map(|i| cp.client(i).unwrap()).collect(),
        "baton-controller",
    );
    let mut replicas: Vec<Option<Child>> = (0..3)
        .map(|i| Some(start_replica(&cp, &sim, &a.bin, i, &class)))
        .collect();

    let ca = cp.ca_der().to_vec();
    let probe = baton_testbed::http_client(Some(&ca)).unwrap();
    // Recovery is what a new client sees: a new connection through the FIP for every probe
    // (no pooled connection left over from before the failure).
    let fresh = fresh_client(&ca);
    let fip_addr = SocketAddr::new(fip.address, 6443);
    let url = format!("https://{fip_addr}/readyz");
    common::wait_for("the FIP answers", Duration::from_secs(60), || {
        answers(&probe, &url)
    })
    .await;
    common::wait_for("a leader", Duration::from_secs(30), || {
        let h = history.holder();
        async move { h.is_some() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let client = H2Client::start(&ca, &url);
    let created = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let churn = busy.then(|| {
        tokio::spawn(churn_services(
            (0..3).map(|i| cp.client(i).unwrap()).collect(),
            Arc::clone(&created),
        ))
    });
    if busy {
        // Let the queue fill before the first failure.
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let stats_before = sim.stats();
    let log_from = next_seq(&sim);
    let created_before = created.load(std::sync::atomic::Ordering::Relaxed);

    let mut report = Report::default();
    for run in 0..a.runs {
        let on_leader = matches!(class.as_str(), "leader-node" | "partition");
        let holder = holder_of(&sim, &fip).expect("the FIP is routed");
        // The victim is always the FIP's holder; leadership is moved (a graceful restart of
        // the leading replica, which hands the Lease over) until the leader is on the victim
        // (leader-node, partition) or elsewhere (the other classes). The FIP itself is never
        // moved behind the replicas' back: they would act on a holder they have not read yet.
        for attempt in 0.. {
            let leader = leader_of(&history);
            if (leader == holder) == on_leader {
                break;
            }
            assert!(
                attempt < 20,
                "could not arrange the leader (holder cp-{holder}, leader cp-{leader})"
            );
            stop_gracefully(&mut replicas, leader).await;
            common::wait_for("a new leader", Duration::from_secs(10), || {
                let h = history.holder();
                let old = format!("cp-{leader}");
                async move { h.is_some_and(|h| h != old) }
            })
            .await;
            replicas[leader] = Some(start_replica(&cp, &sim, &a.bin, leader, &class));
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let victim = holder;
        let seq0 = next_seq(&sim);
        let t0 = Instant::now();
        let t0_unix = common::unix_ms();
        match class.as_str() {
            "kill" | "busy" => cp.kill_apiserver(victim).await,
            "hang" => cp.hang(victim).unwrap(),
            "blackhole" => cp.blackhole(victim).await.unwrap(),
            "partition" => cp.partition(victim).await.unwrap(),
            "dead-node" | "leader-node" => {
                cp.blackhole(victim).await.unwrap();
                if let Some(mut r) = replicas[victim].take() {
                    r.kill().await.unwrap();
                }
            }
            _ => unreachable!(),
        }
        let total = recover(&fresh, &url, &sim, &fip, victim, t0).await;
        let total_ms = total.as_secs_f64() * 1000.0;
        // Heal, and let every replica see the node healthy again before the next run.
        match class.as_str() {
            "kill" | "busy" => cp.start_apiserver(victim).await.unwrap(),
            "hang" => cp.unhang(victim).unwrap(),
            "blackhole" | "partition" => cp.heal(victim).await.unwrap(),
            "dead-node" | "leader-node" => {
                cp.heal(victim).await.unwrap();
                replicas[victim] = Some(start_replica(&cp, &sim, &a.bin, victim, &class));
            }
            _ => unreachable!(),
        }
        let direct = format!("https://{}/readyz", SocketAddr::new(cp.addresses()[victim], 6443));
        common::wait_for("the healed node answers", Duration::from_secs(60), || {
            answers(&probe, &direct)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let moves = retargets(&sim, &fip, seq0);
        let first = moves.first().expect("a replica moved the FIP");
        let result = Run {
            total_ms,
            to_call_ms: first.unix_ms.saturating_sub(t0_unix) as f64,
            call_ms: first.duration_ms as f64,
            client_gap_ms: client
                .longest_gap(t0, t0 + total + Duration::from_secs(2))
                .as_secs_f64()
                * 1000.0,
            retargets: moves.len(),
        };
        eprintln!(
            "{class} run {}: {:.0} ms, victim cp-{victim}, {} retarget(s)",
            run + 1,
            total_ms,
            moves.len()
        );
        report.retargets += moves.len();
        report.false_moves += moves.len().saturating_sub(1);
        report.runs.push(result);
    }
    // A quiet period: nothing fails, nothing may move.
    let seq = next_seq(&sim);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let quiet = retargets(&sim, &fip, seq).len();
    report.false_moves += quiet;
    report.retargets += quiet;
    let log = sim.log(0);
    let bad = history.nonleader_writes(&log, LEASE_MS);
    for w in &bad {
        eprintln!(
            "non-leader write: {} {} from {:?} at {}",
            w.method, w.path, w.user_agent, w.unix_ms
        );
    }
    report.nonleader_writes = bad.len();
    if let Some(churn) = churn {
        churn.abort();
        let stats = sim.stats();
        let fips_created = sim
            .log(log_from)
            .iter()
            .filter(|e| e.method == "POST" && e.path.ends_with("/ips") && e.status < 300)
            .count();
        report.extra = format!(
            " services_created={} service_fips_created={fips_created} cloud_requests={} got_429={}",
            created.load(std::sync::atomic::Ordering::Relaxed) - created_before,
            stats.requests.saturating_sub(stats_before.requests),
            stats.rate_limited.saturating_sub(stats_before.rate_limited)
        );
    }
    client.stop();
    for r in replicas.iter_mut().flatten() {
        let _ = r.kill().await;
    }
    report
}

fn leader_of(history: &LeaseHistory) -> usize {
    history
        .holder()
        .and_then(|h| h.strip_prefix("cp-").and_then(|i| i.parse::<usize>().ok()))
        .expect("a leader")
}

/// SIGTERM to replica `i`: it releases the Lease and exits.
async fn stop_gracefully(replicas: &mut [Option<Child>], i: usize) {
    if let Some(mut r) = replicas[i].take() {
        if let Some(pid) = r.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), r.wait())
            .await
            .is_err()
        {
            let _ = r.kill().await;
        }
    }
}

/// Waits until the FIP answers `/readyz` from a node other than `victim`; returns the time
/// since `t0`. Probes start every 20 ms on fresh connections, overlapping, so a probe stuck on
/// the failed node does not hide the recovery.
async fn recover(
    probe: &reqwest::Client,
    url: &str,
    sim: &SimHandle,
    fip: &IpAddress,
    victim: usize,
    t0: Instant,
) -> Duration {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                assert!(t0.elapsed() < Duration::from_secs(30), "no recovery within 30 s (victim cp-{victim})");
                let (probe, url, tx) = (probe.clone(), url.to_owned(), tx.clone());
                tokio::spawn(async move {
                    if answers(&probe, &url).await {
                        let _ = tx.send(t0.elapsed());
                    }
                });
            }
            Some(at) = rx.recv() => {
                if holder_of(sim, fip).is_some_and(|h| h != victim) {
                    return at;
                }
            }
        }
    }
}

async fn answers(probe: &reqwest::Client, url: &str) -> bool {
    matches!(
        probe.get(url).timeout(Duration::from_millis(300)).send().await,
        Ok(r) if r.status().is_success()
    )
}

/// Where the replicas' logs go: `$BATON_BENCH_LOGS`, or a directory per process under the
/// temporary directory (kept after the run, for a look at a slow or failed failover).
fn logs_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("BATON_BENCH_LOGS").map_or_else(
            || std::env::temp_dir().join(format!("baton-failover-bench-{}", std::process::id())),
            std::path::PathBuf::from,
        );
        std::fs::create_dir_all(&dir).unwrap();
        eprintln!("replica logs: {}", dir.display());
        dir
    })
    .clone()
}

/// `baton agent` on node cp-i (the shipped DaemonSet's job): watches the control-plane endpoint
/// Services through the node's API server and makes the node accept their FIPs.
fn start_agent(cp: &ControlPlane, bin: &str, i: usize) -> Child {
    let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs_dir().join(format!("agent-cp-{i}.log")))
        .unwrap();
    cp.node_command(&format!("cp-{i}"), bin)
        .unwrap()
        .arg("agent")
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--health-listen",
            "off",
        ])
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin} agent: {e}"))
}

/// `baton controller` replica `i` on node cp-i: identity cp-i, talking only to API server i.
fn start_replica(cp: &ControlPlane, sim: &SimHandle, bin: &str, i: usize, class: &str) -> Child {
    let busy = class == "busy";
    let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs_dir().join(format!("{class}-cp-{i}.log")))
        .unwrap();
    let mut controller = cp.node_command(&format!("cp-{i}"), bin).unwrap();
    if busy {
        // A FIP for every LoadBalancer Service, handed to kube-vip (an annotation).
        controller
            .env("CHERRY_REGION_NAME", "LT-Siauliai")
            .env("CHERRY_LOAD_BALANCER", "kube-vip://");
    }
    controller
        .env("BATON_LOG", "info,baton=debug")
        .arg("controller")
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--identity", &format!("cp-{i}"), "--admin-listen", "off"])
        .env("CHERRY_API_KEY", "sim-token")
        .env("CHERRY_PROJECT_ID", "123456")
        .env("CHERRY_FIP_TAG", "cluster=bench-cp")
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"))
}

/// A client that opens a new connection for every request.
fn fresh_client(ca: &[u8]) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// A client like kubectl's: one HTTP/2 connection kept open through the FIP, a request every
/// 100 ms (1 s timeout); records when answers arrive.
struct H2Client {
    answers: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl H2Client {
    fn start(ca: &[u8], url: &str) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(ca.to_vec()))
            .unwrap();
        let mut tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .http2_prior_knowledge()
            .connect_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (url, log) = (url.to_owned(), Arc::clone(&answers));
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let (client, url, log) = (client.clone(), url.clone(), Arc::clone(&log));
                tokio::spawn(async move {
                    if matches!(client.get(&url).timeout(Duration::from_secs(1)).send().await, Ok(r) if r.status().is_success())
                    {
                        log.lock().unwrap().push(Instant::now());
                    }
                });
            }
        });
        Self { answers, task }
    }

    /// The longest time without an answer between `from` and `to`.
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let mut times: Vec<Instant> = self.answers.lock().unwrap().clone();
        times.sort();
        let last_before = times.iter().rev().find(|t| **t <= from).copied().unwrap_or(from);
        let mut prev = last_before;
        let mut gap = Duration::ZERO;
        for t in times.into_iter().filter(|t| *t > from && *t <= to) {
            gap = gap.max(t - prev);
            prev = t;
        }
        gap.max(to.saturating_duration_since(prev).min(Duration::ZERO))
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// Creates a LoadBalancer Service every 250 ms and deletes the one 40 before it, through
/// whichever API server answers (one of them is always failing).
async fn churn_services(clients: Vec<kube::Client>, created: Arc<std::sync::atomic::AtomicU64>) {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use kube::api::{Api, DeleteParams, PostParams};
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "busy"}})).unwrap();
    for c in &clients {
        if Api::<Namespace>::all(c.clone())
            .create(&PostParams::default(), &ns)
            .await
            .is_ok()
        {
            break;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    for i in 0u64.. {
        tick.tick().await;
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("churn-{i}")},
            "spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false,
                     "ports": [{"port": 80, "protocol": "TCP"}]}
        }))
        .unwrap();
        for c in &clients {
            let api: Api<Service> = Api::namespaced(c.clone(), "busy");
            let done =
                tokio::time::timeout(Duration::from_secs(2), api.create(&PostParams::default(), &svc)).await;
            if matches!(done, Ok(Ok(_))) {
                created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(old) = i.checked_sub(40) {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        api.delete(&format!("churn-{old}"), &DeleteParams::default()),
                    )
                    .await;
                }
                break;
            }
        }
    }
}

/// `--replot LOG`: the plots of every class in a log of an earlier run, from its per-run lines
/// (`kill run  1:    532 ms (to call  510, call  105, after  -83; client gap ...`).
fn replot(log: &str, dir: &str) {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    let mut classes: Vec<(String, Vec<Run>)> = Vec::new();
    for line in text.lines() {
        let Some((class, rest)) = line.split_once(" run ") else {
            continue;
        };
        if !CLASSES.contains(&class) {
            continue;
        }
        let num = |key: &str| -> Option<f64> {
            let after = rest.split_once(key)?.1.trim_start();
            let end = after
                .find(|c: char| c != '-' && !c.is_ascii_digit())
                .unwrap_or(after.len());
            after[..end].parse().ok()
        };
        let (Some(total_ms), Some(to_call_ms), Some(call_ms), Some(client_gap_ms)) = (
            rest.split_once(':')
                .and_then(|(_, r)| r.trim_start().split(' ').next()?.parse().ok()),
            num("to call"),
            num(", call"),
            num("client gap"),
        ) else {
            continue;
        };
        let run = Run {
            total_ms,
            to_call_ms,
            call_ms,
            client_gap_ms,
            retargets: 0,
        };
        match classes.iter_mut().find(|(c, _)| c == class) {
            Some((_, runs)) => runs.push(run),
            None => classes.push((class.to_owned(), vec![run])),
        }
    }
    assert!(!classes.is_empty(), "{log}: no per-run lines");
    for (class, runs) in &classes {
        let (p50, p99, _) = p50_p99_max(runs);
        let path = format!("{dir}/failover-{class}.svg");
        std::fs::write(&path, svg(class, runs, p50, p99)).unwrap();
        eprintln!("wrote {path} ({} runs)", runs.len());
    }
}

/// One horizontal bar per run: until the retarget reached the cloud (detection, takeover,
/// decision), then until the FIP answered from another node (the cloud routes the FIP when it
/// receives the retarget, which can be before its answer comes back); a thin line under the bar
/// spans the retarget call, from its arrival to its answer.
fn svg(class: &str, runs: &[Run], p50: f64, p99: f64) -> String {
    let (w, left, right, top, row) = (720.0, 60.0, 20.0, 40.0, 12.0);
    let h = top + row * runs.len() as f64 + 50.0;
    let max = runs.iter().map(|r| r.total_ms).fold(1600.0_f64, f64::max) * 1.05;
    let plot_w = w - left - right;
    let x = |ms: f64| left + plot_w * ms / max;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="13">failover, class {class}: failure → FIP answers from another node (ms)</text>"#,
        w / 2.0
    );
    for (i, r) in runs.iter().enumerate() {
        let y = top + row * i as f64;
        let mut at = 0.0;
        for (len, color) in [
            (r.to_call_ms, "#4a7ebb"),
            ((r.total_ms - r.to_call_ms).max(0.0), "#67c23a"),
        ] {
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                x(at),
                y + 1.0,
                (x(at + len) - x(at)).max(0.0),
                row - 4.0
            );
            at += len;
        }
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="2" fill="#e6a23c"/>"##,
            x(r.to_call_ms),
            y + row - 3.0,
            (x(r.to_call_ms + r.call_ms) - x(r.to_call_ms)).max(0.0)
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 4.0,
            y + row - 2.0,
            i + 1
        );
    }
    let bottom = top + row * runs.len() as f64;
    // p50 to the left of its line, p99 to the right: they are often close.
    for (label, v, color, anchor, dx) in [
        ("p50", p50, "#2a9d3a", "end", -3.0),
        ("p99", p99, "#c0392b", "start", 3.0),
        ("target", 1500.0, "#888", "middle", 0.0),
    ] {
        let _ = write!(
            s,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{top}" y2="{bottom:.1}" stroke="{color}" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="{color}" text-anchor="{anchor}">{label} {v:.0}</text>"#,
            x(v),
            x(v),
            x(v) + dx,
            top - 4.0
        );
    }
    let mut tick = 0.0;
    while tick <= max {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{tick:.0}</text>"#,
            x(tick),
            bottom + 14.0
        );
        tick += 250.0;
    }
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="10" height="10" fill="#4a7ebb"/><text x="{}" y="{:.1}">failure → retarget reaches the cloud (detection, Lease takeover, decision)</text>"##,
        bottom + 22.0,
        left + 14.0,
        bottom + 31.0
    );
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{:.1}" width="10" height="10" fill="#e6a23c"/><text x="{}" y="{:.1}">retarget call, arrival → answer</text><rect x="{}" y="{:.1}" width="10" height="10" fill="#67c23a"/><text x="{}" y="{:.1}">retarget at the cloud → the FIP answers (route change, new connection)</text></svg>"##,
        bottom + 36.0,
        left + 14.0,
        bottom + 45.0,
        left + 200.0,
        bottom + 36.0,
        left + 214.0,
        bottom + 45.0
    );
    s
}
