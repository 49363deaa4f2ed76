//! The production [`Cloud`]: one client for every cloud baton drives. What is the same for all
//! of them lives here (rate gate, IP store, retries, fence, read-back); what each API calls things
//! and how it answers lives in [`cherry`] and [`hetzner`] (chosen by [`ClientConfig::cloud`]).
//!
//! ```text
//!  caller ──► CloudClient (clone = same Arc<Inner>)
//!               │  ips(), ips_tagged(), cached_ip(): IpStore (write-through, resynced,
//!               │  replaced on a new term of the handle's Leadership)
//!               ▼
//!             RateGate (≤ N req/s, urgent first) ──► reqwest (rustls, timeouts) ──► API
//!               ▲                                          │
//!               └──── retry: idempotent calls on 408/429/502/503/504/transport,
//!                     Retry-After or exponential backoff with jitter
//! ```
//!
//! A handle may carry a [`Fence`] ([`CloudClient::fenced`]): each of its writes is then sent
//! only in the term its call began in and before that term's deadline, checked after the gate's
//! grant of every attempt; an attempt that left gets the full request timeout, and is counted in
//! the handle's [`InFlight`] ([`CloudClient::counting`]) until it ends. A write to one IP whose
//! outcome is unknown is resolved by reading the IP back before anything is sent again. A handle
//! may carry a [`Leadership`] ([`CloudClient::led_by`]): its reads of the IP list then wait for a
//! list fetched in the current term.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};
use url::Url;

use baton_core::Secret;

use crate::cloud::Cloud;
use crate::error::{CloudError, Object, Op};
use crate::fence::{CallTerm, Fence, InFlight, Sending, changed};
use crate::hetzner::model::headers::{LIMIT, REMAINING, RESET};
use crate::limiter::{Priority, RateGate};
use crate::model::{
    ApiErrorBody, CreateIpRequest, IpAddress, IpId, IpList, Project, ProjectId, Region, Server, ServerId,
    Tags, TargetedTo, UpdateIpRequest, UpdateProjectRequest, UpdateServerRequest,
};
use crate::provider::CloudKind;
use crate::store::{IpStore, State, reads};
use crate::term::Leadership;

mod hetzner;

/// The public API endpoint.
pub const DEFAULT_BASE_URL: &str = "https://api.cherryservers.com";
/// Cherry's documented limit: more than 4 requests/s per source address may get a 429.
pub const DEFAULT_REQUESTS_PER_SECOND: f64 = 4.0;
/// `baton/<version>`.
pub const USER_AGENT: &str = concat!("baton/", env!("CARGO_PKG_VERSION"));

/// How to reach the API. Build with [`ClientConfig::new`], then adjust fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Which API the endpoint speaks.
    pub cloud: CloudKind,
    /// API endpoint (`base-url`); a trailing `/v1` is tolerated.
    pub base_url: Url,
    /// The API key (sent as `Authorization: Bearer`).
    pub api_key: Secret,
    /// The project all project-scoped calls use.
    pub project_id: ProjectId,
    /// Client-side limit shared by every clone of the client; `None` disables it.
    pub requests_per_second: Option<f64>,
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Whole-request timeout (one attempt).
    pub request_timeout: Duration,
    /// Retries of an idempotent call after the first attempt.
    pub max_retries: u32,
    /// First backoff delay (doubled per retry, with jitter in [d/2, d)).
    pub backoff_base: Duration,
    /// Backoff ceiling; an API's `Retry-After` is honoured up to four times this.
    pub backoff_cap: Duration,
    /// How often the IP list is replaced by a full list from the API (every write's answer is
    /// applied to it in between, so a write never causes a list call).
    pub ip_list_resync: Duration,
    /// How far the API's IP list may lag behind its writes: this client's own writes of that
    /// long before a list call are kept over its answer, and a create whose outcome is unknown
    /// is looked up in a list fetched at least this long after it failed.
    pub ip_list_lag: Duration,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Extra trusted CA certificates (PEM), added to the public web roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// An API that announces its request bucket (`RateLimit-*`): requests kept for urgent calls.
    pub budget_reserve: u32,
    /// An asynchronous action (Hetzner's assign) is looked at this often while it runs.
    pub action_poll: Duration,
    /// An action still running after this long is read back as of unknown outcome.
    pub action_timeout: Duration,
}

impl ClientConfig {
    /// Defaults: the public endpoint, 4 requests/s, 5 s connect and 15 s request timeouts,
    /// 5 retries backing off from 1 s to 30 s (like cherrygo v4), the IP list resynced every
    /// 60 s and allowed to lag 2 s behind the writes.
    pub fn new(api_key: Secret, project_id: impl Into<ProjectId>) -> Self {
        Self {
            cloud: CloudKind::Cherry,
            // A constant that parses.
            base_url: Url::parse(DEFAULT_BASE_URL).unwrap_or_else(|_| unreachable!()),
            api_key,
            project_id: project_id.into(),
            requests_per_second: Some(DEFAULT_REQUESTS_PER_SECOND),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
            max_retries: 5,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(30),
            ip_list_resync: Duration::from_secs(60),
            ip_list_lag: Duration::from_secs(2),
            user_agent: USER_AGENT.to_owned(),
            extra_ca_pem: None,
            budget_reserve: 100,
            action_poll: Duration::from_millis(100),
            action_timeout: Duration::from_secs(60),
        }
    }

    /// Hetzner Cloud (`https://api.hetzner.cloud/v1`) with the project's API token. No spacing of
    /// requests: the API's bucket (3,600 an hour, bursts allowed) is followed from its
    /// `RateLimit-*` headers, 100 requests kept for failover. The Floating IP list is replaced by
    /// a full list every 10 minutes, not every minute: it is read in pages of 50, and 1,000 FIPs
    /// listed every minute would spend a third of the hour's requests. Retries and timeouts as for
    /// Cherry.
    pub fn hetzner(token: Secret) -> Self {
        Self {
            cloud: CloudKind::Hetzner,
            // A constant that parses.
            base_url: Url::parse(crate::hetzner::DEFAULT_BASE_URL).unwrap_or_else(|_| unreachable!()),
            requests_per_second: None,
            ip_list_resync: Duration::from_secs(600),
            ..Self::new(token, 0)
        }
    }

    /// Sets the endpoint.
    #[must_use]
    pub fn with_base_url(mut self, base_url: Url) -> Self {
        self.base_url = base_url;
        self
    }
}

/// How one attempt sent to the API ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The API answered with this HTTP status.
    Status(u16),
    /// No answer: `timeout`, `connect` or `transport`.
    Transport(&'static str),
}

/// Told of every attempt a [`CloudClient`] sends (first tries and retries): the operation,
/// how it ended and how long it waited for the rate limit first. For metrics; must not block.
pub trait CallObserver: Send + Sync {
    /// One attempt of `op` (sent on `route`, e.g. `PUT /v1/ips/{id}`), sent in `priority`, ended
    /// with `outcome` after `queued` in the rate gate.
    fn attempt(&self, op: Op, route: &'static str, priority: Priority, outcome: Attempt, queued: Duration);
}

/// The Cherry Servers API client. Cheap to clone; clones share the rate limit and the IP cache.
#[derive(Clone)]
pub struct CloudClient {
    inner: Arc<Inner>,
    priority: Priority,
    /// When set, writes are sent only in the term their call began in, before its deadline.
    fence: Option<Arc<dyn Fence>>,
    /// When set, every sent attempt of a fenced write is counted here until it ends.
    in_flight: Option<InFlight>,
    /// When set, a read of the IP list in a new term waits for a list fetched in it.
    leadership: Option<Arc<dyn Leadership>>,
}

struct Inner {
    http: reqwest::Client,
    base: Url,
    auth: HeaderValue,
    api_key: Secret,
    project: ProjectId,
    gate: RateGate,
    store: IpStore,
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
    /// Told of every attempt sent (metrics); set once by [`CloudClient::observe`].
    observer: std::sync::OnceLock<Arc<dyn CallObserver>>,
    cloud: CloudKind,
    /// Hetzner: the actions being followed, polled together.
    running: hetzner::Running,
    budget_reserve: u32,
    action_poll: Duration,
    action_timeout: Duration,
    /// One create protocol at a time per tag set, so two callers asking for the same FIP at
    /// once cannot both miss the look-up and both create.
    creating: std::sync::Mutex<HashMap<Tags, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for CloudClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudClient")
            .field("base_url", &self.inner.base.as_str())
            .field("project_id", &self.inner.project)
            .field("api_key", &self.inner.api_key)
            .field("priority", &self.priority)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl CloudClient {
    /// Builds a client. Fails on an empty key, a bad URL or rate, or an unusable CA file.
    pub fn new(config: ClientConfig) -> Result<Self, CloudError> {
        let ClientConfig {
            cloud,
            base_url,
            api_key,
            project_id,
            requests_per_second,
            connect_timeout,
            request_timeout,
            max_retries,
            backoff_base,
            backoff_cap,
            ip_list_resync,
            ip_list_lag,
            user_agent,
            extra_ca_pem,
            budget_reserve,
            action_poll,
            action_timeout,
        } = config;
        if api_key.is_empty() {
            return Err(CloudError::Config("the API key is empty".into()));
        }
        if let Some(r) = requests_per_second
            && !(r.is_finite() && r > 0.0)
        {
            return Err(CloudError::Config(format!(
                "requests per second must be > 0, got {r}"
            )));
        }
        let base = normalize_base(base_url)?;
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", api_key.expose()))
            .map_err(|_| CloudError::Config("the API key contains characters invalid in a header".into()))?;
        auth.set_sensitive(true);

        let tls = tls_config(extra_ca_pem.as_deref())?;
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(connect_timeout)
            .timeout(request_timeout)
            .user_agent(user_agent)
            .default_headers(headers)
            .build()
            .map_err(|e| CloudError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base,
                auth,
                api_key,
                project: project_id,
                gate: RateGate::new(requests_per_second),
                store: IpStore::new(ip_list_resync, ip_list_lag),
                max_retries,
                backoff_base,
                backoff_cap,
                creating: std::sync::Mutex::new(HashMap::new()),
                observer: std::sync::OnceLock::new(),
                cloud,
                running: hetzner::Running::default(),
                budget_reserve,
                action_poll,
                action_timeout,
            }),
            priority: Priority::Normal,
            fence: None,
            in_flight: None,
            leadership: None,
        })
    }

    /// A handle to the same client (same limit, same cache) whose calls are queued in `priority`.
    /// Failover uses [`Priority::Urgent`] so its calls overtake queued normal work.
    /// The handle keeps its fence, if it has one.
    #[must_use]
    pub fn with_priority(&self, priority: Priority) -> Self {
        Self {
            inner: self.inner.clone(),
            priority,
            fence: self.fence.clone(),
            in_flight: self.in_flight.clone(),
            leadership: self.leadership.clone(),
        }
    }

    /// A handle to the same client (same limit, same cache, same priority) whose writes are
    /// fenced. A write call captures the fence's term when it begins; a call that begins with
    /// no term fails with [`CloudError::Fenced`] at once. Each attempt (first try and each
    /// retry) is sent only while the fence shows that same term and its deadline is in the
    /// future, read right after the rate gate's grant; once sent, the attempt has the full
    /// request timeout (a write that left in time gets its answer). A write waiting in the
    /// gate's queue gives up when the deadline passes or the term changes or ends. Retry delays
    /// (backoff, `Retry-After`): the write is dropped as soon as its term changes or ends; a
    /// [`Priority::Urgent`] handle also gives up at once when the delay would end at or after the
    /// current deadline; a [`Priority::Normal`] handle waits out a paused term (a late renewal
    /// moves the deadline) and checks again. Reads are never fenced.
    ///
    /// The controller's "leader until" receiver is a fence as it is:
    /// `client.with_priority(Priority::Urgent).fenced(Arc::new(rx.clone()))`.
    #[must_use]
    pub fn fenced(&self, fence: Arc<dyn Fence>) -> Self {
        Self {
            inner: self.inner.clone(),
            priority: self.priority,
            fence: Some(fence),
            in_flight: self.in_flight.clone(),
            leadership: self.leadership.clone(),
        }
    }

    /// A handle to the same client (keeps priority, fence and leadership) that counts each sent
    /// attempt of a fenced write in `in_flight`, from just before it leaves until its answer,
    /// error, timeout or cancellation: a graceful release waits for them before it clears the
    /// holder.
    #[must_use]
    pub fn counting(&self, in_flight: InFlight) -> Self {
        Self {
            inner: self.inner.clone(),
            priority: self.priority,
            fence: self.fence.clone(),
            in_flight: Some(in_flight),
            leadership: self.leadership.clone(),
        }
    }

    /// A handle to the same client whose reads of the IP list follow `leadership`: the first
    /// read in a new term (this replica leads, and did not at its previous read) waits for a
    /// list fetched after the previous holder stopped writing, so no decision of a new leader
    /// rests on a list older than its predecessor's last writes. Keeps priority and fence.
    ///
    /// Leadership is looked at every 100 ms as well (a task on the current runtime, ending with
    /// the client): renewals a reader does not see between two reads must not look like a lapse.
    #[must_use]
    pub fn led_by(&self, leadership: Arc<dyn Leadership>) -> Self {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = Arc::downgrade(&self.inner);
            let lead = Arc::clone(&leadership);
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(inner) = inner.upgrade() else { break };
                    inner.store.observe(&*lead);
                }
            });
        }
        Self {
            inner: self.inner.clone(),
            priority: self.priority,
            fence: self.fence.clone(),
            in_flight: self.in_flight.clone(),
            leadership: Some(leadership),
        }
    }

    /// Runs `read` on the shared IP store, replaced first if it must be (due resync, a new
    /// term, a requested refresh). The list call goes in the urgent lane: a failover may be
    /// among the waiters, and it is rare (a resync, a new term, an unknown outcome).
    async fn read_store<R>(&self, read: impl FnOnce(&mut State) -> R) -> Result<R, CloudError> {
        let urgent = self.with_priority(Priority::Urgent);
        self.inner
            .store
            .read(
                self.leadership.as_deref(),
                || async move { urgent.list_ips_uncached().await },
                read,
            )
            .await
    }

    /// The term a call of `op` begins in: captured from the handle's fence, for writes only.
    fn term_for(&self, op: Op) -> Option<CallTerm> {
        if op.is_write() {
            self.fence.clone().map(CallTerm::begin)
        } else {
            None
        }
    }

    /// Whether a fenced urgent write must give up instead of waiting `delay` (and any pause
    /// of the rate gate) before its next attempt: its term is over or paused, or the wait would
    /// end at or after the deadline. A normal write waits and checks the fence again.
    fn gives_up_before_retry(&self, term: Option<&CallTerm>, delay: Duration) -> bool {
        let Some(term) = term else {
            return false;
        };
        if term.is_over() {
            return true;
        }
        if self.priority != Priority::Urgent {
            return false;
        }
        let Some(deadline) = term.sendable_until() else {
            return true;
        };
        let ready = (tokio::time::Instant::now() + delay).max(self.inner.gate.next_grant());
        ready >= deadline
    }

    /// Sleeps `delay` before a retry; `false` as soon as the call's term changes or ends (the
    /// write is dropped: it carries a decision of that term). A paused term is waited out.
    async fn sleep_in_term(&self, delay: Duration, term: Option<&CallTerm>) -> bool {
        let Some(term) = term else {
            tokio::time::sleep(delay).await;
            return true;
        };
        let end = tokio::time::Instant::now() + delay;
        let mut changes = term.subscribe();
        loop {
            if term.is_over() {
                return false;
            }
            tokio::select! {
                () = tokio::time::sleep_until(end) => return !term.is_over(),
                () = changed(&mut changes) => {}
            }
        }
    }

    /// Reports every attempt this client (and every handle to it) sends to `observer`. The
    /// first observer set stays; later calls return `false`.
    pub fn observe(&self, observer: Arc<dyn CallObserver>) -> bool {
        self.inner.observer.set(observer).is_ok()
    }

    fn observed(&self, op: Op, outcome: Attempt, queued: Duration) {
        if let Some(observer) = self.inner.observer.get() {
            observer.attempt(op, op.route_on(self.inner.cloud), self.priority, outcome, queued);
        }
    }

    /// The configured project.
    pub fn project_id(&self) -> ProjectId {
        self.inner.project
    }

    /// The cloud this client speaks to.
    pub fn cloud(&self) -> CloudKind {
        self.inner.cloud
    }

    /// Follows the API's bucket from an answer's `RateLimit-*` headers (Hetzner sends them on
    /// every answer); a 429 without them empties the estimate.
    fn follow_budget(&self, headers: &HeaderMap, status: StatusCode) {
        let number = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let (Some(limit), Some(left)) = (number(LIMIT), number(REMAINING)) else {
            return;
        };
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let reset = number(RESET).unwrap_or(now_unix);
        let left = if status == StatusCode::TOO_MANY_REQUESTS {
            0
        } else {
            left
        };
        self.inner
            .gate
            .observe_budget(limit, left, reset, now_unix, self.inner.budget_reserve);
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.inner.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("v1").extend(segments);
        }
        url
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .inner
            .backoff_base
            .saturating_mul(2u32.saturating_pow(attempt.min(16)));
        let full = exp.min(self.inner.backoff_cap);
        if full.is_zero() {
            return full;
        }
        // Jitter in [full/2, full).
        let half = full / 2;
        half + rand::rng().random_range(Duration::ZERO..full.saturating_sub(half))
    }

    fn retry_delay(&self, err: &CloudError, attempt: u32) -> Duration {
        match err.retry_after() {
            Some(ra) => ra.min(self.inner.backoff_cap.saturating_mul(4)),
            None => self.backoff(attempt),
        }
    }

    /// One attempt: waits for the gate, sends, classifies the answer. A fenced write (`term`)
    /// is sent only in its term before the deadline, with the full request timeout, and counted
    /// as in flight while it is on its way.
    async fn send_once(
        &self,
        op: Op,
        object: &Object,
        method: &Method,
        url: &Url,
        body: Option<&[u8]>,
        term: Option<&CallTerm>,
    ) -> Result<Bytes, CloudError> {
        let queued_at = tokio::time::Instant::now();
        // Lives until the answer (or the error) is in: dropped with this function's future.
        let _sending: Option<Sending> = match term {
            None => {
                self.inner.gate.acquire(self.priority).await;
                None
            }
            Some(term) => {
                // An urgent write does not queue for a grant that can only come too late.
                if self.priority == Priority::Urgent
                    && term
                        .sendable_until()
                        .is_some_and(|d| self.inner.gate.next_grant() >= d)
                {
                    return Err(fenced(op, object));
                }
                if !self
                    .inner
                    .gate
                    .acquire_until(self.priority, || term.sendable_until(), term.subscribe())
                    .await
                {
                    return Err(fenced(op, object));
                }
                // Counted before the last look: a release that ends the term and then finds no
                // write counted cannot miss one that passed this look before the term ended.
                let sending = self.in_flight.as_ref().map(InFlight::enter);
                // Right before the bytes leave: still this call's term, before its deadline?
                if term.sendable_until().is_none() {
                    return Err(fenced(op, object));
                }
                sending
            }
        };
        let started = tokio::time::Instant::now();
        let queued = started.saturating_duration_since(queued_at);
        let mut req = self
            .inner
            .http
            .request(method.clone(), url.clone())
            .header(header::AUTHORIZATION, self.inner.auth.clone());
        if let Some(body) = body {
            req = req
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        let transport = |source: reqwest::Error| {
            let kind = if source.is_timeout() {
                "timeout"
            } else if source.is_connect() {
                "connect"
            } else {
                "transport"
            };
            CloudError::Transport {
                op,
                object: object.clone(),
                kind,
                source: source.without_url(),
            }
        };
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(source) => {
                let err = transport(source);
                if let CloudError::Transport { kind, .. } = &err {
                    self.observed(op, Attempt::Transport(kind), queued);
                }
                return Err(err);
            }
        };
        let status = resp.status();
        self.observed(op, Attempt::Status(status.as_u16()), queued);
        let retry_after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(parse_retry_after);
        self.follow_budget(resp.headers(), status);
        let bytes = resp.bytes().await.map_err(transport)?;
        debug!(
            op = op.as_str(),
            object = %object,
            %method,
            status = status.as_u16(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "cloud call"
        );
        if status.is_success() {
            return Ok(bytes);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            let pause = retry_after.unwrap_or(self.inner.backoff_base);
            self.inner.gate.defer(tokio::time::Instant::now() + pause);
        }
        Err(self.error_from_body(op, object, status, retry_after, &bytes))
    }

    fn error_from_body(
        &self,
        op: Op,
        object: &Object,
        status: StatusCode,
        retry_after: Option<Duration>,
        body: &[u8],
    ) -> CloudError {
        if self.inner.cloud == CloudKind::Hetzner
            && let Ok(crate::hetzner::model::ErrorBody { error }) = serde_json::from_slice(body)
        {
            return CloudError::Coded {
                op,
                object: object.clone(),
                status: status.as_u16(),
                code: error.code.into(),
                message: self.mask(&error.message).into(),
                retry_after,
            };
        }
        if let Ok(ApiErrorBody { code, message }) = serde_json::from_slice::<ApiErrorBody>(body) {
            CloudError::Api {
                op,
                object: object.clone(),
                status: status.as_u16(),
                code,
                message: self.mask(&message),
                retry_after,
            }
        } else {
            let text = String::from_utf8_lossy(body);
            let snippet: String = text.chars().take(200).collect();
            CloudError::UnexpectedBody {
                op,
                object: object.clone(),
                status: status.as_u16(),
                snippet: self.mask(&snippet),
                retry_after,
            }
        }
    }

    /// Masks the key if a server (or proxy) echoes it back.
    fn mask(&self, text: &str) -> String {
        let key = self.inner.api_key.expose();
        if key.is_empty() {
            text.to_owned()
        } else {
            text.replace(key, "<redacted>")
        }
    }

    /// Sends with retries (idempotent operations only) and returns the body. A fenced write
    /// (`term`) is sent only in its term; a retry delay is cut short when the term ends.
    async fn execute(
        &self,
        op: Op,
        object: &Object,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        term: Option<&CallTerm>,
    ) -> Result<Bytes, CloudError> {
        let mut attempt = 0;
        // The previous attempt's error, named if the fence stops the next one.
        let mut last: Option<CloudError> = None;
        loop {
            match self
                .send_once(op, object, &method, &url, body.as_deref(), term)
                .await
            {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.is_fenced() => return Err(fenced_after(e, last)),
                Err(e) if op.is_idempotent() && e.is_retryable() && attempt < self.inner.max_retries => {
                    let delay = self.retry_delay(&e, attempt);
                    if !self.wait_to_retry(op, object, attempt, delay, &e, term).await {
                        return Err(fenced_after(fenced(op, object), Some(e)));
                    }
                    attempt += 1;
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Logs a failed attempt and waits `delay` before the next one; `false`: the fence stops the
    /// call instead (an urgent write whose wait would reach its deadline, or a term that ended).
    async fn wait_to_retry(
        &self,
        op: Op,
        object: &Object,
        attempt: u32,
        delay: Duration,
        err: &CloudError,
        term: Option<&CallTerm>,
    ) -> bool {
        // An urgent write does not wait past its fence's deadline.
        let give_up = self.gives_up_before_retry(term, delay);
        warn!(
            op = op.as_str(),
            object = %object,
            attempt = attempt + 1,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            retrying = !give_up,
            outcome_unknown = err.outcome_unknown(),
            category = err.category(),
            error = %err,
            "cloud call failed"
        );
        if give_up {
            return false;
        }
        if self.sleep_in_term(delay, term).await {
            return true;
        }
        debug!(op = op.as_str(), object = %object, "retry dropped: the term it began in is over");
        false
    }

    async fn call<T: DeserializeOwned>(
        &self,
        op: Op,
        object: &Object,
        method: Method,
        url: Url,
        body: Option<&(impl Serialize + Sync)>,
        term: Option<&CallTerm>,
    ) -> Result<T, CloudError> {
        let body = body.map(|b| encode(op, object, b)).transpose()?;
        let bytes = self.execute(op, object, method, url, body, term).await?;
        decode(op, object, &bytes)
    }

    async fn list_ips_uncached(&self) -> Result<Vec<IpAddress>, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_list_ips().await;
        }
        let object = Object(format!("project {}", self.inner.project));
        let url = self.url(&["projects", &self.inner.project.to_string(), "ips"]);
        self.call(Op::ListIps, &object, Method::GET, url, None::<&()>, None)
            .await
    }

    /// Retarget or unassign: a PUT whose success is the IP's target being `wanted`.
    async fn update_ip(&self, op: Op, id: &IpId, wanted: Option<ServerId>) -> Result<IpAddress, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_move_ip(op, id, wanted).await;
        }
        let req = UpdateIpRequest {
            targeted_to: Some(TargetedTo(wanted)),
            ..Default::default()
        };
        let object = Object(format!("ip {id}"));
        let body = encode(op, &object, &req)?;
        let shows = |ip: &IpAddress| ip.target() == wanted;
        match self
            .write_ip(op, id, &object, Method::PUT, Some(body), shows)
            .await
        {
            Ok(Some(ip)) => Ok(ip),
            // A PUT answers with the IP.
            Ok(None) => Err(CloudError::InvalidRequest {
                op,
                object,
                reason: "the API answered a PUT without the IP".into(),
            }),
            Err(e) => {
                // Stopped by the fence after an attempt of unknown outcome (which `write_ip`
                // did not read back): the store shows what the API holds.
                if e.is_fenced() && e.outcome_unknown() {
                    self.read_back(id).await;
                }
                Err(e)
            }
        }
    }

    /// A write to one IP (`PUT` with `body`, or `DELETE`) with retries, in the call's term.
    /// After an attempt whose outcome is unknown, nothing is sent again before the IP is read:
    /// if it already `shows` what was asked (a `DELETE`: the IP is gone), the call succeeds with
    /// that read; otherwise the write is sent again (still only in its term). A read that fails
    /// ends the call with the attempt's error: nothing is sent blind. `Ok(None)`: deleted.
    async fn write_ip(
        &self,
        op: Op,
        id: &IpId,
        object: &Object,
        method: Method,
        body: Option<Vec<u8>>,
        shows: impl Fn(&IpAddress) -> bool,
    ) -> Result<Option<IpAddress>, CloudError> {
        let url = self.ip_url(id);
        let term = self.term_for(op);
        let deleting = method == Method::DELETE;
        let mut attempt = 0;
        let mut last: Option<CloudError> = None;
        loop {
            let err = match self
                .send_once(op, object, &method, &url, body.as_deref(), term.as_ref())
                .await
            {
                Ok(bytes) => {
                    if deleting {
                        self.inner.store.remove(id);
                        return Ok(None);
                    }
                    let ip: IpAddress = decode(op, object, &bytes)?;
                    self.inner.store.upsert(&ip);
                    return Ok(Some(ip));
                }
                Err(e) if e.is_fenced() => return Err(fenced_after(e, last)),
                // Gone after a refused attempt (a 429): someone else deleted it.
                Err(e) if deleting && attempt > 0 && e.is_not_found() => {
                    self.inner.store.remove(id);
                    return Ok(None);
                }
                Err(e) => e,
            };
            if err.outcome_unknown() {
                match self.ip(id).await {
                    Ok(ip) if !deleting && shows(&ip) => {
                        debug!(op = op.as_str(), object = %object, "the write of unknown outcome took effect: not sent again");
                        return Ok(Some(ip));
                    }
                    Ok(_) => {}
                    Err(e) if e.is_not_found() && deleting => {
                        debug!(op = op.as_str(), object = %object, "the delete of unknown outcome took effect");
                        return Ok(None);
                    }
                    Err(e) if e.is_not_found() => return Err(e),
                    Err(e) => {
                        warn!(
                            op = op.as_str(),
                            object = %object,
                            error = %e,
                            "cannot read back a write of unknown outcome; not sending it again"
                        );
                        self.inner.store.require_since(tokio::time::Instant::now());
                        return Err(err);
                    }
                }
            }
            if !(err.is_retryable() && attempt < self.inner.max_retries) {
                return Err(err);
            }
            let delay = self.retry_delay(&err, attempt);
            if !self
                .wait_to_retry(op, object, attempt, delay, &err, term.as_ref())
                .await
            {
                return Err(fenced_after(fenced(op, object), Some(err)));
            }
            attempt += 1;
            last = Some(err);
        }
    }

    /// After a write of unknown outcome on `id`: reads the IP (a read of one IP is current),
    /// so the store shows what the API holds; if that fails too, the next read of the store
    /// uses a list fetched from now on.
    async fn read_back(&self, id: &IpId) {
        match self.ip(id).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(_) => self.inner.store.require_since(tokio::time::Instant::now()),
        }
    }

    /// The path of one IP.
    fn ip_url(&self, id: &IpId) -> Url {
        match self.inner.cloud {
            CloudKind::Cherry => self.url(&["ips", id.as_str()]),
            CloudKind::Hetzner => self.url(&["floating_ips", id.as_str()]),
        }
    }

    async fn post_ip(
        &self,
        object: &Object,
        body: &[u8],
        term: Option<&CallTerm>,
    ) -> Result<IpAddress, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_post_ip(object, body, term).await;
        }
        let url = self.url(&["projects", &self.inner.project.to_string(), "ips"]);
        let bytes = self
            .send_once(Op::CreateIp, object, &Method::POST, &url, Some(body), term)
            .await?;
        decode(Op::CreateIp, object, &bytes)
    }

    /// The create protocol: look up by tags, create, and after a failure whose outcome is
    /// unknown look up again before creating again.
    async fn create_ip_locked(
        &self,
        object: &Object,
        request: &CreateIpRequest,
        term: Option<&CallTerm>,
    ) -> Result<IpAddress, CloudError> {
        if let Some(found) = self.find_ip_by_tags(&request.tags).await? {
            debug!(ip = %found.id, "create_ip: found by tags, not creating");
            return Ok(found);
        }
        let body = match self.inner.cloud {
            CloudKind::Cherry => encode(Op::CreateIp, object, request)?,
            CloudKind::Hetzner => Self::h_create_body(object, request)?,
        };
        let mut attempt = 0;
        let mut last: Option<CloudError> = None;
        loop {
            let err = match self.post_ip(object, &body, term).await {
                Ok(ip) => {
                    self.inner.store.upsert(&ip);
                    return Ok(ip);
                }
                // Not sent: nothing new exists (an earlier POST of unknown outcome was looked
                // up before this one).
                Err(e) if e.is_fenced() => return Err(fenced_after(e, last)),
                Err(e) => e,
            };
            let unknown = err.outcome_unknown();
            // The FIP may exist now: the look-up before another POST reads a list fetched after
            // this one failed (so after it was sent), and after the list's lag.
            let look_from = tokio::time::Instant::now() + self.inner.store.list_lag();
            if unknown {
                self.inner.store.require_since(look_from);
            } else if err.status() != Some(429) && !matches!(err, CloudError::Transport { .. }) {
                return Err(err);
            }
            let delay = self.retry_delay(&err, attempt);
            if self.gives_up_before_retry(term, delay) {
                // Nothing duplicated: a create of unknown outcome is found by its tags later
                // (the store reads a list fetched after it, above).
                warn!(
                    op = Op::CreateIp.as_str(),
                    attempt = attempt + 1,
                    outcome_unknown = unknown,
                    category = err.category(),
                    error = %err,
                    "create failed; not retrying past the fence's deadline"
                );
                return Err(fenced_after(fenced(Op::CreateIp, object), Some(err)));
            }
            warn!(
                op = Op::CreateIp.as_str(),
                attempt = attempt + 1,
                outcome_unknown = unknown,
                category = err.category(),
                error = %err,
                "create failed"
            );
            if !self.sleep_in_term(delay, term).await {
                // Dropped with its term; a create of unknown outcome is found by its tags later.
                return Err(fenced_after(fenced(Op::CreateIp, object), Some(err)));
            }
            if unknown {
                tokio::time::sleep_until(look_from).await;
                if let Some(found) = self.find_ip_by_tags(&request.tags).await? {
                    debug!(ip = %found.id, "create_ip: the failed create had succeeded");
                    return Ok(found);
                }
            }
            if attempt >= self.inner.max_retries {
                return Err(err);
            }
            attempt += 1;
            last = Some(err);
        }
    }
}

#[async_trait]
impl Cloud for CloudClient {
    async fn project(&self) -> Result<Project, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            // A token belongs to one project, which the API does not show: nothing to read.
            return Ok(Project {
                id: ProjectId(0),
                name: "hetzner".into(),
                bgp: crate::model::ProjectBgp::default(),
                href: String::new(),
            });
        }
        let id = self.inner.project.to_string();
        let object = Object(format!("project {id}"));
        self.call(
            Op::GetProject,
            &object,
            Method::GET,
            self.url(&["projects", &id]),
            None::<&()>,
            None,
        )
        .await
    }

    async fn enable_project_bgp(&self) -> Result<Project, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return Err(no_bgp(Op::EnableProjectBgp, "project"));
        }
        let term = self.term_for(Op::EnableProjectBgp);
        let project = self.project().await?;
        if project.bgp.enabled {
            return Ok(project);
        }
        let id = self.inner.project.to_string();
        let object = Object(format!("project {id}"));
        // The CCM resends the current name with the flag.
        let req = UpdateProjectRequest {
            name: Some(project.name),
            bgp: Some(true),
        };
        self.call(
            Op::EnableProjectBgp,
            &object,
            Method::PUT,
            self.url(&["projects", &id]),
            Some(&req),
            term.as_ref(),
        )
        .await
    }

    async fn server(&self, id: ServerId) -> Result<Server, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_server(id).await;
        }
        let sid = id.to_string();
        let object = Object(format!("server {sid}"));
        self.call(
            Op::GetServer,
            &object,
            Method::GET,
            self.url(&["servers", &sid]),
            None::<&()>,
            None,
        )
        .await
    }

    async fn servers(&self) -> Result<Vec<Server>, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_servers().await;
        }
        let pid = self.inner.project.to_string();
        let object = Object(format!("project {pid}"));
        let url = self.url(&["projects", &pid, "servers"]);
        self.call(Op::ListServers, &object, Method::GET, url, None::<&()>, None)
            .await
    }

    async fn update_server_bgp(&self, id: ServerId, enabled: bool) -> Result<Server, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return Err(no_bgp(Op::UpdateServerBgp, &format!("server {id}")));
        }
        let term = self.term_for(Op::UpdateServerBgp);
        let current = self.server(id).await?;
        if current.bgp.enabled == enabled {
            return Ok(current);
        }
        let sid = id.to_string();
        let object = Object(format!("server {sid}"));
        // The CCM resends the existing tags with the flag.
        let req = UpdateServerRequest {
            tags: Some(current.tags.clone()),
            bgp: Some(enabled),
            ..Default::default()
        };
        let mut updated: Server = self
            .call(
                Op::UpdateServerBgp,
                &object,
                Method::PUT,
                self.url(&["servers", &sid]),
                Some(&req),
                term.as_ref(),
            )
            .await?;
        // PUT responses leave out `ip_addresses`; keep the ones just read.
        if updated.ip_addresses.is_empty() {
            updated.ip_addresses = current.ip_addresses;
        }
        Ok(updated)
    }

    async fn ips(&self) -> Result<IpList, CloudError> {
        self.read_store(reads::list).await
    }

    async fn ips_tagged(&self, tags: &Tags) -> Result<Vec<IpAddress>, CloudError> {
        let found = self.read_store(reads::tagged(tags)).await?;
        Ok(found.iter().map(|ip| IpAddress::clone(ip)).collect())
    }

    async fn ips_at(&self, addresses: &BTreeSet<IpAddr>) -> Result<Vec<IpAddress>, CloudError> {
        let found = self.read_store(reads::at(addresses)).await?;
        Ok(found.iter().map(|ip| IpAddress::clone(ip)).collect())
    }

    async fn cached_ip(&self, id: &IpId) -> Result<Option<IpAddress>, CloudError> {
        let found = self.read_store(reads::get(id)).await?;
        Ok(found.map(|ip| IpAddress::clone(&ip)))
    }

    async fn ip(&self, id: &IpId) -> Result<IpAddress, CloudError> {
        let object = Object(format!("ip {id}"));
        let read = match self.inner.cloud {
            CloudKind::Cherry => {
                self.call::<IpAddress>(
                    Op::GetIp,
                    &object,
                    Method::GET,
                    self.ip_url(id),
                    None::<&()>,
                    None,
                )
                .await
            }
            CloudKind::Hetzner => self.h_get_ip(id).await,
        };
        match read {
            Ok(ip) => {
                self.inner.store.upsert(&ip);
                Ok(ip)
            }
            Err(e) => {
                if e.is_not_found() {
                    self.inner.store.remove(id);
                }
                Err(e)
            }
        }
    }

    async fn create_ip(&self, request: CreateIpRequest) -> Result<IpAddress, CloudError> {
        let object = Object(format!("fip in {} tagged {:?}", request.region, request.tags));
        if request.tags.is_empty() {
            return Err(CloudError::InvalidRequest {
                op: Op::CreateIp,
                object,
                reason: "a Floating IP is created with tags, which make the creation idempotent".into(),
            });
        }
        let slot = {
            let mut creating = self
                .inner
                .creating
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            creating.entry(request.tags.clone()).or_default().clone()
        };
        let term = self.term_for(Op::CreateIp);
        let result = {
            let _one_at_a_time = slot.lock().await;
            self.create_ip_locked(&object, &request, term.as_ref()).await
        };
        let mut creating = self
            .inner
            .creating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map and this function hold the only references: nobody else waits on this slot.
        if Arc::strong_count(&slot) == 2 {
            creating.remove(&request.tags);
        }
        result
    }

    async fn retarget_ip(&self, id: &IpId, server: ServerId) -> Result<IpAddress, CloudError> {
        self.update_ip(Op::RetargetIp, id, Some(server)).await
    }

    async fn unassign_ip(&self, id: &IpId) -> Result<IpAddress, CloudError> {
        self.update_ip(Op::UnassignIp, id, None).await
    }

    async fn delete_ip(&self, id: &IpId) -> Result<(), CloudError> {
        let object = Object(format!("ip {id}"));
        match self
            .write_ip(Op::DeleteIp, id, &object, Method::DELETE, None, |_| false)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                if e.is_not_found() {
                    self.inner.store.remove(id);
                } else if e.is_fenced() && e.outcome_unknown() {
                    self.read_back(id).await;
                }
                Err(e)
            }
        }
    }

    async fn regions(&self) -> Result<Vec<Region>, CloudError> {
        if self.inner.cloud == CloudKind::Hetzner {
            return self.h_regions().await;
        }
        let object = Object("regions".into());
        self.call(
            Op::ListRegions,
            &object,
            Method::GET,
            self.url(&["regions"]),
            None::<&()>,
            None,
        )
        .await
    }

    fn invalidate_ips(&self) {
        self.inner.store.require_since(tokio::time::Instant::now());
    }
}

/// What a cloud without customer BGP answers to a BGP call.
fn no_bgp(op: Op, object: &str) -> CloudError {
    CloudError::InvalidRequest {
        op,
        object: Object(object.to_owned()),
        reason: "Hetzner Cloud offers no BGP; baton moves Floating IPs through the API there".into(),
    }
}

/// A write the fence stopped before it was sent.
fn fenced(op: Op, object: &Object) -> CloudError {
    debug!(op = op.as_str(), object = %object, "write not sent: fenced");
    CloudError::Fenced {
        op,
        object: object.clone(),
        after: None,
    }
}

/// Names the previous attempt's error in a [`CloudError::Fenced`] that has none yet.
fn fenced_after(err: CloudError, previous: Option<CloudError>) -> CloudError {
    match (err, previous) {
        (
            CloudError::Fenced {
                op,
                object,
                after: None,
            },
            Some(previous),
        ) => CloudError::Fenced {
            op,
            object,
            after: Some(Box::new(previous)),
        },
        (err, _) => err,
    }
}

fn encode(op: Op, object: &Object, body: &impl Serialize) -> Result<Vec<u8>, CloudError> {
    serde_json::to_vec(body).map_err(|source| CloudError::Decode {
        op,
        object: object.clone(),
        source,
    })
}

fn decode<T: DeserializeOwned>(op: Op, object: &Object, bytes: &[u8]) -> Result<T, CloudError> {
    // DELETE answers 204 with no body; `()` decodes from `null`.
    let bytes = if bytes.is_empty() {
        b"null".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|source| CloudError::Decode {
        op,
        object: object.clone(),
        source,
    })
}

/// Paths are absolute (`/v1/...`): keep a base's own path prefix, drop a trailing `/v1`.
fn normalize_base(mut url: Url) -> Result<Url, CloudError> {
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(CloudError::Config(format!(
            "base-url must be an http(s) URL, got {url}"
        )));
    }
    let path = url.path().trim_end_matches('/');
    let path = path.strip_suffix("/v1").unwrap_or(path).to_owned();
    url.set_path(&format!("{path}/"));
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

/// rustls with the ring provider, the public web roots and optionally extra CAs.
fn tls_config(extra_ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, CloudError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(pem) = extra_ca_pem {
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut &*pem) {
            let cert = cert.map_err(|e| CloudError::Config(format!("cannot read the extra CA PEM: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| CloudError::Config(format!("cannot use an extra CA certificate: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(CloudError::Config("the extra CA PEM holds no certificate".into()));
        }
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| CloudError::Config(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// `Retry-After`: delay-seconds or an HTTP-date.
pub(crate) fn parse_retry_after(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = text.parse::<f64>()
        && secs.is_finite()
        && secs >= 0.0
    {
        return Some(Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests;
