//! The plumbing every reconciler shares, written once: the time limit of a Kubernetes write, the
//! leader check before it, the retry rule after a failed reconcile, and one exponential backoff.
//!
//! ```text
//!  reconcile(obj) ── leader.ensure(step)? ── timed(step, api.patch(…)) ──► Ok(Action)
//!        │ Err(e: ReconcileError)
//!        ▼
//!  Retries::policy(key, e) ── metrics: reconcile errors by controller and category
//!        ├─ not the leader ─────► look again in 5 s (NOT_LEADER_RETRY)
//!        ├─ invalid spec ───────► await change (only an edit fixes it)
//!        └─ else ─► Retry-After, or Backoff::RECONCILE (1 s, doubling, ≤ 5 min, jittered)
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use rand::Rng as _;
use tracing::{debug, info, warn};

use super::context::LeaderGate;
use super::metrics::Metrics;

/// How long a Kubernetes write may take before the reconcile gives up on it (each attempt of the
/// failover client has its own, shorter, limit; this bounds the whole call).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kubernetes call that failed or did not finish in time, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum KubeCallError {
    #[error("{step}: {source}")]
    Failed {
        step: Cow<'static, str>,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{step} timed out")]
    TimedOut { step: Cow<'static, str> },
}

impl KubeCallError {
    /// `step` failed with `source`.
    pub fn failed(step: impl Into<Cow<'static, str>>, source: kube::Error) -> Self {
        Self::Failed {
            step: step.into(),
            source: Box::new(source),
        }
    }

    /// A stable category: `kube` or `timeout`.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Failed { .. } => "kube",
            Self::TimedOut { .. } => "timeout",
        }
    }

    /// The API server's status code, if it answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Failed { source, .. } => match &**source {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            Self::TimedOut { .. } => None,
        }
    }
}

/// Runs the Kubernetes call `f` for `step` within [`WRITE_TIMEOUT`].
pub async fn timed<T>(
    step: impl Into<Cow<'static, str>>,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeCallError> {
    match tokio::time::timeout(WRITE_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(KubeCallError::failed(step, source)),
        Err(_) => Err(KubeCallError::TimedOut { step: step.into() }),
    }
}

/// A write refused before it left: this replica does not hold the leader Lease.
#[derive(Debug, Clone, thiserror::Error)]
#[error("not the leader, {step} deferred")]
pub struct NotLeader {
    pub step: Cow<'static, str>,
}

impl LeaderGate {
    /// The leader check before a write: `Ok` while this replica leads.
    pub fn ensure(&self, step: impl Into<Cow<'static, str>>) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader { step: step.into() })
        }
    }
}

/// What the shared retry rule needs to know of a reconciler's error.
pub trait ReconcileError: std::error::Error {
    /// A stable category: the metric label and log field.
    fn category(&self) -> &'static str;
    /// Leadership ended during the reconcile ([`NOT_LEADER_RETRY`]).
    fn is_not_leader(&self) -> bool;
    /// Only a change of the object (or the configuration) can fix it: no retry.
    fn is_invalid_spec(&self) -> bool {
        false
    }
    /// How long the cloud asked to wait (`Retry-After`), or a fixed wait this error calls for.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// Exponential backoff: `base · 2^(attempt − 1)`, at most `cap`; with `jitter`, a uniform draw
/// between half of that and all of it (many objects failing together do not retry together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    pub jitter: bool,
}

impl Backoff {
    /// Retries of a failed reconcile: 1 s, doubling, at most 5 minutes, jittered.
    pub const RECONCILE: Self = Self {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(300),
        jitter: true,
    };

    /// The delay before attempt `attempt + 1`, after `attempt` (≥ 1) failures in a row.
    pub fn delay(&self, attempt: u32) -> Duration {
        let full = self
            .base
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(16)))
            .min(self.cap);
        if !self.jitter {
            return full;
        }
        let half = full / 2;
        half + rand::rng().random_range(Duration::ZERO..=full.saturating_sub(half))
    }
}

/// When a reconcile that found this replica no longer leading is tried again (benchmarks found a
/// Service that never got its FIP: its reconcile failed so after the new election's reconciles
/// had been handed out).
pub const NOT_LEADER_RETRY: Duration = Duration::from_secs(5);

/// One controller's failed attempts per object, and the retry rule of every reconciler
/// (controller-rs's `error_policy`): the error's category is counted in the metrics.
#[derive(Debug)]
pub struct Retries {
    controller: &'static str,
    failures: Mutex<HashMap<String, u32>>,
}

impl Retries {
    pub fn new(controller: &'static str) -> Self {
        Self {
            controller,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A reconcile of `key` succeeded: its next failure starts the backoff over.
    pub fn succeeded(&self, key: &str) {
        self.failures().remove(key);
    }

    /// What to do after `error` reconciling `key`.
    pub fn policy<E: ReconcileError>(&self, key: &str, error: &E, metrics: &Metrics) -> Action {
        self.retry_in(key, error, metrics)
            .map_or_else(Action::await_change, Action::requeue)
    }

    /// When to try `key` again after `error`; `None`: when it changes.
    fn retry_in<E: ReconcileError>(&self, key: &str, error: &E, metrics: &Metrics) -> Option<Duration> {
        let controller = self.controller;
        metrics.reconcile_failed(controller, error.category());
        if error.is_not_leader() {
            // Leadership lapsed during this reconcile, after its start (so the object is not
            // among the `Skipped` ones a new election reconciles), and this replica may already
            // lead again (a late renewal): look again soon. A follower's reconcile returns at
            // once, so this costs nothing there.
            debug!(controller, object = %key, "not the leader during this reconcile; looking again soon");
            return Some(NOT_LEADER_RETRY);
        }
        if error.is_invalid_spec() {
            info!(controller, object = %key, %error, "waiting for the object or the configuration to change");
            return None;
        }
        let attempt = {
            let mut failures = self.failures();
            let n = failures.entry(key.to_owned()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let delay = error
            .retry_after()
            .unwrap_or_else(|| Backoff::RECONCILE.delay(attempt))
            .min(Backoff::RECONCILE.cap);
        warn!(
            controller,
            object = %key,
            %error,
            category = error.category(),
            attempt,
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "reconcile failed"
        );
        Some(delay)
    }
}

/// The objects one controller has been told to reconcile (a change seen, a retry due, a new
/// leader's reconcile-all) and has not reconciled since: `baton_queue_depth{controller}`.
#[derive(Debug)]
pub struct Queue {
    controller: &'static str,
    keys: Mutex<std::collections::HashSet<String>>,
    metrics: Arc<Metrics>,
}

impl Queue {
    pub fn new(controller: &'static str, metrics: Arc<Metrics>) -> Self {
        metrics.set_queue_depth(controller, 0);
        Self {
            controller,
            keys: Mutex::new(std::collections::HashSet::new()),
            metrics,
        }
    }

    fn update(&self, f: impl FnOnce(&mut std::collections::HashSet<String>) -> bool) {
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if f(&mut keys) {
            self.metrics.set_queue_depth(self.controller, keys.len());
        }
    }

    /// `key` waits for a reconcile.
    pub fn add(&self, key: String) {
        self.update(|keys| keys.insert(key));
    }

    /// A reconcile of `key` starts.
    pub fn started(&self, key: &str) {
        self.update(|keys| keys.remove(key));
    }

    /// How many objects wait.
    pub fn depth(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

/// The objects whose reconcile a replica skipped because it did not lead: what it must look at
/// when it is elected. A replica that never led skipped every object it was told about, so its
/// first election reconciles them all; a leader whose Lease lapsed for a moment (an API server
/// too busy to renew it in time) reconciles only what came in meanwhile, not every object again.
#[derive(Debug)]
pub struct Skipped<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    keys: Mutex<std::collections::HashSet<ObjectRef<K>>>,
    store: Store<K>,
}

impl<K> Skipped<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// For the objects of `store` (used to forget skipped objects that are gone).
    pub fn new(store: Store<K>) -> Self {
        Self {
            keys: Mutex::new(std::collections::HashSet::new()),
            store,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<ObjectRef<K>>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A reconcile of `obj` was skipped: not the leader.
    pub fn record(&self, obj: &K) {
        let mut keys = self.lock();
        keys.insert(ObjectRef::from_obj(obj));
        // A replica that never leads must not collect every object ever deleted.
        if keys.len() > 2 * self.store.len() + 64 {
            keys.retain(|k| self.store.get(k).is_some());
        }
    }

    /// On each election, the objects skipped since the last one (each once).
    pub fn on_election(
        self: Arc<Self>,
        elected: impl futures::Stream<Item = ()> + Send + 'static,
    ) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static {
        use futures::StreamExt as _;
        elected.flat_map(move |()| {
            let keys: Vec<ObjectRef<K>> = self.lock().drain().collect();
            futures::stream::iter(keys)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> k8s_openapi::api::core::v1::Service {
        k8s_openapi::api::core::v1::Service {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_election_reconciles_what_was_skipped_since_the_last_one_once() {
        use futures::StreamExt as _;
        use kube::runtime::watcher::Event;
        let (store, mut writer) = kube::runtime::reflector::store();
        for name in ["a", "b", "c"] {
            writer.apply_watcher_event(&Event::Apply(service(name)));
        }
        let skipped = Arc::new(Skipped::new(store));
        skipped.record(&service("a"));
        skipped.record(&service("b"));
        skipped.record(&service("a"));
        let (elect, elections) = futures::channel::mpsc::unbounded::<()>();
        let mut due = std::pin::pin!(Arc::clone(&skipped).on_election(elections));
        elect.unbounded_send(()).unwrap();
        let mut first = vec![due.next().await.unwrap().name, due.next().await.unwrap().name];
        first.sort();
        assert_eq!(first, ["a", "b"]);
        // The Lease lapsed and came back: only what was skipped in between.
        skipped.record(&service("c"));
        elect.unbounded_send(()).unwrap();
        assert_eq!(due.next().await.unwrap().name, "c");
        elect.unbounded_send(()).unwrap();
        drop(elect);
        assert!(due.next().await.is_none(), "nothing skipped since: nothing to do");
    }

    #[test]
    fn a_replica_that_never_leads_forgets_skipped_objects_that_are_gone() {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(service("kept")));
        let skipped = Skipped::new(store);
        skipped.record(&service("kept"));
        for i in 0..1_000 {
            skipped.record(&service(&format!("deleted-{i}")));
        }
        let held = skipped.lock().len();
        assert!(held <= 2 + 64 + 1, "{held} keys held for a store of one object");
        assert!(skipped.lock().contains(&ObjectRef::from_obj(&service("kept"))));
    }

    #[test]
    fn the_queue_counts_each_waiting_object_once_until_its_reconcile_starts() {
        let metrics = Arc::new(Metrics::default());
        let queue = Queue::new("services", Arc::clone(&metrics));
        let depth = |m: &Metrics| {
            m.encode()
                .lines()
                .find(|l| l.starts_with("baton_queue_depth{controller=\"services\"}"))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        };
        assert_eq!(depth(&metrics).as_deref(), Some("0"), "exported from the start");
        queue.add("a/x".into());
        queue.add("a/y".into());
        queue.add("a/x".into());
        assert_eq!((queue.depth(), depth(&metrics).as_deref()), (2, Some("2")));
        queue.started("a/x");
        queue.started("a/unknown");
        assert_eq!((queue.depth(), depth(&metrics).as_deref()), (1, Some("1")));
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_jitter_stays_within_half_and_full() {
        let plain = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            jitter: false,
        };
        let ms: Vec<u128> = (1..=7).map(|a| plain.delay(a).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(plain.delay(u32::MAX), Duration::from_secs(2), "no overflow");

        for attempt in 1..=12 {
            let full = Duration::from_secs(1)
                .saturating_mul(2u32.pow(attempt - 1))
                .min(Duration::from_secs(300));
            for _ in 0..50 {
                let d = Backoff::RECONCILE.delay(attempt);
                assert!(
                    d >= full / 2 && d <= full,
                    "attempt {attempt}: {d:?} outside [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
    }

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error("flaky")]
        Flaky,
        #[error("bad spec")]
        Invalid,
        #[error(transparent)]
        NotLeader(#[from] NotLeader),
        #[error("slow down")]
        RateLimited,
    }

    impl ReconcileError for TestError {
        fn category(&self) -> &'static str {
            match self {
                Self::Flaky => "flaky",
                Self::Invalid => "invalid",
                Self::NotLeader(_) => "not_leader",
                Self::RateLimited => "rate_limited",
            }
        }
        fn is_not_leader(&self) -> bool {
            matches!(self, Self::NotLeader(_))
        }
        fn is_invalid_spec(&self) -> bool {
            matches!(self, Self::Invalid)
        }
        fn retry_after(&self) -> Option<Duration> {
            matches!(self, Self::RateLimited).then_some(Duration::from_secs(7))
        }
    }

    #[test]
    fn the_retry_rule_backs_off_per_object_and_counts_every_failure_by_category() {
        let metrics = Metrics::default();
        let retries = Retries::new("test");
        assert_eq!(retries.retry_in("a", &TestError::Invalid, &metrics), None);
        let not_leader = TestError::from(NotLeader { step: "x".into() });
        assert_eq!(
            retries.retry_in("a", &not_leader, &metrics),
            Some(NOT_LEADER_RETRY),
            "looked at again: this replica may lead again already"
        );
        assert_eq!(
            retries.retry_in("a", &TestError::RateLimited, &metrics),
            Some(Duration::from_secs(7)),
            "the cloud's Retry-After wins"
        );
        // "a" has failed once (the rate limit): its next retry waits 1–2 s, "b"'s first 0.5–1 s.
        let within = |d: Option<Duration>, lo: u64, hi: u64| {
            d.is_some_and(|d| d >= Duration::from_millis(lo) && d <= Duration::from_millis(hi))
        };
        let a = retries.retry_in("a", &TestError::Flaky, &metrics);
        let b = retries.retry_in("b", &TestError::Flaky, &metrics);
        assert!(within(a, 1000, 2000), "{a:?}");
        assert!(within(b, 500, 1000), "{b:?}");
        retries.succeeded("a");
        let a = retries.retry_in("a", &TestError::Flaky, &metrics);
        assert!(within(a, 500, 1000), "a success starts over: {a:?}");
        assert_eq!(
            format!("{:?}", retries.policy("c", &TestError::Invalid, &metrics)),
            format!("{:?}", Action::await_change())
        );

        let text = metrics.encode();
        for line in [
            r#"baton_reconcile_errors_total{controller="test",category="flaky"} 3"#,
            r#"baton_reconcile_errors_total{controller="test",category="invalid"} 2"#,
            r#"baton_reconcile_errors_total{controller="test",category="not_leader"} 1"#,
            r#"baton_reconcile_errors_total{controller="test",category="rate_limited"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
