//! What is wrong with a configuration. Values of secret settings are never included.

use std::fmt;
use std::path::PathBuf;

use super::settings::{Id, Source};

/// A configuration error. Values of secret settings are never included.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid JSON: {source}")]
    ParseFile {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("config file {path}: expected a JSON object at the top level")]
    NotAnObject { path: PathBuf },
    #[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<InvalidValue>),
    #[error("missing required setting {key} (set {flag}env {env}, or key {key} in --cloud-config)")]
    Missing {
        key: &'static str,
        /// `--flag, ` (empty for a secret, whose flag is refused).
        flag: String,
        env: &'static str,
    },
}

impl ConfigError {
    /// `id` is required and unset: the error names every way to set it.
    pub(super) fn missing(id: Id) -> Self {
        let s = id.setting();
        Self::Missing {
            key: s.file_key,
            flag: if s.secret {
                String::new()
            } else {
                format!("--{}, ", s.flag)
            },
            env: s.env,
        }
    }
}

/// One rejected value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidValue {
    /// The setting's config-file key (its canonical name).
    pub key: &'static str,
    /// Where the bad value came from.
    pub source: Source,
    /// The value, or `<redacted>` for secrets.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for InvalidValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} from {}: invalid value {:?}: {}",
            self.key, self.source, self.value, self.reason
        )
    }
}
