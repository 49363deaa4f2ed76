//! `baton status`: the one screen an operator reads during an incident.
//!
//! ```text
//!  Kubernetes (kubeconfig)          the cloud (layered config,        admin endpoints
//!   Lease <prefix>-controller        the same CherryClient)            (--admin URL…)
//!   Services, Events, Nodes          FIPs: targeted_to, servers         /leader, /health
//!   default/kubernetes slices               │                                 │
//!          │   /readyz of every candidate and through each FIP (crate::probe) │
//!          └──────────────┬─────────────────┴─────────────────────────────────┘
//!                         ▼
//!        report::Report (plain data) ── assess(): problems, verdict, exit code
//!                         ▼
//!              text (one screen) | --output json
//! ```
//!
//! Exit codes (docs/operations.md): 0 healthy, 10 degraded, 11 down; 2 bad arguments or
//! configuration, as everywhere. Every read is time-limited; a source that cannot be read is a
//! problem in the report, not a failure of the command. The API key is never printed.

pub mod report;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use baton_cloud::Cloud as _;
use baton_cloud::model::{IpAddress, IpType, Server};
use baton_core::health::Thresholds;
use clap::{Args, ValueEnum};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};

use crate::config::{Config, ConfigArgs, ProcessEnv};
use crate::controller::mirror::service_name;
use crate::controller::node::UNINITIALIZED_TAINT;
use crate::controller::service::admission::{Handoff, Judge};
use crate::controller::service::{
    Scope, ServiceFacts, control_plane_addresses, facts_of, ip_annotation, is_pending, scope_excluding,
};
use crate::controller::trust::address::AddressPolicy;
use crate::controller::trust::{EndpointPolicy, Refusal};
use crate::kube::args::ClusterArgs;
use crate::names::{CONTROL_PLANE_ENDPOINT_ANNOTATION, SERVICE_NAME_LABEL};
use crate::probe::{ProbeSettings, probe_once};

use self::report::{
    BgpStatus, CandidateStatus, ControllerStatus, EndpointStatus, LeaderStatus, MoveStatus, PendingService,
    RefusedAddress, Report, ServerRef, SourceStatus, Verdict,
};

/// Time limit of each read (Kubernetes, cloud, admin endpoints).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Flags of `baton status` (plus every configuration setting, as `baton controller` takes them).
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub config: ConfigArgs,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Admin endpoints of controller replicas to ask (`http://IP:9590`, comma-separated).
    #[arg(long, env = "BATON_STATUS_ADMIN", value_delimiter = ',', value_name = "URL")]
    pub admin: Vec<url::Url>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = StatusOutput::Text)]
    pub output: StatusOutput,
}

/// Output formats of `baton status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// One screen of text.
    Text,
    /// The report as one JSON document.
    Json,
}

/// Why `baton status` cannot run at all (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    #[error("reading --cluster-ca {path}: {reason}")]
    ClusterCa { path: PathBuf, reason: String },
}

/// Runs `baton status`: prints the report and returns its exit code.
pub async fn run(args: StatusArgs) -> Result<u8, StatusError> {
    let output = args.output;
    let report = collect(&args).await?;
    match output {
        StatusOutput::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".to_owned())
        ),
        StatusOutput::Text => print!("{}", report::render_text(&report)),
    }
    Ok(report.exit_code)
}

/// Reads every source and builds the assessed report.
pub async fn collect(args: &StatusArgs) -> Result<Report, StatusError> {
    let config = Config::resolve(&args.config, &ProcessEnv)?;
    let kube_config = crate::kube::config::load(args.cluster.kubeconfig.as_deref())
        .await
        .map_err(|e| StatusError::KubeConfig(e.with_path()))?;
    let ca_der = match &args.cluster.cluster_ca {
        Some(path) => crate::kube::tls::read_ca(path).map_err(|e| StatusError::ClusterCa {
            path: path.clone(),
            reason: e.to_string(),
        })?,
        None => kube_config.root_cert.clone().unwrap_or_default(),
    };
    let reach = crate::kube::client::ApiReachability::new();
    let client = crate::kube::client::client(&kube_config, &args.cluster.api_servers, &reach)
        .map_err(|e| StatusError::KubeConfig(e.to_string()))?;
    let probe = ProbeSettings {
        path: config.health_check.path.clone(),
        server_name: args.cluster.health_check_server_name.clone(),
        ca_der,
        interval: Duration::from_secs(1),
        timeout: config.health_check.timeout.max(Duration::from_secs(1)),
        thresholds: Thresholds { rise: 1, fall: 1 },
    };

    let mut report = Report::default();
    let (cloud_ips, servers) = read_cloud(&config, &mut report).await;
    let kube = read_kube(&client, &config, &args.cluster.lease_namespace).await;
    match kube {
        Ok(k) => {
            report.kubernetes.reachable = true;
            report.leader = k.leader.clone();
            if let Some(too_old) = &k.too_old {
                report.problem(Verdict::Down, too_old.to_string());
            }
            report.endpoints = endpoints(&k, &config, &cloud_ips, &servers, &probe).await;
            for (service, refusal) in refused_endpoints(&k, &config, &cloud_ips) {
                report.problem(
                    Verdict::Degraded,
                    format!("control-plane endpoint Service {service} is refused: {refusal}"),
                );
            }
            report.refused_addresses = refused_addresses(&k, &config, &cloud_ips);
            report.pending_services = pending_services(&k, &config, &cloud_ips, &report.refused_addresses);
            report.bgp = bgp(&k, &config);
            // On Hetzner Cloud the Nodes are hcloud-cloud-controller-manager's to initialise.
            if config.cloud == baton_cloud::CloudKind::Cherry {
                report.uninitialized_nodes = uninitialized(&k.nodes);
            }
            report.cold_start = cold_start(&k.nodes, &k.pods);
        }
        Err(error) => report.kubernetes.error = Some(error),
    }
    report.controllers = controllers(&args.admin).await;
    report.assess();
    Ok(report)
}

/// The role of a pod in the controller's namespace, read from its first container's arguments
/// (so whatever the names and labels an install gave them): `baton agent`, `baton controller
/// --standby`, or `baton controller`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Agent,
    Standby,
    Replica,
}

fn role(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Role> {
    let c = pod.spec.as_ref()?.containers.first()?;
    let args: Vec<&str> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .filter(|a| !a.starts_with('/'))
        .collect();
    match args.first().copied()? {
        "agent" => Some(Role::Agent),
        "controller" if args.contains(&"--standby") => Some(Role::Standby),
        "controller" => Some(Role::Replica),
        _ => None,
    }
}

fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `node` is a control-plane node (`node-role.kubernetes.io/control-plane` or
/// `…/master`, whatever the value: kubeadm sets "", k3s and RKE2 "true").
fn is_control_plane(node: &Node) -> bool {
    node.metadata.labels.as_ref().is_some_and(|l| {
        l.contains_key("node-role.kubernetes.io/control-plane")
            || l.contains_key("node-role.kubernetes.io/master")
    })
}

/// The cold-start section: `None` when no agent runs as a pod here (baton is not installed
/// in-cluster, or not in this namespace).
fn cold_start(nodes: &[Node], pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<report::ColdStartStatus> {
    let ours: Vec<(Role, &k8s_openapi::api::core::v1::Pod)> =
        pods.iter().filter_map(|p| Some((role(p)?, p))).collect();
    let agents: Vec<&k8s_openapi::api::core::v1::Pod> = ours
        .iter()
        .filter(|(r, _)| *r == Role::Agent)
        .map(|(_, p)| *p)
        .collect();
    if agents.is_empty() {
        return None;
    }
    let node_file_dir = agents.iter().find_map(|p| {
        p.spec
            .as_ref()?
            .containers
            .first()?
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "BATON_AGENT_STATE_DIR")?
            .value
            .clone()
            .filter(|v| !v.is_empty())
    });
    let on = |node: &str, role: Role| -> Vec<&k8s_openapi::api::core::v1::Pod> {
        ours.iter()
            .filter(|(r, p)| *r == role && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|(_, p)| *p)
            .collect()
    };
    let nodes = nodes
        .iter()
        .filter(|n| is_control_plane(n))
        .map(|n| {
            let name = n.name_any();
            report::ColdStartNode {
                ready: n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
                agent: on(&name, Role::Agent).into_iter().any(pod_ready),
                standby: on(&name, Role::Standby).into_iter().any(pod_ready),
                replicas: on(&name, Role::Replica)
                    .into_iter()
                    .map(kube::ResourceExt::name_any)
                    .collect(),
                name,
            }
        })
        .collect();
    Some(report::ColdStartStatus { node_file_dir, nodes })
}

/// The project's IPs and servers; records on the report whether the cloud could be read.
async fn read_cloud(config: &Config, report: &mut Report) -> (Vec<IpAddress>, Vec<Server>) {
    let Ok(cloud_config) = config.cloud_client_config() else {
        report.cloud = SourceStatus {
            skipped: true,
            error: Some(match config.cloud {
                baton_cloud::CloudKind::Cherry => "no apiKey / projectID configured".to_owned(),
                baton_cloud::CloudKind::Hetzner => "no HCLOUD_TOKEN configured".to_owned(),
            }),
            ..SourceStatus::default()
        };
        return (Vec::new(), Vec::new());
    };
    let read = async {
        let cloud = baton_cloud::CherryClient::new(cloud_config)?;
        let ips = baton_cloud::model::each_ip(&cloud.ips().await?)
            .cloned()
            .collect();
        let servers = cloud.servers().await?;
        Ok::<_, baton_cloud::CloudError>((ips, servers))
    };
    match tokio::time::timeout(READ_TIMEOUT * 3, read).await {
        Ok(Ok(found)) => {
            report.cloud.reachable = true;
            found
        }
        Ok(Err(e)) => {
            report.cloud.error = Some(e.to_string());
            (Vec::new(), Vec::new())
        }
        Err(_) => {
            report.cloud.error = Some(format!("no answer within {}s", (READ_TIMEOUT * 3).as_secs()));
            (Vec::new(), Vec::new())
        }
    }
}

/// What `baton status` reads from Kubernetes.
struct KubeFacts {
    leader: Option<LeaderStatus>,
    services: Vec<Service>,
    nodes: Vec<Node>,
    /// `default/kubernetes` API server addresses (`IP:port`).
    api_servers: Vec<SocketAddr>,
    /// Warning Events and `FloatingIPMoved` Events of Services, newest last.
    events: Vec<Event>,
    /// Which control-plane endpoint Services the controller acts on.
    policy: EndpointPolicy,
    /// The UID of namespace `kube-system` (the `cluster` tag).
    cluster_id: String,
    /// Every namespace's labels (only with `serviceAllocationNamespaceSelector`).
    namespaces: Option<std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>>,
    /// The server is below the version floor.
    too_old: Option<crate::kube::version::TooOld>,
    /// The pods in the controller's namespace (the agents, replicas and standby replicas).
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(READ_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {}s", READ_TIMEOUT.as_secs())),
    }
}

async fn read_kube(client: &kube::Client, config: &Config, lease_ns: &str) -> Result<KubeFacts, String> {
    let services = timed(
        "listing Services",
        Api::<Service>::all(client.clone()).list(&ListParams::default()),
    )
    .await?
    .items;
    let nodes = timed(
        "listing Nodes",
        Api::<Node>::all(client.clone()).list(&ListParams::default()),
    )
    .await?
    .items;
    let lease_name = format!("{}-controller", config.prefix);
    let lease = timed(
        "reading the Lease",
        Api::<Lease>::namespaced(client.clone(), lease_ns).get_opt(&lease_name),
    )
    .await?;
    let slices = timed(
        "listing default/kubernetes EndpointSlices",
        Api::<EndpointSlice>::namespaced(client.clone(), "default")
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}=kubernetes"))),
    )
    .await?
    .items;
    let mut events = timed(
        "listing Service Events",
        Api::<Event>::all(client.clone()).list(&ListParams::default().fields("involvedObject.kind=Service")),
    )
    .await?
    .items;
    events
        .retain(|e| e.type_.as_deref() == Some("Warning") || e.reason.as_deref() == Some("FloatingIPMoved"));
    events.sort_by_key(event_time);
    // Which endpoint Services the controller acts on: the same policy, from the same sources.
    let cluster_id = timed(
        "reading namespace kube-system",
        Api::<Namespace>::all(client.clone()).get_opt("kube-system"),
    )
    .await?
    .and_then(|ns| ns.metadata.uid)
    .unwrap_or_default();
    let record = timed(
        "reading the bootstrap's record",
        Api::<ConfigMap>::namespaced(client.clone(), "kube-system").get_opt(crate::names::BOOTSTRAP_RECORD),
    )
    .await?
    .and_then(|cm| cm.data)
    .unwrap_or_default();
    let namespaces = if config.service_allocation.namespace_selector.is_some() {
        let list = timed(
            "listing Namespaces",
            Api::<Namespace>::all(client.clone()).list(&ListParams::default()),
        )
        .await?;
        Some(
            list.items
                .iter()
                .map(|ns| (ns.name_any(), ns.labels().clone()))
                .collect(),
        )
    } else {
        None
    };
    let version = timed("reading the Kubernetes version", client.apiserver_version())
        .await
        .ok()
        .and_then(|v| crate::kube::version::check(&v.major, &v.minor, &v.git_version).err());
    // The baton pods, for the cold-start section; not readable (RBAC) is no pods.
    let pods = timed(
        "listing the pods of the controller's namespace",
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), lease_ns)
            .list(&ListParams::default()),
    )
    .await
    .map(|l| l.items)
    .unwrap_or_default();
    Ok(KubeFacts {
        pods,
        policy: EndpointPolicy::new(config, &cluster_id, &record),
        cluster_id,
        namespaces,
        too_old: version,
        leader: Some(leader_status(
            lease_ns,
            &lease_name,
            lease.as_ref(),
            k8s_openapi::jiff::Timestamp::now().as_second(),
        )),
        services,
        nodes,
        api_servers: api_servers(&slices),
        events,
    })
}

/// The Lease `ns/name` as `baton status` shows it at `now` (Unix seconds).
fn leader_status(ns: &str, name: &str, lease: Option<&Lease>, now: i64) -> LeaderStatus {
    let spec = lease.and_then(|l| l.spec.as_ref());
    let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
    let duration = spec.and_then(|s| s.lease_duration_seconds);
    let age = renewed.map(|t| now - t.as_second());
    let holder = spec
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty());
    let valid = lease.is_some()
        && holder.is_some()
        && matches!((age, duration), (Some(a), Some(d)) if a <= i64::from(d));
    // Since the holder's record expired (renewTime + duration), or since the Lease was released
    // (its last write cleared the holder).
    let leaderless = match (valid, holder.is_some(), age, duration) {
        (true, ..) => Some(0),
        (false, true, Some(a), Some(d)) => Some((a - i64::from(d)).max(0)),
        (false, false, Some(a), _) => Some(a.max(0)),
        _ => None,
    };
    LeaderStatus {
        lease: format!("{ns}/{name}"),
        valid,
        leaderless_seconds: leaderless,
        holder,
        renewed: renewed.map(|t| t.to_string()),
        age_seconds: age,
        duration_seconds: duration,
    }
}

fn api_servers(slices: &[EndpointSlice]) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in slices {
        let port = slice
            .ports
            .as_ref()
            .and_then(|p| p.iter().find_map(|p| p.port))
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(6443);
        for ep in &slice.endpoints {
            for addr in &ep.addresses {
                if let Ok(ip) = addr.parse::<IpAddr>() {
                    out.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// When an Event last happened (the newest of its times; events.k8s.io Events carry
/// `eventTime`, core ones `lastTimestamp`), to the microsecond.
fn event_time(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    [
        e.last_timestamp.as_ref().map(|t| t.0),
        e.event_time.as_ref().map(|t| t.0),
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0),
        e.first_timestamp.as_ref().map(|t| t.0),
        e.metadata.creation_timestamp.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
}

fn event_time_text(e: &Event) -> Option<String> {
    event_time(e).map(|t| t.to_string())
}

fn events_of<'a>(k: &'a KubeFacts, ns: &str, name: &str) -> impl Iterator<Item = &'a Event> {
    let (ns, name) = (ns.to_owned(), name.to_owned());
    k.events.iter().filter(move |e| {
        e.involved_object.name.as_deref() == Some(name.as_str())
            && e.involved_object.namespace.as_deref() == Some(ns.as_str())
    })
}

/// The policy's answer for an annotated Service with a `loadBalancerIP` (`None`: it names no
/// address, so the controller has nothing to refuse or admit).
fn admitted<'a>(
    k: &KubeFacts,
    ips: &'a [IpAddress],
    svc: &Service,
) -> Option<Result<&'a IpAddress, Refusal>> {
    let ip = svc
        .spec
        .as_ref()?
        .load_balancer_ip
        .as_deref()?
        .trim()
        .parse()
        .ok()?;
    Some(
        k.policy
            .admit(&svc.namespace().unwrap_or_default(), ip, ips.iter()),
    )
}

/// The annotated endpoint Services in allowed namespaces that the controller refuses (another
/// cluster's FIP, an untagged one, no FIP at all), with why. Those of other namespaces are a
/// tenant's business, not an incident: not listed.
fn refused_endpoints(k: &KubeFacts, config: &Config, ips: &[IpAddress]) -> Vec<(String, Refusal)> {
    let mirror = service_name(&config.prefix);
    k.services
        .iter()
        .filter(|s| {
            is_endpoint(s, &mirror)
                && !(s.namespace().as_deref() == Some("kube-system") && s.name_any() == mirror)
        })
        .filter(|s| k.policy.allows_namespace(&s.namespace().unwrap_or_default()))
        .filter_map(|s| match admitted(k, ips, s)? {
            Ok(_) => None,
            Err(r) => Some((
                format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()),
                r,
            )),
        })
        .collect()
}

fn is_endpoint(svc: &Service, mirror: &str) -> bool {
    svc.annotations()
        .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || (svc.namespace().as_deref() == Some("kube-system") && svc.name_any() == mirror)
}

fn server_ref(s: &Server) -> ServerRef {
    ServerRef {
        id: s.id.0,
        hostname: s.hostname.clone(),
    }
}

async fn endpoints(
    k: &KubeFacts,
    config: &Config,
    ips: &[IpAddress],
    servers: &[Server],
    probe: &ProbeSettings,
) -> Vec<EndpointStatus> {
    let mirror = service_name(&config.prefix);
    let fips: Vec<&IpAddress> = ips.iter().filter(|ip| ip.ip_type == IpType::FloatingIp).collect();
    let mut out: Vec<EndpointStatus> = Vec::new();
    for svc in k.services.iter().filter(|s| is_endpoint(s, &mirror)) {
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        // A Service the controller refuses is no endpoint ([`refused_endpoints`] names it).
        if !(ns == "kube-system" && name == mirror) && admitted(k, ips, svc).is_some_and(|r| r.is_err()) {
            continue;
        }
        let spec = svc.spec.as_ref();
        let address = spec
            .and_then(|s| s.load_balancer_ip.clone())
            .or_else(|| facts_of(svc).ingress_ips.first().cloned());
        let port = spec
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .and_then(|p| u16::try_from(p.port).ok())
            .unwrap_or(6443);
        let fip = address
            .as_deref()
            .and_then(|a| a.parse::<IpAddr>().ok())
            .and_then(|a| fips.iter().find(|ip| ip.address == a).copied());
        let last_move = events_of(k, &ns, &name)
            .filter(|e| e.reason.as_deref() == Some("FloatingIPMoved"))
            .last()
            .map(|e| MoveStatus {
                time: event_time_text(e),
                message: e.message.clone().unwrap_or_default(),
                count: e.series.as_ref().and_then(|s| s.count).or(e.count),
            });
        out.push(
            endpoint(
                Some(format!("{ns}/{name}")),
                address,
                port,
                fip,
                last_move,
                &k.api_servers,
                servers,
                probe,
            )
            .await,
        );
    }
    // A tagged control-plane FIP whose mirror Service does not exist (yet).
    if let Some(tag) = &config.fip_tag
        && !k
            .services
            .iter()
            .any(|s| s.namespace().as_deref() == Some("kube-system") && s.name_any() == mirror)
        && let Some(fip) = fips
            .iter()
            .find(|ip| tag.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
    {
        let port = if config.api_server_port == 0 {
            6443
        } else {
            config.api_server_port
        };
        out.push(
            endpoint(
                None,
                Some(fip.address.to_string()),
                port,
                Some(fip),
                None,
                &k.api_servers,
                servers,
                probe,
            )
            .await,
        );
    }
    out
}

#[allow(clippy::too_many_arguments)] // one endpoint's facts, gathered by the caller
async fn endpoint(
    service: Option<String>,
    address: Option<String>,
    port: u16,
    fip: Option<&IpAddress>,
    last_move: Option<MoveStatus>,
    api_servers: &[SocketAddr],
    servers: &[Server],
    probe: &ProbeSettings,
) -> EndpointStatus {
    let holder_id = fip.and_then(IpAddress::target);
    let holder = holder_id.map(|id| {
        servers.iter().find(|s| s.id == id).map_or_else(
            || ServerRef {
                id: id.0,
                hostname: fip
                    .and_then(|f| f.targeted_to.as_ref())
                    .map(|t| t.hostname.clone())
                    .unwrap_or_default(),
            },
            server_ref,
        )
    });
    let checks = api_servers.iter().map(|addr| async move {
        let result = probe_once(probe, *addr).await;
        (*addr, result)
    });
    let results = futures::future::join_all(checks).await;
    let candidates = results
        .into_iter()
        .map(|(addr, result)| {
            let server = servers.iter().find(|s| {
                s.first_ipv4(&IpType::PrimaryIp) == Some(addr.ip())
                    || s.first_ipv4(&IpType::PrivateIp) == Some(addr.ip())
            });
            CandidateStatus {
                address: addr.to_string(),
                holder: server.is_some_and(|s| Some(s.id) == holder_id),
                server: server.map(server_ref),
                ready: result.is_ok(),
                error: result.err(),
            }
        })
        .collect();
    let through = match address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()) {
        Some(ip) if holder_id.is_some() => Some(probe_once(probe, SocketAddr::new(ip, port)).await),
        _ => None,
    };
    EndpointStatus {
        service,
        fip: address,
        fip_id: fip.map(|f| f.id.0.clone()),
        holder,
        fip_ready: through.as_ref().map(Result::is_ok),
        fip_error: through.and_then(Result::err),
        candidates,
        last_move,
    }
}

/// The managed Services asking for an address the rules refuse ([`Judge`], the controller's own
/// judgement), on the cloud's list as read: what the controller refuses (or will, for an
/// address it let a Service use before this version: the check to run before an upgrade).
/// Nothing when the cloud could not be read (no FIP could be judged).
fn refused_addresses(k: &KubeFacts, config: &Config, ips: &[IpAddress]) -> Vec<RefusedAddress> {
    let Some(mode) = config.load_balancer.as_ref() else {
        return Vec::new();
    };
    if ips.is_empty() {
        return Vec::new();
    }
    let mirror = service_name(&config.prefix);
    let all: Vec<ServiceFacts> = k.services.iter().map(facts_of).collect();
    let control_plane = control_plane_addresses(config.fip_tag.as_ref(), ips, &all, ("kube-system", &mirror));
    let policy = AddressPolicy::new(config, &k.cluster_id);
    let judge = Judge::new(&policy, ips, k.namespaces.as_ref(), &all);
    let mut facts: Vec<&ServiceFacts> = all
        .iter()
        .filter(|f| {
            !f.deleting
                && scope_excluding(
                    f,
                    ("kube-system", &mirror),
                    &control_plane,
                    Some(ip_annotation(mode)),
                ) == Scope::Managed
        })
        .collect();
    facts.sort_by_key(|f| f.key());
    facts
        .into_iter()
        .filter_map(|f| match judge.handoff(f, mode) {
            Handoff::Refused { refusal, keeps } => Some(RefusedAddress {
                service: f.key(),
                address: refusal.address().to_string(),
                reason: refusal.reason().to_owned(),
                message: refusal.to_string(),
                keeps: keeps.map(|k| k.to_string()),
                shown: f.ingress_ips.iter().any(|i| i.parse() == Ok(refusal.address())),
                untagged: refusal.untagged(),
            }),
            _ => None,
        })
        .collect()
}

fn pending_services(
    k: &KubeFacts,
    config: &Config,
    ips: &[IpAddress],
    refused: &[RefusedAddress],
) -> Vec<PendingService> {
    let mirror = service_name(&config.prefix);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    // A Service asking for a control-plane FIP is never given an ingress by baton: not pending.
    let all: Vec<_> = k.services.iter().map(facts_of).collect();
    let control_plane = control_plane_addresses(config.fip_tag.as_ref(), ips, &all, ("kube-system", &mirror));
    let extra = config.load_balancer.as_ref().map(ip_annotation);
    let mut out = Vec::new();
    for svc in &k.services {
        let facts = facts_of(svc);
        if !is_pending(&facts, ("kube-system", &mirror), &control_plane, extra) {
            continue;
        }
        // Refused, not waiting: listed with why ([`refused_addresses`]).
        if refused.iter().any(|r| r.service == facts.key()) {
            continue;
        }
        let warning = events_of(k, &facts.namespace, &facts.name)
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .last()
            .map(|e| {
                format!(
                    "{}: {}",
                    e.reason.as_deref().unwrap_or("Warning"),
                    e.message.as_deref().unwrap_or_default()
                )
            });
        let reason = warning.unwrap_or_else(|| {
            if config.load_balancer.is_none() {
                "Service FIPs are off (loadbalancer is not configured)".to_owned()
            } else {
                "waiting for a FIP (no Event yet)".to_owned()
            }
        });
        out.push(PendingService {
            service: facts.key(),
            age_seconds: (facts.created > 0).then(|| now - facts.created),
            reason,
        });
    }
    out
}

fn bgp(k: &KubeFacts, config: &Config) -> BgpStatus {
    let mut status = BgpStatus {
        load_balancer: config.load_balancer.as_ref().map(ToString::to_string),
        node_selector: config.bgp_node_selector.as_ref().map(ToString::to_string),
        ..BgpStatus::default()
    };
    if config.load_balancer.is_none() {
        return status;
    }
    let annotation = config.annotations.local_asn.replace("{{n}}", "0");
    for node in &k.nodes {
        let selected = config
            .bgp_node_selector
            .as_ref()
            .is_none_or(|sel| sel.matches(node.labels()));
        let has_provider = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_ref())
            .is_some_and(|p| !p.is_empty());
        if !(selected && has_provider) {
            continue;
        }
        status.nodes_selected += 1;
        if node.annotations().contains_key(&annotation) {
            status.nodes_annotated += 1;
        } else {
            status.nodes_missing.push(node.name_any());
        }
    }
    status
}

fn uninitialized(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED_TAINT))
        })
        .map(kube::ResourceExt::name_any)
        .collect()
}

async fn controllers(urls: &[url::Url]) -> Vec<ControllerStatus> {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .no_proxy()
        .build()
    else {
        return Vec::new();
    };
    let ask = |url: &url::Url, path: &str| {
        let http = http.clone();
        let target = url.join(path);
        async move {
            let target = target.map_err(|e| e.to_string())?;
            let resp = http.get(target).send().await.map_err(|e| e.to_string())?;
            let ok = resp.status().is_success();
            let text = resp.text().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((ok, text.trim().to_owned()))
        }
    };
    let mut out = Vec::new();
    for url in urls {
        let mut status = ControllerStatus {
            url: url.to_string(),
            ..ControllerStatus::default()
        };
        match ask(url, "/leader").await {
            Ok((true, role)) => status.role = Some(role),
            Ok((false, text)) | Err(text) => status.error = Some(format!("/leader: {text}")),
        }
        match ask(url, "/health").await {
            Ok((true, _)) => status.healthy = Some(true),
            Ok((false, text)) => {
                status.healthy = Some(false);
                // What failed; the lines after it are every loop's heartbeat age.
                status.error = Some(text.lines().next().unwrap_or_default().to_owned());
            }
            Err(e) => status.error = Some(format!("/health: {e}")),
        }
        out.push(status);
    }
    out
}

#[cfg(test)]
mod tests;
