//! The mirror Service against a real control plane: it lists exactly the API servers that
//! `default/kubernetes` lists, and follows them when one stops.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

use std::collections::BTreeSet;
use std::time::Duration;

use baton::controller::mirror::{self, MirrorSpec};
use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

async fn slice_addresses(client: &kube::Client, ns: &str, service: &str) -> BTreeSet<String> {
    Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .expect("list EndpointSlices")
        .items
        .into_iter()
        .flat_map(|s| s.endpoints)
        .flat_map(|e| e.addresses)
        .collect()
}

/// Reconciles until the mirror lists `want` (the apiservers' lease reconciler is periodic).
async fn converge(cp: &ControlPlane, client_of: usize, spec: &MirrorSpec, want: &BTreeSet<String>) {
    let client = cp.client(client_of).expect("client");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        mirror::reconcile(&client, spec).await.expect("reconcile");
        let source = slice_addresses(&client, "default", "kubernetes").await;
        let mirrored = slice_addresses(&client, "kube-system", &spec.name).await;
        if &source == want && &mirrored == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "default/kubernetes {source:?}, mirror {mirrored:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[test]
fn mirror_service_follows_default_kubernetes() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options::servers(3)).await.unwrap();
        let spec = MirrorSpec::new("baton", "203.0.113.5".parse().unwrap(), 0);
        let all: BTreeSet<String> = cp.addresses().iter().map(ToString::to_string).collect();
        converge(&cp, 1, &spec, &all).await;

        let client = cp.client(1).unwrap();
        let svc = Api::<Service>::namespaced(client.clone(), "kube-system")
            .get(&spec.name)
            .await
            .unwrap();
        let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
        assert_eq!(ingress[0].ip.as_deref(), Some("203.0.113.5"));
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("Proxy"));
        let s = svc.spec.unwrap();
        assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(s.ports.unwrap()[0].port, 6443);
        let eps = Api::<Endpoints>::namespaced(client.clone(), "kube-system")
            .get(&spec.name)
            .await
            .unwrap();
        let ips: BTreeSet<String> = eps
            .subsets
            .unwrap_or_default()
            .into_iter()
            .flat_map(|s| s.addresses.unwrap_or_default())
            .map(|a| a.ip)
            .collect();
        assert_eq!(ips, all, "Endpoints mirror default/kubernetes too");

        // A stopped API server leaves default/kubernetes, and then the mirror.
        cp.stop_apiserver(0).await.unwrap();
        let rest: BTreeSet<String> = cp.addresses()[1..].iter().map(ToString::to_string).collect();
        converge(&cp, 1, &spec, &rest).await;

        // Reconciling again changes nothing (idempotent) and leaves no stale slice behind.
        mirror::reconcile(&client, &spec).await.unwrap();
        let n = Api::<EndpointSlice>::namespaced(client, "kube-system")
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={}", spec.name)))
            .await
            .unwrap()
            .items
            .len();
        assert_eq!(n, 1);
    });
}
