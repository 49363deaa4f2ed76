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
struct LoopLabel {
    r#loop: String,
}

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
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabel {
    task: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloudLabel {
    route: &'static str,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    priority: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FipKindLabel {
    kind: &'static str,
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
    lease_handoffs: Counter,
    cloud_stale: Gauge,
    api_reachable: Gauge,
    api_failed: Family<ReasonLabel, Counter>,
    task_up: Family<TaskLabel, Gauge>,
    reconciles: Family<ControllerLabel, Counter>,
    reconcile_errors: Family<ErrorLabel, Counter>,
    watch_events: Family<KindLabel, Counter>,
    queue_depth: Family<ControllerLabel, Gauge>,
    services_pending: Gauge,
    fips_owned: Family<FipKindLabel, Gauge>,
    leader: Gauge,
    leaderless: Gauge<f64, std::sync::atomic::AtomicU64>,
    loop_age: Family<LoopLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    cloud_requests: Family<CloudLabel, Counter>,
    cloud_wait: Family<PriorityLabel, Histogram>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn probe_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5])
}

fn wait_histogram() -> Histogram {
    Histogram::new([0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// Registers `metric` under `name` and hands it back.
fn register<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    #[allow(clippy::too_many_lines)] // one registration per metric, a flat table
    fn default() -> Self {
        let mut registry = Registry::with_prefix("baton");
        let r = &mut registry;
        let mut metrics = Self {
            failovers: register(
                r,
                "failovers",
                "Control-plane FIP moves, by reason",
                Family::default(),
            ),
            failover_errors: register(
                r,
                "failover_errors",
                "Failed control-plane FIP retarget calls",
                Counter::default(),
            ),
            stuck: register(
                r,
                "failover_stuck",
                "Times a FIP should have moved but no candidate was healthy",
                Family::default(),
            ),
            time_to_recover: register(
                r,
                "failover_time_to_recover_seconds",
                "From the first failed probe (of the holder or through the FIP) to the completed retarget",
                Histogram::new([0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0]),
            ),
            probe_duration: register(
                r,
                "probe_duration_seconds",
                "API server health probe latency, by target and result",
                Family::new_with_constructor(probe_histogram as fn() -> Histogram),
            ),
            failover_fenced: register(
                r,
                "failover_fenced",
                "FIP moves given up because this replica's leadership ended before the call could leave",
                Counter::default(),
            ),
            failover_held: register(
                r,
                "failover_held",
                "FIP moves held back after a recent move: of an unreachable FIP (hold-down), or of a new holder failing since the move to it (ping-pong), once per hold",
                Counter::default(),
            ),
            lease_handoffs: register(
                r,
                "lease_handoffs",
                "Hand-offs of the leader Lease asked for by a leader on a control-plane FIP holder's node, to a replica on another node",
                Counter::default(),
            ),
            cloud_stale: register(
                r,
                "cloud_ip_list_stale",
                "1 while the cloud cannot be read and failover decisions use the last IP list read",
                Gauge::default(),
            ),
            api_reachable: register(
                r,
                "api_server_reachable",
                "1 while an API server answered within the readiness window, else 0",
                Gauge::default(),
            ),
            api_failed: register(
                r,
                "api_requests_failed",
                "Failed Kubernetes API attempts (one per API server tried), by reason",
                Family::default(),
            ),
            task_up: register(
                r,
                "task_up",
                "1 while a supervised controller task runs, 0 once it ended unexpectedly",
                Family::default(),
            ),
            reconciles: register(
                r,
                "reconciles",
                "Successful reconciles (a BGP pass counts as one), by controller",
                Family::default(),
            ),
            reconcile_errors: register(
                r,
                "reconcile_errors",
                "Failed reconciles, by controller and error category",
                Family::default(),
            ),
            watch_events: register(
                r,
                "watch_events",
                "Objects received from the shared watches (listed or changed), by kind",
                Family::default(),
            ),
            queue_depth: register(
                r,
                "queue_depth",
                "Objects waiting for a reconcile (changed, or due for a retry), by controller",
                Family::default(),
            ),
            services_pending: register(
                r,
                "services_pending",
                "LoadBalancer Services baton manages that have no ingress yet",
                Gauge::default(),
            ),
            fips_owned: register(
                r,
                "fips_owned",
                "Floating IPs of this cluster in the project, by kind (service, control_plane); the leader's count",
                Family::default(),
            ),
            leader: register(
                r,
                "leader",
                "1 while this replica holds the leader Lease, else 0",
                Gauge::default(),
            ),
            leaderless: register(
                r,
                "leaderless_seconds",
                "Seconds since this replica last saw any replica lead (itself, or the holder of a Lease record not yet expired); 0 while one leads",
                Gauge::default(),
            ),
            loop_age: register(
                r,
                "loop_heartbeat_age_seconds",
                "How long each long-running controller loop has been in its current unit of work (0 while it waits); /health fails past the stall limit",
                Family::default(),
            ),
            cloud_requests: register(
                r,
                "cloud_requests",
                "Requests sent to the cloud API (first tries and retries), by route and HTTP status or transport failure",
                Family::default(),
            ),
            cloud_wait: register(
                r,
                "cloud_rate_limit_wait_seconds",
                "Time a cloud request waited for the client's rate limit before it was sent, by priority",
                Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            ),
            registry: Mutex::new(Registry::default()),
        };
        *metrics
            .registry
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = registry;
        metrics.export_known_series();
        metrics
    }
}

impl Metrics {
    /// Creates at zero every series whose label values are known in advance, so each metric is
    /// on `/metrics` from the start (an empty family is not exported) and `rate()` and
    /// `absent()` work before the first occurrence.
    fn export_known_series(&self) {
        for reason in baton_core::failover::Reason::ALL {
            let label = ReasonLabel {
                reason: reason.as_str().to_owned(),
            };
            drop(self.failovers.get_or_create(&label));
            drop(self.stuck.get_or_create(&label));
        }
        for reason in crate::kube::client::FAILURE_REASONS {
            drop(self.api_failed.get_or_create(&ReasonLabel {
                reason: (*reason).to_owned(),
            }));
        }
        for controller in ["services", "nodes", "bgp"] {
            drop(self.reconciles.get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            }));
        }
        for kind in ["Service", "Node", "EndpointSlice"] {
            drop(self.watch_events.get_or_create(&KindLabel {
                kind: kind.to_owned(),
            }));
        }
        for kind in ["control_plane", "service"] {
            drop(self.fips_owned.get_or_create(&FipKindLabel { kind }));
        }
        for priority in [baton_cloud::Priority::Urgent, baton_cloud::Priority::Normal] {
            drop(self.cloud_wait.get_or_create(&PriorityLabel {
                priority: priority.as_str(),
            }));
        }
    }

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

    /// Records a hand-off of the Lease asked for (the leader was on a FIP holder's node).
    pub fn lease_handoff(&self) {
        self.lease_handoffs.inc();
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

    /// Records an object received from a shared watch of `kind`.
    pub fn watch_event(&self, kind: &str) {
        self.watch_events
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
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

    /// Sets `baton_queue_depth{controller}`.
    pub fn set_queue_depth(&self, controller: &str, depth: usize) {
        self.queue_depth
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// Sets `baton_services_pending`.
    pub fn set_services_pending(&self, pending: usize) {
        self.services_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    /// Sets `baton_fips_owned{kind}`.
    pub fn set_fips_owned(&self, kind: &'static str, count: usize) {
        self.fips_owned
            .get_or_create(&FipKindLabel { kind })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets `baton_leaderless_seconds`.
    pub fn set_leaderless(&self, for_: Duration) {
        self.leaderless.set(for_.as_secs_f64());
    }

    /// Sets `baton_loop_heartbeat_age_seconds{loop}`.
    pub fn set_loop_age(&self, name: &str, age: Duration) {
        self.loop_age
            .get_or_create(&LoopLabel {
                r#loop: name.to_owned(),
            })
            .set(age.as_secs_f64());
    }

    /// Sets `baton_leader`.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
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

impl baton_cloud::CallObserver for Metrics {
    fn attempt(
        &self,
        _op: baton_cloud::Op,
        route: &'static str,
        priority: baton_cloud::Priority,
        outcome: baton_cloud::Attempt,
        queued: Duration,
    ) {
        let status = match outcome {
            baton_cloud::Attempt::Status(code) => code.to_string(),
            baton_cloud::Attempt::Transport(kind) => kind.to_owned(),
        };
        self.cloud_requests
            .get_or_create(&CloudLabel { route, status })
            .inc();
        self.cloud_wait
            .get_or_create(&PriorityLabel {
                priority: priority.as_str(),
            })
            .observe(queued.as_secs_f64());
    }
}
