use std::collections::BTreeMap;

use baton_cloud::tags::service_tag_on;
use rstest::rstest;

use super::*;

const CLUSTER: &str = "6f1c-uid";

fn ip(address: &str, kind: &str, cidr: &str, tags: &[(&str, &str)]) -> IpAddress {
    serde_json::from_value(serde_json::json!({
        "id": format!("id-{address}"),
        "address": address,
        "cidr": cidr,
        "type": kind,
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap()
}

fn fip(address: &str, tags: &[(&str, &str)]) -> IpAddress {
    ip(address, "floating-ip", &format!("{address}/32"), tags)
}

fn tag(ns: &str, name: &str) -> String {
    service_tag_on(CloudKind::Cherry, ns, name)
}

/// The project: this cluster's FIPs (tagged by the operator, reserved for Services), another
/// cluster's, untagged ones (one adopted), two subnets, a server's primary IP.
fn project() -> Vec<IpAddress> {
    let web = tag("apps", "web");
    let db = tag("apps", "db");
    let other = tag("tenant", "api");
    vec![
        fip("203.0.113.10", &[("cluster", CLUSTER)]), // the operator's, for this cluster
        fip(
            "203.0.113.11",
            &[("usage", USAGE_VALUE), ("service", &web), ("cluster", CLUSTER)],
        ),
        fip(
            "203.0.113.12",
            &[("usage", USAGE_VALUE), ("service", &db), ("cluster", CLUSTER)],
        ),
        fip(
            "203.0.113.13",
            &[("usage", USAGE_VALUE), ("service", &other), ("cluster", CLUSTER)],
        ),
        fip("203.0.113.20", &[("cluster", "other-cluster-uid")]),
        fip(
            "203.0.113.21",
            &[
                ("usage", USAGE_VALUE),
                ("service", &web),
                ("cluster", "other-cluster-uid"),
            ],
        ),
        fip("203.0.113.30", &[]),
        fip("203.0.113.31", &[]), // adopted
        ip("198.18.0.0", "subnet", "198.18.0.0/29", &[("cluster", CLUSTER)]),
        ip("198.18.1.0", "subnet", "198.18.1.0/29", &[]),
        ip("198.51.100.10", "primary-ip", "198.51.100.0/24", &[]),
    ]
}

fn policy(namespaces: &[&str], selector: Option<&str>) -> AddressPolicy {
    AddressPolicy {
        cloud: CloudKind::Cherry,
        cluster_id: CLUSTER.to_owned(),
        adopted: ["203.0.113.31".parse().unwrap()].into(),
        allocation: ServiceAllocation {
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            namespace_selector: selector.map(|s| s.parse().unwrap()),
        },
    }
}

/// The Services of the lab: `apps/web`, `apps/db`, `tenant/api` (their tags).
fn sibling_of(namespace: &str) -> impl Fn(&str) -> bool + '_ {
    move |t: &str| {
        [("apps", "web"), ("apps", "db"), ("tenant", "api")]
            .iter()
            .any(|(ns, name)| *ns == namespace && tag(ns, name) == t)
    }
}

fn admit(
    policy: &AddressPolicy,
    ns: &str,
    labels: Option<&BTreeMap<String, String>>,
    name: &str,
    address: &str,
) -> Result<String, &'static str> {
    let ips = project();
    let index = ProjectAddresses::of(&ips);
    let own = tag(ns, name);
    let sibling = sibling_of(ns);
    let ask = Ask {
        namespace: ns,
        namespace_labels: labels,
        service_tag: &own,
        field: "spec.loadBalancerIP",
        address: address.parse().unwrap(),
        sibling: &sibling,
    };
    match policy.admit(&ask, &index) {
        Ok(ip) => Ok(ip.id.0.clone()),
        Err(refusal) => {
            // Every refusal names the field and the address, for the Event.
            let text = refusal.to_string();
            assert!(
                text.contains(address) && text.contains("spec.loadBalancerIP"),
                "{text}"
            );
            assert_eq!(refusal.address().to_string(), address);
            Err(refusal.reason())
        }
    }
}

#[rstest]
// With no serviceAllocation every namespace may ask for this cluster's addresses.
#[case::operators_fip("tenant", "x", "203.0.113.10", Ok("id-203.0.113.10"))]
#[case::adopted("tenant", "x", "203.0.113.31", Ok("id-203.0.113.31"))]
#[case::in_a_clusters_subnet("tenant", "x", "198.18.0.3", Ok("id-198.18.0.0"))]
#[case::its_own("apps", "web", "203.0.113.11", Ok("id-203.0.113.11"))]
#[case::a_sibling_of_its_namespace("apps", "other", "203.0.113.12", Ok("id-203.0.113.12"))]
#[case::another_namespaces_service("tenant", "x", "203.0.113.11", Err("FloatingIPOfAnotherService"))]
#[case::another_clusters("tenant", "x", "203.0.113.20", Err("FloatingIPNotOwned"))]
// The other cluster's FIP reserved for a Service of the same name is still the other cluster's.
#[case::another_clusters_of_the_same_name("apps", "web", "203.0.113.21", Err("FloatingIPNotOwned"))]
#[case::untagged("tenant", "x", "203.0.113.30", Err("FloatingIPNotOwned"))]
#[case::the_subnets_last("tenant", "x", "198.18.0.7", Ok("id-198.18.0.0"))]
#[case::past_the_subnet("tenant", "x", "198.18.0.8", Err("AddressNotInProject"))]
#[case::in_an_untagged_subnet("tenant", "x", "198.18.1.3", Err("FloatingIPNotOwned"))]
#[case::outside_the_project("tenant", "x", "192.0.2.200", Err("AddressNotInProject"))]
#[case::a_servers_primary_ip("tenant", "x", "198.51.100.10", Err("AddressNotInProject"))]
fn an_open_allocation_admits_this_clusters_addresses_only(
    #[case] ns: &str,
    #[case] name: &str,
    #[case] address: &str,
    #[case] want: Result<&str, &str>,
) {
    let got = admit(&policy(&[], None), ns, None, name, address);
    assert_eq!(
        got.as_ref().map(String::as_str).map_err(|e| *e),
        want,
        "{ns}/{name} asking for {address}"
    );
}

#[rstest]
#[case::listed("apps", None, "203.0.113.10", Ok("id-203.0.113.10"))]
#[case::selected("web", Some(&[("team", "web")][..]), "203.0.113.10", Ok("id-203.0.113.10"))]
#[case::neither("tenant", Some(&[("team", "ops")][..]), "203.0.113.10", Err("AddressNamespaceNotAllowed"))]
// Labels not known yet: no selector matches (fail closed).
#[case::labels_unknown("web", None, "203.0.113.10", Err("AddressNamespaceNotAllowed"))]
// The namespace is judged first: a tenant learns nothing about the address.
#[case::tenant_other_cluster("tenant", None, "203.0.113.20", Err("AddressNamespaceNotAllowed"))]
#[case::tenant_outside("tenant", None, "192.0.2.200", Err("AddressNamespaceNotAllowed"))]
// An allowed namespace still gets only this cluster's addresses.
#[case::allowed_other_cluster("apps", None, "203.0.113.20", Err("FloatingIPNotOwned"))]
#[case::allowed_outside("apps", None, "192.0.2.200", Err("AddressNotInProject"))]
fn a_restricted_allocation_admits_listed_or_selected_namespaces(
    #[case] ns: &str,
    #[case] labels: Option<&[(&str, &str)]>,
    #[case] address: &str,
    #[case] want: Result<&str, &str>,
) {
    let labels: Option<BTreeMap<String, String>> = labels.map(|l| {
        l.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    });
    let got = admit(
        &policy(&["apps"], Some("team=web")),
        ns,
        labels.as_ref(),
        "x",
        address,
    );
    assert_eq!(
        got.as_ref().map(String::as_str).map_err(|e| *e),
        want,
        "{ns} asking for {address}"
    );
}

#[test]
fn a_services_own_fip_is_its_own_in_any_namespace() {
    // tenant/api's FIP: its namespace may not ask for addresses, but this one is its own (baton
    // wrote the address into its IP annotation).
    let got = admit(&policy(&["apps"], None), "tenant", None, "api", "203.0.113.13");
    assert_eq!(got, Ok("id-203.0.113.13".to_owned()));
}

#[test]
fn the_refusals_name_the_rule_and_the_remedy() {
    let ips = project();
    let index = ProjectAddresses::of(&ips);
    let nobody = |_: &str| false;
    let ask = |ns, address: &str| Ask {
        namespace: ns,
        namespace_labels: None,
        service_tag: "t",
        field: "metallb.io/loadBalancerIPs",
        address: address.parse().unwrap(),
        sibling: &nobody,
    };
    let p = policy(&["apps", "web"], Some("team=web"));
    let text = p
        .admit(&ask("tenant", "203.0.113.10"), &index)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("namespace tenant")
            && text.contains("namespaces apps,web or namespaces labelled team=web")
            && text.contains("serviceAllocationNamespaces")
            && text.contains("metallb.io/loadBalancerIPs"),
        "{text}"
    );
    let text = p
        .admit(&ask("apps", "203.0.113.30"), &index)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("id-203.0.113.30")
            && text.contains("carries no cluster tag")
            && text.contains(&format!("tag it cluster={CLUSTER}"))
            && text.contains("adoptFips"),
        "{text}"
    );
    let refusal = p.admit(&ask("apps", "203.0.113.20"), &index).unwrap_err();
    let text = refusal.to_string();
    assert!(
        text.contains("its tag is cluster=other-cluster-uid (another cluster's)") && !text.contains("tag it"),
        "{text}"
    );
    assert!(!refusal.untagged());
    assert!(
        p.admit(&ask("apps", "203.0.113.30"), &index)
            .unwrap_err()
            .untagged()
    );
    let hetzner = AddressPolicy {
        cloud: CloudKind::Hetzner,
        ..p
    };
    let text = hetzner
        .admit(&ask("apps", "203.0.113.30"), &index)
        .unwrap_err()
        .to_string();
    assert!(text.contains(&format!("label it cluster={CLUSTER}")), "{text}");
}

#[test]
fn an_empty_cluster_id_owns_nothing() {
    let p = AddressPolicy {
        cluster_id: String::new(),
        ..policy(&[], None)
    };
    let ips = vec![fip("203.0.113.9", &[("cluster", "")])];
    let index = ProjectAddresses::of(&ips);
    let nobody = |_: &str| false;
    let ask = Ask {
        namespace: "apps",
        namespace_labels: None,
        service_tag: "",
        field: "spec.loadBalancerIP",
        address: "203.0.113.9".parse().unwrap(),
        sibling: &nobody,
    };
    assert_eq!(p.admit(&ask, &index).unwrap_err().reason(), "FloatingIPNotOwned");
}

#[rstest]
#[case(&[], None, "every namespace")]
#[case(&["b", "a"], None, "namespaces a,b")]
#[case(&[], Some("team=web"), "namespaces labelled team=web")]
fn the_allocation_says_who_may(#[case] ns: &[&str], #[case] selector: Option<&str>, #[case] want: &str) {
    assert_eq!(policy(ns, selector).allocation.describe(), want);
}

#[test]
fn the_policy_reads_the_settings() {
    let env: BTreeMap<String, String> = [
        ("BATON_ADOPT_FIPS", "203.0.113.5"),
        ("BATON_SERVICE_ALLOCATION_NAMESPACES", "apps, web"),
        ("BATON_SERVICE_ALLOCATION_NAMESPACE_SELECTOR", "team in (web,ops)"),
        ("BATON_CLOUD_CONFIG", ""),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &env).unwrap();
    let p = AddressPolicy::new(&config, CLUSTER);
    assert_eq!(p.adopted, ["203.0.113.5".parse().unwrap()].into());
    assert_eq!(
        p.allocation.namespaces,
        ["apps".to_owned(), "web".to_owned()].into()
    );
    let labels: BTreeMap<String, String> = [("team".to_owned(), "ops".to_owned())].into();
    assert!(p.allocation.allows("elsewhere", Some(&labels)));
    assert!(!p.allocation.allows("elsewhere", None));
    let bare =
        crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &BTreeMap::new()).unwrap();
    assert!(AddressPolicy::new(&bare, CLUSTER).allocation.is_open());
}
