//! Continuous, parallel `/readyz` probes with rise/fall hysteresis.
//!
//! One task per target probes every `interval` with a fresh TLS connection (no pooling: a probe
//! through a FIP must follow the FIP when it moves), verifying the API server's certificate
//! against the cluster CA for `server_name` while connecting to the target's address. Results feed
//! a [`HealthTracker`] per target; the health map is published on a watch channel, so the
//! failover loop reacts to a change at once instead of polling.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_core::health::{Health, HealthTracker, Thresholds};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How to probe.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// The HTTP path (`/readyz`).
    pub path: String,
    /// The TLS server name to verify (e.g. `kubernetes.default.svc`).
    pub server_name: String,
    /// Cluster CA certificates (DER).
    pub ca_der: Vec<Vec<u8>>,
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
}

/// Observer of each probe's latency and outcome (metrics).
pub trait ProbeObserver: Send + Sync {
    /// One probe of `target` finished.
    fn observe(&self, target: SocketAddr, ok: bool, latency: Duration);
}

impl ProbeObserver for () {
    fn observe(&self, _: SocketAddr, _: bool, _: Duration) {}
}

/// The set of probed targets and their current health.
pub struct Prober {
    settings: ProbeSettings,
    observer: Arc<dyn ProbeObserver>,
    tasks: BTreeMap<SocketAddr, CancellationToken>,
    health_tx: watch::Sender<BTreeMap<SocketAddr, Health>>,
}

/// Errors building probe clients.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid cluster CA certificate: {0}")]
    Ca(#[source] rustls::Error),
    #[error("building the probe client: {0}")]
    Client(#[source] reqwest::Error),
}

impl Prober {
    /// A prober with no targets yet.
    pub fn new(settings: ProbeSettings, observer: Arc<dyn ProbeObserver>) -> Self {
        let (health_tx, _) = watch::channel(BTreeMap::new());
        Self {
            settings,
            observer,
            tasks: BTreeMap::new(),
            health_tx,
        }
    }

    /// Subscribes to health changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<SocketAddr, Health>> {
        self.health_tx.subscribe()
    }

    /// The current health of `target` (`Unknown` if not probed).
    pub fn health(&self, target: &SocketAddr) -> Health {
        self.health_tx.borrow().get(target).copied().unwrap_or_default()
    }

    /// Forgets `target`'s history (its health becomes `Unknown`) and probes it afresh.
    pub fn reset(&mut self, target: &SocketAddr) -> Result<(), ProbeError> {
        if let Some(token) = self.tasks.remove(target) {
            token.cancel();
        }
        self.health_tx.send_if_modified(|m| m.remove(target).is_some());
        let targets: Vec<SocketAddr> = self
            .tasks
            .keys()
            .copied()
            .chain(std::iter::once(*target))
            .collect();
        self.set_targets(&targets)
    }

    /// Probes exactly `targets` from now on: starts new ones, stops the rest.
    pub fn set_targets(&mut self, targets: &[SocketAddr]) -> Result<(), ProbeError> {
        let gone: Vec<SocketAddr> = self
            .tasks
            .keys()
            .filter(|t| !targets.contains(t))
            .copied()
            .collect();
        for t in gone {
            if let Some(token) = self.tasks.remove(&t) {
                token.cancel();
            }
            self.health_tx.send_if_modified(|m| m.remove(&t).is_some());
        }
        for &t in targets {
            if self.tasks.contains_key(&t) {
                continue;
            }
            let client = probe_client(&self.settings, t)?;
            let token = CancellationToken::new();
            self.tasks.insert(t, token.clone());
            self.health_tx
                .send_if_modified(|m| m.insert(t, Health::Unknown).is_none());
            let url = format!(
                "https://{}:{}{}",
                self.settings.server_name,
                t.port(),
                self.settings.path
            );
            tokio::spawn(probe_loop(
                client,
                url,
                t,
                self.settings.clone(),
                self.health_tx.clone(),
                Arc::clone(&self.observer),
                token,
            ));
        }
        Ok(())
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        for token in self.tasks.values() {
            token.cancel();
        }
    }
}

fn probe_client(s: &ProbeSettings, target: SocketAddr) -> Result<reqwest::Client, ProbeError> {
    let mut roots = rustls::RootCertStore::empty();
    for der in &s.ca_der {
        roots
            .add(rustls::pki_types::CertificateDer::from(der.clone()))
            .map_err(ProbeError::Ca)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(ProbeError::Ca)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(&s.server_name, target)
        .pool_max_idle_per_host(0)
        .connect_timeout(s.timeout)
        .timeout(s.timeout)
        .no_proxy()
        .build()
        .map_err(ProbeError::Client)
}

async fn probe_loop(
    client: reqwest::Client,
    url: String,
    target: SocketAddr,
    settings: ProbeSettings,
    health_tx: watch::Sender<BTreeMap<SocketAddr, Health>>,
    observer: Arc<dyn ProbeObserver>,
    token: CancellationToken,
) {
    let mut tracker = HealthTracker::new(settings.thresholds);
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let started = tokio::time::Instant::now();
        let ok = matches!(client.get(&url).send().await, Ok(r) if r.status().is_success());
        observer.observe(target, ok, started.elapsed());
        if let Some(h) = tracker.observe(ok) {
            tracing::debug!(%target, health = ?h, "probe health changed");
            health_tx.send_if_modified(|m| match m.get_mut(&target) {
                Some(v) if *v != h => {
                    *v = h;
                    true
                }
                _ => false,
            });
        }
    }
}
