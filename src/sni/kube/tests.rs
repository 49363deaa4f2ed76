use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use rstest::rstest;

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

fn namespace(name: &str, labels: &[(&str, &str)], domains: Option<&str>) -> Arc<Namespace> {
    let mut meta = serde_json::json!({"name": name});
    let labels: serde_json::Map<_, _> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::json!(v)))
        .collect();
    meta["labels"] = labels.into();
    if let Some(d) = domains {
        meta["annotations"] = serde_json::json!({ SNI_DOMAINS: d });
    }
    Arc::new(serde_json::from_value(serde_json::json!({"metadata": meta})).unwrap())
}

/// Namespaces t1, a, b, c allowed by flag for example.com; backends in 10.0.0.0/8.
fn open_policy() -> Policy {
    Policy::from_flags(
        &[
            "t1=example.com,t1.internal".into(),
            "a=example.com".into(),
            "b=example.com".into(),
            "c=example.com".into(),
        ],
        "baton.dev/sni-tenants=true",
        &["10.0.0.0/8".into()],
    )
    .unwrap()
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
    let (tenants, problems) = tenants(&services, &slices, &[], &open_policy());
    assert_eq!(problems, []);
    assert_eq!(
        tenants,
        [Tenant {
            service: "t1/apiserver".into(),
            hosts: vec!["api.t1.example.com".into(), "api.t1.internal".into()],
            backends: vec![a("10.0.0.1:6443"), a("10.0.0.2:6443")],
            ports: vec![(443, vec![a("10.0.0.9:9090")])],
        }]
    );
    let spec = spec(&tenants);
    assert_eq!(spec.tenants.len(), 1);
    assert_eq!(
        spec.ports,
        [(
            vec!["api.t1.example.com".to_owned(), "api.t1.internal".to_owned()],
            443,
            vec![a("10.0.0.9:9090")]
        )]
    );
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
    let (tenants, problems) = tenants(&services, &[], &[], &open_policy());
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
    // The conflict is told to both Services, each naming the other.
    let events = problems[1].events();
    assert_eq!(
        events
            .iter()
            .map(|(svc, reason, _, other)| (*svc, *reason, *other))
            .collect::<Vec<_>>(),
        [
            ("b/new", "SniHostConflict", Some("a/old")),
            ("a/old", "SniHostConflict", Some("b/new"))
        ]
    );
    assert!(
        events[1].2.contains("b/new also claims host api.x.example.com"),
        "{}",
        events[1].2
    );
}

#[test]
fn only_namespaces_allowed_by_flag_or_label_have_tenants_and_only_under_their_domains() {
    let policy = Policy::from_flags(
        &["flagged=t1.example.com".into()],
        "baton.dev/sni-tenants=true",
        &["10.0.0.0/8".into()],
    )
    .unwrap();
    let namespaces = [
        namespace(
            "labelled",
            &[("baton.dev/sni-tenants", "true")],
            Some("t2.example.com"),
        ),
        namespace(
            "other-value",
            &[("baton.dev/sni-tenants", "false")],
            Some("t3.example.com"),
        ),
        namespace("plain", &[], Some("t4.example.com")),
        namespace("no-domains", &[("baton.dev/sni-tenants", "true")], None),
    ];
    let t = "2026-01-01T00:00:00Z";
    let services = [
        service(
            "flagged",
            "api",
            t,
            Some("api.t1.example.com,t1.example.com,evil.t1.example.com.attacker.net"),
            &["https"],
        ),
        service(
            "labelled",
            "api",
            t,
            Some("api.t2.example.com,api.t1.example.com"),
            &["https"],
        ),
        service("other-value", "api", t, Some("api.t3.example.com"), &["https"]),
        service("plain", "api", t, Some("api.t4.example.com"), &["https"]),
        service("no-domains", "api", t, Some("api.t5.example.com"), &["https"]),
        service("unknown-ns", "api", t, Some("api.t6.example.com"), &["https"]),
    ];
    let (tenants, problems) = tenants(&services, &[], &namespaces, &policy);
    let routed: Vec<_> = tenants
        .iter()
        .map(|t| (t.service.as_str(), t.hosts.join(",")))
        .collect();
    assert_eq!(
        routed,
        [
            ("flagged/api", "api.t1.example.com,t1.example.com".to_owned()),
            ("labelled/api", "api.t2.example.com".to_owned()),
        ],
        "namespaces not allowed (label value, no label, no such namespace) are ignored"
    );
    let refused: Vec<_> = problems
        .iter()
        .map(|p| match p {
            Problem::HostNotAllowed { service, host, .. } => (service.as_str(), host.as_str()),
            other => panic!("{other}"),
        })
        .collect();
    assert_eq!(
        refused,
        [
            ("flagged/api", "evil.t1.example.com.attacker.net"),
            ("labelled/api", "api.t1.example.com"),
            ("no-domains/api", "api.t5.example.com"),
        ],
        "a claim outside the namespace's domains is refused (a labelled namespace without domains has none)"
    );
    assert_eq!(problems[1].events()[0].1, "SniHostNotAllowed");
    // Without the label option, only flags allow.
    let strict = Policy::from_flags(&[], "", &[]).unwrap();
    assert!(strict.allows_nothing());
    assert!(tenants_of(&services, &namespaces, &strict).is_empty());
}

fn tenants_of(services: &[Arc<Service>], namespaces: &[Arc<Namespace>], policy: &Policy) -> Vec<Tenant> {
    tenants(services, &[], namespaces, policy).0
}

#[test]
fn backends_outside_the_allowed_networks_or_local_are_left_out_and_reported() {
    let mut policy = open_policy();
    policy.local.insert("10.0.0.7".parse().unwrap());
    let services = [service(
        "t1",
        "api",
        "2026-01-01T00:00:00Z",
        Some("api.t1.example.com"),
        &["https"],
    )];
    let slices = [slice(
        "t1",
        "api",
        ("https", 6443),
        &[
            ("10.0.0.1", None),
            ("192.0.2.1", None),
            ("127.0.0.1", None),
            ("169.254.169.254", None),
            ("10.0.0.7", None),
        ],
    )];
    let (tenants, problems) = tenants(&services, &slices, &[], &policy);
    assert_eq!(tenants[0].backends, [a("10.0.0.1:6443")]);
    let refused: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(refused.len(), 4, "{refused:#?}");
    for (addr, why) in [
        ("192.0.2.1", "outside the allowed networks"),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.7", "an address of this node"),
    ] {
        assert!(
            refused.iter().any(|r| r.contains(addr) && r.contains(why)),
            "{addr}: {refused:#?}"
        );
    }
}

#[rstest]
#[case("10.244.1.5", None)]
#[case("::ffff:10.244.1.5", None)]
#[case("10.245.0.1", Some("outside the allowed networks (--backend-cidr)"))]
#[case("127.0.0.1", Some("a loopback, link-local, multicast or unspecified address"))]
#[case("::1", Some("a loopback, link-local, multicast or unspecified address"))]
#[case("fe80::1", Some("a loopback, link-local, multicast or unspecified address"))]
#[case(
    "169.254.169.254",
    Some("a loopback, link-local, multicast or unspecified address")
)]
#[case("0.0.0.0", Some("a loopback, link-local, multicast or unspecified address"))]
#[case("224.0.0.1", Some("a loopback, link-local, multicast or unspecified address"))]
#[case("2001:db8::5", None)]
fn which_backends_may_be_dialled(#[case] ip: &str, #[case] why: Option<&str>) {
    let policy = Policy::from_flags(&[], "", &["10.244.0.0/16".into(), "2001:db8::/32".into()]).unwrap();
    assert_eq!(policy.refuses(ip.parse().unwrap()), why);
}

#[rstest]
#[case("api.t1.example.com", "example.com", true)]
#[case("example.com", "example.com", true)]
#[case("badexample.com", "example.com", false)]
#[case("api.example.com.evil", "example.com", false)]
#[case("com", "example.com", false)]
fn host_names_in_a_domain(#[case] host: &str, #[case] domain: &str, #[case] inside: bool) {
    assert_eq!(in_domain(host, domain), inside);
}

#[rstest]
#[case(&["t1"], "", &[], "--tenant-namespace \"t1\": expected NS=DOMAIN[,DOMAIN…]")]
#[case(&["T 1=example.com"], "", &[], "--tenant-namespace \"T 1=example.com\": \"T 1\" is not a namespace name")]
#[case(&["t1=exa mple.com"], "", &[], "--tenant-namespace \"t1=exa mple.com\": \"exa mple.com\" is not a domain name")]
#[case(&["t1=a.com", "t1=b.com"], "", &[], "--tenant-namespace \"t1=b.com\": namespace t1 is given twice")]
#[case(&[], "tenants", &[], "--tenant-namespace-label \"tenants\": expected KEY=VALUE, or \"\" for none")]
#[case(&[], "", &["10.0.0.0/33"], "--backend-cidr \"10.0.0.0/33\": not a CIDR (e.g. 10.244.0.0/16)")]
fn bad_policy_flags_name_the_flag_and_the_value(
    #[case] namespaces: &[&str],
    #[case] label: &str,
    #[case] cidrs: &[&str],
    #[case] want: &str,
) {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let e = Policy::from_flags(&owned(namespaces), label, &owned(cidrs)).unwrap_err();
    assert_eq!(e.to_string(), want);
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
