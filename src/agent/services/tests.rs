use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use rstest::rstest;
use serde_json::json;

use super::*;

const MIRROR: &str = "baton-kubernetes-external";

/// A Service `ns/name` with optional annotation value, class, loadBalancerIP and ingress IPs.
fn svc(
    ns: &str,
    name: &str,
    annotation: Option<&str>,
    class: Option<&str>,
    lb_ip: Option<&str>,
    ingress: &[&str],
) -> Arc<Service> {
    let mut annotations = serde_json::Map::new();
    if let Some(v) = annotation {
        annotations.insert("baton.dev/control-plane-endpoint".into(), json!(v));
    }
    let mut spec = serde_json::Map::new();
    spec.insert("type".into(), json!("LoadBalancer"));
    if let Some(c) = class {
        spec.insert("loadBalancerClass".into(), json!(c));
    }
    if let Some(ip) = lb_ip {
        spec.insert("loadBalancerIP".into(), json!(ip));
    }
    let ingress: Vec<_> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "annotations": annotations},
            "spec": spec,
            "status": {"loadBalancer": {"ingress": ingress}},
        }))
        .unwrap(),
    )
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[rstest]
#[case::annotated_spec_ip(svc("default", "api", Some("true"), None, Some("203.0.113.10"), &[]), &["203.0.113.10"])]
#[case::annotated_ingress_only(svc("default", "api", Some("true"), None, None, &["203.0.113.11"]), &["203.0.113.11"])]
#[case::both_fields_and_two_ingresses(
    svc("default", "api", Some("true"), None, Some("203.0.113.10"), &["203.0.113.10", "2001:db8::10"]),
    &["203.0.113.10", "2001:db8::10"]
)]
#[case::annotation_not_true(svc("default", "api", Some("false"), None, Some("203.0.113.10"), &[]), &[])]
#[case::annotation_not_exactly_true(svc("default", "api", Some("True"), None, Some("203.0.113.10"), &[]), &[])]
#[case::control_plane_class(
    svc("default", "api", None, Some("baton.dev/control-plane"), Some("203.0.113.12"), &[]),
    &["203.0.113.12"]
)]
#[case::other_class(svc("default", "web", None, Some("example.com/lb"), Some("203.0.113.13"), &[]), &[])]
#[case::the_mirror(svc("kube-system", MIRROR, None, None, None, &["203.0.113.14"]), &["203.0.113.14"])]
#[case::the_mirror_name_elsewhere(svc("default", MIRROR, None, None, None, &["203.0.113.14"]), &[])]
#[case::another_prefixs_mirror(svc("kube-system", "edge-kubernetes-external", None, None, None, &["203.0.113.15"]), &[])]
#[case::workload_service(svc("default", "web", None, None, Some("203.0.113.30"), &["203.0.113.30"]), &[])]
#[case::no_address_yet(svc("default", "api", Some("true"), None, None, &[]), &[])]
#[case::empty_spec_ip(svc("default", "api", Some("true"), None, Some(""), &["203.0.113.16"]), &["203.0.113.16"])]
fn control_plane_endpoints_give_their_fips(#[case] service: Arc<Service>, #[case] want: &[&str]) {
    let got = control_plane_fips(&[service], MIRROR);
    assert_eq!(got.fips, ips(want));
    assert!(got.problems.is_empty(), "{:?}", got.problems);
}

#[test]
fn several_services_give_the_union() {
    let services = [
        svc(
            "default",
            "api",
            Some("true"),
            None,
            Some("203.0.113.10"),
            &["203.0.113.10"],
        ),
        svc(
            "default",
            "api-int",
            Some("true"),
            None,
            Some("203.0.113.11"),
            &[],
        ),
        svc(
            "kube-system",
            MIRROR,
            None,
            Some("baton.dev/control-plane"),
            None,
            &["203.0.113.10"],
        ),
        svc("default", "web", None, None, None, &["203.0.113.30"]),
    ];
    assert_eq!(
        control_plane_fips(&services, MIRROR).fips,
        ips(&["203.0.113.10", "203.0.113.11"])
    );
}

#[rstest]
#[case::garbage(Some("not-an-ip"), &[], "Service default/api: spec.loadBalancerIP \"not-an-ip\" is not an IP address")]
#[case::cidr(None, &["203.0.113.0/24"], "Service default/api: status.loadBalancer.ingress[0].ip \"203.0.113.0/24\" is not an IP address")]
#[case::loopback(Some("127.0.0.1"), &[], "Service default/api: spec.loadBalancerIP 127.0.0.1 cannot be a Floating IP (loopback)")]
#[case::unspecified(None, &["203.0.113.9", "0.0.0.0"], "Service default/api: status.loadBalancer.ingress[1].ip 0.0.0.0 cannot be a Floating IP (unspecified)")]
#[case::multicast(Some("ff02::1"), &[], "Service default/api: spec.loadBalancerIP ff02::1 cannot be a Floating IP (multicast)")]
#[case::broadcast(Some("255.255.255.255"), &[], "Service default/api: spec.loadBalancerIP 255.255.255.255 cannot be a Floating IP (broadcast)")]
fn bad_addresses_are_named_and_skipped(
    #[case] lb_ip: Option<&str>,
    #[case] ingress: &[&str],
    #[case] problem: &str,
) {
    let services = [
        svc("default", "api", Some("true"), None, lb_ip, ingress),
        svc(
            "default",
            "api-int",
            Some("true"),
            None,
            Some("203.0.113.11"),
            &[],
        ),
    ];
    let got = control_plane_fips(&services, MIRROR);
    assert_eq!(got.problems.len(), 1, "{:?}", got.problems);
    assert_eq!(got.problems[0].to_string(), problem);
    // The good addresses are still accepted.
    assert!(got.fips.contains(&"203.0.113.11".parse::<IpAddr>().unwrap()));
    assert!(got.fips.iter().all(|ip| usable(*ip).is_ok()));
}

/// An annotated endpoint Service with these FIPs (spec, ingress) and holder address annotation.
fn held(name: &str, lb_ip: Option<&str>, ingress: &[&str], holder: Option<&str>) -> Arc<Service> {
    let svc = svc("default", name, Some("true"), None, lb_ip, ingress);
    let mut svc = Arc::unwrap_or_clone(svc);
    if let Some(h) = holder {
        svc.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend([
                ("baton.dev/fip-holder".to_owned(), "cp-1".to_owned()),
                ("baton.dev/fip-holder-address".to_owned(), h.to_owned()),
            ]);
    }
    Arc::new(svc)
}

fn holders(list: &[(&str, &[&str])]) -> BTreeMap<IpAddr, BTreeSet<IpAddr>> {
    list.iter()
        .map(|(fip, addrs)| (fip.parse().unwrap(), ips(addrs)))
        .collect()
}

#[rstest]
#[case::named(held("api", Some("203.0.113.10"), &[], Some("198.51.100.11")), &[("203.0.113.10", &["198.51.100.11"][..])])]
#[case::every_fip_of_the_service(
    held("api", Some("203.0.113.10"), &["203.0.113.11"], Some("198.51.100.11")),
    &[("203.0.113.10", &["198.51.100.11"][..]), ("203.0.113.11", &["198.51.100.11"][..])]
)]
#[case::only_fips_of_its_family(
    held("api", None, &["203.0.113.10", "2001:db8::10"], Some("198.51.100.11")),
    &[("203.0.113.10", &["198.51.100.11"][..])]
)]
#[case::not_named(held("api", Some("203.0.113.10"), &[], None), &[])]
#[case::empty(held("api", Some("203.0.113.10"), &[], Some(" ")), &[])]
#[case::no_fip_yet(held("api", None, &[], Some("198.51.100.11")), &[])]
fn the_holder_annotation_names_each_fips_holder(
    #[case] service: Arc<Service>,
    #[case] want: &[(&str, &[&str])],
) {
    let got = control_plane_fips(&[service], MIRROR);
    assert_eq!(got.holders, holders(want));
    assert!(got.problems.is_empty(), "{:?}", got.problems);
}

#[test]
fn a_workload_services_holder_annotation_does_not_count() {
    let mut svc = Arc::unwrap_or_clone(svc("default", "web", None, None, Some("203.0.113.30"), &[]));
    svc.metadata.annotations = Some(BTreeMap::from([(
        "baton.dev/fip-holder-address".to_owned(),
        "198.51.100.11".to_owned(),
    )]));
    assert_eq!(control_plane_fips(&[Arc::new(svc)], MIRROR), FipSet::default());
}

#[test]
fn services_that_disagree_about_a_holder_give_both() {
    let mut all = FipSet::default();
    for s in [
        held("api", Some("203.0.113.10"), &[], Some("198.51.100.11")),
        held("api-copy", Some("203.0.113.10"), &[], Some("198.51.100.12")),
    ] {
        all.merge(&control_plane_fips(&[s], MIRROR));
    }
    assert_eq!(
        all.holders,
        holders(&[("203.0.113.10", &["198.51.100.11", "198.51.100.12"][..])])
    );
    assert_eq!(all.fips, ips(&["203.0.113.10"]));
}

#[rstest]
#[case::garbage(
    "cp-1",
    "Service default/api: annotation baton.dev/fip-holder-address \"cp-1\" is not an IP address"
)]
#[case::cidr(
    "198.51.100.11/32",
    "Service default/api: annotation baton.dev/fip-holder-address \"198.51.100.11/32\" is not an IP address"
)]
#[case::loopback(
    "127.0.0.1",
    "Service default/api: annotation baton.dev/fip-holder-address 127.0.0.1 cannot be a server's address (loopback)"
)]
#[case::unspecified(
    "0.0.0.0",
    "Service default/api: annotation baton.dev/fip-holder-address 0.0.0.0 cannot be a server's address (unspecified)"
)]
fn a_bad_holder_address_is_named_and_the_fip_still_accepted(#[case] holder: &str, #[case] problem: &str) {
    let got = control_plane_fips(&[held("api", Some("203.0.113.10"), &[], Some(holder))], MIRROR);
    assert_eq!(got.fips, ips(&["203.0.113.10"]));
    assert!(got.holders.is_empty(), "{:?}", got.holders);
    assert_eq!(got.problems.len(), 1, "{:?}", got.problems);
    assert_eq!(got.problems[0].to_string(), problem);
}

#[test]
fn the_mirror_name_follows_the_prefix() {
    assert_eq!(mirror_name("baton"), MIRROR);
    assert_eq!(mirror_name("edge"), "edge-kubernetes-external");
}
