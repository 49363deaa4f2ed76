//! Crash safety of the Service FIP controller: while Services are created and deleted, the
//! controller process (`baton controller-services`) is killed with SIGKILL at random points and
//! started again; at the end of every run the simulator holds exactly one FIP per live Service,
//! none for deleted ones (a FIP left by a rare race is released by the orphan sweep, a minute into
//! the controller's term), and each live Service shows its FIP.
//!
//! `CRASH_RUNS` (default 20) sets the number of runs, `CRASH_SEED` the dice (printed on failure).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use baton::controller::service::{FIP_ID_ANNOTATION, SWEEP_QUIET};
use baton_cloud::tags::service_tag;
use baton_sim::{Faults, Topology};
use baton_testbed::{ADMIN_TOKEN, lab};
use common::{eventually, ingress, lb_service, namespace, service_fips};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use rand::{Rng as _, SeedableRng as _};

const SERVICES: usize = 100;
const DELETED: usize = 50;

struct Controller {
    env: BTreeMap<String, String>,
    log: std::path::PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Controller {
    fn start(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("controller-services")
            .env_clear()
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start baton controller-services");
        self.child = Some(child);
        self.starts += 1;
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn killed_at_random_points_nothing_leaks_or_is_duplicated() {
    let runs: usize = std::env::var("CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("services_crash: {runs} runs, CRASH_SEED={seed}");
    lab::run(move || async move {
        baton_testbed::init_tracing();
        let (cp, client) = common::control_plane_with_controllers().await;
        // Low latency keeps the wall time short; some injected 5xx, half of them after the write
        // took effect, exercise the create protocol's look-up after an unknown outcome.
        let faults = Faults {
            latency_ms: 5.into(),
            error_rate: 0.03,
            ..Faults::none()
        };
        let sim = common::sim(faults, Topology::default()).await;
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let mut env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                ("RUST_LOG", "info,baton=debug,kube=warn"),
            ],
        );
        env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
        env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
        let log = cp.dir().join("controller-services.log");
        eprintln!("controller log: {}", log.display());
        let mut controller = Controller {
            env,
            log,
            child: None,
            starts: 0,
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let cluster = common::context(client.clone(), &common::env_for(&sim, &[]))
            .await
            .cluster_id
            .clone();
        let mut all_live: BTreeSet<String> = BTreeSet::new();

        for run in 0..runs {
            let ns = format!("crash-{run}");
            namespace(&client, &ns).await;
            let api: Api<Service> = Api::namespaced(client.clone(), &ns);
            let mut names: Vec<String> = (0..SERVICES).map(|i| format!("svc-{i}")).collect();
            names.shuffle(&mut rng);
            let mut doomed: Vec<String> = names.clone();
            doomed.shuffle(&mut rng);
            doomed.truncate(DELETED);
            let doomed_set: BTreeSet<String> = doomed.iter().cloned().collect();

            // The workload: create in random order; delete each doomed Service soon after it
            // exists. Runs while the controller is killed and restarted.
            let ops_api = api.clone();
            let ops_ns = ns.clone();
            let ops_seed: u64 = rng.random();
            let ops = tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(ops_seed);
                let mut created: Vec<String> = Vec::new();
                let mut to_delete: Vec<String> = Vec::new();
                for name in &names {
                    ops_api
                        .create(&PostParams::default(), &lb_service(&ops_ns, name, &[]))
                        .await
                        .unwrap();
                    created.push(name.clone());
                    if doomed_set.contains(name) {
                        to_delete.push(name.clone());
                    }
                    if !to_delete.is_empty() && rng.random_bool(0.6) {
                        let i = rng.random_range(0..to_delete.len());
                        let victim = to_delete.swap_remove(i);
                        ops_api.delete(&victim, &DeleteParams::default()).await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..25))).await;
                }
                for victim in to_delete {
                    ops_api.delete(&victim, &DeleteParams::default()).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..25))).await;
                }
            });

            // Kill at random points while the workload runs, and once more after it.
            let mut after = 0;
            while after < 2 {
                if ops.is_finished() {
                    after += 1;
                }
                controller.start();
                let up = rng.random_range(30..1200);
                tokio::time::sleep(Duration::from_millis(up)).await;
                controller.kill();
            }
            ops.await.unwrap();

            // Let it converge.
            controller.start();
            let live: BTreeSet<String> = (0..SERVICES)
                .map(|i| format!("svc-{i}"))
                .filter(|n| !doomed.contains(n))
                .collect();
            let shown: BTreeMap<String, (String, String)> = eventually(
                Duration::from_secs(120),
                &format!("run {run} converged (seed {seed})"),
                || async {
                    let list = api.list(&ListParams::default()).await.ok()?;
                    let names: BTreeSet<String> =
                        list.items.iter().map(kube::ResourceExt::name_any).collect();
                    if names != live {
                        return None;
                    }
                    let mut shown = BTreeMap::new();
                    for s in &list.items {
                        let ip = ingress(s)?;
                        let id = s.annotations().get(FIP_ID_ANNOTATION)?.clone();
                        shown.insert(s.name_any(), (id, ip));
                    }
                    Some(shown)
                },
            )
            .await;
            controller.kill();

            // The cloud's truth: exactly one FIP per live Service, the one it shows; none else.
            for name in &live {
                all_live.insert(format!("{ns}/{name}"));
            }
            let fips = service_fips(&sim).await;
            for f in &fips {
                assert_eq!(f.tags.get("cluster"), Some(&cluster), "foreign FIP {f:?}");
            }
            let by_service = group_by_service(&fips);
            for name in &live {
                let tag = service_tag(&ns, name);
                let mine = by_service.get(&tag).map(Vec::as_slice).unwrap_or_default();
                assert_eq!(
                    mine.len(),
                    1,
                    "run {run} (seed {seed}): {name} has {} FIPs",
                    mine.len()
                );
                let (id, ip) = &shown[name];
                assert_eq!(
                    &mine[0].id.to_string(),
                    id,
                    "run {run}: {name} records another FIP"
                );
                assert_eq!(
                    &mine[0].address.to_string(),
                    ip,
                    "run {run}: {name} shows another IP"
                );
            }
            // A deleted Service's FIP is released by its cleanup. One case is left to the orphan
            // sweep: the controller was killed with a create on its way (the cloud made the FIP,
            // the controller never learnt it), and the Service then went away without its
            // finalizer holding it (kubernetes/kubernetes#77988). Nothing reconciles that
            // Service again; the sweep releases the FIP once a term is SWEEP_QUIET old.
            let mut swept: Vec<String> = Vec::new();
            for name in &doomed {
                let tag = service_tag(&ns, name);
                if let Some(kept) = by_service.get(&tag) {
                    let ids: Vec<String> = kept.iter().map(|f| f.id.to_string()).collect();
                    eprintln!("run {run}: deleted {name} kept FIPs {ids:?}; waiting for the orphan sweep");
                    swept.push(tag);
                }
            }
            let mut fips = fips;
            if !swept.is_empty() {
                controller.start();
                let deadline = tokio::time::Instant::now() + SWEEP_QUIET + Duration::from_secs(20);
                let kept = |fips: &[baton_cloud::model::IpAddress]| {
                    fips.iter()
                        .any(|f| f.tags.get("service").is_some_and(|t| swept.contains(t)))
                };
                while kept(&fips) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    fips = service_fips(&sim).await;
                }
                controller.kill();
            }
            let by_service = group_by_service(&fips);
            for name in &doomed {
                let tag = service_tag(&ns, name);
                if let Some(kept) = by_service.get(&tag) {
                    let needle = format!("{ns}/{name}");
                    let ids: Vec<String> = kept.iter().map(|f| f.id.to_string()).collect();
                    let text = std::fs::read_to_string(&controller.log).unwrap_or_default();
                    for line in text.lines().filter(|l| {
                        l.contains(&needle)
                            || l.contains("starting")
                            || ids.iter().any(|id| l.contains(id.as_str()))
                    }) {
                        eprintln!("  {line}");
                    }
                    for e in sim
                        .log(0)
                        .iter()
                        .filter(|e| ids.iter().any(|id| e.path.contains(id.as_str())))
                    {
                        eprintln!("  sim: {e:?}");
                    }
                    panic!("run {run} (seed {seed}): deleted {name} kept FIPs {kept:?}");
                }
            }
            assert_eq!(
                fips.len(),
                all_live.len(),
                "run {run} (seed {seed}): FIPs {} for {} live Services",
                fips.len(),
                all_live.len()
            );
            // Deleting the survivors releases their FIPs too (and frees cluster IPs for the next run).
            controller.start();
            for name in &live {
                api.delete(name, &DeleteParams::default()).await.unwrap();
            }
            eventually(
                Duration::from_secs(120),
                &format!("run {run}: all deleted"),
                || async {
                    let left = api.list(&ListParams::default()).await.ok()?.items.len();
                    (left == 0).then_some(())
                },
            )
            .await;
            controller.kill();
            let left = service_fips(&sim).await;
            assert!(
                left.is_empty(),
                "run {run} (seed {seed}): FIPs left after deleting all: {left:?}"
            );
            all_live.clear();
            let stats = sim.stats();
            eprintln!(
                "run {run}: ok after {} controller starts; cloud writes {} ({} POST, {} DELETE), injected errors {}",
                controller.starts,
                stats.writes,
                stats.route("POST /v1/projects/{id}/ips"),
                stats.route("DELETE /v1/ips/{id}"),
                stats.injected_errors
            );
        }
        assert!(controller.starts >= 20 * 2, "at least 20 runs with kills");
    });
}

/// The FIPs by their `service` tag.
fn group_by_service(
    fips: &[baton_cloud::model::IpAddress],
) -> BTreeMap<String, Vec<&baton_cloud::model::IpAddress>> {
    let mut out: BTreeMap<String, Vec<_>> = BTreeMap::new();
    for f in fips {
        out.entry(f.tags.get("service").cloned().unwrap_or_default())
            .or_default()
            .push(f);
    }
    out
}
