use serde_json::json;

use super::*;
use crate::controller::service::facts_of;
use crate::controller::service::plan::ServiceFacts;

const MIRROR: (&str, &str) = ("kube-system", "baton-kubernetes-external");

fn cand(key: &str, created: i64) -> Candidate {
    Candidate {
        key: key.into(),
        created,
    }
}

#[test]
fn the_budget_keeps_the_oldest_services() {
    let all = vec![
        cand("a/new", 30),
        cand("a/old", 10),
        cand("b/mid", 20),
        cand("a/mid", 20),
    ];
    let got = admit(all.clone(), Some(2));
    assert_eq!(
        got.admitted,
        ["a/old", "a/mid"].iter().map(|s| (*s).to_owned()).collect()
    );
    assert_eq!(got.refused, vec!["b/mid".to_owned(), "a/new".to_owned()]);
    assert!(admit(all.clone(), None).refused.is_empty());
    assert_eq!(admit(all, Some(0)).admitted.len(), 0);
}

#[allow(clippy::needless_pass_by_value)] // called with json! literals
fn k8s_service(
    name: &str,
    created: &str,
    extra: serde_json::Value,
) -> std::sync::Arc<k8s_openapi::api::core::v1::Service> {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "apps", "creationTimestamp": created},
        "spec": {"type": "LoadBalancer"},
    });
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in extra {
            if k == "metadata" {
                for (mk, mv) in val.as_object().unwrap() {
                    obj["metadata"][mk] = mv.clone();
                }
            } else {
                obj.insert(k.clone(), val.clone());
            }
        }
    }
    std::sync::Arc::new(serde_json::from_value(v).unwrap())
}

#[test]
fn the_budget_counts_only_managed_live_load_balancers() {
    let services = [
        // Older, but not baton's to announce: a control-plane endpoint, an opted-out one, one
        // being deleted, a ClusterIP.
        k8s_service(
            "api",
            "2026-01-01T00:00:00Z",
            json!({"metadata": {"annotations": {"baton.dev/control-plane-endpoint": "true"}}}),
        ),
        k8s_service(
            "mine",
            "2026-01-01T00:00:01Z",
            json!({"metadata": {"annotations": {"cherryservers.com/loadbalancer-managed": "false"}}}),
        ),
        k8s_service(
            "going",
            "2026-01-01T00:00:02Z",
            json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z", "finalizers": ["x"]}}),
        ),
        k8s_service(
            "plain",
            "2026-01-01T00:00:03Z",
            json!({"spec": {"type": "ClusterIP"}}),
        ),
        k8s_service("web", "2026-01-01T00:00:05Z", json!({})),
        k8s_service("db", "2026-01-01T00:00:04Z", json!({})),
    ];
    let facts: Vec<ServiceFacts> = services.iter().map(|s| facts_of(s)).collect();
    let got = admitted(&facts, MIRROR, &BTreeSet::new(), &BTreeSet::new(), Some(1));
    assert_eq!(got.admitted.iter().collect::<Vec<_>>(), vec!["apps/db"]);
    assert_eq!(got.refused, vec!["apps/web".to_owned()]);
    assert!(got.refuses("apps/web"));
    assert!(!got.refuses("apps/db"));
    assert!(
        !got.refuses("apps/going"),
        "a Service being deleted is not counted"
    );
    let unlimited = admitted(&facts, MIRROR, &BTreeSet::new(), &BTreeSet::new(), None);
    assert!(unlimited.refused.is_empty());
}

#[test]
fn a_service_asking_for_a_control_plane_address_takes_no_slot() {
    let services = [
        k8s_service(
            "leftover",
            "2026-01-01T00:00:00Z",
            json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "203.0.113.1"}}),
        ),
        k8s_service("web", "2026-01-01T00:00:05Z", json!({})),
    ];
    let facts: Vec<ServiceFacts> = services.iter().map(|s| facts_of(s)).collect();
    let none = admitted(&facts, MIRROR, &BTreeSet::new(), &BTreeSet::new(), Some(1));
    assert!(
        none.refuses("apps/web"),
        "without the control-plane addresses it is counted"
    );
    let cp = BTreeSet::from(["203.0.113.1".parse().unwrap()]);
    let got = admitted(&facts, MIRROR, &cp, &BTreeSet::new(), Some(1));
    assert_eq!(got.admitted.iter().collect::<Vec<_>>(), vec!["apps/web"]);
    assert!(got.refused.is_empty());
}

#[test]
fn a_service_whose_request_is_refused_takes_no_slot() {
    let services = [
        k8s_service(
            "tenant",
            "2026-01-01T00:00:00Z",
            json!({"spec": {"type": "LoadBalancer", "loadBalancerIP": "203.0.113.66"}}),
        ),
        k8s_service("web", "2026-01-01T00:00:05Z", json!({})),
    ];
    let facts: Vec<ServiceFacts> = services.iter().map(|s| facts_of(s)).collect();
    let refused = BTreeSet::from(["apps/tenant".to_owned()]);
    let got = admitted(&facts, MIRROR, &BTreeSet::new(), &refused, Some(1));
    assert_eq!(got.admitted.iter().collect::<Vec<_>>(), vec!["apps/web"]);
    assert!(got.refused.is_empty());
}
