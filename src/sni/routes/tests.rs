use super::*;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn routes_parse_and_route_by_host_then_default() {
    let mut spec = RouteSpec::default();
    spec.add_route("api.t1.example.com,API.t1.internal.=127.0.0.1:1,127.0.0.1:2")
        .unwrap();
    spec.add_route("api.t2.example.com=127.0.0.1:3").unwrap();
    let health = Health::default();
    let table = spec.build(&health);
    assert_eq!(
        table.for_host(Some("api.t1.internal")).unwrap().name,
        "api.t1.example.com"
    );
    assert_eq!(
        table.for_host(Some("api.t2.example.com")).unwrap().backends[0].addr,
        a("127.0.0.1:3")
    );
    assert!(table.for_host(Some("api.t3.example.com")).is_none());
    assert!(table.for_host(None).is_none());
    spec.set_default("127.0.0.1:9").unwrap();
    let table = spec.build(&health);
    assert_eq!(
        table.for_host(Some("api.t3.example.com")).unwrap().name,
        "default"
    );
    assert_eq!(table.for_host(None).unwrap().name, "default");
    assert_eq!(table.host_count(), 3);
    assert_eq!(table.sets().len(), 3);
}

#[test]
fn bad_routes_name_the_flag_and_the_value() {
    let mut spec = RouteSpec::default();
    let e = spec.add_route("api.t1.example.com").unwrap_err();
    assert_eq!(
        e.to_string(),
        "--route \"api.t1.example.com\": expected HOST[,HOST…]=ADDR[,ADDR…]"
    );
    let e = spec.add_route("api t1=127.0.0.1:1").unwrap_err();
    assert!(e.to_string().contains("\"api t1\" is not a host name"), "{e}");
    let e = spec.add_route("a.b=127.0.0.1").unwrap_err();
    assert!(e.to_string().contains("\"127.0.0.1\" is not IP:PORT"), "{e}");
    spec.add_route("a.b=127.0.0.1:1").unwrap();
    let e = spec.add_route("A.B=127.0.0.1:2").unwrap_err();
    assert!(e.to_string().contains("host a.b is routed twice"), "{e}");
    let e = spec.add_destination("nowhere=a.b").unwrap_err();
    assert_eq!(e.field, "--proxy-route");
    let e = spec.set_default("").unwrap_err();
    assert_eq!(e.field, "--default");
}

#[test]
fn destinations_match_address_and_port_before_address() {
    let mut spec = RouteSpec::default();
    spec.add_destination("10.0.0.1=api.t1.example.com").unwrap();
    spec.add_destination("10.0.0.1:443=api.t2.example.com").unwrap();
    spec.add_destination("[2001:db8::1]=api.t3.example.com").unwrap();
    let table = spec.build(&Health::default());
    assert_eq!(
        table.host_for_destination(a("10.0.0.1:443")),
        Some("api.t2.example.com")
    );
    assert_eq!(
        table.host_for_destination(a("10.0.0.1:6443")),
        Some("api.t1.example.com")
    );
    assert_eq!(
        table.host_for_destination(a("[2001:db8::1]:443")),
        Some("api.t3.example.com")
    );
    assert_eq!(table.host_for_destination(a("10.0.0.2:443")), None);
}

#[test]
fn a_routes_file_merges_with_the_flags() {
    let text = "# tenants\napi.t1.example.com=127.0.0.1:1\n\ndefault=127.0.0.1:9 # fallback\nproxy 10.0.0.1=api.t1.example.com\n";
    let file = RouteSpec::parse_file(text).unwrap();
    assert_eq!(file.tenants.len(), 1);
    assert_eq!(file.default, vec![a("127.0.0.1:9")]);
    assert_eq!(file.destinations.len(), 1);
    let mut flags = RouteSpec::default();
    flags.add_route("api.t2.example.com=127.0.0.1:2").unwrap();
    flags.merge(&file).unwrap();
    assert_eq!(flags.tenants.len(), 2);
    let mut clash = RouteSpec::default();
    clash.add_route("api.t1.example.com=127.0.0.1:5").unwrap();
    assert!(clash.merge(&file).is_err());
    assert!(RouteSpec::parse_file("garbage line").is_err());
}

#[test]
fn health_is_shared_across_tables_and_down_backends_go_last() {
    let health = Health::default();
    let mut spec = RouteSpec::default();
    spec.add_route("t.example=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .unwrap();
    let first = spec.build(&health);
    let set = first.for_host(Some("t.example")).unwrap().clone();
    // Round robin over the three.
    let starts: Vec<_> = (0..3)
        .map(|_| set.order(health.now_ms())[0].addr.port())
        .collect();
    assert_eq!(starts, [1, 2, 3]);
    health.mark_down(&set.backends[0]);
    let second = spec.build(&health);
    let set2 = second.for_host(Some("t.example")).unwrap();
    for _ in 0..3 {
        let order = set2.order(health.now_ms());
        assert_eq!(order.len(), 3);
        assert_eq!(order[2].addr.port(), 1, "the down backend is tried last");
    }
    Health::mark_up(&set.backends[0]);
    assert!(set2.backends[0].is_up(health.now_ms()));
}
