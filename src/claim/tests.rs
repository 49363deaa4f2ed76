use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use baton_cloud::model::{IpAddress, Server, ServerId};
use baton_core::FipTag;
use rstest::rstest;

use super::decide::*;

fn fip(id: &str, address: &str, tags: &[(&str, &str)], target: Option<u64>) -> IpAddress {
    let mut v = serde_json::json!({
        "id": id,
        "address": address,
        "type": "floating-ip",
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    });
    if let Some(t) = target {
        v["targeted_to"] = serde_json::json!({"id": t});
    }
    serde_json::from_value(v).unwrap()
}

fn server(id: u64, hostname: &str, primary: &str, private: &str, state: &str) -> Server {
    serde_json::from_value(serde_json::json!({
        "id": id,
        "hostname": hostname,
        "state": state,
        "ip_addresses": [
            {"id": format!("p{id}"), "address": primary, "type": "primary-ip"},
            {"id": format!("v{id}"), "address": private, "type": "private-ip"},
        ],
    }))
    .unwrap()
}

fn project() -> Vec<IpAddress> {
    vec![
        fip("1", "203.0.113.10", &[("cluster", "prod-api")], None), // ours, by fipTag
        fip("2", "203.0.113.20", &[("cluster", "other-api")], Some(600_102)), // another cluster's
        fip("3", "203.0.113.30", &[], None),                        // nobody's; adopted below
        fip("4", "203.0.113.40", &[], None),                        // nobody's
        serde_json::from_value(
            serde_json::json!({"id": "p", "address": "198.51.100.11", "type": "primary-ip"}),
        )
        .unwrap(),
    ]
}

fn servers() -> Vec<Server> {
    vec![
        server(600_101, "cp-0", "198.51.100.11", "192.0.2.11", "active"),
        server(600_102, "cp-1", "198.51.100.12", "192.0.2.12", "active"),
        server(600_103, "cp-2", "198.51.100.13", "192.0.2.13", "off"),
    ]
}

fn tag() -> FipTag {
    "cluster=prod-api".parse().unwrap()
}

fn adopted() -> BTreeSet<IpAddr> {
    BTreeSet::from(["203.0.113.30".parse().unwrap()])
}

fn at(addrs: &[&str]) -> BTreeSet<IpAddr> {
    addrs.iter().map(|a| a.parse().unwrap()).collect()
}

#[rstest]
#[case::by_fip_tag(None, Ok("203.0.113.10"))]
#[case::by_address(Some(&["203.0.113.10"][..]), Ok("203.0.113.10"))]
#[case::adopted_by_address(Some(&["203.0.113.30"][..]), Ok("203.0.113.30"))]
// A DNS name that resolves to the FIP and to something else (e.g. a node's address as well).
#[case::a_name_with_other_addresses(Some(&["203.0.113.10", "198.51.100.11"][..]), Ok("203.0.113.10"))]
#[case::another_clusters(Some(&["203.0.113.20"][..]), Err("FloatingIPNotOwned"))]
#[case::nobodys(Some(&["203.0.113.40"][..]), Err("FloatingIPNotOwned"))]
#[case::not_a_fip(Some(&["198.51.100.11"][..]), Err("FloatingIPNotFound"))]
#[case::absent(Some(&["203.0.113.99"][..]), Err("FloatingIPNotFound"))]
#[case::two_fips(Some(&["203.0.113.10", "203.0.113.30"][..]), Err("SeveralFloatingIPs"))]
fn only_this_clusters_fip_is_claimed(#[case] addresses: Option<&[&str]>, #[case] want: Result<&str, &str>) {
    let ips = project();
    let tag = tag();
    let adopted = adopted();
    let ownership = Ownership {
        fip_tag: Some(&tag),
        adopted: &adopted,
    };
    let choice = match addresses {
        Some(a) => FipChoice::At {
            wanted: "api.prod.example.com",
            addresses: at(a),
        },
        None => FipChoice::Tagged(&tag),
    };
    match (the_fip(&ips, Some(&choice), ownership), want) {
        (Ok(ip), Ok(addr)) => assert_eq!(ip.address.to_string(), addr),
        (Err(refusal), Err(reason)) => assert_eq!(refusal.reason(), reason, "{refusal}"),
        (got, want) => panic!("{addresses:?}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn another_clusters_fip_is_refused_naming_the_fip_its_labels_and_the_rule() {
    let ips = project();
    let tag = tag();
    let none = BTreeSet::new();
    let choice = FipChoice::At {
        wanted: "203.0.113.20",
        addresses: at(&["203.0.113.20"]),
    };
    let refusal = the_fip(
        &ips,
        Some(&choice),
        Ownership {
            fip_tag: Some(&tag),
            adopted: &none,
        },
    )
    .unwrap_err();
    let text = refusal.to_string();
    for part in [
        "203.0.113.20",
        "(2,",
        "cluster=other-api",
        "fipTag cluster=prod-api",
        "adoptFips",
    ] {
        assert!(text.contains(part), "{part:?} missing: {text}");
    }
}

#[test]
fn no_fip_named_and_an_ambiguous_tag_are_clear_errors() {
    let ips = project();
    let none = BTreeSet::new();
    let ownership = Ownership {
        fip_tag: None,
        adopted: &none,
    };
    let refusal = the_fip(&ips, None, ownership).unwrap_err();
    assert!(refusal.to_string().contains("fipTag"), "{refusal}");
    assert!(refusal.to_string().contains("--fip"), "{refusal}");
    // Two FIPs with the tag: the controller would keep the first; claim asks instead.
    let mut ips = project();
    ips.push(fip("5", "203.0.113.50", &[("cluster", "prod-api")], None));
    let tag = tag();
    let refusal = the_fip(
        &ips,
        Some(&FipChoice::Tagged(&tag)),
        Ownership {
            fip_tag: Some(&tag),
            adopted: &none,
        },
    )
    .unwrap_err();
    assert_eq!(refusal.reason(), "SeveralFloatingIPs");
    assert!(refusal.to_string().contains("203.0.113.50 (5)"), "{refusal}");
}

#[rstest]
#[case::flag_id(Some("600102"), &[], "whatever", Ok(600_102))]
#[case::flag_name(Some("cp-2"), &[], "whatever", Ok(600_103))]
#[case::flag_unknown(Some("cp-9"), &["198.51.100.11"], "cp-0", Err("ServerNotFound"))]
#[case::primary_address(None, &["127.0.0.1", "198.51.100.12"], "unrelated", Ok(600_102))]
#[case::private_address(None, &["192.0.2.13"], "unrelated", Ok(600_103))]
#[case::host_name(None, &["10.0.0.5"], "cp-1", Ok(600_102))]
#[case::short_host_name(None, &[], "cp-1.prod.example.com", Ok(600_102))]
#[case::nothing_matches(None, &["10.0.0.5"], "bastion", Err("ServerNotFound"))]
// The address wins over the name (CAPH's machine name may differ from the host's).
#[case::address_before_name(None, &["198.51.100.13"], "cp-0", Ok(600_103))]
#[case::two_servers_by_address(None, &["198.51.100.11", "198.51.100.12"], "x", Err("SeveralServers"))]
fn this_server_is_found_by_flag_address_or_name(
    #[case] flag: Option<&str>,
    #[case] local: &[&str],
    #[case] hostname: &str,
    #[case] want: Result<u64, &str>,
) {
    let servers = servers();
    match (this_server(&servers, flag, &at(local), hostname), want) {
        (Ok(s), Ok(id)) => assert_eq!(s.id, ServerId(id)),
        (Err(refusal), Err(reason)) => assert_eq!(refusal.reason(), reason, "{refusal}"),
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

#[test]
fn a_host_that_is_no_server_is_told_to_name_one() {
    let text = this_server(&servers(), None, &at(&["10.0.0.5"]), "bastion")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("10.0.0.5") && text.contains("bastion") && text.contains("--server"),
        "{text}"
    );
}

#[rstest]
#[case::unassigned(None, Decision::Assign { from: None })]
#[case::here(Some(600_101), Decision::AlreadyHere)]
#[case::on_a_running_server(Some(600_102), Decision::HeldElsewhere { holder: ServerId(600_102), name: "cp-1".into(), state: "active".into() })]
// A server that exists keeps it even when it is off: only the controller moves it, by health.
#[case::on_a_server_that_is_off(Some(600_103), Decision::HeldElsewhere { holder: ServerId(600_103), name: "cp-2".into(), state: "off".into() })]
#[case::on_a_server_that_is_gone(Some(600_199), Decision::Assign { from: Some(ServerId(600_199)) })]
fn a_fip_is_assigned_only_when_no_existing_server_holds_it(
    #[case] target: Option<u64>,
    #[case] want: Decision,
) {
    let ip = fip("1", "203.0.113.10", &[("cluster", "prod-api")], target);
    assert_eq!(decide(&ip, ServerId(600_101), &servers()), want);
}

#[rstest]
#[case::primary(&["198.51.100.11", "192.0.2.11"], "203.0.113.10", Some("198.51.100.11"))]
#[case::private_only(&["192.0.2.11"], "203.0.113.10", Some("192.0.2.11"))]
#[case::none_local(&["10.0.0.5"], "203.0.113.10", None)]
#[case::ipv6_fip(&["198.51.100.11"], "2001:db8::10", None)]
fn own_traffic_goes_to_the_servers_address_on_this_host(
    #[case] local: &[&str],
    #[case] fip: &str,
    #[case] want: Option<&str>,
) {
    let s = &servers()[0];
    assert_eq!(
        own_address(fip.parse().unwrap(), s, &at(local)),
        want.map(|w| w.parse().unwrap())
    );
}
