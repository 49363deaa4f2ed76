//! What `/health` and `/ready` report: the supervised controller tasks and whether an API server
//! answers; and a throttle for errors that repeat (a persistent RBAC denial on a watch).
//!
//! - `/health` (liveness) is 503 naming every task that ended or panicked before shutdown; the
//!   kubelet then restarts the pod. Each task's `baton_task_up{task}` is 1 while it runs.
//! - `/ready` is 503 when no API server answered any request for [`READY_WINDOW`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;

/// `/ready` fails once no API server answered for this long: two lease durations (eight renew
/// periods). A healthy replica talks to the API at least every second (lease renewals) and, even
/// without leader election, every few seconds (each watch is re-issued every
/// `kube::client::WATCH_TIMEOUT`).
pub const READY_WINDOW: Duration = Duration::from_secs(8);

/// Test-only (hidden, used by `tests/health.rs`): the supervised task of this name panics about a
/// second after it started, so a test can see `/health` report a dead task of the real binary.
pub const TEST_FAIL_TASK_ENV: &str = "BATON_TEST_FAIL_TASK";

/// Runs the controller's long-running tasks and remembers those that stopped unexpectedly.
#[derive(Clone)]
pub struct Supervisor(Arc<Inner>);

struct Inner {
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    dead: Mutex<BTreeMap<&'static str, String>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    fail_task: Option<String>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("dead", &self.dead())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// A task ending after `shutdown` is cancelled is expected; before, it is a failure.
    pub fn new(metrics: Arc<Metrics>, shutdown: CancellationToken) -> Self {
        let fail_task = std::env::var(TEST_FAIL_TASK_ENV).ok().filter(|v| !v.is_empty());
        if let Some(task) = &fail_task {
            tracing::warn!(
                task,
                "{TEST_FAIL_TASK_ENV} is set: this task will be made to fail (tests only)"
            );
        }
        Self(Arc::new(Inner {
            shutdown,
            metrics,
            dead: Mutex::new(BTreeMap::new()),
            handles: Mutex::new(Vec::new()),
            fail_task,
        }))
    }

    /// Spawns `task` under `name`.
    pub fn spawn<F>(&self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.0.metrics.set_task_up(name, true);
        let fail = self.0.fail_task.as_deref() == Some(name);
        let inner = tokio::spawn(async move {
            if fail {
                tokio::select! {
                    () = task => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        panic!("{TEST_FAIL_TASK_ENV}={name}: failing on purpose");
                    }
                }
            } else {
                task.await;
            }
        });
        let sup = Arc::clone(&self.0);
        let outer = tokio::spawn(async move {
            let why = match inner.await {
                Ok(()) => "ended".to_owned(),
                Err(e) if e.is_panic() => format!("panicked: {}", panic_message(&*e.into_panic())),
                Err(e) => e.to_string(),
            };
            if sup.shutdown.is_cancelled() {
                tracing::debug!(task = name, "stopped");
                return;
            }
            tracing::error!(
                task = name,
                why,
                "controller task stopped unexpectedly; /health now fails"
            );
            sup.metrics.set_task_up(name, false);
            sup.dead
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name, why);
        });
        self.0
            .handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(outer);
    }

    /// The tasks that stopped unexpectedly, with why.
    pub fn dead(&self) -> Vec<(&'static str, String)> {
        self.0
            .dead
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// `/health`: `None` while every task runs, else the reason.
    pub fn unhealthy(&self) -> Option<String> {
        let dead = self.dead();
        (!dead.is_empty()).then(|| {
            dead.iter()
                .map(|(task, why)| format!("task {task} {why}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// Waits up to `timeout` for every task to finish (after shutdown).
    pub async fn join(&self, timeout: Duration) {
        let handles = std::mem::take(&mut *self.0.handles.lock().unwrap_or_else(PoisonError::into_inner));
        let _ = tokio::time::timeout(timeout, futures::future::join_all(handles)).await;
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Lets an error that repeats be logged loudly at most once per period; the repeats in between
/// are counted and reported with the next loud line.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// Loud at most once per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(repeats suppressed since the last loud line)` when this one should be loud.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < self.every) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_throttle_lets_one_line_through_per_period() {
        let mut t = LogThrottle::new(Duration::from_millis(300));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(t.allow(), Some(2));
        assert_eq!(t.allow(), None);
    }

    #[tokio::test]
    async fn a_task_that_ends_or_panics_before_shutdown_is_reported() {
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(Arc::clone(&metrics), shutdown.clone());
        let token = shutdown.clone();
        sup.spawn("steady", async move { token.cancelled().await });
        sup.spawn("quitter", async {});
        sup.spawn("crasher", async { panic!("boom") });
        for _ in 0..100 {
            if sup.dead().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let why = sup.unhealthy().unwrap_or_default();
        assert_eq!(why, "task crasher panicked: boom; task quitter ended");
        let text = metrics.encode();
        assert!(text.contains("baton_task_up{task=\"steady\"} 1"), "{text}");
        assert!(text.contains("baton_task_up{task=\"quitter\"} 0"), "{text}");
        shutdown.cancel();
        sup.join(Duration::from_secs(5)).await;
        assert_eq!(sup.dead().len(), 2, "stopping at shutdown is no failure");
    }
}
