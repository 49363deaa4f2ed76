//! The shipped API Priority and Fairness objects (`manifests/apf.yaml`) against a real
//! kube-apiserver with APF on and small limits: under a load that fills the priority levels
//! where a cluster's workloads (`workload-low`) and every kube-system controller's Lease traffic
//! (`leader-election`) go, baton's Lease renewals queue for seconds without them, and are
//! answered at once with them.
//!
//! ```text
//!  LoadGen: 64 workload writers ──▶ workload-low      ┐ each write held 300/200 ms by a slow
//!           48 kube-system Lease renewers ──▶ leader-election ┘ admission webhook
//!  baton's ServiceAccount: GET + PUT of kube-system/baton-controller (a renewal)
//!       without manifests/apf.yaml ──▶ leader-election (queued)
//!       with it ──▶ FlowSchema baton ──▶ priority level baton (its own seats)
//! ```
#![allow(clippy::unwrap_used)] // in tests a panic is the failure report

mod common;

use std::time::Duration;

use baton_testbed::load::{self, quantile};
use baton_testbed::{ControlPlane, Load, LoadGen, Options, Work, lab};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::time::Instant;

async fn flow_schema_uid(cp: &ControlPlane, name: &str) -> String {
    Api::<FlowSchema>::all(cp.client(0).unwrap())
        .get(name)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

fn show(v: &[Duration]) -> String {
    format!(
        "p50 {:?} p90 {:?} max {:?}",
        quantile(v, 0.5),
        quantile(v, 0.9),
        quantile(v, 1.0)
    )
}

#[test]
fn the_shipped_flowschema_keeps_batons_lease_renewals_out_of_the_queues_of_a_busy_cluster() {
    lab::run(|| async {
        let user = load::baton_user("baton-lab-apf-baton-sa");
        let cp = ControlPlane::start(Options {
            apf: true,
            users: vec![user.clone()],
            ..Options::servers(1)
        })
        .await
        .unwrap();
        let admin = cp.client(0).unwrap();
        // baton's own rights on its Lease (manifests/rbac.yaml), and the Lease.
        common::apply_shipped_manifests(&admin, &["rbac.yaml"]).await;
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "baton-controller", "namespace": "kube-system"},
            "spec": {"holderIdentity": "cp-0", "leaseDurationSeconds": 1}
        }))
        .unwrap();
        Api::<Lease>::namespaced(admin.clone(), "kube-system")
            .patch(
                "baton-controller",
                &PatchParams::apply("apf-test"),
                &Patch::Apply(&lease),
            )
            .await
            .unwrap();
        let http = baton_testbed::http_client(Some(cp.ca_der())).unwrap();
        let (idle, schema) = load::lease_renewals(&cp, &http, &user.token, 10).await.unwrap();
        assert_eq!(
            schema,
            flow_schema_uid(&cp, "system-leader-election").await,
            "without manifests/apf.yaml baton's Lease updates go where every kube-system controller's go"
        );

        // A busy cluster: workloads fill workload-low (which then lends no seats), other
        // kube-system controllers renewing their Leases fill leader-election; every write of
        // theirs is held by a slow webhook.
        let workloads = LoadGen::start(
            &cp,
            0,
            Load {
                workers: 64,
                ..Load::default()
            },
        )
        .await
        .unwrap();
        let leases = LoadGen::start(
            &cp,
            0,
            Load {
                work: Work::Leases,
                users: load::kube_system_users().to_vec(),
                workers: 48,
                webhook_delay: Duration::from_millis(300),
            },
        )
        .await
        .unwrap();
        // APF adjusts what each priority level borrows every 10 s: let it settle.
        tokio::time::sleep(Duration::from_secs(12)).await;
        let (queued, _) = load::lease_renewals(&cp, &http, &user.token, 20).await.unwrap();

        common::apply_shipped_manifests(&admin, &["apf.yaml"]).await;
        let ours = flow_schema_uid(&cp, "baton").await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while load::renew_lease(&cp, &http, &user.token).await.unwrap().1 != ours {
            assert!(
                Instant::now() < deadline,
                "the API server did not take up the shipped FlowSchema baton"
            );
        }
        let (lifted, schema) = load::lease_renewals(&cp, &http, &user.token, 20).await.unwrap();
        let lease_load = leases.stop().await.unwrap();
        let workload = workloads.stop().await.unwrap();
        eprintln!(
            "baton's Lease renewals (GET + PUT): idle {}; under the load without manifests/apf.yaml {}; \
             with it {}. The other controllers' Lease load: {} requests, {} throttled, writes p50 {:?}; \
             the workloads: {} requests, {} throttled",
            show(&idle),
            show(&queued),
            show(&lifted),
            lease_load.requests,
            lease_load.throttled,
            lease_load.write_quantile(0.5),
            workload.requests,
            workload.throttled,
        );
        assert_eq!(schema, ours, "every renewal matched FlowSchema baton");
        // Without the FlowSchema a renewal waits for a seat of leader-election, each held 300 ms
        // by a load write: far past the 300 ms a renew attempt may take.
        assert!(
            quantile(&queued, 0.9) >= Duration::from_millis(500),
            "the load did not queue baton's renewals (the contrast is lost): {}",
            show(&queued)
        );
        // With it, a renewal is not queued: it fits a renew attempt (300 ms) with room.
        assert!(
            quantile(&lifted, 0.9) * 5 < quantile(&queued, 0.9)
                && quantile(&lifted, 0.9) < Duration::from_millis(300),
            "the shipped FlowSchema did not lift baton's renewals: without {}, with {}",
            show(&queued),
            show(&lifted)
        );
    });
}
