//! Layered configuration, exactly as cloud-provider-cherry users know it.
//!
//! Every setting is looked up, in order, as
//!
//! ```text
//!   --flag  >  environment (CHERRY_* for the CCM's settings, BATON_* for baton's own)
//!           >  the JSON file given by --cloud-config (cloud-sa.json keys)
//!           >  default
//! ```
//!
//! and the source of each effective value is kept, so `baton config show` can say where it came
//! from. Keys of the JSON file match case-insensitively (as Go's `encoding/json` does for the CCM),
//! so `projectID` and `projectId` are the same key; numbers and booleans may be JSON numbers/bools
//! or strings. Empty values count as unset, like `os.Getenv` checks in the CCM. Every invalid value
//! is reported at once, each naming its source, key and value (secrets are never echoed).
//!
//! Unlike the CCM, documented keys that the CCM parses but ignores (`base-url`, the annotation
//! names) are honoured here.
//!
//! ```text
//!   settings.rs  the table: typed ids, flags, parse and display of every setting (and the flags
//!                read outside the layers, for `config show`)
//!   sources.rs   flag > env > file(s) > default, with the source of each value
//!   show.rs      `baton config show` / `baton config reference`
//!   mod.rs       Config::resolve*, the errors
//! ```

mod settings;
mod show;
mod sources;

use std::fmt;
use std::path::PathBuf;

pub use self::settings::{
    Annotations, Config, ConfigArgs, DEFAULT_BASE_URL, FLAGS, Flag, FlagArgs, HealthCheck, Id, LeaseTiming,
    SETTINGS, Setting,
};
pub use self::show::{ConfigAction, ConfigCommand, FlagRow, OutputFormat, ShowRow, reference, show};
pub use self::sources::{
    CLOUD_CONFIG_ENV, Env, ProcessEnv, Section, Source, cloud_config_path, flag_value, flag_values,
};
use self::sources::{FileValues, RawValues};

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
    #[error("missing required setting {key} (set {flag}, env {env}, or key {key} in --cloud-config)")]
    Missing {
        key: &'static str,
        flag: String,
        env: &'static str,
    },
}

impl ConfigError {
    /// `id` is required and unset: the error names every way to set it.
    fn missing(id: Id) -> Self {
        let s = id.setting();
        Self::Missing {
            key: s.file_key,
            flag: format!("--{}", s.flag),
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

impl Config {
    /// Resolves the configuration from flags, the environment and the config file.
    pub fn resolve(args: &ConfigArgs, env: &dyn Env) -> Result<Self, ConfigError> {
        let file = FileValues::layered(None, cloud_config_path(args, env).as_deref())?;
        Self::resolve_values(args, env, file.as_ref())
    }

    /// Like [`Config::resolve`], with the bootstrap config's `cloud:` section as one more layer:
    /// flag > env > `--cloud-config` file (else the section's `configFile`) > the section's own
    /// keys > default.
    pub fn resolve_with_section(
        args: &ConfigArgs,
        env: &dyn Env,
        section: Section,
    ) -> Result<Self, ConfigError> {
        let file = cloud_config_path(args, env).or_else(|| section.config_file.clone());
        let merged = FileValues::layered(Some(section), file.as_deref())?;
        Self::resolve_values(args, env, merged.as_ref())
    }

    fn resolve_values(
        args: &ConfigArgs,
        env: &dyn Env,
        file: Option<&FileValues>,
    ) -> Result<Self, ConfigError> {
        let raw = RawValues::collect(args, env, file);
        let mut errors = raw.type_errors.clone();
        let cfg = Self::parse(&raw, &mut errors);
        if errors.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid(errors))
        }
    }

    /// The Cherry Servers client settings (requires `apiKey` and `projectID`).
    pub fn cloud_client_config(&self) -> Result<baton_cloud::ClientConfig, ConfigError> {
        let mut c =
            baton_cloud::ClientConfig::new(self.require_api_key()?.clone(), self.require_project_id()?);
        c.base_url = self.base_url.clone();
        c.requests_per_second = self.api_rate_limit;
        c.request_timeout = self.api_timeout;
        c.user_agent = format!("baton/{}", env!("CARGO_PKG_VERSION"));
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
