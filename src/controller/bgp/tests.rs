//! Table tests of the BGP planner (no I/O).

use std::collections::BTreeMap;
use std::net::IpAddr;

use baton_cloud::model::{IpAddress, IpId, IpType, Region, RegionBgp, RegionId, Server, ServerId};
use baton_core::BgpPeerMode;
use rstest::rstest;
use serde_json::json;

use super::*;
use crate::config::Annotations;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn names() -> Annotations {
    Annotations {
        local_asn: "cherryservers.com/bgp-peers-{{n}}-node-asn".into(),
        peer_asn: "cherryservers.com/bgp-peers-{{n}}-peer-asn".into(),
        peer_ip: "cherryservers.com/bgp-peers-{{n}}-peer-ip".into(),
        src_ip: "cherryservers.com/bgp-peers-{{n}}-src-ip".into(),
        multi_hop: "cherryservers.com/bgp-peers-{{n}}-peer-multi-hop".into(),
        fip_region: "cherryservers.com/fip-region".into(),
    }
}

fn node(name: &str, src: &str, peers: &[&str]) -> NodeBgp {
    NodeBgp {
        node: name.into(),
        local_asn: 65_000,
        peer_asn: 16_125,
        peers: peers.iter().map(|p| ip(p)).collect(),
        src_ip: ip(src),
        region: "LT-Siauliai".into(),
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn server(hosts: &[&str], primary: Option<&str>) -> Server {
    let mut s: Server = serde_json::from_value(json!({"id": 42, "hostname": "n1"})).unwrap();
    s.region = Some(Region {
        id: RegionId(1),
        name: "Lithuania".into(),
        slug: "LT-Siauliai".into(),
        region_iso_2: "LT".into(),
        location: String::new(),
        href: String::new(),
        bgp: RegionBgp {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            asn: 16_125,
        },
    });
    s.id = ServerId(42);
    if let Some(p) = primary {
        let mut addr: IpAddress = serde_json::from_value(json!({
            "id": "p1", "address": p, "type": "primary-ip", "address_family": 4
        }))
        .unwrap();
        addr.id = IpId::from("p1");
        addr.ip_type = IpType::PrimaryIp;
        s.ip_addresses = vec![addr];
    }
    s
}

#[test]
fn node_bgp_reads_the_server_as_the_ccm_does() {
    // Route servers come back sorted whatever order the API lists them in.
    let s = server(&["198.51.100.3", "198.51.100.2"], Some("198.51.100.21"));
    let got = node_bgp("n1", &s, 65_000).unwrap();
    assert_eq!(
        got,
        node("n1", "198.51.100.21", &["198.51.100.2", "198.51.100.3"])
    );
    assert_eq!(node_bgp("n1", &s, 0), Err(NodeBgpError::NoLocalAsn));
    assert_eq!(
        node_bgp("n1", &server(&["198.51.100.2"], None), 65_000),
        Err(NodeBgpError::NoSourceIp("42".into()))
    );
    assert_eq!(
        node_bgp("n1", &server(&[], Some("198.51.100.21")), 65_000),
        Err(NodeBgpError::NoRegion("42".into()))
    );
    assert!(matches!(
        node_bgp("n1", &server(&["router"], Some("198.51.100.21")), 65_000),
        Err(NodeBgpError::BadPeer { .. })
    ));
}

#[test]
fn node_annotations_follow_the_seed_format() {
    let got = desired_node_annotations(
        &node("n1", "198.51.100.21", &["198.51.100.2", "198.51.100.3"]),
        &names(),
    );
    let want = map(&[
        ("cherryservers.com/bgp-peers-0-node-asn", "65000"),
        ("cherryservers.com/bgp-peers-0-peer-asn", "16125"),
        ("cherryservers.com/bgp-peers-0-peer-ip", "198.51.100.2"),
        ("cherryservers.com/bgp-peers-0-src-ip", "198.51.100.21"),
        ("cherryservers.com/bgp-peers-0-peer-multi-hop", "true"),
        ("cherryservers.com/bgp-peers-1-node-asn", "65000"),
        ("cherryservers.com/bgp-peers-1-peer-asn", "16125"),
        ("cherryservers.com/bgp-peers-1-peer-ip", "198.51.100.3"),
        ("cherryservers.com/bgp-peers-1-src-ip", "198.51.100.21"),
        ("cherryservers.com/bgp-peers-1-peer-multi-hop", "true"),
    ]);
    assert_eq!(got, want);
}

#[test]
fn custom_annotation_names_are_used() {
    let mut n = names();
    n.peer_ip = "example.com/peer-{{n}}-address".into();
    let got = desired_node_annotations(&node("n1", "198.51.100.21", &["198.51.100.2"]), &n);
    assert_eq!(got["example.com/peer-0-address"], "198.51.100.2");
    assert!(!got.contains_key("cherryservers.com/bgp-peers-0-peer-ip"));
}

#[test]
fn shrinking_peers_removes_stale_indexes_and_keeps_other_annotations() {
    let two = desired_node_annotations(
        &node("n1", "198.51.100.21", &["198.51.100.2", "198.51.100.3"]),
        &names(),
    );
    let mut current = two.clone();
    current.insert("unrelated.example/x".into(), "1".into());
    current.insert("cherryservers.com/bgp-peers-7-peer-ip".into(), "192.0.2.9".into());
    current.insert("cherryservers.com/bgp-peers-x-peer-ip".into(), "kept".into());
    let one = desired_node_annotations(&node("n1", "198.51.100.21", &["198.51.100.3"]), &names());
    let patch = node_annotation_patch(&current, &one, &names());
    // Index 0 now names the remaining peer; index 1 and the stray index 7 go.
    assert_eq!(
        patch.get("cherryservers.com/bgp-peers-0-peer-ip"),
        Some(&Some("198.51.100.3".to_owned()))
    );
    for suffix in ["node-asn", "peer-asn", "peer-ip", "src-ip", "peer-multi-hop"] {
        assert_eq!(
            patch.get(&format!("cherryservers.com/bgp-peers-1-{suffix}")),
            Some(&None),
            "{suffix}"
        );
    }
    assert_eq!(patch.get("cherryservers.com/bgp-peers-7-peer-ip"), Some(&None));
    assert!(!patch.contains_key("unrelated.example/x"));
    assert!(!patch.contains_key("cherryservers.com/bgp-peers-x-peer-ip"));
    // Nothing to do once applied.
    assert!(node_annotation_patch(&two, &two, &names()).is_empty());
}

#[rstest]
#[case("cherryservers.com/bgp-peers-0-peer-ip", true)]
#[case("cherryservers.com/bgp-peers-12-src-ip", true)]
#[case("cherryservers.com/bgp-peers--peer-ip", false)]
#[case("cherryservers.com/bgp-peers-0-peer-ipx", false)]
#[case("cherryservers.com/bgp-peers-0-bgp-pass", false)]
fn peer_annotation_keys(#[case] key: &str, #[case] want: bool) {
    assert_eq!(is_peer_annotation(key, &names()), want);
}

fn svc(ns: &str, name: &str, address: &str) -> LbService {
    LbService {
        namespace: ns.into(),
        name: name.into(),
        ip: ip(address),
    }
}

fn owned() -> BTreeMap<String, String> {
    map(&[(MANAGED_BY_LABEL, MANAGED_BY)])
}

#[test]
fn metallb_native_objects() {
    let objs = desired_metallb_objects(
        &[svc("apps", "web", "203.0.113.5")],
        &[node("n1", "198.51.100.21", &["198.51.100.2", "198.51.100.3"])],
        BgpPeerMode::Native,
        "baton",
        None,
    );
    let mut pool_labels = owned();
    pool_labels.insert(SERVICE_NAMESPACE_LABEL.into(), "apps".into());
    pool_labels.insert(SERVICE_NAME_LABEL.into(), "web".into());
    let want = vec![
        MetalLbObject {
            kind: Kind::IpAddressPool,
            name: "apps.web".into(),
            labels: pool_labels,
            spec: json!({"addresses": ["203.0.113.5/32"], "autoAssign": false, "avoidBuggyIPs": false}),
        },
        MetalLbObject {
            kind: Kind::BgpAdvertisement,
            name: "baton-bgp-adv".into(),
            labels: owned(),
            spec: json!({"ipAddressPools": ["apps.web"]}),
        },
        MetalLbObject {
            kind: Kind::BgpPeer,
            name: "n1-0".into(),
            labels: owned(),
            spec: json!({
                "myASN": 65000, "peerASN": 16125, "peerAddress": "198.51.100.2",
                "sourceAddress": "198.51.100.21", "peerPort": 179, "holdTime": "30s",
                "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": "n1"}}],
            }),
        },
        MetalLbObject {
            kind: Kind::BgpPeer,
            name: "n1-1".into(),
            labels: owned(),
            spec: json!({
                "myASN": 65000, "peerASN": 16125, "peerAddress": "198.51.100.3",
                "sourceAddress": "198.51.100.21", "peerPort": 179, "holdTime": "30s",
                "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": "n1"}}],
            }),
        },
    ];
    assert_eq!(objs, want);
}

#[test]
fn metallb_frr_peers_are_per_region_and_multi_hop() {
    let selector: baton_core::LabelSelector = "bgp=on,tier!=edge".parse().unwrap();
    let objs = desired_metallb_objects(
        &[],
        &[
            node("n1", "198.51.100.21", &["198.51.100.2", "198.51.100.3"]),
            node("n2", "198.51.100.22", &["198.51.100.2", "198.51.100.3"]),
        ],
        BgpPeerMode::Frr,
        "baton",
        Some(&selector),
    );
    // No pool: no advertisement (an empty pool list would advertise every pool).
    let names: Vec<(Kind, &str)> = objs.iter().map(|o| (o.kind, o.name.as_str())).collect();
    assert_eq!(
        names,
        vec![(Kind::BgpPeer, "lt-siauliai-0"), (Kind::BgpPeer, "lt-siauliai-1")]
    );
    assert_eq!(
        objs[1].spec,
        json!({
            "myASN": 65000, "peerASN": 16125, "peerAddress": "198.51.100.3",
            "peerPort": 179, "holdTime": "30s", "ebgpMultiHop": true,
            "nodeSelectors": [{
                "matchLabels": {"bgp": "on", "topology.kubernetes.io/region": "LT-Siauliai"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["edge"]}],
            }],
        })
    );
}

#[test]
fn metallb_none_mode_manages_no_peer_and_shared_ips_get_one_pool() {
    let objs = desired_metallb_objects(
        &[
            svc("b", "dns-udp", "203.0.113.7"),
            svc("b", "dns-tcp", "203.0.113.7"),
            svc("a", "web", "203.0.113.5"),
        ],
        &[node("n1", "198.51.100.21", &["198.51.100.2"])],
        BgpPeerMode::None,
        "baton",
        None,
    );
    let names: Vec<(Kind, &str)> = objs.iter().map(|o| (o.kind, o.name.as_str())).collect();
    assert_eq!(
        names,
        vec![
            (Kind::IpAddressPool, "a.web"),
            (Kind::IpAddressPool, "b.dns-tcp"),
            (Kind::BgpAdvertisement, "baton-bgp-adv"),
        ]
    );
    assert_eq!(objs[2].spec, json!({"ipAddressPools": ["a.web", "b.dns-tcp"]}));
}

fn existing(kind: Kind, name: &str, ours: bool, spec: serde_json::Value) -> Existing {
    Existing {
        kind,
        name: name.into(),
        ours,
        labels: if ours { owned() } else { BTreeMap::new() },
        spec,
    }
}

#[test]
fn actions_apply_delete_and_never_touch_user_objects() {
    let desired = vec![
        MetalLbObject {
            kind: Kind::IpAddressPool,
            name: "apps.web".into(),
            labels: owned(),
            spec: json!({"addresses": ["203.0.113.5/32"], "autoAssign": false}),
        },
        MetalLbObject {
            kind: Kind::IpAddressPool,
            name: "apps.db".into(),
            labels: owned(),
            spec: json!({"addresses": ["203.0.113.6/32"], "autoAssign": false}),
        },
        MetalLbObject {
            kind: Kind::BgpPeer,
            name: "n1-0".into(),
            labels: owned(),
            spec: json!({"myASN": 65000}),
        },
    ];
    let found = vec![
        // Up to date (read back with a defaulted field).
        existing(
            Kind::IpAddressPool,
            "apps.web",
            true,
            json!({"addresses": ["203.0.113.5/32"], "autoAssign": false, "avoidBuggyIPs": false}),
        ),
        // A user's object of the same name: conflict, untouched.
        existing(Kind::BgpPeer, "n1-0", false, json!({"myASN": 1})),
        // Ours, no longer wanted.
        existing(Kind::BgpPeer, "lt-siauliai-0", true, json!({})),
        // A user's, not wanted by baton: untouched.
        existing(Kind::BgpPeer, "user-peer", false, json!({})),
    ];
    let actions = metallb_actions(&desired, &found);
    assert_eq!(
        actions,
        vec![
            Action::Apply(desired[1].clone()),
            Action::Conflict(Kind::BgpPeer, "n1-0".into()),
            Action::Delete(Kind::BgpPeer, "lt-siauliai-0".into()),
        ]
    );
}

#[rstest]
#[case::batons(&[("app.kubernetes.io/managed-by", "baton")], true)]
#[case::the_ccms(&[("cloud-provider", "equinix-metal"), ("service-web", "namespace-apps")], true)]
#[case::a_users(&[("app", "mine")], false)]
#[case::another_managers(&[("app.kubernetes.io/managed-by", "helm")], false)]
#[case::other_provider(&[("cloud-provider", "other")], false)]
fn adoptable_objects(#[case] labels: &[(&str, &str)], #[case] want: bool) {
    assert_eq!(adoptable(&map(labels)), want);
}

/// What cloud-provider-cherry left in MetalLB's namespace, as it writes it: its pools (one is the
/// control-plane FIP's, CPEM #258), `equinix-metal-bgp-adv`, native peers with never-matching
/// selectors. baton takes over the pools and peers it wants under the same names, and deletes
/// the rest after its own objects are applied.
#[test]
fn the_ccms_objects_are_adopted_or_removed_after_batons_are_applied() {
    let ccm = |kind, name: &str, extra: &[(&str, &str)], spec| {
        let mut labels = map(&[("cloud-provider", "equinix-metal")]);
        labels.extend(map(extra));
        Existing {
            kind,
            name: name.into(),
            ours: adoptable(&labels),
            labels,
            spec,
        }
    };
    let services = vec![svc("apps", "web", "203.0.113.5")];
    let nodes = vec![node("n1", "198.51.100.1", &["10.0.0.1"])];
    let desired = desired_metallb_objects(&services, &nodes, BgpPeerMode::Native, "baton", None);
    let found = vec![
        ccm(
            Kind::IpAddressPool,
            "apps.web",
            &[("service-web", "namespace-apps")],
            json!({"addresses": ["203.0.113.5/32"], "autoAssign": false, "avoidBuggyIPs": false}),
        ),
        ccm(
            Kind::IpAddressPool,
            "kube-system.cloud-provider-cherry-kubernetes-external",
            &[(
                "service-cloud-provider-cherry-kubernetes-external",
                "namespace-kube-system",
            )],
            json!({"addresses": ["203.0.113.1/32"], "autoAssign": false}),
        ),
        ccm(
            Kind::BgpAdvertisement,
            "equinix-metal-bgp-adv",
            &[],
            json!({"ipAddressPools": ["apps.web", "kube-system.cloud-provider-cherry-kubernetes-external"]}),
        ),
        ccm(
            Kind::BgpPeer,
            "n1-0",
            &[],
            json!({"myASN": 65000, "peerASN": 16125, "peerAddress": "10.0.0.1", "password": "",
                   "sourceAddress": "198.51.100.1", "peerPort": 179, "holdTime": "30s",
                   "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": "n1"}},
                                     {"matchLabels": {"nomatch.cherryservers.com/service-name": "web"}}]}),
        ),
        // A user's object: never touched.
        existing(Kind::BgpAdvertisement, "users-adv", false, json!({})),
    ];
    let actions = metallb_actions(&desired, &found);
    let applied: Vec<(Kind, &str)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply(o) => Some((o.kind, o.name.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(applied, vec![(Kind::BgpAdvertisement, "baton-bgp-adv")]);
    // The pool and the peer are the CCM's and mean what baton wants (the peer's extra selector
    // never matches): only labelled, their specs untouched (no BGP session reset).
    let labelled: Vec<(Kind, &str)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Label(k, n, labels) => {
                assert_eq!(labels.get(MANAGED_BY_LABEL).map(String::as_str), Some(MANAGED_BY));
                Some((*k, n.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        labelled,
        vec![(Kind::IpAddressPool, "apps.web"), (Kind::BgpPeer, "n1-0")]
    );
    let deleted: Vec<(Kind, &str)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete(k, n) => Some((*k, n.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        deleted,
        vec![
            (
                Kind::IpAddressPool,
                "kube-system.cloud-provider-cherry-kubernetes-external"
            ),
            (Kind::BgpAdvertisement, "equinix-metal-bgp-adv"),
        ]
    );
    // Deletes come after every apply: the addresses stay advertised throughout.
    let first_delete = actions
        .iter()
        .position(|a| matches!(a, Action::Delete(..)))
        .unwrap();
    assert!(
        actions[first_delete..]
            .iter()
            .all(|a| matches!(a, Action::Delete(..)))
    );
    assert!(!actions.iter().any(|a| matches!(a, Action::Conflict(..))));
}

#[test]
fn a_ccm_object_that_means_something_else_is_applied_and_a_real_selector_counts() {
    let desired = desired_metallb_objects(
        &[svc("apps", "web", "203.0.113.5")],
        &[node("n1", "198.51.100.1", &["10.0.0.1"])],
        BgpPeerMode::Native,
        "baton",
        None,
    );
    let ccm_labels = map(&[("cloud-provider", "equinix-metal")]);
    let peer = |selectors: serde_json::Value, asn: u32| Existing {
        kind: Kind::BgpPeer,
        name: "n1-0".into(),
        ours: true,
        labels: ccm_labels.clone(),
        spec: json!({"myASN": asn, "peerASN": 16125, "peerAddress": "10.0.0.1", "sourceAddress": "198.51.100.1",
                     "peerPort": 179, "holdTime": "30s", "nodeSelectors": selectors}),
    };
    let peer_action = |e: Existing| {
        metallb_actions(&desired, &[e]).into_iter().find(|a| {
            matches!(a, Action::Apply(o) if o.kind == Kind::BgpPeer)
                || matches!(a, Action::Label(Kind::BgpPeer, ..))
        })
    };
    let own = json!({"matchLabels": {"kubernetes.io/hostname": "n1"}});
    let nomatch = json!({"matchLabels": {"nomatch.cherryservers.com/service-name": "web"}});
    assert!(matches!(
        peer_action(peer(json!([own, nomatch]), 65_000)),
        Some(Action::Label(..))
    ));
    // Another ASN: baton's spec is applied.
    assert!(matches!(
        peer_action(peer(json!([own, nomatch]), 65_001)),
        Some(Action::Apply(_))
    ));
    // A selector that matches other nodes too is not the CCM's never-matching one.
    let other = json!({"matchLabels": {"kubernetes.io/hostname": "n2"}});
    assert!(matches!(
        peer_action(peer(json!([own, other]), 65_000)),
        Some(Action::Apply(_))
    ));
}

#[test]
fn an_adopted_peer_keeps_its_spec_on_later_passes() {
    let desired = desired_metallb_objects(
        &[svc("apps", "web", "203.0.113.5")],
        &[node("n1", "198.51.100.1", &["10.0.0.1"])],
        BgpPeerMode::Native,
        "baton",
        None,
    );
    // After the first pass: the CCM's peer carries both labels and still its CCM selectors.
    let mut labels = owned();
    labels.insert("cloud-provider".into(), "equinix-metal".into());
    let peer = Existing {
        kind: Kind::BgpPeer,
        name: "n1-0".into(),
        ours: true,
        labels,
        spec: json!({"myASN": 65000, "peerASN": 16125, "peerAddress": "10.0.0.1", "sourceAddress": "198.51.100.1",
                     "peerPort": 179, "holdTime": "30s", "password": "",
                     "nodeSelectors": [{"matchLabels": {"kubernetes.io/hostname": "n1"}},
                                       {"matchLabels": {"nomatch.cherryservers.com/service-name": "web"}}]}),
    };
    let actions = metallb_actions(&desired, &[peer]);
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Apply(o) if o.kind == Kind::BgpPeer)
                || matches!(a, Action::Label(Kind::BgpPeer, ..))),
        "{actions:?}"
    );
}
