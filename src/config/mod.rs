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
//!   error.rs     what is wrong with a configuration (every invalid value at once)
//!   sources.rs   flag > env > file(s) > default, each value's Source; Config::resolve*
//!   show.rs      `baton config show` / `baton config reference`
//!   mod.rs       re-exports; what the cloud client needs from a Config
//! ```

mod error;
mod settings;
mod show;
mod sources;

pub use self::error::{ConfigError, InvalidValue};
pub use self::settings::{
    Annotations, Config, ConfigArgs, DEFAULT_BASE_URL, FLAGS, Flag, FlagArgs, HealthCheck, Id, LeaseTiming,
    SETTINGS, ServiceAllocation, Setting, Source, items,
};
pub use self::show::{ConfigAction, ConfigCommand, FlagRow, OutputFormat, ShowRow, reference, show};
pub use self::sources::{
    CLOUD_CONFIG_ENV, Env, ProcessEnv, Section, cloud_config_path, flag_value, flag_values,
};

/// On Hetzner Cloud: the Service annotation baton writes a Service FIP's address to (and reads a
/// bring-your-own address from, with `spec.loadBalancerIP`).
pub const HETZNER_IP_ANNOTATION: &str = "baton.dev/floating-ips";

impl Config {
    /// The cloud client's settings: Cherry Servers' (requires `apiKey` and `projectID`) or
    /// Hetzner Cloud's (requires `HCLOUD_TOKEN`; its bucket is followed from the API's headers, so
    /// `apiRateLimit` applies only when set explicitly).
    pub fn cloud_client_config(&self) -> Result<baton_cloud::ClientConfig, ConfigError> {
        let mut c = match self.cloud {
            baton_cloud::CloudKind::Cherry => {
                let mut c = baton_cloud::ClientConfig::new(
                    self.require_api_key()?.clone(),
                    self.require_project_id()?,
                );
                c.base_url = self.base_url.clone();
                c.requests_per_second = self.api_rate_limit;
                c
            }
            baton_cloud::CloudKind::Hetzner => {
                let mut c = baton_cloud::ClientConfig::hetzner(self.require_hcloud_token()?.clone());
                c.base_url = self.hcloud_endpoint.clone();
                if self
                    .sources
                    .get(&Id::ApiRateLimit)
                    .is_some_and(|s| *s != Source::Default)
                {
                    c.requests_per_second = self.api_rate_limit;
                }
                c
            }
        };
        c.request_timeout = self.api_timeout;
        c.user_agent = format!("baton/{}", env!("CARGO_PKG_VERSION"));
        Ok(c)
    }

    /// Whether baton initialises Nodes: `initializeNodes`, or by default on Cherry Servers and
    /// not on Hetzner Cloud (hcloud-cloud-controller-manager does it there).
    pub fn initializes_nodes(&self) -> bool {
        self.initialize_nodes
            .unwrap_or(self.cloud == baton_cloud::CloudKind::Cherry)
    }

    /// Hetzner Cloud's API token, or an error naming where to set it.
    pub fn require_hcloud_token(&self) -> Result<&baton_core::Secret, ConfigError> {
        self.hcloud_token
            .as_ref()
            .ok_or_else(|| ConfigError::missing(Id::HcloudToken))
    }

    /// How long a controller loop may spend in one unit of work before `/health` fails naming it:
    /// `loopStallLimit`, or else derived from the cloud client's limits. The longest a loop
    /// legitimately waits is one idempotent cloud call: 6 attempts of `apiTimeout` each, with 31 s
    /// of backoff between them (1 + 2 + 4 + 8 + 16 s); 29 s more cover the rate limit's queue and
    /// a Kubernetes write (10 s at most). 150 s at the default `apiTimeout` of 15 s.
    pub fn stall_limit(&self) -> std::time::Duration {
        self.loop_stall_limit
            .unwrap_or_else(|| self.api_timeout.saturating_mul(6) + std::time::Duration::from_secs(60))
    }

    /// The API key, or an error naming where to set it.
    pub fn require_api_key(&self) -> Result<&baton_core::Secret, ConfigError> {
        self.api_key
            .as_ref()
            .ok_or_else(|| ConfigError::missing(Id::ApiKey))
    }

    /// The project ID, or an error naming where to set it.
    pub fn require_project_id(&self) -> Result<u64, ConfigError> {
        self.project_id.ok_or_else(|| ConfigError::missing(Id::ProjectId))
    }
}

#[cfg(test)]
mod tests;
