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

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_core::duration::{format_duration, parse_duration};
use baton_core::names::{is_dns1123_label, is_qualified_key};
use baton_core::{FipTag, LabelSelector, LoadBalancerMode, Secret};
use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use url::Url;

/// The official Cherry Servers API.
pub const DEFAULT_BASE_URL: &str = "https://api.cherryservers.com";

/// Where settings come from: the process environment, or a fixed map in tests.
pub trait Env {
    /// The value of environment variable `key`, if set.
    fn var(&self, key: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

/// One configurable setting: its flag, environment variable, file key and default.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The field name in [`ConfigArgs`].
    pub id: &'static str,
    /// The long flag, without `--`.
    pub flag: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// The key in the JSON config file.
    pub file_key: &'static str,
    /// The default, as a string in the same syntax as the other sources.
    pub default: Option<&'static str>,
    /// Whether the value is secret (never printed).
    pub secret: bool,
    /// One line of documentation.
    pub doc: &'static str,
}

macro_rules! settings {
    ($( $field:ident {
        flag: $flag:literal, env: $env:literal, file: $file:literal,
        default: $default:expr, secret: $secret:literal, doc: $doc:literal $(,)?
    } ),* $(,)?) => {
        /// The configuration flags shared by `baton controller`, `baton bootstrap` and
        /// `baton config show`. Each flag also reads an environment variable and a key of the
        /// `--cloud-config` file; see `baton config show` and docs/configuration.md.
        #[derive(Clone, Default, Args)]
        pub struct ConfigArgs {
            /// JSON config file in cloud-provider-cherry's `cloud-sa.json` format [env: BATON_CLOUD_CONFIG]
            #[arg(long = "cloud-config", value_name = "PATH")]
            pub cloud_config: Option<PathBuf>,
            $(
                #[doc = concat!($doc, " [env: ", $env, "] [file: ", $file, "]")]
                #[arg(long = $flag, value_name = "VALUE", allow_hyphen_values = true)]
                pub $field: Option<String>,
            )*
        }

        /// Every setting, in documentation order.
        pub const SETTINGS: &[Setting] = &[$(
            Setting {
                id: stringify!($field),
                flag: $flag,
                env: $env,
                file_key: $file,
                default: $default,
                secret: $secret,
                doc: $doc,
            }
        ),*];

        impl ConfigArgs {
            fn flag(&self, id: &str) -> Option<&str> {
                match id {
                    $( stringify!($field) => self.$field.as_deref(), )*
                    _ => None,
                }
            }
        }

        impl fmt::Debug for ConfigArgs {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct("ConfigArgs");
                d.field("cloud_config", &self.cloud_config);
                $(
                    if $secret {
                        d.field(stringify!($field), &self.$field.as_ref().map(|_| "<redacted>"));
                    } else {
                        d.field(stringify!($field), &self.$field);
                    }
                )*
                d.finish()
            }
        }
    };
}

settings! {
    api_key { flag: "api-key", env: "CHERRY_API_KEY", file: "apiKey", default: None, secret: true,
        doc: "Cherry Servers API key (prefer the environment or the file: flags show in `ps`)" },
    project_id { flag: "project-id", env: "CHERRY_PROJECT_ID", file: "projectID", default: None, secret: false,
        doc: "Cherry Servers project ID (a number)" },
    region { flag: "region", env: "CHERRY_REGION_NAME", file: "region", default: None, secret: false,
        doc: "Region for Service Floating IPs (slug, e.g. LT-Siauliai); when set it wins over the Service annotation" },
    base_url { flag: "base-url", env: "CHERRY_BASE_URL", file: "base-url", default: Some(DEFAULT_BASE_URL), secret: false,
        doc: "Base URL of the Cherry Servers API" },
    load_balancer { flag: "load-balancer", env: "CHERRY_LOAD_BALANCER", file: "loadbalancer", default: None, secret: false,
        doc: "Load balancer implementation: kube-vip://, metallb:///<ns>/?bgp-peer-mode=native|frr|none, empty://?ip-annotation=<name>" },
    annotation_local_asn { flag: "annotation-local-asn", env: "CHERRY_ANNOTATION_LOCAL_ASN", file: "annotationLocalASN",
        default: Some("cherryservers.com/bgp-peers-{{n}}-node-asn"), secret: false,
        doc: "Node annotation for the node's BGP ASN ({{n}} = peer index)" },
    annotation_peer_asn { flag: "annotation-peer-asn", env: "CHERRY_ANNOTATION_PEER_ASN", file: "annotationPeerASN",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-asn"), secret: false,
        doc: "Node annotation for the BGP peer's ASN ({{n}} = peer index)" },
    annotation_peer_ip { flag: "annotation-peer-ip", env: "CHERRY_ANNOTATION_PEER_IP", file: "annotationPeerIP",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-ip"), secret: false,
        doc: "Node annotation for the BGP peer's IP ({{n}} = peer index)" },
    annotation_src_ip { flag: "annotation-src-ip", env: "CHERRY_ANNOTATION_SRC_IP", file: "annotationSrcIP",
        default: Some("cherryservers.com/bgp-peers-{{n}}-src-ip"), secret: false,
        doc: "Node annotation for the BGP source IP ({{n}} = peer index)" },
    annotation_multi_hop { flag: "annotation-multi-hop", env: "CHERRY_ANNOTATION_MULTI_HOP", file: "annotationMultiHop",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-multi-hop"), secret: false,
        doc: "Node annotation for BGP multi-hop ({{n}} = peer index)" },
    annotation_fip_region { flag: "annotation-fip-region", env: "CHERRY_ANNOTATION_FIP_REGION", file: "annotationFIPRegion",
        default: Some("cherryservers.com/fip-region"), secret: false,
        doc: "Service annotation naming the region of its Floating IP" },
    fip_tag { flag: "fip-tag", env: "CHERRY_FIP_TAG", file: "fipTag", default: None, secret: false,
        doc: "Tag (key=value) of the control-plane Floating IP; unset = no control-plane FIP management" },
    api_server_port { flag: "api-server-port", env: "CHERRY_API_SERVER_PORT", file: "apiServerPort", default: Some("0"), secret: false,
        doc: "API server port on the Floating IP; 0 = the kube-apiserver's own port" },
    bgp_node_selector { flag: "bgp-node-selector", env: "CHERRY_BGP_NODE_SELECTOR", file: "bgpNodeSelector", default: None, secret: false,
        doc: "Label selector of the nodes on which to enable BGP (e.g. key1=value1,key2=value2); unset = all nodes" },
    bgp_prefix_limit { flag: "bgp-prefix-limit", env: "BATON_BGP_PREFIX_LIMIT", file: "bgpPrefixLimit", default: Some("0"), secret: false,
        doc: "Most Service prefixes handed to the load balancer per BGP session; Services past it get a Warning Event instead; 0 = no limit" },
    fip_health_check_use_host_ip { flag: "fip-health-check-use-host-ip", env: "CHERRY_FIP_HEALTH_CHECK_USE_HOST_IP",
        file: "fipHealthCheckUseHostIP", default: Some("false"), secret: false,
        doc: "Probe the FIP holder on its host IP instead of the FIP (needed when the FIP is bound on loopback)" },
    api_rate_limit { flag: "api-rate-limit", env: "BATON_API_RATE_LIMIT", file: "apiRateLimit", default: Some("4"), secret: false,
        doc: "Cloud API requests per second, shared by all of baton's callers; 0 = unlimited" },
    api_timeout { flag: "api-timeout", env: "BATON_API_TIMEOUT", file: "apiTimeout", default: Some("15s"), secret: false,
        doc: "Timeout of one cloud API request (one attempt; idempotent calls are retried)" },
    prefix { flag: "prefix", env: "BATON_PREFIX", file: "prefix", default: Some("baton"), secret: false,
        doc: "Name prefix of the objects baton creates (e.g. kube-system/<prefix>-kubernetes-external)" },
    health_check_path { flag: "health-check-path", env: "BATON_HEALTH_CHECK_PATH", file: "healthCheckPath", default: Some("/readyz"),
        secret: false, doc: "HTTP path probed on the API servers (/readyz, or /healthz as in the CCM)" },
    health_check_interval { flag: "health-check-interval", env: "BATON_HEALTH_CHECK_INTERVAL", file: "healthCheckInterval",
        default: Some("200ms"), secret: false, doc: "Interval between two probes of one API server" },
    health_check_timeout { flag: "health-check-timeout", env: "BATON_HEALTH_CHECK_TIMEOUT", file: "healthCheckTimeout",
        default: Some("300ms"), secret: false, doc: "Timeout of one probe (probes overlap: a slow probe does not delay the next)" },
    health_check_rise { flag: "health-check-rise", env: "BATON_HEALTH_CHECK_RISE", file: "healthCheckRise", default: Some("2"),
        secret: false, doc: "Consecutive successful probes before an API server counts as healthy" },
    health_check_fall { flag: "health-check-fall", env: "BATON_HEALTH_CHECK_FALL", file: "healthCheckFall", default: Some("3"),
        secret: false, doc: "Consecutive failed probes before an API server counts as failed" },
    lease_duration { flag: "lease-duration", env: "BATON_LEASE_DURATION", file: "leaseDuration", default: Some("1s"),
        secret: false, doc: "How long the controller's leader Lease stays valid without renewal: a follower takes over this long after it last saw the Lease change" },
    lease_renew_deadline { flag: "lease-renew-deadline", env: "BATON_LEASE_RENEW_DEADLINE", file: "leaseRenewDeadline", default: Some("600ms"),
        secret: false, doc: "The leader stops writing this long after the start of its last successful renew; must be below leaseDuration" },
    lease_renew_interval { flag: "lease-renew-interval", env: "BATON_LEASE_RENEW_INTERVAL", file: "leaseRenewInterval", default: Some("200ms"),
        secret: false, doc: "How often the leader renews its Lease; must be below leaseRenewDeadline" },
}

/// Where an effective value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Source {
    /// A command-line flag.
    Flag { flag: String },
    /// An environment variable.
    Env { var: String },
    /// A key of the config file.
    File { path: PathBuf, key: String },
    /// The built-in default.
    Default,
    /// Not set anywhere, no default.
    Unset,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag { flag } => write!(f, "flag --{flag}"),
            Self::Env { var } => write!(f, "env {var}"),
            Self::File { path, key } => write!(f, "file {} key {key}", path.display()),
            Self::Default => f.write_str("default"),
            Self::Unset => f.write_str("unset"),
        }
    }
}

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

/// The names of the node and Service annotations baton writes and reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Annotations {
    pub local_asn: String,
    pub peer_asn: String,
    pub peer_ip: String,
    pub src_ip: String,
    pub multi_hop: String,
    pub fip_region: String,
}

/// Health-check settings of the control-plane endpoint manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub use_host_ip: bool,
}

/// Leader-election timings of `baton controller` (docs/controller.md explains the safety rule
/// `renew_interval < renew_deadline < duration`).
#[derive(Debug, Clone, Serialize)]
pub struct LeaseTiming {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub renew_interval: Duration,
}

/// The effective configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub api_key: Option<Secret>,
    pub project_id: Option<u64>,
    pub region: Option<String>,
    pub base_url: Url,
    #[serde(serialize_with = "display_opt")]
    pub load_balancer: Option<LoadBalancerMode>,
    pub annotations: Annotations,
    #[serde(serialize_with = "display_opt")]
    pub fip_tag: Option<FipTag>,
    pub api_server_port: u16,
    #[serde(serialize_with = "display_opt")]
    pub bgp_node_selector: Option<LabelSelector>,
    /// Most Service prefixes announced per BGP session; `None` = no limit.
    pub bgp_prefix_limit: Option<u32>,
    /// Requests per second; `None` = unlimited.
    pub api_rate_limit: Option<f64>,
    pub api_timeout: Duration,
    pub prefix: String,
    pub health_check: HealthCheck,
    pub lease: LeaseTiming,
    /// The source of every setting, by setting id.
    #[serde(skip)]
    pub sources: BTreeMap<&'static str, Source>,
    /// Keys of the config file that baton does not know (they are ignored).
    #[serde(skip)]
    pub unknown_file_keys: Vec<String>,
}

#[allow(clippy::ref_option)] // serde's `serialize_with` passes `&Option<T>`
fn display_opt<T: fmt::Display, S: serde::Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

impl Config {
    /// Resolves the configuration from flags, the environment and the config file.
    pub fn resolve(args: &ConfigArgs, env: &dyn Env) -> Result<Self, ConfigError> {
        let file_path = cloud_config_path(args, env);
        let file = match &file_path {
            Some(path) => Some(read_file(path)?),
            None => None,
        };
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
        let Section {
            origin,
            object,
            config_file,
        } = section;
        let mut merged = object_values(&origin, object);
        if let Some(path) = cloud_config_path(args, env).or(config_file) {
            merged.entries.extend(read_file(&path)?.entries);
        }
        Self::resolve_values(args, env, Some(&merged))
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

    /// The API key, or an error naming where to set it.
    pub fn require_api_key(&self) -> Result<&Secret, ConfigError> {
        self.api_key.as_ref().ok_or_else(|| missing("api_key"))
    }

    /// The project ID, or an error naming where to set it.
    pub fn require_project_id(&self) -> Result<u64, ConfigError> {
        self.project_id.ok_or_else(|| missing("project_id"))
    }

    /// The effective value of a setting as text (secrets redacted), for display.
    pub fn display_value(&self, id: &str) -> Option<String> {
        let d = |d: &Duration| format_duration(*d);
        match id {
            "api_key" => self.api_key.as_ref().map(|_| "<redacted>".to_owned()),
            "project_id" => self.project_id.map(|p| p.to_string()),
            "region" => self.region.clone(),
            "base_url" => Some(self.base_url.to_string()),
            "load_balancer" => self.load_balancer.as_ref().map(ToString::to_string),
            "annotation_local_asn" => Some(self.annotations.local_asn.clone()),
            "annotation_peer_asn" => Some(self.annotations.peer_asn.clone()),
            "annotation_peer_ip" => Some(self.annotations.peer_ip.clone()),
            "annotation_src_ip" => Some(self.annotations.src_ip.clone()),
            "annotation_multi_hop" => Some(self.annotations.multi_hop.clone()),
            "annotation_fip_region" => Some(self.annotations.fip_region.clone()),
            "fip_tag" => self.fip_tag.as_ref().map(ToString::to_string),
            "api_server_port" => Some(self.api_server_port.to_string()),
            "bgp_node_selector" => self.bgp_node_selector.as_ref().map(ToString::to_string),
            "bgp_prefix_limit" => Some(self.bgp_prefix_limit.unwrap_or(0).to_string()),
            "fip_health_check_use_host_ip" => Some(self.health_check.use_host_ip.to_string()),
            "api_rate_limit" => Some(
                self.api_rate_limit
                    .map_or_else(|| "0".to_owned(), |r| r.to_string()),
            ),
            "api_timeout" => Some(d(&self.api_timeout)),
            "prefix" => Some(self.prefix.clone()),
            "health_check_path" => Some(self.health_check.path.clone()),
            "health_check_interval" => Some(d(&self.health_check.interval)),
            "health_check_timeout" => Some(d(&self.health_check.timeout)),
            "health_check_rise" => Some(self.health_check.rise.to_string()),
            "health_check_fall" => Some(self.health_check.fall.to_string()),
            "lease_duration" => Some(d(&self.lease.duration)),
            "lease_renew_deadline" => Some(d(&self.lease.renew_deadline)),
            "lease_renew_interval" => Some(d(&self.lease.renew_interval)),
            _ => None,
        }
    }

    fn parse(raw: &RawValues, errors: &mut Vec<InvalidValue>) -> Self {
        let mut p = Parser { raw, errors };
        let annotations = Annotations {
            local_asn: p.peer_annotation("annotation_local_asn"),
            peer_asn: p.peer_annotation("annotation_peer_asn"),
            peer_ip: p.peer_annotation("annotation_peer_ip"),
            src_ip: p.peer_annotation("annotation_src_ip"),
            multi_hop: p.peer_annotation("annotation_multi_hop"),
            fip_region: p
                .value("annotation_fip_region", |v| {
                    if is_qualified_key(v) {
                        Ok(v.to_owned())
                    } else {
                        Err("not a valid annotation key".to_owned())
                    }
                })
                .unwrap_or_default(),
        };
        let lease = p.lease();
        let health_check = HealthCheck {
            path: p
                .value("health_check_path", |v| {
                    if v.starts_with('/') && !v.contains(char::is_whitespace) {
                        Ok(v.to_owned())
                    } else {
                        Err("must be an absolute path, e.g. /readyz".to_owned())
                    }
                })
                .unwrap_or_default(),
            interval: p.duration("health_check_interval"),
            timeout: p.duration("health_check_timeout"),
            rise: p.count("health_check_rise"),
            fall: p.count("health_check_fall"),
            use_host_ip: p
                .value("fip_health_check_use_host_ip", parse_bool)
                .unwrap_or(false),
        };
        Self {
            api_key: p.value("api_key", |v| Ok(Secret::new(v))),
            project_id: p.value("project_id", |v| match v.parse::<u64>() {
                Ok(0) => Err("must be a positive number".to_owned()),
                Ok(n) => Ok(n),
                Err(_) => Err("must be a number (a JSON number or a string of digits)".to_owned()),
            }),
            region: p.value("region", |v| Ok(v.to_owned())),
            base_url: p
                .value("base_url", |v| {
                    let url = Url::parse(v).map_err(|e| e.to_string())?;
                    match url.scheme() {
                        "https" | "http" if url.has_host() => Ok(url),
                        _ => Err("must be an http(s) URL with a host".to_owned()),
                    }
                })
                .unwrap_or_else(|| Url::parse(DEFAULT_BASE_URL).expect("the default base URL parses")),
            load_balancer: p.value("load_balancer", |v| v.parse().map_err(|e| format!("{e}"))),
            annotations,
            fip_tag: p.value("fip_tag", |v| v.parse().map_err(|e| format!("{e}"))),
            api_server_port: p
                .value("api_server_port", |v| {
                    v.parse::<u16>()
                        .map_err(|_| "must be a port number, 0-65535".to_owned())
                })
                .unwrap_or(0),
            bgp_node_selector: p.value("bgp_node_selector", |v| v.parse().map_err(|e| format!("{e}"))),
            bgp_prefix_limit: p
                .value("bgp_prefix_limit", |v| {
                    v.parse::<u32>()
                        .map(|n| (n > 0).then_some(n))
                        .map_err(|_| "must be a whole number of prefixes, or 0 for no limit".to_owned())
                })
                .flatten(),
            api_rate_limit: p
                .value("api_rate_limit", |v| match v.parse::<f64>() {
                    Ok(0.0) => Ok(None),
                    Ok(r) if r.is_finite() && r > 0.0 => Ok(Some(r)),
                    _ => {
                        Err("must be a positive number of requests per second, or 0 for unlimited".to_owned())
                    }
                })
                .flatten(),
            api_timeout: p.duration("api_timeout"),
            prefix: p
                .value("prefix", |v| {
                    // <prefix>-kubernetes-external must be a valid Service name (63 chars).
                    if is_dns1123_label(v) && v.len() <= 63 - "-kubernetes-external".len() {
                        Ok(v.to_owned())
                    } else {
                        Err("must be a lowercase DNS label of at most 43 characters".to_owned())
                    }
                })
                .unwrap_or_default(),
            health_check,
            lease,
            sources: raw
                .values
                .iter()
                .map(|(id, (_, src))| (*id, src.clone()))
                .collect(),
            unknown_file_keys: raw.unknown_file_keys.clone(),
        }
    }
}

/// `cloud-sa.json` keys from another file (the bootstrap config's `cloud:` section), and the
/// `cloud-sa.json` it names (`configFile`), which ranks like `--cloud-config`, below it.
#[derive(Debug, Clone)]
pub struct Section {
    /// The file the keys were read from (named by errors and `Source::File`).
    pub origin: PathBuf,
    /// The keys, as in `cloud-sa.json`.
    pub object: serde_json::Map<String, serde_json::Value>,
    /// A `cloud-sa.json`, used when neither `--cloud-config` nor `BATON_CLOUD_CONFIG` is set.
    pub config_file: Option<PathBuf>,
}

/// The `--cloud-config` file: the flag, else `BATON_CLOUD_CONFIG` (empty counts as unset).
pub fn cloud_config_path(args: &ConfigArgs, env: &dyn Env) -> Option<PathBuf> {
    args.cloud_config.clone().or_else(|| {
        env.var(CLOUD_CONFIG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// The environment variable of `--cloud-config`.
pub const CLOUD_CONFIG_ENV: &str = "BATON_CLOUD_CONFIG";

fn missing(id: &str) -> ConfigError {
    let s = setting(id);
    ConfigError::Missing {
        key: s.file_key,
        flag: format!("--{}", s.flag),
        env: s.env,
    }
}

fn setting(id: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.id == id)
        .expect("every setting id used in code is in SETTINGS")
}

/// Parses a boolean the way Go's `strconv.ParseBool` does (the CCM uses it).
fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("must be true or false".to_owned()),
    }
}

struct Parser<'a> {
    raw: &'a RawValues,
    errors: &'a mut Vec<InvalidValue>,
}

impl Parser<'_> {
    /// Parses setting `id` with `f`; records an error and returns `None` if it fails.
    fn value<T>(&mut self, id: &'static str, f: impl FnOnce(&str) -> Result<T, String>) -> Option<T> {
        let (value, source) = self.raw.values.get(id)?;
        let value = value.as_deref()?;
        match f(value) {
            Ok(v) => Some(v),
            Err(reason) => {
                let s = setting(id);
                self.errors.push(InvalidValue {
                    key: s.file_key,
                    source: source.clone(),
                    value: if s.secret {
                        "<redacted>".to_owned()
                    } else {
                        value.to_owned()
                    },
                    reason,
                });
                None
            }
        }
    }

    fn duration(&mut self, id: &'static str) -> Duration {
        self.value(id, |v| match parse_duration(v) {
            Ok(d) if d.is_zero() => Err("must be greater than zero".to_owned()),
            Ok(d) => Ok(d),
            Err(e) => Err(e.to_string()),
        })
        .unwrap_or_default()
    }

    fn lease(&mut self) -> LeaseTiming {
        LeaseTiming {
            duration: self.duration("lease_duration"),
            renew_deadline: self.duration("lease_renew_deadline"),
            renew_interval: self.duration("lease_renew_interval"),
        }
    }

    fn count(&mut self, id: &'static str) -> u32 {
        self.value(id, |v| match v.parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => Ok(n),
            _ => Err("must be a whole number from 1 to 100".to_owned()),
        })
        .unwrap_or(1)
    }

    fn peer_annotation(&mut self, id: &'static str) -> String {
        self.value(id, |v| {
            if !v.contains("{{n}}") {
                return Err("must contain {{n}} (the peer index)".to_owned());
            }
            if !is_qualified_key(&v.replace("{{n}}", "0")) {
                return Err("not a valid annotation key".to_owned());
            }
            Ok(v.to_owned())
        })
        .unwrap_or_default()
    }
}

/// Each setting's raw (string) value and its source, before parsing.
struct RawValues {
    values: BTreeMap<&'static str, (Option<String>, Source)>,
    unknown_file_keys: Vec<String>,
    type_errors: Vec<InvalidValue>,
}

struct FileValues {
    /// Lower-cased key -> (file, key as written, value as text or an error).
    entries: BTreeMap<String, (PathBuf, String, Result<String, String>)>,
}

impl RawValues {
    fn collect(args: &ConfigArgs, env: &dyn Env, file: Option<&FileValues>) -> Self {
        let nonempty = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        let mut values = BTreeMap::new();
        let mut type_errors = Vec::new();
        for s in SETTINGS {
            let mut from_file = None;
            if let Some(f) = file
                && let Some((path, key, v)) = f.entries.get(&s.file_key.to_ascii_lowercase())
            {
                let source = Source::File {
                    path: path.clone(),
                    key: key.clone(),
                };
                match v {
                    Ok(v) => from_file = nonempty(Some(v.clone())).map(|v| (v, source)),
                    // A value of the wrong JSON type is an error even when a flag overrides it:
                    // the file is wrong and its owner should hear about it.
                    Err(reason) => type_errors.push(InvalidValue {
                        key: s.file_key,
                        source,
                        value: "<non-scalar JSON>".to_owned(),
                        reason: reason.clone(),
                    }),
                }
            }
            let resolved = nonempty(args.flag(s.id).map(str::to_owned))
                .map(|v| {
                    (
                        v,
                        Source::Flag {
                            flag: s.flag.to_owned(),
                        },
                    )
                })
                .or_else(|| {
                    nonempty(env.var(s.env)).map(|v| {
                        (
                            v,
                            Source::Env {
                                var: s.env.to_owned(),
                            },
                        )
                    })
                })
                .or(from_file)
                .or_else(|| s.default.map(|d| (d.to_owned(), Source::Default)));
            let entry = match resolved {
                Some((v, src)) => (Some(v), src),
                None => (None, Source::Unset),
            };
            values.insert(s.id, entry);
        }
        let known: Vec<String> = SETTINGS.iter().map(|s| s.file_key.to_ascii_lowercase()).collect();
        let unknown_file_keys = file
            .map(|f| {
                f.entries
                    .iter()
                    .filter(|(k, _)| !known.contains(k))
                    .map(|(_, (_, key, _))| key.clone())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            values,
            unknown_file_keys,
            type_errors,
        }
    }
}

fn read_file(path: &Path) -> Result<FileValues, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|source| ConfigError::ParseFile {
        path: path.to_owned(),
        source,
    })?;
    let serde_json::Value::Object(map) = json else {
        return Err(ConfigError::NotAnObject {
            path: path.to_owned(),
        });
    };
    Ok(object_values(path, map))
}

fn object_values(path: &Path, map: serde_json::Map<String, serde_json::Value>) -> FileValues {
    let entries = map
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => Ok(s),
                serde_json::Value::Number(n) => Ok(n.to_string()),
                serde_json::Value::Bool(b) => Ok(b.to_string()),
                _ => Err("must be a string, number or boolean".to_owned()),
            };
            (k.to_ascii_lowercase(), (path.to_owned(), k, text))
        })
        .collect();
    FileValues { entries }
}

/// `baton config …`
#[derive(Debug, Args)]
pub struct ConfigCommand {
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// What to do with the configuration.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up; boxing buys nothing
pub enum ConfigAction {
    /// Print the effective configuration and where each value came from (secrets redacted).
    Show {
        #[command(flatten)]
        config: ConfigArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Print the reference table of every setting (Markdown, as in docs/configuration.md).
    Reference,
}

/// Output formats of `baton config show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// One row of `baton config show`.
#[derive(Debug, Serialize)]
pub struct ShowRow {
    pub key: &'static str,
    pub value: Option<String>,
    pub source: Source,
}

impl ConfigCommand {
    /// Runs the command, printing to stdout.
    pub fn run(self, env: &dyn Env) -> Result<(), ConfigError> {
        let text = match self.action {
            ConfigAction::Show { config, output } => show(&config, env, output)?,
            ConfigAction::Reference => reference(),
        };
        print!("{text}");
        Ok(())
    }
}

/// Renders `baton config show`.
pub fn show(args: &ConfigArgs, env: &dyn Env, output: OutputFormat) -> Result<String, ConfigError> {
    let cfg = Config::resolve(args, env)?;
    let rows: Vec<ShowRow> = SETTINGS
        .iter()
        .map(|s| ShowRow {
            key: s.file_key,
            value: cfg.display_value(s.id),
            source: cfg.sources.get(s.id).cloned().unwrap_or(Source::Unset),
        })
        .collect();
    Ok(match output {
        OutputFormat::Json => {
            let doc = serde_json::json!({ "settings": rows, "unknownFileKeys": cfg.unknown_file_keys });
            format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default())
        }
        OutputFormat::Text => {
            let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(0);
            let mut out = String::new();
            for r in &rows {
                let value = r.value.as_deref().unwrap_or("<unset>");
                let _ = writeln!(out, "{:width$}  {value}  ({})", r.key, r.source);
            }
            for k in &cfg.unknown_file_keys {
                let _ = writeln!(out, "warning: unknown key {k:?} in the config file is ignored");
            }
            out
        }
    })
}

/// The Markdown reference table of every setting.
pub fn reference() -> String {
    let mut out = String::from(
        "| key (cloud-sa.json) | flag | environment | default | description |\n|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let default = s.default.map_or_else(|| "unset".to_owned(), |d| format!("`{d}`"));
        let _ = writeln!(
            out,
            "| `{}` | `--{}` | `{}` | {default} | {}{} |",
            s.file_key,
            s.flag,
            s.env,
            s.doc.replace('|', "\\|"),
            if s.secret { " (secret: never printed)" } else { "" },
        );
    }
    out
}

#[cfg(test)]
mod tests;
