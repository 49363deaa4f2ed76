use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::*;

fn service(ns: &str, name: &str, created: &str, hosts: Option<&str>, ports: &[&str]) -> Arc<Service> {
    let mut meta = serde_json::json!({"namespace": ns, "name": name, "creationTimestamp": created});
    if let Some(h) = hosts {
        meta["annotations"] = serde_json::json!({ SNI_HOSTS: h });
    }
    let ports: Vec<_> = ports
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({"name": n, "port": 443 + i}))
        .collect();
    Arc::new(serde_json::from_value(serde_json::json!({"metadata": meta, "spec": {"ports": ports}})).unwrap())
}

fn slice(ns: &str, svc: &str, port: (&str, u16), endpoints: &[(&str, Option<bool>)]) -> Arc<EndpointSlice> {
    let eps: Vec<_> = endpoints
        .iter()
        .map(|(ip, ready)| {
            let mut e = serde_json::json!({"addresses": [ip]});
            if let Some(r) = ready {
                e["conditions"] = serde_json::json!({"ready": r});
            }
            e
        })
        .collect();
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": format!("{svc}-x"),
                         "labels": {SERVICE_NAME_LABEL: svc}},
            "addressType": "IPv4",
            "ports": [{"name": port.0, "port": port.1}],
            "endpoints": eps,
        }))
        .unwrap(),
    )
}

fn a(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn an_annotated_service_is_a_tenant_with_its_ready_endpoints() {
    let services = [
        service(
            "t1",
            "apiserver",
            "2026-01-01T00:00:00Z",
            Some("API.t1.example.com, api.t1.internal"),
            &["metrics", "https"],
        ),
        service("t1", "plain", "2026-01-01T00:00:00Z", None, &["https"]),
    ];
    let slices = [
        slice(
            "t1",
            "apiserver",
            ("https", 6443),
            &[
                ("10.0.0.1", None),
                ("10.0.0.2", Some(true)),
                ("10.0.0.3", Some(false)),
            ],
        ),
        slice("t1", "apiserver", ("metrics", 9090), &[("10.0.0.9", None)]),
        slice("t2", "apiserver", ("https", 6443), &[("10.9.9.9", None)]),
    ];
    let (tenants, problems) = tenants(&services, &slices);
    assert_eq!(problems, []);
    assert_eq!(
        tenants,
        [Tenant {
            service: "t1/apiserver".into(),
            hosts: vec!["api.t1.example.com".into(), "api.t1.internal".into()],
            backends: vec![a("10.0.0.1:6443"), a("10.0.0.2:6443")],
        }]
    );
    let spec = spec(&tenants);
    assert_eq!(spec.tenants.len(), 1);
}

#[test]
fn a_host_claimed_twice_goes_to_the_older_service_and_bad_names_are_reported() {
    let services = [
        service(
            "b",
            "new",
            "2026-02-01T00:00:00Z",
            Some("api.x.example.com,api.b.example.com,bad name"),
            &["https"],
        ),
        service(
            "a",
            "old",
            "2026-01-01T00:00:00Z",
            Some("api.x.example.com"),
            &["https"],
        ),
        service(
            "c",
            "noport",
            "2026-01-01T00:00:00Z",
            Some("api.c.example.com"),
            &[],
        ),
    ];
    let (tenants, problems) = tenants(&services, &[]);
    let hosts: Vec<_> = tenants
        .iter()
        .map(|t| (t.service.as_str(), t.hosts.clone()))
        .collect();
    assert_eq!(
        hosts,
        [
            ("a/old", vec!["api.x.example.com".to_owned()]),
            ("b/new", vec!["api.b.example.com".to_owned()])
        ]
    );
    assert_eq!(
        problems,
        [
            Problem::NoPort {
                service: "c/noport".into()
            },
            Problem::Conflict {
                service: "b/new".into(),
                host: "api.x.example.com".into(),
                owner: "a/old".into()
            },
            Problem::BadHost {
                service: "b/new".into(),
                value: "bad name".into()
            },
        ]
    );
    assert!(problems[1].to_string().contains("already routed by a/old"));
}

#[test]
fn flags_and_the_file_win_over_services() {
    let mut fixed = RouteSpec::default();
    fixed.add_route("api.x.example.com=127.0.0.1:1").unwrap();
    let mut from_services = RouteSpec::default();
    from_services
        .add_route("api.x.example.com,api.y.example.com=127.0.0.1:2")
        .unwrap();
    from_services.add_route("api.z.example.com=127.0.0.1:3").unwrap();
    let skipped = fixed.merge_missing(&from_services);
    assert_eq!(skipped, ["api.x.example.com"]);
    let hosts: Vec<_> = fixed.tenants.iter().map(|(h, _)| h.join(",")).collect();
    assert_eq!(
        hosts,
        ["api.x.example.com", "api.y.example.com", "api.z.example.com"]
    );
}
