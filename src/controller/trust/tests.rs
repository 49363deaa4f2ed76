use std::collections::BTreeMap;

use rstest::rstest;

use super::*;

const CLUSTER: &str = "6f1c-uid";

fn fip(address: &str, tags: &[(&str, &str)]) -> IpAddress {
    serde_json::from_value(serde_json::json!({
        "id": format!("id-{address}"),
        "address": address,
        "type": "floating-ip",
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap()
}

fn primary(address: &str) -> IpAddress {
    serde_json::from_value(serde_json::json!({"id": "p", "address": address, "type": "primary-ip"})).unwrap()
}

fn project() -> Vec<IpAddress> {
    vec![
        fip("203.0.113.1", &[("cluster", "my-cp")]), // the fipTag FIP
        fip(
            "203.0.113.2",
            &[("cluster", CLUSTER), ("usage", "cloud-provider-cherry-auto")],
        ),
        fip("203.0.113.3", &[("cluster", "other-cluster-uid")]), // another cluster's
        fip("203.0.113.4", &[]),                                 // untagged
        fip("203.0.113.5", &[]),                                 // untagged, adopted
        primary("198.51.100.10"),
    ]
}

fn policy() -> EndpointPolicy {
    EndpointPolicy {
        namespaces: ["kube-system".to_owned(), "openshift-kube-apiserver".to_owned()].into(),
        cluster_id: CLUSTER.to_owned(),
        fip_tag: Some("cluster=my-cp".parse().unwrap()),
        adopted: ["203.0.113.5".parse().unwrap()].into(),
    }
}

#[rstest]
#[case::the_fip_tag("kube-system", "203.0.113.1", Ok("203.0.113.1"))]
#[case::this_clusters_tag("openshift-kube-apiserver", "203.0.113.2", Ok("203.0.113.2"))]
#[case::adopted("kube-system", "203.0.113.5", Ok("203.0.113.5"))]
#[case::another_clusters("kube-system", "203.0.113.3", Err("FloatingIPNotOwned"))]
#[case::untagged("kube-system", "203.0.113.4", Err("FloatingIPNotOwned"))]
#[case::a_cluster_ip("kube-system", "10.96.0.1", Err("NotAFloatingIP"))]
#[case::a_primary_ip("kube-system", "198.51.100.10", Err("NotAFloatingIP"))]
// A namespace not allowed is refused whatever it names, this cluster's own FIP included.
#[case::tenant_own_fip("tenant", "203.0.113.1", Err("ControlPlaneNamespaceNotAllowed"))]
#[case::tenant_other_fip("tenant", "203.0.113.3", Err("ControlPlaneNamespaceNotAllowed"))]
#[case::tenant_cluster_ip("tenant", "10.96.0.1", Err("ControlPlaneNamespaceNotAllowed"))]
fn an_endpoint_is_admitted_only_from_an_allowed_namespace_with_this_clusters_fip(
    #[case] namespace: &str,
    #[case] address: &str,
    #[case] want: Result<&str, &str>,
) {
    let ips = project();
    let got = policy().admit(namespace, address.parse().unwrap(), ips.iter());
    match (got, want) {
        (Ok(fip), Ok(addr)) => assert_eq!(fip.address.to_string(), addr),
        (Err(refusal), Err(reason)) => {
            assert_eq!(refusal.reason(), reason, "{refusal}");
            // The message names the address, for the Event.
            assert!(refusal.to_string().contains(address), "{refusal}");
        }
        (got, want) => panic!("{namespace} {address}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn ownership_needs_this_clusters_id_not_any_cluster_tag() {
    let p = EndpointPolicy {
        cluster_id: String::new(),
        ..policy()
    };
    // An empty cluster id matches no FIP's empty `cluster` tag.
    assert!(!p.owns(&fip("203.0.113.9", &[("cluster", "")])));
    assert!(policy().owns(&fip("203.0.113.9", &[("cluster", CLUSTER)])));
    assert!(!policy().owns(&fip("203.0.113.9", &[("infra-id", CLUSTER)])));
    let no_tag = EndpointPolicy {
        fip_tag: None,
        ..policy()
    };
    assert!(!no_tag.owns(&fip("203.0.113.1", &[("cluster", "my-cp")])));
}

#[test]
fn the_refusal_names_the_rule_and_the_fip() {
    let ips = project();
    let e = policy()
        .admit("kube-system", "203.0.113.3".parse().unwrap(), ips.iter())
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("id-203.0.113.3") && text.contains("adoptFips") && text.contains(CLUSTER),
        "{text}"
    );
    let e = policy()
        .admit("tenant", "203.0.113.3".parse().unwrap(), ips.iter())
        .unwrap_err();
    assert!(
        e.to_string().contains("controlPlaneNamespaces")
            && e.to_string().contains("kube-system,openshift-kube-apiserver"),
        "{e}"
    );
}

#[test]
fn the_policy_joins_the_settings_and_the_bootstraps_record() {
    let env: BTreeMap<String, String> = [
        ("CHERRY_FIP_TAG", "cluster=my-cp"),
        ("BATON_CONTROL_PLANE_NAMESPACES", "kube-system, infra"),
        ("BATON_ADOPT_FIPS", "203.0.113.5"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &env).unwrap();
    let record: BTreeMap<String, String> = [
        ("endpointNamespaces", "openshift-kube-apiserver"),
        ("fips", "203.0.113.7, not-an-ip,203.0.113.8"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let p = EndpointPolicy::new(&config, CLUSTER, &record);
    assert_eq!(
        p.namespaces,
        ["infra", "kube-system", "openshift-kube-apiserver"]
            .map(str::to_owned)
            .into()
    );
    assert_eq!(
        p.adopted,
        ["203.0.113.5", "203.0.113.7", "203.0.113.8"]
            .map(|a| a.parse().unwrap())
            .into()
    );
    assert_eq!(p.cluster_id, CLUSTER);
    assert!(p.fip_tag.is_some());
    // Without a record and settings: kube-system only, nothing adopted.
    let bare =
        crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &BTreeMap::new()).unwrap();
    let p = EndpointPolicy::new(&bare, CLUSTER, &BTreeMap::new());
    assert_eq!(p.namespaces, ["kube-system".to_owned()].into());
    assert!(p.adopted.is_empty() && p.fip_tag.is_none());
}
