use super::*;

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The backends a connection for `host` on local port `port` is sent to.
fn backends_on(table: &RouteTable, host: &str, port: u16) -> Option<Vec<SocketAddr>> {
    table
        .for_host_port(Some(host), port)
        .map(|s| s.backends.iter().map(|b| b.addr).collect())
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
        "--route \"api.t1.example.com\": expected HOST[,HOST…][:PORT]=ADDR[,ADDR…]"
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

/// The ports of an order, and whether each is a trial.
fn ports(order: &[Attempt]) -> Vec<(u16, bool)> {
    order.iter().map(|a| (a.backend.addr.port(), a.trial)).collect()
}

#[test]
fn health_is_shared_across_tables_and_a_down_backend_gets_one_trial_after_its_hold_down() {
    let health = Health::default();
    let mut spec = RouteSpec::default();
    spec.add_route("t.example=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
        .unwrap();
    let first = spec.build(&health);
    let set = first.for_host(Some("t.example")).unwrap().clone();
    let now = health.now_ms();
    // Round robin over the three.
    let starts: Vec<_> = (0..3)
        .map(|_| set.order(now).unwrap()[0].backend.addr.port())
        .collect();
    assert_eq!(starts, [1, 2, 3]);
    health.mark_down(&set.backends[0]);
    // A new table (a reload) shares the health: the down backend is skipped in its hold-down.
    let second = spec.build(&health);
    let set2 = second.for_host(Some("t.example")).unwrap();
    for _ in 0..3 {
        let order = set2.order(now).unwrap();
        assert_eq!(order.len(), 2, "{:?}", ports(&order));
        assert!(order.iter().all(|a| a.backend.addr.port() != 1));
    }
    // After the hold-down one connection at a time tries it, after the up ones.
    let later = now + u64::try_from(DOWN_FOR.as_millis()).unwrap() + 1;
    let trial = set2.order(later).unwrap();
    assert_eq!(
        trial.last().map(|a| (a.backend.addr.port(), a.trial)),
        Some((1, true))
    );
    let meanwhile = set2.order(later).unwrap();
    assert_eq!(meanwhile.len(), 2, "no second trial while one runs");
    drop(trial); // the trial ended (here without a verdict): the next may try
    assert_eq!(set2.order(later).unwrap().len(), 3);
    Health::mark_up(&set.backends[0]);
    assert!(set2.backends[0].is_up(health.now_ms()));
    assert!(set2.order(later).unwrap().iter().all(|a| !a.trial));
}

#[test]
fn a_tenant_with_no_backend_to_try_fails_fast() {
    let health = Health::default();
    let mut spec = RouteSpec::default();
    spec.add_route("t.example=127.0.0.1:1,127.0.0.1:2").unwrap();
    spec.tenants.push((vec!["empty.example".into()], vec![]));
    let table = spec.build(&health);
    let set = table.for_host(Some("t.example")).unwrap();
    for b in &set.backends {
        health.mark_down(b);
    }
    let now = health.now_ms();
    assert_eq!(set.order(now).unwrap_err(), NoBackend::NoneHealthy);
    // An active health check's Down is never tried, hold-down or not.
    let later = now + 10 * u64::try_from(DOWN_FOR.as_millis()).unwrap();
    set.backends[0].set_probed_down(true);
    assert_eq!(ports(&set.order(later).unwrap()), [(2, true)]);
    let empty = table.for_host(Some("empty.example")).unwrap();
    assert_eq!(empty.order(now).unwrap_err(), NoBackend::Empty);
}

#[test]
fn a_backend_set_has_at_most_its_connects_in_flight() {
    let mut spec = RouteSpec::default();
    spec.add_route("t.example=127.0.0.1:1").unwrap();
    let table = spec.build(&Health::default());
    let set = table.for_host(Some("t.example")).unwrap();
    let first = set.connecting(2).unwrap();
    let _second = set.connecting(2).unwrap();
    assert_eq!(set.connecting(2).unwrap_err(), NoBackend::Busy);
    drop(first);
    assert!(set.connecting(2).is_ok());
}

#[test]
fn a_port_route_serves_its_port_and_the_default_route_the_others() {
    let mut services = RouteSpec::default();
    services.tenants.push((
        vec!["api.t1.example".into(), "alt.t1.example".into()],
        vec![a("10.0.0.1:6443")],
    ));
    services.ports.push((
        vec!["api.t1.example".into(), "alt.t1.example".into()],
        8132,
        vec![a("10.0.0.1:8132")],
    ));
    let mut flags = RouteSpec::default();
    flags.add_route("alt.t1.example=127.0.0.1:9").unwrap();
    // The flag owns alt.t1.example on every port; the Service keeps api.t1.example.
    let skipped = flags.merge_missing(&services);
    assert_eq!(skipped, ["alt.t1.example"]);
    let table = flags.build(&Health::default());
    let on = |host: &str, port: u16| backends_on(&table, host, port);
    assert_eq!(on("api.t1.example", 443), Some(vec![a("10.0.0.1:6443")]));
    assert_eq!(on("api.t1.example", 8132), Some(vec![a("10.0.0.1:8132")]));
    assert_eq!(
        table.for_host_port(Some("api.t1.example"), 8132).unwrap().name,
        "api.t1.example:8132"
    );
    assert_eq!(on("alt.t1.example", 8132), Some(vec![a("127.0.0.1:9")]));
    assert!(table.for_host_port(Some("other.example"), 8132).is_none());
    assert!(table.is_routed("api.t1.example"));
    assert_eq!(table.sets().len(), 3);
}

#[test]
fn a_route_with_a_port_serves_that_port_and_clashes_only_there() {
    let mut spec = RouteSpec::default();
    spec.add_route("api.t1.example=10.0.0.1:6443").unwrap();
    spec.add_route("api.t1.example, Konn.t1.example:8132=10.0.0.1:8132,10.0.0.2:8132")
        .unwrap();
    let table = spec.build(&Health::default());
    let on = |host: &str, port: u16| backends_on(&table, host, port);
    assert_eq!(on("api.t1.example", 443), Some(vec![a("10.0.0.1:6443")]));
    assert_eq!(
        on("api.t1.example", 8132),
        Some(vec![a("10.0.0.1:8132"), a("10.0.0.2:8132")])
    );
    assert_eq!(
        on("konn.t1.example", 8132),
        Some(vec![a("10.0.0.1:8132"), a("10.0.0.2:8132")])
    );
    // A host with a route for one port only has none on the others (no default here).
    assert_eq!(on("konn.t1.example", 443), None);
    // Both names are published (DNS, logs), each once.
    let mut hosts: Vec<&str> = table.hosts().collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["api.t1.example", "konn.t1.example"]);
    assert_eq!(table.host_count(), 2);

    let e = spec.add_route("konn.t1.example:8132=127.0.0.1:1").unwrap_err();
    assert!(
        e.to_string()
            .contains("host konn.t1.example is routed twice on port 8132"),
        "{e}"
    );
    // Another port, or every port, is free for it.
    spec.add_route("konn.t1.example:8133=127.0.0.1:1").unwrap();
    spec.add_route("konn.t1.example=127.0.0.1:2").unwrap();
    for bad in [
        "a.b:0=127.0.0.1:1",
        "a.b:x=127.0.0.1:1",
        "a.b:70000=127.0.0.1:1",
        "a.b:=127.0.0.1:1",
    ] {
        let e = spec.add_route(bad).unwrap_err();
        assert_eq!(e.field, "--route");
        assert!(e.why.contains("is not a port (1-65535)"), "{bad}: {e}");
    }

    // The routes file has the same form, and a clash with the flags is on the same port only.
    let file = RouteSpec::parse_file("api.t2.example:8132=10.0.0.3:8132\n").unwrap();
    assert_eq!(file.ports.len(), 1);
    spec.merge(&file).unwrap();
    let clash = RouteSpec::parse_file("api.t1.example:8132=10.0.0.9:8132\n").unwrap();
    let e = spec.merge(&clash).unwrap_err();
    assert!(e.why.contains("routed twice on port 8132"), "{e}");
}

#[test]
fn a_host_a_flag_routes_on_one_port_is_not_taken_by_a_service() {
    let mut flags = RouteSpec::default();
    flags.add_route("api.t1.example:8132=127.0.0.1:9").unwrap();
    let mut services = RouteSpec::default();
    services.add_route("api.t1.example=10.0.0.1:6443").unwrap();
    services.add_route("api.t1.example:8132=10.0.0.1:8132").unwrap();
    assert_eq!(flags.merge_missing(&services), ["api.t1.example"]);
    let table = flags.build(&Health::default());
    assert_eq!(
        backends_on(&table, "api.t1.example", 8132),
        Some(vec![a("127.0.0.1:9")])
    );
    assert_eq!(backends_on(&table, "api.t1.example", 443), None);
}
