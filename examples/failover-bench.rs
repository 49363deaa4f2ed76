//! Failover benchmark (run through `scripts/bench/failover`).
//!
//! In a lab: three real API servers, the simulator with added API latency, and `baton
//! controller` (the binary in `BATON_BIN`). Each run kills the FIP holder's API server and
//! measures the time until `https://<FIP>:6443/readyz` answers again, then restarts it and lets
//! the controller see it healthy. Every retarget beyond one per run, and any during a final quiet
//! period, is a false move.
//!
//! `--busy`: the simulator enforces the real API's 4 requests/s, and LoadBalancer Services are
//! created (and, 40 behind, deleted) at 4/s throughout, so the controller's Service FIP work
//! always has more queued cloud calls than the limit lets through: the failover's calls must
//! jump that queue. The holder is read from the simulator's state directly, so the benchmark
//! itself uses none of the request budget.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// a benchmark harness: a panic is the report
// Plot arithmetic on small counts (runs, pixels): the casts cannot lose anything that matters.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    clippy::many_single_char_names
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use baton_cloud::model::ServerId;
use baton_cloud::sim::{Faults, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use tokio::time::Instant;

const CP: [u64; 3] = [600_101, 600_102, 600_103];

struct Args {
    runs: usize,
    latency_ms: u64,
    svg: Option<String>,
    bin: String,
    busy: bool,
}

fn args() -> Args {
    let mut a = Args {
        runs: 20,
        latency_ms: 100,
        svg: None,
        bin: std::env::var("BATON_BIN").unwrap_or_else(|_| "target/release/baton".into()),
        busy: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().expect("flag value");
        match flag.as_str() {
            "--runs" => a.runs = value().parse().expect("--runs N"),
            "--latency-ms" => a.latency_ms = value().parse().expect("--latency-ms N"),
            "--svg" => a.svg = Some(value()),
            "--bin" => a.bin = value(),
            "--busy" => a.busy = true,
            other => {
                panic!("unknown flag {other}; flags: --runs N --latency-ms N --svg PATH --bin PATH --busy")
            }
        }
    }
    a
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn main() {
    let a = args();
    let (times, false_moves, busy) = lab::run(move || run(a.runs, a.latency_ms, a.bin.clone(), a.busy));
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&sorted, 50.0), percentile(&sorted, 99.0));
    for (i, t) in times.iter().enumerate() {
        eprintln!("run {:2}: {:6.0} ms", i + 1, t);
    }
    if let Some(path) = &a.svg {
        std::fs::write(path, svg(&times, p50, p99)).unwrap();
        eprintln!("wrote {path}");
    }
    let mode = if a.busy { "failover-busy" } else { "failover" };
    println!(
        "{mode} p50_ms={:.0} p99_ms={:.0} runs={} false_moves={false_moves}{busy}",
        p50,
        p99,
        times.len()
    );
}

async fn run(runs: usize, latency_ms: u64, bin: String, busy: bool) -> (Vec<f64>, usize, String) {
    let mut cp = ControlPlane::start(Options::servers(3)).await.unwrap();
    let sim = common::sim(
        Faults {
            latency_ms,
            rate_limit: busy.then_some(4.0),
            ..Faults::none()
        },
        Topology::default(),
    )
    .await;
    let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "bench-cp"), CP[0]).await;

    let _controller = start_controller(&cp, &sim, &bin, busy);

    let probe = baton_testbed::http_client(Some(cp.ca_der())).unwrap();
    let url = format!("https://{}/readyz", SocketAddr::new(fip.address, 6443));
    let ok = |probe: reqwest::Client, url: String| async move {
        matches!(probe.get(&url).timeout(Duration::from_millis(300)).send().await, Ok(r) if r.status().is_success())
    };
    // Warm up: the controller sees every API server healthy.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok(probe.clone(), url.clone()).await {
        assert!(Instant::now() < deadline, "the FIP never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let fip_path = format!("/v1/ips/{}", fip.id.as_str());
    let puts = |sim: &baton_cloud::sim::SimHandle| {
        sim.log(0)
            .into_iter()
            .filter(|e| e.method == "PUT" && e.path == fip_path && e.status < 300)
            .count()
    };
    let target = |sim: &baton_cloud::sim::SimHandle| sim.peek_ip(fip.id.as_str()).and_then(|ip| ip.target());
    let created = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let churn = busy.then(|| {
        tokio::spawn(churn_services(
            (0..3).map(|i| cp.client(i).unwrap()).collect(),
            std::sync::Arc::clone(&created),
        ))
    });
    if busy {
        // Let the queue fill before the first kill.
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    // The busy counts cover the runs, from the first kill (not the warm-up).
    let stats_before = sim.stats();
    let log_from = sim.log(0).last().map_or(0, |e| e.seq + 1);
    let created_before = created.load(std::sync::atomic::Ordering::Relaxed);
    let mut times = Vec::with_capacity(runs);
    let mut false_moves = 0;
    for run in 0..runs {
        let before = puts(&sim);
        let holder = target(&sim).expect("the FIP is assigned").0;
        let idx = CP
            .iter()
            .position(|&id| id == holder)
            .expect("held by a control-plane server");
        let t0 = Instant::now();
        cp.kill_apiserver(idx).await;
        // The FIP keeps answering for a moment after the kill only if the connection raced it.
        loop {
            if ok(probe.clone(), url.clone()).await && target(&sim) != Some(ServerId(holder)) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "run {run}: no recovery within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
        cp.start_apiserver(idx).await.unwrap();
        // Let the controller see the restarted API server healthy again.
        tokio::time::sleep(Duration::from_secs(3)).await;
        false_moves += (puts(&sim) - before).saturating_sub(1);
    }
    // A quiet period: nothing fails, nothing may move.
    let before = puts(&sim);
    tokio::time::sleep(Duration::from_secs(10)).await;
    false_moves += puts(&sim) - before;
    let busy_report = if let Some(churn) = churn {
        churn.abort();
        busy_report(
            &sim,
            &stats_before,
            log_from,
            created.load(std::sync::atomic::Ordering::Relaxed) - created_before,
        )
    } else {
        String::new()
    };
    (times, false_moves, busy_report)
}

/// What the busy mode's Service churn made the cloud do since `before` (log entries from
/// `log_from` on).
fn busy_report(
    sim: &baton_cloud::sim::SimHandle,
    before: &baton_cloud::sim::Stats,
    log_from: u64,
    services_created: u64,
) -> String {
    let stats = sim.stats();
    let fips_created = sim
        .log(log_from)
        .iter()
        .filter(|e| e.method == "POST" && e.path.ends_with("/ips") && e.status < 300)
        .count();
    format!(
        " services_created={services_created} service_fips_created={fips_created} cloud_requests={} got_429={}",
        stats.requests.saturating_sub(before.requests),
        stats.rate_limited.saturating_sub(before.rate_limited)
    )
}

/// `baton controller` (the binary `bin`) against every API server, for the bench FIP; with the
/// default client limit (4 requests/s) in both modes.
fn start_controller(
    cp: &ControlPlane,
    sim: &baton_cloud::sim::SimHandle,
    bin: &str,
    busy: bool,
) -> tokio::process::Child {
    let urls: Vec<String> = (0..3).map(|i| cp.url(i)).collect();
    let kubeconfig = cp.write_kubeconfig(1, ADMIN_TOKEN).unwrap();
    let log = std::fs::File::create(cp.dir().join("controller.log")).unwrap();
    let mut controller = tokio::process::Command::new(bin);
    if busy {
        // A FIP for every LoadBalancer Service, handed to kube-vip (an annotation).
        controller
            .env("CHERRY_REGION_NAME", "LT-Siauliai")
            .env("CHERRY_LOAD_BALANCER", "kube-vip://");
    }
    controller
        .arg("controller")
        .args([
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--identity",
            "bench",
        ])
        .args(["--admin-listen", "off", "--api-servers", &urls.join(",")])
        .env("CHERRY_API_KEY", "sim-token")
        .env("CHERRY_PROJECT_ID", "123456")
        .env("CHERRY_FIP_TAG", "cluster=bench-cp")
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin}: {e}"))
}

/// Creates a LoadBalancer Service every 250 ms and deletes the one 40 before it, through
/// whichever API server answers (one of them is always being killed).
async fn churn_services(clients: Vec<kube::Client>, created: std::sync::Arc<std::sync::atomic::AtomicU64>) {
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

fn svg(times: &[f64], p50: f64, p99: f64) -> String {
    let (w, h, left, bottom, top) = (640.0, 320.0, 50.0, 40.0, 30.0);
    let max = times.iter().copied().fold(1500.0_f64, f64::max) * 1.1;
    let plot_w = w - left - 20.0;
    let plot_h = h - bottom - top;
    let y = |ms: f64| top + plot_h * (1.0 - ms / max);
    let bar_w = plot_w / times.len().max(1) as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="13">Control-plane failover: holder's API server killed → FIP answers again (ms)</text>"#,
        w / 2.0
    );
    for (i, t) in times.iter().enumerate() {
        let x = left + i as f64 * bar_w + 2.0;
        let _ = write!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#4a7ebb"/>"##,
            y(*t),
            bar_w - 4.0,
            y(0.0) - y(*t)
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x + (bar_w - 4.0) / 2.0,
            h - bottom + 14.0,
            i + 1
        );
    }
    for (label, v, color) in [
        ("p50", p50, "#2a9d3a"),
        ("p99", p99, "#c0392b"),
        ("target 1500", 1500.0, "#888"),
    ] {
        let _ = write!(
            s,
            r#"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="{color}" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" fill="{color}" text-anchor="end">{label} {v:.0}</text>"#,
            w - 20.0,
            y(v),
            y(v),
            w - 22.0,
            y(v) - 3.0
        );
    }
    let _ = write!(
        s,
        r#"<line x1="{left}" x2="{left}" y1="{top}" y2="{:.1}" stroke="black"/><line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
        y(0.0),
        w - 20.0,
        y(0.0),
        y(0.0)
    );
    for tick in [0.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0] {
        if tick <= max {
            let _ = write!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{tick:.0}</text>"#,
                left - 4.0,
                y(tick) + 4.0
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">run</text></svg>"#,
        left + plot_w / 2.0,
        h - 8.0
    );
    s
}
