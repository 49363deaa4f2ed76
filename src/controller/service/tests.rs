//! Table tests of the Service FIP planner (no I/O).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use baton_core::LoadBalancerMode;
use rstest::rstest;

use super::*;

const MIRROR: (&str, &str) = ("kube-system", "baton-kubernetes-external");

fn lb(ns: &str, name: &str) -> ServiceFacts {
    ServiceFacts {
        namespace: ns.into(),
        name: name.into(),
        type_: Some("LoadBalancer".into()),
        ..ServiceFacts::default()
    }
}

fn with(mut svc: ServiceFacts, annotations: &[(&str, &str)]) -> ServiceFacts {
    for (k, v) in annotations {
        svc.annotations.insert((*k).into(), (*v).into());
    }
    svc
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn fip(id: &str, address: &str) -> OwnedFip {
    OwnedFip {
        id: id.into(),
        address: ip(address),
    }
}

fn metallb() -> LoadBalancerMode {
    "metallb:///".parse().unwrap()
}

fn kube_vip() -> LoadBalancerMode {
    "kube-vip://".parse().unwrap()
}

fn empty() -> LoadBalancerMode {
    "empty://".parse().unwrap()
}

#[rstest]
#[case::plain(lb("default", "web"), Scope::Managed)]
#[case::our_class(
    ServiceFacts { class: Some(LOAD_BALANCER_CLASS.into()), ..lb("default", "web") },
    Scope::Managed
)]
#[case::other_class(
    ServiceFacts { class: Some("example.com/other".into()), ..lb("default", "web") },
    Scope::Ignored(Ignored::OtherClass("example.com/other".into()))
)]
#[case::cluster_ip(
    ServiceFacts { type_: Some("ClusterIP".into()), ..lb("default", "web") },
    Scope::Ignored(Ignored::NotLoadBalancer)
)]
#[case::no_type(
    ServiceFacts { type_: None, ..lb("default", "web") },
    Scope::Ignored(Ignored::NotLoadBalancer)
)]
#[case::opted_out(
    with(lb("default", "web"), &[(MANAGED_ANNOTATION, "false")]),
    Scope::Ignored(Ignored::OptedOut)
)]
#[case::opted_out_case(
    with(lb("default", "web"), &[(MANAGED_ANNOTATION, " False ")]),
    Scope::Ignored(Ignored::OptedOut)
)]
#[case::managed_true(with(lb("default", "web"), &[(MANAGED_ANNOTATION, "true")]), Scope::Managed)]
#[case::control_plane(
    with(lb("default", "api"), &[("baton.dev/control-plane-endpoint", "true")]),
    Scope::Ignored(Ignored::ControlPlaneEndpoint)
)]
#[case::control_plane_not_true(
    with(lb("default", "api"), &[("baton.dev/control-plane-endpoint", "false")]),
    Scope::Managed
)]
#[case::mirror_without_annotation(
    lb("kube-system", "baton-kubernetes-external"),
    Scope::Ignored(Ignored::ControlPlaneEndpoint)
)]
#[case::mirror_name_elsewhere(lb("default", "baton-kubernetes-external"), Scope::Managed)]
fn scope_table(#[case] svc: ServiceFacts, #[case] want: Scope) {
    assert_eq!(scope(&svc, MIRROR), want);
}

/// Hetzner Cloud: only a Service naming baton's class is baton's; a classless one is
/// hcloud-cloud-controller-manager's, and its cleanup finalizer is not baton's to clear.
#[test]
fn where_a_class_is_needed_a_classless_service_is_left_to_the_clouds_controller() {
    let mut svc = lb("default", "web");
    svc.needs_class = true;
    assert_eq!(scope(&svc, MIRROR), Scope::Ignored(Ignored::NoClass));
    svc.class = Some(FLOATING_IP_CLASS.into());
    assert_eq!(scope(&svc, MIRROR), Scope::Managed);
    svc.class = Some("example.com/other".into());
    assert_eq!(
        scope(&svc, MIRROR),
        Scope::Ignored(Ignored::OtherClass("example.com/other".into()))
    );
    let mut leaving = lb("default", "web");
    leaving.needs_class = true;
    leaving.deleting = true;
    assert!(!clears_ccm_finalizer(&leaving, true, MIRROR));
    leaving.needs_class = false;
    assert!(clears_ccm_finalizer(&leaving, true, MIRROR));
    // On Cherry Servers baton's floating-ip class is served as well.
    let mut cherry = lb("default", "web");
    cherry.class = Some(FLOATING_IP_CLASS.into());
    assert_eq!(scope(&cherry, MIRROR), Scope::Managed);
}

#[rstest]
#[case::nothing(metallb(), lb("d", "s"), Ok(None))]
#[case::metallb_new(metallb(), with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, "192.0.2.7")]), Ok(Some("192.0.2.7")))]
#[case::metallb_legacy(
    metallb(),
    with(lb("d", "s"), &[(METALLB_LEGACY_IPS_ANNOTATION, "192.0.2.8")]),
    Ok(Some("192.0.2.8"))
)]
#[case::metallb_new_wins(
    metallb(),
    with(lb("d", "s"), &[(METALLB_LEGACY_IPS_ANNOTATION, "192.0.2.8"), (METALLB_IPS_ANNOTATION, "192.0.2.7")]),
    Ok(Some("192.0.2.7"))
)]
#[case::dual_stack_first_v4(
    metallb(),
    with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, "2001:db8::1, 192.0.2.9")]),
    Ok(Some("192.0.2.9"))
)]
#[case::kube_vip(kube_vip(), with(lb("d", "s"), &[(KUBE_VIP_IPS_ANNOTATION, "192.0.2.7")]), Ok(Some("192.0.2.7")))]
#[case::kube_vip_ignores_metallb(kube_vip(), with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, "192.0.2.7")]), Ok(None))]
#[case::empty_default_annotation(
    empty(),
    with(lb("d", "s"), &[("cherryservers.com/loadBalancerIPs", "192.0.2.7")]),
    Ok(Some("192.0.2.7"))
)]
#[case::spec_ip(metallb(), ServiceFacts { load_balancer_ip: Some("192.0.2.5".into()), ..lb("d", "s") }, Ok(Some("192.0.2.5")))]
#[case::spec_blank(metallb(), ServiceFacts { load_balancer_ip: Some(" ".into()), ..lb("d", "s") }, Ok(None))]
#[case::annotation_wins_over_spec(
    metallb(),
    ServiceFacts { load_balancer_ip: Some("192.0.2.5".into()), ..with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, "192.0.2.7")]) },
    Ok(Some("192.0.2.7"))
)]
#[case::bad_annotation(metallb(), with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, "not-an-ip")]), Err(METALLB_IPS_ANNOTATION))]
#[case::empty_annotation(metallb(), with(lb("d", "s"), &[(METALLB_IPS_ANNOTATION, " , ")]), Err(METALLB_IPS_ANNOTATION))]
#[case::bad_spec(metallb(), ServiceFacts { load_balancer_ip: Some("1.2.3".into()), ..lb("d", "s") }, Err("spec.loadBalancerIP"))]
fn requested_ip_table(
    #[case] mode: LoadBalancerMode,
    #[case] svc: ServiceFacts,
    #[case] want: Result<Option<&str>, &str>,
) {
    match (requested_ip(&svc, &mode), want) {
        (Ok(got), Ok(want)) => assert_eq!(got, want.map(ip)),
        (Err(got), Err(field)) => {
            assert_eq!(got.field, field);
            // The Event names the annotation and its value.
            let text = got.to_string();
            assert!(text.contains(field), "{text}");
        }
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

#[rstest]
#[case::global_wins(Some("LT-Siauliai"), &[("cherryservers.com/fip-region", "NL-Amsterdam")], Ok(("LT-Siauliai", true)))]
#[case::global_blank_falls_back(Some(" "), &[("cherryservers.com/fip-region", "NL-Amsterdam")], Ok(("NL-Amsterdam", false)))]
#[case::annotation(None, &[("cherryservers.com/fip-region", " LT-Siauliai ")], Ok(("LT-Siauliai", false)))]
#[case::missing(None, &[], Err("cherryservers.com/fip-region"))]
#[case::empty_annotation(None, &[("cherryservers.com/fip-region", "")], Err("cherryservers.com/fip-region=\"\""))]
#[case::bad_chars(None, &[("cherryservers.com/fip-region", "LT/../x")], Err("cherryservers.com/fip-region=\"LT/../x\""))]
fn region_table(
    #[case] global: Option<&str>,
    #[case] annotations: &[(&str, &str)],
    #[case] want: Result<(&str, bool), &str>,
) {
    let svc = with(lb("d", "s"), annotations);
    match (choose_region(global, "cherryservers.com/fip-region", &svc), want) {
        (Ok(got), Ok((region, global))) => {
            assert_eq!(got.region, region);
            assert_eq!(got.source == RegionSource::Global, global);
        }
        (Err(got), Err(needle)) => {
            let text = got.to_string();
            assert!(text.contains(needle), "{text:?} should name {needle:?}");
        }
        (got, want) => panic!("got {got:?}, want {want:?}"),
    }
}

fn record(id: &str, address: Option<&str>) -> Record {
    Record {
        id: id.into(),
        address: address.map(ip),
    }
}

#[rstest]
#[case::fresh(None, None, None, Decision::Create)]
#[case::found(
    None,
    None,
    Some(fip("a", "203.0.113.1")),
    Decision::Publish(fip("a", "203.0.113.1"))
)]
#[case::found_and_shown(
    Some("203.0.113.1"),
    Some(record("a", Some("203.0.113.1"))),
    Some(fip("a", "203.0.113.1")),
    Decision::Publish(fip("a", "203.0.113.1"))
)]
#[case::record_lost_found_by_tags(
    Some("203.0.113.1"),
    None,
    Some(fip("a", "203.0.113.1")),
    Decision::Publish(fip("a", "203.0.113.1"))
)]
#[case::byo(Some("192.0.2.50"), None, None, Decision::ByoIp(ip("192.0.2.50")))]
#[case::byo_after_ours(
    Some("192.0.2.50"), Some(record("a", Some("203.0.113.1"))), Some(fip("a", "203.0.113.1")),
    Decision::ReleaseForByoIp { requested: ip("192.0.2.50"), ours: fip("a", "203.0.113.1") }
)]
#[case::ours_vanished_recreate(
    Some("203.0.113.1"),
    Some(record("a", Some("203.0.113.1"))),
    None,
    Decision::Create
)]
#[case::ours_vanished_but_user_ip(
    Some("192.0.2.50"),
    Some(record("a", Some("203.0.113.1"))),
    None,
    Decision::ByoIp(ip("192.0.2.50"))
)]
#[case::replaced_fip_is_ours(
    Some("203.0.113.1"),
    Some(record("a", Some("203.0.113.1"))),
    Some(fip("b", "203.0.113.2")),
    Decision::Publish(fip("b", "203.0.113.2"))
)]
fn decide_table(
    #[case] requested: Option<&str>,
    #[case] record: Option<Record>,
    #[case] ours: Option<OwnedFip>,
    #[case] want: Decision,
) {
    assert_eq!(decide(requested.map(ip), record.as_ref(), ours), want);
}

#[rstest]
#[case::none(vec![], None, None, None, vec![])]
#[case::one(vec![fip("a", "203.0.113.1")], None, None, Some("a"), vec![])]
#[case::lowest_id(vec![fip("b", "203.0.113.2"), fip("a", "203.0.113.1")], None, None, Some("a"), vec!["b"])]
#[case::recorded(
    vec![fip("a", "203.0.113.1"), fip("b", "203.0.113.2")], Some(record("b", None)), None, Some("b"), vec!["a"]
)]
#[case::requested(
    vec![fip("a", "203.0.113.1"), fip("b", "203.0.113.2")], None, Some("203.0.113.2"), Some("b"), vec!["a"]
)]
#[case::record_beats_requested(
    vec![fip("a", "203.0.113.1"), fip("b", "203.0.113.2")], Some(record("a", None)), Some("203.0.113.2"), Some("a"), vec!["b"]
)]
fn pick_table(
    #[case] candidates: Vec<OwnedFip>,
    #[case] record: Option<Record>,
    #[case] requested: Option<&str>,
    #[case] chosen: Option<&str>,
    #[case] extras: Vec<&str>,
) {
    let (got, rest) = pick(candidates, record.as_ref(), requested.map(ip));
    assert_eq!(got.map(|f| f.id), chosen.map(str::to_owned));
    assert_eq!(rest.into_iter().map(|f| f.id).collect::<Vec<_>>(), extras);
}

#[test]
fn record_reads_id_and_address() {
    assert_eq!(Record::read(&lb("d", "s")), None);
    assert_eq!(
        Record::read(&with(lb("d", "s"), &[(FIP_ID_ANNOTATION, " ")])),
        None
    );
    assert_eq!(
        Record::read(&with(
            lb("d", "s"),
            &[
                (FIP_ID_ANNOTATION, "u-1"),
                (FIP_ADDRESS_ANNOTATION, "203.0.113.4")
            ]
        )),
        Some(record("u-1", Some("203.0.113.4")))
    );
    assert_eq!(
        Record::read(&with(
            lb("d", "s"),
            &[(FIP_ID_ANNOTATION, "u-1"), (FIP_ADDRESS_ANNOTATION, "junk")]
        )),
        Some(record("u-1", None))
    );
}

#[rstest]
#[case::metallb(metallb(), METALLB_IPS_ANNOTATION)]
#[case::kube_vip(kube_vip(), KUBE_VIP_IPS_ANNOTATION)]
#[case::empty_default(empty(), "cherryservers.com/loadBalancerIPs")]
#[case::empty_custom("empty://?ip-annotation=x.io/ip".parse().unwrap(), "x.io/ip")]
fn publish_writes_the_implementations_annotation(#[case] mode: LoadBalancerMode, #[case] key: &str) {
    let f = fip("u-1", "203.0.113.4");
    let changes = publish_changes(&lb("d", "s"), &mode, &f);
    let want: BTreeMap<String, String> = [
        (key, "203.0.113.4"),
        (FIP_ID_ANNOTATION, "u-1"),
        (FIP_ADDRESS_ANNOTATION, "203.0.113.4"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(changes.annotations, want);
    assert!(changes.status);
}

#[test]
fn publish_is_a_no_op_when_shown() {
    let f = fip("u-1", "203.0.113.4");
    let mut svc = with(
        lb("d", "s"),
        &[
            (METALLB_IPS_ANNOTATION, "203.0.113.4"),
            (FIP_ID_ANNOTATION, "u-1"),
            (FIP_ADDRESS_ANNOTATION, "203.0.113.4"),
        ],
    );
    svc.ingress_ips = vec!["203.0.113.4".into()];
    assert_eq!(publish_changes(&svc, &metallb(), &f), PublishChanges::default());
    // A second ingress entry (someone else's) is corrected.
    svc.ingress_ips.push("192.0.2.1".into());
    assert!(publish_changes(&svc, &metallb(), &f).status);
}

#[test]
fn removals_keep_a_user_ip() {
    let ours = with(
        lb("d", "s"),
        &[
            (METALLB_IPS_ANNOTATION, "203.0.113.4"),
            (FIP_ID_ANNOTATION, "u-1"),
            (FIP_ADDRESS_ANNOTATION, "203.0.113.4"),
        ],
    );
    assert_eq!(
        record_removals(&ours, Some(&metallb())),
        vec![FIP_ID_ANNOTATION, FIP_ADDRESS_ANNOTATION, METALLB_IPS_ANNOTATION]
    );
    let user = with(ours, &[(METALLB_IPS_ANNOTATION, "192.0.2.50")]);
    assert_eq!(
        record_removals(&user, Some(&metallb())),
        vec![FIP_ID_ANNOTATION, FIP_ADDRESS_ANNOTATION]
    );
    assert!(record_removals(&lb("d", "s"), Some(&metallb())).is_empty());
}

#[test]
fn orphans_are_fips_whose_service_is_not_in_the_store() {
    let fip = |id: &str, tag: &str| TaggedFip {
        id: id.into(),
        service_tag: tag.into(),
    };
    let fips = [
        fip("a", "live"),
        fip("b", "gone"),
        fip("c", "cluster-ip"),
        fip("d", "live"),
    ];
    let owners: std::collections::HashSet<String> = ["live".to_owned(), "cluster-ip".to_owned()].into();
    assert_eq!(orphans(&fips, &owners), vec!["b".to_owned()]);
    assert!(orphans(&[], &owners).is_empty());
}

const OLD_TERM: Duration = Duration::from_secs(600);

const FIP: FipNow = FipNow {
    same_owner_tag: true,
    routed: false,
    control_plane: false,
};

#[rstest]
#[case::an_orphan_is_released(OLD_TERM, Some(FIP), Owner::Unseen, Sweep::Delete)]
#[case::owner_gone_long_ago(OLD_TERM, Some(FIP), Owner::SeenAgo(Duration::from_secs(61)), Sweep::Delete)]
#[case::never_in_a_young_term(
    Duration::from_secs(59),
    Some(FIP),
    Owner::Unseen,
    Sweep::Keep(Kept::YoungTerm)
)]
#[case::owner_exists_now(OLD_TERM, Some(FIP), Owner::Exists, Sweep::Keep(Kept::OwnerExists))]
#[case::owner_seen_a_moment_ago(
    OLD_TERM,
    Some(FIP),
    Owner::SeenAgo(Duration::from_secs(5)),
    Sweep::Keep(Kept::OwnerSeenRecently)
)]
#[case::already_gone(OLD_TERM, None, Owner::Unseen, Sweep::Keep(Kept::Gone))]
#[case::retagged(OLD_TERM, Some(FipNow { same_owner_tag: false, ..FIP }), Owner::Unseen, Sweep::Keep(Kept::Retagged))]
#[case::routed(OLD_TERM, Some(FipNow { routed: true, ..FIP }), Owner::Unseen, Sweep::Keep(Kept::Routed))]
#[case::control_plane(OLD_TERM, Some(FipNow { control_plane: true, ..FIP }), Owner::Unseen, Sweep::Keep(Kept::ControlPlane))]
fn the_sweep_deletes_only_a_fip_orphaned_now(
    #[case] term_age: Duration,
    #[case] fip: Option<FipNow>,
    #[case] owner: Owner,
    #[case] want: Sweep,
) {
    let check = SweepCheck { term_age, fip, owner };
    assert_eq!(sweep_decision(&check), want);
}

#[test]
fn a_service_refused_by_the_prefix_budget_gets_only_the_record() {
    let svc = lb("apps", "web");
    let changes = withhold_handoff(
        publish_changes(&svc, &metallb(), &fip("f1", "203.0.113.5")),
        &metallb(),
    );
    assert!(!changes.status);
    assert_eq!(
        changes.annotations.keys().map(String::as_str).collect::<Vec<_>>(),
        vec![FIP_ADDRESS_ANNOTATION, FIP_ID_ANNOTATION]
    );
}

fn cloud_fip(address: &str, target: Option<u64>, tags: &[(&str, &str)]) -> IpAddress {
    serde_json::from_value(serde_json::json!({
        "id": format!("id-{address}"),
        "address": address,
        "type": "floating-ip",
        "targeted_to": target.map(|t| serde_json::json!({"id": t})),
        "tags": tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
    }))
    .unwrap()
}

#[test]
fn asked_addresses_reads_every_implementations_annotation_and_the_spec() {
    let mut svc = with(
        lb("apps", "web"),
        &[
            (METALLB_LEGACY_IPS_ANNOTATION, "203.0.113.1, 2001:db8::1"),
            (KUBE_VIP_IPS_ANNOTATION, "203.0.113.2"),
            ("example.com/ips", "203.0.113.3"),
            (METALLB_IPS_ANNOTATION, "not-an-ip"),
        ],
    );
    svc.load_balancer_ip = Some("203.0.113.4".into());
    let got: Vec<String> = asked_addresses(&svc, Some("example.com/ips"))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        got,
        [
            "203.0.113.1",
            "203.0.113.2",
            "203.0.113.3",
            "203.0.113.4",
            "2001:db8::1"
        ]
    );
    assert!(asked_addresses(&lb("apps", "plain"), None).is_empty());
}

fn with_ip(mut svc: ServiceFacts, address: &str) -> ServiceFacts {
    svc.load_balancer_ip = Some(address.into());
    svc
}

#[rstest]
#[case::annotated(with(lb("default", "api"), &[("baton.dev/control-plane-endpoint", "true")]), true)]
#[case::annotated_loosely(with(lb("default", "api"), &[("baton.dev/control-plane-endpoint", " True ")]), true)]
#[case::annotated_false(with(lb("default", "api"), &[("baton.dev/control-plane-endpoint", "false")]), false)]
#[case::class(ServiceFacts { class: Some("baton.dev/control-plane".into()), ..lb("default", "api-int") }, true)]
#[case::the_mirror_without_its_annotation(lb("kube-system", "baton-kubernetes-external"), true)]
#[case::the_ccms_mirror(lb("kube-system", "cloud-provider-cherry-kubernetes-external"), true)]
#[case::a_ccm_mirror_name_elsewhere(lb("apps", "cloud-provider-cherry-kubernetes-external"), false)]
#[case::our_class(ServiceFacts { class: Some(LOAD_BALANCER_CLASS.into()), ..lb("apps", "web") }, false)]
#[case::plain(lb("apps", "web"), false)]
fn control_plane_service_table(#[case] svc: ServiceFacts, #[case] want: bool) {
    assert_eq!(is_control_plane_service(&svc, MIRROR), want, "{svc:?}");
}

#[test]
fn a_service_of_any_name_asking_for_a_control_plane_fip_is_never_managed() {
    let tag: baton_core::FipTag = "cluster=my-cp".parse().unwrap();
    let ips = vec![
        // The fipTag FIP, momentarily unassigned.
        cloud_fip("203.0.113.1", None, &[("cluster", "my-cp")]),
        // Routed to a server, and no control-plane Service asks for it: an operator's FIP for a
        // workload Service, not a control-plane address.
        cloud_fip("203.0.113.2", Some(7), &[]),
        // A workload FIP (announced by BGP, never targeted).
        cloud_fip("203.0.113.3", None, &[("usage", "cloud-provider-cherry-auto")]),
        // Routed to a server and asked for by a control-plane Service of class
        // baton.dev/control-plane (a bootstrap API Service that lost its annotation).
        cloud_fip("203.0.113.4", Some(8), &[]),
    ];
    let api = with_ip(
        with(
            lb("default", "api"),
            &[("baton.dev/control-plane-endpoint", "true")],
        ),
        "203.0.113.9",
    );
    let api_int = with_ip(
        ServiceFacts {
            class: Some("baton.dev/control-plane".into()),
            ..lb("default", "api-int")
        },
        "203.0.113.4",
    );
    // baton's mirror by name, its annotation lost, asking by MetalLB's annotation.
    let mirror = with(lb(MIRROR.0, MIRROR.1), &[(METALLB_IPS_ANNOTATION, "203.0.113.8")]);
    let services = [api, api_int, mirror];
    let cp = control_plane_addresses(Some(&tag), &ips, &services, MIRROR);
    let got: Vec<String> = cp.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["203.0.113.1", "203.0.113.4", "203.0.113.8", "203.0.113.9"]);

    // cloud-provider-cherry's leftover mirror, by spec and by MetalLB annotation.
    let leftover = with_ip(
        lb("kube-system", "cloud-provider-cherry-kubernetes-external"),
        "203.0.113.1",
    );
    assert_eq!(
        scope_excluding(&leftover, MIRROR, &cp, None),
        Scope::Ignored(Ignored::ControlPlaneEndpoint)
    );
    let by_annotation = with(lb("apps", "sneaky"), &[(METALLB_IPS_ANNOTATION, "203.0.113.4")]);
    assert_eq!(
        scope_excluding(&by_annotation, MIRROR, &cp, None),
        Scope::Ignored(Ignored::ControlPlaneEndpoint)
    );
    let custom = with(lb("apps", "custom"), &[("example.com/ips", "203.0.113.9")]);
    assert_eq!(scope_excluding(&custom, MIRROR, &cp, None), Scope::Managed);
    assert_eq!(
        scope_excluding(&custom, MIRROR, &cp, Some("example.com/ips")),
        Scope::Ignored(Ignored::ControlPlaneEndpoint)
    );
    // A workload FIP, a FIP routed to a server for a workload Service, or a user's own address
    // is still the Service's.
    let workload = with(lb("apps", "web"), &[(METALLB_IPS_ANNOTATION, "203.0.113.3")]);
    assert_eq!(scope_excluding(&workload, MIRROR, &cp, None), Scope::Managed);
    let routed = with_ip(lb("apps", "byo"), "203.0.113.2");
    assert_eq!(scope_excluding(&routed, MIRROR, &cp, None), Scope::Managed);
    // Other reasons to ignore keep their reason.
    let opted = with_ip(
        with(lb("apps", "out"), &[(MANAGED_ANNOTATION, "false")]),
        "203.0.113.1",
    );
    assert_eq!(
        scope_excluding(&opted, MIRROR, &cp, None),
        Scope::Ignored(Ignored::OptedOut)
    );
    // Without a fipTag and without the Services, nothing is a control-plane address: routing
    // alone never makes one.
    assert!(control_plane_addresses(None, &ips, &[], MIRROR).is_empty());
}

#[test]
fn a_routed_fip_of_a_workload_service_is_brought_not_announced() {
    let tag: baton_core::FipTag = "cluster=my-cp".parse().unwrap();
    let ips = vec![
        // The control-plane FIP, routed to its holder: a control-plane address only.
        cloud_fip("203.0.113.1", Some(600_101), &[("cluster", "my-cp")]),
        // The operator's FIP, routed to cp-0 for a workload Service.
        cloud_fip("203.0.113.2", Some(600_101), &[]),
        // baton's FIP of a Service, which the operator then targeted to cp-1 by the API.
        cloud_fip(
            "203.0.113.3",
            Some(600_102),
            &[("usage", "cloud-provider-cherry-auto")],
        ),
        // A workload FIP announced by BGP.
        cloud_fip("203.0.113.5", None, &[("usage", "cloud-provider-cherry-auto")]),
    ];
    let roles = FipRoles::of(Some(&tag), &ips, &[], MIRROR);
    assert_eq!(roles.control_plane, BTreeSet::from([ip("203.0.113.1")]));
    assert_eq!(
        roles.routed,
        BTreeMap::from([(ip("203.0.113.2"), 600_101), (ip("203.0.113.3"), 600_102)])
    );
    assert_eq!(roles.routed_to(ip("203.0.113.2")), Some(600_101));
    assert_eq!(
        roles.routed_to(ip("203.0.113.1")),
        None,
        "control-plane, not routed BYO"
    );
    assert_eq!(roles.routed_to(ip("203.0.113.5")), None, "announced by BGP");
    assert_eq!(
        roles.never_announced(),
        BTreeSet::from([ip("203.0.113.1"), ip("203.0.113.2"), ip("203.0.113.3")])
    );

    // The Service asking for the routed FIP is managed: it brings its own address (no FIP of
    // baton's carries its tags), so baton sets its ingress and reserves nothing.
    let byo = with_ip(lb("apps", "byo"), "203.0.113.2");
    assert_eq!(
        scope_excluding(&byo, MIRROR, &roles.control_plane, None),
        Scope::Managed
    );
    let requested = requested_ip(&byo, &metallb()).unwrap();
    assert_eq!(requested, Some(ip("203.0.113.2")));
    assert_eq!(decide(requested, None, None), Decision::ByoIp(ip("203.0.113.2")));
    // It takes no slot of the BGP prefix budget (it is never announced); a plain Service does.
    let plain = lb("apps", "web");
    let admission = budget::admitted(
        &[byo.clone(), plain],
        MIRROR,
        &roles.never_announced(),
        &BTreeSet::new(),
        Some(1),
    );
    assert!(admission.admitted.contains("apps/web"), "{admission:?}");
    assert!(!admission.admitted.contains("apps/byo") && !admission.refuses("apps/byo"));
    // Nor is it pending once its ingress shows the address.
    let shown = ServiceFacts {
        ingress_ips: vec!["203.0.113.2".into()],
        ..byo
    };
    assert!(!is_pending(&shown, MIRROR, &roles.control_plane, None));
}

#[test]
fn the_ccms_cleanup_finalizer_goes_only_from_a_deleted_service_after_batons_own() {
    let mut going = lb("apps", "web");
    going.deleting = true;
    assert!(clears_ccm_finalizer(&going, true, MIRROR));
    assert!(!clears_ccm_finalizer(&going, false, MIRROR), "not there");
    let mut live = going.clone();
    live.deleting = false;
    assert!(
        !clears_ccm_finalizer(&live, true, MIRROR),
        "a live Service keeps it"
    );
    let mut ours_first = going.clone();
    ours_first.has_finalizer = true;
    assert!(
        !clears_ccm_finalizer(&ours_first, true, MIRROR),
        "baton's cleanup first"
    );
    let mut other = going.clone();
    other.class = Some("example.com/other".into());
    assert!(
        !clears_ccm_finalizer(&other, true, MIRROR),
        "another controller's Service"
    );
    let mut opted = with(going.clone(), &[(MANAGED_ANNOTATION, "false")]);
    opted.deleting = true;
    assert!(
        clears_ccm_finalizer(&opted, true, MIRROR),
        "the CCM put it on opted-out Services too"
    );
    let mut cluster_ip = going;
    cluster_ip.type_ = Some("ClusterIP".into());
    assert!(
        clears_ccm_finalizer(&cluster_ip, true, MIRROR),
        "a Service turned ClusterIP after the CCM stopped"
    );
}

#[test]
fn a_term_is_dated_from_its_first_look_and_only_a_new_term_restarts_it() {
    use baton_cloud::Lead;
    let t0 = tokio::time::Instant::now();
    let s = Duration::from_secs;
    let lead = |term, until| Some(Lead { term, until });
    let mut clock = TermClock::default();
    assert_eq!(clock.age(None, t0), None, "not leading");
    assert_eq!(clock.age(lead(1, t0 + s(10)), t0), Some(s(0)), "a term begins");
    // Renewed before each deadline: one term.
    assert_eq!(clock.age(lead(1, t0 + s(15)), t0 + s(8)), Some(s(8)));
    // A late renewal pauses writes (no age while paused), then the same term goes on.
    assert_eq!(clock.age(lead(1, t0 + s(15)), t0 + s(16)), None, "paused");
    assert_eq!(clock.age(lead(1, t0 + s(40)), t0 + s(25)), Some(s(25)));
    // A new term starts afresh.
    assert_eq!(clock.age(lead(2, t0 + s(40)), t0 + s(30)), Some(s(0)));
    assert_eq!(clock.age(lead(2, t0 + s(40)), t0 + s(35)), Some(s(5)));
}

#[test]
fn a_reconcile_waits_while_the_watch_shows_a_version_its_own_writes_superseded() {
    use super::{AHEAD_WAIT, OwnWrites};
    let t0 = std::time::Instant::now();
    let mut own = OwnWrites::default();
    // Read at 10; the annotations made 11, the status 12.
    own.wrote("d/s".into(), "10", "11", t0);
    own.wrote("d/s".into(), "10", "12", t0);
    assert!(own.behind("d/s", "10", t0), "the version read");
    assert!(
        own.behind("d/s", "11", t0),
        "the annotations' event, before the status'"
    );
    assert!(!own.behind("d/s", "other", t0), "another Service");
    // The watch shows the last write: acted on, and the record is gone.
    assert!(!own.behind("d/s", "12", t0));
    assert!(!own.behind("d/s", "11", t0));
    // A watch that never catches up is waited for only so long.
    own.wrote("d/s".into(), "12", "13", t0);
    assert!(own.behind("d/s", "12", t0 + AHEAD_WAIT / 2));
    assert!(!own.behind("d/s", "12", t0 + AHEAD_WAIT));
    // A version someone else wrote since is acted on.
    own.wrote("d/s".into(), "13", "14", t0);
    assert!(!own.behind("d/s", "15", t0));
}
