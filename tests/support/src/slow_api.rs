//! A slow API server, for writes: a TLS-terminating HTTP reverse proxy in front of one real
//! kube-apiserver that holds every write for a drawn latency and passes reads at once.
//!
//! ```text
//!  client (a baton replica on the node)        SlowApi (in the test process, listening in
//!    https://198.51.100.11:<port>   ──TLS──▶     the node's network namespace)
//!                                                 │ GET, HEAD, OPTIONS (reads, watches)
//!                                                 ├──────────── at once, streamed ──────────┐
//!                                                 │ POST, PUT, PATCH, DELETE (writes)        │
//!                                                 └─▶ FIFO ─▶ writer: sleep until arrival    │
//!                                                     + drawn hold, forward, await the answer │
//!                                                                                ──TLS──▶ kube-apiserver
//!                                                                              198.51.100.11:6443
//! ```
//!
//! - **Where.** It listens on API server `i`'s own address, on a port of its own (the
//!   kernel's choice), with a serving certificate for that address signed by the cluster CA: a
//!   client on that node (or anywhere in the lab) uses [`SlowApi::url`] as its API server,
//!   e.g. through [`ControlPlane::write_kubeconfig_for`]. On a lab node its sockets, the
//!   listener and the connections to the API server alike, are made in the node's network
//!   namespace, so the node's faults apply to it as to anything running there.
//! - **What passes.** Every request header (bearer tokens included) except the hop-by-hop ones;
//!   the body; the answer's status, headers and body. Reads and watches (`GET`, `HEAD`,
//!   `OPTIONS`) pass at once and their answers stream: a watch's events arrive as the API server
//!   sends them. HTTP/1.1 and HTTP/2 (ALPN) on both sides; no protocol upgrades (`exec`,
//!   `port-forward`).
//! - **Writes.** A write's body is read, a hold is drawn from the [`Profile`]'s log-normal
//!   latency (seeded, so a run repeats draw for draw), and the write joins one queue. The
//!   queue's writer forwards each write once its hold has passed *and* the write before it was
//!   answered: the API server applies writes in the order they arrived, one at a time, as behind
//!   a slow etcd, and the proxy never reorders them. A write is never dropped by the proxy: it
//!   is forwarded even if its client gave up waiting (a slow server still applies a request
//!   whose client timed out), and [`SlowApiStats::abandoned`] counts those.
//! - **Changing.** [`SlowApi::set_profile`] applies to writes that arrive afterwards (writes
//!   held already keep their draw); [`SlowApi::off`] passes new writes at once (behind the
//!   writes still held, in order).
//!
//! Dropping the `SlowApi` stops it: its listener, connections and queue (writes still held
//! then are not sent).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::control_plane::{APISERVER_PORT, ControlPlane};
use crate::latency::{Latency, LatencyError};
use crate::tls_server::{self, Body};

type Upstream = Client<hyper_rustls::HttpsConnector<NodeConnector>, Body>;

/// How long writes are held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// `None`: writes pass at once.
    latency: Option<Latency>,
    seed: u64,
}

impl Profile {
    /// Writes pass at once.
    pub const OFF: Self = Self {
        latency: None,
        seed: 0,
    };

    /// Writes are held for a latency drawn from the log-normal distribution with median `p50`
    /// and 99th percentile `p99` (seed 0; see [`with_seed`](Self::with_seed)).
    pub fn writes(p50: Duration, p99: Duration) -> Result<Self, LatencyError> {
        Ok(Self {
            latency: Some(Latency::from_percentiles(p50, p99)?),
            seed: 0,
        })
    }

    /// Every write is held for `d` (zero: [`OFF`](Self::OFF)).
    pub fn fixed(d: Duration) -> Self {
        Self {
            latency: Latency::from_percentiles(d, d).ok(),
            seed: 0,
        }
    }

    /// The same distribution, drawn from a random source seeded with `seed`.
    #[must_use]
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// The latency distribution of writes (`None`: off).
    pub fn latency(&self) -> Option<Latency> {
        self.latency
    }
}

/// What a [`SlowApi`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowApiStats {
    /// Writes received (each is held; for no time while the profile is off).
    pub writes: u64,
    /// Writes received and not yet answered by the API server (held, queued or in flight).
    pub holding: u64,
    /// Writes forwarded and answered by the API server.
    pub forwarded: u64,
    /// Of those, writes whose client had gone (timed out, disconnected) when the answer
    /// came: the API server applied them all the same.
    pub abandoned: u64,
    /// Reads and watches passed at once.
    pub reads: u64,
    /// Requests the API server could not be reached for (the client got a 502).
    pub failed: u64,
}

/// One write, as the proxy held and forwarded it ([`SlowApi::writes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldWrite {
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The request's path and query.
    pub path: String,
    /// The latency drawn for it.
    pub hold: Duration,
    /// From its arrival until it was forwarded: at least `hold`, longer when the write before
    /// it was answered later.
    pub forwarded_after: Duration,
    /// From its arrival until the API server's answer (status and headers).
    pub answered_after: Duration,
    /// The API server's status; `None` when it could not be reached.
    pub status: Option<u16>,
    /// Whether its client had gone when the answer came.
    pub client_gone: bool,
}

/// A running slow API server (see the module docs). Dropping it stops it.
pub struct SlowApi {
    addr: SocketAddr,
    apiserver: usize,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

struct Shared {
    upstream: Upstream,
    /// `https://<API server address>:6443`.
    target: String,
    state: Mutex<State>,
}

struct State {
    profile: Profile,
    rng: StdRng,
    stats: SlowApiStats,
    log: Vec<HeldWrite>,
    /// The writer's queue, in arrival order (sent while this state is locked, so the order of
    /// the draws is the order of the queue).
    queue: mpsc::UnboundedSender<Job>,
}

/// A held write waiting for the writer.
struct Job {
    request: Request<Body>,
    arrived: Instant,
    hold: Duration,
    answer: oneshot::Sender<Result<Response<Incoming>, String>>,
}

impl SlowApi {
    /// Starts a slow API server in front of API server `i` of `cp`, holding writes as
    /// `profile` says. Must be called inside the lab.
    pub async fn start(cp: &ControlPlane, i: usize, profile: Profile) -> anyhow::Result<Self> {
        let ip = cp.addresses()[i];
        let netns = cp.apiserver_netns(i);
        let listener = bind(netns.clone(), SocketAddr::new(ip, 0))
            .await
            .with_context(|| format!("binding the slow API server on {ip}"))?;
        let addr = listener.local_addr()?;
        let cert = cp.issue_serving_cert(&[ip.to_string()])?;
        let acceptor = tls_server::acceptor(cert)?;

        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls::pki_types::CertificateDer::from(cp.ca_der().to_vec()))?;
        let client_tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(client_tls)
            .https_only()
            .enable_all_versions()
            .wrap_connector(NodeConnector {
                netns: netns.map(Arc::new),
            });
        let upstream = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);

        let (queue, jobs) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            upstream,
            target: format!("https://{}", SocketAddr::new(ip, APISERVER_PORT)),
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(profile.seed),
                profile,
                stats: SlowApiStats::default(),
                log: Vec::new(),
                queue,
            }),
        });
        let writer = tokio::spawn(write_in_order(Arc::clone(&shared), jobs));
        let handler = {
            let shared = Arc::clone(&shared);
            move |req| {
                let shared = Arc::clone(&shared);
                async move { handle(&shared, req).await }
            }
        };
        let accept = tokio::spawn(tls_server::serve(listener, acceptor, handler));
        Ok(Self {
            addr,
            apiserver: i,
            shared,
            accept,
            writer,
        })
    }

    /// `https://<address>:<port>`: the URL a client uses as its API server.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The address it listens on (API server `i`'s address, a port of its own).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The index of the API server behind it.
    pub fn apiserver(&self) -> usize {
        self.apiserver
    }

    /// Holds the writes that arrive from now on as `profile` says (reseeding the random source
    /// with its seed). Writes held already keep their draw.
    pub fn set_profile(&self, profile: Profile) {
        let mut state = lock(&self.shared.state);
        state.rng = StdRng::seed_from_u64(profile.seed);
        state.profile = profile;
    }

    /// Passes the writes that arrive from now on at once (after the writes still held).
    pub fn off(&self) {
        self.set_profile(Profile::OFF);
    }

    /// The current profile.
    pub fn profile(&self) -> Profile {
        lock(&self.shared.state).profile
    }

    /// The counters so far.
    pub fn stats(&self) -> SlowApiStats {
        lock(&self.shared.state).stats
    }

    /// Every write answered so far (or found unreachable), in the order it was forwarded.
    pub fn writes(&self) -> Vec<HeldWrite> {
        lock(&self.shared.state).log.clone()
    }
}

impl Drop for SlowApi {
    fn drop(&mut self) {
        // The serving task owns the connections (aborted with it).
        self.accept.abort();
        self.writer.abort();
    }
}

/// Whether `method` writes (is held) or reads (passes at once).
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let arrived = Instant::now();
    let (mut parts, body) = req.into_parts();
    let target = match upstream_uri(&shared.target, &parts.uri) {
        Ok(uri) => uri,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    parts.uri = target;
    strip_hop_by_hop(&mut parts.headers);
    parts.version = hyper::Version::HTTP_11;
    if !is_write(&parts.method) {
        lock(&shared.state).stats.reads += 1;
        return match shared
            .upstream
            .request(Request::from_parts(parts, body.boxed()))
            .await
        {
            Ok(resp) => downstream(resp),
            Err(e) => {
                lock(&shared.state).stats.failed += 1;
                error(StatusCode::BAD_GATEWAY, &format!("API server: {e}"))
            }
        };
    }
    // A write: read it whole, draw its hold and queue it, in one step under the lock.
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("reading the request: {e}")),
    };
    let request = Request::from_parts(parts, tls_server::full(body));
    let (answer, answered) = oneshot::channel();
    {
        let mut state = lock(&shared.state);
        let hold = match state.profile.latency {
            Some(lat) => {
                let State { rng, .. } = &mut *state;
                lat.sample(rng)
            }
            None => Duration::ZERO,
        };
        state.stats.writes += 1;
        state.stats.holding += 1;
        let job = Job {
            request,
            arrived,
            hold,
            answer,
        };
        if state.queue.send(job).is_err() {
            return error(StatusCode::SERVICE_UNAVAILABLE, "the slow API server is stopping");
        }
    }
    // If the client goes away, this future is dropped; the writer forwards the write anyway.
    match answered.await {
        Ok(Ok(resp)) => downstream(resp),
        Ok(Err(e)) => error(StatusCode::BAD_GATEWAY, &e),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the slow API server is stopping"),
    }
}

/// The writer: forwards the queued writes one at a time, in arrival order, each once its hold
/// has passed, and awaits the API server's answer before the next.
async fn write_in_order(shared: Arc<Shared>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = jobs.recv().await {
        let Job {
            request,
            arrived,
            hold,
            answer,
        } = job;
        tokio::time::sleep_until(arrived + hold).await;
        let forwarded_after = arrived.elapsed();
        let method = request.method().to_string();
        let path = request
            .uri()
            .path_and_query()
            .map_or_else(String::new, ToString::to_string);
        let result = shared
            .upstream
            .request(request)
            .await
            .map_err(|e| format!("API server: {e}"));
        let answered_after = arrived.elapsed();
        let status = result.as_ref().ok().map(|r| r.status().as_u16());
        let client_gone = match answer.send(result) {
            Ok(()) => false,
            Err(unsent) => {
                // Nobody waits for the answer: read it to the end (so the connection is
                // reused), as the API server has applied the write all the same.
                if let Ok(resp) = unsent {
                    tokio::spawn(async move {
                        let _ = resp.into_body().collect().await;
                    });
                }
                true
            }
        };
        let mut state = lock(&shared.state);
        state.stats.holding -= 1;
        if status.is_some() {
            state.stats.forwarded += 1;
            if client_gone {
                state.stats.abandoned += 1;
            }
        } else {
            state.stats.failed += 1;
        }
        state.log.push(HeldWrite {
            method,
            path,
            hold,
            forwarded_after,
            answered_after,
            status,
            client_gone,
        });
    }
}

/// `target` + the path and query of `uri`.
fn upstream_uri(target: &str, uri: &Uri) -> Result<Uri, String> {
    let pq = uri.path_and_query().map_or("/", |pq| pq.as_str());
    format!("{target}{pq}")
        .parse()
        .map_err(|e| format!("request path {pq:?}: {e}"))
}

/// Removes the headers that describe one connection, not the message (RFC 9110 §7.6.1), and
/// `Host` (the upstream URI carries the API server's authority).
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
    ] {
        headers.remove(name);
    }
}

/// The API server's answer, for the client: its body streams through.
fn downstream(resp: Response<Incoming>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(parts, body.boxed())
}

fn error(status: StatusCode, msg: &str) -> Response<Body> {
    tls_server::text(status, &format!("slow API server: {msg}"))
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on a new thread that has entered the network namespace `netns` (or stayed in the
/// caller's when `None`): a socket made there stays in that namespace for its whole life,
/// whichever thread uses it later.
async fn in_netns<T: Send + 'static>(
    netns: Option<PathBuf>,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("slow-api-netns".into())
        .spawn(move || {
            let result = (|| {
                if let Some(ns) = &netns {
                    enter_netns(ns)?;
                }
                f().map_err(anyhow::Error::from)
            })();
            let _ = tx.send(result);
        })
        .context("starting a thread for the node's network namespace")?;
    rx.await.context("the network namespace thread ended")?
}

fn enter_netns(ns: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::open(ns).with_context(|| format!("opening {}", ns.display()))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering the network namespace {}", ns.display()))
}

/// A listener on `addr` in `netns`.
async fn bind(netns: Option<PathBuf>, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let std = in_netns(netns, move || {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .await?;
    Ok(TcpListener::from_std(std)?)
}

/// Connects to the API server from the node's network namespace (or the lab's).
#[derive(Clone)]
struct NodeConnector {
    netns: Option<Arc<PathBuf>>,
}

impl tower::Service<Uri> for NodeConnector {
    type Response = TokioIo<TcpStream>;
    type Error = anyhow::Error;
    type Future = Pin<Box<dyn Future<Output = anyhow::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<anyhow::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let netns = self.netns.as_deref().cloned();
        Box::pin(async move {
            let host = uri.host().context("no host in the API server's URL")?;
            let ip: IpAddr = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .with_context(|| format!("API server host {host}"))?;
            let addr = SocketAddr::new(ip, uri.port_u16().unwrap_or(443));
            if netns.is_none() {
                let s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
                    .await
                    .with_context(|| format!("connecting to {addr}: timed out"))?
                    .with_context(|| format!("connecting to {addr}"))?;
                s.set_nodelay(true)?;
                return Ok(TokioIo::new(s));
            }
            let std = in_netns(netns, move || {
                let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                Ok(s)
            })
            .await
            .with_context(|| format!("connecting to {addr}"))?;
            Ok(TokioIo::new(TcpStream::from_std(std)?))
        })
    }
}

#[cfg(test)]
mod tests;
