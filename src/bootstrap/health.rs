//! Continuous `/readyz` checks of every address the API names may carry, by the one prober
//! ([`crate::probe`]) that the controller uses too.
//!
//! ```text
//!   crate::probe::Prober ── GET https://<apiServerName>:<port>/readyz per address (connected to
//!        │                  the address, TLS verified against the cluster CA and that name)
//!        ▼ rise/fall (baton_core::health), keyed by address:port
//!   watch<HealthMap> (keyed by address) ──▶ dns::sync (health flags of the records) and the run loop
//! ```
//!
//! The name is checked, not the address: the request goes to `https://<name>:<port>` with the
//! name resolved to the probed address, so the certificate must carry the name the clients use
//! (`api-int.<cluster>.<domain>`), not every address.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use baton_core::health::Health;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use crate::probe::ProbeSettings;
use crate::probe::{ProbeError, Prober};

/// The health of every probed address.
pub type HealthMap = BTreeMap<IpAddr, Health>;

/// Whether `ip` counts as healthy in `map` (only `Up` does).
pub fn is_up(map: &HealthMap, ip: IpAddr) -> bool {
    map.get(&ip) == Some(&Health::Up)
}

/// Why the checker cannot start.
#[derive(Debug, thiserror::Error)]
#[error("health checks: {0}")]
pub struct HealthError(#[from] ProbeError);

/// Probes addresses continuously (all on the API servers' `port`) and publishes their health.
pub struct HealthChecker {
    port: u16,
    /// The prober and its targets.
    prober: Mutex<(Prober, Vec<SocketAddr>)>,
    tx: watch::Sender<HealthMap>,
}

impl HealthChecker {
    /// A checker with no address yet; its probes stop when `token` is cancelled.
    pub fn new(settings: ProbeSettings, port: u16, token: CancellationToken) -> Result<Self, HealthError> {
        // Fails now on an unusable CA rather than at the first address.
        crate::kube::tls::client_config(&settings.ca_der).map_err(ProbeError::Ca)?;
        let prober = Prober::with_shutdown(settings, Arc::new(()), token.clone());
        let tx = watch::channel(HealthMap::new()).0;
        tokio::spawn(forward(prober.subscribe(), tx.clone(), token));
        Ok(Self {
            port,
            prober: Mutex::new((prober, Vec::new())),
            tx,
        })
    }

    /// Starts probing `ip` (no-op if it is probed already).
    pub fn watch(&self, ip: IpAddr) -> Result<(), HealthError> {
        let mut guard = self.prober.lock().unwrap_or_else(PoisonError::into_inner);
        let (prober, targets) = &mut *guard;
        let target = SocketAddr::new(ip, self.port);
        if targets.contains(&target) {
            return Ok(());
        }
        targets.push(target);
        prober.set_targets(targets)?;
        self.tx.send_modify(|m| {
            m.entry(ip).or_insert(Health::Unknown);
        });
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

impl std::fmt::Debug for HealthChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthChecker")
            .field("port", &self.port)
            .field("health", &*self.tx.borrow())
            .finish_non_exhaustive()
    }
}

/// Copies the prober's health (by address:port) into `tx` (by address) until `token` is
/// cancelled or the prober is gone.
async fn forward(
    mut from: watch::Receiver<BTreeMap<SocketAddr, Health>>,
    tx: watch::Sender<HealthMap>,
    token: CancellationToken,
) {
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            r = from.changed() => if r.is_err() { return },
        }
        let by_addr: HealthMap = from
            .borrow_and_update()
            .iter()
            .map(|(t, h)| (t.ip(), *h))
            .collect();
        tx.send_if_modified(|m| {
            let changed = *m != by_addr;
            if changed {
                m.clone_from(&by_addr);
            }
            changed
        });
    }
}
