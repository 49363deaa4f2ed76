//! Active health checks of a tenant's API servers, with the one prober (`crate::probe`): for a
//! tenant whose CA is configured (`--health-ca HOST=FILE`), every backend is probed
//! (`GET /readyz`, the tenant's certificate verified for HOST, rise 2 / fall 3, every second) and skipped while the prober says Down. Passive health (a refused connect)
//! still applies on top; a tenant without a CA has passive health only.
//!
//! ```text
//!  RouteTable (watch) ─► per tenant with a CA: Prober::set_targets(backends)
//!  Prober::subscribe ─► Backend::set_probed_down(addr, Down) ─► BackendSet::order skips it
//! ```
//!
//! Also the other way round: [`router_check`], the probe `baton controller` runs against the
//! router on every control-plane node (`sniRouterPort`), so that the shared FIP leaves a node
//! whose router stopped serving.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use baton_core::health::{Health as ProbeHealth, Thresholds};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::hello::{client_hello, record};
use super::metrics::Metrics;
use super::router::{HEALTH_NAME, UNRECOGNIZED_NAME};
use super::routes::{Health, RouteTable};
use crate::probe::{Check, ProbeSettings, Prober};

/// A tenant's CA for health checks: `HOST=FILE` (`--health-ca`); the error says why.
pub fn parse_ca(spec: &str) -> Result<(String, Vec<Vec<u8>>), String> {
    let (host, file) = spec.split_once('=').ok_or("expected HOST=CAFILE")?;
    let host = super::hello::normalize_host(host.trim().as_bytes())
        .map_err(|_| format!("{host:?} is not a host name"))?;
    let ca = crate::kube::tls::read_ca(&PathBuf::from(file.trim())).map_err(|e| e.to_string())?;
    Ok((host, ca))
}

/// Keeps one prober per tenant with a CA, following the route table, until `shutdown`.
pub async fn run(
    cas: BTreeMap<String, Vec<Vec<u8>>>,
    mut routes: watch::Receiver<Arc<RouteTable>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut probers: BTreeMap<String, Prober> = BTreeMap::new();
    loop {
        let table = routes.borrow_and_update().clone();
        for (host, ca) in &cas {
            let Some(set) = table.get(host) else {
                continue;
            };
            let prober = probers.entry(set.name.clone()).or_insert_with(|| {
                let prober = Prober::with_shutdown(settings(host, ca), Arc::new(()), shutdown.child_token());
                tokio::spawn(follow(
                    set.name.clone(),
                    prober.subscribe(),
                    Arc::clone(&health),
                    Arc::clone(&metrics),
                    shutdown.clone(),
                ));
                info!(tenant = set.name, "health checks started");
                prober
            });
            let targets: Vec<_> = set.backends.iter().map(|b| b.addr).collect();
            if let Err(error) = prober.set_targets(&targets) {
                warn!(%error, tenant = set.name, "health checks not started");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = routes.changed() => if changed.is_err() { return },
        }
    }
}

/// The router's own health check: connect, send a ClientHello for [`HEALTH_NAME`], and expect
/// the router's `unrecognized_name` alert. A router that is gone refuses the connect; one that
/// hangs (or is full) answers nothing within the probe's timeout.
pub fn router_check() -> Check {
    let hello: Arc<[u8]> = record(&client_hello(Some(HEALTH_NAME))).into();
    Arc::new(move |target: SocketAddr| {
        let hello = Arc::clone(&hello);
        Box::pin(async move {
            let answered = async {
                let mut s = tokio::net::TcpStream::connect(target).await?;
                s.write_all(&hello).await?;
                let mut alert = [0u8; UNRECOGNIZED_NAME.len()];
                s.read_exact(&mut alert).await?;
                Ok::<_, std::io::Error>(alert == UNRECOGNIZED_NAME)
            };
            match answered.await {
                Ok(ok) => ok,
                Err(error) => {
                    tracing::debug!(%error, %target, "router health check failed");
                    false
                }
            }
        })
    })
}

fn settings(host: &str, ca: &[Vec<u8>]) -> ProbeSettings {
    ProbeSettings {
        path: "/readyz".into(),
        server_name: host.to_owned(),
        ca_der: ca.to_vec(),
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        thresholds: Thresholds::default(),
    }
}

/// Copies a prober's verdicts onto the backends the router reads.
async fn follow(
    tenant: String,
    mut verdicts: watch::Receiver<BTreeMap<std::net::SocketAddr, ProbeHealth>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    loop {
        let now = verdicts.borrow_and_update().clone();
        for (addr, verdict) in now {
            let down = verdict == ProbeHealth::Down;
            if health.backend(addr).set_probed_down(down) {
                info!(tenant, backend = %addr, down, "health check verdict changed");
                metrics.set_backend_up(&tenant, addr, !down);
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = verdicts.changed() => if changed.is_err() { return },
        }
    }
}
