//! The binary's top-level error: each subcommand's error, and the exit code it maps to.

use crate::{bootstrap, config, exit, telemetry};

/// Top-level errors of the binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("logging: {0}")]
    Logging(#[from] telemetry::LogError),
    #[error("{0}")]
    Usage(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error("{0}")]
    Subcommand(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    /// `baton status` found the cluster degraded or down (the report is already printed).
    #[error("status: exit {0}")]
    Status(u8),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Logging(_) | Self::Usage(_) => exit::CONFIG,
            Self::Subcommand(_) => exit::FAILURE,
            Self::Bootstrap(e) => e.exit_code(),
            Self::Status(code) => *code,
        }
    }
}

/// Wraps a subcommand's error.
pub fn subcommand_error(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Subcommand(Box::new(e))
}
