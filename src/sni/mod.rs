//! `baton sni serve`: many API servers behind one address. A TCP proxy that reads the TLS
//! ClientHello's server name (SNI) without terminating TLS and splices the raw stream to that
//! tenant's API servers, so client certificates still authenticate end to end.
//!
//! ```text
//!  flags / BATON_SNI_* ─┐
//!  --routes-file ────────┼─► Sources::publish: merged RouteSpec ──build──► RouteTable ──watch──┐
//!  --services (kube.rs) ─┘   (file re-read every --reload-interval-ms; a bad file keeps       │
//!                             the old routes; Services watched, reloaded on every change)     │
//!                                                                                   ▼
//!  --listen ADDR ──────► Router::serve(Kind::Sni)   ─┐   router.rs: admit (admission.rs: caps,
//!  --proxy-listen ADDR ► Router::serve(Kind::Proxy) ─┴─► pending queue), read within the bounds,
//!    (on each of --threads threads: its own           choose, connect, replay, splice (pump.rs)
//!     SO_REUSEPORT sockets, then the next
//!     thread's, and its own event loop)
//!  --admin-listen ADDR ► /metrics /health /ready         metrics.rs (plain HTTP: keep it on loopback)
//!  --metrics-listen ADDR ► /metrics over HTTPS, TokenReview + SubjectAccessReview (crate::admin)
//!  shutdown: crate::signal::shutdown ─► stop accepting ─► wait ≤ --drain-s for open splices
//! ```
//!
//! The parsers (`hello`, `proxy_protocol`), the route table (`routes`), the admission
//! bookkeeping (`admission`) and the tenant policy (`kube::Policy`) are pure and need no server;
//! `router` and `pump` are the only modules doing I/O on client connections.

pub mod admission;
pub mod dns;
pub mod health;
pub mod hello;
pub mod kube;
pub mod metrics;
pub mod proxy_protocol;
pub mod pump;
pub mod router;
pub mod routes;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::{Args, Subcommand};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use self::admission::Caps;
use self::metrics::Metrics;
use self::pump::{Timeouts, Transfer};
use self::router::{Kind, Limits, Router};
use self::routes::{Health, RouteError, RouteSpec, RouteTable};

/// Route TLS connections by server name (SNI) to many API servers behind one address.
#[derive(Debug, Args)]
pub struct SniArgs {
    #[command(subcommand)]
    pub command: SniCommand,
}

/// The `sni` subcommands.
#[derive(Debug, Subcommand)]
pub enum SniCommand {
    /// Run the router with routes from flags (and a file) until SIGINT/SIGTERM.
    Serve(ServeArgs),
}

/// `baton sni serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to accept TLS on, e.g. `203.0.113.10:443`. Repeatable; comma-separated in the
    /// environment variable.
    #[arg(long, env = "BATON_SNI_LISTEN", value_name = "ADDR", value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,

    /// A tenant: its host names and its API servers, `HOST[,HOST…]=ADDR[,ADDR…]`; with
    /// `HOST[,HOST…]:PORT=…` its backends for connections to local port PORT only (a second
    /// `--listen`, konnectivity's say). Repeatable; `;`-separated in the environment variable.
    #[arg(
        long,
        env = "BATON_SNI_ROUTE",
        value_name = "HOST[:PORT]=ADDR[,ADDR…]",
        value_delimiter = ';'
    )]
    pub route: Vec<String>,

    /// Backends for a ClientHello without a server name or with one no route names
    /// (default: close the connection).
    #[arg(long, env = "BATON_SNI_DEFAULT", value_name = "ADDR[,ADDR…]")]
    pub default: Option<String>,

    /// Address to accept PROXY protocol (v1 or v2) connections on. Repeatable.
    #[arg(
        long,
        env = "BATON_SNI_PROXY_LISTEN",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub proxy_listen: Vec<SocketAddr>,

    /// PROXY listener: route connections whose original destination is DSTADDR (`IP` or
    /// `IP:PORT`) to the tenant of HOST. Repeatable; `;`-separated in the environment variable.
    #[arg(
        long,
        env = "BATON_SNI_PROXY_ROUTE",
        value_name = "DSTADDR=HOST",
        value_delimiter = ';'
    )]
    pub proxy_route: Vec<String>,

    /// More routes, re-read while running: lines `HOST[,HOST…][:PORT]=ADDR[,ADDR…]`,
    /// `default=ADDR[,…]` and `proxy DSTADDR=HOST`; `#` comments. A host in both the file and a
    /// flag (on the same port, or both for every port) is an error.
    #[arg(long, env = "BATON_SNI_ROUTES_FILE", value_name = "FILE")]
    pub routes_file: Option<PathBuf>,

    /// How often the routes file is checked for changes, in milliseconds.
    #[arg(
        long,
        env = "BATON_SNI_RELOAD_INTERVAL_MS",
        default_value_t = 1000,
        value_name = "MS"
    )]
    pub reload_interval_ms: u64,

    /// Address of the plain-HTTP admin server (`/metrics`, `/health`, `/ready`), without
    /// authentication: keep it on loopback (`127.0.0.1:9591`; the metrics name every tenant's
    /// host and backends); none by default.
    #[arg(long, env = "BATON_SNI_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,

    /// Address of the authenticated metrics server: HTTPS, `/metrics` only, for bearer tokens
    /// the API server authenticates and authorises for `get` on /metrics (needs a kubeconfig or
    /// the in-cluster configuration); none by default.
    #[arg(long, env = "BATON_SNI_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// The metrics server's certificate chain (PEM); default: self-signed at start.
    #[arg(long, env = "BATON_SNI_METRICS_TLS_CERT", value_name = "PATH")]
    pub metrics_tls_cert: Option<PathBuf>,

    /// The metrics server's private key (PEM), with --metrics-tls-cert.
    #[arg(long, env = "BATON_SNI_METRICS_TLS_KEY", value_name = "PATH")]
    pub metrics_tls_key: Option<PathBuf>,

    /// The most bytes read before a backend is chosen (PROXY header and ClientHello).
    #[arg(long, env = "BATON_SNI_MAX_HELLO_BYTES", default_value_t = 16 * 1024, value_name = "BYTES")]
    pub max_hello_bytes: usize,

    /// The longest time to read them, in milliseconds.
    #[arg(
        long,
        env = "BATON_SNI_HELLO_TIMEOUT_MS",
        default_value_t = 5000,
        value_name = "MS"
    )]
    pub hello_timeout_ms: u64,

    /// The longest time to connect to one backend, in milliseconds; then the next is tried.
    #[arg(
        long,
        env = "BATON_SNI_CONNECT_TIMEOUT_MS",
        default_value_t = 2000,
        value_name = "MS"
    )]
    pub connect_timeout_ms: u64,

    /// The most connections open at once (not yet routed and spliced); beyond it no connection
    /// is accepted until one ends. 0: as many as the open-files limit allows (two descriptors
    /// per connection, after the listening sockets' and the pipes'), at most 100000.
    #[arg(
        long,
        env = "BATON_SNI_MAX_CONNECTIONS",
        default_value_t = 0,
        value_name = "N"
    )]
    pub max_connections: usize,

    /// The most connections open at once from one client address (an IPv6 /64 counts as one);
    /// more are reset at once.
    #[arg(
        long,
        env = "BATON_SNI_MAX_CONNECTIONS_PER_SOURCE",
        default_value_t = 4096,
        value_name = "N"
    )]
    pub max_connections_per_source: usize,

    /// The most connections not yet routed (reading their ClientHello) at once, and at most
    /// --max-connections; a new one beyond it evicts the oldest.
    #[arg(
        long,
        env = "BATON_SNI_MAX_PENDING",
        default_value_t = 20_000,
        value_name = "N"
    )]
    pub max_pending: usize,

    /// The most connections not yet routed from one client address; more are reset at once.
    #[arg(
        long,
        env = "BATON_SNI_MAX_PENDING_PER_SOURCE",
        default_value_t = 128,
        value_name = "N"
    )]
    pub max_pending_per_source: usize,

    /// The most bytes all connections not yet routed hold together; beyond it the oldest are
    /// evicted.
    #[arg(
        long,
        env = "BATON_SNI_MAX_PENDING_BYTES",
        default_value_t = 16 << 20,
        value_name = "BYTES"
    )]
    pub max_pending_bytes: usize,

    /// The most connects in flight at once to one tenant's backends; more connections to it
    /// are refused at once.
    #[arg(
        long,
        env = "BATON_SNI_MAX_CONNECTING",
        default_value_t = 512,
        value_name = "N"
    )]
    pub max_connecting: usize,

    /// A spliced connection with no byte in either direction for this long is closed, in
    /// seconds (API watches stay busier: clients send HTTP/2 PINGs every 30 s or so).
    #[arg(
        long,
        env = "BATON_SNI_IDLE_TIMEOUT_S",
        default_value_t = 3600,
        value_name = "S"
    )]
    pub idle_timeout_s: u64,

    /// A spliced connection whose peer takes none of the bytes waiting for it for this long is
    /// closed, in seconds.
    #[arg(
        long,
        env = "BATON_SNI_STALL_TIMEOUT_S",
        default_value_t = 300,
        value_name = "S"
    )]
    pub stall_timeout_s: u64,

    /// Move spliced connections' bytes with splice(2) through per-thread pipes (kernel to
    /// kernel) instead of copying them through a 32 KiB buffer. Off by default: on loopback,
    /// through TLS, it moved fewer bytes a second than copying (docs/benchmarks.md).
    #[arg(long, env = "BATON_SNI_SPLICE")]
    pub splice: bool,

    /// PROXY listener: the v2 TLV type whose value names the tenant (one of its host names),
    /// for clients that send no SNI; `0x00` not to read one.
    #[arg(
        long,
        env = "BATON_SNI_PROXY_TENANT_TLV",
        default_value = "0xE0",
        value_name = "TYPE",
        value_parser = parse_tlv_type
    )]
    pub proxy_tenant_tlv: u8,

    /// Threads that accept and splice connections, each with its own listening socket
    /// (`SO_REUSEPORT`: the kernel spreads new connections over them) and its own event loop,
    /// like nginx's worker processes; a thread also accepts from the next thread's socket, so a
    /// connection the kernel gave a busy thread can be taken by its neighbour; 0: one per CPU
    /// the process may use.
    #[arg(long, env = "BATON_SNI_THREADS", default_value_t = 0, value_name = "N")]
    pub threads: usize,

    /// Also route the tenant Services (annotation `baton.dev/sni-hosts`) of the cluster the
    /// kubeconfig names, reloaded live; their ready endpoints are the backends.
    #[arg(long, env = "BATON_SNI_SERVICES")]
    pub services: bool,

    /// The kubeconfig for `--services` (default: in-cluster, then `KUBECONFIG`/`~/.kube/config`).
    #[arg(long, env = "BATON_SNI_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Watch tenant Services in this namespace only (default: all namespaces; a namespace must
    /// still be allowed, see --tenant-namespace and --tenant-namespace-label).
    #[arg(long, env = "BATON_SNI_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Allow tenant Services in namespace NS, with host names in (or under) these domains.
    /// Repeatable; `;`-separated in the environment variable.
    #[arg(
        long,
        env = "BATON_SNI_TENANT_NAMESPACE",
        value_name = "NS=DOMAIN[,DOMAIN…]",
        value_delimiter = ';'
    )]
    pub tenant_namespace: Vec<String>,

    /// Allow tenant Services in namespaces carrying this label (`KEY=VALUE`), with host names
    /// under the domains of their annotation `baton.dev/sni-domains`; `""`: no namespace by label.
    #[arg(
        long,
        env = "BATON_SNI_TENANT_NAMESPACE_LABEL",
        default_value = "baton.dev/sni-tenants=true",
        value_name = "KEY=VALUE"
    )]
    pub tenant_namespace_label: String,

    /// Tenant Services' backends must be in one of these networks (`CIDR`); never loopback,
    /// link-local, multicast or an address of this node. None given: no Service backend is
    /// dialled. Repeatable; comma-separated in the environment variable.
    #[arg(
        long,
        env = "BATON_SNI_BACKEND_CIDR",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub backend_cidr: Vec<String>,

    /// Publish every routed host name inside `--dns-zone` in DNS, answering with
    /// `--dns-address`, from an embedded authoritative server on these addresses (UDP and TCP).
    #[arg(long, env = "BATON_SNI_DNS_LISTEN", value_name = "ADDR", value_delimiter = ',', requires_all = ["dns_zone", "dns_address"])]
    pub dns_listen: Vec<SocketAddr>,

    /// The zone the tenants' host names are published in, e.g. `example.com`.
    #[arg(
        long,
        env = "BATON_SNI_DNS_ZONE",
        value_name = "ZONE",
        requires = "dns_listen"
    )]
    pub dns_zone: Option<baton_dns::DnsName>,

    /// The address(es) every host name answers with: the shared FIP.
    #[arg(
        long,
        env = "BATON_SNI_DNS_ADDRESS",
        value_name = "IP",
        value_delimiter = ',',
        requires = "dns_listen"
    )]
    pub dns_address: Vec<std::net::IpAddr>,

    /// Health-check a tenant's backends actively: `HOST=CAFILE`, HOST one of the tenant's host
    /// names (the name verified on its serving certificate), CAFILE the tenant's CA (PEM). Backends
    /// whose `/readyz` fails are skipped. Repeatable; `;`-separated in the environment variable.
    #[arg(
        long,
        env = "BATON_SNI_HEALTH_CA",
        value_name = "HOST=CAFILE",
        value_delimiter = ';'
    )]
    pub health_ca: Vec<String>,

    /// After SIGTERM, how long open connections may go on, in seconds.
    #[arg(long, env = "BATON_SNI_DRAIN_S", default_value_t = 10, value_name = "S")]
    pub drain_s: u64,
}

/// Errors of `baton sni`.
#[derive(Debug, thiserror::Error)]
pub enum SniError {
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("{field} {value}: {why}")]
    Config {
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("--routes-file {path}: {source}")]
    RoutesFile { path: PathBuf, source: std::io::Error },
    #[error("--dns-listen: {0}")]
    Dns(baton_dns::DnsError),
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("starting the connection threads: {0}")]
    Runtime(std::io::Error),
    #[error("metrics server: {0}")]
    Metrics(#[from] crate::admin::AdminError),
}

impl SniError {
    /// Whether the error is the operator's configuration (exit code 2).
    pub fn is_config(&self) -> bool {
        !matches!(
            self,
            Self::Bind { .. }
                | Self::Dns(_)
                | Self::Runtime(_)
                | Self::Metrics(crate::admin::AdminError::Bind { .. })
        )
    }
}

/// Runs `baton sni …`.
pub async fn run(args: SniArgs) -> Result<(), SniError> {
    match args.command {
        SniCommand::Serve(serve) => run_serve(serve).await,
    }
}

/// The routes from the flags alone.
pub fn flag_routes(args: &ServeArgs) -> Result<RouteSpec, RouteError> {
    let mut spec = RouteSpec::default();
    for r in &args.route {
        spec.add_route(r)?;
    }
    if let Some(d) = &args.default {
        spec.set_default(d)?;
    }
    for r in &args.proxy_route {
        spec.add_destination(r)?;
    }
    Ok(spec)
}

/// The routes file, parsed and checked against the flags' routes.
fn load_file(flags: &RouteSpec, path: &PathBuf) -> Result<RouteSpec, SniError> {
    let text = std::fs::read_to_string(path).map_err(|source| SniError::RoutesFile {
        path: path.clone(),
        source,
    })?;
    let bad = |why: String| SniError::Config {
        field: "--routes-file",
        value: path.display().to_string(),
        why,
    };
    let from_file = RouteSpec::parse_file(&text).map_err(|e| bad(e.to_string()))?;
    flags.clone().merge(&from_file).map_err(|e| bad(e.to_string()))?;
    Ok(from_file)
}

/// Where the routes come from: flags (fixed), the routes file and tenant Services (both
/// replaced while running). Every change merges the three and publishes a new table.
struct Sources {
    flags: RouteSpec,
    file: Mutex<RouteSpec>,
    services: Mutex<RouteSpec>,
    tx: watch::Sender<Arc<RouteTable>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

impl Sources {
    fn set_file(&self, spec: RouteSpec) {
        *self.file.lock().unwrap_or_else(PoisonError::into_inner) = spec;
        self.publish();
    }

    fn set_services(&self, spec: RouteSpec) {
        *self.services.lock().unwrap_or_else(PoisonError::into_inner) = spec;
        self.publish();
    }

    fn publish(&self) {
        let table = Arc::new(self.merged().build(&self.health));
        publish_health(&self.metrics, &table, &self.health);
        self.metrics.reload("applied", table.host_count());
        info!(hosts = table.host_count(), "routes published");
        self.tx.send_replace(table);
    }

    /// Flags, then the file (checked against the flags when read), then Services for the
    /// hosts neither names.
    fn merged(&self) -> RouteSpec {
        let mut spec = self.flags.clone();
        let file = self.file.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Err(error) = spec.merge(&file) {
            warn!(%error, "routes file clashes with the flags; ignoring the file");
        }
        let services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        for host in spec.merge_missing(&services) {
            warn!(
                host,
                "host of a tenant Service is routed by a flag or the routes file; the Service is ignored for it"
            );
        }
        spec
    }
}

async fn run_serve(args: ServeArgs) -> Result<(), SniError> {
    let signal = crate::signal::shutdown();
    let flags = flag_routes(&args)?;
    let limits = check_limits(&args)?;
    let admin_servers = AdminServers::of(&args);
    let ServeArgs {
        listen,
        proxy_listen,
        routes_file,
        reload_interval_ms,
        drain_s,
        threads,
        services,
        kubeconfig,
        namespace,
        tenant_namespace,
        tenant_namespace_label,
        backend_cidr,
        dns_listen,
        dns_zone,
        dns_address,
        health_ca,
        ..
    } = args;
    let cas = health_cas(&health_ca)?;
    let policy = tenant_policy(
        services,
        &tenant_namespace,
        &tenant_namespace_label,
        &backend_cidr,
    )?;
    let threads = thread_count(threads);
    // Bound first, so the connections' share of the open files leaves out what the listening
    // sockets hold (two per thread and address); connections wait in the backlog meanwhile.
    let listeners = bind_all(&listen, &proxy_listen, threads)?;
    let limits = fit_to_open_files(limits, threads, listeners.iter().map(Vec::len).sum());
    let file = routes_file.as_ref().map(|p| load_file(&flags, p)).transpose()?;
    // The metrics server's reviews need the API server too.
    let kube = kube_client(
        services || admin_servers.metrics_listen.is_some(),
        kubeconfig.as_deref(),
    )
    .await?;
    let client = if services { kube.clone() } else { None };
    let health = Arc::new(Health::default());
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = watch::channel(Arc::new(RouteTable::default()));
    let sources = Arc::new(Sources {
        flags,
        file: Mutex::new(RouteSpec::default()),
        services: Mutex::new(RouteSpec::default()),
        tx,
        health: Arc::clone(&health),
        metrics: Arc::clone(&metrics),
    });
    sources.set_file(file.unwrap_or_default());

    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let dns = match dns_zone {
        Some(zone) if !dns_listen.is_empty() => Some(
            dns::serve(zone, dns_listen, dns_address, rx.clone(), shutdown.clone())
                .await
                .map_err(SniError::Dns)?,
        ),
        _ => None,
    };
    if !cas.is_empty() {
        tokio::spawn(health::run(
            cas,
            rx.clone(),
            Arc::clone(&health),
            Arc::clone(&metrics),
            shutdown.clone(),
        ));
    }
    let router = Arc::new(Router::new(rx, health, limits, Arc::clone(&metrics)));
    let workers = Workers::start(&router, listeners, &shutdown, &tracker)?;
    admin_servers.spawn(kube, &metrics, &shutdown).await?;
    let reload = routes_file.map(|p| (p, Duration::from_millis(reload_interval_ms.max(10))));
    watch_sources(
        &sources,
        reload,
        client.map(|c| (c, namespace, policy)),
        &shutdown,
    );
    info!(
        version = env!("CARGO_PKG_VERSION"),
        ?listen,
        ?proxy_listen,
        hosts = router_hosts(&router),
        services,
        max_connections = limits.caps.max_connections,
        "SNI router serving"
    );
    signal.await;
    info!("signal received; no new connections, draining open ones");
    shutdown.cancel();
    workers.drain(&tracker, Duration::from_secs(drain_s)).await;
    if let Some(dns) = dns {
        let _ = dns.await;
    }
    Ok(())
}

/// `--threads`: 0 is one per CPU the process may use.
fn thread_count(threads: usize) -> usize {
    if threads == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    } else {
        threads
    }
}

/// Who may be a tenant (`--services`), with a warning when nothing can be.
fn tenant_policy(
    services: bool,
    namespaces: &[String],
    label: &str,
    cidrs: &[String],
) -> Result<kube::Policy, SniError> {
    let policy = kube::Policy::from_flags(namespaces, label, cidrs)?;
    if services && policy.allows_nothing() {
        warn!(
            "--services: no namespace is allowed (no --tenant-namespace, no --tenant-namespace-label): no Service is routed"
        );
    }
    if services && policy.backend_cidrs.is_empty() {
        warn!("--services: no --backend-cidr: no tenant Service's backend is dialled");
    }
    Ok(policy)
}

/// `--health-ca` parsed: tenant host → CA certificates.
fn health_cas(specs: &[String]) -> Result<BTreeMap<String, Vec<Vec<u8>>>, SniError> {
    specs
        .iter()
        .map(|spec| {
            health::parse_ca(spec).map_err(|why| SniError::Config {
                field: "--health-ca",
                value: spec.clone(),
                why,
            })
        })
        .collect()
}

/// Starts the sources that change while running: the routes file and tenant Services.
fn watch_sources(
    sources: &Arc<Sources>,
    reload: Option<(PathBuf, Duration)>,
    services: Option<(::kube::Client, Option<String>, kube::Policy)>,
    shutdown: &CancellationToken,
) {
    if let Some((path, interval)) = reload {
        tokio::spawn(reload_loop(Arc::clone(sources), path, interval, shutdown.clone()));
    }
    if let Some((client, namespace, policy)) = services {
        let s = Arc::clone(sources);
        let publish = move |tenants: Vec<kube::Tenant>| s.set_services(kube::spec(&tenants));
        tokio::spawn(kube::watch_tenants(
            client,
            namespace,
            policy,
            publish,
            shutdown.clone(),
        ));
    }
}

/// Waits for the accept loops to stop, then up to `limit` for open connections to end.
/// The threads that accept and splice connections: each runs its own single-threaded event
/// loop over its own listening sockets, so a connection never moves between threads (no
/// cross-thread wake-ups; on a proxy that spends most of its time in the kernel, those were a
/// tenth of its CPU).
struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Closed once every thread's accept loops have ended.
    accepting: tokio::sync::mpsc::Receiver<()>,
    /// Ends the threads (and the connections still open on them).
    stop: CancellationToken,
}

impl Workers {
    fn start(
        router: &Arc<Router>,
        listeners: Vec<Vec<(std::net::TcpListener, Kind)>>,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Result<Self, SniError> {
        let (accepting_tx, accepting) = tokio::sync::mpsc::channel(1);
        let stop = CancellationToken::new();
        let mut threads = Vec::new();
        for (i, own) in listeners.into_iter().enumerate() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(SniError::Runtime)?;
            let (router, shutdown, tracker) = (Arc::clone(router), shutdown.clone(), tracker.clone());
            let (accepting, stop) = (accepting_tx.clone(), stop.clone());
            let thread = std::thread::Builder::new()
                .name(format!("sni-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        let mut loops = Vec::new();
                        for (l, kind) in own {
                            match TcpListener::from_std(l) {
                                Ok(l) => loops.push(tokio::spawn(Arc::clone(&router).serve(
                                    l,
                                    kind,
                                    shutdown.clone(),
                                    tracker.clone(),
                                ))),
                                Err(error) => warn!(%error, "cannot listen on this thread"),
                            }
                        }
                        for l in loops {
                            let _ = l.await;
                        }
                        drop(accepting);
                        // Keep serving the open connections until the drain is over.
                        stop.cancelled().await;
                    });
                })
                .map_err(SniError::Runtime)?;
            threads.push(thread);
        }
        Ok(Self {
            threads,
            accepting,
            stop,
        })
    }

    /// After shutdown: waits until no thread accepts any more, then up to `limit` for the open
    /// connections to end; then ends the threads, closing what is still open.
    async fn drain(mut self, tracker: &TaskTracker, limit: Duration) {
        while self.accepting.recv().await.is_some() {}
        tracker.close();
        if tokio::time::timeout(limit, tracker.wait()).await.is_err() {
            warn!(open = tracker.len(), "drain time over; closing open connections");
        }
        self.stop.cancel();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// The bounds, checked.
fn check_limits(args: &ServeArgs) -> Result<Limits, SniError> {
    let bad = |field: &'static str, value: String, why: &str| SniError::Config {
        field,
        value,
        why: why.into(),
    };
    if args.listen.is_empty() && args.proxy_listen.is_empty() {
        return Err(bad("--listen", String::new(), "give --listen or --proxy-listen"));
    }
    if !(512..=1 << 20).contains(&args.max_hello_bytes) {
        return Err(bad(
            "--max-hello-bytes",
            args.max_hello_bytes.to_string(),
            "must be between 512 and 1048576",
        ));
    }
    for (field, value) in [
        ("--max-connections-per-source", args.max_connections_per_source),
        ("--max-pending", args.max_pending),
        ("--max-pending-per-source", args.max_pending_per_source),
        ("--max-connecting", args.max_connecting),
    ] {
        if value == 0 {
            return Err(bad(field, "0".into(), "must be at least 1"));
        }
    }
    if args.max_pending_bytes < args.max_hello_bytes {
        return Err(bad(
            "--max-pending-bytes",
            args.max_pending_bytes.to_string(),
            "must be at least --max-hello-bytes",
        ));
    }
    for (field, value) in [
        ("--idle-timeout-s", args.idle_timeout_s),
        ("--stall-timeout-s", args.stall_timeout_s),
    ] {
        if value == 0 {
            return Err(bad(field, "0".into(), "must be at least 1"));
        }
    }
    Ok(Limits {
        max_hello: args.max_hello_bytes,
        hello_timeout: Duration::from_millis(args.hello_timeout_ms.max(1)),
        connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
        max_connecting: args.max_connecting,
        timeouts: Timeouts {
            idle: Duration::from_secs(args.idle_timeout_s),
            stall: Duration::from_secs(args.stall_timeout_s),
        },
        transfer: if args.splice {
            Transfer::Splice
        } else {
            Transfer::Copy
        },
        caps: Caps {
            max_connections: args.max_connections,
            per_source: args.max_connections_per_source,
            max_pending: args.max_pending,
            pending_per_source: args.max_pending_per_source,
            pending_bytes: args.max_pending_bytes,
        },
        proxy_tenant_tlv: (args.proxy_tenant_tlv != 0).then_some(args.proxy_tenant_tlv),
    })
}

/// `0xE0`, `224`: a TLV type.
fn parse_tlv_type(v: &str) -> Result<u8, String> {
    let v = v.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => v.parse::<u8>(),
    };
    parsed.map_err(|_| format!("{v:?} is not a TLV type (0x00-0xFF)"))
}

/// The most connections by default, whatever the open-files limit allows.
const DEFAULT_MAX_CONNECTIONS: usize = 100_000;
/// Descriptors kept for everything but connections, pipes and listening sockets (admin, DNS,
/// the API server's connections, logs).
const RESERVED_FDS: u64 = 256;

/// Raises the soft limit on open files to the hard one, and fits `--max-connections` to it: two
/// descriptors per connection, after the `listening` descriptors of the listening sockets and
/// every thread's pipes with `--splice` (0: as many as fit, at most [`DEFAULT_MAX_CONNECTIONS`];
/// more than fit: lowered, with a warning).
fn fit_to_open_files(mut limits: Limits, threads: usize, listening: usize) -> Limits {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let open_files = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 1024,
    };
    let pipes = match limits.transfer {
        Transfer::Splice => u64::try_from(threads * pump::PIPES_PER_THREAD * 2).unwrap_or(u64::MAX),
        Transfer::Copy => 0,
    };
    let kept = RESERVED_FDS
        .saturating_add(pipes)
        .saturating_add(u64::try_from(listening).unwrap_or(u64::MAX));
    let fit = usize::try_from(open_files.saturating_sub(kept) / 2)
        .unwrap_or(usize::MAX)
        .max(1);
    let wanted = limits.caps.max_connections;
    limits.caps.max_connections = match wanted {
        0 => fit.min(DEFAULT_MAX_CONNECTIONS),
        n if n > fit => {
            warn!(
                max_connections = n,
                open_files, fit, "--max-connections needs more open files than allowed; lowered"
            );
            fit
        }
        n => n,
    };
    limits
}

/// The Kubernetes client for `--services`.
async fn kube_client(
    services: bool,
    kubeconfig: Option<&std::path::Path>,
) -> Result<Option<::kube::Client>, SniError> {
    if !services {
        return Ok(None);
    }
    let bad = |why: String| SniError::Config {
        field: "--kubeconfig",
        value: kubeconfig.map(|p| p.display().to_string()).unwrap_or_default(),
        why,
    };
    let config = crate::kube::config::load(kubeconfig)
        .await
        .map_err(|e| bad(e.with_path()))?;
    Ok(Some(
        ::kube::Client::try_from(config).map_err(|e| bad(e.to_string()))?,
    ))
}

/// The listening sockets of each of `threads` threads: every address once per thread, with
/// `SO_REUSEPORT` (the first socket of an address fixes its port, for `:0`). Each thread also
/// accepts from the next thread's socket (the last from the first's): the kernel spreads new
/// connections by a hash of their addresses, blind to how busy each thread is, and a connection
/// hashed to a busy thread is taken by its neighbour instead of waiting its turn. A new
/// connection wakes two threads whatever their number (with two threads, both: each accepts
/// from both sockets); the one that finds it taken gets EAGAIN.
fn bind_all(
    listen: &[SocketAddr],
    proxy_listen: &[SocketAddr],
    threads: usize,
) -> Result<Vec<Vec<(std::net::TcpListener, Kind)>>, SniError> {
    let mut per_thread: Vec<Vec<(std::net::TcpListener, Kind)>> =
        (0..threads.max(1)).map(|_| Vec::new()).collect();
    for (addrs, kind) in [(listen, Kind::Sni), (proxy_listen, Kind::Proxy)] {
        for addr in addrs {
            let mut bound = *addr;
            let mut sockets = Vec::with_capacity(per_thread.len());
            for _ in 0..per_thread.len() {
                let l = bind_shared(bound).map_err(|source| SniError::Bind { addr: *addr, source })?;
                bound = l
                    .local_addr()
                    .map_err(|source| SniError::Bind { addr: *addr, source })?;
                sockets.push(l);
            }
            // Each thread also accepts from the next thread's socket (a descriptor of it).
            let n = sockets.len();
            let next = (1..n)
                .chain((n > 1).then_some(0))
                .map(|i| sockets[i].try_clone())
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|source| SniError::Bind { addr: *addr, source })?;
            for (own, l) in per_thread.iter_mut().zip(sockets) {
                own.push((l, kind));
            }
            for (own, l) in per_thread.iter_mut().zip(next) {
                own.push((l, kind));
            }
        }
    }
    Ok(per_thread)
}

/// A non-blocking listening socket on `addr` that other sockets of this process may share.
fn bind_shared(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    // Accepted connections inherit them (Linux): no setsockopt per connection.
    socket.set_tcp_nodelay(true)?;
    socket.set_tcp_keepalive(&router::keepalive_settings())?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // As many as the kernel allows (somaxconn): a burst of new connections, an attack among
    // them, waits in the backlog instead of being dropped (a dropped SYN costs a client 1 s).
    socket.listen(4096)?;
    Ok(socket.into())
}

fn router_hosts(router: &Router) -> usize {
    router.routes().borrow().host_count()
}

/// Sets `backend_up` for every backend of `table` from the shared health.
fn publish_health(metrics: &Metrics, table: &RouteTable, health: &Health) {
    let now = health.now_ms();
    for set in table.sets() {
        for b in &set.backends {
            metrics.set_backend_up(&set.name, b.addr, b.is_up(now));
        }
    }
}

/// Re-reads the routes file when it changes and publishes the new routes; a file that does
/// not read or parse keeps the old routes (logged, counted).
async fn reload_loop(sources: Arc<Sources>, path: PathBuf, interval: Duration, shutdown: CancellationToken) {
    let mut last = std::fs::read_to_string(&path).ok();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let text = tokio::fs::read_to_string(&path).await.ok();
        if text.is_none() || text == last {
            if text.is_none() {
                warn!(path = %path.display(), "routes file unreadable; keeping the routes");
            }
            continue;
        }
        last = text;
        match load_file(&sources.flags, &path) {
            Ok(spec) => sources.set_file(spec),
            Err(error) => {
                warn!(%error, "routes file invalid; keeping the routes");
                sources
                    .metrics
                    .reload("invalid", sources.tx.borrow().host_count());
            }
        }
    }
}

/// The router's admin endpoints: plain on `admin_listen`, authenticated on `metrics_listen`.
struct AdminServers {
    admin_listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    metrics_tls: (Option<PathBuf>, Option<PathBuf>),
}

impl AdminServers {
    fn of(args: &ServeArgs) -> Self {
        Self {
            admin_listen: args.admin_listen,
            metrics_listen: args.metrics_listen,
            metrics_tls: (args.metrics_tls_cert.clone(), args.metrics_tls_key.clone()),
        }
    }

    async fn spawn(
        self,
        kube: Option<::kube::Client>,
        metrics: &Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> Result<(), SniError> {
        if let Some(addr) = self.admin_listen {
            crate::admin::warn_if_exposed("--admin-listen", addr);
            let l = TcpListener::bind(addr)
                .await
                .map_err(|source| SniError::Bind { addr, source })?;
            tokio::spawn(admin(l, Arc::clone(metrics), shutdown.clone()));
        }
        if let (Some(addr), Some(kube)) = (self.metrics_listen, kube) {
            let (cert, key) = &self.metrics_tls;
            let tls =
                crate::admin::tls::server_config(cert.as_deref(), key.as_deref(), &[addr.ip().to_string()])
                    .map_err(crate::admin::AdminError::from)?;
            let server =
                crate::admin::SecureServer::bind(addr, tls, crate::admin::Authorizer::new(kube)).await?;
            tokio::spawn(server.serve(metrics_app(Arc::clone(metrics)), shutdown.clone()));
        }
        Ok(())
    }
}

/// `/metrics` alone (the authenticated metrics server's route).
fn metrics_app(metrics: Arc<Metrics>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let m = Arc::clone(&metrics);
            async move { m.encode() }
        }),
    )
}

/// The admin server: `/metrics`, `/health`, `/ready`.
async fn admin(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    use axum::routing::get;
    let app = metrics_app(metrics)
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(|| async { "ok" }));
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        warn!(%error, "admin server stopped");
    }
}

#[cfg(test)]
mod tests;
