use clap::Parser as _;
use rstest::rstest;

use super::*;
use crate::cli::{Cli, Command};

fn parse(args: &[&str]) -> Result<AgentArgs, clap::Error> {
    let mut all = vec!["baton", "agent"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all).map(|cli| match cli.command {
        Command::Agent(a) => a,
        other => panic!("not the agent: {other:?}"),
    })
}

fn settings(args: &[&str]) -> Result<Settings, AgentError> {
    Settings::from_args(&parse(args).unwrap())
}

#[test]
fn defaults() {
    let s = settings(&[]).unwrap();
    assert!(s.fips.is_empty());
    assert_eq!(
        s.table,
        Some(("kube-system".to_owned(), "baton-control-plane-fips".to_owned()))
    );
    assert_eq!(s.health_listen, Some("127.0.0.1:9594".parse().unwrap()));
    assert_eq!(s.recheck, Duration::from_secs(10));
    assert!(!s.cleanup);
}

#[test]
fn static_fips_repeat_and_list() {
    let s = settings(&[
        "--fip",
        "203.0.113.5",
        "--fip",
        "203.0.113.6,2001:db8::5",
        "--no-kube",
        "--health-listen",
        "off",
        "--prefix",
        "edge",
    ])
    .unwrap();
    let want: BTreeSet<IpAddr> = ["203.0.113.5", "203.0.113.6", "2001:db8::5"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(s.fips, want);
    assert_eq!(s.table, None, "--no-kube: no FIP table");
    assert_eq!(s.health_listen, None);
    assert!(settings(&["--prefix", "edge"]).unwrap().table.unwrap().1 == "edge-control-plane-fips");
}

#[rstest]
#[case::loopback_fip(&["--fip", "127.0.0.1"], "--fip 127.0.0.1: cannot be a Floating IP (loopback)")]
#[case::unspecified_fip(&["--fip", "0.0.0.0"], "--fip 0.0.0.0: cannot be a Floating IP (unspecified)")]
#[case::no_kube_no_fip(&["--no-kube"], "--no-kube true: without the FIP table the agent needs at least one --fip")]
#[case::bad_prefix(&["--prefix", "Not_A_Label"], "--prefix Not_A_Label: must be a lowercase DNS label of at most 43 characters")]
#[case::bad_listen(&["--health-listen", "localhost"], "--health-listen localhost: expected IP:port or off")]
#[case::recheck_too_short(&["--recheck-interval-ms", "0"], "--recheck-interval-ms 0: must be at least 100")]
fn bad_flags_are_named(#[case] args: &[&str], #[case] message: &str) {
    let e = settings(args).unwrap_err();
    assert!(e.is_config());
    assert_eq!(e.to_string(), message);
}

#[test]
fn a_fip_that_is_no_address_is_refused_by_the_parser_naming_the_flag() {
    let e = parse(&["--fip", "api.example.com"]).unwrap_err().to_string();
    assert!(e.contains("--fip <IP>") && e.contains("api.example.com"), "{e}");
}

#[test]
fn cleanup_needs_nothing_else() {
    let s = settings(&["--cleanup", "--no-kube"]).unwrap();
    assert!(s.cleanup);
}

#[test]
fn every_flag_has_a_baton_environment_variable() {
    use clap::CommandFactory as _;
    let cli = Cli::command();
    let agent = cli.find_subcommand("agent").unwrap();
    // The global logging flags have BATON_LOG_* variables of their own.
    for arg in agent
        .get_arguments()
        .filter(|a| a.get_long().is_some() && !a.is_global_set())
    {
        let long = arg.get_long().unwrap();
        let env = arg
            .get_env()
            .and_then(|e| e.to_str())
            .unwrap_or_else(|| panic!("--{long} has no environment variable"));
        assert!(env.starts_with("BATON_"), "--{long}: {env}");
    }
}

/// docs/configuration.md's `baton agent` table: every flag, its variable and default, as clap
/// has them.
#[test]
fn docs_configuration_md_lists_every_agent_flag() {
    use clap::CommandFactory as _;
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    let mut cli = Cli::command();
    cli.build(); // fills in the implicit defaults (`false` of a flag)
    let agent = cli.find_subcommand("agent").unwrap();
    for arg in agent.get_arguments().filter(|a| !a.is_global_set()) {
        let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let default = arg
            .get_default_values()
            .first()
            .map_or("unset".to_owned(), |d| format!("`{}`", d.to_string_lossy()));
        let row = format!("| `--{long}` | `{}` | {default} |", env.to_string_lossy());
        assert!(
            doc.contains(&row),
            "docs/configuration.md lacks the row starting {row}"
        );
    }
}
