use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

const MIRROR: &str = "baton-kubernetes-external";

fn svc(name: &str, annotated: bool, ip: &str) -> Service {
    let annotations = if annotated {
        json!({"baton.dev/control-plane-endpoint": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "metadata": {"namespace": "default", "name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "loadBalancerIP": ip},
    }))
    .unwrap()
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// `svc` naming `holder` as its FIP's holder.
fn holding(mut svc: Service, holder: &str) -> Service {
    svc.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("baton.dev/fip-holder-address".into(), holder.into());
    svc
}

#[test]
fn the_index_follows_lists_applies_and_deletes() {
    let mut index = Index::default();
    // The first list: nothing counts before InitDone.
    assert!(!index.apply(Event::Init, MIRROR));
    assert!(!index.apply(Event::InitApply(svc("api", true, "203.0.113.10")), MIRROR));
    assert!(!index.apply(Event::InitApply(svc("web", false, "203.0.113.30")), MIRROR));
    assert!(index.fips().fips.is_empty());
    assert!(index.apply(Event::InitDone, MIRROR));
    assert_eq!(index.fips().fips, ips(&["203.0.113.10"]));
    assert_eq!(index.current.len(), 1, "only control-plane endpoints are kept");

    // A new endpoint, a changed one, a workload Service that becomes one.
    assert!(index.apply(Event::Apply(svc("api-int", true, "203.0.113.11")), MIRROR));
    assert!(index.apply(Event::Apply(svc("api", true, "203.0.113.12")), MIRROR));
    assert!(index.apply(Event::Apply(svc("web", true, "203.0.113.30")), MIRROR));
    assert_eq!(
        index.fips().fips,
        ips(&["203.0.113.11", "203.0.113.12", "203.0.113.30"])
    );
    // An endpoint that stops being one, and a deletion.
    index.apply(Event::Apply(svc("web", false, "203.0.113.30")), MIRROR);
    index.apply(Event::Delete(svc("api-int", true, "203.0.113.11")), MIRROR);
    assert_eq!(index.fips().fips, ips(&["203.0.113.12"]));

    // A relist (after a watch error): the old index serves until the new one is complete, and
    // what the relist no longer shows is gone.
    index.apply(Event::Init, MIRROR);
    index.apply(Event::InitApply(svc("api-2", true, "203.0.113.13")), MIRROR);
    assert_eq!(index.fips().fips, ips(&["203.0.113.12"]));
    index.apply(Event::InitDone, MIRROR);
    assert_eq!(index.fips().fips, ips(&["203.0.113.13"]));
}

#[test]
fn the_index_follows_the_holder_annotations() {
    let mut index = Index::default();
    index.apply(Event::Init, MIRROR);
    index.apply(Event::InitApply(svc("api", true, "203.0.113.10")), MIRROR);
    index.apply(Event::InitDone, MIRROR);
    assert!(index.fips().holders.is_empty());
    // The leader names the holder, then moves it.
    assert!(index.apply(
        Event::Apply(holding(svc("api", true, "203.0.113.10"), "198.51.100.11")),
        MIRROR
    ));
    let fip: IpAddr = "203.0.113.10".parse().unwrap();
    assert_eq!(index.fips().holders[&fip], ips(&["198.51.100.11"]));
    index.apply(
        Event::Apply(holding(svc("api", true, "203.0.113.10"), "198.51.100.12")),
        MIRROR,
    );
    assert_eq!(index.fips().holders[&fip], ips(&["198.51.100.12"]));
    // A bad one is a problem, not a holder; what is published carries no problems.
    index.apply(
        Event::Apply(holding(svc("api", true, "203.0.113.10"), "cp-2")),
        MIRROR,
    );
    assert!(index.fips().holders.is_empty());
    assert!(index.fips().problems.is_empty());
    assert_eq!(index.problems().len(), 1);
}

#[test]
fn problems_are_listed_once_per_address() {
    let mut index = Index::default();
    index.apply(Event::Init, MIRROR);
    index.apply(Event::InitApply(svc("api", true, "not-an-ip")), MIRROR);
    index.apply(Event::InitDone, MIRROR);
    assert!(index.fips().fips.is_empty());
    let problems: Vec<String> = index.problems().into_iter().collect();
    assert_eq!(
        problems,
        vec!["Service default/api: spec.loadBalancerIP \"not-an-ip\" is not an IP address"]
    );
}

#[test]
fn the_watch_status_says_why_it_is_not_ready() {
    let status = WatchStatus::default();
    assert_eq!(status.not_ready().as_deref(), Some("Services not listed yet"));
    status.set(|s| s.listed = true);
    assert_eq!(status.not_ready(), None);
    status.set(|s| s.error = Some("connection refused".into()));
    assert_eq!(
        status.not_ready().as_deref(),
        Some("watching Services: connection refused")
    );
}
