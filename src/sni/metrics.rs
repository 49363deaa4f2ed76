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
    open: Gauge,
    pending: Gauge,
    max_connections: Gauge,
    accept_waits: Counter,
    closed: Family<ReasonLabel, Counter>,
    health_checks: Counter,
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
            open: Gauge::default(),
            pending: Gauge::default(),
            max_connections: Gauge::default(),
            accept_waits: Counter::default(),
            closed: Family::default(),
            health_checks: Counter::default(),
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
            "Bytes spliced, per tenant and direction (counted as they go)",
            m.bytes.clone(),
        );
        registry.register(
            "rejected",
            "Connections closed before they were spliced, per reason (source_limit, \
             source_pending_limit, evicted, hello_timeout, closed, not_tls, malformed, too_large, \
             bad_name, proxy_header, unknown_sni, no_sni, no_backend, no_healthy_backend, \
             connect_limit, connect_failed)",
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
        registry.register(
            "open_connections",
            "Connections open now (not yet routed and spliced)",
            m.open.clone(),
        );
        registry.register(
            "pending_connections",
            "Connections not yet routed (reading their PROXY header and ClientHello)",
            m.pending.clone(),
        );
        registry.register(
            "max_connections",
            "The most connections open at once (--max-connections, or what open files allow)",
            m.max_connections.clone(),
        );
        registry.register(
            "accept_waits",
            "Times the accept loops waited for a free connection slot (every slot taken)",
            m.accept_waits.clone(),
        );
        registry.register(
            "closed",
            "Spliced connections ended by the router, per reason (idle_timeout, stall_timeout, error)",
            m.closed.clone(),
        );
        registry.register(
            "health_checks",
            "The router's own health checks answered (server name health.baton.invalid)",
            m.health_checks.clone(),
        );
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

    /// A spliced connection ended by the router (a timeout, an error).
    pub fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn health_check(&self) {
        self.health_checks.inc();
    }

    pub fn accept_waited(&self) {
        self.accept_waits.inc();
    }

    pub fn set_max_connections(&self, max: usize) {
        self.max_connections.set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// Counts a connection open until the guard is dropped.
    pub fn open(&self) -> GaugeGuard<'_> {
        GaugeGuard::new(&self.open)
    }

    /// Counts a connection pending until the guard is dropped.
    pub fn pending(&self) -> GaugeGuard<'_> {
        GaugeGuard::new(&self.pending)
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

    /// Bytes to the backend, counted as they go.
    pub fn to_backend(&self) -> &Counter {
        &self.to_backend
    }

    /// Bytes to the client, counted as they go.
    pub fn to_client(&self) -> &Counter {
        &self.to_client
    }
}

/// Holds a gauge one higher while it lives.
pub struct GaugeGuard<'a>(&'a Gauge);

impl<'a> GaugeGuard<'a> {
    fn new(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
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
