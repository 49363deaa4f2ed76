//! What a Service hands to the load balancer, in every load-balancer mode (no I/O).

use std::collections::BTreeMap;

use baton_cloud::CloudKind;
use baton_cloud::tags::{USAGE_VALUE, service_tag_on};
use rstest::rstest;

use super::*;
use crate::config::ServiceAllocation;
use crate::controller::service::plan::{FIP_ADDRESS_ANNOTATION, FIP_ID_ANNOTATION};

const CLUSTER: &str = "6f1c-uid";

fn fip(address: &str, tags: &[(&str, &str)]) -> IpAddress {
    serde_json::from_value(serde_json::json!({
        "id": format!("id-{address}"),
        "address": address,
        "cidr": format!("{address}/32"),
        "type": "floating-ip",
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap()
}

fn svc(ns: &str, name: &str, annotations: &[(&str, &str)], lb_ip: Option<&str>) -> ServiceFacts {
    ServiceFacts {
        namespace: ns.into(),
        name: name.into(),
        type_: Some("LoadBalancer".into()),
        load_balancer_ip: lb_ip.map(str::to_owned),
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..ServiceFacts::default()
    }
}

fn project() -> Vec<IpAddress> {
    let web = service_tag_on(CloudKind::Cherry, "apps", "web");
    vec![
        fip("203.0.113.10", &[("cluster", CLUSTER)]),
        fip(
            "203.0.113.11",
            &[("usage", USAGE_VALUE), ("service", &web), ("cluster", CLUSTER)],
        ),
        fip("203.0.113.20", &[("cluster", "other-cluster-uid")]),
        fip("203.0.113.30", &[]),
    ]
}

fn policy(namespaces: &[&str]) -> AddressPolicy {
    AddressPolicy {
        cloud: CloudKind::Cherry,
        cluster_id: CLUSTER.into(),
        adopted: std::collections::BTreeSet::new(),
        allocation: ServiceAllocation {
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            namespace_selector: None,
        },
    }
}

fn mode(m: &str) -> LoadBalancerMode {
    m.parse().unwrap()
}

fn handoff(p: &AddressPolicy, f: &ServiceFacts, m: &str) -> Handoff {
    let ips = project();
    let services = vec![f.clone()];
    Judge::new(p, &ips, None, &services).handoff(f, &mode(m))
}

fn reason(h: &Handoff) -> Option<&'static str> {
    match h {
        Handoff::Refused { refusal, .. } => Some(refusal.reason()),
        _ => None,
    }
}

/// The same request, read where each implementation reads it, gets the same verdict.
#[rstest]
#[case::metallb("metallb:///", "metallb.io/loadBalancerIPs")]
#[case::metallb_legacy("metallb:///", "metallb.universe.tf/loadBalancerIPs")]
#[case::kube_vip("kube-vip://", "kube-vip.io/loadbalancerIPs")]
#[case::empty("empty://", "cherryservers.com/loadBalancerIPs")]
#[case::hetzner("empty://?ip-annotation=baton.dev/floating-ips", "baton.dev/floating-ips")]
#[case::spec("metallb:///", "spec.loadBalancerIP")]
fn every_mode_refuses_what_is_not_this_clusters(#[case] m: &str, #[case] field: &str) {
    let p = policy(&["apps"]);
    let ask = |ns: &str, address: &str| {
        if field == "spec.loadBalancerIP" {
            svc(ns, "x", &[], Some(address))
        } else {
            svc(ns, "x", &[(field, address)], None)
        }
    };
    assert_eq!(
        handoff(&p, &ask("apps", "203.0.113.10"), m),
        Handoff::Address("203.0.113.10".parse().unwrap())
    );
    for (ns, address, want) in [
        ("apps", "203.0.113.20", "FloatingIPNotOwned"),
        ("apps", "203.0.113.30", "FloatingIPNotOwned"),
        ("apps", "192.0.2.200", "AddressNotInProject"),
        ("apps", "203.0.113.11", "FloatingIPOfAnotherService"),
        ("tenant", "203.0.113.10", "AddressNamespaceNotAllowed"),
    ] {
        let h = handoff(&p, &ask(ns, address), m);
        assert_eq!(
            reason(&h),
            Some(want),
            "{ns} asking for {address} in {field}: {h:?}"
        );
        let Handoff::Refused { refusal, keeps } = h else {
            unreachable!()
        };
        assert!(refusal.to_string().contains(field), "{refusal}");
        assert_eq!(keeps, None);
    }
}

#[test]
fn a_services_own_fip_is_handed_over_in_a_namespace_that_may_not_ask() {
    // baton wrote its own FIP's address into apps/web's IP annotation.
    let web = svc(
        "apps",
        "web",
        &[
            ("metallb.io/loadBalancerIPs", "203.0.113.11"),
            (FIP_ID_ANNOTATION, "id-203.0.113.11"),
            (FIP_ADDRESS_ANNOTATION, "203.0.113.11"),
        ],
        None,
    );
    assert_eq!(
        handoff(&policy(&["elsewhere"]), &web, "metallb:///"),
        Handoff::Address("203.0.113.11".parse().unwrap())
    );
}

#[test]
fn a_refused_request_keeps_the_services_own_fip_and_a_typo_too() {
    let asks = |value: &str| {
        svc(
            "apps",
            "web",
            &[
                ("metallb.io/loadBalancerIPs", value),
                (FIP_ID_ANNOTATION, "id-203.0.113.11"),
                (FIP_ADDRESS_ANNOTATION, "203.0.113.11"),
            ],
            None,
        )
    };
    let p = policy(&[]);
    let h = handoff(&p, &asks("203.0.113.20"), "metallb:///");
    assert_eq!(reason(&h), Some("FloatingIPNotOwned"));
    assert_eq!(h.address(), Some("203.0.113.11".parse().unwrap()));
    assert_eq!(
        handoff(&p, &asks("not-an-ip"), "metallb:///"),
        Handoff::Address("203.0.113.11".parse().unwrap())
    );
    // A record naming a FIP that is not the Service's own (written by whoever may edit the
    // Service) keeps nothing.
    let forged = svc(
        "apps",
        "x",
        &[
            ("metallb.io/loadBalancerIPs", "203.0.113.20"),
            (FIP_ID_ANNOTATION, "id-203.0.113.10"),
            (FIP_ADDRESS_ANNOTATION, "203.0.113.10"),
        ],
        None,
    );
    let h = handoff(&p, &forged, "metallb:///");
    assert_eq!(reason(&h), Some("FloatingIPNotOwned"));
    assert_eq!(h.address(), None);
    assert_eq!(
        handoff(&p, &svc("apps", "x", &[], None), "metallb:///"),
        Handoff::Nothing
    );
}

#[test]
fn a_fip_reserved_for_a_service_is_shared_within_its_namespace_only() {
    let ips = project();
    let p = policy(&[]);
    let web = svc("apps", "web", &[], None);
    let udp = svc("apps", "web-udp", &[], Some("203.0.113.11"));
    let other = svc("tenant", "web-udp", &[], Some("203.0.113.11"));
    let services = vec![web, udp.clone(), other.clone()];
    let judge = Judge::new(&p, &ips, None, &services);
    let m = mode("metallb:///");
    assert_eq!(
        judge.handoff(&udp, &m),
        Handoff::Address("203.0.113.11".parse().unwrap())
    );
    assert_eq!(
        reason(&judge.handoff(&other, &m)),
        Some("FloatingIPOfAnotherService")
    );
    // apps/web gone: its held FIP is nobody's to take, not even within the namespace.
    let services = vec![udp.clone()];
    let judge = Judge::new(&p, &ips, None, &services);
    assert_eq!(
        reason(&judge.handoff(&udp, &m)),
        Some("FloatingIPOfAnotherService")
    );
}

#[test]
fn a_namespace_selector_reads_the_namespaces_labels() {
    let ips = project();
    let p = AddressPolicy {
        allocation: ServiceAllocation {
            namespaces: std::collections::BTreeSet::new(),
            namespace_selector: Some("team=web".parse().unwrap()),
        },
        ..policy(&[])
    };
    let labels: BTreeMap<String, BTreeMap<String, String>> =
        [("shop".to_owned(), [("team".to_owned(), "web".to_owned())].into())].into();
    let shop = svc("shop", "x", &[], Some("203.0.113.10"));
    let tenant = svc("tenant", "x", &[], Some("203.0.113.10"));
    let services = vec![shop.clone(), tenant.clone()];
    let judge = Judge::new(&p, &ips, Some(&labels), &services);
    let m = mode("metallb:///");
    assert_eq!(
        judge.handoff(&shop, &m),
        Handoff::Address("203.0.113.10".parse().unwrap())
    );
    assert_eq!(
        reason(&judge.handoff(&tenant, &m)),
        Some("AddressNamespaceNotAllowed")
    );
    // Without the labels read, no namespace is selected.
    let judge = Judge::new(&p, &ips, None, &services);
    assert_eq!(
        reason(&judge.handoff(&shop, &m)),
        Some("AddressNamespaceNotAllowed")
    );
}
