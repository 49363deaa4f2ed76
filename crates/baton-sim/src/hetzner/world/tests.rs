use rstest::rstest;

use super::*;
use crate::TopoFip;
use baton_cloud::model::ServerId;

const NOW: u64 = 1_738_238_400; // 2025-01-30T12:00:00Z

fn world() -> HetznerWorld {
    HetznerWorld::from_topology(&Topology::default(), NOW).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn create(w: &mut HetznerWorld, pairs: &[(&str, &str)]) -> FloatingIp {
    let req = CreateFloatingIpRequest {
        ip_type: "ipv4".into(),
        home_location: Some("fsn1".into()),
        labels: Some(labels(pairs)),
        ..Default::default()
    };
    w.create_fip(req, NOW, false).unwrap().0
}

#[rstest]
#[case(0, "1970-01-01T00:00:00+00:00")]
#[case(NOW, "2025-01-30T12:00:00+00:00")]
#[case(951_782_400, "2000-02-29T00:00:00+00:00")]
#[case(4_107_542_399, "2100-02-28T23:59:59+00:00")]
fn stamps_are_rfc3339(#[case] secs: u64, #[case] text: &str) {
    assert_eq!(stamp(secs), text);
}

#[test]
fn the_lab_topology_reads_as_hetzner_servers() {
    let w = world();
    let servers = w.list_servers(&ServerFilter::default());
    assert_eq!(servers.len(), 6);
    let cp0 = servers.iter().find(|s| s.name == "cp-0").unwrap();
    assert_eq!(cp0.id, 600_101);
    assert_eq!(cp0.status, "running");
    assert_eq!(cp0.location.name, "fsn1");
    assert_eq!(cp0.location.network_zone, "eu-central");
    assert_eq!(cp0.public_net.ipv4.as_ref().unwrap().ip, "198.51.100.11");
    assert_eq!(cp0.private_net[0].ip, "192.0.2.11");
    assert_eq!(cp0.labels["role"], "control-plane");
    let filter = ServerFilter {
        selector: Selector::parse("role=control-plane").unwrap(),
        ..ServerFilter::default()
    };
    assert_eq!(w.list_servers(&filter).len(), 3);
    let filter = ServerFilter {
        status: vec!["off".into()],
        ..ServerFilter::default()
    };
    assert!(w.list_servers(&filter).is_empty());
    assert_eq!(w.list_locations(None).len(), 6);
    assert_eq!(w.get_server(1).unwrap_err().status, 404);
}

#[test]
fn reserved_fips_keep_their_labels_and_assignment() {
    let mut topo = Topology::default();
    topo.floating_ips.push(TopoFip {
        id: Some("4711".into()),
        address: Some("203.0.113.50".parse().unwrap()),
        tags: labels(&[("cluster", "lab")]),
        targeted_to: Some(600_102),
        ..TopoFip::default()
    });
    let w = HetznerWorld::from_topology(&topo, NOW).unwrap();
    let fip = w.get_fip(4711).unwrap();
    assert_eq!((fip.ip.as_str(), fip.server), ("203.0.113.50", Some(600_102)));
    assert_eq!(fip.labels["cluster"], "lab");
    assert_eq!(fip.home_location.name, "fsn1");
    let peek = w.peek_ip("4711").unwrap();
    assert_eq!(peek.target(), Some(ServerId(600_102)));
    assert_eq!(peek.targeted_to.unwrap().hostname, "cp-1");
    assert_eq!(peek.tags["cluster"], "lab");
    assert_eq!(peek.region.unwrap().slug, "fsn1");
    assert_eq!(w.get_server(600_102).unwrap().public_net.floating_ips, [4711]);

    topo.floating_ips[0].id = Some("not-a-number".into());
    assert!(HetznerWorld::from_topology(&topo, NOW).is_err());
}

#[test]
fn an_assign_moves_the_fip_only_when_its_action_succeeds() {
    let mut w = world();
    let fip = create(&mut w, &[("k", "v")]);
    assert_eq!(fip.ip, "203.0.113.1");
    let action = w.assign(fip.id, 600_101, Reassign::Direct, NOW, false).unwrap();
    assert_eq!(
        (action.command.as_str(), action.status.as_str()),
        ("assign_floating_ip", "running")
    );
    assert_eq!(action.resources.len(), 2);
    assert_eq!(w.get_fip(fip.id).unwrap().server, None);
    assert!(w.forward_map().is_empty());
    // Another action on the FIP while this one runs: 423.
    let locked = w.unassign(fip.id, NOW, false).unwrap_err();
    assert_eq!((locked.status, locked.code), (423, "locked"));
    assert_eq!(w.delete_fip(fip.id).unwrap_err().code, "locked");

    assert!(w.complete(action.id, NOW + 1));
    assert!(!w.complete(action.id, NOW + 2), "an action ends once");
    let done = w.get_action(action.id).unwrap();
    assert_eq!((done.status.as_str(), done.progress), ("success", 100));
    assert_eq!(done.finished.as_deref(), Some("2025-01-30T12:00:01+00:00"));
    assert_eq!(w.get_fip(fip.id).unwrap().server, Some(600_101));
    let route: Vec<_> = w.forward_map().into_iter().collect();
    assert_eq!(
        route,
        [("203.0.113.1".parse().unwrap(), "198.51.100.11".parse().unwrap())]
    );
    assert_eq!(w.fip_action(fip.id, action.id).unwrap().id, action.id);
    assert_eq!(w.actions_by_id(&[action.id, 999]).len(), 1);
}

#[test]
fn a_failed_action_leaves_the_fip_where_it_was() {
    let mut w = world();
    let fip = create(&mut w, &[]);
    let action = w.assign(fip.id, 600_101, Reassign::Direct, NOW, true).unwrap();
    w.complete(action.id, NOW);
    let failed = w.get_action(action.id).unwrap();
    assert_eq!(failed.status, "error");
    assert_eq!(failed.error.unwrap().code, "action_failed");
    assert_eq!(w.get_fip(fip.id).unwrap().server, None);
}

#[test]
fn reassign_moves_directly_or_is_refused() {
    let mut w = world();
    let fip = create(&mut w, &[]);
    let first = w.assign(fip.id, 600_101, Reassign::Direct, NOW, false).unwrap();
    w.complete(first.id, NOW);
    let refused = w
        .assign(fip.id, 600_102, Reassign::Refuse, NOW, false)
        .unwrap_err();
    assert_eq!((refused.status, refused.code), (422, "floating_ip_assigned"));
    // The same server again is no reassignment.
    let again = w.assign(fip.id, 600_101, Reassign::Refuse, NOW, false).unwrap();
    w.complete(again.id, NOW);
    let moved = w.assign(fip.id, 600_102, Reassign::Direct, NOW, false).unwrap();
    w.complete(moved.id, NOW);
    assert_eq!(w.get_fip(fip.id).unwrap().server, Some(600_102));
    let off = w.unassign(fip.id, NOW, false).unwrap();
    assert_eq!(off.resources[1].id, 600_102);
    w.complete(off.id, NOW);
    assert_eq!(w.get_fip(fip.id).unwrap().server, None);
}

#[test]
fn assign_checks_the_server_and_its_network_zone() {
    let mut w = world();
    let fip = create(&mut w, &[]);
    assert_eq!(
        w.assign(fip.id, 1, Reassign::Direct, NOW, false)
            .unwrap_err()
            .status,
        404
    );
    assert_eq!(
        w.assign(99, 600_101, Reassign::Direct, NOW, false)
            .unwrap_err()
            .status,
        404
    );
    // nbg1 is in eu-central too; ash is not.
    for (home, ok) in [("nbg1", true), ("ash", false)] {
        let req = CreateFloatingIpRequest {
            ip_type: "ipv4".into(),
            home_location: Some(home.into()),
            ..Default::default()
        };
        let fip = w.create_fip(req, NOW, false).unwrap().0;
        let result = w.assign(fip.id, 600_101, Reassign::Direct, NOW, false);
        assert_eq!(result.is_ok(), ok, "{home}");
        if let Err(e) = result {
            assert_eq!((e.status, e.code), (422, "invalid_input"));
        }
    }
}

#[test]
fn create_validates_its_input() {
    let mut w = world();
    let bad = |req: CreateFloatingIpRequest| w.clone().create_fip(req, NOW, false).unwrap_err();
    let base = CreateFloatingIpRequest {
        ip_type: "ipv4".into(),
        home_location: Some("fsn1".into()),
        ..Default::default()
    };
    let e = bad(CreateFloatingIpRequest {
        labels: Some(labels(&[("bad key", "v")])),
        ..base.clone()
    });
    assert_eq!((e.status, e.code), (422, "invalid_input"));
    assert_eq!(e.details.unwrap()["fields"][0]["name"], "labels");
    let e = bad(CreateFloatingIpRequest {
        ip_type: "ipv5".into(),
        ..base.clone()
    });
    assert_eq!(e.details.unwrap()["fields"][0]["name"], "type");
    let e = bad(CreateFloatingIpRequest {
        home_location: Some("mars1".into()),
        ..base.clone()
    });
    assert_eq!(e.details.unwrap()["fields"][0]["name"], "home_location");
    let e = bad(CreateFloatingIpRequest {
        home_location: None,
        ..base.clone()
    });
    assert_eq!(e.code, "invalid_input");

    let named = CreateFloatingIpRequest {
        name: Some("api".into()),
        ..base.clone()
    };
    w.create_fip(named.clone(), NOW, false).unwrap();
    let e = w.create_fip(named, NOW, false).unwrap_err();
    assert_eq!((e.status, e.code), (409, "uniqueness_error"));
    assert_eq!(e.details.unwrap()["fields"][0]["name"], "name");
}

#[test]
fn create_with_a_server_starts_an_assign_action() {
    let mut w = world();
    let req = CreateFloatingIpRequest {
        ip_type: "ipv4".into(),
        server: Some(600_103),
        ..Default::default()
    };
    let (fip, action) = w.create_fip(req, NOW, false).unwrap();
    let action = action.unwrap();
    assert_eq!(fip.home_location.name, "fsn1", "the server's location");
    assert_eq!(fip.server, None, "assigned when the action succeeds");
    w.complete(action.id, NOW);
    assert_eq!(w.get_fip(fip.id).unwrap().server, Some(600_103));
}

#[test]
fn update_replaces_labels_and_delete_respects_protection() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1"), ("b", "2")]);
    let req = UpdateFloatingIpRequest {
        labels: Some(labels(&[("c", "3")])),
        description: Some("api".into()),
        ..Default::default()
    };
    let updated = w.update_fip(fip.id, req).unwrap();
    assert_eq!(updated.labels, labels(&[("c", "3")]));
    assert_eq!(updated.description.as_deref(), Some("api"));
    let bad = UpdateFloatingIpRequest {
        labels: Some(labels(&[("c", "not valid")])),
        ..Default::default()
    };
    assert_eq!(w.update_fip(fip.id, bad).unwrap_err().code, "invalid_input");

    let action = w.change_protection(fip.id, Some(true), NOW).unwrap();
    assert_eq!(action.status, "success");
    let e = w.delete_fip(fip.id).unwrap_err();
    assert_eq!((e.status, e.code), (423, "protected"));
    w.change_protection(fip.id, Some(false), NOW).unwrap();
    w.delete_fip(fip.id).unwrap();
    assert_eq!(w.get_fip(fip.id).unwrap_err().status, 404);
    assert_eq!(w.fips_created_deleted(), (1, 1));
}

#[test]
fn list_filters_by_selector_and_name() {
    let mut w = world();
    create(&mut w, &[("env", "prod"), ("role", "api")]);
    create(&mut w, &[("env", "dev")]);
    let named = CreateFloatingIpRequest {
        ip_type: "ipv4".into(),
        home_location: Some("fsn1".into()),
        name: Some("special".into()),
        ..Default::default()
    };
    w.create_fip(named, NOW, false).unwrap();
    let count = |selector: &str, name: Option<&str>| {
        let filter = FipFilter {
            selector: Selector::parse(selector).unwrap(),
            name: name.map(str::to_owned),
        };
        w.list_fips(&filter).len()
    };
    assert_eq!(count("", None), 3);
    assert_eq!(count("env=prod", None), 1);
    assert_eq!(count("env", None), 2);
    assert_eq!(count("!env", None), 1);
    assert_eq!(count("env in (prod,dev),role!=api", None), 1);
    assert_eq!(count("", Some("special")), 1);
}

#[test]
fn duplicates_are_counted_by_label_set() {
    let mut w = world();
    create(&mut w, &[("service", "a")]);
    create(&mut w, &[("service", "a")]);
    create(&mut w, &[("service", "b")]);
    assert_eq!(w.duplicate_fips(), 1);
    w.reset_census();
    assert_eq!(w.duplicate_fips(), 1, "two FIPs still carry the same labels");
}

#[test]
fn the_state_round_trips_and_ends_running_actions_on_load() {
    let mut w = world();
    let fip = create(&mut w, &[("k", "v")]);
    let action = w.assign(fip.id, 600_101, Reassign::Direct, NOW, false).unwrap();
    let text = serde_json::to_string(&w).unwrap();
    assert!(text.contains(r#""cloud":"hetzner""#));
    let mut back: HetznerWorld = serde_json::from_str(&text).unwrap();
    assert_eq!(back.get_fip(fip.id).unwrap().labels["k"], "v");
    back.complete_all(NOW + 5);
    assert_eq!(back.get_action(action.id).unwrap().status, "success");
    assert_eq!(back.get_fip(fip.id).unwrap().server, Some(600_101));
    // Ids go on from where they were.
    assert_eq!(create(&mut back, &[]).id, fip.id + 1);
}
