//! Test fixtures shared by the endpoint manager's tests: FIPs, endpoint Services, the policy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_cloud::model::IpAddress;
use k8s_openapi::api::core::v1::Service;

use super::ENDPOINT_FINALIZER;
use crate::controller::mirror::CONTROL_PLANE_ENDPOINT_ANNOTATION;
use crate::controller::trust::EndpointPolicy;

pub(super) fn fip_at(address: &str, target: Option<u64>, tags: &[(&str, &str)]) -> IpAddress {
    serde_json::from_value(serde_json::json!({
        "id": format!("id-{address}"),
        "address": address,
        "type": "floating-ip",
        "targeted_to": target.map(|t| serde_json::json!({"id": t})),
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap()
}

pub(super) fn endpoint_svc(
    ns: &str,
    name: &str,
    lb_ip: &str,
    finalizer: bool,
    deleting: bool,
    annotated: bool,
) -> Arc<Service> {
    let mut meta = serde_json::json!({
        "name": name, "namespace": ns, "resourceVersion": "7",
        "annotations": if annotated { serde_json::json!({CONTROL_PLANE_ENDPOINT_ANNOTATION: "true"}) } else { serde_json::json!({}) },
    });
    if finalizer {
        meta["finalizers"] = serde_json::json!([ENDPOINT_FINALIZER]);
    }
    if deleting {
        meta["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
    }
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "spec": {"type": "LoadBalancer", "loadBalancerIP": lb_ip},
        }))
        .unwrap(),
    )
}

/// This cluster's id in the tests' `cluster` tags.
pub(super) const CLUSTER: &str = "uid-1";

/// Endpoints allowed in `kube-system` and `default`; FIPs tagged `cluster=uid-1` are ours.
pub(super) fn policy(fip_tag: Option<&str>) -> EndpointPolicy {
    EndpointPolicy {
        namespaces: ["kube-system".to_owned(), "default".to_owned()].into(),
        cluster_id: CLUSTER.to_owned(),
        fip_tag: fip_tag.map(|t| t.parse().unwrap()),
        adopted: BTreeSet::new(),
    }
}
