//! Why `baton bootstrap` stopped, and the exit code and category each reason maps to.

use std::path::PathBuf;
use std::time::Duration;

use super::config::ConfigFileError;
use super::health::HealthError;
use super::state::{StateError, Step};
use crate::exit::bootstrap as exit;

/// Why `baton bootstrap` stopped. Each variant names the step or field; none carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
    #[error(transparent)]
    CloudConfig(#[from] crate::config::ConfigError),
    #[error("invalid bootstrap config {}: {field}: {message}", path.display())]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("timed out after {} waiting for {what}{}", baton_core::duration::format_duration(*after), last.as_ref().map(|l| format!(" (last: {l})")).unwrap_or_default())]
    Timeout {
        what: String,
        after: Duration,
        last: Option<String>,
    },
    #[error("cloud: {step}: {source}")]
    Cloud {
        step: String,
        #[source]
        source: baton_cloud::CloudError,
    },
    #[error("cloud: {0}")]
    CloudState(String),
    #[error("Kubernetes: {step}: {source}")]
    Kube {
        step: String,
        #[source]
        source: kube::Error,
    },
    #[error("handoff manifest {origin}: {reason}")]
    Manifest { origin: String, reason: String },
    #[error("DNS: {0}")]
    Dns(#[from] baton_dns::DnsError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Health(#[from] HealthError),
    #[error("interrupted during step {0}; the state file is saved, run `baton bootstrap` again to continue")]
    Interrupted(Step),
}

impl BootstrapError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::ConfigFile(_)
            | Self::CloudConfig(_)
            | Self::Field { .. }
            | Self::Health(_)
            | Self::Manifest { .. }
            | Self::Dns(baton_dns::DnsError::Config(_) | baton_dns::DnsError::Name(_))
            | Self::Cloud {
                source: baton_cloud::CloudError::Config(_),
                ..
            } => exit::CONFIG,
            Self::Timeout { .. } => exit::TIMEOUT,
            Self::Cloud { .. } | Self::CloudState(_) => exit::CLOUD,
            Self::Kube { .. } => exit::KUBERNETES,
            Self::Dns(_) => exit::DNS,
            Self::State(_) => exit::FAILURE,
            Self::Interrupted(_) => exit::INTERRUPTED,
        }
    }

    /// A stable category for the summary and logs.
    pub fn category(&self) -> &'static str {
        match self.exit_code() {
            exit::CONFIG => "config",
            exit::TIMEOUT => "timeout",
            exit::CLOUD => "cloud",
            exit::KUBERNETES => "kubernetes",
            exit::DNS => "dns",
            exit::INTERRUPTED => "interrupted",
            _ => "failure",
        }
    }
}

#[cfg(test)]
mod tests;
