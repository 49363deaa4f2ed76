//! The command line: one binary, one subcommand per entry point.

use clap::{Parser, Subcommand};

/// baton: a bootstrap-aware control-plane endpoint manager for bare-metal Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "baton", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub log: crate::telemetry::LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up; boxing buys nothing
pub enum Command {
    /// Run on the bootstrap host: reserve/find FIPs, publish DNS, create the API Services, hand off.
    Bootstrap(crate::bootstrap::BootstrapArgs),
    /// Run in the cluster: control-plane FIP failover, Service FIPs, BGP, node initialisation.
    Controller(crate::controller::run::ControllerArgs),
    /// Serve or push the DNS records of the API names.
    Dns(crate::dns::DnsArgs),
    /// Route TLS by server name (SNI) to many API servers behind one address.
    Sni(crate::sni::SniArgs),
    /// Run on every control-plane node: accept the packets routed to the control-plane Floating
    /// IPs (one nftables redirect rule per FIP, kept in sync with the Services).
    Agent(crate::agent::AgentArgs),
    /// On the first control-plane server, before its API server starts: assign the cluster's
    /// control-plane Floating IP to this server and make this node accept it (idempotent).
    Claim(crate::claim::ClaimArgs),
    /// Run the Cherry Servers API simulator.
    Sim(crate::sim::SimArgs),
    /// Inspect the configuration.
    Config(crate::config::ConfigCommand),
    /// One screen for an incident: endpoints, holders, leader, pending Services, BGP, nodes.
    /// Exit 0 healthy, 10 degraded, 11 down.
    Status(crate::status::StatusArgs),
    /// Print the version.
    Version,
    /// Run only the Service FIP and node controllers (tests and benchmarks).
    #[command(hide = true)]
    ControllerServices(crate::controller::standalone::StandaloneArgs),
}
