//! Exactly one FIP per Service across a leader change: two `baton controller` replicas (leader
//! election), a burst of 200 LoadBalancer Services, a cloud whose answers take up to seconds
//! (p50 300 ms, p99 2 s) and lose 10 % of the creates' answers after creating; the leader is
//! killed (SIGKILL) in the middle of the burst. When every Service has its ingress: each has
//! exactly one FIP, no FIP is orphaned, and the simulator deleted no FIP (every Service lives)
//! and never held two FIPs for one Service.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use baton_cloud::tags::service_fip_tags;
use baton_sim::{Faults, RouteFaults, Topology};
use baton_testbed::control_plane::Proc;
use baton_testbed::{ADMIN_TOKEN, lab};
use common::{eventually, ingress, lb_service, namespace};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use tokio::process::Command;

const NS: &str = "burst";
const SERVICES: usize = 200;
/// The leader is killed once this many Services have their ingress.
const KILL_AT: usize = 50;

/// The replica holding the Lease (`replica-<i>`), once it is not `not`.
async fn leader(client: &kube::Client, not: Option<usize>) -> usize {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    eventually(Duration::from_secs(60), "a leader", || async {
        let lease = leases.get_opt("baton-controller").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        let i: usize = holder.strip_prefix("replica-")?.parse().ok()?;
        (Some(i) != not).then_some(i)
    })
    .await
}

async fn with_ingress(api: &Api<Service>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|s| Some((s.name_any(), ingress(s)?)))
        .collect()
}

#[test]
fn killing_the_leader_mid_burst_leaves_exactly_one_fip_per_service() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (cp, client) = common::control_plane_with_controllers().await;
        let sim = common::sim(
            Faults {
                latency_ms: "300,2000".parse().unwrap(),
                routes: BTreeMap::from([(
                    "POST /v1/projects/{id}/ips".to_owned(),
                    RouteFaults {
                        error_rate: Some(0.1),
                        lost_response_ratio: Some(1.0),
                        ..RouteFaults::default()
                    },
                )]),
                non_json_ratio: 0.5,
                ..Faults::none()
            },
            Topology {
                // Service FIPs are never routed: their addresses need not be local to the lab.
                fip_pool: "198.18.0.0/16".into(),
                ..Topology::default()
            },
        )
        .await;
        namespace(&client, NS).await;
        let cluster = common::context(client.clone(), &common::env_for(&sim, &[]))
            .await
            .cluster_id
            .clone();
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                ("BATON_LOG", "info,baton=debug,kube=warn"),
            ],
        );
        let mut replicas: Vec<Option<Proc>> = (0..2)
            .map(|i| {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton"));
                cmd.arg("controller")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--identity", &format!("replica-{i}")])
                    .args(["--admin-listen", &format!("127.0.0.1:{}", 19_690 + i)])
                    .env_clear()
                    .envs(&env);
                Some(Proc::spawn(&format!("controller-{i}"), cp.dir(), &mut cmd).unwrap())
            })
            .collect();
        let first = leader(&client, None).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        sim.reset_stats();

        // The burst: 200 Services at once (32 creates in flight).
        let api: Api<Service> = Api::namespaced(client.clone(), NS);
        let names: Vec<String> = (0..SERVICES).map(|i| format!("svc-{i:03}")).collect();
        let creating = {
            let api = api.clone();
            let names = names.clone();
            tokio::spawn(async move {
                futures::stream::iter(names)
                    .for_each_concurrent(32, |name| {
                        let api = api.clone();
                        async move {
                            api.create(&PostParams::default(), &lb_service(NS, &name, &[]))
                                .await
                                .unwrap();
                        }
                    })
                    .await;
            })
        };
        // In the middle of it, the leader dies.
        eventually(Duration::from_secs(180), "the burst under way", || async {
            (with_ingress(&api).await.len() >= KILL_AT).then_some(())
        })
        .await;
        let in_flight = sim.stats().fips_created;
        replicas[first].take().unwrap().terminate(Duration::ZERO).await;
        eprintln!("killed replica-{first} with {in_flight} FIPs created");
        assert!(
            usize::try_from(in_flight).unwrap() < SERVICES,
            "the burst was over before the kill: the test proves nothing"
        );
        creating.await.unwrap();
        let second = leader(&client, Some(first)).await;
        eprintln!("replica-{second} took over");

        let shown = eventually(Duration::from_secs(300), "every Service's ingress", || async {
            let shown = with_ingress(&api).await;
            (shown.len() == SERVICES).then_some(shown)
        })
        .await;

        // Every Service: exactly one FIP carrying its tags, the one its ingress shows.
        let fips = sim.peek_ips();
        let service_fips: Vec<_> = fips.iter().filter(|ip| common::is_service_fip(ip)).collect();
        for name in &names {
            let tags = service_fip_tags(NS, name, &cluster);
            let own: Vec<_> = service_fips.iter().filter(|ip| ip.has_tags(&tags)).collect();
            assert_eq!(own.len(), 1, "{name} has {} FIPs", own.len());
            assert_eq!(own[0].address.to_string(), shown[name], "{name}'s ingress");
        }
        // No FIP without its Service.
        assert_eq!(service_fips.len(), SERVICES, "orphaned FIPs");
        let stats = sim.stats();
        eprintln!(
            "created {}, deleted {}, duplicates {}, lost create answers {}",
            stats.fips_created, stats.fips_deleted, stats.duplicate_fips, stats.injected_errors
        );
        assert_eq!(stats.fips_deleted, 0, "a FIP of a live Service was deleted");
        assert_eq!(stats.duplicate_fips, 0, "a Service had two FIPs at once");
        assert_eq!(stats.fips_created, u64::try_from(SERVICES).unwrap());
        assert!(
            stats.injected_errors > 0,
            "no answer was lost: the test proves nothing"
        );
        let distinct: BTreeSet<&String> = shown.values().collect();
        assert_eq!(distinct.len(), SERVICES);
        for p in replicas.into_iter().flatten() {
            p.terminate(Duration::from_secs(5)).await;
        }
        sim.shutdown().await;
    });
}
