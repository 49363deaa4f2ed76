//! The test bed itself: three real kube-apiservers on three lab addresses over one etcd.

use std::collections::BTreeSet;
use std::time::Duration;

use baton_testbed::{ControlPlane, Options, lab};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};

#[test]
fn three_apiservers_share_one_etcd_and_list_themselves_in_default_kubernetes() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options::servers(3))
            .await
            .expect("control plane");

        // A Service created through the first API server …
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "probe", "namespace": "default"},
            "spec": {"ports": [{"port": 443, "targetPort": 6443}]}
        }))
        .unwrap();
        Api::<Service>::namespaced(cp.client(0).unwrap(), "default")
            .create(&PostParams::default(), &svc)
            .await
            .expect("create through apiserver 0");

        // … is read back through the other two.
        for i in 1..3 {
            let got = Api::<Service>::namespaced(cp.client(i).unwrap(), "default")
                .get("probe")
                .await
                .unwrap_or_else(|e| panic!("get through apiserver {i}: {e}"));
            assert_eq!(got.spec.unwrap().ports.unwrap()[0].port, 443);
        }

        // Every API server adds its own advertise address to default/kubernetes (lease reconciler).
        let want: BTreeSet<String> = cp.addresses().iter().map(ToString::to_string).collect();
        let slices = Api::<EndpointSlice>::namespaced(cp.client(2).unwrap(), "default");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let lp = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
            let got: BTreeSet<String> = slices
                .list(&lp)
                .await
                .unwrap()
                .items
                .into_iter()
                .flat_map(|s| s.endpoints)
                .flat_map(|e| e.addresses)
                .collect();
            if got == want {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "default/kubernetes EndpointSlice lists {got:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}
