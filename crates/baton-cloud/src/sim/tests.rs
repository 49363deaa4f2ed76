use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    sim: SimArgs,
}

#[test]
fn verify_cli() {
    use clap::CommandFactory as _;
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
    ])
    .unwrap();
    let (builder, listen) = cli.sim.into_builder().unwrap();
    assert_eq!(listen.port(), 0);
    assert_eq!(builder.faults.rate_limit, None);
    assert!((builder.faults.error_rate - 0.3).abs() < f64::EPSILON);
    assert_eq!(builder.topology.forward_ports, [6443, 443]);
    assert_eq!(builder.topology.fip_pool, "203.0.113.128/25");
    assert_eq!(builder.faults.retarget_delay_ms, 250);
}

#[test]
fn defaults_match_the_issue() {
    let cli = Cli::try_parse_from(["sim"]).unwrap();
    assert_eq!(cli.sim.listen.to_string(), "127.0.0.1:8080");
    let (builder, _) = cli.sim.into_builder().unwrap();
    assert_eq!(builder.faults.rate_limit, Some(4.0));
    assert_eq!(builder.faults.retarget_delay_ms, 0);
    assert_eq!(builder.topology.api_key, "sim-token");
    assert_eq!(builder.topology.project.id, 123_456);
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
