//! `baton bootstrap`: carries the API endpoint from reserved Floating IPs to the running
//! cluster, on the bootstrap host (seed 002, "Kubernetes Service Owned API Loadbalancers").
//!
//! ```text
//!  config.rs ─▶ BootstrapConfig ─┐               state.rs (facts, atomic file)
//!                                ▼                     ▲ │
//!  loop { step = next_step(state, observations) ───────┘ │  (pure, unit-tested)
//!         run step ─────────────────────────────────────┘ }
//!
//!  1 reserve-fips       steps::resolve_fip       (cloud; found by tag/address, or reserved + tagged)
//!  2 publish-dns        dns::Publisher + dns::spawn_sync ◀── health.rs (/readyz of every address)
//!  3 wait-for-api       steps::api_ready          (the bootstrap API server, via the kubeconfig)
//!  4 handoff            steps::apply_services + apply_manifests (server-side apply)
//!  5 wait-for-services  steps::service_readiness  (ingress = FIP, a ready endpoint, FIP serves)
//!  6 drop-bootstrap     the bootstrap address leaves DNS (pushed, in rfc2136 mode)
//!  7 drain              one TTL, so no client still holds it
//!  8 complete           summary; DNS keeps serving until stopped (or --exit-when-complete)
//!                       progress.rs reports every step (terminal, plain, json, status file, sd_notify)
//! ```
//!
//! Every step is idempotent, and the state file records what is settled, so a run killed at any
//! instant continues where it stopped and never reserves a second FIP or duplicates an object.

pub mod config;
pub mod dns;
pub mod health;
pub mod progress;
pub mod state;
pub mod steps;

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::{CherryClient, Cloud};
use baton_core::health::Thresholds;
use baton_dns::RecordStore;
use clap::Args;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::config::{BootstrapConfig, ConfigFileError, Endpoint};
use self::dns::{NameAddrs, Publisher};
use self::health::{HealthChecker, HealthError, ProbeSettings, is_up};
use self::progress::{OutputMode, Reporter, ServiceProgress};
use self::state::{FipRecord, State, StateError, StateFile, Step, now_ms};
use self::steps::Readiness;
use crate::config::{ConfigArgs, Env};

pub use crate::exit::bootstrap as exit;

/// `baton bootstrap` arguments. Cloud settings come as in every subcommand (flag > env >
/// `--cloud-config` file > the config file's `cloud:` section > default).
#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// The bootstrap config file (YAML or JSON; see docs/bootstrap.md).
    #[arg(long, short = 'c', env = "BATON_BOOTSTRAP_CONFIG", value_name = "PATH")]
    pub config: PathBuf,
    /// Where progress is saved, so a rerun continues (overrides `stateFile`).
    #[arg(long, env = "BATON_BOOTSTRAP_STATE_FILE", value_name = "PATH")]
    pub state_file: Option<PathBuf>,
    /// Also write the current step and each Service's progress to this JSON file.
    #[arg(long, env = "BATON_BOOTSTRAP_STATUS_FILE", value_name = "PATH")]
    pub status_file: Option<PathBuf>,
    /// Progress output: a live view on a terminal, timestamped lines, or JSON events on stdout.
    #[arg(long, env = "BATON_BOOTSTRAP_OUTPUT", value_enum, default_value_t = OutputMode::Auto)]
    pub output: OutputMode,
    /// Exit once complete, instead of serving DNS until stopped.
    #[arg(long, env = "BATON_BOOTSTRAP_EXIT_WHEN_COMPLETE")]
    pub exit_when_complete: bool,
    /// Kubeconfig of the bootstrap API server (overrides `kubernetes.kubeconfig`).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Validate the config file (and the cloud settings) and exit, touching nothing.
    #[arg(long)]
    pub check_config: bool,
    #[command(flatten)]
    pub cloud: ConfigArgs,
}

/// Why `baton bootstrap` stopped. Each variant names the step or field; none carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
    #[error(transparent)]
    CloudConfig(#[from] crate::config::ConfigError),
    #[error("invalid bootstrap config {}: {field}: {message}", path.display())]
    Field {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("timed out after {} waiting for {what}{}", baton_core::duration::format_duration(*after), last.as_ref().map(|l| format!(" (last: {l})")).unwrap_or_default())]
    Timeout {
        what: String,
        after: Duration,
        last: Option<String>,
    },
    #[error("cloud: {step}: {source}")]
    Cloud {
        step: String,
        #[source]
        source: baton_cloud::CloudError,
    },
    #[error("cloud: {0}")]
    CloudState(String),
    #[error("Kubernetes: {step}: {source}")]
    Kube {
        step: String,
        #[source]
        source: kube::Error,
    },
    #[error("handoff manifest {origin}: {reason}")]
    Manifest { origin: String, reason: String },
    #[error("DNS: {0}")]
    Dns(#[from] baton_dns::DnsError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Health(#[from] HealthError),
    #[error("interrupted during step {0}; the state file is saved, run `baton bootstrap` again to continue")]
    Interrupted(Step),
}

impl BootstrapError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::ConfigFile(_)
            | Self::CloudConfig(_)
            | Self::Field { .. }
            | Self::Health(_)
            | Self::Manifest { .. }
            | Self::Dns(baton_dns::DnsError::Config(_) | baton_dns::DnsError::Name(_))
            | Self::Cloud {
                source: baton_cloud::CloudError::Config(_),
                ..
            } => exit::CONFIG,
            Self::Timeout { .. } => exit::TIMEOUT,
            Self::Cloud { .. } | Self::CloudState(_) => exit::CLOUD,
            Self::Kube { .. } => exit::KUBERNETES,
            Self::Dns(_) => exit::DNS,
            Self::State(_) => exit::FAILURE,
            Self::Interrupted(_) => exit::INTERRUPTED,
        }
    }

    /// A stable category for the summary and logs.
    pub fn category(&self) -> &'static str {
        match self.exit_code() {
            exit::CONFIG => "config",
            exit::TIMEOUT => "timeout",
            exit::CLOUD => "cloud",
            exit::KUBERNETES => "kubernetes",
            exit::DNS => "dns",
            exit::INTERRUPTED => "interrupted",
            _ => "failure",
        }
    }
}

/// What this process has observed (not persisted: a rerun observes again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observations {
    /// Every endpoint's FIP is resolved in this process.
    pub fips_resolved: bool,
    /// DNS publishing runs in this process.
    pub dns_running: bool,
    /// The bootstrap API server answered `/readyz`.
    pub api_ready: bool,
    /// Now (Unix ms).
    pub now_ms: u64,
}

/// The next step, from the persistent facts and this process's observations.
pub fn next_step(state: &State, obs: &Observations, ttl: Duration) -> Step {
    if !obs.fips_resolved {
        return Step::ReserveFips;
    }
    if !obs.dns_running {
        return Step::PublishDns;
    }
    if state.completed_at.is_some() {
        return Step::Complete;
    }
    if let Some(dropped) = state.bootstrap_dropped_at {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        return if obs.now_ms >= dropped.saturating_add(ttl_ms) {
            Step::Complete
        } else {
            Step::Drain
        };
    }
    if state.services_ready_at.is_some() {
        return Step::DropBootstrap;
    }
    if state.handoff_applied_at.is_some() {
        return Step::WaitForServices;
    }
    if !obs.api_ready {
        return Step::WaitForApi;
    }
    Step::Handoff
}

/// Runs `baton bootstrap`: the steps, then (unless `--exit-when-complete`) serves DNS until
/// SIGTERM/SIGINT. Prints the summary; returns the error that decides the exit code.
pub async fn run(args: BootstrapArgs, env: &dyn Env) -> Result<(), BootstrapError> {
    let token = CancellationToken::new();
    let signals = spawn_signal_handler(token.clone());
    let reporter = Arc::new(Reporter::new(args.output, args.status_file.clone()));
    let mut runner = None;
    let result = async {
        let r = Runner::new(&args, env, reporter.clone(), token.clone())?;
        if args.check_config {
            r.check().await?;
            return Ok(());
        }
        runner = Some(r);
        match runner.as_mut() {
            Some(r) => r.run_steps().await,
            None => Ok(()),
        }
    }
    .await;
    if let Some(r) = runner.as_ref() {
        // Every DNS change so far is reported before the summary (the reporter task may lag);
        // when the process ends with the summary, none after it.
        r.report_dns();
        if args.exit_when_complete || result.is_err() {
            reporter.mute_dns();
        }
    }
    let summary = summary(runner.as_ref(), &reporter, &result, args.check_config);
    reporter.finish(&summary);
    if result.is_ok() && !args.exit_when_complete && !args.check_config && runner.is_some() {
        reporter.event(
            "serving",
            "serving DNS until stopped (SIGTERM); the bootstrap control plane may stop now",
            json!({}),
        );
        token.cancelled().await;
        drop(runner);
    }
    signals.abort();
    result
}

fn spawn_signal_handler(token: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(error) => {
                warn!(%error, "cannot install the SIGTERM handler");
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("signal received; stopping");
        token.cancel();
    })
}

struct Runner {
    cfg: BootstrapConfig,
    cloud_cfg: crate::config::Config,
    kubeconfig: Option<PathBuf>,
    /// The bootstrap API server's URL, once the kubeconfig is loaded.
    api_url: Option<String>,
    reporter: Arc<Reporter>,
    token: CancellationToken,
    state_file: StateFile,
    state: State,
    resumed: bool,
    resolved: Vec<(Endpoint, FipRecord)>,
    cloud: Option<Arc<dyn Cloud>>,
    kube: Option<kube::Client>,
    health: Option<Arc<HealthChecker>>,
    store: RecordStore,
    dropped: watch::Sender<bool>,
    publisher: Option<Publisher>,
    api_ready: bool,
}

impl Runner {
    fn new(
        args: &BootstrapArgs,
        env: &dyn Env,
        reporter: Arc<Reporter>,
        token: CancellationToken,
    ) -> Result<Self, BootstrapError> {
        let mut cfg = BootstrapConfig::load(&args.config)?;
        if let Some(p) = &args.state_file {
            cfg.state_file.clone_from(p);
        }
        // `cloud.configFile` names a cloud-sa.json; it ranks like --cloud-config, below it.
        let mut cloud_args = args.cloud.clone();
        let mut object = cfg.cloud.clone();
        if let Some(file) = object.remove("configFile") {
            let Some(file) = file.as_str().filter(|f| !f.is_empty()) else {
                return Err(BootstrapError::Field {
                    path: cfg.path.clone(),
                    field: "cloud.configFile".into(),
                    message: "must be a path".into(),
                });
            };
            let file = PathBuf::from(file);
            let file = if file.is_absolute() {
                file
            } else {
                cfg.path.parent().map_or(file.clone(), |d| d.join(&file))
            };
            if crate::config::cloud_config_path(&cloud_args, env).is_none() {
                cloud_args.cloud_config = Some(file);
            }
        }
        let cloud_cfg = crate::config::Config::resolve_with_object(&cloud_args, env, &cfg.path, object)?;
        for key in &cloud_cfg.unknown_file_keys {
            warn!(key, "unknown cloud setting in the config is ignored");
        }
        // Required now, so a bad config fails before anything happens.
        cloud_cfg.cloud_client_config()?;
        if cfg.reserves() && cloud_cfg.region.is_none() {
            return Err(BootstrapError::Field {
                path: cfg.path.clone(),
                field: "cloud.region".into(),
                message:
                    "required when an endpoint has fip.reserve: true (or set --region / CHERRY_REGION_NAME)"
                        .into(),
            });
        }
        let kubeconfig = args
            .kubeconfig
            .as_ref()
            // KUBECONFIG may be a list; the first entry names the bootstrap API server.
            .and_then(|p| crate::kube::config::first_path(p))
            .or_else(|| cfg.kubernetes.kubeconfig.clone());
        if kubeconfig.is_none() {
            return Err(BootstrapError::Field {
                path: cfg.path.clone(),
                field: "kubernetes.kubeconfig".into(),
                message: "required (or --kubeconfig / KUBECONFIG)".into(),
            });
        }
        let state_file = StateFile::new(cfg.state_file.clone());
        let (state, resumed) = if args.check_config {
            (State::new(&cfg.cluster.infra_id), false)
        } else {
            state_file.load(&cfg.cluster.infra_id)?
        };
        let dropped = watch::channel(state.bootstrap_dropped_at.is_some()).0;
        Ok(Self {
            cfg,
            cloud_cfg,
            kubeconfig,
            api_url: None,
            reporter,
            token,
            state_file,
            state,
            resumed,
            resolved: Vec::new(),
            cloud: None,
            kube: None,
            health: None,
            store: RecordStore::new(),
            dropped,
            publisher: None,
            api_ready: false,
        })
    }

    /// `--check-config`: the cloud answers, the region exists, the kubeconfig loads.
    async fn check(&self) -> Result<(), BootstrapError> {
        let cloud = self.cloud()?;
        if let Some(region) = &self.cloud_cfg.region {
            steps::check_region(cloud.as_ref(), &self.cfg, region).await?;
        }
        self.load_kube().await?;
        self.reporter
            .event("check", "the configuration is valid", json!({}));
        Ok(())
    }

    fn cloud(&self) -> Result<Arc<dyn Cloud>, BootstrapError> {
        if let Some(c) = &self.cloud {
            return Ok(c.clone());
        }
        let client = CherryClient::new(self.cloud_cfg.cloud_client_config()?).map_err(|source| {
            BootstrapError::Cloud {
                step: "building the API client".into(),
                source,
            }
        })?;
        Ok(Arc::new(client))
    }

    async fn load_kube(&self) -> Result<(kube::Client, String), BootstrapError> {
        let path = self.kubeconfig.clone().unwrap_or_default();
        let field_err = |message: String| BootstrapError::Field {
            path: self.cfg.path.clone(),
            field: "kubernetes.kubeconfig".into(),
            message,
        };
        let mut config = crate::kube::config::load(Some(&path))
            .await
            .map_err(|e| field_err(e.with_path()))?;
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(30));
        let url = config.cluster_url.to_string();
        let client =
            kube::Client::try_from(config).map_err(|e| field_err(format!("{}: {e}", path.display())))?;
        Ok((client, url))
    }

    fn save(&mut self) -> Result<(), BootstrapError> {
        self.state_file.save(&self.state)?;
        Ok(())
    }

    fn observations(&self) -> Observations {
        Observations {
            fips_resolved: !self.resolved.is_empty() && self.resolved.len() == self.cfg.endpoints.len(),
            dns_running: self.publisher.is_some(),
            api_ready: self.api_ready,
            now_ms: now_ms(),
        }
    }

    fn ttl(&self) -> Duration {
        match self.cfg.dns.mode {
            config::DnsMode::None => Duration::ZERO,
            _ => Duration::from_secs(u64::from(self.cfg.dns.ttl)),
        }
    }

    async fn run_steps(&mut self) -> Result<(), BootstrapError> {
        self.reporter.event(
            "started",
            &format!(
                "baton {} bootstrap of {}.{} ({}), state file {}",
                env!("CARGO_PKG_VERSION"),
                self.cfg.cluster.name,
                self.cfg.cluster.base_domain,
                if self.resumed { "resuming" } else { "fresh start" },
                self.state_file.path().display()
            ),
            json!({"resumed": self.resumed, "stateFile": self.state_file.path(), "version": env!("CARGO_PKG_VERSION")}),
        );
        loop {
            let step = next_step(&self.state, &self.observations(), self.ttl());
            self.state.step = step;
            self.reporter.step(step);
            let token = self.token.clone();
            let fut = self.run_step(step);
            tokio::select! {
                biased;
                () = token.cancelled() => return Err(BootstrapError::Interrupted(step)),
                r = fut => r?,
            }
            if step == Step::Complete {
                return Ok(());
            }
        }
    }

    async fn run_step(&mut self, step: Step) -> Result<(), BootstrapError> {
        match step {
            Step::ReserveFips => self.reserve_fips().await,
            Step::PublishDns => self.publish_dns().await,
            Step::WaitForApi => self.wait_for_api().await,
            Step::Handoff => self.handoff().await,
            Step::WaitForServices => self.wait_for_services().await,
            Step::DropBootstrap => self.drop_bootstrap().await,
            Step::Drain => {
                let dropped = self.state.bootstrap_dropped_at.unwrap_or_else(now_ms);
                let until = dropped.saturating_add(u64::try_from(self.ttl().as_millis()).unwrap_or(0));
                let left = until.saturating_sub(now_ms());
                self.reporter
                    .detail(&format!("{:.1}s left", Duration::from_millis(left).as_secs_f64()));
                tokio::time::sleep(Duration::from_millis(left)).await;
                Ok(())
            }
            Step::Complete => {
                if self.state.completed_at.is_none() {
                    self.state.completed_at = Some(now_ms());
                    self.save()?;
                }
                Ok(())
            }
        }
    }

    async fn reserve_fips(&mut self) -> Result<(), BootstrapError> {
        let cloud = self.cloud()?;
        self.cloud = Some(cloud.clone());
        let region = self.cloud_cfg.region.clone();
        if self.cfg.reserves()
            && let Some(region) = &region
            && self.state.fips.len() < self.cfg.endpoints.len()
        {
            steps::check_region(cloud.as_ref(), &self.cfg, region).await?;
        }
        let mut resolved = Vec::new();
        for (i, ep) in self.cfg.endpoints.clone().into_iter().enumerate() {
            let recorded = self.state.fips.get(&ep.name).cloned();
            let fip = steps::resolve_fip(
                cloud.as_ref(),
                &self.cfg,
                i,
                &ep,
                recorded.as_ref(),
                region.as_deref(),
            )
            .await?;
            if recorded.as_ref() != Some(&fip) {
                self.state.fips.insert(ep.name.clone(), fip.clone());
                self.save()?;
            }
            let action = match (&recorded, fip.reserved_by_baton) {
                (Some(_), _) => "recorded",
                (None, true) => "reserved",
                (None, false) => "found",
            };
            self.reporter.event(
                "fip",
                &format!("endpoint {}: FIP {} ({action}, {})", ep.name, fip.address, ep.fip),
                json!({"endpoint": ep.name, "fip": fip.address, "fipId": fip.id, "action": action}),
            );
            resolved.push((ep, fip));
        }
        self.resolved = resolved;
        Ok(())
    }

    fn names(&self) -> Vec<NameAddrs> {
        self.resolved
            .iter()
            .map(|(ep, fip)| NameAddrs {
                name: ep.dns_name.clone(),
                bootstrap: self.cfg.bootstrap_address(ep.publish),
                fip: fip.address,
            })
            .collect()
    }

    async fn publish_dns(&mut self) -> Result<(), BootstrapError> {
        let hc = &self.cloud_cfg.health_check;
        let settings = ProbeSettings {
            server_name: self.cfg.kubernetes.api_server_name.clone(),
            path: hc.path.clone(),
            interval: hc.interval,
            timeout: hc.timeout,
            thresholds: Thresholds {
                rise: hc.rise,
                fall: hc.fall,
            },
            ca_der: self.cfg.kubernetes.cluster_ca_der.clone(),
        };
        let health = Arc::new(HealthChecker::new(
            settings,
            self.cfg.kubernetes.api_server_port,
            self.token.clone(),
        )?);
        let names = self.names();
        for n in &names {
            health.watch(n.bootstrap)?;
            health.watch(n.fip)?;
        }
        dns::sync_once(&self.store, &names, *self.dropped.borrow(), &health.snapshot());
        dns::spawn_sync(
            self.store.clone(),
            names,
            health.subscribe(),
            self.dropped.subscribe(),
            self.token.clone(),
        );
        self.spawn_dns_reporter();
        let publisher = Publisher::start(&self.cfg.dns, self.store.clone(), &self.token).await?;
        self.reporter.event(
            "dns-started",
            &format!(
                "DNS ({}) for zone {} TTL {}s{}",
                publisher.mode(),
                self.cfg.dns.zone,
                self.cfg.dns.ttl,
                if publisher.listen_addrs().is_empty() {
                    String::new()
                } else {
                    format!(
                        " on {}",
                        publisher
                            .listen_addrs()
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            ),
            json!({"mode": publisher.mode(), "zone": self.cfg.dns.zone.as_str(), "ttl": self.cfg.dns.ttl,
                   "listen": publisher.listen_addrs()}),
        );
        self.health = Some(health);
        self.publisher = Some(publisher);
        Ok(())
    }

    /// Reports the records being served now (changes only).
    fn report_dns(&self) {
        if self.publisher.is_none() {
            return;
        }
        for (name, recs) in self.store.snapshot().names() {
            self.reporter.dns(name.as_str(), recs.served());
        }
    }

    fn spawn_dns_reporter(&self) {
        let mut rx = self.store.subscribe();
        let reporter = self.reporter.clone();
        let token = self.token.clone();
        tokio::spawn(async move {
            loop {
                let snap = rx.borrow_and_update().clone();
                for (name, recs) in snap.names() {
                    reporter.dns(name.as_str(), recs.served());
                }
                tokio::select! {
                    () = token.cancelled() => return,
                    r = rx.changed() => if r.is_err() { return },
                }
            }
        });
    }

    async fn kube(&mut self) -> Result<kube::Client, BootstrapError> {
        if let Some(k) = &self.kube {
            return Ok(k.clone());
        }
        let (k, url) = self.load_kube().await?;
        self.kube = Some(k.clone());
        self.api_url = Some(url);
        Ok(k)
    }

    async fn wait_for_api(&mut self) -> Result<(), BootstrapError> {
        let client = self.kube().await?;
        let timeout = self.cfg.timeouts.bootstrap_api;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match steps::api_ready(&client).await {
                Ok(()) => {
                    self.api_ready = true;
                    return Ok(());
                }
                Err(e) => {
                    self.reporter.detail(&e);
                    Some(e)
                }
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(BootstrapError::Timeout {
                    what: format!(
                        "the bootstrap API server {} (kubeconfig {}) to answer /readyz",
                        self.api_url.as_deref().unwrap_or("?"),
                        self.kubeconfig
                            .as_ref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    ),
                    after: timeout,
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn handoff(&mut self) -> Result<(), BootstrapError> {
        let client = self.kube().await?;
        let timeout = self.cfg.timeouts.handoff;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let r = async {
                steps::apply_services(&client, &self.resolved).await?;
                steps::apply_manifests(&client, &self.cfg.manifests).await
            }
            .await;
            match r {
                Ok(()) => break,
                // A refusal (invalid object, forbidden) will not change by retrying.
                Err(BootstrapError::Kube {
                    source: kube::Error::Api(s),
                    step,
                }) if (400..500).contains(&s.code) && s.code != 409 && s.code != 429 => {
                    return Err(BootstrapError::Kube {
                        source: kube::Error::Api(s),
                        step,
                    });
                }
                Err(BootstrapError::Kube { step, source }) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(BootstrapError::Timeout {
                            what: "the handoff (applying the API Services and manifests)".into(),
                            after: timeout,
                            last: Some(format!("{step}: {source}")),
                        });
                    }
                    self.reporter.detail(&format!("{step}: {source}; retrying"));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        }
        self.reporter.event(
            "handoff",
            &format!(
                "applied {} API Service(s) and {} manifest object(s)",
                self.resolved.len(),
                self.cfg.manifests.len()
            ),
            json!({"services": self.resolved.iter().map(|(e, _)| e.service.to_string()).collect::<Vec<_>>(),
                   "manifestObjects": self.cfg.manifests.len()}),
        );
        self.state.handoff_applied_at = Some(now_ms());
        self.save()
    }

    async fn wait_for_services(&mut self) -> Result<(), BootstrapError> {
        let client = self.kube().await?;
        let timeout = self.cfg.timeouts.services_ready;
        let deadline = tokio::time::Instant::now() + timeout;
        let health = self.health.clone();
        loop {
            let h = health.as_ref().map(|h| h.snapshot()).unwrap_or_default();
            let mut progress = Vec::new();
            let mut last_error = None;
            for (ep, fip) in &self.resolved {
                let readiness = match steps::observe_service(&client, ep).await {
                    Ok((svc, slices)) => {
                        steps::service_readiness(svc.as_ref(), &slices, fip.address, is_up(&h, fip.address))
                    }
                    Err(e) => {
                        last_error = Some(format!("reading Service {}: {e}", ep.service));
                        Readiness::Missing
                    }
                };
                progress.push(ServiceProgress {
                    endpoint: ep.name.clone(),
                    service: ep.service.to_string(),
                    fip: fip.address,
                    waiting_for: readiness.waiting_for(),
                    readiness,
                });
            }
            let all_ready = progress.iter().all(|p| p.readiness == Readiness::Ready);
            let waiting: Vec<String> = progress
                .iter()
                .filter(|p| p.readiness != Readiness::Ready)
                .map(|p| format!("{}: {}", p.service, p.waiting_for))
                .collect();
            self.reporter.services(progress);
            if all_ready {
                self.state.services_ready_at = Some(now_ms());
                return self.save();
            }
            if let Some(e) = &last_error {
                self.reporter.detail(e);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BootstrapError::Timeout {
                    what: format!("the API Services to become Ready ({})", waiting.join("; ")),
                    after: timeout,
                    last: last_error,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn drop_bootstrap(&mut self) -> Result<(), BootstrapError> {
        self.dropped.send_replace(true);
        let h = self.health.as_ref().map(|h| h.snapshot()).unwrap_or_default();
        dns::sync_once(&self.store, &self.names(), true, &h);
        let generation = self.store.snapshot().generation;
        if let Some(p) = &self.publisher {
            let wait = p.wait_published(generation);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if let Some(e) = p.last_error() {
                            self.reporter.detail(&format!("DNS push failing: {e}"));
                        }
                    }
                }
            }
        }
        let addrs: std::collections::BTreeSet<IpAddr> = self.names().iter().map(|n| n.bootstrap).collect();
        self.reporter.event(
            "bootstrap-dropped",
            "the bootstrap address no longer appears in DNS",
            json!({"addresses": addrs}),
        );
        self.state.bootstrap_dropped_at = Some(now_ms());
        self.save()
    }
}

fn summary(
    runner: Option<&Runner>,
    reporter: &Reporter,
    result: &Result<(), BootstrapError>,
    check_only: bool,
) -> serde_json::Value {
    let (status, code, error, category) = match result {
        Ok(()) if check_only => ("valid", exit::COMPLETE, None, None),
        Ok(()) => ("complete", exit::COMPLETE, None, None),
        Err(e @ BootstrapError::Interrupted(_)) => (
            "interrupted",
            e.exit_code(),
            Some(e.to_string()),
            Some(e.category()),
        ),
        Err(e) => ("failed", e.exit_code(), Some(e.to_string()), Some(e.category())),
    };
    let mut v = json!({
        "result": status,
        "exitCode": code,
        "error": error,
        "category": category,
        "startedAt": progress::rfc3339(reporter.started_ms()),
        "finishedAt": progress::rfc3339(now_ms()),
        "durationSeconds": (reporter.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    });
    if let Some(r) = runner {
        let endpoints: Vec<serde_json::Value> = r
            .cfg
            .endpoints
            .iter()
            .map(|ep| {
                let fip = r.state.fips.get(&ep.name);
                json!({
                    "name": ep.name,
                    "dnsName": ep.dns_name.as_str(),
                    "service": ep.service.to_string(),
                    "bootstrapAddress": r.cfg.bootstrap_address(ep.publish),
                    "fip": fip.map(|f| f.address),
                    "fipId": fip.map(|f| f.id.clone()),
                    "reservedByBaton": fip.map(|f| f.reserved_by_baton),
                })
            })
            .collect();
        let records: serde_json::Map<String, serde_json::Value> = r
            .store
            .snapshot()
            .names()
            .map(|(n, recs)| (n.as_str().to_owned(), json!(recs.served())))
            .collect();
        let extra = json!({
            "cluster": r.cfg.cluster.name,
            "baseDomain": r.cfg.cluster.base_domain,
            "infraId": r.cfg.cluster.infra_id,
            "step": r.state.step.as_str(),
            "resumed": r.resumed,
            "stateFile": r.state_file.path(),
            "endpoints": endpoints,
            "dns": {
                "mode": r.publisher.as_ref().map_or("not started", Publisher::mode),
                "zone": r.cfg.dns.zone.as_str(),
                "ttl": r.cfg.dns.ttl,
                "listen": r.publisher.as_ref().map(Publisher::listen_addrs).unwrap_or_default(),
                "records": records,
            },
        });
        if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            obj.extend(extra);
        }
    }
    v
}

#[cfg(test)]
mod tests;
