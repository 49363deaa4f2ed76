//! The agent's health and metrics, and the small HTTP server that shows them.
//!
//! ```text
//!  reconcile loop ─► Health::in_sync / failed ──┐
//!  Service watch task alive? ───────────────────┼─► GET /health  200 | 503 + why   (liveness)
//!  watch::WatchStatus (listed, last error) ─────┴─► GET /ready   200 | 503 + why   (readiness)
//!  reconcile loop ─► Metrics ───────────────────────► GET /metrics (baton_agent_*)
//! ```
//!
//! `/health` is about the agent's own job: the kernel accepts exactly the wanted FIPs and the
//! watch task runs. A lost connection to the API server makes `/ready` fail, not `/health`: a
//! restart would not bring the API server back, and the rules stay in place meanwhile.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::plan::{self, Observed};
use super::watch::WatchStatus;

/// What `/health` and `/ready` answer.
#[derive(Debug)]
pub struct Health {
    inner: Mutex<Inner>,
    watch: Option<Arc<WatchStatus>>,
}

#[derive(Debug)]
struct Inner {
    /// `None` once the kernel holds the wanted FIPs; else why not.
    problem: Option<String>,
    watch_running: bool,
}

impl Health {
    /// Before the first update: not in sync. `watch`: the Service watch's status (none with
    /// `--no-kube`).
    pub fn new(watch: Option<Arc<WatchStatus>>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                problem: Some("the kernel's rules were not checked yet".into()),
                watch_running: true,
            }),
            watch,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn in_sync(&self) {
        self.lock().problem = None;
    }

    pub fn failed(&self, why: String) {
        self.lock().problem = Some(why);
    }

    /// The Service watch task ended (it should not).
    pub fn watch_ended(&self) {
        self.lock().watch_running = false;
    }

    /// `Ok` when the rules match the wanted FIPs and the watch task runs.
    pub fn health(&self) -> Result<(), String> {
        let inner = self.lock();
        if let Some(p) = &inner.problem {
            return Err(p.clone());
        }
        if self.watch.is_some() && !inner.watch_running {
            return Err("the Service watch stopped".into());
        }
        Ok(())
    }

    /// [`Self::health`], and the Services were listed and the watch answers.
    pub fn ready(&self) -> Result<(), String> {
        self.health()?;
        match self.watch.as_ref().and_then(|w| w.not_ready()) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FipLabel {
    fip: String,
}

/// The agent's metrics, under the prefix `baton_agent_`.
pub struct Metrics {
    registry: Registry,
    fips: Gauge,
    held: Gauge,
    in_sync: Gauge,
    updates: Family<ResultLabel, Counter>,
    repairs: Counter,
    boot_deliveries: Gauge,
    node_file_writes: Family<ResultLabel, Counter>,
    connections: Family<FipLabel, Counter<u64, AtomicU64>>,
    own_connections: Family<FipLabel, Counter<u64, AtomicU64>>,
    /// The FIPs shown in `connections` and in `own_connections`.
    shown: Mutex<(BTreeSet<IpAddr>, BTreeSet<IpAddr>)>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton_agent");
        let m = Self {
            registry: Registry::default(),
            fips: Gauge::default(),
            held: Gauge::default(),
            in_sync: Gauge::default(),
            updates: Family::default(),
            repairs: Counter::default(),
            boot_deliveries: Gauge::default(),
            node_file_writes: Family::default(),
            connections: Family::default(),
            own_connections: Family::default(),
            shown: Mutex::new((BTreeSet::new(), BTreeSet::new())),
        };
        registry.register(
            "fips",
            "Floating IPs this node accepts now (rules in its nftables table)",
            m.fips.clone(),
        );
        registry.register(
            "held_fips",
            "Floating IPs this node holds, whose own packets it delivers to itself (rules in the \
             output chain)",
            m.held.clone(),
        );
        registry.register(
            "in_sync",
            "1 when the kernel accepts exactly the wanted Floating IPs",
            m.in_sync.clone(),
        );
        registry.register(
            "updates",
            "Replacements of the nftables table, by result (ok, error)",
            m.updates.clone(),
        );
        registry.register(
            "repairs",
            "Replacements because the table changed under the agent (flushed, edited)",
            m.repairs.clone(),
        );
        registry.register(
            "boot_deliveries",
            "Floating IPs whose own packets this node still delivers to its own API server since \
             boot, because their holder does not answer yet (docs/agent.md, \"Cold start\")",
            m.boot_deliveries.clone(),
        );
        registry.register(
            "node_file_writes",
            "Writes of the node file the boot unit restores from, by result (ok, error)",
            m.node_file_writes.clone(),
        );
        registry.register(
            "fip_connections",
            "Connections to each Floating IP redirected on this node since its rule was created \
             (the rule's nftables counter: NAT chains see the first packet of a connection)",
            m.connections.clone(),
        );
        registry.register(
            "own_connections",
            "This node's own connections to each Floating IP it holds, delivered to itself since \
             the output rule was created (the rule's nftables counter)",
            m.own_connections.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Records what the kernel holds: the FIP counts and each rule's counter.
    pub fn observe(&self, observed: &Observed, in_sync: bool) {
        let accepted = plan::accepted(observed);
        let held: BTreeSet<IpAddr> = accepted.held.keys().copied().collect();
        self.fips
            .set(i64::try_from(accepted.fips.len()).unwrap_or(i64::MAX));
        self.held.set(i64::try_from(held.len()).unwrap_or(i64::MAX));
        self.in_sync.set(i64::from(in_sync));
        let mut shown = self.shown.lock().unwrap_or_else(PoisonError::into_inner);
        for gone in shown.0.difference(&accepted.fips) {
            self.connections.remove(&FipLabel {
                fip: gone.to_string(),
            });
        }
        for gone in shown.1.difference(&held) {
            self.own_connections.remove(&FipLabel {
                fip: gone.to_string(),
            });
        }
        let store = |family: &Family<FipLabel, Counter<u64, AtomicU64>>, ip: &IpAddr, n: u64| {
            family
                .get_or_create(&FipLabel { fip: ip.to_string() })
                .inner()
                .store(n, Ordering::Relaxed);
        };
        for table in observed.values() {
            for (ip, n) in &table.fips {
                store(&self.connections, ip, *n);
            }
            for (ip, local) in &table.local {
                store(&self.own_connections, ip, local.connections);
            }
        }
        *shown = (accepted.fips, held);
    }

    pub fn updated(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.updates.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn repaired(&self) {
        self.repairs.inc();
    }

    /// The boot deliveries that still stand.
    pub fn set_boot_deliveries(&self, n: usize) {
        self.boot_deliveries.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn node_file_written(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.node_file_writes.get_or_create(&ResultLabel { result }).inc();
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            warn!(%error, "encoding metrics failed");
        }
        out
    }
}

/// Binds the health server's address (before anything else runs: a taken port is a start-up
/// error).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `/health`, `/ready` and `/metrics` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    use axum::http::StatusCode;
    use axum::routing::get;
    let answer = |r: Result<(), String>| match r {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let ready = Arc::clone(&health);
    let app = axum::Router::new()
        .route(
            "/health",
            get(move || {
                let h = Arc::clone(&health);
                async move { answer(h.health()) }
            }),
        )
        .route(
            "/ready",
            get(move || {
                let h = Arc::clone(&ready);
                async move { answer(h.ready()) }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let m = Arc::clone(&metrics);
                async move { m.encode() }
            }),
        );
    if let Err(error) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        warn!(%error, "health server stopped");
    }
}
