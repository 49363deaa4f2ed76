use clap::{CommandFactory as _, Parser};

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[test]
fn verify_cli() {
    Cli::command().debug_assert();
}

#[test]
fn args_map_to_faults_and_topology() {
    let cli = Cli::try_parse_from([
        "sim",
        "--listen",
        "127.0.0.1:0",
        "--rate-limit",
        "0",
        "--error-rate",
        "0.3",
        "--forward-ports",
        "6443,443",
        "--fip-pool",
        "203.0.113.128/25",
        "--retarget-delay-ms",
        "250",
        "--route-fips",
        "baton0",
    ])
    .unwrap();
    let options = cli.sim.into_options();
    assert_eq!(options.route_fips.as_deref(), Some("baton0"));
    assert_eq!(options.listen.port(), 0);
    assert_eq!(options.faults.rate_limit, None);
    assert!((options.faults.error_rate - 0.3).abs() < f64::EPSILON);
    assert_eq!(options.forward_ports, Some(vec![6443, 443]));
    assert_eq!(options.fip_pool.as_deref(), Some("203.0.113.128/25"));
    assert_eq!(options.faults.retarget_delay_ms, 250);
}

#[test]
fn defaults_match_the_issue() {
    let cli = Cli::try_parse_from(["sim"]).unwrap();
    assert_eq!(cli.sim.listen.to_string(), "127.0.0.1:8080");
    let options = cli.sim.into_options();
    assert_eq!(options.faults, Faults::default());
    assert_eq!(options.faults.rate_limit, Some(4.0));
    assert_eq!(options.faults.retarget_delay_ms, 0);
    assert_eq!(options.topology, None);
    assert_eq!(options.api_key, None);
}

#[test]
fn forward_ports_empty_disables_forwarding() {
    for args in [
        &["sim", "--forward-ports", ""][..],
        &["sim", "--forward-ports="][..],
        &["sim", "--forward-ports"][..],
    ] {
        let cli = Cli::try_parse_from(args).unwrap();
        assert_eq!(cli.sim.into_options().forward_ports, Some(vec![]), "{args:?}");
    }
    let cli = Cli::try_parse_from(["sim", "--forward-ports", "6443, 443"]).unwrap();
    assert_eq!(cli.sim.into_options().forward_ports, Some(vec![6443, 443]));
    let cli = Cli::try_parse_from(["sim"]).unwrap();
    assert_eq!(cli.sim.into_options().forward_ports, None, "the topology's ports");
    let err = Cli::try_parse_from(["sim", "--forward-ports", "6443,http"]).unwrap_err();
    assert!(err.to_string().contains("\"http\" is not a TCP port"), "{err}");
}

#[test]
fn deleting_an_attached_fip_is_refused_unless_allowed() {
    let cli = Cli::try_parse_from(["sim"]).unwrap();
    assert!(cli.sim.into_options().faults.reject_delete_attached);
    let cli = Cli::try_parse_from(["sim", "--allow-delete-attached"]).unwrap();
    assert!(!cli.sim.into_options().faults.reject_delete_attached);
}

#[test]
fn latency_flags_take_distributions_per_route() {
    let cli = Cli::try_parse_from([
        "sim",
        "--latency-ms",
        "300,2000",
        "--route-latency-ms",
        "POST /v1/projects/{id}/ips=p50:100,p99:900",
        "--route-latency-ms",
        "GET /v1/projects/{id}/ips=40",
        "--processing-ratio",
        "0.5",
        "--list-lag-ms",
        "800",
    ])
    .unwrap();
    let faults = cli.sim.into_options().faults;
    assert_eq!(faults.latency_ms, Latency::p50_p99(300, 2000));
    assert_eq!(
        faults.routes["POST /v1/projects/{id}/ips"].latency_ms,
        Some(Latency::Percentiles(vec![(50.0, 100), (99.0, 900)]))
    );
    assert_eq!(
        faults.routes["GET /v1/projects/{id}/ips"].latency_ms,
        Some(Latency::Fixed(40))
    );
    assert!((faults.processing_ratio - 0.5).abs() < f64::EPSILON);
    assert_eq!(faults.list_lag_ms, 800);
    faults.validate().unwrap();

    let err = Cli::try_parse_from(["sim", "--latency-ms", "2000,300"]).unwrap_err();
    assert!(err.to_string().contains("below p50"), "{err}");
    let err = Cli::try_parse_from(["sim", "--route-latency-ms", "ips=3"]).unwrap_err();
    assert!(
        err.to_string().contains("\"ips\" is not \"METHOD /v1/...\""),
        "{err}"
    );
}

#[test]
fn the_cloud_and_the_hetzner_settings_map_to_options() {
    let options = Cli::try_parse_from(["sim"]).unwrap().sim.into_options();
    assert_eq!(options.cloud, CloudKind::Cherry);
    assert_eq!(options.hetzner, HetznerSettings::default());

    let cli = Cli::try_parse_from([
        "sim",
        "--cloud",
        "hetzner",
        "--action-ms",
        "300,900",
        "--action-error-rate",
        "0.1",
        "--action-fail-servers",
        "worker-1,600101",
        "--reassign",
        "refuse",
        "--hetzner-bucket",
        "10",
        "--hetzner-refill-per-s",
        "0.5",
    ])
    .unwrap();
    let options = cli.sim.into_options();
    assert_eq!(options.cloud, CloudKind::Hetzner);
    assert_eq!(
        options.hetzner,
        HetznerSettings {
            action_ms: Latency::p50_p99(300, 900),
            action_error_rate: 0.1,
            action_fail_servers: vec!["worker-1".into(), "600101".into()],
            reassign: Reassign::Refuse,
            bucket: 10,
            refill_per_s: 0.5,
        }
    );
    assert!(Cli::try_parse_from(["sim", "--cloud", "aws"]).is_err());
    assert!(Cli::try_parse_from(["sim", "--reassign", "sometimes"]).is_err());
}
