//! Continuous `/readyz` checks of every address the API names may carry.
//!
//! ```text
//!   one task per address ── GET https://<apiServerName>:<port>/readyz (connected to the address,
//!        │                  TLS verified against the cluster CA and that name)
//!        ▼ rise/fall (baton_core::health)
//!   watch<HealthMap> ──▶ dns::sync (health flags of the records) and the run loop
//! ```
//!
//! The name is checked, not the address: the request goes to `https://<name>:<port>` with the
//! name resolved to the probed address, so the certificate must carry the name the clients use
//! (`api-int.<cluster>.<domain>`), not every address.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use baton_core::health::{Health, HealthTracker, Thresholds};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info_span};

/// The health of every probed address.
pub type HealthMap = BTreeMap<IpAddr, Health>;

/// Whether `ip` counts as healthy in `map` (only `Up` does).
pub fn is_up(map: &HealthMap, ip: IpAddr) -> bool {
    map.get(&ip) == Some(&Health::Up)
}

/// How to probe.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// The name the API servers' certificates are checked against.
    pub server_name: String,
    /// The API servers' port.
    pub port: u16,
    /// `/readyz`.
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    /// The cluster CA (DER certificates).
    pub ca_der: Vec<Vec<u8>>,
}

/// Why the checker cannot start.
#[derive(Debug, thiserror::Error)]
#[error("health checks: {0}")]
pub struct HealthError(String);

/// Probes addresses continuously and publishes their health.
#[derive(Debug)]
pub struct HealthChecker {
    settings: ProbeSettings,
    tls: Arc<rustls::ClientConfig>,
    tx: watch::Sender<HealthMap>,
    tasks: Mutex<BTreeMap<IpAddr, JoinHandle<()>>>,
    token: CancellationToken,
}

impl HealthChecker {
    /// A checker with no address yet.
    pub fn new(settings: ProbeSettings, token: CancellationToken) -> Result<Self, HealthError> {
        let tls = tls_config(&settings.ca_der)?;
        Ok(Self {
            settings,
            tls: Arc::new(tls),
            tx: watch::channel(HealthMap::new()).0,
            tasks: Mutex::new(BTreeMap::new()),
            token,
        })
    }

    /// Starts probing `ip` (no-op if it is probed already).
    pub fn watch(&self, ip: IpAddr) -> Result<(), HealthError> {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if tasks.contains_key(&ip) {
            return Ok(());
        }
        let s = &self.settings;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls((*self.tls).clone())
            .resolve(&s.server_name, SocketAddr::new(ip, s.port))
            .connect_timeout(s.timeout)
            .timeout(s.timeout)
            .pool_max_idle_per_host(1)
            .no_proxy()
            .build()
            .map_err(|e| HealthError(format!("cannot build the probe client: {e}")))?;
        let url = format!("https://{}:{}{}", s.server_name, s.port, s.path);
        self.tx.send_modify(|m| {
            m.insert(ip, Health::Unknown);
        });
        let probe = Probe {
            ip,
            url,
            client,
            interval: s.interval,
            tracker: HealthTracker::new(s.thresholds),
            tx: self.tx.clone(),
            token: self.token.clone(),
        };
        tasks.insert(
            ip,
            tokio::spawn(probe.run().instrument(info_span!("readyz", address = %ip))),
        );
        Ok(())
    }

    /// A receiver of every change.
    pub fn subscribe(&self) -> watch::Receiver<HealthMap> {
        self.tx.subscribe()
    }

    /// The current health of every probed address.
    pub fn snapshot(&self) -> HealthMap {
        self.tx.borrow().clone()
    }
}

impl Drop for HealthChecker {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).values() {
            t.abort();
        }
    }
}

struct Probe {
    ip: IpAddr,
    url: String,
    client: reqwest::Client,
    interval: Duration,
    tracker: HealthTracker,
    tx: watch::Sender<HealthMap>,
    token: CancellationToken,
}

impl Probe {
    async fn run(mut self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let result = self.probe_once().await;
            if let Err(reason) = &result {
                debug!(%reason, "probe failed");
            }
            if let Some(health) = self.tracker.observe(result.is_ok()) {
                debug!(address = %self.ip, ?health, "API server health changed");
                let ip = self.ip;
                self.tx.send_modify(|m| {
                    m.insert(ip, health);
                });
            }
        }
    }

    async fn probe_once(&self) -> Result<(), String> {
        let resp = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {}", resp.status()))
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// rustls (ring) trusting only the cluster CA.
fn tls_config(ca_der: &[Vec<u8>]) -> Result<rustls::ClientConfig, HealthError> {
    let mut roots = rustls::RootCertStore::empty();
    for der in ca_der {
        roots
            .add(rustls::pki_types::CertificateDer::from(der.clone()))
            .map_err(|e| HealthError(format!("the cluster CA is not usable: {e}")))?;
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| HealthError(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}
