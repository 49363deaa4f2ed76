//! The Service FIP benchmark (run by `scripts/bench/services`, ignored by `cargo test`): a real
//! API server and the simulator (API latency `BENCH_LATENCY_MS`, default 50 ms; per-client limit
//! `BENCH_RATE` requests/s or `off`), `baton controller-services` with its client limiter at the
//! same rate; `BENCH_COUNT` Services are created at once and the time until all have an ingress is
//! measured. Ends with the line
//! `services n=<N> rate=<R|off> all_ingress_s=<x> bound_s=<b|0> cloud_writes=<n> cloud_requests=<n> got_429=<n>`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark harness: a panic is the report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use baton_sim::{Faults, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::{ingress, lb_service, namespace};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
#[ignore = "benchmark: run by scripts/bench/services"]
fn bench_services() {
    let count: u32 = env_or("BENCH_COUNT", 100);
    let count_usize = usize::try_from(count).unwrap();
    let rate_text = std::env::var("BENCH_RATE").unwrap_or_else(|_| "4".into());
    let rate: Option<f64> = match rate_text.as_str() {
        "off" | "0" => None,
        r => Some(r.parse().expect("BENCH_RATE: a number or off")),
    };
    let latency_ms: u64 = env_or("BENCH_LATENCY_MS", 50);
    lab::run(move || async move {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client(0).unwrap();
        let sim = common::sim(
            Faults {
                latency_ms,
                rate_limit: rate,
                retry_after_secs: Some(1),
                ..Faults::none()
            },
            // Room for 1,000 FIPs (the lab pool 203.0.113.0/24 has 254); Service FIPs are never
            // targeted, so their addresses need not be local to the lab.
            Topology {
                fip_pool: "198.18.0.0/16".into(),
                ..Topology::default()
            },
        )
        .await;
        let limit = rate.map_or_else(|| "0".to_owned(), |r| r.to_string());
        let mut env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                ("BATON_API_RATE_LIMIT", &limit),
                ("RUST_LOG", "warn"),
            ],
        );
        env.insert(
            "KUBECONFIG".into(),
            cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap().display().to_string(),
        );
        let log_path = cp.dir().join("controller-services.log");
        let log = std::fs::File::create(&log_path).unwrap();
        namespace(&client, "bench").await;
        let mut controller = Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("controller-services")
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        // Let it start watching (its list of Services is empty).
        tokio::time::sleep(Duration::from_secs(2)).await;
        sim.reset_stats();

        let api: Api<Service> = Api::namespaced(client.clone(), "bench");
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = progress.clone();
        let watch_api = api.clone();
        let watcher_task = tokio::spawn(async move {
            let mut with_ingress = BTreeSet::new();
            let mut stream = std::pin::pin!(
                watcher(watch_api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(event) = stream.next().await {
                let svc = match event {
                    Ok(svc) => svc,
                    Err(error) => {
                        eprintln!("watch: {error}");
                        continue;
                    }
                };
                if ingress(&svc).is_some() {
                    with_ingress.insert(svc.name_any());
                    seen.store(with_ingress.len(), std::sync::atomic::Ordering::Relaxed);
                    if with_ingress.len() == count_usize {
                        let _ = done_tx.send(tokio::time::Instant::now());
                        return;
                    }
                }
            }
        });

        let started = tokio::time::Instant::now();
        futures::stream::iter(0..count)
            .for_each_concurrent(32, |i| {
                let api = api.clone();
                async move {
                    let mut svc = lb_service("bench", &format!("svc-{i:04}"), &[]);
                    // No NodePorts: kube-apiserver allocates them from one bitmap (serialised by
                    // optimistic concurrency), which makes creating 1,000 Services at once slow
                    // for reasons that have nothing to do with baton. BGP load balancers
                    // (MetalLB, kube-vip) do not need them.
                    if let Some(spec) = svc.spec.as_mut() {
                        spec.allocate_load_balancer_node_ports = Some(false);
                    }
                    api.create(&PostParams::default(), &svc).await.unwrap();
                }
            })
            .await;
        let created_s = started.elapsed().as_secs_f64();
        let timeout = Duration::from_secs_f64(60.0 + rate.map_or(0.0, |r| f64::from(count) / r * 2.0));
        let reporter = {
            let progress = progress.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    eprintln!(
                        "  {:>5.1}s: {} with ingress",
                        started.elapsed().as_secs_f64(),
                        progress.load(std::sync::atomic::Ordering::Relaxed)
                    );
                }
            })
        };
        let finished = tokio::time::timeout(timeout, done_rx).await;
        reporter.abort();
        let Ok(Ok(finished)) = finished else {
            let stats = sim.stats();
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(20).collect();
            panic!(
                "not all Services got an ingress in {timeout:?}: {} did; POST {}; controller log tail:\n{}",
                progress.load(std::sync::atomic::Ordering::Relaxed),
                stats.route("POST /v1/projects/{id}/ips"),
                tail.join("\n")
            );
        };
        let all_ingress_s = finished.duration_since(started).as_secs_f64();
        watcher_task.abort();
        let _ = controller.kill();
        let _ = controller.wait();

        let stats = sim.stats();
        let bound_s = rate.map_or(0.0, |r| f64::from(count) / r);
        let rate_shown = rate.map_or_else(|| "off".to_owned(), |r| r.to_string());
        eprintln!(
            "created {count} Services in {created_s:.2}s; POST {} GET-list {} GET-ip {} DELETE {}; controller log {}",
            stats.route("POST /v1/projects/{id}/ips"),
            stats.route("GET /v1/projects/{id}/ips"),
            stats.route("GET /v1/ips/{id}"),
            stats.route("DELETE /v1/ips/{id}"),
            log_path.display()
        );
        println!(
            "services n={count} rate={rate_shown} all_ingress_s={all_ingress_s:.2} bound_s={} cloud_writes={} cloud_requests={} got_429={}",
            if rate.is_some() {
                format!("{bound_s:.2}")
            } else {
                "0".into()
            },
            stats.writes,
            stats.requests,
            stats.with_status(429),
        );
    });
}
