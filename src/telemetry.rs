//! Logging: `tracing` with an `EnvFilter` (`RUST_LOG`), as text or JSON.

use clap::{Args, ValueEnum};

/// Log output options, shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, global = true, env = "BATON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in `RUST_LOG` syntax (e.g. `info,baton=debug`). The default keeps
    /// per-request logging of the libraries (hickory's per-query lines, kube-client's ERROR line
    /// for every failed request, which its caller reports anyway) off.
    #[arg(
        long,
        global = true,
        env = "BATON_LOG",
        default_value = "info,hickory_server=warn,hickory_proto=warn,kube_client::client::builder=off"
    )]
    pub log: String,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Why logging cannot start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LogError(String);

/// Installs the global subscriber, writing to stderr. `RUST_LOG` overrides `--log`.
pub fn init(args: &LogArgs) -> Result<(), LogError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .map_err(|e| LogError(format!("invalid log filter {:?}: {e}", args.log)))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    res.map_err(|e| LogError(e.to_string()))
}
