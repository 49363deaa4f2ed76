//! baton: carries a bare-metal Kubernetes cluster's API endpoint (DNS names + Floating IPs) from
//! the bootstrap host to the running cluster, and keeps it healthy afterwards.
//!
//! ```text
//!   main.rs ── Cli::parse ── run(cli) ─┬─ config   layered settings (flag > env > cloud-sa.json > default)
//!                                      ├─ sim      baton-sim: the Cherry Servers API simulator
//!                                      ├─ dns      baton-dns: embedded server / RFC 2136 push
//!                                      ├─ bootstrap on the bootstrap host: FIPs, DNS, API Services, handoff
//!                                      ├─ controller in the cluster: failover, Service FIPs, BGP, nodes
//!                                      ├─ sni      many API servers behind one address (TLS SNI router)
//!                                      ├─ agent    on each control-plane node: accept the FIPs' packets
//!                                      ├─ claim    on the first control-plane server: assign the FIP here
//!                                      └─ version
//! ```
//!
//! Pure types and decision logic live in `baton-core`; the cloud client in `baton-cloud`; the
//! simulator in `baton-sim`; DNS in `baton-dns`. Those libraries carry no command-line code:
//! this crate wires them to the command line (`sim`, `dns`).
//!
//! Both halves use the same tools, from modules below them: `probe` (the one `/readyz` prober),
//! `admin` (the admin endpoints: loopback plain HTTP, authenticated HTTPS metrics),
//! `kube` (kubeconfig loader, cluster CA and TLS, the failover client), `names` (what both write
//! on Kubernetes objects), `exit` (exit codes), `signal` (the one SIGTERM/SIGINT handler) and
//! `error` (the top-level error). No module imports from one above it.

pub mod admin;
pub mod agent;
pub mod bootstrap;
pub mod claim;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dns;
pub mod error;
pub mod events;
pub mod exit;
pub mod kube;
pub mod names;
pub mod probe;
pub mod signal;
pub mod sim;
pub mod sni;
pub mod status;
pub mod telemetry;

use cli::{Cli, Command};
pub use error::{Error, subcommand_error};

/// Runs a parsed command line to completion.
pub async fn run(cli: Cli) -> Result<(), Error> {
    let Cli { log, command } = cli;
    telemetry::init(&log)?;
    match command {
        Command::Version => {
            println!("baton {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Config(cmd) => Ok(cmd.run(&config::ProcessEnv)?),
        Command::Bootstrap(args) => Ok(bootstrap::run(args, &config::ProcessEnv).await?),
        Command::Controller(args) => controller::run::run(args).await.map_err(|e| {
            if e.is_config() {
                Error::Usage(Box::new(e))
            } else {
                subcommand_error(e)
            }
        }),
        Command::ControllerServices(args) => controller::standalone::run(args).await,
        Command::Dns(args) => dns::run(args).await.map_err(|e| match e {
            // Bad flags or key files are configuration errors (exit 2), like bad settings.
            baton_dns::DnsError::Config(_)
            | baton_dns::DnsError::Name(_)
            | baton_dns::DnsError::TsigKey(_) => Error::Usage(Box::new(e)),
            e => subcommand_error(e),
        }),
        Command::Sim(args) => sim::run(args).await.map_err(subcommand_error),
        Command::Sni(args) => sni::run(args).await.map_err(|e| {
            if e.is_config() {
                Error::Usage(Box::new(e))
            } else {
                subcommand_error(e)
            }
        }),
        Command::Agent(args) => agent::run(args).await.map_err(|e| {
            if e.is_config() {
                Error::Usage(Box::new(e))
            } else {
                subcommand_error(e)
            }
        }),
        Command::Claim(args) => claim::run(args, &config::ProcessEnv).await.map_err(|e| {
            if e.is_config() {
                Error::Usage(Box::new(e))
            } else {
                subcommand_error(e)
            }
        }),
        Command::Status(args) => match status::run(args).await {
            Ok(exit::status::HEALTHY) => Ok(()),
            Ok(code) => Err(Error::Status(code)),
            Err(e) => Err(Error::Usage(Box::new(e))),
        },
    }
}
