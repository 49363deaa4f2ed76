use super::report;
use super::report::*;
use crate::exit;
use k8s_openapi::api::core::v1::Node;

/// A named change to a healthy report.
type Case = (&'static str, Box<dyn Fn(&mut Report)>);

fn healthy() -> Report {
    Report {
        kubernetes: SourceStatus {
            reachable: true,
            ..SourceStatus::default()
        },
        cloud: SourceStatus {
            reachable: true,
            ..SourceStatus::default()
        },
        leader: Some(LeaderStatus {
            lease: "kube-system/baton-controller".into(),
            holder: Some("ctl-a".into()),
            valid: true,
            ..LeaderStatus::default()
        }),
        endpoints: vec![EndpointStatus {
            service: Some("kube-system/baton-kubernetes-external".into()),
            fip: Some("203.0.113.1".into()),
            fip_id: Some("x".into()),
            holder: Some(ServerRef {
                id: 600_101,
                hostname: "cp-0".into(),
            }),
            fip_ready: Some(true),
            candidates: vec![
                CandidateStatus {
                    address: "198.51.100.11:6443".into(),
                    ready: true,
                    holder: true,
                    ..CandidateStatus::default()
                },
                CandidateStatus {
                    address: "198.51.100.12:6443".into(),
                    ready: true,
                    ..CandidateStatus::default()
                },
            ],
            ..EndpointStatus::default()
        }],
        ..Report::default()
    }
}

fn assessed(mut r: Report) -> Report {
    r.assess();
    r
}

#[test]
fn all_well_is_healthy_exit_0() {
    let r = assessed(healthy());
    assert_eq!((r.verdict, r.exit_code), (Verdict::Healthy, exit::OK));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert!(render_text(&r).starts_with("baton status: HEALTHY (exit 0)"));
}

#[test]
fn no_leader_for_longer_than_the_limit_is_named_as_such() {
    let mut r = healthy();
    let l = r.leader.as_mut().unwrap();
    l.valid = false;
    l.leaderless_seconds = Some(LEADERLESS_LIMIT_SECONDS);
    let r = assessed(r);
    assert_eq!(r.verdict, Verdict::Degraded);
    assert!(
        !r.problems[0].message.contains("no leader for"),
        "at the limit: {:?}",
        r.problems
    );
    assert!(render_text(&r).contains("(EXPIRED, no leader for 60s)"));

    let mut r = healthy();
    let l = r.leader.as_mut().unwrap();
    l.valid = false;
    l.leaderless_seconds = Some(61);
    let r = assessed(r);
    assert_eq!(
        (r.verdict, r.exit_code),
        (Verdict::Degraded, exit::status::DEGRADED)
    );
    assert!(
        r.problems[0]
            .message
            .starts_with("no leader for 61s, longer than 60s: no controller holds the Lease"),
        "{:?}",
        r.problems
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["leader"]["leaderlessSeconds"], 61);
}

#[test]
fn attention_items_are_degraded_exit_10() {
    let cases: Vec<Case> = vec![
        (
            "no leader",
            Box::new(|r| r.leader.as_mut().unwrap().valid = false),
        ),
        (
            "unhealthy candidate",
            Box::new(|r| r.endpoints[0].candidates[1].ready = false),
        ),
        (
            "pending Service",
            Box::new(|r| {
                r.pending_services.push(PendingService {
                    service: "default/web".into(),
                    reason: "InvalidRegion: no region".into(),
                    ..PendingService::default()
                });
            }),
        ),
        (
            "uninitialised node",
            Box::new(|r| r.uninitialized_nodes.push("worker-0".into())),
        ),
        (
            "cloud unreadable",
            Box::new(|r| {
                r.cloud = SourceStatus {
                    error: Some("401".into()),
                    ..SourceStatus::default()
                };
            }),
        ),
        (
            "BGP annotations missing",
            Box::new(|r| r.bgp.nodes_missing.push("worker-1".into())),
        ),
    ];
    for (what, change) in cases {
        let mut r = healthy();
        change(&mut r);
        let r = assessed(r);
        assert_eq!(
            (r.verdict, r.exit_code),
            (Verdict::Degraded, exit::status::DEGRADED),
            "{what}: {:?}",
            r.problems
        );
    }
}

#[test]
fn an_endpoint_that_does_not_serve_is_down_exit_11() {
    let cases: Vec<Case> = vec![
        (
            "holder fails /readyz",
            Box::new(|r| r.endpoints[0].candidates[0].ready = false),
        ),
        ("FIP not routed", Box::new(|r| r.endpoints[0].holder = None)),
        (
            "FIP not in the project",
            Box::new(|r| r.endpoints[0].fip_id = None),
        ),
        (
            "FIP does not answer",
            Box::new(|r| r.endpoints[0].fip_ready = Some(false)),
        ),
        (
            "Kubernetes unreadable",
            Box::new(|r| {
                r.kubernetes = SourceStatus {
                    error: Some("connection refused".into()),
                    ..SourceStatus::default()
                };
            }),
        ),
    ];
    for (what, change) in cases {
        let mut r = healthy();
        change(&mut r);
        let r = assessed(r);
        assert_eq!(
            (r.verdict, r.exit_code),
            (Verdict::Down, exit::status::DOWN),
            "{what}"
        );
        assert_eq!(
            r.problems[0].severity,
            Verdict::Down,
            "most serious first: {what}"
        );
    }
}

#[test]
fn exit_codes_do_not_collide() {
    let taken = [
        exit::FAILURE,
        exit::CONFIG,
        exit::bootstrap::TIMEOUT,
        exit::bootstrap::CLOUD,
        exit::bootstrap::KUBERNETES,
        exit::bootstrap::DNS,
        exit::bootstrap::INTERRUPTED,
    ];
    for code in [exit::status::DEGRADED, exit::status::DOWN] {
        assert!(!taken.contains(&code), "{code}");
    }
}

#[test]
fn the_json_names_are_camel_case() {
    let r = assessed(healthy());
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["verdict"], "healthy");
    assert_eq!(v["exitCode"], 0);
    assert_eq!(v["leader"]["holder"], "ctl-a");
    assert_eq!(v["endpoints"][0]["holder"]["hostname"], "cp-0");
    assert!(v["pendingServices"].is_array() && v["uninitializedNodes"].is_array());
}

#[test]
fn a_service_asking_for_a_control_plane_fip_is_not_pending() {
    use std::collections::BTreeMap;
    let env: BTreeMap<String, String> = [
        ("CHERRY_API_KEY", "k"),
        ("CHERRY_PROJECT_ID", "1"),
        ("CHERRY_FIP_TAG", "cluster=my-cp"),
        ("CHERRY_LOAD_BALANCER", "metallb:///"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &env).unwrap();
    let svc = |name: &str, ip: Option<&str>| -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"type": "LoadBalancer", "loadBalancerIP": ip},
        }))
        .unwrap()
    };
    let facts = facts_of(
        &config,
        vec![svc("leftover", Some("203.0.113.1")), svc("web", None)],
    );
    let ips: Vec<baton_cloud::model::IpAddress> = vec![
        serde_json::from_value(serde_json::json!({
            "id": "a", "address": "203.0.113.1", "type": "floating-ip", "tags": {"cluster": "my-cp"},
        }))
        .unwrap(),
    ];
    let names = |ips: &[baton_cloud::model::IpAddress]| -> Vec<String> {
        super::pending_services(&facts, &config, ips, &[])
            .into_iter()
            .map(|p| p.service)
            .collect()
    };
    assert_eq!(names(&ips), ["apps/web"]);
    assert_eq!(
        names(&[]),
        ["apps/leftover", "apps/web"],
        "unknown to the cloud: a bring-your-own IP"
    );
}

#[test]
fn status_lists_the_addresses_the_rules_refuse_and_not_as_pending() {
    let env: std::collections::BTreeMap<String, String> = [
        ("CHERRY_API_KEY", "k"),
        ("CHERRY_PROJECT_ID", "1"),
        ("CHERRY_LOAD_BALANCER", "metallb:///"),
        ("BATON_SERVICE_ALLOCATION_NAMESPACES", "apps"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let config = crate::config::Config::resolve(&crate::config::ConfigArgs::default(), &env).unwrap();
    let svc =
        |ns: &str, name: &str, ip: &str, ingress: Option<&str>| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"type": "LoadBalancer", "loadBalancerIP": ip},
                "status": {"loadBalancer": {"ingress": ingress.map(|i| vec![serde_json::json!({"ip": i})])}},
            }))
            .unwrap()
        };
    let facts = facts_of(
        &config,
        vec![
            svc("apps", "ours", "203.0.113.10", Some("203.0.113.10")),
            // Used before this version: its ingress shows another cluster's FIP.
            svc("apps", "theirs", "203.0.113.20", Some("203.0.113.20")),
            svc("tenant", "ours", "203.0.113.10", None),
        ],
    );
    let ips: Vec<baton_cloud::model::IpAddress> = [("203.0.113.10", "uid-1"), ("203.0.113.20", "uid-2")]
        .iter()
        .map(|(a, c)| {
            serde_json::from_value(serde_json::json!({
                "id": format!("id-{a}"), "address": a, "type": "floating-ip", "tags": {"cluster": c},
            }))
            .unwrap()
        })
        .collect();
    let refused = super::refused_addresses(&facts, &config, &ips);
    let got: Vec<(&str, &str, bool)> = refused
        .iter()
        .map(|r| (r.service.as_str(), r.reason.as_str(), r.shown))
        .collect();
    assert_eq!(
        got,
        [
            ("apps/theirs", "FloatingIPNotOwned", true),
            ("tenant/ours", "AddressNamespaceNotAllowed", false),
        ]
    );
    assert!(super::pending_services(&facts, &config, &ips, &refused).is_empty());
    let mut report = super::report::Report {
        refused_addresses: refused,
        ..Default::default()
    };
    report.assess();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.severity == super::report::Verdict::Degraded
                && p.message.contains("apps/theirs asks for 203.0.113.20")
                && p.message.contains("withdraws it")),
        "{:?}",
        report.problems
    );
    let text = super::report::render_text(&report);
    assert!(text.contains("Addresses refused"), "{text}");
    // Another cluster's FIP is never offered for adoption.
    assert!(!text.contains("adoptFips="), "{text}");
}

#[test]
fn leaderless_seconds_come_from_the_lease_record() {
    let lease =
        |holder: Option<&str>, renewed: i64, duration: i32| -> k8s_openapi::api::coordination::v1::Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "baton-controller", "namespace": "kube-system"},
                "spec": {
                    "holderIdentity": holder,
                    "renewTime": k8s_openapi::jiff::Timestamp::from_second(renewed).unwrap().to_string(),
                    "leaseDurationSeconds": duration,
                }
            }))
            .unwrap()
        };
    let at = |l: &k8s_openapi::api::coordination::v1::Lease, now: i64| {
        let s = super::leader_status("kube-system", "baton-controller", Some(l), now);
        (s.valid, s.leaderless_seconds)
    };
    let held = lease(Some("ctl-a"), 1_000, 15);
    assert_eq!(at(&held, 1_010), (true, Some(0)));
    // Expired at 1,015: no leader since.
    assert_eq!(at(&held, 1_090), (false, Some(75)));
    // Released (holder cleared) at 1,000: no leader since.
    assert_eq!(at(&lease(None, 1_000, 15), 1_030), (false, Some(30)));
    let none = super::leader_status("kube-system", "baton-controller", None, 1_000);
    assert_eq!((none.valid, none.leaderless_seconds), (false, None));
}

fn cold_node(name: &str, cp_label: Option<&str>, ready: bool) -> Node {
    let labels = cp_label.map_or_else(
        || serde_json::json!({}),
        |v| serde_json::json!({"node-role.kubernetes.io/control-plane": v}),
    );
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "Unknown" }}]},
    }))
    .unwrap()
}

fn cold_pod(
    name: &str,
    node: &str,
    args: &[&str],
    env: &[(&str, &str)],
    ready: bool,
) -> k8s_openapi::api::core::v1::Pod {
    let env: Vec<serde_json::Value> = env
        .iter()
        .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "baton:0.1.0", "args": args, "env": env}]},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

#[test]
fn cold_start_names_every_node_that_could_not_come_back_alone() {
    let state = [("BATON_AGENT_STATE_DIR", "/var/lib/baton")];
    let nodes = vec![
        cold_node("cp-0", Some(""), true),
        // k3s and RKE2 label their control-plane nodes "true".
        cold_node("cp-1", Some("true"), true),
        cold_node("cp-2", Some(""), false),
        cold_node("worker", None, true),
    ];
    let pods = vec![
        cold_pod("baton-agent-a", "cp-0", &["agent"], &state, true),
        cold_pod("baton-agent-b", "cp-1", &["agent"], &state, true),
        cold_pod(
            "baton-standby-a",
            "cp-0",
            &["controller", "--standby", "--cloud-config", "x"],
            &[],
            true,
        ),
        cold_pod(
            "baton-standby-b",
            "cp-1",
            &["controller", "--standby"],
            &[],
            false,
        ),
        cold_pod(
            "baton-1",
            "cp-0",
            &["controller", "--cloud-config", "x"],
            &[],
            true,
        ),
        cold_pod("baton-2", "cp-2", &["controller"], &[], true),
        cold_pod("unrelated", "cp-0", &["serve"], &[], true),
    ];
    let c = super::cold_start(&nodes, &pods).unwrap();
    assert_eq!(c.node_file_dir.as_deref(), Some("/var/lib/baton"));
    let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        ["cp-0", "cp-1", "cp-2"],
        "control-plane nodes only, whatever the label value"
    );
    assert!(c.nodes[0].agent && c.nodes[0].standby && c.nodes[0].replicas == ["baton-1"]);
    assert!(c.nodes[1].agent && !c.nodes[1].standby);
    let problems: Vec<String> = report::cold_start_problems(&c)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].starts_with("no standby controller Ready on cp-1:"),
        "{problems:#?}"
    );
    assert!(
        problems[1].starts_with("controller replica baton-2 is bound to cp-2, which is not Ready"),
        "{problems:#?}"
    );
}

#[test]
fn cold_start_without_a_node_file_says_so_and_without_agent_pods_is_not_shown() {
    let nodes = vec![cold_node("cp-0", Some(""), true)];
    let pods = vec![
        cold_pod("baton-agent-a", "cp-0", &["agent"], &[], true),
        cold_pod("baton-standby-a", "cp-0", &["controller", "--standby"], &[], true),
    ];
    let c = super::cold_start(&nodes, &pods).unwrap();
    let problems: Vec<String> = report::cold_start_problems(&c)
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("keep no node file"), "{problems:#?}");
    assert!(
        super::cold_start(&nodes, &[]).is_none(),
        "no agent pod: baton does not run as pods here"
    );
}

/// What `baton status` read of a cluster `uid-1` holding only `services`.
fn facts_of(
    config: &crate::config::Config,
    services: Vec<k8s_openapi::api::core::v1::Service>,
) -> super::KubeFacts {
    super::KubeFacts {
        leader: None,
        services,
        nodes: Vec::new(),
        pods: Vec::new(),
        api_servers: Vec::new(),
        events: Vec::new(),
        policy: crate::controller::trust::EndpointPolicy::new(
            config,
            "uid-1",
            &std::collections::BTreeMap::new(),
        ),
        too_old: None,
        cluster_id: "uid-1".to_owned(),
        namespaces: None,
    }
}
