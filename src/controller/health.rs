//! What `/health` and `/ready` report: the supervised controller tasks, each long-running loop's
//! heartbeat, whether an API server answers successfully, and how long no replica has led; and a
//! throttle for errors that repeat (a persistent RBAC denial on a watch).
//!
//! ```text
//!  loop ──beat()/idle(wait)──┐                 reconcile ──work() guard──┐
//!                            ▼                                           ▼
//!              Heartbeats: per loop, the start of each unit of work in flight
//!                            │ age = now − oldest start (0 while it only waits)
//!                            ▼
//!  /health: 503 "loop <name> stalled …" past the stall limit, or "task <name> …" for a dead task;
//!           200 "ok" + one line per loop with its age
//!  /metrics: baton_loop_heartbeat_age_seconds{loop}, baton_leaderless_seconds
//! ```
//!
//! - `/health` (liveness) is 503 naming every task that ended or panicked before shutdown, and
//!   every loop stuck in one unit of work (a cloud call, a reconcile) past the stall limit
//!   (`loopStallLimit`, [`crate::config::Config::stall_limit`]); the kubelet then restarts the
//!   pod. Each task's `baton_task_up{task}` is 1 while it runs.
//! - `/ready` is 503 when no API server answered a request successfully (401, 403 and 5xx do not
//!   count) for [`READY_WINDOW`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::context::LeaderGate;
use super::metrics::Metrics;

/// `/ready` fails once no API server answered successfully for this long: two lease durations (eight renew
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

/// The heartbeats of the controller's long-running loops, and the limit past which a loop counts
/// as stalled.
#[derive(Clone)]
pub struct Heartbeats(Arc<Beats>);

struct Beats {
    limit: Duration,
    loops: Mutex<BTreeMap<&'static str, BTreeMap<u64, Instant>>>,
    next: AtomicU64,
    /// Why a duty is refused (the Kubernetes version floor): `/ready` fails naming it.
    refused: Mutex<Option<String>>,
}

/// The slot of a loop's own unit of work (concurrent work takes the others).
const OWN: u64 = 0;

impl std::fmt::Debug for Heartbeats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeats")
            .field("limit", &self.0.limit)
            .field("ages", &self.ages())
            .finish()
    }
}

impl Default for Heartbeats {
    /// The limit at the default settings (150 s).
    fn default() -> Self {
        Self::new(Duration::from_secs(150))
    }
}

/// One loop's heartbeat.
#[derive(Clone)]
pub struct Heartbeat {
    beats: Arc<Beats>,
    name: &'static str,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Heartbeat").field(&self.name).finish()
    }
}

/// A unit of work in flight ([`Heartbeat::work`]); it ends when dropped.
#[must_use = "the work ends when this is dropped"]
pub struct Working {
    beats: Arc<Beats>,
    name: &'static str,
    id: u64,
}

impl Drop for Working {
    fn drop(&mut self) {
        self.beats.update(self.name, |slots| {
            slots.remove(&self.id);
        });
    }
}

impl Beats {
    fn update(&self, name: &'static str, f: impl FnOnce(&mut BTreeMap<u64, Instant>)) {
        let mut loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        f(loops.entry(name).or_default());
    }
}

impl Heartbeats {
    /// A loop counts as stalled once one unit of work has taken longer than `limit`.
    pub fn new(limit: Duration) -> Self {
        Self(Arc::new(Beats {
            limit,
            loops: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(OWN + 1),
            refused: Mutex::new(None),
        }))
    }

    /// Marks a duty as refused for `why`: `/ready` fails with it from now on.
    pub fn refuse(&self, why: String) {
        *self.0.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
    }

    /// Why a duty is refused, if one is.
    pub fn refused(&self) -> Option<String> {
        self.0
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The stall limit.
    pub fn limit(&self) -> Duration {
        self.0.limit
    }

    /// The heartbeat of a loop that runs one unit of work after another (a decision loop): at
    /// work from now until its first [`Heartbeat::idle`] or [`Heartbeat::beat`].
    pub fn start_loop(&self, name: &'static str) -> Heartbeat {
        self.0.update(name, |slots| {
            slots.insert(OWN, Instant::now());
        });
        Heartbeat {
            beats: Arc::clone(&self.0),
            name,
        }
    }

    /// The heartbeat of concurrent workers (a controller's reconciles): each takes a
    /// [`Heartbeat::work`] guard; none in flight is no stall.
    pub fn workers(&self, name: &'static str) -> Heartbeat {
        self.0.update(name, |_| {});
        Heartbeat {
            beats: Arc::clone(&self.0),
            name,
        }
    }

    /// Each loop and how long its oldest unit of work in flight has run (zero while it waits).
    pub fn ages(&self) -> Vec<(&'static str, Duration)> {
        let now = Instant::now();
        self.0
            .loops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, slots)| {
                let age = slots
                    .values()
                    .min()
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(*t));
                (*name, age)
            })
            .collect()
    }

    /// The loops stalled past the limit, with their ages.
    pub fn stalled(&self) -> Vec<(&'static str, Duration)> {
        self.ages()
            .into_iter()
            .filter(|(_, age)| *age > self.0.limit)
            .collect()
    }

    /// Publishes every loop's age as `baton_loop_heartbeat_age_seconds{loop}`.
    pub fn export(&self, metrics: &Metrics) {
        for (name, age) in self.ages() {
            metrics.set_loop_age(name, age);
        }
    }
}

impl Heartbeat {
    /// The loop starts its next unit of work now (the last one ended).
    pub fn beat(&self) {
        self.beats.update(self.name, |slots| {
            slots.insert(OWN, Instant::now());
        });
    }

    /// Waits for `f` as the loop's idle time (waiting for a change, a tick, leadership: not
    /// stalled however long it takes); the next unit of work starts when it returns.
    pub async fn idle<F: Future>(&self, f: F) -> F::Output {
        struct Resume<'a>(&'a Heartbeat);
        impl Drop for Resume<'_> {
            fn drop(&mut self) {
                self.0.beat();
            }
        }
        self.beats.update(self.name, |slots| {
            slots.remove(&OWN);
        });
        let _resume = Resume(self);
        f.await
    }

    /// A unit of work of one of the loop's concurrent workers, from now until the guard drops.
    pub fn work(&self) -> Working {
        let id = self.beats.next.fetch_add(1, Ordering::Relaxed);
        self.beats.update(self.name, |slots| {
            slots.insert(id, Instant::now());
        });
        Working {
            beats: Arc::clone(&self.beats),
            name: self.name,
            id,
        }
    }
}

/// `/health`: whether every task runs and no loop is stalled, and the text: what failed (each
/// dead task, each stalled loop), or `ok`; then one line per loop with its heartbeat age.
pub fn health(sup: &Supervisor, beats: &Heartbeats) -> (bool, String) {
    let limit = beats.limit();
    let mut failed: Vec<String> = beats
        .stalled()
        .into_iter()
        .map(|(name, age)| {
            format!(
                "loop {name} stalled: {:.1}s in one unit of work (limit {}s)",
                age.as_secs_f64(),
                limit.as_secs()
            )
        })
        .collect();
    failed.extend(sup.unhealthy());
    let ok = failed.is_empty();
    let mut text = if ok { "ok".to_owned() } else { failed.join("; ") };
    for (name, age) in beats.ages() {
        let _ = write!(
            text,
            "\nloop {name}: heartbeat age {:.1}s (limit {}s)",
            age.as_secs_f64(),
            limit.as_secs()
        );
    }
    (ok, text)
}

/// How long no replica has been seen leading, on this replica's clock: from its own term and,
/// while another replica holds the Lease, that record's expiry (the Lease watch). Its own term
/// counts as led until its Lease could expire for a follower
/// ([`LeaderGate::term_surely_held_until`]), so a renewal that is late but lands is no
/// leaderless time, and a holder cut off from its API server is, from when a follower could
/// take over. Counts from the start of the process until a leader is first seen.
#[derive(Debug)]
pub struct Leaderless(Mutex<Instant>);

impl Default for Leaderless {
    fn default() -> Self {
        Self(Mutex::new(Instant::now()))
    }
}

impl Leaderless {
    /// Looks at `gate` now; returns how long no replica has led.
    pub fn observe(&self, gate: &LeaderGate) -> Duration {
        Self::observe_at(
            &self.0,
            Instant::now(),
            gate.term_surely_held_until(),
            gate.handover().map(|h| h.takeover),
        )
    }

    /// `own`: this replica leads until then; `other`: another holder's record expires then.
    fn observe_at(
        last: &Mutex<Instant>,
        now: Instant,
        own: Option<Instant>,
        other: Option<Instant>,
    ) -> Duration {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        for until in [own, other].into_iter().flatten() {
            *last = (*last).max(until.min(now));
        }
        now.saturating_duration_since(*last)
    }
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

    #[tokio::test(start_paused = true)]
    async fn a_loop_stuck_in_one_unit_of_work_is_stalled_and_waiting_is_not() {
        let beats = Heartbeats::new(Duration::from_secs(10));
        let sup = Supervisor::new(Arc::new(Metrics::default()), CancellationToken::new());
        let decide = beats.start_loop("endpoints");
        let reconcile = beats.workers("services");
        // Waiting (a tick, a change, leadership) is never a stall, however long.
        decide.idle(tokio::time::sleep(Duration::from_secs(60))).await;
        assert!(beats.stalled().is_empty(), "{beats:?}");
        decide.beat();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let slow = reconcile.work();
        let quick = reconcile.work();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(quick);
        assert_eq!(
            beats.ages(),
            [
                ("endpoints", Duration::from_secs(8)),
                ("services", Duration::from_secs(5))
            ]
        );
        let (ok, text) = health(&sup, &beats);
        assert!(ok, "{text}");
        assert!(
            text.starts_with("ok\nloop endpoints: heartbeat age 8.0s (limit 10s)"),
            "{text}"
        );
        // The decision loop is in one unit of work (a cloud call) past the limit; the oldest
        // reconcile in flight too.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (ok, text) = health(&sup, &beats);
        assert!(!ok);
        assert!(
            text.starts_with(
                "loop endpoints stalled: 14.0s in one unit of work (limit 10s); \
                 loop services stalled: 11.0s in one unit of work (limit 10s)"
            ),
            "{text}"
        );
        // Back: the loop waits again, the reconcile returned.
        decide.idle(std::future::ready(())).await;
        drop(slow);
        let (ok, text) = health(&sup, &beats);
        assert!(ok, "{text}");
        let metrics = Metrics::default();
        beats.export(&metrics);
        let text = metrics.encode();
        assert!(
            text.contains("baton_loop_heartbeat_age_seconds{loop=\"services\"} 0.0"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leaderless_counts_from_the_last_moment_any_replica_was_seen_leading() {
        let start = Instant::now();
        let last = Mutex::new(start);
        let at = |s: u64| start + Duration::from_secs(s);
        let secs = Duration::from_secs;
        // Nobody led yet: counts from the start.
        assert_eq!(Leaderless::observe_at(&last, at(5), None, None), secs(5));
        // Another replica holds a record that expires at 12 s: a leader.
        assert_eq!(Leaderless::observe_at(&last, at(6), None, Some(at(12))), secs(0));
        // It expired and was not renewed.
        assert_eq!(Leaderless::observe_at(&last, at(20), None, Some(at(12))), secs(8));
        // This replica leads until 31 s, and is seen at 30 s; then its lease lapses.
        assert_eq!(
            Leaderless::observe_at(&last, at(30), Some(at(31)), Some(at(12))),
            secs(0)
        );
        assert_eq!(Leaderless::observe_at(&last, at(40), None, None), secs(10));
        assert_eq!(
            Leaderless::observe_at(&last, at(41), Some(at(31)), None),
            secs(10)
        );
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
