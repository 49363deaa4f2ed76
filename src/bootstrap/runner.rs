//! One run of `baton bootstrap`: plans the next step ([`super::plan::next_step`]) from the
//! state file and what this process observed, runs it, saves the facts it settled, and again,
//! until complete. Each step's side effects are in [`super::steps`], [`super::dns`] and
//! [`super::health`]; waiting steps share one [`Deadline`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::{CherryClient, Cloud};
use baton_core::health::Thresholds;
use baton_dns::RecordStore;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::{self, BootstrapConfig, Endpoint};
use super::deadline::Deadline;
use super::dns::{self, NameAddrs, Publisher};
use super::error::BootstrapError;
use super::health::{HealthChecker, ProbeSettings, is_up};
use super::plan::{Observations, next_step};
use super::progress::{Reporter, ServiceProgress};
use super::settings::Settings;
use super::state::{FipRecord, State, StateFile, Step, now_ms};
use super::steps::{self, Readiness};

/// One run of the steps: the settings, the state file and what this process holds.
pub(super) struct Runner {
    pub(super) cfg: BootstrapConfig,
    pub(super) cloud_cfg: crate::config::Config,
    pub(super) kubeconfig: PathBuf,
    /// The bootstrap API server's URL, once the kubeconfig is loaded.
    pub(super) api_url: Option<String>,
    pub(super) reporter: Arc<Reporter>,
    pub(super) token: CancellationToken,
    pub(super) state_file: StateFile,
    pub(super) state: State,
    pub(super) resumed: bool,
    pub(super) resolved: Vec<(Endpoint, FipRecord)>,
    pub(super) cloud: Option<Arc<dyn Cloud>>,
    pub(super) kube: Option<kube::Client>,
    pub(super) health: Option<Arc<HealthChecker>>,
    pub(super) store: RecordStore,
    pub(super) dropped: watch::Sender<bool>,
    pub(super) publisher: Option<Publisher>,
    pub(super) api_ready: bool,
}

impl Runner {
    /// A runner for `settings`, resuming from the state file (a fresh state for
    /// `--check-config`, which writes nothing).
    pub(super) fn new(
        settings: Settings,
        check_only: bool,
        reporter: Arc<Reporter>,
        token: CancellationToken,
    ) -> Result<Self, BootstrapError> {
        let Settings {
            cfg,
            cloud: cloud_cfg,
            kubeconfig,
        } = settings;
        let state_file = StateFile::new(cfg.state_file.clone());
        let (state, resumed) = if check_only {
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
    pub(super) async fn check(&self) -> Result<(), BootstrapError> {
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
        let path = &self.kubeconfig;
        let field_err = |message: String| BootstrapError::Field {
            path: self.cfg.path.clone(),
            field: "kubernetes.kubeconfig".into(),
            message,
        };
        let mut config = crate::kube::config::load(Some(path))
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

    pub(super) async fn run_steps(&mut self) -> Result<(), BootstrapError> {
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
    pub(super) fn report_dns(&self) {
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
        let deadline = Deadline::after(self.cfg.timeouts.bootstrap_api);
        loop {
            let e = match steps::api_ready(&client).await {
                Ok(()) => {
                    self.api_ready = true;
                    return Ok(());
                }
                Err(e) => e,
            };
            self.reporter.detail(&e);
            deadline.check(
                || {
                    format!(
                        "the bootstrap API server {} (kubeconfig {}) to answer /readyz",
                        self.api_url.as_deref().unwrap_or("?"),
                        self.kubeconfig.display()
                    )
                },
                Some(e),
            )?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn handoff(&mut self) -> Result<(), BootstrapError> {
        let client = self.kube().await?;
        let deadline = Deadline::after(self.cfg.timeouts.handoff);
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
                    deadline.check(
                        || "the handoff (applying the API Services and manifests)".into(),
                        Some(format!("{step}: {source}")),
                    )?;
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
        let deadline = Deadline::after(self.cfg.timeouts.services_ready);
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
            deadline.check(
                || format!("the API Services to become Ready ({})", waiting.join("; ")),
                last_error,
            )?;
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
