use super::*;
use baton_cloud::model::TargetedTo;

fn world() -> World {
    World::from_topology(&Topology::default()).unwrap()
}

fn create(w: &mut World, tags: &[(&str, &str)]) -> IpAddress {
    let tags = tags
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    w.create_ip(
        123_456,
        CreateIpRequest {
            region: "LT-Siauliai".into(),
            tags,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn default_topology_has_the_lab_servers() {
    let w = world();
    let servers = w.list_servers(123_456, None).unwrap();
    assert_eq!(servers.len(), 6);
    let cp0 = servers.iter().find(|s| s.hostname == "cp-0").unwrap();
    assert_eq!(
        cp0.first_ipv4(&IpType::PrimaryIp),
        Some("198.51.100.11".parse().unwrap())
    );
    assert_eq!(
        cp0.first_ipv4(&IpType::PrivateIp),
        Some("192.0.2.11".parse().unwrap())
    );
    assert_eq!(cp0.region.as_ref().unwrap().bgp.asn, 16_125);
    assert_eq!(w.list_servers(1, None).unwrap_err().status, 404);
}

#[test]
fn fips_come_from_the_pool_in_order() {
    let mut w = world();
    assert_eq!(create(&mut w, &[("a", "1")]).address.to_string(), "203.0.113.1");
    let second = create(&mut w, &[("a", "2")]);
    assert_eq!(second.address.to_string(), "203.0.113.2");
    assert_eq!(second.cidr, "203.0.113.2/32");
    assert!(second.targeted_to.is_none() && second.routed_to.is_none());
}

#[test]
fn region_by_slug_legacy_name_or_id() {
    let w = world();
    for key in ["LT-Siauliai", "Lithuania", "EU-Nord-1", "eu_nord_1", "1"] {
        assert_eq!(w.resolve_region(key).unwrap(), 1, "{key}");
    }
    assert_eq!(w.resolve_region("lt-siauliai").unwrap_err().status, 400);
}

#[test]
fn retarget_fills_routed_to_and_targeted_to_and_zero_unassigns() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1")]);
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo(Some(ServerId(600_101)))),
        ..Default::default()
    };
    let ip = w.update_ip(fip.id.as_str(), req).unwrap();
    assert_eq!(ip.target(), Some(ServerId(600_101)));
    let routed = ip.routed_to.unwrap();
    assert_eq!(routed.ip_type, IpType::PrimaryIp);
    assert_eq!(routed.address.to_string(), "198.51.100.11");
    assert_eq!(w.forward_map().len(), 1);

    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo::NONE),
        ..Default::default()
    };
    let ip = w.update_ip(fip.id.as_str(), req).unwrap();
    assert!(ip.targeted_to.is_none() && ip.routed_to.is_none());
    assert!(w.forward_map().is_empty());
}

#[test]
fn tags_are_replaced_wholesale() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1"), ("b", "2")]);
    let req = UpdateIpRequest {
        tags: Some(Tags::from([("c".into(), "3".into())])),
        ..Default::default()
    };
    let ip = w.update_ip(fip.id.as_str(), req).unwrap();
    assert_eq!(ip.tags.len(), 1);
    assert_eq!(ip.tags["c"], "3");
}

#[test]
fn unchanged_ptr_record_is_a_500() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1")]);
    let set = |p: &str| UpdateIpRequest {
        ptr_record: Some(p.into()),
        ..Default::default()
    };
    let ip = w.update_ip(fip.id.as_str(), set("api.example.com")).unwrap();
    assert_eq!(ip.ptr_record.as_deref(), Some("api.example.com."));
    assert_eq!(
        w.update_ip(fip.id.as_str(), set("api.example.com"))
            .unwrap_err()
            .status,
        500
    );
    assert_eq!(
        w.update_ip(fip.id.as_str(), set("api.example.com."))
            .unwrap_err()
            .status,
        500
    );
}

#[test]
fn delete_of_attached_fip_is_optionally_refused() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1")]);
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo(Some(ServerId(600_101)))),
        ..Default::default()
    };
    w.update_ip(fip.id.as_str(), req).unwrap();
    assert_eq!(w.delete_ip(fip.id.as_str(), true).unwrap_err().status, 400);
    w.delete_ip(fip.id.as_str(), false).unwrap();
    assert_eq!(w.get_ip(fip.id.as_str()).unwrap_err().status, 404);
}

#[test]
fn primary_ips_cannot_be_moved_or_deleted() {
    let mut w = world();
    let primary = w.list_ips(123_456, &["primary-ip".into()]).unwrap().remove(0);
    assert!(primary.assigned_to.is_some());
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo(Some(ServerId(600_101)))),
        ..Default::default()
    };
    assert_eq!(w.update_ip(primary.id.as_str(), req).unwrap_err().status, 400);
    assert_eq!(w.delete_ip(primary.id.as_str(), false).unwrap_err().status, 400);
}

#[test]
fn unknown_target_server_is_a_400() {
    let mut w = world();
    let fip = create(&mut w, &[("a", "1")]);
    let req = UpdateIpRequest {
        targeted_to: Some(TargetedTo(Some(ServerId(9)))),
        ..Default::default()
    };
    assert_eq!(w.update_ip(fip.id.as_str(), req).unwrap_err().status, 400);
}

#[test]
fn bgp_enable_on_project_and_server() {
    let mut w = world();
    let p = w
        .update_project(
            123_456,
            UpdateProjectRequest {
                name: None,
                bgp: Some(true),
            },
        )
        .unwrap();
    assert!(p.bgp.enabled);
    assert_eq!(p.bgp.local_asn, 65_000);
    let s = w
        .update_server(
            600_101,
            UpdateServerRequest {
                bgp: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(s.bgp.enabled);
    assert!(s.ip_addresses.is_empty(), "PUT responses carry no ip_addresses");
    assert!(!w.get_server(600_101).unwrap().ip_addresses.is_empty());
}

#[test]
fn ids_are_stable_across_builds() {
    let a = world().list_ips(123_456, &[]).unwrap();
    let b = world().list_ips(123_456, &[]).unwrap();
    assert_eq!(a, b);
    assert!(uuid::Uuid::parse_str(a[0].id.as_str()).is_ok());
}
