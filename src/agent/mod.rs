//! `baton agent`: makes a control-plane node accept the packets the cloud routes to it for a
//! control-plane Floating IP. Cherry Servers delivers a FIP's packets with the FIP as their
//! destination; the agent keeps one nftables rule per FIP in the prerouting hook, `daddr FIP
//! redirect`, which rewrites the destination to the address the packet arrived on (ports kept),
//! where the API server listens. On the FIP's holder (the FIP table names one of this node's
//! addresses as its holder) it also keeps `daddr FIP dnat to <that address>` in the output hook: the node's own packets for its FIP would come back
//! from the cloud's router with the node's own source address, and be dropped.
//! docs/agent.md says why this way and not another.
//!
//! ```text
//!  --fip (static) ───────────────────────────────────────┐
//!  FIP table (watch.rs; table.rs, pure) ─► FIPs+holders ──┼─► plan.rs: wanted(), plan() ─► InSync
//!  kernel state at start (kept until listed) ─────────────┤        ▲                  └─► Replace
//!  this node's addresses (getifaddrs, every pass) ────────┘        │ read back                │
//!  netlink.rs (NETLINK_NETFILTER socket) ◄── nft.rs (pure encoder/decoder) ◄──────────────────┘
//!     table ip|ip6 baton: chain prerouting (nat, hook prerouting, priority -100), one rule
//!     per FIP; chain output (nat, hook output, priority -100), one rule per FIP held here;
//!     replaced in one transaction; re-read every --recheck-interval-ms
//!  admin.rs: /health /ready /metrics on --health-listen
//! ```
//!
//! The FIP table is the ConfigMap `<prefix>-control-plane-fips` that only the controller's leader
//! writes, with the FIPs it validated (this cluster's, from allowed namespaces): the agent reads
//! no Service, so nothing a tenant writes changes this node's NAT.
//!
//! On exit the rules stay (a restart must not drop traffic); `--cleanup` removes the tables.

pub mod admin;
pub mod boot;
pub mod netlink;
pub mod nft;
pub mod plan;
pub mod state;
pub mod table;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, info, warn};

use self::admin::{Health, Metrics};
use self::netlink::KernelError;
use self::plan::{Observed, Pairs, Plan, Source, Wanted};
use self::table::FipSet;

/// Flags of `baton agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// A Floating IP to accept whatever the FIP table says, e.g. for an installer that needs it
    /// before the controller runs. Repeatable; comma-separated in the environment variable.
    #[arg(long, env = "BATON_AGENT_FIP", value_name = "IP", value_delimiter = ',')]
    pub fip: Vec<IpAddr>,

    /// Do not watch the FIP table: accept only the `--fip` addresses (a node without a cluster
    /// yet, or a systemd unit).
    #[arg(long, env = "BATON_AGENT_NO_KUBE")]
    pub no_kube: bool,

    /// Remove baton's nftables tables (`ip baton`, `ip6 baton`) and exit: the uninstall step.
    #[arg(long, env = "BATON_AGENT_CLEANUP", conflicts_with = "boot")]
    pub cleanup: bool,

    /// Keep the node's own copy of what it accepts here: `<DIR>/agent/fips.json` (the FIPs and
    /// their holders, rewritten atomically when the FIP table changes) and `<DIR>/bin/baton`
    /// (this binary, for the boot unit). Unset: no node file, nothing for `--boot` to restore.
    #[arg(long, env = "BATON_AGENT_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Where `--boot` records this boot's boot deliveries (`<DIR>/boot.json`): a tmpfs, so that
    /// the record ends with the boot.
    #[arg(
        long,
        env = "BATON_AGENT_RUN_DIR",
        default_value = "/run/baton",
        value_name = "DIR"
    )]
    pub run_dir: PathBuf,

    /// At boot, before the kubelet and without any API server (systemd/baton-agent-boot.service):
    /// accept every FIP of the node file, send the node's own packets for them to its own API
    /// server until their holder answers (the agent ends that later), and exit.
    #[arg(long, env = "BATON_AGENT_BOOT")]
    pub boot: bool,

    /// kubeconfig of this node's API server (default: in-cluster, then `KUBECONFIG` /
    /// `~/.kube/config`). Never the FIP.
    #[arg(long, env = "BATON_AGENT_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Name prefix of baton's objects, as for `baton controller`: the FIP table is the ConfigMap
    /// `<prefix>-control-plane-fips`.
    #[arg(long, env = "BATON_PREFIX", default_value = "baton", value_name = "PREFIX")]
    pub prefix: String,

    /// The controller's namespace (its Lease's), where the FIP table is.
    #[arg(
        long,
        env = "BATON_LEASE_NAMESPACE",
        default_value = "kube-system",
        value_name = "NAMESPACE"
    )]
    pub namespace: String,

    /// Listen address of `/health`, `/ready` and `/metrics`; `off` disables it.
    #[arg(
        long,
        env = "BATON_AGENT_HEALTH_LISTEN",
        default_value = "127.0.0.1:9594",
        value_name = "ADDR|off"
    )]
    pub health_listen: String,

    /// How often the kernel's table is read back (and restored if something changed it), in
    /// milliseconds.
    #[arg(
        long,
        env = "BATON_AGENT_RECHECK_INTERVAL_MS",
        default_value_t = 10_000,
        value_name = "MS"
    )]
    pub recheck_interval_ms: u64,
}

/// Errors of `baton agent`.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{field} {value}: {why}")]
    Config {
        field: &'static str,
        value: String,
        why: String,
    },
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    TooOld(#[from] crate::kube::version::TooOld),
    #[error("health server on {addr}: {source}")]
    Health {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error("restoring the FIP rules: {0}")]
    Restore(#[from] PutError),
}

impl AgentError {
    /// Whether the error is bad input (exit code 2) rather than a runtime failure.
    pub fn is_config(&self) -> bool {
        matches!(self, Self::Config { .. } | Self::KubeConfig(_))
    }
}

/// The flags, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub fips: BTreeSet<IpAddr>,
    /// The FIP table, `(namespace, name)`; `None`: `--no-kube`.
    pub table: Option<(String, String)>,
    pub cleanup: bool,
    pub boot: bool,
    pub state_dir: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    pub health_listen: Option<SocketAddr>,
    pub recheck: Duration,
}

/// The shortest `--recheck-interval-ms`.
const MIN_RECHECK_MS: u64 = 100;

impl Settings {
    /// Checks the flags; a bad one is named with its value.
    pub fn from_args(args: &AgentArgs) -> Result<Self, AgentError> {
        let bad = |field, value: String, why: String| AgentError::Config { field, value, why };
        let mut fips = BTreeSet::new();
        for ip in &args.fip {
            table::usable(*ip).map_err(|why| {
                bad(
                    "--fip",
                    ip.to_string(),
                    format!("cannot be a Floating IP ({why})"),
                )
            })?;
            fips.insert(*ip);
        }
        if args.no_kube && fips.is_empty() && !args.cleanup && !args.boot {
            return Err(bad(
                "--no-kube",
                "true".into(),
                "without the FIP table the agent needs at least one --fip".into(),
            ));
        }
        let prefix = &args.prefix;
        if !baton_core::names::is_dns1123_label(prefix) || prefix.len() > 43 {
            return Err(bad(
                "--prefix",
                prefix.clone(),
                "must be a lowercase DNS label of at most 43 characters".into(),
            ));
        }
        if !baton_core::names::is_dns1123_label(&args.namespace) {
            return Err(bad(
                "--namespace",
                args.namespace.clone(),
                "must be a namespace name (a lowercase DNS label)".into(),
            ));
        }
        let health_listen = match args.health_listen.as_str() {
            "off" => None,
            v => Some(
                v.parse()
                    .map_err(|_| bad("--health-listen", v.to_owned(), "expected IP:port or off".into()))?,
            ),
        };
        if args.recheck_interval_ms < MIN_RECHECK_MS {
            return Err(bad(
                "--recheck-interval-ms",
                args.recheck_interval_ms.to_string(),
                format!("must be at least {MIN_RECHECK_MS}"),
            ));
        }
        if args.boot && args.state_dir.is_none() {
            return Err(bad(
                "--boot",
                "true".into(),
                "needs --state-dir (BATON_AGENT_STATE_DIR), where the agent keeps the node file".into(),
            ));
        }
        for (field, dir) in [
            ("--state-dir", args.state_dir.as_ref()),
            ("--run-dir", Some(&args.run_dir)),
        ] {
            if let Some(dir) = dir
                && !dir.is_absolute()
            {
                return Err(bad(
                    field,
                    dir.display().to_string(),
                    "must be an absolute path".into(),
                ));
            }
        }
        Ok(Self {
            fips,
            table: (!args.no_kube).then(|| (args.namespace.clone(), crate::names::fip_table_name(prefix))),
            cleanup: args.cleanup,
            boot: args.boot,
            state_dir: args.state_dir.clone(),
            run_dir: args.run_dir.clone(),
            kubeconfig: args.kubeconfig.clone(),
            health_listen,
            recheck: Duration::from_millis(args.recheck_interval_ms),
        })
    }
}

/// Runs the agent until SIGTERM/SIGINT (or, with `--cleanup`, removes the tables).
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    let signal = crate::signal::shutdown();
    tokio::spawn(async move {
        signal.await;
        on_signal.cancel();
    });
    run_until(&args, shutdown).await
}

/// Runs the agent until `shutdown` is cancelled.
pub async fn run_until(args: &AgentArgs, shutdown: CancellationToken) -> Result<(), AgentError> {
    let settings = Settings::from_args(args)?;
    if settings.cleanup {
        let removed = netlink::run(netlink::Socket::remove_all).await?;
        let tables: Vec<String> = removed.iter().map(|f| format!("{f} {}", nft::TABLE)).collect();
        info!(tables = %tables.join(", "), "baton's nftables tables removed");
        return Ok(());
    }
    // Settings::from_args makes sure --boot comes with --state-dir.
    if let (true, Some(dir)) = (settings.boot, &settings.state_dir) {
        return boot::run(dir, &settings).await;
    }
    let upstream = match &settings.table {
        Some(_) => Some(kube_client(settings.kubeconfig.as_deref()).await?),
        None => None,
    };
    // Whatever the kernel accepts now stays until the FIP table is listed.
    let at_start = plan::accepted(&netlink::run(netlink::Socket::read).await?);
    info!(
        version = env!("CARGO_PKG_VERSION"),
        fips = %list(&settings.fips),
        kept = %list(&at_start.fips),
        held_here = %Pairs(&at_start.held),
        table = upstream.is_some(),
        state_dir = %settings.state_dir.as_ref().map_or_else(|| "-".into(), |d| d.display().to_string()),
        "baton agent starting"
    );
    let status = upstream.as_ref().map(|_| Arc::new(watch::WatchStatus::default()));
    let health = Arc::new(Health::new(status.clone()));
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = settings.health_listen {
        let listener = admin::bind(addr)
            .await
            .map_err(|source| AgentError::Health { addr, source })?;
        tokio::spawn(
            admin::serve(
                listener,
                Arc::clone(&health),
                Arc::clone(&metrics),
                shutdown.clone(),
            )
            .instrument(tracing::info_span!("health")),
        );
    }
    let keeper = Keeper::start(&settings, upstream.as_ref(), &shutdown);
    let (tx, rx) = tokio::sync::watch::channel(upstream.is_none().then(FipSet::default));
    // With --no-kube nobody sends; the sender lives as long as the loop.
    // The version floor (crate::kube::version): read beside the loop, which keeps what the
    // kernel holds meanwhile (an API server that does not answer yet costs no rule); below 1.30
    // the agent stops with the reason before it watches the table.
    let stop = shutdown.child_token();
    let (refused_tx, mut refused_rx) = tokio::sync::oneshot::channel();
    let _no_watch = match (upstream, settings.table.clone(), status) {
        (Some(upstream), Some((namespace, name)), Some(status)) => {
            let h = Arc::clone(&health);
            let stop = stop.clone();
            let client = upstream.client;
            tokio::spawn(
                async move {
                    let version = tokio::select! {
                        () = stop.cancelled() => return,
                        v = crate::kube::version::read_and_check(&client) => v,
                    };
                    if let Err(too_old) = version {
                        error!("{too_old}");
                        let _ = refused_tx.send(too_old);
                        stop.cancel();
                        return;
                    }
                    watch::watch_table(client, namespace, name, tx, status, stop).await;
                    h.watch_ended();
                }
                .instrument(tracing::info_span!("fip_table")),
            );
            None
        }
        _ => Some(tx),
    };
    let inputs = Inputs {
        fixed: settings.fips,
        at_start,
    };
    reconcile(inputs, keeper, rx, (&health, &metrics), settings.recheck, &stop).await;
    if let Ok(too_old) = refused_rx.try_recv() {
        return Err(too_old.into());
    }
    info!("stopping; the FIP rules stay in place");
    Ok(())
}

/// The agent's API server: the client for the FIP table watch, and what the boot phase needs
/// of it (its address, this node's own API server by the manifest's design, and its CA).
struct Upstream {
    client: kube::Client,
    /// The API server's address, when the configuration names it by IP.
    address: Option<IpAddr>,
    port: u16,
    ca_der: Vec<Vec<u8>>,
}

/// The client for the FIP table watch.
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<Upstream, AgentError> {
    let config = crate::kube::config::load(kubeconfig)
        .await
        .map_err(|e| AgentError::KubeConfig(e.with_path()))?;
    let address = config.cluster_url.host().and_then(|h| {
        h.trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok()
    });
    let port = config.cluster_url.port_u16().unwrap_or(443);
    let ca_der = config.root_cert.clone().unwrap_or_default();
    let client = kube::Client::try_from(config).map_err(|e| AgentError::KubeConfig(e.to_string()))?;
    Ok(Upstream {
        client,
        address,
        port,
        ca_der,
    })
}

/// What the wanted set is made of, besides the FIP table and this node's addresses.
struct Inputs {
    fixed: BTreeSet<IpAddr>,
    /// What the kernel held when the agent started (kept until the FIP table is listed).
    at_start: Wanted,
}

/// What the agent keeps beside the kernel's tables: the node file (with `--state-dir`) and the
/// boot phase (when `--boot` recorded boot deliveries at this boot).
struct Keeper {
    /// `<state-dir>/agent/fips.json` and what it holds now (as read at start, then as written).
    node_file: Option<(PathBuf, Option<state::NodeFile>)>,
    /// This node's API server's address (see [`Upstream`]), recorded in the node file.
    node_address: Option<IpAddr>,
    boot: Option<BootPhase>,
}

impl Keeper {
    fn start(settings: &Settings, upstream: Option<&Upstream>, shutdown: &CancellationToken) -> Self {
        let Some(dir) = &settings.state_dir else {
            return Self {
                node_file: None,
                node_address: None,
                boot: None,
            };
        };
        match state::install_self(&dir.join(state::BOOT_BINARY)) {
            Ok(true) => {
                info!(path = %dir.join(state::BOOT_BINARY).display(), "boot binary installed for the boot unit");
            }
            Ok(false) => {}
            Err(error) => {
                warn!(%error, "the boot binary was not installed: the boot unit runs an older one, or none");
            }
        }
        let path = dir.join(state::NODE_FILE);
        let known = state::load::<state::NodeFile>(&path).unwrap_or_else(|error| {
            warn!(%error, "the node file cannot be read; the agent writes it anew");
            None
        });
        let node_address = upstream
            .and_then(|u| u.address)
            .filter(|a| table::usable(*a).is_ok());
        if upstream.is_some() && node_address.is_none() {
            warn!(
                "the agent's API server is not named by a usable IP address: the node file names no address, so at boot this node's own packets for its FIPs are not delivered to its own API server"
            );
        }
        let boot = upstream.and_then(|u| BootPhase::start(&settings.run_dir, u, shutdown));
        Self {
            node_file: Some((path, known)),
            node_address,
            boot,
        }
    }

    /// Records `want` (what the kernel is to hold now, without boot deliveries) in the node file
    /// when it differs from what the file holds.
    fn save(&mut self, want: &Wanted, table: &FipSet, metrics: &Metrics) {
        let Some((path, known)) = &mut self.node_file else {
            return;
        };
        let file = state::NodeFile::of(want, table, self.node_address);
        if known.as_ref() == Some(&file) {
            return;
        }
        match state::save(path, &file) {
            Ok(()) => {
                info!(path = %path.display(), fips = %list(&want.fips), "node file written (restored at boot)");
                *known = Some(file);
                metrics.node_file_written(true);
            }
            Err(error) => {
                warn!(%error, "the node file was not written: at the next boot the node restores an older set");
                metrics.node_file_written(false);
            }
        }
    }
}

/// The boot deliveries `--boot` made at this boot, and the probes of the holders that end them.
struct BootPhase {
    /// The deliveries still standing, as `marker` records them.
    deliveries: state::BootMarker,
    marker: PathBuf,
    /// `/readyz` of the holders the FIP table names (`None`: no CA to verify them with).
    prober: Option<crate::probe::Prober>,
    port: u16,
    /// The last reason each delivery stays, logged when it changes.
    told: BTreeMap<IpAddr, boot::Why>,
}

impl BootPhase {
    fn start(run_dir: &std::path::Path, upstream: &Upstream, shutdown: &CancellationToken) -> Option<Self> {
        let marker = run_dir.join(state::BOOT_MARKER);
        let deliveries = match state::load::<state::BootMarker>(&marker) {
            Ok(Some(m)) if !m.delivered.is_empty() => m,
            Ok(_) => return None,
            Err(error) => {
                warn!(%error, "the boot marker cannot be read: no boot delivery is kept");
                return None;
            }
        };
        info!(delivered = %Pairs(&deliveries.delivered), "boot phase: this node's own packets for these FIPs go to its own API server until their holder answers");
        let prober = if upstream.ca_der.is_empty() {
            warn!(
                "no cluster CA in the agent's configuration: holders cannot be probed, so a boot delivery ends only when this node holds the FIP or the FIP leaves the table"
            );
            None
        } else {
            Some(crate::probe::Prober::with_shutdown(
                crate::probe::ProbeSettings {
                    path: "/readyz".into(),
                    server_name: crate::kube::args::API_SERVER_NAME.into(),
                    ca_der: upstream.ca_der.clone(),
                    interval: Duration::from_millis(500),
                    timeout: Duration::from_secs(1),
                    thresholds: baton_core::health::Thresholds { rise: 2, fall: 2 },
                },
                Arc::new(()),
                shutdown.child_token(),
            ))
        };
        Some(Self {
            deliveries,
            marker,
            prober,
            port: upstream.port,
            told: BTreeMap::new(),
        })
    }

    fn health(
        &self,
    ) -> Option<tokio::sync::watch::Receiver<BTreeMap<SocketAddr, baton_core::health::Health>>> {
        self.prober.as_ref().map(crate::probe::Prober::subscribe)
    }

    /// Ends the deliveries whose holder is known now (boot::resolve), records what stands, and
    /// probes the holders of the rest.
    fn step(&mut self, table: Option<&FipSet>, local: &BTreeSet<IpAddr>) {
        let port = self.port;
        let fates = boot::resolve(&self.deliveries.delivered, table, local, |h| {
            self.prober
                .as_ref()
                .is_some_and(|p| p.health(&SocketAddr::new(h, port)) == baton_core::health::Health::Up)
        });
        let mut ended = false;
        for (fip, fate) in fates {
            match fate {
                boot::Fate::End(why) => {
                    info!(%fip, %why, "boot delivery ended: this node's own packets for the FIP follow the FIP table again");
                    self.deliveries.delivered.remove(&fip);
                    self.told.remove(&fip);
                    ended = true;
                }
                boot::Fate::Keep(why) => {
                    if self.told.get(&fip) != Some(&why) {
                        info!(%fip, %why, "boot delivery stays");
                        self.told.insert(fip, why);
                    }
                }
            }
        }
        if ended && let Err(error) = self.deliveries.store(&self.marker) {
            warn!(%error, "the boot marker was not updated: a restarted agent keeps deliveries that ended");
        }
        let targets: Vec<SocketAddr> = table
            .map(|t| {
                self.deliveries
                    .delivered
                    .keys()
                    .filter_map(|fip| t.holders.get(fip))
                    .flatten()
                    .filter(|h| !local.contains(h))
                    .map(|h| SocketAddr::new(*h, port))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect()
            })
            .unwrap_or_default();
        if let Some(p) = &mut self.prober
            && let Err(error) = p.set_targets(&targets)
        {
            warn!(%error, "probing the FIPs' holders failed");
        }
    }
}

/// Keeps the kernel's tables equal to the wanted FIPs: at once when they change, and every
/// `recheck` (someone may flush the ruleset, this node's addresses may change); after a failure
/// again within a second, doubling up to `recheck`. A boot phase's holder probes wake it too.
async fn reconcile(
    inputs: Inputs,
    mut keeper: Keeper,
    mut rx: tokio::sync::watch::Receiver<Option<FipSet>>,
    (health, metrics): (&Health, &Metrics),
    recheck: Duration,
    shutdown: &CancellationToken,
) {
    let first_retry = Duration::from_millis(500).min(recheck);
    let mut retry = first_retry;
    let mut applied: Option<Wanted> = None;
    let mut open = true;
    let mut probes = keeper.boot.as_ref().and_then(BootPhase::health);
    loop {
        let table = rx.borrow_and_update().clone();
        let pause = if once(
            &inputs,
            &mut keeper,
            table.as_ref(),
            &mut applied,
            (health, metrics),
        )
        .await
        {
            retry = first_retry;
            recheck
        } else {
            let p = retry;
            retry = (retry * 2).min(recheck);
            p
        };
        if keeper.boot.is_none() {
            probes = None;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = async { if open { rx.changed().await } else { std::future::pending().await } } => {
                open = changed.is_ok();
            }
            () = async {
                match probes.as_mut() {
                    Some(p) => { if p.changed().await.is_err() { std::future::pending::<()>().await } }
                    None => std::future::pending().await,
                }
            } => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// One pass: read the kernel and this node's addresses, replace what differs, read it back.
/// True when the kernel holds what is wanted.
async fn once(
    inputs: &Inputs,
    keeper: &mut Keeper,
    table: Option<&FipSet>,
    applied: &mut Option<Wanted>,
    (health, metrics): (&Health, &Metrics),
) -> bool {
    let (observed, local) = match netlink::run(|s| Ok((s.read()?, netlink::local_addresses()?))).await {
        Ok(o) => o,
        Err(error) => {
            warn!(%error, "reading the FIP rules failed");
            health.failed(error.to_string());
            return false;
        }
    };
    let source = table.map_or(Source::HeldAtStart(&inputs.at_start), Source::Table);
    let mut want = plan::wanted(&inputs.fixed, &source, &local);
    if let Some(t) = table {
        keeper.save(&want, t, metrics);
    }
    if let Some(b) = &mut keeper.boot {
        b.step(table, &local);
        want = boot::with_boot(want, &b.deliveries.delivered, &local);
        metrics.set_boot_deliveries(b.deliveries.delivered.len());
        if b.deliveries.delivered.is_empty() {
            info!("boot phase over: every FIP's holder is known and answers (or is this node)");
            keeper.boot = None;
        }
    }
    let want = &want;
    let Plan::Replace {
        families,
        added,
        removed,
        now_held,
        no_longer_held,
        reasons,
    } = plan::plan(want, &observed)
    else {
        metrics.observe(&observed, true);
        health.in_sync();
        if applied.as_ref() != Some(want) {
            info!(fips = %list(&want.fips), held_here = %Pairs(&want.held), "FIP acceptance in place");
            *applied = Some(want.clone());
        }
        return true;
    };
    if applied.as_ref() == Some(want) {
        warn!(why = %reasons.join("; "), "baton's nftables table changed under the agent; restoring it");
        metrics.repaired();
    }
    let result = put(want, families).await;
    metrics.updated(!matches!(result, Err(PutError::Kernel(_))));
    match result {
        Ok(after) => metrics.observe(&after, true),
        Err(PutError::Kernel(error)) => {
            error!(
                %error,
                added = %list(&added),
                removed = %list(&removed),
                now_held = %list(&now_held),
                no_longer_held = %list(&no_longer_held),
                "FIP acceptance not updated"
            );
            health.failed(error.to_string());
            metrics.observe(&observed, false);
            return false;
        }
        Err(error @ PutError::Differs { .. }) => {
            if let PutError::Differs { after, .. } = &error {
                metrics.observe(after, false);
            }
            warn!(why = %error, "FIP acceptance not updated");
            health.failed(error.to_string());
            return false;
        }
    }
    info!(
        added = %list(&added),
        removed = %list(&removed),
        now_held = %list(&now_held),
        no_longer_held = %list(&no_longer_held),
        fips = %list(&want.fips),
        held_here = %Pairs(&want.held),
        "FIP acceptance updated"
    );
    health.in_sync();
    *applied = Some(want.clone());
    true
}

/// Why the kernel does not hold what [`put`] was to write.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The transaction went through, yet the tables read back differ.
    #[error("after the update the kernel still differs: {}", .reasons.join("; "))]
    Differs { reasons: Vec<String>, after: Observed },
}

/// Replaces baton's tables of `families` with `want` in one transaction and reads them back:
/// what the kernel holds then, or why it does not hold `want`. The one writer of the agent's
/// tables (the agent's passes, `--boot`, `baton claim`).
pub async fn put(want: &Wanted, families: Vec<nft::Family>) -> Result<Observed, PutError> {
    let w = want.clone();
    let after = netlink::run(move |s| {
        s.replace(&w, &families)?;
        s.read()
    })
    .await?;
    match plan::plan(want, &after) {
        Plan::InSync => Ok(after),
        Plan::Replace { reasons, .. } => Err(PutError::Differs { reasons, after }),
    }
}

/// `a, b, c` (or `-`).
fn list(ips: &BTreeSet<IpAddr>) -> String {
    if ips.is_empty() {
        return "-".into();
    }
    ips.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;
