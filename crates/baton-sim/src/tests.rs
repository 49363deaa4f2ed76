use super::*;

fn options() -> SimOptions {
    SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        cloud: CloudKind::Cherry,
        hetzner: HetznerSettings::default(),
        topology: None,
        state: None,
        api_key: None,
        fip_pool: None,
        forward_ports: None,
        route_fips: None,
        faults: Faults::default(),
    }
}

#[test]
fn options_override_the_topology() {
    let (builder, listen) = SimOptions {
        forward_ports: Some(vec![6443, 443]),
        fip_pool: Some("203.0.113.128/25".into()),
        api_key: Some("k".into()),
        faults: Faults {
            error_rate: 0.3,
            rate_limit: None,
            retarget_delay_ms: 250,
            ..Faults::default()
        },
        ..options()
    }
    .into_builder()
    .unwrap();
    assert_eq!(listen.port(), 0);
    assert_eq!(builder.faults.rate_limit, None);
    assert!((builder.faults.error_rate - 0.3).abs() < f64::EPSILON);
    assert_eq!(builder.topology.forward_ports, [6443, 443]);
    assert_eq!(builder.topology.fip_pool, "203.0.113.128/25");
    assert_eq!(builder.topology.api_key, "k");
    assert_eq!(builder.faults.retarget_delay_ms, 250);
}

#[test]
fn defaults_match_the_issue() {
    let (builder, _) = options().into_builder().unwrap();
    assert_eq!(builder.faults.rate_limit, Some(4.0));
    assert_eq!(builder.faults.retarget_delay_ms, 0);
    assert_eq!(builder.topology.api_key, "sim-token");
    assert_eq!(builder.topology.project.id, 123_456);
}

#[test]
fn a_missing_topology_file_names_the_file() {
    let err = SimOptions {
        topology: Some("/nonexistent/topology.yaml".into()),
        ..options()
    }
    .into_builder()
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/topology.yaml"), "{err}");
}

#[test]
fn topology_file_round_trips_through_yaml() {
    let text = serde_yaml_ng::to_string(&Topology::default()).unwrap();
    assert_eq!(Topology::from_text(&text).unwrap(), Topology::default());
    let small = "api_key: k\nservers:\n  - {id: 1, hostname: a, primary_ip: 198.51.100.5}\n";
    let t = Topology::from_text(small).unwrap();
    assert_eq!(t.servers.len(), 1);
    assert_eq!(t.servers[0].region, "LT-Siauliai");
    assert!(Topology::from_text("bogus_field: 1").is_err());
}
