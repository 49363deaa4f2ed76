//! baton: carries a bare-metal Kubernetes cluster's API endpoint (DNS names + Floating IPs) from
//! the bootstrap host to the running cluster, and keeps it healthy afterwards.
//!
//! ```text
//!   main.rs ── Cli::parse ── run(cli) ─┬─ config   layered settings (flag > env > cloud-sa.json > default)
//!                                      ├─ sim      baton-sim: the Cherry Servers API simulator
//!                                      ├─ dns      baton-dns: embedded server / RFC 2136 push
//!                                      ├─ bootstrap on the bootstrap host: FIPs, DNS, API Services, handoff
//!                                      ├─ controller  (later issue)
//!                                      └─ version
//! ```
//!
//! Pure types and decision logic live in `baton-core`; the cloud client in `baton-cloud`; the
//! simulator in `baton-sim`; DNS in `baton-dns`. Those libraries carry no command-line code:
//! this crate wires them to the command line (`sim`, `dns`) and owns the one signal handler
//! (`signal`).

pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dns;
pub mod kube_failover;
pub mod signal;
pub mod sim;
pub mod telemetry;

use cli::{Cli, Command};

/// Exit codes shared by every subcommand.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// A runtime failure.
    pub const FAILURE: u8 = 1;
    /// Bad configuration or arguments.
    pub const CONFIG: u8 = 2;
    /// The subcommand is not built yet.
    pub const NOT_BUILT: u8 = 3;
    // `baton bootstrap` adds 4 (timeout), 5 (cloud), 6 (Kubernetes), 7 (DNS), 8 (interrupted):
    // see `bootstrap::exit`.
}

/// Top-level errors of the binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("logging: {0}")]
    Logging(String),
    #[error("`baton {0}` is not built yet")]
    NotBuilt(&'static str),
    #[error("{0}")]
    Usage(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error("{0}")]
    Subcommand(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Logging(_) | Self::Usage(_) => exit::CONFIG,
            Self::NotBuilt(_) => exit::NOT_BUILT,
            Self::Subcommand(_) => exit::FAILURE,
            Self::Bootstrap(e) => e.exit_code(),
        }
    }
}

/// Wraps a subcommand's error.
pub fn subcommand_error(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Subcommand(Box::new(e))
}

/// Runs a parsed command line to completion.
pub async fn run(cli: Cli) -> Result<(), Error> {
    let Cli { log, command } = cli;
    telemetry::init(&log)?;
    match command {
        Command::Version => {
            println!("baton {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Config(cmd) => cmd.run(&config::ProcessEnv),
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
    }
}
