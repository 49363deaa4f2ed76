//! `baton controller`: wiring of the in-cluster controller.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::{CherryClient, Cloud, Priority};
use baton_core::health::Thresholds;
use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::endpoint::{self, EndpointOptions};
use super::health::{Heartbeats, Leaderless, READY_WINDOW, Supervisor};
use super::lease::{self, LeaseConfig};
use super::metrics::Metrics;
use super::watches::Watches;
use super::{Context, LeaderGate};
use crate::config::{Config, ConfigArgs, ProcessEnv};
use crate::kube::args::ClusterArgs;
use crate::kube::client::ApiReachability;
use crate::probe::ProbeSettings;

/// Flags of `baton controller` (plus every configuration setting).
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub config: ConfigArgs,

    #[command(flatten)]
    pub cluster: ClusterArgs,

    #[command(flatten)]
    pub standby: super::standby::StandbyArgs,

    /// This replica's identity in the leader Lease (the pod name).
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub identity: Option<String>,

    /// The Node this replica runs on (the downward API's `spec.nodeName`): a leader on the
    /// control-plane FIP's holder hands the Lease to a replica on another node.
    #[arg(long, env = "NODE_NAME", value_name = "NODE")]
    pub node_name: Option<String>,

    /// Run without leader election (exactly one replica).
    #[arg(long, env = "BATON_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,

    /// Listen address of the plain-HTTP admin server (/metrics, /health, /ready, /leader),
    /// unauthenticated: keep it on loopback (the kubelet probes it there on a host-network pod);
    /// another address is an explicit opt-in to serve it to the network; `off` disables it.
    #[arg(long, env = "BATON_ADMIN_LISTEN", default_value = "127.0.0.1:9590")]
    pub admin_listen: String,

    /// Listen address of the authenticated metrics server (HTTPS, /metrics only, for bearer
    /// tokens the API server authenticates and authorises for `get` on /metrics); `off`
    /// disables it. The shipped manifests use 0.0.0.0:9592.
    #[arg(long, env = "BATON_METRICS_LISTEN", default_value = "off")]
    pub metrics_listen: String,

    /// The metrics server's certificate chain (PEM); default: self-signed at start.
    #[arg(long, env = "BATON_METRICS_TLS_CERT", value_name = "PATH")]
    pub metrics_tls_cert: Option<PathBuf>,

    /// The metrics server's private key (PEM), with --metrics-tls-cert.
    #[arg(long, env = "BATON_METRICS_TLS_KEY", value_name = "PATH")]
    pub metrics_tls_key: Option<PathBuf>,
}

/// Errors of `baton controller`.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("invalid --{flag} {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    #[error("reading --cluster-ca {path}: {reason}")]
    ClusterCa { path: PathBuf, reason: String },
    #[error("no cluster CA: give --cluster-ca or a kubeconfig with certificate-authority data")]
    NoClusterCa,
    #[error(transparent)]
    Lease(#[from] lease::LeaseTimingError),
    #[error(transparent)]
    Cloud(#[from] baton_cloud::CloudError),
    #[error(transparent)]
    Context(#[from] super::context::ContextError),
    #[error(transparent)]
    Endpoint(#[from] endpoint::EndpointError),
    #[error("admin server: {0}")]
    Admin(#[from] crate::admin::AdminError),
}

impl ControllerError {
    /// Whether the error is bad input (exit code 2) rather than a runtime failure.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::Config(_)
                | Self::Flag { .. }
                | Self::Admin(crate::admin::AdminError::Tls(_))
                | Self::ClusterCa { .. }
                | Self::NoClusterCa
                | Self::KubeConfig(_)
                | Self::Lease(_)
        )
    }
}

async fn kube_config(args: &ControllerArgs) -> Result<kube::Config, ControllerError> {
    crate::kube::config::load(args.cluster.kubeconfig.as_deref())
        .await
        .map_err(|e| ControllerError::KubeConfig(e.to_string()))
}

fn cluster_ca(args: &ControllerArgs, kube: &kube::Config) -> Result<Vec<Vec<u8>>, ControllerError> {
    if let Some(path) = &args.cluster.cluster_ca {
        return crate::kube::tls::read_ca(path).map_err(|e| ControllerError::ClusterCa {
            path: path.clone(),
            reason: e.to_string(),
        });
    }
    kube.root_cert
        .clone()
        .filter(|c| !c.is_empty())
        .ok_or(ControllerError::NoClusterCa)
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(args: ControllerArgs) -> Result<(), ControllerError> {
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    let signal = crate::signal::shutdown();
    tokio::spawn(async move {
        signal.await;
        tracing::info!("signal received; stopping");
        on_signal.cancel();
    });
    if args.standby.standby {
        return super::standby::run(args, shutdown).await;
    }
    run_until(args, shutdown).await
}

/// Runs the controller until `shutdown` is cancelled.
pub async fn run_until(args: ControllerArgs, shutdown: CancellationToken) -> Result<(), ControllerError> {
    run_until_with(args, shutdown, None).await
}

/// Runs the controller until `shutdown` is cancelled, or (`rest`: a standby replica's round)
/// until it has been a follower for `rest` while another replica leads.
pub async fn run_until_with(
    args: ControllerArgs,
    shutdown: CancellationToken,
    rest: Option<Duration>,
) -> Result<(), ControllerError> {
    let config = Arc::new(Config::resolve(&args.config, &ProcessEnv)?);
    let mut cloud_config = config.cloud_client_config()?;
    let listen = |flag: &'static str, value: &str| {
        crate::admin::parse_listen(value).map_err(|reason| ControllerError::Flag { flag, reason })
    };
    let admin = listen("admin-listen", &args.admin_listen)?;
    let metrics_at = listen("metrics-listen", &args.metrics_listen)?;
    let kube_cfg = kube_config(&args).await?;
    let ca_der = cluster_ca(&args, &kube_cfg)?;
    let metrics = Arc::new(Metrics::default());
    let reach = ApiReachability::new();
    reach.set_observer(Arc::clone(&metrics) as _);
    // `--api-servers` when given, else the kubeconfig's own server, always with the failover
    // client's time limits and reachability record.
    let clients = crate::kube::client::clients(&kube_cfg, &args.cluster.api_servers, &reach)
        .map_err(|e| ControllerError::KubeConfig(e.to_string()))?;
    let client = clients.client();
    let sup = Supervisor::new(Arc::clone(&metrics), shutdown.clone());
    let heartbeats = Heartbeats::new(config.stall_limit());

    let identity = args.identity.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_or_else(|_| "baton".into(), |h| h.trim().to_owned())
    });
    // The cloud's request log then tells which replica sent each call.
    cloud_config.user_agent = format!("{} controller/{identity}", cloud_config.user_agent);
    let lease_cfg = lease_config(&args, &config, &identity)?;
    let lease_ref = (
        lease_cfg.namespace.clone(),
        lease_cfg.name.clone(),
        identity.clone(),
    );
    let cherry = CherryClient::new(cloud_config)?;
    cherry.observe(Arc::clone(&metrics) as _);

    tracing::info!(version = env!("CARGO_PKG_VERSION"), %identity, "baton controller starting");
    let leader = if args.no_leader_election {
        LeaderGate::always()
    } else {
        let beat = heartbeats.start_loop("lease");
        let (gate, task) = lease::spawn(client.clone(), lease_cfg, beat, shutdown.clone());
        sup.spawn("lease", joined(task));
        gate
    };
    if let (Some(rest), false) = (rest, args.no_leader_election) {
        sup.spawn(
            "standby-rest",
            super::standby::rest_when_led_elsewhere(leader.clone(), rest, shutdown.clone()),
        );
    }
    let (client, cloud, urgent_cloud) = fenced_clients(&clients, &leader, &cherry);
    // The self-signed metrics certificate's name (a DNS name: the pod name is one).
    let cert_name = identity.clone();
    // Served before the cluster id is read: while the API server does not answer, the kubelet
    // sees the pod alive and not ready, as it would later.
    let endpoints = AdminEndpoints {
        metrics: Arc::clone(&metrics),
        leader: leader.clone(),
        reach: reach.clone(),
        client: client.clone(),
        heartbeats: heartbeats.clone(),
        leaderless: spawn_leaderless(&sup, (!args.no_leader_election).then_some(&leader), &shutdown),
    };
    spawn_admin_endpoints(&sup, &args, (admin, metrics_at), cert_name, endpoints, &shutdown).await?;
    let ctx = Context::new(
        client,
        cloud,
        Arc::clone(&config),
        leader,
        Arc::clone(&metrics),
        Some(identity),
    );
    let ctx = tokio::select! {
        () = shutdown.cancelled() => {
            sup.join(lease::RELEASE_WAIT + Duration::from_secs(5)).await;
            return Ok(());
        }
        ctx = ctx => ctx?.with_heartbeats(heartbeats),
    };

    let opts = endpoint_options(&args, &config, ca_der, urgent_cloud);
    if !args.no_leader_election {
        sup.spawn(
            "leader-events",
            leader_events(ctx.clone(), lease_ref, shutdown.clone()),
        );
    }
    let mut result_rx = spawn_controllers(&sup, ctx, opts, &shutdown);
    let result = tokio::select! {
        () = shutdown.cancelled() => Ok(()),
        r = &mut result_rx => {
            if let Ok(Err(e)) = r {
                Err(e)
            } else {
                // Ended or panicked: reported by the supervisor (/health); run until told to stop.
                shutdown.cancelled().await;
                Ok(())
            }
        }
    };
    shutdown.cancel();
    // Lets the controllers finish the write in hand and the lease task release the Lease once
    // the writes on their way are answered (at most `lease::RELEASE_WAIT`).
    sup.join(lease::RELEASE_WAIT + Duration::from_secs(5)).await;
    result.map_err(Into::into)
}

/// The endpoint loop's settings: the probe from the configuration's `healthCheck`, a pass every
/// 250 ms when nothing changes, the project's servers re-read from the cloud every 10 minutes.
fn endpoint_options(
    args: &ControllerArgs,
    config: &Config,
    ca_der: Vec<Vec<u8>>,
    urgent_cloud: Arc<dyn Cloud>,
) -> EndpointOptions {
    let hc = &config.health_check;
    EndpointOptions {
        probe: ProbeSettings {
            path: hc.path.clone(),
            server_name: args.cluster.health_check_server_name.clone(),
            ca_der,
            interval: hc.interval,
            timeout: hc.timeout,
            thresholds: Thresholds {
                rise: hc.rise,
                fall: hc.fall,
            },
        },
        urgent_cloud,
        fip_table_namespace: args.cluster.lease_namespace.clone(),
        tick: Duration::from_millis(250),
        servers_refresh: Duration::from_secs(600),
    }
}

/// The controllers' clients, every write fenced by `leader`'s term and deadline, checked right
/// before each attempt leaves and counted in flight until answered (a graceful release waits for
/// it): Kubernetes (the lease task's own client is not), the cloud at normal and at urgent
/// priority (docs/controller.md, "Fencing at the write"). Reads of the shared IP list follow the Lease: a new term's first read waits for
/// a list fetched after the previous holder stopped writing (docs/cloud.md, "Shared IP list").
fn fenced_clients(
    clients: &crate::kube::client::Clients,
    leader: &LeaderGate,
    cherry: &CherryClient,
) -> (kube::Client, Arc<dyn Cloud>, Arc<dyn Cloud>) {
    let fence: Arc<dyn baton_cloud::Fence> = Arc::new(leader.receiver());
    let client = clients.fenced(crate::kube::client::WriteFence {
        fence: Arc::clone(&fence),
        in_flight: leader.in_flight().clone(),
    });
    let led: Arc<dyn baton_cloud::Leadership> = Arc::new(leader.clone());
    let cherry = cherry.led_by(led).counting(leader.in_flight().clone());
    let cloud: Arc<dyn Cloud> = Arc::new(cherry.fenced(Arc::clone(&fence)));
    let urgent_cloud: Arc<dyn Cloud> = Arc::new(cherry.with_priority(Priority::Urgent).fenced(fence));
    (client, cloud, urgent_cloud)
}

/// The clock of `baton_leaderless_seconds`; with leader election (`gate`), a supervised task
/// follows the leadership record so that a leader seen between two scrapes counts too.
fn spawn_leaderless(
    sup: &Supervisor,
    gate: Option<&LeaderGate>,
    shutdown: &CancellationToken,
) -> Arc<Leaderless> {
    let clock = Arc::new(Leaderless::default());
    if let Some(gate) = gate {
        let task = watch_leaderless(gate.clone(), Arc::clone(&clock), shutdown.clone());
        sup.spawn("leaderless", task);
    }
    clock
}

/// Follows the leadership record (every change, and at least every 100 ms).
async fn watch_leaderless(mut gate: LeaderGate, clock: Arc<Leaderless>, shutdown: CancellationToken) {
    loop {
        clock.observe(&gate);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = gate.changed() => {}
        }
    }
}

/// An Event on the Lease each time this replica becomes leader (the convention of
/// Kubernetes' own controllers: `kubectl describe lease` tells who led when), until `shutdown`.
async fn leader_events(
    ctx: Context,
    (namespace, name, identity): (String, String, String),
    shutdown: CancellationToken,
) {
    use futures::StreamExt as _;
    let lease = super::context::object_ref("coordination.k8s.io/v1", "Lease", Some(&namespace), &name);
    let mut elected = std::pin::pin!(ctx.leader.elected().take_until(shutdown.cancelled_owned()));
    while elected.next().await.is_some() {
        ctx.event_on(
            &lease,
            None,
            kube::runtime::events::EventType::Normal,
            "LeaderElection",
            "Lead",
            format!("{identity} became leader"),
        )
        .await;
    }
}

/// The leader Lease's settings, checked (docs/controller.md: why the order matters).
fn lease_config(
    args: &ControllerArgs,
    config: &Config,
    identity: &str,
) -> Result<LeaseConfig, ControllerError> {
    let mut cfg = LeaseConfig::new(
        &args.cluster.lease_namespace,
        &format!("{}-controller", config.prefix),
        identity,
    );
    cfg.duration = config.lease.duration;
    cfg.renew_deadline = config.lease.renew_deadline;
    cfg.renew_interval = config.lease.renew_interval;
    cfg.node = args.node_name.clone().filter(|n| !n.is_empty());
    cfg.validate()?;
    Ok(cfg)
}

/// Every controller, supervised, on one set of shared watches (each subscribes before the
/// watches run). The endpoint loop's only error (bad probe settings, at start) comes back
/// through the returned channel and ends the process with that error.
fn spawn_controllers(
    sup: &Supervisor,
    ctx: Context,
    opts: EndpointOptions,
    shutdown: &CancellationToken,
) -> tokio::sync::oneshot::Receiver<Result<(), endpoint::EndpointError>> {
    let mut watches = Watches::new(&ctx.client).counted(Arc::clone(&ctx.metrics));
    let config = Arc::clone(&ctx.config);
    let urgent = Arc::clone(&opts.urgent_cloud);
    spawn_cloud_controllers(
        sup,
        &config,
        (Arc::new(ctx.clone()), urgent),
        &mut watches,
        shutdown,
    );
    let (result_tx, result_rx) = tokio::sync::oneshot::channel();
    let endpoints = endpoint::run(ctx, &mut watches, opts, shutdown.clone());
    sup.spawn(
        "endpoints",
        async move {
            let _ = result_tx.send(endpoints.await);
        }
        .instrument(tracing::info_span!("endpoints")),
    );
    sup.spawn(
        "watches",
        watches
            .run(shutdown.clone().cancelled_owned())
            .instrument(tracing::info_span!("watches")),
    );
    result_rx
}

/// The cloud-controller duties, supervised: a FIP per LoadBalancer Service (when a load balancer
/// is configured; otherwise only deletions in flight are finished), BGP, node initialisation.
/// Their watch and reconcile errors are logged inside run_services / run_bgp / run_nodes.
fn spawn_cloud_controllers(
    sup: &Supervisor,
    config: &Config,
    (shared, urgent): (Arc<Context>, Arc<dyn Cloud>),
    watches: &mut Watches,
    shutdown: &CancellationToken,
) {
    sup.spawn(
        "services",
        super::service::run_services(Arc::clone(&shared), watches, shutdown.clone().cancelled_owned())
            .instrument(tracing::info_span!("services")),
    );
    let hetzner = config.cloud == baton_cloud::CloudKind::Hetzner;
    // Without a load balancer run_bgp returns at once (not a failure): spawn it only with one.
    // Hetzner Cloud has no BGP: its Service FIPs are routed to a healthy node instead.
    if hetzner {
        tracing::info!("Hetzner Cloud: no BGP; Service FIPs are routed to healthy nodes");
        sup.spawn(
            "routing",
            super::routing::run_routing(Arc::clone(&shared), urgent, watches, shutdown.clone())
                .instrument(tracing::info_span!("routing")),
        );
    } else if config.load_balancer.is_some() {
        sup.spawn(
            "bgp",
            super::bgp::run_bgp(Arc::clone(&shared), watches, shutdown.clone().cancelled_owned())
                .instrument(tracing::info_span!("bgp")),
        );
    } else {
        tracing::info!("no loadbalancer configured: BGP is off");
    }
    // Next to hcloud-cloud-controller-manager, which initialises the Nodes (docs/hetzner.md),
    // unless told to (`initializeNodes`).
    if !config.initializes_nodes() {
        tracing::info!("Node initialisation is off (initializeNodes)");
        return;
    }
    sup.spawn(
        "nodes",
        super::node::run_nodes(shared, watches, shutdown.clone().cancelled_owned())
            .instrument(tracing::info_span!("nodes")),
    );
}

/// What the admin endpoints read.
struct AdminEndpoints {
    metrics: Arc<Metrics>,
    leader: LeaderGate,
    reach: ApiReachability,
    client: kube::Client,
    heartbeats: Heartbeats,
    leaderless: Arc<Leaderless>,
}

/// The plain admin server (`admin`: loopback by default) and the authenticated metrics server
/// (`metrics`), each a supervised task when configured.
async fn spawn_admin_endpoints(
    sup: &Supervisor,
    args: &ControllerArgs,
    (admin, metrics_at): (Option<SocketAddr>, Option<SocketAddr>),
    cert_name: String,
    e: AdminEndpoints,
    shutdown: &CancellationToken,
) -> Result<(), ControllerError> {
    if let Some(addr) = admin {
        let app = admin_router(&e, sup.clone());
        spawn_admin(sup, addr, app, shutdown.clone()).await?;
    }
    if let Some(addr) = metrics_at {
        let names = vec![cert_name, addr.ip().to_string()];
        let tls = crate::admin::tls::server_config(
            args.metrics_tls_cert.as_deref(),
            args.metrics_tls_key.as_deref(),
            &names,
        )
        .map_err(crate::admin::AdminError::from)?;
        let server =
            crate::admin::SecureServer::bind(addr, tls, crate::admin::Authorizer::new(e.client.clone()))
                .await?;
        let app = metrics_router(&e);
        sup.spawn(
            "metrics",
            server
                .serve(app, shutdown.clone())
                .instrument(tracing::info_span!("metrics")),
        );
    }
    Ok(())
}

/// Binds the plain admin server and runs it as the supervised task `admin`.
async fn spawn_admin(
    sup: &Supervisor,
    addr: SocketAddr,
    app: axum::Router,
    shutdown: CancellationToken,
) -> Result<(), ControllerError> {
    crate::admin::warn_if_exposed("--admin-listen", addr);
    let listener = crate::admin::bind_plain(addr).await?;
    sup.spawn(
        "admin",
        crate::admin::serve_plain(listener, app, shutdown).instrument(tracing::info_span!("admin")),
    );
    Ok(())
}

/// A task spawned elsewhere, as a future for the supervisor (its panic is passed on).
async fn joined(task: tokio::task::JoinHandle<()>) {
    if let Err(e) = task.await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// `/metrics` alone: what the authenticated metrics server serves.
fn metrics_router(e: &AdminEndpoints) -> axum::Router {
    use axum::routing::get;
    let metrics = Arc::clone(&e.metrics);
    let reach = e.reach.clone();
    let leader = e.leader.clone();
    let heartbeats = e.heartbeats.clone();
    let leaderless = Arc::clone(&e.leaderless);
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let metrics = Arc::clone(&metrics);
            let reach = reach.clone();
            let leading = leader.is_leader();
            metrics.set_leaderless(leaderless.observe(&leader));
            heartbeats.export(&metrics);
            async move {
                metrics.set_api_reachable(reach.answered_within(READY_WINDOW));
                metrics.set_leader(leading);
                metrics.encode()
            }
        }),
    )
}

/// The plain admin server's routes: `/metrics`, `/health`, `/ready`, `/leader`.
fn admin_router(e: &AdminEndpoints, sup: Supervisor) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    let leader = e.leader.clone();
    let reach = e.reach.clone();
    let heartbeats = e.heartbeats.clone();
    let refusals = e.heartbeats.clone();
    metrics_router(e)
        .route(
            "/health",
            get(move || {
                let (ok, text) = super::health::health(&sup, &heartbeats);
                let status = if ok {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (status, text) }
            }),
        )
        .route(
            "/ready",
            get(move || {
                let reach = reach.clone();
                let refused = refusals.refused();
                async move {
                    if let Some(why) = refused {
                        (StatusCode::SERVICE_UNAVAILABLE, why)
                    } else if reach.answered_within(READY_WINDOW) {
                        (StatusCode::OK, "ok".to_owned())
                    } else {
                        let refused = reach
                            .last_refusal()
                            .map_or_else(String::new, |s| format!("; the last answer was HTTP {s}"));
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "no API server answered successfully for {}s ({} failed attempts{refused})",
                                reach.silent_for().as_secs(),
                                reach.consecutive_failures()
                            ),
                        )
                    }
                }
            }),
        )
        .route(
            "/leader",
            get(move || {
                let leader = leader.clone();
                async move { if leader.is_leader() { "leader" } else { "follower" } }
            }),
        )
}
