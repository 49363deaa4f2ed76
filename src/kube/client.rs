//! The controller's Kubernetes client: client-side failover between API servers, bounded time
//! for every request, and a record of whether any API server answers.
//!
//! The controller must never reach Kubernetes through the FIP it manages (CPEM #304/#319): if the
//! FIP holder dies it would lose the very API it needs to move the FIP. Given every control-plane
//! address (or just the one of the kubeconfig), [`client`] builds one `kube::Client` whose requests
//! go to the last API server that answered, and on a transport error, a timeout or an abandoned
//! attempt are retried on the next address. Request bodies are buffered so a retry sends the same
//! bytes. Watches reconnect through the same path, so they move to a live API server too.
//!
//! # Time limits (an API server that accepts and then hangs must not pin the controller)
//!
//! kube 5's client speaks HTTP/1.1 only (its hyper-util client is built with `http1` alone and
//! its rustls connector offers no `h2` ALPN; upstream kube-rs/kube#1923 is open), so HTTP/2
//! keep-alive pings are not available. A dead connection is found by time limits instead:
//!
//! - [`CONNECT_TIMEOUT`] (1 s) covers TCP connect *and* the TLS handshake (a stopped API server
//!   still completes TCP handshakes from its listen backlog, but never the TLS one).
//! - [`REQUEST_TIMEOUT`] (3 s) per attempt, until the response headers arrive. Watches get their
//!   headers at once, so this applies to them too; their long-lived body does not count.
//! - [`READ_TIMEOUT`] (8 s) of silence on a connection (reset by every read and write) fails it.
//!   This is what ends a watch whose API server died mid-stream. A healthy but idle watch is
//!   never silent that long because every watch is bounded to [`WATCH_TIMEOUT`] (5 s)
//!   server-side: the client lowers `timeoutSeconds` of each watch request, the API server ends
//!   the watch cleanly after it and the watcher re-watches from its resourceVersion (cheap: no
//!   list). kube-runtime's own idle timeout (`timeoutSeconds` + 5 s) would otherwise be 295 s.
//!   TCP keepalive is not used: it only probes idle connections, and its useful settings (a few
//!   seconds) are what the read timeout already gives, for busy connections too.
//! - An attempt its caller gave up on after waiting at least [`ABANDONED_AFTER`] (the lease task
//!   abandons a renewal after two lease durations) counts as a failure of that API server too, so callers with a
//!   tight deadline also steer the client away from a hung server. Moving to another API server
//!   costs one new connection, so a false alarm is cheap.
//!
//! Every attempt is recorded in an [`ApiReachability`]: the last answer and the consecutive
//! failures, which `/ready` and the metrics read.
//!
//! # Writes that are not idempotent are not re-sent blindly
//!
//! A request whose connection was never made is sent to the next API server as it is. One that
//! may have been received ([`Failure::MaybeSent`]: a timeout, a connection lost mid-request) is
//! re-sent only if repeating it cannot do anything twice ([`on_failure`]): reads, `PUT`, `PATCH`
//! and `DELETE` (the same write twice is the same state; a conditional one fails the second
//! time), and the reviews that persist nothing (TokenReview, SubjectAccessReview). A `POST` that
//! creates a named object (an Event, the Lease) is **looked up first** on the next API server:
//! found with what was sent, the first attempt created it and that object is the answer; not
//! found, the create is sent again; found different, someone else's, an error. Any other `POST`
//! (a generated name) is not re-sent: the caller gets the error.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Time to connect, TLS handshake included.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time from sending a request to its response headers, per API server tried.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Silence on a connection after which it is considered dead (reads and writes reset it).
pub const READ_TIMEOUT: Duration = Duration::from_secs(8);
/// Upper bound of every watch's server-side `timeoutSeconds` (well below [`READ_TIMEOUT`]).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// An attempt dropped by its caller after waiting at least this long counts as a failure.
pub const ABANDONED_AFTER: Duration = Duration::from_millis(250);

/// Errors building the client.
#[derive(Debug, thiserror::Error)]
pub enum FailoverError {
    #[error("invalid API server URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("building a client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
}

/// Every `reason` [`ApiObserver::request_failed`] is told.
pub const FAILURE_REASONS: &[&str] = &[
    "connect",
    "timeout",
    "abandoned",
    "transport",
    "unauthorized",
    "forbidden",
    "server_error",
];

/// Told about every failed attempt (the metrics implement it).
pub trait ApiObserver: Send + Sync {
    /// One attempt on one API server failed; `reason` is `connect`, `timeout`, `abandoned` or
    /// `transport` (no answer), or `unauthorized` (401), `forbidden` (403) or `server_error`
    /// (5xx): an answer that is no success ([`refusal`]).
    fn request_failed(&self, reason: &'static str);
}

/// The failure reason of an answer with `status` that does not count as reaching the API
/// server: 401 (this replica's credentials are not valid), 403 (it may not do what it needs),
/// 5xx (the API server cannot serve). `None` for every other status, conflicts, not-found and
/// 429 included: the API server authenticated, authorised and judged the request.
pub fn refusal(status: http::StatusCode) -> Option<&'static str> {
    match status.as_u16() {
        401 => Some("unauthorized"),
        403 => Some("forbidden"),
        500..=599 => Some("server_error"),
        _ => None,
    }
}

/// Whether the API servers answer: shared by the client (which records) and `/ready` (which
/// reads). An answer counts unless it is a [`refusal`] (401, 403, 5xx): a replica whose token is
/// not valid, or whose API server cannot serve, is not ready.
#[derive(Clone)]
pub struct ApiReachability(Arc<ReachInner>);

struct ReachInner {
    created: Instant,
    last_ok: Mutex<Option<Instant>>,
    failures: AtomicU64,
    /// The status of the last refused answer since the last success (0: none).
    refused: std::sync::atomic::AtomicU16,
    observer: OnceLock<Arc<dyn ApiObserver>>,
}

impl std::fmt::Debug for ApiReachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiReachability")
            .field("last_success", &self.last_success())
            .field("consecutive_failures", &self.consecutive_failures())
            .finish_non_exhaustive()
    }
}

impl Default for ApiReachability {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiReachability {
    /// Nothing answered yet; the silence counts from now.
    pub fn new() -> Self {
        Self(Arc::new(ReachInner {
            created: Instant::now(),
            last_ok: Mutex::new(None),
            failures: AtomicU64::new(0),
            refused: std::sync::atomic::AtomicU16::new(0),
            observer: OnceLock::new(),
        }))
    }

    /// Reports every failed attempt to `observer` from now on (only the first call counts).
    pub fn set_observer(&self, observer: Arc<dyn ApiObserver>) {
        let _ = self.0.observer.set(observer);
    }

    /// When an API server last answered.
    pub fn last_success(&self) -> Option<Instant> {
        *self
            .0
            .last_ok
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Failed attempts since the last answer.
    pub fn consecutive_failures(&self) -> u64 {
        self.0.failures.load(Ordering::Relaxed)
    }

    /// How long no API server has answered (since creation when none ever did).
    pub fn silent_for(&self) -> Duration {
        self.last_success().unwrap_or(self.0.created).elapsed()
    }

    /// Whether an API server answered within `window` (never, before the first answer: a
    /// replica that has not reached the API yet is not ready).
    pub fn answered_within(&self, window: Duration) -> bool {
        self.last_success().is_some_and(|t| t.elapsed() <= window)
    }

    /// Records an answer.
    pub fn record_success(&self) {
        *self
            .0
            .last_ok
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        self.0.failures.store(0, Ordering::Relaxed);
        self.0.refused.store(0, Ordering::Relaxed);
    }

    /// The HTTP status of the last refused answer (401, 403, 5xx) since the last success.
    pub fn last_refusal(&self) -> Option<u16> {
        Some(self.0.refused.load(Ordering::Relaxed)).filter(|s| *s != 0)
    }

    /// Records an answer: a success, or a [`refusal`] (a failed attempt, though the API server
    /// answered).
    pub fn record_answer(&self, status: http::StatusCode) {
        match refusal(status) {
            None => self.record_success(),
            Some(reason) => {
                self.0.refused.store(status.as_u16(), Ordering::Relaxed);
                self.record_failure(reason);
            }
        }
    }

    /// Records a failed attempt.
    pub fn record_failure(&self, reason: &'static str) {
        self.0.failures.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = self.0.observer.get() {
            o.request_failed(reason);
        }
    }
}

/// The tower service behind the client.
#[derive(Clone)]
struct Failover {
    clients: Arc<Vec<(String, kube::Client)>>,
    current: Arc<AtomicUsize>,
    reach: ApiReachability,
    /// The leader's fence on writes, for the controllers' client (not the lease task's).
    fence: Option<WriteFence>,
}

/// The leader's fence on its Kubernetes writes, the same as on its cloud writes
/// ([`baton_cloud::CallTerm`]): a write is sent only in the term it began in and before that
/// term's deadline, checked before each attempt (the re-send to the next API server included),
/// and counted in flight until its answer.
#[derive(Clone, Debug)]
pub struct WriteFence {
    pub fence: Arc<dyn baton_cloud::Fence>,
    pub in_flight: baton_cloud::InFlight,
}

/// How long a write waits for the deadline of its own term to move (a renewal that comes late)
/// before it fails as not sent.
pub const FENCE_PAUSE_WAIT: Duration = REQUEST_TIMEOUT;

/// A write the fence did not let leave: this replica's term ended, or stayed paused.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} not sent: {reason}")]
pub struct NotSent {
    method: http::Method,
    path: String,
    reason: &'static str,
}

impl WriteFence {
    /// Whether a request of `method` to `path` is a write the fence holds: anything but a read
    /// and the reviews that persist nothing.
    fn holds(method: &http::Method, path: &str) -> bool {
        !matches!(
            *method,
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        ) && !REVIEWS.iter().any(|r| path.ends_with(r))
    }
}

impl Failover {
    /// `idx` failed: later requests start at the next address (unless another request has
    /// already moved on).
    fn skip(&self, idx: usize, reason: &'static str) {
        self.reach.record_failure(reason);
        let n = self.clients.len();
        let _ = self
            .current
            .compare_exchange(idx, (idx + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Counts an attempt dropped by its caller after [`ABANDONED_AFTER`] as a failure of its server.
struct Attempt<'a> {
    failover: &'a Failover,
    idx: usize,
    started: Instant,
    done: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done && self.started.elapsed() >= ABANDONED_AFTER {
            let url = &self.failover.clients[self.idx].0;
            tracing::debug!(api_server = %url, "request abandoned by its caller; trying the next API server from now on");
            self.failover.skip(self.idx, "abandoned");
        }
    }
}

/// How an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection: the request never left.
    NotSent,
    /// A timeout or a connection lost after it was made: the API server may have acted on it.
    MaybeSent,
}

/// What to do on the next API server after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Send it again: doing it twice cannot do anything twice.
    Resend,
    /// A create of a named object: read `path` (the object) first; send the create only if it
    /// does not exist.
    LookUp {
        /// The object's path (`<collection>/<name>`).
        path: String,
    },
    /// Do not send it again: the caller decides.
    GiveUp,
}

/// POSTs that persist nothing: asking again is harmless.
const REVIEWS: &[&str] = &[
    "/tokenreviews",
    "/subjectaccessreviews",
    "/selfsubjectaccessreviews",
    "/selfsubjectrulesreviews",
    "/localsubjectaccessreviews",
    "/selfsubjectreviews",
];

/// The rule for re-sending a request of `method` to `path` (with `body`) that failed as
/// `failure`.
pub fn on_failure(method: &http::Method, path: &str, body: &[u8], failure: Failure) -> Retry {
    if failure == Failure::NotSent || *method != http::Method::POST {
        return Retry::Resend;
    }
    if REVIEWS.iter().any(|r| path.ends_with(r)) {
        return Retry::Resend;
    }
    let name = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|n| !n.is_empty() && !n.contains('/'));
    match name {
        Some(name) => Retry::LookUp {
            path: format!("{}/{name}", path.trim_end_matches('/')),
        },
        None => Retry::GiveUp,
    }
}

/// Whether `found` (an object read back) holds everything `sent` (a create's body) set, apart
/// from `metadata` (which the API server fills in): then the create that failed made it.
pub fn holds_what_was_sent(sent: &serde_json::Value, found: &serde_json::Value) -> bool {
    use serde_json::Value;
    fn subset(sent: &Value, found: &Value) -> bool {
        match (sent, found) {
            (Value::Object(s), Value::Object(f)) => s
                .iter()
                .all(|(k, v)| v.is_null() || f.get(k).is_some_and(|fv| subset(v, fv))),
            (Value::Array(s), Value::Array(f)) => {
                s.len() == f.len() && s.iter().zip(f).all(|(a, b)| subset(a, b))
            }
            (s, f) => s == f,
        }
    }
    match (sent, found) {
        (Value::Object(s), Value::Object(f)) => s
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "apiVersion" | "kind" | "status"))
            .all(|(k, v)| v.is_null() || f.get(k).is_some_and(|fv| subset(v, fv))),
        _ => false,
    }
}

/// How an attempt's transport error failed: a connection never made, or maybe sent.
fn failure_of(error: &kube::Error) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper_util::client::legacy::Error>()
            && h.is_connect()
        {
            return Failure::NotSent;
        }
        source = e.source();
    }
    Failure::MaybeSent
}

/// What a lookup before a re-sent create found.
enum LookedUp {
    /// The object, as the failed create would have made it: its response.
    Ours(Response<Body>),
    /// No such object: send the create.
    Absent,
}

impl Failover {
    /// Reads `path` on API server `idx` (headers as the create's, without its body's).
    async fn look_up(
        &self,
        idx: usize,
        parts: &http::request::Parts,
        path: &str,
        sent: &[u8],
    ) -> Result<LookedUp, BoxError> {
        let (url, client) = &self.clients[idx];
        let mut builder = Request::builder().method(http::Method::GET).uri(path);
        if let Some(h) = builder.headers_mut() {
            h.clone_from(&parts.headers);
            h.remove(http::header::CONTENT_TYPE);
            h.remove(http::header::CONTENT_LENGTH);
        }
        let req = builder.body(Body::empty())?;
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, client.send(req)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => return Err(Box::new(e)),
            Err(_) => {
                return Err(format!("API server {url} did not answer within {REQUEST_TIMEOUT:?}").into());
            }
        };
        let status = resp.status();
        let (head, body) = resp.into_parts();
        let bytes = body.collect_bytes().await?;
        if status == http::StatusCode::NOT_FOUND {
            return Ok(LookedUp::Absent);
        }
        if !status.is_success() {
            return Err(format!("looking up {path} before creating it again: HTTP {status}").into());
        }
        let sent: serde_json::Value = serde_json::from_slice(sent).unwrap_or_default();
        let found: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if !holds_what_was_sent(&sent, &found) {
            return Err(format!(
                "a create of {path} may have failed and an object of that name exists, not the one sent: not created again"
            )
            .into());
        }
        tracing::info!(api_server = %url, %path, "a create that timed out had been made: not sent again");
        let mut resp = Response::from_parts(head, Body::from(bytes));
        *resp.status_mut() = http::StatusCode::CREATED;
        Ok(LookedUp::Ours(resp))
    }
}

impl Failover {
    /// The term a write of this fenced client was decided in (`None`: not a fenced write);
    /// refused at once when this replica does not lead.
    fn write_term(
        &self,
        parts: &http::request::Parts,
    ) -> Result<Option<(baton_cloud::CallTerm, baton_cloud::InFlight)>, BoxError> {
        let Some(fence) = self
            .fence
            .as_ref()
            .filter(|_| WriteFence::holds(&parts.method, parts.uri.path()))
        else {
            return Ok(None);
        };
        let term = baton_cloud::CallTerm::begin(Arc::clone(&fence.fence));
        if term.lead().is_none() {
            return Err(not_sent(parts, "this replica does not lead"));
        }
        Ok(Some((term, fence.in_flight.clone())))
    }

    /// Right before an attempt of a fenced write: waits for its term to be open (a late renewal
    /// at most [`FENCE_PAUSE_WAIT`]), and counts it in flight until the returned guard drops.
    async fn may_send(
        &self,
        term: Option<&(baton_cloud::CallTerm, baton_cloud::InFlight)>,
        parts: &http::request::Parts,
    ) -> Result<Option<baton_cloud::Sending>, BoxError> {
        let Some((term, in_flight)) = term else {
            return Ok(None);
        };
        term.sendable_within(FENCE_PAUSE_WAIT)
            .await
            .map_err(|reason| not_sent(parts, reason))?;
        Ok(Some(in_flight.enter()))
    }
}

fn not_sent(parts: &http::request::Parts, reason: &'static str) -> BoxError {
    Box::new(NotSent {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        reason,
    })
}

impl tower::Service<Request<Body>> for Failover {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            if let Some(uri) = bounded_watch(&parts.uri, WATCH_TIMEOUT) {
                parts.uri = uri;
            }
            let bytes = body.collect_bytes().await?;
            let term = this.write_term(&parts)?;
            let n = this.clients.len();
            let start = this.current.load(Ordering::Relaxed);
            let mut last: Option<BoxError> = None;
            // Set once an attempt may have been received: how the next one goes.
            let mut retry = Retry::Resend;
            for i in 0..n {
                let idx = (start + i) % n;
                match &retry {
                    Retry::Resend => {}
                    Retry::GiveUp => break,
                    Retry::LookUp { path } => match this.look_up(idx, &parts, path, &bytes).await {
                        Ok(LookedUp::Ours(resp)) => {
                            this.current.store(idx, Ordering::Relaxed);
                            this.reach.record_answer(resp.status());
                            return Ok(resp);
                        }
                        Ok(LookedUp::Absent) => {}
                        Err(error) => {
                            tracing::debug!(api_server = %this.clients[idx].0, %error, "lookup before a re-sent create failed");
                            this.skip(idx, "transport");
                            last = Some(error);
                            continue;
                        }
                    },
                }
                let mut builder = Request::builder()
                    .method(parts.method.clone())
                    .uri(parts.uri.clone())
                    .version(parts.version);
                if let Some(h) = builder.headers_mut() {
                    h.clone_from(&parts.headers);
                }
                let req = builder.body(Body::from(bytes.clone()))?;
                let _sending = this.may_send(term.as_ref(), &parts).await?;
                let (url, client) = &this.clients[idx];
                let mut attempt = Attempt {
                    failover: &this,
                    idx,
                    started: Instant::now(),
                    done: false,
                };
                let result = tokio::time::timeout(REQUEST_TIMEOUT, client.send(req)).await;
                attempt.done = true;
                let failure = match result {
                    Ok(Ok(resp)) => {
                        if idx != start {
                            tracing::info!(api_server = %url, "switched to another API server");
                        }
                        this.current.store(idx, Ordering::Relaxed);
                        this.reach.record_answer(resp.status());
                        return Ok(resp);
                    }
                    Ok(Err(error)) => {
                        let reason = classify(&error);
                        tracing::debug!(api_server = %url, %error, reason, "API server unreachable; trying the next");
                        this.skip(idx, reason);
                        let failure = failure_of(&error);
                        last = Some(Box::new(error));
                        failure
                    }
                    Err(_) => {
                        tracing::debug!(api_server = %url, timeout = ?REQUEST_TIMEOUT, "API server did not answer in time; trying the next");
                        this.skip(idx, "timeout");
                        last = Some(
                            format!("API server {url} did not answer within {REQUEST_TIMEOUT:?}").into(),
                        );
                        Failure::MaybeSent
                    }
                };
                // Once a lookup is due it stays due: an earlier attempt may have created it.
                if !matches!(retry, Retry::LookUp { .. }) {
                    retry = on_failure(&parts.method, parts.uri.path(), &bytes, failure);
                }
                if retry == Retry::GiveUp {
                    tracing::warn!(api_server = %url, method = %parts.method, path = parts.uri.path(), "a request that may have been received is not sent again (not idempotent)");
                }
            }
            Err(last.unwrap_or_else(|| "no API server".into()))
        })
    }
}

/// The failure reason of a transport error, from the io errors in its source chain.
fn classify(error: &kube::Error) -> &'static str {
    use std::io::ErrorKind;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::TimedOut => return "timeout",
                ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::NotConnected
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable => return "connect",
                _ => {}
            }
        }
        source = e.source();
    }
    "transport"
}

/// For a watch request (`watch=true` or `watch=1`), the same URI with `timeoutSeconds` lowered to
/// at most `max` (added when missing); `None` for any other request or when nothing changes.
fn bounded_watch(uri: &http::Uri, max: Duration) -> Option<http::Uri> {
    let query = uri.query()?;
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    if !pairs
        .iter()
        .any(|(k, v)| k == "watch" && matches!(v.as_str(), "true" | "1"))
    {
        return None;
    }
    let max = max.as_secs();
    let current = pairs
        .iter()
        .find(|(k, _)| k == "timeoutSeconds")
        .and_then(|(_, v)| v.parse::<u64>().ok());
    if current.is_some_and(|t| t > 0 && t <= max) {
        return None;
    }
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in &pairs {
        if k != "timeoutSeconds" {
            out.append_pair(k, v);
        }
    }
    out.append_pair("timeoutSeconds", &max.to_string());
    let path_and_query = format!("{}?{}", uri.path(), out.finish());
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// A client for `base` (credentials, CA, TLS server name) that sends each request to the first
/// reachable of `urls`, starting from the last one that answered, with the time limits of this
/// module, recording every attempt in `reach`. With no `urls`, `base`'s own server (the
/// kubeconfig's): the time limits and the reachability record matter there as much.
pub fn client(
    base: &kube::Config,
    urls: &[String],
    reach: &ApiReachability,
) -> Result<kube::Client, FailoverError> {
    clients(base, urls, reach).map(|c| c.client())
}

/// The shared state of [`client`], to make fenced and unfenced clients from.
pub fn clients(
    base: &kube::Config,
    urls: &[String],
    reach: &ApiReachability,
) -> Result<Clients, FailoverError> {
    let own = [base.cluster_url.to_string()];
    let urls = if urls.is_empty() { &own[..] } else { urls };
    let mut clients = Vec::with_capacity(urls.len());
    for url in urls {
        let mut cfg = base.clone();
        cfg.cluster_url = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| FailoverError::Url {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        // A dead API server must cost little: fail the connection fast and try the next.
        cfg.connect_timeout = Some(
            cfg.connect_timeout
                .map_or(CONNECT_TIMEOUT, |t| t.min(CONNECT_TIMEOUT)),
        );
        cfg.read_timeout = Some(READ_TIMEOUT);
        cfg.write_timeout = Some(cfg.write_timeout.map_or(READ_TIMEOUT, |t| t.min(READ_TIMEOUT)));
        // Count the read timeout from each request, not from when a pooled connection went idle.
        cfg.reset_reader_on_write = true;
        let c = kube::Client::try_from(cfg).map_err(|source| FailoverError::Client {
            url: url.clone(),
            source,
        })?;
        clients.push((url.clone(), c));
    }
    Ok(Clients {
        failover: Failover {
            clients: Arc::new(clients),
            current: Arc::new(AtomicUsize::new(0)),
            reach: reach.clone(),
            fence: None,
        },
        ns: base.default_namespace.clone(),
    })
}

/// The failover client's shared state (addresses, the one that answered last, reachability),
/// from which clients with and without the leader's write fence are made.
#[derive(Clone)]
pub struct Clients {
    failover: Failover,
    ns: String,
}

impl Clients {
    /// A client with no fence (the lease task, reads, tools).
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.failover.clone(), self.ns.clone())
    }

    /// A client whose writes go out only under `fence` (the controllers' client).
    pub fn fenced(&self, fence: WriteFence) -> kube::Client {
        let mut failover = self.failover.clone();
        failover.fence = Some(fence);
        kube::Client::new(failover, self.ns.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> http::Uri {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn watches_are_bounded_and_nothing_else_is_touched() {
        let five = Duration::from_secs(5);
        let w = bounded_watch(
            &uri("/api/v1/nodes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=12"),
            five,
        )
        .map(|u| u.to_string());
        assert_eq!(
            w.as_deref(),
            Some("/api/v1/nodes?watch=true&allowWatchBookmarks=true&resourceVersion=12&timeoutSeconds=5")
        );
        let w = bounded_watch(&uri("https://h:6443/api/v1/pods?watch=1"), five).map(|u| u.to_string());
        assert_eq!(
            w.as_deref(),
            Some("https://h:6443/api/v1/pods?watch=1&timeoutSeconds=5")
        );
        assert_eq!(
            bounded_watch(&uri("/api/v1/nodes?watch=true&timeoutSeconds=3"), five),
            None
        );
        assert_eq!(bounded_watch(&uri("/api/v1/nodes?limit=500"), five), None);
        assert_eq!(bounded_watch(&uri("/api/v1/nodes"), five), None);
        assert_eq!(bounded_watch(&uri("/api/v1/nodes?watch=false"), five), None);
    }

    fn post(path: &str, body: &serde_json::Value, failure: Failure) -> Retry {
        on_failure(&http::Method::POST, path, body.to_string().as_bytes(), failure)
    }

    #[test]
    fn what_is_sent_again_after_a_failure_that_may_have_reached_the_server() {
        use http::Method;
        let maybe = Failure::MaybeSent;
        let event = serde_json::json!({"metadata": {"name": "web.17a2", "namespace": "apps"}, "reason": "X"});
        let events = "/apis/events.k8s.io/v1/namespaces/apps/events";
        assert_eq!(
            post(events, &event, maybe),
            Retry::LookUp {
                path: format!("{events}/web.17a2")
            }
        );
        // Never sent: anything goes to the next API server as it is.
        assert_eq!(post(events, &event, Failure::NotSent), Retry::Resend);
        // A generated name: a second create would make a second object.
        let generated = serde_json::json!({"metadata": {"generateName": "web-"}});
        assert_eq!(post(events, &generated, maybe), Retry::GiveUp);
        assert_eq!(post(events, &serde_json::json!("not json"), maybe), Retry::GiveUp);
        // Reviews persist nothing.
        for review in [
            "/apis/authentication.k8s.io/v1/tokenreviews",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        ] {
            assert_eq!(
                post(review, &serde_json::json!({"spec": {}}), maybe),
                Retry::Resend
            );
        }
        // The same write twice is the same state (or fails, when conditional).
        for method in [Method::GET, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(
                on_failure(&method, events, b"{}", maybe),
                Retry::Resend,
                "{method}"
            );
        }
    }

    #[test]
    fn a_create_is_recognised_by_what_it_sent() {
        let sent = serde_json::json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.17a2", "namespace": "apps"},
            "reason": "FloatingIPReserved", "note": "reserved 203.0.113.7",
            "eventTime": "2026-01-01T00:00:00.123456Z",
            "regarding": {"kind": "Service", "name": "web", "namespace": "apps"},
            "series": null,
        });
        let mut found = sent.clone();
        found["metadata"]["uid"] = "u-1".into();
        found["metadata"]["resourceVersion"] = "42".into();
        found["regarding"]["uid"] = "s-1".into();
        found["deprecatedCount"] = 0.into();
        assert!(
            holds_what_was_sent(&sent, &found),
            "ours, with what the server added"
        );
        let mut other = found.clone();
        other["note"] = "reserved 203.0.113.9".into();
        assert!(!holds_what_was_sent(&sent, &other), "someone else's of that name");
        assert!(!holds_what_was_sent(&sent, &serde_json::json!("x")));
    }

    #[tokio::test]
    async fn reachability_counts_silence_and_failures() {
        struct Count(AtomicU64);
        impl ApiObserver for Count {
            fn request_failed(&self, _: &'static str) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let r = ApiReachability::new();
        let count = Arc::new(Count(AtomicU64::new(0)));
        r.set_observer(Arc::clone(&count) as _);
        let window = Duration::from_millis(200);
        assert!(!r.answered_within(window), "no grace before the first answer");
        r.record_success();
        assert!(r.answered_within(window));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(!r.answered_within(window));
        r.record_failure("timeout");
        r.record_failure("connect");
        assert_eq!(r.consecutive_failures(), 2);
        assert_eq!(count.0.load(Ordering::Relaxed), 2);
        r.record_success();
        assert_eq!(r.consecutive_failures(), 0);
        assert!(r.answered_within(window));
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_successful_answer_counts_as_reaching_the_api_server() {
        let r = ApiReachability::new();
        let window = Duration::from_millis(200);
        tokio::time::sleep(Duration::from_millis(250)).await;
        for refused in [401, 403, 500, 503] {
            r.record_answer(http::StatusCode::from_u16(refused).unwrap());
            assert!(!r.answered_within(window), "{refused} counted as an answer");
            assert_eq!(r.last_refusal(), Some(refused));
        }
        assert_eq!(r.consecutive_failures(), 4);
        // A conflict, a missing object, a throttled request: the API server judged them.
        for judged in [200, 201, 404, 409, 429] {
            let r = ApiReachability::new();
            tokio::time::sleep(Duration::from_millis(250)).await;
            r.record_answer(http::StatusCode::from_u16(judged).unwrap());
            assert!(r.answered_within(window), "{judged} not counted as an answer");
            assert_eq!(r.last_refusal(), None);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_leaves_only_in_its_own_term_and_waits_out_a_short_pause() {
        use baton_cloud::Lead;
        assert!(WriteFence::holds(
            &http::Method::PATCH,
            "/api/v1/namespaces/a/services/b/status"
        ));
        assert!(WriteFence::holds(
            &http::Method::POST,
            "/api/v1/namespaces/a/events"
        ));
        assert!(!WriteFence::holds(&http::Method::GET, "/api/v1/services"));
        assert!(!WriteFence::holds(
            &http::Method::POST,
            "/apis/authentication.k8s.io/v1/tokenreviews"
        ));
        let lead = |term, ms| {
            Some(Lead {
                term,
                until: Instant::now() + Duration::from_millis(ms),
            })
        };
        let (tx, rx) = tokio::sync::watch::channel(lead(1, 600));
        let fence: Arc<dyn baton_cloud::Fence> = Arc::new(rx);
        let in_term_1 = baton_cloud::CallTerm::begin(Arc::clone(&fence));
        let open = |call: &baton_cloud::CallTerm| {
            let call = call.clone();
            async move { call.sendable_within(FENCE_PAUSE_WAIT).await }
        };
        assert_eq!(open(&in_term_1).await, Ok(()), "its term, before the deadline");

        // Paused: the deadline passed; a late renewal of the same term lets it go.
        tokio::time::advance(Duration::from_millis(700)).await;
        let waiting = tokio::spawn(open(&in_term_1));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "no write while paused");
        tx.send_replace(lead(1, 600));
        assert_eq!(waiting.await.unwrap(), Ok(()), "resumed in the same term");

        // A new term while it waits: the old term's write is dropped, and stays so.
        tokio::time::advance(Duration::from_millis(700)).await;
        let waiting = tokio::spawn(open(&in_term_1));
        tokio::time::advance(Duration::from_millis(200)).await;
        tx.send_replace(lead(2, 600));
        assert!(waiting.await.unwrap().is_err(), "decided in a term that ended");
        assert!(open(&in_term_1).await.is_err(), "another term's write");

        // A pause that lasts: given up after FENCE_PAUSE_WAIT.
        let in_term_2 = baton_cloud::CallTerm::begin(Arc::clone(&fence));
        tokio::time::advance(Duration::from_millis(700)).await;
        let started = Instant::now();
        assert!(open(&in_term_2).await.is_err());
        assert!(started.elapsed() >= FENCE_PAUSE_WAIT);

        // No term: nothing is sent.
        tx.send_replace(None);
        let no_term = baton_cloud::CallTerm::begin(fence);
        assert_eq!(open(&no_term).await, Err("this replica does not lead"));
    }
}
