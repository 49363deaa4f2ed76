//! The settings table: one row per setting, and everything generated from it.
//!
//! ```text
//!   settings! { Variant field => config.path: flag, env, file key, default, parse, show }
//!        ├─▶ Id (typed: a misspelt setting is a compile error)   ├─▶ SETTINGS (docs, show, reference)
//!        ├─▶ ConfigArgs (the flags)                               ├─▶ Config::parse_value (into config.path)
//!        └─▶ Config::display_value (from config.path)
//!   flags! { … }  the flags a subcommand reads outside the layered config (show only)
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use baton_cloud::CloudKind;
use baton_core::duration::parse_duration;
use baton_core::names::{is_dns1123_label, is_qualified_key};
use baton_core::{FipTag, LabelSelector, LoadBalancerMode, Secret};
use clap::Args;
use serde::Serialize;
use url::Url;

use self::display::{auto_or_bool, duration, duration_or_zero, list, optional, redacted, text, zero_if_none};

/// The official Cherry Servers API.
pub const DEFAULT_BASE_URL: &str = "https://api.cherryservers.com";

/// One configurable setting: its flag, environment variable, file key and default.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The typed id.
    pub id: Id,
    /// The field name in [`ConfigArgs`].
    pub name: &'static str,
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
    ($( $id:ident $field:ident => $($path:ident).+ {
        flag: $flag:literal, env: $env:literal, file: $file:literal,
        default: $default:expr, secret: $secret:literal, doc: $doc:literal,
        parse: $parse:expr, show: $show:expr $(,)?
    } ),* $(,)?) => {
        /// Every setting, by name: a typo is a compile error, not a panic at run time.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Id {
            $( $id, )*
        }

        impl Id {
            /// The setting's row in [`SETTINGS`].
            pub fn setting(self) -> &'static Setting {
                // SETTINGS is generated in the order of the variants.
                &SETTINGS[self as usize]
            }
        }

        /// The configuration flags shared by `baton controller`, `baton bootstrap` and
        /// `baton config show`. Each flag also reads an environment variable and a key of the
        /// `--cloud-config` file; see `baton config show` and docs/configuration.md.
        #[derive(Clone, Default, Args)]
        pub struct ConfigArgs {
            /// JSON config file in cloud-provider-cherry's `cloud-sa.json` format [env: BATON_CLOUD_CONFIG]
            #[arg(long = "cloud-config", value_name = "PATH")]
            pub cloud_config: Option<PathBuf>,
            $(
                // A secret's flag is refused (Config::resolve says where to put it instead), so
                // it is not offered in --help either.
                #[doc = concat!($doc, " [env: ", $env, "] [file: ", $file, "]")]
                #[arg(long = $flag, value_name = "VALUE", allow_hyphen_values = true, hide = $secret)]
                pub $field: Option<String>,
            )*
        }

        /// Every setting, in documentation order.
        pub const SETTINGS: &[Setting] = &[$(
            Setting {
                id: Id::$id,
                name: stringify!($field),
                flag: $flag,
                env: $env,
                file_key: $file,
                default: $default,
                secret: $secret,
                doc: $doc,
            }
        ),*];

        impl ConfigArgs {
            pub(super) fn flag(&self, id: Id) -> Option<&str> {
                match id {
                    $( Id::$id => self.$field.as_deref(), )*
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

        impl Config {
            /// The effective value of a setting as text (secrets redacted), for display.
            pub fn display_value(&self, id: Id) -> Option<String> {
                match id {
                    $( Id::$id => ($show)(&self.$($path).+), )*
                }
            }

            /// Parses `value` as setting `id` into its field; the reason if it is not valid.
            pub(super) fn parse_value(&mut self, id: Id, value: &str) -> Result<(), String> {
                match id {
                    $( Id::$id => self.$($path).+ = parse_with(value, $parse)?, )*
                }
                Ok(())
            }
        }
    };
}

settings! {
    Cloud cloud => cloud {
        flag: "cloud", env: "BATON_CLOUD", file: "cloud", default: Some("cherry"), secret: false,
        doc: "The cloud whose Floating IPs baton moves: cherry (Cherry Servers) or hetzner (Hetzner Cloud)",
        parse: |v| v.parse::<CloudKind>().map_err(|e| e.to_string()), show: text },
    HcloudToken hcloud_token => hcloud_token {
        flag: "hcloud-token", env: "HCLOUD_TOKEN", file: "hcloudToken", default: None, secret: true,
        doc: "Hetzner Cloud API token (with --cloud hetzner): from the environment (hcloud-cloud-controller-manager's Secret `hcloud`, key `token`) or the file only; `--hcloud-token` is refused",
        parse: |v| Ok(Some(Secret::new(v))), show: redacted },
    HcloudEndpoint hcloud_endpoint => hcloud_endpoint {
        flag: "hcloud-endpoint", env: "HCLOUD_ENDPOINT", file: "hcloudEndpoint",
        default: Some(baton_cloud::hetzner::DEFAULT_BASE_URL), secret: false,
        doc: "Base URL of the Hetzner Cloud API (with --cloud hetzner)",
        parse: parse_base_url, show: text },
    ApiKey api_key => api_key {
        flag: "api-key", env: "CHERRY_API_KEY", file: "apiKey", default: None, secret: true,
        doc: "Cherry Servers API key: from the environment or the file only (a flag would show in `ps` and /proc/<pid>/cmdline to every local user, so `--api-key` is refused)",
        parse: |v| Ok(Some(Secret::new(v))), show: redacted },
    ProjectId project_id => project_id {
        flag: "project-id", env: "CHERRY_PROJECT_ID", file: "projectID", default: None, secret: false,
        doc: "Cherry Servers project ID (a number)",
        parse: |v| match v.parse::<u64>() {
            Ok(0) => Err("must be a positive number".to_owned()),
            Ok(n) => Ok(Some(n)),
            Err(_) => Err("must be a number (a JSON number or a string of digits)".to_owned()),
        }, show: optional },
    Region region => region {
        flag: "region", env: "CHERRY_REGION_NAME", file: "region", default: None, secret: false,
        doc: "Region for Service Floating IPs (slug, e.g. LT-Siauliai); when set it wins over the Service annotation",
        parse: |v| Ok(Some(v.to_owned())), show: optional },
    BaseUrl base_url => base_url {
        flag: "base-url", env: "CHERRY_BASE_URL", file: "base-url", default: Some(DEFAULT_BASE_URL), secret: false,
        doc: "Base URL of the Cherry Servers API",
        parse: parse_base_url, show: text },
    LoadBalancer load_balancer => load_balancer {
        flag: "load-balancer", env: "CHERRY_LOAD_BALANCER", file: "loadbalancer", default: None, secret: false,
        doc: "Load balancer implementation: kube-vip://, metallb:///<ns>/?bgp-peer-mode=native|frr|none, empty://?ip-annotation=<name>",
        parse: |v| v.parse::<LoadBalancerMode>().map(Some).map_err(|e| format!("{e}")), show: optional },
    AnnotationLocalAsn annotation_local_asn => annotations.local_asn {
        flag: "annotation-local-asn", env: "CHERRY_ANNOTATION_LOCAL_ASN", file: "annotationLocalASN",
        default: Some("cherryservers.com/bgp-peers-{{n}}-node-asn"), secret: false,
        doc: "Node annotation for the node's BGP ASN ({{n}} = peer index)",
        parse: peer_annotation, show: text },
    AnnotationPeerAsn annotation_peer_asn => annotations.peer_asn {
        flag: "annotation-peer-asn", env: "CHERRY_ANNOTATION_PEER_ASN", file: "annotationPeerASN",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-asn"), secret: false,
        doc: "Node annotation for the BGP peer's ASN ({{n}} = peer index)",
        parse: peer_annotation, show: text },
    AnnotationPeerIp annotation_peer_ip => annotations.peer_ip {
        flag: "annotation-peer-ip", env: "CHERRY_ANNOTATION_PEER_IP", file: "annotationPeerIP",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-ip"), secret: false,
        doc: "Node annotation for the BGP peer's IP ({{n}} = peer index)",
        parse: peer_annotation, show: text },
    AnnotationSrcIp annotation_src_ip => annotations.src_ip {
        flag: "annotation-src-ip", env: "CHERRY_ANNOTATION_SRC_IP", file: "annotationSrcIP",
        default: Some("cherryservers.com/bgp-peers-{{n}}-src-ip"), secret: false,
        doc: "Node annotation for the BGP source IP ({{n}} = peer index)",
        parse: peer_annotation, show: text },
    AnnotationMultiHop annotation_multi_hop => annotations.multi_hop {
        flag: "annotation-multi-hop", env: "CHERRY_ANNOTATION_MULTI_HOP", file: "annotationMultiHop",
        default: Some("cherryservers.com/bgp-peers-{{n}}-peer-multi-hop"), secret: false,
        doc: "Node annotation for BGP multi-hop ({{n}} = peer index)",
        parse: peer_annotation, show: text },
    AnnotationFipRegion annotation_fip_region => annotations.fip_region {
        flag: "annotation-fip-region", env: "CHERRY_ANNOTATION_FIP_REGION", file: "annotationFIPRegion",
        default: Some("cherryservers.com/fip-region"), secret: false,
        doc: "Service annotation naming the region of its Floating IP",
        parse: |v| if is_qualified_key(v) {
            Ok(v.to_owned())
        } else {
            Err("not a valid annotation key".to_owned())
        }, show: text },
    FipTag fip_tag => fip_tag {
        flag: "fip-tag", env: "CHERRY_FIP_TAG", file: "fipTag", default: None, secret: false,
        doc: "Tag (key=value) of the control-plane Floating IP; unset = no control-plane FIP management",
        parse: |v| v.parse::<FipTag>().map(Some).map_err(|e| format!("{e}")), show: optional },
    ControlPlaneNamespaces control_plane_namespaces => control_plane_namespaces {
        flag: "control-plane-namespaces", env: "BATON_CONTROL_PLANE_NAMESPACES", file: "controlPlaneNamespaces",
        default: Some("kube-system"), secret: false,
        doc: "Namespaces whose Services may be control-plane endpoints (annotation baton.dev/control-plane-endpoint), comma-separated; the namespaces `baton bootstrap` recorded (ConfigMap kube-system/baton-bootstrap) are allowed too; an endpoint Service elsewhere gets a Warning Event and nothing else",
        parse: parse_namespaces, show: list },
    AdoptFips adopt_fips => adopt_fips {
        flag: "adopt-fips", env: "BATON_ADOPT_FIPS", file: "adoptFips", default: None, secret: false,
        doc: "Floating IP addresses that are this cluster's although untagged, comma-separated: control-plane endpoints may route them, and Services of the namespaces serviceAllocation allows may ask for them (the explicit step to adopt a FIP; without it baton routes, unassigns, deletes or hands out only FIPs with this cluster's tags)",
        parse: parse_addresses, show: list },
    ServiceAllocationNamespaces service_allocation_namespaces => service_allocation.namespaces {
        flag: "service-allocation-namespaces", env: "BATON_SERVICE_ALLOCATION_NAMESPACES", file: "serviceAllocationNamespaces",
        default: None, secret: false,
        doc: "Namespaces whose Services may ask for an address (spec.loadBalancerIP, the load balancer's IP annotation), comma-separated, as MetalLB's serviceAllocation.namespaces; the address must still be this cluster's (tag cluster=<kube-system UID>, or adoptFips). With serviceAllocationNamespaceSelector: a namespace either lists or selects may; both unset: every namespace may. A Service asking for no address gets a FIP of its own in any namespace",
        parse: parse_namespaces, show: list },
    ServiceAllocationNamespaceSelector service_allocation_namespace_selector => service_allocation.namespace_selector {
        flag: "service-allocation-namespace-selector", env: "BATON_SERVICE_ALLOCATION_NAMESPACE_SELECTOR",
        file: "serviceAllocationNamespaceSelector", default: None, secret: false,
        doc: "Label selector of the namespaces whose Services may ask for an address (e.g. team=web, or baton.dev/fips in (allowed)), as MetalLB's serviceAllocation.namespaceSelectors; see serviceAllocationNamespaces",
        parse: |v| v.parse::<LabelSelector>()
            .map(|s| (!s.is_empty()).then_some(s))
            .map_err(|e| format!("{e}")),
        show: optional },
    InitializeNodes initialize_nodes => initialize_nodes {
        flag: "initialize-nodes", env: "BATON_INITIALIZE_NODES", file: "initializeNodes", default: Some("auto"), secret: false,
        doc: "Initialise Nodes as a cloud controller manager does (provider ID, addresses, labels, the uninitialized taint): true, false, or auto (true on Cherry Servers; false on Hetzner Cloud, where hcloud-cloud-controller-manager does it)",
        parse: |v| match v {
            "auto" => Ok(None),
            v => parse_bool(v).map(Some).map_err(|e| format!("{e}, or auto")),
        }, show: auto_or_bool },
    ApiServerPort api_server_port => api_server_port {
        flag: "api-server-port", env: "CHERRY_API_SERVER_PORT", file: "apiServerPort", default: Some("0"), secret: false,
        doc: "API server port on the Floating IP; 0 = the kube-apiserver's own port",
        parse: |v| v.parse::<u16>().map_err(|_| "must be a port number, 0-65535".to_owned()), show: text },
    BgpNodeSelector bgp_node_selector => bgp_node_selector {
        flag: "bgp-node-selector", env: "CHERRY_BGP_NODE_SELECTOR", file: "bgpNodeSelector", default: None, secret: false,
        doc: "Label selector of the nodes on which to enable BGP (e.g. key1=value1,key2=value2); unset = all nodes",
        parse: |v| v.parse::<LabelSelector>().map(Some).map_err(|e| format!("{e}")), show: optional },
    BgpPrefixLimit bgp_prefix_limit => bgp_prefix_limit {
        flag: "bgp-prefix-limit", env: "BATON_BGP_PREFIX_LIMIT", file: "bgpPrefixLimit", default: Some("0"), secret: false,
        doc: "Most Service prefixes handed to the load balancer per BGP session; Services past it get a Warning Event instead; 0 = no limit",
        parse: |v| v.parse::<u32>()
            .map(|n| (n > 0).then_some(n))
            .map_err(|_| "must be a whole number of prefixes, or 0 for no limit".to_owned()),
        show: zero_if_none },
    FipHealthCheckUseHostIp fip_health_check_use_host_ip => health_check.use_host_ip {
        flag: "fip-health-check-use-host-ip", env: "CHERRY_FIP_HEALTH_CHECK_USE_HOST_IP",
        file: "fipHealthCheckUseHostIP", default: Some("false"), secret: false,
        doc: "Probe the FIP holder on its host IP instead of the FIP (needed when the FIP is bound on loopback)",
        parse: parse_bool, show: text },
    ApiRateLimit api_rate_limit => api_rate_limit {
        flag: "api-rate-limit", env: "BATON_API_RATE_LIMIT", file: "apiRateLimit", default: Some("4"), secret: false,
        doc: "Cloud API requests per second, shared by all of baton's callers; 0 = unlimited",
        parse: |v| match v.parse::<f64>() {
            Ok(0.0) => Ok(None),
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Some(r)),
            _ => Err("must be a positive number of requests per second, or 0 for unlimited".to_owned()),
        }, show: zero_if_none },
    ApiTimeout api_timeout => api_timeout {
        flag: "api-timeout", env: "BATON_API_TIMEOUT", file: "apiTimeout", default: Some("15s"), secret: false,
        doc: "Timeout of one cloud API request (one attempt; idempotent calls are retried)",
        parse: positive_duration, show: duration },
    LoopStallLimit loop_stall_limit => loop_stall_limit {
        flag: "loop-stall-limit", env: "BATON_LOOP_STALL_LIMIT", file: "loopStallLimit", default: Some("0"), secret: false,
        doc: "/health fails, naming the loop, when a controller loop has spent longer than this in one unit of work (a cloud call with its retries, a reconcile); 0 = 6 × apiTimeout + 60s (150s at the default apiTimeout)",
        parse: |v| parse_duration(v)
            .map(|d| (!d.is_zero()).then_some(d))
            .map_err(|e| e.to_string()),
        show: duration_or_zero },
    FipReleaseGracePeriod fip_release_grace_period => fip_release_grace_period {
        flag: "fip-release-grace-period", env: "BATON_FIP_RELEASE_GRACE_PERIOD", file: "fipReleaseGracePeriod",
        default: Some("10m"), secret: false,
        doc: "How long a Service FIP is kept after its Service is gone, no longer a LoadBalancer or asks for another address, before it is released (a Service back within it keeps its address); 0 = at once; the Service annotation baton.dev/fip-release-grace-period overrides it",
        parse: |v| parse_duration(v).map_err(|e| e.to_string()), show: duration },
    Prefix prefix => prefix {
        flag: "prefix", env: "BATON_PREFIX", file: "prefix", default: Some("baton"), secret: false,
        doc: "Name prefix of the objects baton creates (e.g. kube-system/<prefix>-kubernetes-external)",
        parse: |v| {
            // <prefix>-kubernetes-external must be a valid Service name (63 chars).
            if is_dns1123_label(v) && v.len() <= 63 - "-kubernetes-external".len() {
                Ok(v.to_owned())
            } else {
                Err("must be a lowercase DNS label of at most 43 characters".to_owned())
            }
        }, show: text },
    HealthCheckPath health_check_path => health_check.path {
        flag: "health-check-path", env: "BATON_HEALTH_CHECK_PATH", file: "healthCheckPath", default: Some("/readyz"),
        secret: false, doc: "HTTP path probed on the API servers (/readyz, or /healthz as in the CCM)",
        parse: |v| if v.starts_with('/') && !v.contains(char::is_whitespace) {
            Ok(v.to_owned())
        } else {
            Err("must be an absolute path, e.g. /readyz".to_owned())
        }, show: text },
    HealthCheckInterval health_check_interval => health_check.interval {
        flag: "health-check-interval", env: "BATON_HEALTH_CHECK_INTERVAL", file: "healthCheckInterval",
        default: Some("200ms"), secret: false, doc: "Interval between two probes of one API server",
        parse: positive_duration, show: duration },
    HealthCheckTimeout health_check_timeout => health_check.timeout {
        flag: "health-check-timeout", env: "BATON_HEALTH_CHECK_TIMEOUT", file: "healthCheckTimeout",
        default: Some("300ms"), secret: false, doc: "Timeout of one probe (probes overlap: a slow probe does not delay the next)",
        parse: positive_duration, show: duration },
    HealthCheckRise health_check_rise => health_check.rise {
        flag: "health-check-rise", env: "BATON_HEALTH_CHECK_RISE", file: "healthCheckRise", default: Some("2"),
        secret: false, doc: "Consecutive successful probes before an API server counts as healthy",
        parse: count, show: text },
    HealthCheckFall health_check_fall => health_check.fall {
        flag: "health-check-fall", env: "BATON_HEALTH_CHECK_FALL", file: "healthCheckFall", default: Some("3"),
        secret: false, doc: "Consecutive failed probes before an API server counts as failed",
        parse: count, show: text },
    SniRouterPort sni_router_port => health_check.sni_router_port {
        flag: "sni-router-port", env: "BATON_SNI_ROUTER_PORT", file: "sniRouterPort", default: Some("0"),
        secret: false, doc: "Port of the SNI router (baton sni serve) on the control-plane nodes: a FIP holder whose router stops answering its probes loses the FIP, as one whose API server fails; 0 = routers not probed",
        parse: |v| v.parse::<u16>().map_err(|_| "must be a port number, 0-65535".to_owned()), show: text },
    LeaseDuration lease_duration => lease.duration {
        flag: "lease-duration", env: "BATON_LEASE_DURATION", file: "leaseDuration", default: Some("1700ms"),
        secret: false, doc: "How long the controller's leader Lease stays valid without renewal: a follower takes over this long after it last saw the Lease change",
        parse: positive_duration, show: duration },
    LeaseRenewDeadline lease_renew_deadline => lease.renew_deadline {
        flag: "lease-renew-deadline", env: "BATON_LEASE_RENEW_DEADLINE", file: "leaseRenewDeadline", default: Some("1300ms"),
        secret: false, doc: "The leader stops writing this long after the start of its last successful renew; must be below leaseDuration",
        parse: positive_duration, show: duration },
    LeaseRenewInterval lease_renew_interval => lease.renew_interval {
        flag: "lease-renew-interval", env: "BATON_LEASE_RENEW_INTERVAL", file: "leaseRenewInterval", default: Some("200ms"),
        secret: false, doc: "How often the leader renews its Lease; must be below leaseRenewDeadline",
        parse: positive_duration, show: duration },
}

/// One flag that a subcommand reads itself, outside the layered configuration (no file key):
/// listed by `baton config show` with its source, like the settings.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// The field name in [`FlagArgs`].
    pub name: &'static str,
    /// The long flag, without `--`.
    pub flag: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// The default.
    pub default: Option<&'static str>,
    /// The subcommands that take it.
    pub used_by: &'static [&'static str],
    /// One line of documentation.
    pub doc: &'static str,
}

macro_rules! flags {
    ($( $field:ident {
        flag: $flag:literal, env: $env:literal, default: $default:expr,
        used_by: [$($cmd:literal),+], doc: $doc:literal $(,)?
    } ),* $(,)?) => {
        /// The flags of [`FLAGS`], as `baton config show` takes them (the subcommands that use
        /// them define their own, with the same names, environment variables and defaults).
        #[derive(Debug, Clone, Default, Args)]
        pub struct FlagArgs {
            $(
                #[doc = concat!($doc, " [env: ", $env, "]")]
                #[arg(long = $flag, value_name = "VALUE")]
                pub $field: Option<String>,
            )*
        }

        /// Every flag read outside the layered configuration, in documentation order.
        pub const FLAGS: &[Flag] = &[$(
            Flag {
                name: stringify!($field),
                flag: $flag,
                env: $env,
                default: $default,
                used_by: &[$($cmd),+],
                doc: $doc,
            }
        ),*];

        impl FlagArgs {
            /// The value given on the command line for `flag` (a row of [`FLAGS`]).
            pub(super) fn get(&self, flag: &Flag) -> Option<&str> {
                match flag.name {
                    $( stringify!($field) => self.$field.as_deref(), )*
                    _ => None,
                }
            }
        }
    };
}

flags! {
    kubeconfig { flag: "kubeconfig", env: "KUBECONFIG", default: None, used_by: ["controller", "bootstrap", "status"],
        doc: "kubeconfig of the API server; `baton controller` uses the in-cluster configuration when unset" },
    identity { flag: "identity", env: "POD_NAME", default: None, used_by: ["controller"],
        doc: "This replica's identity in the leader Lease (the pod name); the host name when unset" },
    node_name { flag: "node-name", env: "NODE_NAME", default: None, used_by: ["controller"],
        doc: "The Node this replica runs on (the downward API's `spec.nodeName`): a leader on the control-plane FIP's holder hands the Lease to a replica on another node, and the FIP moves to a node without the leader; unset: neither" },
    admin_listen { flag: "admin-listen", env: "BATON_ADMIN_LISTEN", default: Some("127.0.0.1:9590"), used_by: ["controller"],
        doc: "Listen address of the plain-HTTP admin server (/metrics, /health, /ready, /leader), unauthenticated: keep it on loopback (the kubelet probes it there on a host-network pod); another address is an explicit opt-in to serve it to the network; `off` disables it" },
    metrics_listen { flag: "metrics-listen", env: "BATON_METRICS_LISTEN", default: Some("off"), used_by: ["controller"],
        doc: "Listen address of the authenticated metrics server: HTTPS, /metrics only, for bearer tokens that pass a TokenReview and a SubjectAccessReview (nonResourceURL /metrics, verb get); `off` disables it (the shipped manifests listen on 0.0.0.0:9592)" },
    metrics_tls_cert { flag: "metrics-tls-cert", env: "BATON_METRICS_TLS_CERT", default: None, used_by: ["controller"],
        doc: "Certificate chain (PEM) of the metrics server; with --metrics-tls-key. Unset: a self-signed certificate made at start" },
    metrics_tls_key { flag: "metrics-tls-key", env: "BATON_METRICS_TLS_KEY", default: None, used_by: ["controller"],
        doc: "Private key (PEM) of --metrics-tls-cert" },
    health_check_server_name { flag: "health-check-server-name", env: "BATON_HEALTH_CHECK_SERVER_NAME",
        default: Some("kubernetes.default.svc"), used_by: ["controller", "status"],
        doc: "TLS server name expected on the API servers' certificates when probing them by address" },
    cluster_ca { flag: "cluster-ca", env: "BATON_CLUSTER_CA", default: None, used_by: ["controller", "status"],
        doc: "Cluster CA (PEM) for the probes; by default the CA of the Kubernetes client configuration" },
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

/// The names of the node and Service annotations baton writes and reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Annotations {
    pub local_asn: String,
    pub peer_asn: String,
    pub peer_ip: String,
    pub src_ip: String,
    pub multi_hop: String,
    pub fip_region: String,
}

/// Health-check settings of the control-plane endpoint manager.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HealthCheck {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub use_host_ip: bool,
    /// The SNI router's port on the candidates (0: not probed).
    pub sni_router_port: u16,
}

/// MetalLB's `serviceAllocation` (of an `IPAddressPool`), for the addresses workload Services
/// ask for: the namespaces that may, by name or by a label selector. Both unset: every
/// namespace may, as a MetalLB pool without `serviceAllocation` serves every namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServiceAllocation {
    /// `serviceAllocationNamespaces`.
    pub namespaces: std::collections::BTreeSet<String>,
    /// `serviceAllocationNamespaceSelector`.
    #[serde(serialize_with = "display_opt")]
    pub namespace_selector: Option<LabelSelector>,
}

impl ServiceAllocation {
    /// Whether every namespace may ask (nothing configured).
    pub fn is_open(&self) -> bool {
        self.namespaces.is_empty() && self.namespace_selector.is_none()
    }

    /// Whether `namespace`, labelled `labels` (`None`: not known yet, so no selector matches),
    /// may ask for an address.
    pub fn allows(
        &self,
        namespace: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> bool {
        self.is_open()
            || self.namespaces.contains(namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| labels.is_some_and(|l| s.matches(l)))
    }

    /// Who may, in words: `namespaces apps,web or namespaces labelled team=web`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.namespaces.is_empty() {
            let names: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
            parts.push(format!("namespaces {}", names.join(",")));
        }
        if let Some(s) = &self.namespace_selector {
            parts.push(format!("namespaces labelled {s}"));
        }
        if parts.is_empty() {
            "every namespace".to_owned()
        } else {
            parts.join(" or ")
        }
    }
}

/// Leader-election timings of `baton controller` (docs/controller.md explains the safety rule
/// `renew_interval < renew_deadline < duration`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseTiming {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub renew_interval: Duration,
}

/// The effective configuration. Each field is filled by its row of the settings table.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The cloud baton drives.
    pub cloud: CloudKind,
    /// Hetzner Cloud's API token.
    pub hcloud_token: Option<Secret>,
    /// Hetzner Cloud's API endpoint.
    pub hcloud_endpoint: Url,
    pub api_key: Option<Secret>,
    pub project_id: Option<u64>,
    pub region: Option<String>,
    pub base_url: Url,
    #[serde(serialize_with = "display_opt")]
    pub load_balancer: Option<LoadBalancerMode>,
    pub annotations: Annotations,
    #[serde(serialize_with = "display_opt")]
    pub fip_tag: Option<FipTag>,
    /// Whether the node controller runs; `None`: by the cloud (see [`Config::initializes_nodes`]).
    pub initialize_nodes: Option<bool>,
    pub api_server_port: u16,
    /// Namespaces allowed to hold control-plane endpoint Services (besides the bootstrap's).
    pub control_plane_namespaces: std::collections::BTreeSet<String>,
    /// FIPs adopted by the operator: this cluster's although untagged.
    pub adopt_fips: std::collections::BTreeSet<std::net::IpAddr>,
    /// The namespaces whose Services may ask for an address (`serviceAllocation*`).
    pub service_allocation: ServiceAllocation,
    #[serde(serialize_with = "display_opt")]
    pub bgp_node_selector: Option<LabelSelector>,
    /// Most Service prefixes announced per BGP session; `None` = no limit.
    pub bgp_prefix_limit: Option<u32>,
    /// Requests per second; `None` = unlimited.
    pub api_rate_limit: Option<f64>,
    pub api_timeout: Duration,
    /// `/health`'s limit on one unit of work of a controller loop; `None` = derived from
    /// `api_timeout` ([`Config::loop_stall_limit`]).
    pub loop_stall_limit: Option<Duration>,
    /// How long a Service FIP no longer wanted is kept before it is released.
    pub fip_release_grace_period: Duration,
    pub prefix: String,
    pub health_check: HealthCheck,
    pub lease: LeaseTiming,
    /// The source of every setting.
    #[serde(skip)]
    pub sources: std::collections::BTreeMap<Id, Source>,
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
    /// Every field at its zero value, before the table fills it in (every setting with a
    /// default always gets a value; the rest are `Option`s).
    pub(super) fn empty() -> Self {
        Self {
            cloud: CloudKind::Cherry,
            hcloud_token: None,
            hcloud_endpoint: Url::parse(baton_cloud::hetzner::DEFAULT_BASE_URL)
                .expect("the default Hetzner endpoint parses"),
            api_key: None,
            project_id: None,
            region: None,
            base_url: Url::parse(DEFAULT_BASE_URL).expect("the default base URL parses"),
            load_balancer: None,
            annotations: Annotations::default(),
            fip_tag: None,
            initialize_nodes: None,
            api_server_port: 0,
            control_plane_namespaces: std::collections::BTreeSet::new(),
            adopt_fips: std::collections::BTreeSet::new(),
            service_allocation: ServiceAllocation::default(),
            bgp_node_selector: None,
            bgp_prefix_limit: None,
            api_rate_limit: None,
            api_timeout: Duration::ZERO,
            loop_stall_limit: None,
            fip_release_grace_period: Duration::ZERO,
            prefix: String::new(),
            health_check: HealthCheck::default(),
            lease: LeaseTiming::default(),
            sources: std::collections::BTreeMap::new(),
            unknown_file_keys: Vec::new(),
        }
    }
}

/// `f(value)`: names the field's type for a row's parser (a closure's types are inferred
/// from it).
fn parse_with<T>(value: &str, f: impl FnOnce(&str) -> Result<T, String>) -> Result<T, String> {
    f(value)
}

// Value parsers shared by several rows.

/// An http(s) URL with a host (an API's base URL).
fn parse_base_url(v: &str) -> Result<Url, String> {
    let url = Url::parse(v).map_err(|e| e.to_string())?;
    match url.scheme() {
        "https" | "http" if url.has_host() => Ok(url),
        _ => Err("must be an http(s) URL with a host".to_owned()),
    }
}

/// Parses a boolean the way Go's `strconv.ParseBool` does (the CCM uses it).
fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err("must be true or false".to_owned()),
    }
}

fn positive_duration(v: &str) -> Result<Duration, String> {
    match parse_duration(v) {
        Ok(d) if d.is_zero() => Err("must be greater than zero".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

fn count(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if (1..=100).contains(&n) => Ok(n),
        _ => Err("must be a whole number from 1 to 100".to_owned()),
    }
}

/// A comma-separated list of items (blanks around commas ignored, empty items dropped): the
/// list settings' syntax, which the bootstrap's record shares.
pub fn items(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn parse_namespaces(v: &str) -> Result<std::collections::BTreeSet<String>, String> {
    items(v)
        .map(|ns| {
            if is_dns1123_label(ns) {
                Ok(ns.to_owned())
            } else {
                Err(format!("{ns:?} is not a namespace name (a lowercase DNS label)"))
            }
        })
        .collect()
}

fn parse_addresses(v: &str) -> Result<std::collections::BTreeSet<std::net::IpAddr>, String> {
    items(v)
        .map(|a| {
            a.parse::<std::net::IpAddr>()
                .map_err(|_| format!("{a:?} is not an IP address"))
        })
        .collect()
}

fn peer_annotation(v: &str) -> Result<String, String> {
    if !v.contains("{{n}}") {
        return Err("must contain {{n}} (the peer index)".to_owned());
    }
    if !is_qualified_key(&v.replace("{{n}}", "0")) {
        return Err("not a valid annotation key".to_owned());
    }
    Ok(v.to_owned())
}

/// Value displays, one per kind of field. Each is `fn(&Field) -> Option<String>`, whatever the
/// field, so every row of the table can name any of them.
#[allow(
    clippy::unnecessary_wraps,
    clippy::ref_option,
    clippy::trivially_copy_pass_by_ref
)]
mod display {
    use std::fmt;
    use std::time::Duration;

    use baton_core::duration::format_duration;

    pub(super) fn text<T: fmt::Display>(v: &T) -> Option<String> {
        Some(v.to_string())
    }

    pub(super) fn optional<T: fmt::Display>(v: &Option<T>) -> Option<String> {
        v.as_ref().map(ToString::to_string)
    }

    pub(super) fn auto_or_bool(v: &Option<bool>) -> Option<String> {
        Some(v.map_or_else(|| "auto".to_owned(), |b| b.to_string()))
    }

    pub(super) fn zero_if_none<T: fmt::Display>(v: &Option<T>) -> Option<String> {
        Some(v.as_ref().map_or_else(|| "0".to_owned(), ToString::to_string))
    }

    pub(super) fn redacted<T>(v: &Option<T>) -> Option<String> {
        v.as_ref().map(|_| "<redacted>".to_owned())
    }

    pub(super) fn duration_or_zero(v: &Option<Duration>) -> Option<String> {
        Some(v.map_or_else(|| "0".to_owned(), format_duration))
    }

    /// A list setting, comma-separated; an empty one is unset.
    pub(super) fn list<T: fmt::Display>(v: &std::collections::BTreeSet<T>) -> Option<String> {
        (!v.is_empty()).then(|| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
    }

    pub(super) fn duration(v: &Duration) -> Option<String> {
        Some(format_duration(*v))
    }
}
