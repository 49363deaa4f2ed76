//! Prometheus metrics of the controller (prometheus-client), served on the admin port.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::probe::ProbeObserver;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    controller: String,
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabel {
    target: String,
    result: String,
}

/// The controller's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    failovers: Family<ReasonLabel, Counter>,
    failover_errors: Counter,
    stuck: Family<ReasonLabel, Counter>,
    time_to_recover: Histogram,
    probe_duration: Family<ProbeLabel, Histogram>,
    failover_fenced: Counter,
    failover_held: Counter,
    cloud_stale: Gauge,
    api_reachable: Gauge,
    api_failed: Family<ReasonLabel, Counter>,
    task_up: Family<TaskLabel, Gauge>,
    reconciles: Family<ControllerLabel, Counter>,
    reconcile_errors: Family<ErrorLabel, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn probe_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let failovers = Family::<ReasonLabel, Counter>::default();
        let failover_errors = Counter::default();
        let stuck = Family::<ReasonLabel, Counter>::default();
        let time_to_recover = Histogram::new([0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0]);
        let probe_duration =
            Family::<ProbeLabel, Histogram>::new_with_constructor(probe_histogram as fn() -> Histogram);
        registry.register(
            "failovers",
            "Control-plane FIP moves, by reason",
            failovers.clone(),
        );
        registry.register(
            "failover_errors",
            "Failed control-plane FIP retarget calls",
            failover_errors.clone(),
        );
        registry.register(
            "failover_stuck",
            "Times a FIP should have moved but no candidate was healthy",
            stuck.clone(),
        );
        registry.register(
            "failover_time_to_recover_seconds",
            "From the first failed probe (of the holder or through the FIP) to the completed retarget",
            time_to_recover.clone(),
        );
        registry.register(
            "probe_duration_seconds",
            "API server health probe latency, by target and result",
            probe_duration.clone(),
        );
        let failover_fenced = Counter::default();
        registry.register(
            "failover_fenced",
            "FIP moves given up because this replica's leadership ended before the call could leave",
            failover_fenced.clone(),
        );
        let failover_held = Counter::default();
        registry.register(
            "failover_held",
            "FIP moves for an unreachable FIP held back by the hold-down after a recent such move",
            failover_held.clone(),
        );
        let cloud_stale = Gauge::default();
        registry.register(
            "cloud_ip_list_stale",
            "1 while the cloud cannot be read and failover decisions use the last IP list read",
            cloud_stale.clone(),
        );
        let api_reachable = Gauge::default();
        let api_failed = Family::<ReasonLabel, Counter>::default();
        let task_up = Family::<TaskLabel, Gauge>::default();
        registry.register(
            "api_server_reachable",
            "1 while an API server answered within the readiness window, else 0",
            api_reachable.clone(),
        );
        registry.register(
            "api_requests_failed",
            "Failed Kubernetes API attempts (one per API server tried), by reason",
            api_failed.clone(),
        );
        registry.register(
            "task_up",
            "1 while a supervised controller task runs, 0 once it ended unexpectedly",
            task_up.clone(),
        );
        let reconciles = Family::<ControllerLabel, Counter>::default();
        let reconcile_errors = Family::<ErrorLabel, Counter>::default();
        registry.register(
            "reconciles",
            "Successful reconciles (a BGP pass counts as one), by controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by controller and error category",
            reconcile_errors.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            reconciles,
            reconcile_errors,
            api_reachable,
            api_failed,
            task_up,
            failovers,
            failover_errors,
            stuck,
            time_to_recover,
            probe_duration,
            failover_fenced,
            failover_held,
            cloud_stale,
        }
    }
}

impl Metrics {
    /// Records a completed move.
    pub fn failover(&self, reason: &str, recovered: Duration) {
        self.failovers
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
        self.time_to_recover.observe(recovered.as_secs_f64());
    }

    /// Records a failed retarget.
    pub fn failover_error(&self) {
        self.failover_errors.inc();
    }

    /// Records a move that could not happen.
    pub fn stuck(&self, reason: &str) {
        self.stuck
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records a move given up by the write fence.
    pub fn failover_fenced(&self) {
        self.failover_fenced.inc();
    }

    /// Records a move held back by the hold-down.
    pub fn failover_held(&self) {
        self.failover_held.inc();
    }

    /// Whether decisions currently use a stale IP list (the cloud cannot be read).
    pub fn cloud_stale(&self, stale: bool) {
        self.cloud_stale.set(i64::from(stale));
    }

    /// Sets `baton_api_server_reachable`.
    pub fn set_api_reachable(&self, reachable: bool) {
        self.api_reachable.set(i64::from(reachable));
    }

    /// Records a successful reconcile by `controller`.
    pub fn reconciled(&self, controller: &str) {
        self.reconciles
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// Records a failed reconcile by `controller`, by the error's category.
    pub fn reconcile_failed(&self, controller: &str, category: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabel {
                controller: controller.to_owned(),
                category: category.to_owned(),
            })
            .inc();
    }

    /// Sets `baton_task_up{task}`.
    pub fn set_task_up(&self, task: &str, up: bool) {
        self.task_up
            .get_or_create(&TaskLabel {
                task: task.to_owned(),
            })
            .set(i64::from(up));
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}

impl ProbeObserver for Metrics {
    fn observe(&self, target: SocketAddr, ok: bool, latency: Duration) {
        self.probe_duration
            .get_or_create(&ProbeLabel {
                target: target.to_string(),
                result: if ok { "ok" } else { "fail" }.to_owned(),
            })
            .observe(latency.as_secs_f64());
    }
}

impl crate::kube::client::ApiObserver for Metrics {
    fn request_failed(&self, reason: &'static str) {
        self.api_failed
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
