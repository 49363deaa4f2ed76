//! Continuous, parallel `/readyz` probes with rise/fall hysteresis: the one prober of the
//! controller (every candidate API server and every FIP) and the bootstrap (every address its
//! DNS names may carry).
//!
//! One task per target starts a probe every `interval` with a fresh TLS connection (no pooling:
//! a probe through a FIP must follow the FIP when it moves), verifying the API server's
//! certificate against the cluster CA for `server_name` while connecting to the target's address.
//! Probes overlap: a probe that hangs until its `timeout` (a hung API server accepts TCP and then
//! answers nothing; a blackholed node answers nothing at all) does not delay the next one, so a
//! hung or vanished server is detected `fall` intervals plus one timeout after it stops, not `fall`
//! timeouts. Results feed a [`HealthTracker`] per target in the order they complete; the health
//! map is published on a watch channel, so the failover loop reacts to a change at once instead
//! of polling. Each target also remembers when its current run of failures began (the start of
//! its first failed probe), which is where a failover's time to recover is measured from.
//!
//! ```text
//!   set_targets([addr…]) ── one ProbeLoop per target ── GET https://<server_name>:<port><path>
//!                                (connected to addr, TLS by crate::kube::tls)
//!                                — or a caller's own check (`Prober::with_check`: the
//!                                controller's probe of the SNI router)
//!        ▼ HealthTracker (rise/fall), failing_since
//!   watch<BTreeMap<SocketAddr, Health>> ──▶ subscribe(): the failover loop, the bootstrap's DNS
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;

use baton_core::health::{Health, HealthTracker, Thresholds};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// How to probe.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// The HTTP path (`/readyz`).
    pub path: String,
    /// The TLS server name to verify (e.g. `kubernetes.default.svc`).
    pub server_name: String,
    /// Cluster CA certificates (DER).
    pub ca_der: Vec<Vec<u8>>,
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
}

/// Observer of each probe's latency and outcome (metrics).
pub trait ProbeObserver: Send + Sync {
    /// One probe of `target` finished.
    fn observe(&self, target: SocketAddr, ok: bool, latency: Duration);
}

impl ProbeObserver for () {
    fn observe(&self, _: SocketAddr, _: bool, _: Duration) {}
}

/// A probe of its own: resolves to whether `target` is healthy (bounded by the settings'
/// timeout).
pub type Check = Arc<dyn Fn(SocketAddr) -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// The set of probed targets and their current health.
pub struct Prober {
    settings: ProbeSettings,
    /// `None`: `GET <path>` over TLS.
    check: Option<Check>,
    observer: Arc<dyn ProbeObserver>,
    tasks: BTreeMap<SocketAddr, CancellationToken>,
    /// Every probe loop stops when this is cancelled (or the prober dropped).
    shutdown: CancellationToken,
    health_tx: watch::Sender<BTreeMap<SocketAddr, Health>>,
    failing_since: FailingSince,
}

/// Per target: the start of the first failed probe since its last successful one, and when its
/// last failed probe ended.
type FailingSince = Arc<Mutex<Runs>>;

#[derive(Debug, Default)]
struct Runs {
    failing_since: BTreeMap<SocketAddr, Instant>,
    last_failure: BTreeMap<SocketAddr, Instant>,
}

/// Errors building probe clients.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid cluster CA certificate: {0}")]
    Ca(#[source] rustls::Error),
    #[error("building the probe client: {0}")]
    Client(#[source] reqwest::Error),
}

impl Prober {
    /// A prober with no targets yet.
    pub fn new(settings: ProbeSettings, observer: Arc<dyn ProbeObserver>) -> Self {
        Self::with_shutdown(settings, observer, CancellationToken::new())
    }

    /// A prober with no targets yet whose probes also stop when `shutdown` is cancelled.
    pub fn with_shutdown(
        settings: ProbeSettings,
        observer: Arc<dyn ProbeObserver>,
        shutdown: CancellationToken,
    ) -> Self {
        let (health_tx, _) = watch::channel(BTreeMap::new());
        Self {
            settings,
            check: None,
            observer,
            tasks: BTreeMap::new(),
            shutdown,
            health_tx,
            failing_since: FailingSince::default(),
        }
    }

    /// A prober whose probes run `check` instead of `GET <path>` (the settings' interval,
    /// timeout and thresholds apply; its path, server name and CA are not used).
    pub fn with_check(settings: ProbeSettings, observer: Arc<dyn ProbeObserver>, check: Check) -> Self {
        let mut prober = Self::new(settings, observer);
        prober.check = Some(check);
        prober
    }

    /// When `target`'s current run of failed probes began (`None` after a success).
    pub fn failing_since(&self, target: &SocketAddr) -> Option<Instant> {
        self.failing_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .failing_since
            .get(target)
            .copied()
    }

    /// When `target`'s last failed probe ended (`None`: none since it was first probed).
    pub fn last_failure(&self, target: &SocketAddr) -> Option<Instant> {
        self.failing_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .last_failure
            .get(target)
            .copied()
    }

    /// Subscribes to health changes.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<SocketAddr, Health>> {
        self.health_tx.subscribe()
    }

    /// The current health of `target` (`Unknown` if not probed).
    pub fn health(&self, target: &SocketAddr) -> Health {
        self.health_tx.borrow().get(target).copied().unwrap_or_default()
    }

    /// Forgets `target`'s history (its health becomes `Unknown`) and probes it afresh.
    pub fn reset(&mut self, target: &SocketAddr) -> Result<(), ProbeError> {
        if let Some(token) = self.tasks.remove(target) {
            token.cancel();
        }
        self.health_tx.send_if_modified(|m| m.remove(target).is_some());
        self.forget_failures(target);
        let targets: Vec<SocketAddr> = self
            .tasks
            .keys()
            .copied()
            .chain(std::iter::once(*target))
            .collect();
        self.set_targets(&targets)
    }

    /// Probes exactly `targets` from now on: starts new ones, stops the rest.
    pub fn set_targets(&mut self, targets: &[SocketAddr]) -> Result<(), ProbeError> {
        let gone: Vec<SocketAddr> = self
            .tasks
            .keys()
            .filter(|t| !targets.contains(t))
            .copied()
            .collect();
        for t in gone {
            if let Some(token) = self.tasks.remove(&t) {
                token.cancel();
            }
            self.health_tx.send_if_modified(|m| m.remove(&t).is_some());
            self.forget_failures(&t);
        }
        for &t in targets {
            if self.tasks.contains_key(&t) {
                continue;
            }
            let check = match &self.check {
                Some(check) => Arc::clone(check),
                None => readyz(&self.settings, t)?,
            };
            let token = self.shutdown.child_token();
            self.tasks.insert(t, token.clone());
            self.health_tx
                .send_if_modified(|m| m.insert(t, Health::Unknown).is_none());
            tokio::spawn(
                ProbeLoop {
                    check,
                    target: t,
                    settings: self.settings.clone(),
                    health_tx: self.health_tx.clone(),
                    failing_since: Arc::clone(&self.failing_since),
                    observer: Arc::clone(&self.observer),
                }
                .run(token)
                .instrument(tracing::info_span!("readyz", target = %t)),
            );
        }
        Ok(())
    }

    fn forget_failures(&self, target: &SocketAddr) {
        let mut runs = self
            .failing_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        runs.failing_since.remove(target);
        runs.last_failure.remove(target);
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        for token in self.tasks.values() {
            token.cancel();
        }
    }
}

/// One probe of `target`, now (for `baton status`): `Ok` on a 2xx answer within the timeout,
/// else why not. Same client, TLS rules and URL as the continuous probes.
pub async fn probe_once(settings: &ProbeSettings, target: SocketAddr) -> Result<(), String> {
    let client = probe_client(settings, target).map_err(|e| e.to_string())?;
    let url = format!(
        "https://{}:{}{}",
        settings.server_name,
        target.port(),
        settings.path
    );
    match client.get(&url).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("{} answered {}", settings.path, r.status())),
        Err(e) => Err(error_chain(&e)),
    }
}

fn probe_client(s: &ProbeSettings, target: SocketAddr) -> Result<reqwest::Client, ProbeError> {
    let tls = crate::kube::tls::client_config(&s.ca_der).map_err(ProbeError::Ca)?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(&s.server_name, target)
        .pool_max_idle_per_host(0)
        .connect_timeout(s.timeout)
        .timeout(s.timeout)
        .no_proxy()
        .build()
        .map_err(ProbeError::Client)
}

/// `GET url` answers 2xx (within the client's own timeout: connect, TLS and answer); why not is
/// logged at debug.
async fn answers_ok(client: &reqwest::Client, url: &str) -> bool {
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            tracing::debug!(status = %r.status(), "probe failed");
            false
        }
        Err(e) => {
            tracing::debug!(reason = %error_chain(&e), "probe failed");
            false
        }
    }
}

/// `GET http://<target><path>` in plain HTTP: healthy on a 2xx answer within `timeout` (the
/// routing loop's check of a node's kube-proxy, `/healthz` on port 10256).
pub fn plain_http_check(path: &str, timeout: std::time::Duration) -> Result<Check, ProbeError> {
    // reqwest is built with rustls and no default crypto provider: it needs a TLS config even for
    // plain HTTP.
    let tls = crate::kube::tls::client_config(&[]).map_err(ProbeError::Ca)?;
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .pool_max_idle_per_host(0)
        .connect_timeout(timeout)
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(ProbeError::Client)?;
    let path = path.to_owned();
    Ok(Arc::new(move |target: SocketAddr| {
        let (client, url) = (client.clone(), format!("http://{target}{path}"));
        Box::pin(async move { answers_ok(&client, &url).await })
    }))
}

/// `GET https://<server_name>:<port><path>`, connected to `target`: healthy on a 2xx answer.
fn readyz(s: &ProbeSettings, target: SocketAddr) -> Result<Check, ProbeError> {
    let client = probe_client(s, target)?;
    let url = format!("https://{}:{}{}", s.server_name, target.port(), s.path);
    Ok(Arc::new(move |_| {
        let (client, url) = (client.clone(), url.clone());
        Box::pin(async move {
            // The client's own timeout bounds connect + TLS + answer.
            answers_ok(&client, &url).await
        })
    }))
}

/// The probes of one target.
struct ProbeLoop {
    check: Check,
    target: SocketAddr,
    settings: ProbeSettings,
    health_tx: watch::Sender<BTreeMap<SocketAddr, Health>>,
    failing_since: FailingSince,
    observer: Arc<dyn ProbeObserver>,
}

impl ProbeLoop {
    async fn run(self, token: CancellationToken) {
        let mut tracker = HealthTracker::new(self.settings.thresholds);
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Enough probes in flight to cover one timeout, and no more.
        let max_in_flight = max_in_flight(&self.settings);
        let mut in_flight = FuturesUnordered::new();
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick(), if in_flight.len() < max_in_flight => {
                    let probe = (self.check)(self.target);
                    let timeout = self.settings.timeout;
                    in_flight.push(async move {
                        let started = Instant::now();
                        let ok = tokio::time::timeout(timeout, probe).await.unwrap_or(false);
                        (started, ok)
                    });
                }
                Some((started, ok)) = in_flight.next() => self.record(&mut tracker, started, ok),
            }
        }
    }

    fn record(&self, tracker: &mut HealthTracker, started: Instant, ok: bool) {
        let target = self.target;
        self.observer.observe(target, ok, started.elapsed());
        {
            let mut runs = self
                .failing_since
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if ok {
                runs.failing_since.remove(&target);
            } else {
                let first = runs.failing_since.entry(target).or_insert(started);
                *first = (*first).min(started);
                runs.last_failure.insert(target, Instant::now());
            }
        }
        if let Some(h) = tracker.observe(ok) {
            tracing::debug!(%target, health = ?h, "probe health changed");
            self.health_tx.send_if_modified(|m| match m.get_mut(&target) {
                Some(v) if *v != h => {
                    *v = h;
                    true
                }
                _ => false,
            });
        }
    }
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// Probes in flight at once for one target: one timeout's worth of intervals, plus one.
fn max_in_flight(s: &ProbeSettings) -> usize {
    let interval = s.interval.as_millis().max(1);
    usize::try_from(s.timeout.as_millis().div_ceil(interval))
        .unwrap_or(usize::MAX)
        .saturating_add(1)
        .clamp(1, 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(interval_ms: u64, timeout_ms: u64) -> ProbeSettings {
        ProbeSettings {
            path: "/readyz".into(),
            server_name: "kubernetes.default.svc".into(),
            ca_der: Vec::new(),
            interval: Duration::from_millis(interval_ms),
            timeout: Duration::from_millis(timeout_ms),
            thresholds: Thresholds { rise: 2, fall: 3 },
        }
    }

    #[test]
    fn enough_probes_overlap_to_cover_one_timeout() {
        assert_eq!(max_in_flight(&settings(200, 300)), 3);
        assert_eq!(max_in_flight(&settings(200, 200)), 2);
        assert_eq!(max_in_flight(&settings(1000, 300)), 2);
        assert_eq!(max_in_flight(&settings(1, 60_000)), 16);
    }

    /// A target that accepts TCP and never answers (a hung API server): with overlapping
    /// probes it is `Down` after about `fall` intervals plus one timeout, not `fall` timeouts.
    #[tokio::test]
    async fn a_hung_target_is_detected_within_fall_intervals_plus_one_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let (cert, key) = {
            let c = rcgen::generate_simple_self_signed(vec!["kubernetes.default.svc".into()]).unwrap();
            (c.cert.der().to_vec(), c.signing_key)
        };
        drop(key);
        let mut s = settings(100, 1000);
        s.ca_der = vec![cert];
        let mut prober = Prober::new(s, Arc::new(()));
        let mut rx = prober.subscribe();
        let started = Instant::now();
        prober.set_targets(&[addr]).unwrap();
        while prober.health(&addr) != Health::Down {
            tokio::time::timeout(Duration::from_secs(5), rx.changed())
                .await
                .expect("the hung target is detected")
                .unwrap();
        }
        let took = started.elapsed();
        // Serial probes would need 3 × 1 s = 3 s; overlapping ones 2 × 100 ms + 1 s = 1.2 s.
        assert!(took < Duration::from_millis(2500), "detection took {took:?}");
        let since = prober.failing_since(&addr).expect("the failing run has a start");
        assert!(
            since <= started + Duration::from_millis(500),
            "the run began with the first probe"
        );
        accept.abort();
    }
}
