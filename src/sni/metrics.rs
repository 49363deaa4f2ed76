//! Prometheus metrics of the SNI router (prometheus-client), under the prefix `baton_sni_`.
//!
//! Labels come from the configuration only (the tenant's first host name, `default`, a
//! backend address, a fixed reason): a client cannot create a label value by sending a name.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BytesLabel {
    host: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabel {
    host: String,
    backend: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// The router's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    accepted: Counter,
    connections: Family<HostLabel, Counter>,
    active: Family<HostLabel, Gauge>,
    bytes: Family<BytesLabel, Counter>,
    rejected: Family<ReasonLabel, Counter>,
    backend_up: Family<BackendLabel, Gauge>,
    backend_failures: Family<BackendLabel, Counter>,
    reloads: Family<ReasonLabel, Counter>,
    hosts: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton_sni");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            accepted: Counter::default(),
            connections: Family::default(),
            active: Family::default(),
            bytes: Family::default(),
            rejected: Family::default(),
            backend_up: Family::default(),
            backend_failures: Family::default(),
            reloads: Family::default(),
            hosts: Gauge::default(),
        };
        registry.register("accepted", "TCP connections accepted", m.accepted.clone());
        registry.register(
            "connections",
            "Connections spliced to a backend, per tenant",
            m.connections.clone(),
        );
        registry.register(
            "active_connections",
            "Connections spliced now, per tenant",
            m.active.clone(),
        );
        registry.register(
            "bytes",
            "Bytes spliced, per tenant and direction (counted when a connection ends)",
            m.bytes.clone(),
        );
        registry.register(
            "rejected",
            "Connections closed before a backend was chosen, per reason (unknown_sni, no_sni, \
             hello_timeout, not_tls, malformed, too_large, bad_name, proxy_header, closed, \
             no_backend)",
            m.rejected.clone(),
        );
        registry.register(
            "backend_up",
            "1 while the backend's last connect succeeded, 0 after a failed one",
            m.backend_up.clone(),
        );
        registry.register(
            "backend_connect_failures",
            "Failed connects to a backend",
            m.backend_failures.clone(),
        );
        registry.register(
            "reloads",
            "Route reloads, per result (applied, unchanged, invalid)",
            m.reloads.clone(),
        );
        registry.register("hosts", "Host names routed", m.hosts.clone());
        *m.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = registry;
        m
    }
}

impl Metrics {
    pub fn accepted(&self) {
        self.accepted.inc();
    }

    pub fn rejected(&self, reason: &'static str) {
        self.rejected.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// `host`'s per-connection metrics, looked up once: a connection then only bumps atomics
    /// (no label allocation, no lookup in a family's map).
    pub fn tenant(&self, host: &str) -> TenantMetrics {
        let label = HostLabel {
            host: host.to_owned(),
        };
        let mut bytes = BytesLabel {
            host: host.to_owned(),
            direction: "to_backend",
        };
        let to_backend = self.bytes.get_or_create(&bytes).clone();
        bytes.direction = "to_client";
        TenantMetrics {
            connections: self.connections.get_or_create(&label).clone(),
            active: self.active.get_or_create(&label).clone(),
            to_backend,
            to_client: self.bytes.get_or_create(&bytes).clone(),
        }
    }

    /// Sets `backend_up` of one backend of `host`'s set.
    pub fn set_backend_up(&self, host: &str, backend: std::net::SocketAddr, up: bool) {
        let label = BackendLabel {
            host: host.to_owned(),
            backend: backend.to_string(),
        };
        self.backend_up.get_or_create(&label).set(i64::from(up));
    }

    /// A connect to `backend` failed: down, counted.
    pub fn backend_failed(&self, host: &str, backend: std::net::SocketAddr) {
        let label = BackendLabel {
            host: host.to_owned(),
            backend: backend.to_string(),
        };
        self.backend_up.get_or_create(&label).set(0);
        self.backend_failures.get_or_create(&label).inc();
    }

    pub fn reload(&self, result: &'static str, hosts: usize) {
        self.reloads.get_or_create(&ReasonLabel { reason: result }).inc();
        self.hosts.set(i64::try_from(hosts).unwrap_or(i64::MAX));
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// One tenant's connection metrics (handles onto the families' series).
#[derive(Clone, Debug)]
pub struct TenantMetrics {
    connections: Counter,
    active: Gauge,
    to_backend: Counter,
    to_client: Counter,
}

impl TenantMetrics {
    /// A connection spliced to the tenant's backend; returns a guard that counts it active.
    pub fn spliced(&self) -> ActiveGuard<'_> {
        self.connections.inc();
        self.active.inc();
        ActiveGuard { active: &self.active }
    }

    /// Bytes a connection carried, counted when it ends.
    pub fn bytes(&self, to_backend: u64, to_client: u64) {
        self.to_backend.inc_by(to_backend);
        self.to_client.inc_by(to_client);
    }
}

/// Counts a connection active while it lives.
pub struct ActiveGuard<'a> {
    active: &'a Gauge,
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.active.dec();
    }
}
