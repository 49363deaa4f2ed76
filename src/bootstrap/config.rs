//! The bootstrap config file: its schema (YAML or JSON) and its validation.
//!
//! Parsing is two-step. serde reads the file into `Raw*` structs whose fields are all optional
//! (unknown keys are rejected, so a typo is an error, not a silently ignored setting); then
//! [`BootstrapConfig::from_raw`] checks every field and collects **every** problem, each naming
//! the field by its path in the file (`endpoints[1].fip.address`). The result holds only parsed
//! types (addresses, DNS names, FIP tags, durations), so later steps never re-validate.
//!
//! Cloud settings are not parsed here: the `cloud:` section is a map with the keys of
//! cloud-provider-cherry's `cloud-sa.json` and goes through the shared layered configuration
//! (`crate::config`), so flags and `CHERRY_*` variables still take precedence over it.
//! See `docs/bootstrap.md` and `bootstrap/bootstrap.example.yaml`.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton_core::FipTag;
use baton_core::duration::parse_duration;
use baton_core::names::{is_dns1123_label, is_dns1123_subdomain};
use baton_dns::{DnsName, TsigKey};
use serde::Deserialize;

/// Default TTL of the API records (seconds). OpenShift's on-prem CoreDNS uses 60.
pub const DEFAULT_TTL: u32 = 30;
/// Default state file.
pub const DEFAULT_STATE_FILE: &str = "/var/lib/baton/bootstrap-state.json";

/// One problem in the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `endpoints[0].fip.address`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a config file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read the bootstrap config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bootstrap config {path} is not valid YAML/JSON: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid bootstrap config {path}:\n{}", .errors.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid { path: PathBuf, errors: Vec<FieldError> },
}

// ---------------------------------------------------------------------------------------------
// The file as written.

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    cluster: Option<RawCluster>,
    bootstrap_host: Option<RawHost>,
    cloud: Option<serde_json::Map<String, serde_json::Value>>,
    kubernetes: Option<RawKubernetes>,
    endpoints: Option<Vec<RawEndpoint>>,
    dns: Option<RawDns>,
    timeouts: Option<RawTimeouts>,
    handoff: Option<RawHandoff>,
    state_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawCluster {
    name: Option<String>,
    base_domain: Option<String>,
    infra_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHost {
    public_address: Option<String>,
    private_address: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawKubernetes {
    kubeconfig: Option<PathBuf>,
    #[serde(rename = "clusterCA")]
    cluster_ca: Option<PathBuf>,
    api_server_port: Option<u16>,
    api_server_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawEndpoint {
    name: Option<String>,
    fip: Option<RawFip>,
    service: Option<RawService>,
    publish: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawFip {
    tag: Option<String>,
    address: Option<String>,
    reserve: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawService {
    namespace: Option<String>,
    name: Option<String>,
    ports: Option<Vec<RawPort>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawPort {
    name: Option<String>,
    port: Option<i64>,
    target_port: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawDns {
    mode: Option<String>,
    zone: Option<String>,
    ttl: Option<i64>,
    listen: Option<Vec<String>>,
    server: Option<String>,
    tsig_key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTimeouts {
    bootstrap_api: Option<String>,
    handoff: Option<String>,
    services_ready: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHandoff {
    manifests: Option<Vec<PathBuf>>,
}

// ---------------------------------------------------------------------------------------------
// The validated configuration.

/// The cluster's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// `metadata.name` of the cluster, e.g. `c1`.
    pub name: String,
    /// e.g. `example.com`.
    pub base_domain: String,
    /// The installer's infrastructure id, e.g. `c1-x7k2p`: part of the tags of reserved FIPs.
    pub infra_id: String,
}

/// Which bootstrap-host address an endpoint's DNS name carries during bootstrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Publish {
    /// `bootstrapHost.publicAddress`.
    Public,
    /// `bootstrapHost.privateAddress`.
    Private,
}

/// How an endpoint's Floating IP is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FipSource {
    /// The installer reserved it with this tag.
    Tag(FipTag),
    /// The installer reserved this address.
    Address(IpAddr),
    /// baton reserves it, tagged so that a rerun finds it again (see [`reserve_tags`]).
    Reserve,
}

impl fmt::Display for FipSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tag(t) => write!(f, "tag {t}"),
            Self::Address(a) => write!(f, "address {a}"),
            Self::Reserve => f.write_str("reserve"),
        }
    }
}

/// The tags of a FIP that baton reserves for endpoint `endpoint` of cluster `infra_id`.
pub fn reserve_tags(infra_id: &str, endpoint: &str) -> baton_cloud::model::Tags {
    baton_cloud::model::Tags::from([
        ("usage".to_owned(), "baton-control-plane-endpoint".to_owned()),
        ("infra-id".to_owned(), infra_id.to_owned()),
        ("endpoint".to_owned(), endpoint.to_owned()),
    ])
}

/// One port of an API Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub port: u16,
    pub target_port: u16,
}

/// The API Service of an endpoint (no selector: its endpoints mirror `default/kubernetes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub ports: Vec<ServicePort>,
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One API endpoint: a DNS name, a FIP and a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `api`, `api-int`, …
    pub name: String,
    /// `<name>.<cluster>.<baseDomain>`.
    pub dns_name: DnsName,
    pub fip: FipSource,
    pub service: ServiceRef,
    pub publish: Publish,
}

/// How DNS is published.
#[derive(Debug, Clone)]
pub enum DnsMode {
    /// baton's embedded authoritative server on these addresses.
    Embedded { listen: Vec<SocketAddr> },
    /// RFC 2136 updates to the site's server, TSIG-signed.
    Rfc2136 { server: SocketAddr, key: TsigKey },
    /// Not published by baton (the installer does it).
    None,
}

/// DNS settings.
#[derive(Debug, Clone)]
pub struct Dns {
    pub mode: DnsMode,
    /// The zone, `<cluster>.<baseDomain>` by default.
    pub zone: DnsName,
    /// TTL of the records; after dropping the bootstrap address baton waits one TTL.
    pub ttl: u32,
}

/// How to reach the bootstrap API server.
#[derive(Debug, Clone)]
pub struct Kubernetes {
    /// Admin kubeconfig of the bootstrap API server (`--kubeconfig`/`KUBECONFIG` override it).
    pub kubeconfig: Option<PathBuf>,
    /// The cluster CA file.
    pub cluster_ca: PathBuf,
    /// Its certificates (DER), for the `/readyz` checks.
    pub cluster_ca_der: Vec<Vec<u8>>,
    /// The API servers' port.
    pub api_server_port: u16,
    /// The name the API servers' certificates are checked against.
    pub api_server_name: String,
}

/// Time limits of the waiting steps (per run: a rerun starts them again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub bootstrap_api: Duration,
    pub handoff: Duration,
    pub services_ready: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            bootstrap_api: Duration::from_secs(20 * 60),
            handoff: Duration::from_secs(5 * 60),
            services_ready: Duration::from_secs(40 * 60),
        }
    }
}

/// One object of a handoff manifest.
#[derive(Debug, Clone)]
pub struct ManifestObject {
    /// `file#index`, for messages.
    pub origin: String,
    pub object: kube::api::DynamicObject,
}

/// The validated bootstrap configuration.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    /// The file it came from.
    pub path: PathBuf,
    pub cluster: Cluster,
    pub bootstrap_public: IpAddr,
    pub bootstrap_private: Option<IpAddr>,
    /// The `cloud:` section (cloud-sa.json keys), resolved later with flags and environment.
    pub cloud: serde_json::Map<String, serde_json::Value>,
    pub kubernetes: Kubernetes,
    pub endpoints: Vec<Endpoint>,
    pub dns: Dns,
    pub timeouts: Timeouts,
    /// The manifests' objects, in file order.
    pub manifests: Vec<ManifestObject>,
    pub state_file: PathBuf,
}

impl BootstrapConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text` (YAML, or JSON, which is YAML) read from `path`. Relative
    /// paths inside it are relative to the file's directory.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigFileError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigFileError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        let mut v = Validator {
            errors: Vec::new(),
            base,
        };
        let cfg = v.config(path, raw);
        match cfg {
            Some(cfg) if v.errors.is_empty() => Ok(cfg),
            _ => Err(ConfigFileError::Invalid {
                path: path.to_owned(),
                errors: v.errors,
            }),
        }
    }

    /// The bootstrap address an endpoint publishes.
    pub fn bootstrap_address(&self, publish: Publish) -> IpAddr {
        match publish {
            Publish::Public => self.bootstrap_public,
            // Validation guarantees a private address when an endpoint publishes it.
            Publish::Private => self.bootstrap_private.unwrap_or(self.bootstrap_public),
        }
    }

    /// Whether some endpoint asks baton to reserve its FIP (then `cloud.region` is required).
    pub fn reserves(&self) -> bool {
        self.endpoints.iter().any(|e| e.fip == FipSource::Reserve)
    }
}

struct Validator<'a> {
    errors: Vec<FieldError>,
    base: &'a Path,
}

impl Validator<'_> {
    fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn required<T>(&mut self, field: &str, v: Option<T>) -> Option<T> {
        if v.is_none() {
            self.err(field, "required");
        }
        v
    }

    fn required_list<T>(&mut self, field: &str, v: Option<Vec<T>>, what: &str) -> Vec<T> {
        match v {
            None => {
                self.err(field, "required");
                Vec::new()
            }
            Some(v) if v.is_empty() => {
                self.err(field, format!("at least one {what} is required"));
                v
            }
            Some(v) => v,
        }
    }

    fn path(&self, p: PathBuf) -> PathBuf {
        if p.is_absolute() { p } else { self.base.join(p) }
    }

    fn address(&mut self, field: &str, v: &str) -> Option<IpAddr> {
        match v.trim().parse::<IpAddr>() {
            Ok(ip) if ip.is_unspecified() || ip.is_multicast() => {
                self.err(field, format!("{v:?} is not a usable host address"));
                None
            }
            Ok(ip) => Some(ip),
            Err(_) => {
                self.err(field, format!("{v:?} is not an IP address"));
                None
            }
        }
    }

    fn duration(&mut self, field: &str, v: Option<String>, default: Duration) -> Duration {
        match v {
            None => default,
            Some(s) => match parse_duration(&s) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    self.err(field, "must be greater than zero");
                    default
                }
                Err(e) => {
                    self.err(field, format!("{s:?}: {e}"));
                    default
                }
            },
        }
    }

    #[allow(clippy::too_many_lines)] // one straight walk over the schema reads best
    fn config(&mut self, path: &Path, raw: RawConfig) -> Option<BootstrapConfig> {
        let cluster = self.cluster(raw.cluster);
        let (bootstrap_public, bootstrap_private) = match self.required("bootstrapHost", raw.bootstrap_host) {
            Some(host) => (
                self.required("bootstrapHost.publicAddress", host.public_address)
                    .and_then(|a| self.address("bootstrapHost.publicAddress", &a)),
                host.private_address
                    .and_then(|a| self.address("bootstrapHost.privateAddress", &a)),
            ),
            None => (None, None),
        };
        let cloud = self.required("cloud", raw.cloud).unwrap_or_default();
        let kubernetes = self.kubernetes(raw.kubernetes, cluster.as_ref());
        let zone_default = cluster
            .as_ref()
            .and_then(|c| format!("{}.{}", c.name, c.base_domain).parse::<DnsName>().ok());
        let dns = self.dns(raw.dns, zone_default.as_ref());
        let endpoints = self.endpoints(raw.endpoints, cluster.as_ref(), dns.as_ref(), bootstrap_private);
        let timeouts = self.timeouts(raw.timeouts);
        let manifests = self.manifests(raw.handoff);
        let state_file = raw
            .state_file
            .map_or_else(|| PathBuf::from(DEFAULT_STATE_FILE), |p| self.path(p));
        Some(BootstrapConfig {
            path: path.to_owned(),
            cluster: cluster?,
            bootstrap_public: bootstrap_public?,
            bootstrap_private,
            cloud,
            kubernetes: kubernetes?,
            endpoints,
            dns: dns?,
            timeouts,
            manifests,
            state_file,
        })
    }

    fn cluster(&mut self, raw: Option<RawCluster>) -> Option<Cluster> {
        let raw = self.required("cluster", raw)?;
        let name = self.required("cluster.name", raw.name);
        let base_domain = self.required("cluster.baseDomain", raw.base_domain);
        let infra_id = self.required("cluster.infraId", raw.infra_id);
        if let Some(n) = &name
            && !is_dns1123_label(n)
        {
            self.err("cluster.name", format!("{n:?} is not a lowercase DNS label"));
        }
        if let Some(d) = &base_domain
            && !is_dns1123_subdomain(d.trim_end_matches('.'))
        {
            self.err(
                "cluster.baseDomain",
                format!("{d:?} is not a lowercase domain name"),
            );
        }
        if let Some(i) = &infra_id
            && (i.is_empty() || i.len() > 128 || i.chars().any(|c| c.is_control() || c == '='))
        {
            self.err(
                "cluster.infraId",
                "must be 1-128 printable characters without '='",
            );
        }
        Some(Cluster {
            name: name?,
            base_domain: base_domain?.trim_end_matches('.').to_owned(),
            infra_id: infra_id?,
        })
    }

    fn kubernetes(&mut self, raw: Option<RawKubernetes>, cluster: Option<&Cluster>) -> Option<Kubernetes> {
        let raw = self.required("kubernetes", raw)?;
        let cluster_ca = self
            .required("kubernetes.clusterCA", raw.cluster_ca)
            .map(|p| self.path(p));
        let der = cluster_ca
            .as_ref()
            .and_then(|p| match crate::kube::tls::read_ca(p) {
                Ok(der) => Some(der),
                Err(e) => {
                    self.err("kubernetes.clusterCA", format!("{}: {e}", p.display()));
                    None
                }
            });
        let port = raw.api_server_port.unwrap_or(6443);
        if port == 0 {
            self.err("kubernetes.apiServerPort", "must be a port number 1-65535");
        }
        let name = raw
            .api_server_name
            .or_else(|| cluster.map(|c| format!("api-int.{}.{}", c.name, c.base_domain)));
        if let Some(n) = &name
            && (n.parse::<IpAddr>().is_ok() || !is_dns1123_subdomain(n))
        {
            // A name, not an address: every probed address is checked against the same name.
            self.err(
                "kubernetes.apiServerName",
                format!("{n:?} is not a DNS name (the name on the API servers' certificates)"),
            );
        }
        Some(Kubernetes {
            kubeconfig: raw.kubeconfig.map(|p| self.path(p)),
            cluster_ca: cluster_ca?,
            cluster_ca_der: der?,
            api_server_port: port,
            api_server_name: name?,
        })
    }

    fn dns(&mut self, raw: Option<RawDns>, zone_default: Option<&DnsName>) -> Option<Dns> {
        let raw = raw.unwrap_or_default();
        let zone = match raw.zone {
            Some(z) => match z.parse::<DnsName>() {
                Ok(z) => Some(z),
                Err(e) => {
                    self.err("dns.zone", e.to_string());
                    None
                }
            },
            None => zone_default.cloned(),
        };
        let ttl = match raw.ttl {
            None => DEFAULT_TTL,
            Some(t) => match u32::try_from(t) {
                Ok(t) if (1..=86_400).contains(&t) => t,
                _ => {
                    self.err("dns.ttl", format!("{t} is not a TTL from 1 to 86400 seconds"));
                    DEFAULT_TTL
                }
            },
        };
        let mode = match raw.mode.as_deref().unwrap_or("embedded") {
            "embedded" => {
                let listen = self.required_list("dns.listen", raw.listen, "listen address");
                let mut out = Vec::new();
                for (i, l) in listen.iter().enumerate() {
                    match parse_socket(l, 53) {
                        Some(a) => out.push(a),
                        None => self.err(
                            format!("dns.listen[{i}]"),
                            format!("{l:?} is not an address or address:port"),
                        ),
                    }
                }
                if listen.is_empty() {
                    None
                } else {
                    Some(DnsMode::Embedded { listen: out })
                }
            }
            "rfc2136" => {
                let server = self.required("dns.server", raw.server).and_then(|s| {
                    let parsed = parse_socket(&s, 53);
                    if parsed.is_none() {
                        self.err("dns.server", format!("{s:?} is not an address or address:port"));
                    }
                    parsed
                });
                let key = self
                    .required("dns.tsigKeyFile", raw.tsig_key_file)
                    .map(|p| self.path(p))
                    .and_then(|p| match TsigKey::from_file(&p) {
                        Ok(k) => Some(k),
                        Err(e) => {
                            self.err("dns.tsigKeyFile", e.to_string());
                            None
                        }
                    });
                Some(DnsMode::Rfc2136 {
                    server: server?,
                    key: key?,
                })
            }
            "none" => Some(DnsMode::None),
            other => {
                self.err(
                    "dns.mode",
                    format!("{other:?}: expected embedded, rfc2136 or none"),
                );
                None
            }
        };
        Some(Dns {
            mode: mode?,
            zone: zone?,
            ttl,
        })
    }

    fn endpoints(
        &mut self,
        raw: Option<Vec<RawEndpoint>>,
        cluster: Option<&Cluster>,
        dns: Option<&Dns>,
        private: Option<IpAddr>,
    ) -> Vec<Endpoint> {
        let raw = self.required_list("endpoints", raw, "endpoint (e.g. api)");
        let mut names = BTreeSet::new();
        let mut services = BTreeSet::new();
        let mut out = Vec::new();
        for (i, e) in raw.into_iter().enumerate() {
            let f = |s: &str| format!("endpoints[{i}].{s}");
            let name = self.required(&f("name"), e.name);
            if let Some(n) = &name {
                if !is_dns1123_label(n) {
                    self.err(f("name"), format!("{n:?} is not a lowercase DNS label"));
                } else if !names.insert(n.clone()) {
                    self.err(f("name"), format!("endpoint {n:?} is listed twice"));
                }
            }
            let dns_name = match (&name, cluster, dns) {
                (Some(n), Some(_), Some(d)) => DnsName::relative_to(n, &d.zone)
                    .map_err(|e| self.err(f("name"), e.to_string()))
                    .ok(),
                _ => None,
            };
            let fip = self.fip(&f("fip"), e.fip);
            let service = self.service(&f("service"), e.service);
            if let Some(s) = &service
                && !services.insert((s.namespace.clone(), s.name.clone()))
            {
                self.err(f("service"), format!("Service {s} is used by two endpoints"));
            }
            let publish = match e.publish.as_deref().unwrap_or("public") {
                "public" => Some(Publish::Public),
                "private" => {
                    if private.is_none() {
                        self.err(f("publish"), "\"private\" needs bootstrapHost.privateAddress");
                    }
                    Some(Publish::Private)
                }
                other => {
                    self.err(f("publish"), format!("{other:?}: expected public or private"));
                    None
                }
            };
            if let (Some(name), Some(dns_name), Some(fip), Some(service), Some(publish)) =
                (name, dns_name, fip, service, publish)
            {
                out.push(Endpoint {
                    name,
                    dns_name,
                    fip,
                    service,
                    publish,
                });
            }
        }
        out
    }

    fn fip(&mut self, field: &str, raw: Option<RawFip>) -> Option<FipSource> {
        let raw = self.required(field, raw)?;
        let reserve = raw.reserve.unwrap_or(false);
        let given =
            usize::from(raw.tag.is_some()) + usize::from(raw.address.is_some()) + usize::from(reserve);
        if given != 1 {
            self.err(field, "give exactly one of tag, address or reserve: true");
            return None;
        }
        if let Some(t) = raw.tag {
            return match t.parse::<FipTag>() {
                Ok(t) => Some(FipSource::Tag(t)),
                Err(e) => {
                    self.err(format!("{field}.tag"), format!("{t:?}: {e}"));
                    None
                }
            };
        }
        if let Some(a) = raw.address {
            return self
                .address(&format!("{field}.address"), &a)
                .map(FipSource::Address);
        }
        Some(FipSource::Reserve)
    }

    fn service(&mut self, field: &str, raw: Option<RawService>) -> Option<ServiceRef> {
        let raw = self.required(field, raw)?;
        let namespace = self.required(&format!("{field}.namespace"), raw.namespace);
        let name = self.required(&format!("{field}.name"), raw.name);
        if let Some(n) = &namespace
            && !is_dns1123_label(n)
        {
            self.err(
                format!("{field}.namespace"),
                format!("{n:?} is not a valid namespace name"),
            );
        }
        if let Some(n) = &name
            && (!is_dns1123_label(n) || n.starts_with(|c: char| c.is_ascii_digit()))
        {
            self.err(
                format!("{field}.name"),
                format!("{n:?} is not a valid Service name"),
            );
        }
        let raw_ports = raw.ports.unwrap_or_else(|| {
            vec![RawPort {
                name: Some("https".into()),
                port: Some(6443),
                target_port: None,
            }]
        });
        if raw_ports.is_empty() {
            self.err(format!("{field}.ports"), "at least one port is required");
        }
        let mut ports = Vec::new();
        for (i, p) in raw_ports.into_iter().enumerate() {
            let pf = |s: &str| format!("{field}.ports[{i}].{s}");
            let port = self
                .required(&pf("port"), p.port)
                .and_then(|n| match u16::try_from(n) {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        self.err(pf("port"), format!("{n} is not a port number 1-65535"));
                        None
                    }
                });
            let target = match p.target_port {
                None => port,
                Some(n) => match u16::try_from(n) {
                    Ok(n) if n > 0 => Some(n),
                    _ => {
                        self.err(pf("targetPort"), format!("{n} is not a port number 1-65535"));
                        None
                    }
                },
            };
            let pname = p.name.unwrap_or_else(|| format!("port-{i}"));
            if !is_dns1123_label(&pname) {
                self.err(pf("name"), format!("{pname:?} is not a valid port name"));
            }
            if let (Some(port), Some(target_port)) = (port, target) {
                ports.push(ServicePort {
                    name: pname,
                    port,
                    target_port,
                });
            }
        }
        Some(ServiceRef {
            namespace: namespace?,
            name: name?,
            ports,
        })
    }

    fn timeouts(&mut self, raw: Option<RawTimeouts>) -> Timeouts {
        let raw = raw.unwrap_or_default();
        let d = Timeouts::default();
        Timeouts {
            bootstrap_api: self.duration("timeouts.bootstrapApi", raw.bootstrap_api, d.bootstrap_api),
            handoff: self.duration("timeouts.handoff", raw.handoff, d.handoff),
            services_ready: self.duration("timeouts.servicesReady", raw.services_ready, d.services_ready),
        }
    }

    fn manifests(&mut self, raw: Option<RawHandoff>) -> Vec<ManifestObject> {
        let files = raw.and_then(|h| h.manifests).unwrap_or_default();
        let mut out = Vec::new();
        for (i, file) in files.into_iter().enumerate() {
            let field = format!("handoff.manifests[{i}]");
            let file = self.path(file);
            match std::fs::read_to_string(&file) {
                Ok(text) => match parse_manifests(&file, &text) {
                    Ok(objs) => out.extend(objs),
                    Err(e) => self.err(field, e),
                },
                Err(e) => self.err(field, format!("cannot read {}: {e}", file.display())),
            }
        }
        out
    }
}

/// `ip`, `ip:port` or `[v6]:port`.
fn parse_socket(s: &str, default_port: u16) -> Option<SocketAddr> {
    let s = s.trim();
    s.parse::<SocketAddr>().ok().or_else(|| {
        s.parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, default_port))
    })
}

/// The objects of a multi-document YAML file; empty documents are skipped. Each needs
/// `apiVersion`, `kind` and `metadata.name`.
pub fn parse_manifests(file: &Path, text: &str) -> Result<Vec<ManifestObject>, String> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(doc)
            .map_err(|e| format!("{} document {i}: not valid YAML: {e}", file.display()))?;
        if value.is_null() {
            continue;
        }
        let object: kube::api::DynamicObject = serde_yaml_ng::from_value(value)
            .map_err(|e| format!("{} document {i}: not a Kubernetes object: {e}", file.display()))?;
        let origin = format!("{}#{i}", file.display());
        if object.types.is_none() {
            return Err(format!("{origin}: apiVersion and kind are required"));
        }
        if object.metadata.name.is_none() {
            return Err(format!("{origin}: metadata.name is required"));
        }
        out.push(ManifestObject { origin, object });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
