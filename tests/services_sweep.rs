//! The orphan sweep against a real API server and the simulator: it waits a minute into the
//! term, then releases FIPs whose Service is gone, checking each again right before its delete;
//! a Service deleted and re-created under the same name while the sweep runs keeps its FIP.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::sync::Arc;
use std::time::Duration;

use baton::controller::Context;
use baton::controller::service::{self, FIP_ID_ANNOTATION, SWEEP_QUIET};
use baton::controller::watches::Watches;
use baton_cloud::Cloud as _;
use baton_cloud::model::CreateIpRequest;
use baton_cloud::tags::service_fip_tags;
use baton_sim::{Faults, Topology};
use baton_testbed::lab;
use common::{eventually, ingress, lb_service, namespace};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use tokio::sync::watch;
use tokio::time::Instant;

/// FIPs whose Service is gone when the sweep begins (at baton's 4 requests/s, a read and a
/// delete each: the sweep takes about 20 s).
const ORPHANS: usize = 40;

/// The Service controller and its watches; they stop when `true` is sent, and the handles end
/// once they have.
fn start(ctx: Arc<Context>) -> (watch::Sender<bool>, [tokio::task::JoinHandle<()>; 2]) {
    let (tx, rx) = watch::channel(false);
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut watches = Watches::new(&ctx.client);
    let services = tokio::spawn(service::run_services(ctx, &mut watches, stop(rx.clone())));
    let watching = tokio::spawn(watches.run(stop(rx)));
    (tx, [services, watching])
}

#[test]
fn a_service_recreated_while_the_sweep_runs_keeps_its_fip() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                // Cherry's limit: the sweep's reads and deletes take their time.
                ("BATON_API_RATE_LIMIT", "4"),
            ],
        );
        let ctx = common::context(client.clone(), &env).await;
        let cluster = ctx.cluster_id.clone();
        namespace(&client, "apps").await;
        let api: Api<Service> = Api::namespaced(client.clone(), "apps");
        // FIPs of this cluster's Services that no longer exist (their finalizer never ran).
        let cloud = common::unlimited_client(&sim);
        for i in 0..ORPHANS {
            cloud
                .create_ip(CreateIpRequest {
                    region: "LT-Siauliai".into(),
                    tags: service_fip_tags("apps", &format!("gone-{i}"), &cluster),
                    ..CreateIpRequest::default()
                })
                .await
                .unwrap();
        }
        let first = start(ctx.clone());

        // web gets its FIP, then vanishes without its cleanup (as kubernetes#77988 allows)
        // while no controller runs (a running one would put its finalizer back between the
        // strip and the delete, and clean up): its FIP is an orphan too, the last one in the
        // list. The controllers then start again, a new term.
        api.create(&PostParams::default(), &lb_service("apps", "web", &[]))
            .await
            .unwrap();
        let web = eventually(Duration::from_secs(60), "web's ingress", || async {
            api.get_opt("web").await.unwrap().filter(|s| ingress(s).is_some())
        })
        .await;
        let fip_id = web.annotations()[FIP_ID_ANNOTATION].clone();
        let address = ingress(&web).unwrap();
        let (first, running) = first;
        first.send_replace(true);
        for task in running {
            task.await.unwrap();
        }
        let strip = serde_json::json!({"metadata": {"finalizers": null}});
        api.patch("web", &PatchParams::default(), &Patch::Merge(&strip))
            .await
            .unwrap();
        api.delete("web", &DeleteParams::default()).await.unwrap();
        eventually(Duration::from_secs(30), "web gone", || async {
            api.get_opt("web").await.unwrap().is_none().then_some(())
        })
        .await;
        assert!(sim.peek_ip(&fip_id).is_some(), "no cleanup ran");
        let started = Instant::now();
        let (stop, _running) = start(ctx.clone());

        // Nothing is swept in the first minute of the term.
        tokio::time::sleep_until(started + SWEEP_QUIET - Duration::from_secs(5)).await;
        assert_eq!(sim.stats().fips_deleted, 0, "swept in the first minute of a term");

        // The sweep runs; web comes back under the same name before it reaches web's FIP, and
        // adopts it (found by its tags).
        eventually(Duration::from_secs(60), "the sweep under way", || async {
            (sim.stats().fips_deleted >= 3).then_some(())
        })
        .await;
        assert!(
            sim.stats().fips_deleted < 20,
            "the sweep went too fast for this test"
        );
        api.create(&PostParams::default(), &lb_service("apps", "web", &[]))
            .await
            .unwrap();
        let back = eventually(Duration::from_secs(60), "web's ingress again", || async {
            api.get_opt("web").await.unwrap().filter(|s| ingress(s).is_some())
        })
        .await;
        assert_eq!(ingress(&back), Some(address), "the same address");

        // The sweep finishes: every orphan released, web's FIP kept.
        eventually(Duration::from_secs(90), "every orphan released", || async {
            (sim.stats().fips_deleted >= u64::try_from(ORPHANS).unwrap()).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            sim.stats().fips_deleted,
            u64::try_from(ORPHANS).unwrap(),
            "only the orphans were deleted"
        );
        assert!(sim.peek_ip(&fip_id).is_some(), "web's FIP was released");
        let deletes_of_web = sim
            .log(0)
            .iter()
            .filter(|e| e.method == "DELETE" && e.path.ends_with(&fip_id))
            .count();
        assert_eq!(deletes_of_web, 0);
        assert_eq!(
            api.get("web").await.unwrap().annotations()[FIP_ID_ANNOTATION],
            fip_id
        );
        stop.send_replace(true);
        sim.shutdown().await;
    });
}
