//! The I/O shell around the parsers: accept, read the first bytes within the bounds, choose
//! the backend set from the current route table, connect, replay, splice.
//!
//! ```text
//!  free slot? (--max-connections; else the accept loop waits: backpressure) ─► accept
//!   ─► admission: per-source caps (refused at once, reset), pending queue (oldest evicted)
//!   ─► read ≤ max_hello bytes within hello_timeout, the buffer growing only by what arrives
//!        ─┬─ SNI listener:   hello::parse
//!         └─ PROXY listener: proxy_protocol::parse — tenant TLV → host, else destination →
//!            host, else hello::parse
//!   ─► RouteTable::for_host_port (the snapshot current now; later reloads do not touch this
//!      connection) ─► BackendSet::order (up ones, one trial of a down one; none: refused at once)
//!   ─► connect (≤ max_connecting in flight per set; connect_timeout each; next on failure)
//!   ─► write the bytes read (minus a PROXY header) ─► pump::both_ways until both sides end,
//!      idle or stalled (a pipe or buffer only while bytes flow)
//! ```

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::admission::{Admitted, Caps, Pending, PendingSlot, Sources};
use super::hello::{self, Hello, HelloError};
use super::metrics::Metrics;
use super::proxy_protocol::{self, Proxied, ProxyError};
use super::pump::{self, PumpError, Timeouts, Transfer};
use super::routes::{BackendSet, Health, NoBackend, RouteTable};

/// A TLS fatal alert `unrecognized_name` (112), sent before closing on an unknown name.
pub const UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];

/// The server name of the router's own health check (`baton controller` probes the router on
/// every control-plane node with it): always answered by the router itself with
/// [`UNRECOGNIZED_NAME`], whatever the routes say. `.invalid` is reserved (RFC 2606): no
/// tenant can have it.
pub const HEALTH_NAME: &str = "health.baton.invalid";

/// TCP keep-alive on both sides of a spliced connection: a peer that vanished without a FIN
/// (a dead client, a powered-off node) is found within about two minutes, whatever the idle
/// timeout.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 6;

/// Connections accepted in a row before the accept loop lets the thread's other tasks run.
const ACCEPT_BATCH: usize = 8;

/// Bytes read from a client at once before it is routed (then copied into its own buffer,
/// which so grows only by what arrived).
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// The bounds every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes read before a backend is chosen (PROXY header and ClientHello).
    pub max_hello: usize,
    /// The longest time to read them.
    pub hello_timeout: Duration,
    /// The longest time to connect to one backend.
    pub connect_timeout: Duration,
    /// The most connects in flight at once to one backend set (a tenant).
    pub max_connecting: usize,
    /// Idle and stall timeouts of spliced connections.
    pub timeouts: Timeouts,
    /// How spliced connections' bytes are moved.
    pub transfer: Transfer,
    /// The connection caps.
    pub caps: Caps,
    /// The PROXY v2 TLV type that names a tenant's host name (`None`: not read).
    pub proxy_tenant_tlv: Option<u8>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_hello: 16 * 1024,
            hello_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_connecting: 512,
            timeouts: Timeouts {
                idle: Duration::from_secs(3600),
                stall: Duration::from_secs(300),
            },
            transfer: Transfer::Copy,
            caps: Caps::default(),
            proxy_tenant_tlv: Some(0xE0),
        }
    }
}

/// Which protocol a listener speaks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TLS: route by the ClientHello's server name.
    Sni,
    /// A PROXY protocol header, then TLS: route by the tenant TLV, else the original
    /// destination, else by SNI.
    Proxy,
}

/// Why a connection was closed before it was spliced.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("client closed before a complete ClientHello")]
    Closed,
    #[error("no complete ClientHello within the time limit")]
    Timeout,
    #[error("evicted: the oldest of too many connections not yet routed")]
    Evicted,
    #[error("more than {0} bytes before a complete ClientHello")]
    TooMuch(usize),
    #[error(transparent)]
    Hello(#[from] HelloError),
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("no route for server name {0:?}")]
    Unknown(String),
    #[error("no server name and no default route")]
    NoSni,
    #[error("the router's health check")]
    Health,
    #[error("reading from the client: {0}")]
    Io(#[from] std::io::Error),
}

impl Refused {
    fn reason(&self) -> &'static str {
        match self {
            Self::Closed | Self::Io(_) => "closed",
            Self::Timeout => "hello_timeout",
            Self::Evicted => "evicted",
            Self::TooMuch(_) => "too_large",
            Self::Hello(e) => e.category(),
            Self::Proxy(_) => "proxy_header",
            Self::Unknown(_) => "unknown_sni",
            Self::NoSni => "no_sni",
            Self::Health => "health_check",
        }
    }

    /// Whether the client is told (a TLS alert, then a normal close) rather than reset.
    fn answered(&self) -> bool {
        matches!(self, Self::Unknown(_) | Self::NoSni | Self::Health)
    }
}

/// The router: the current routes, the backends' health, the bounds, the connection slots and
/// the metrics.
#[derive(Debug)]
pub struct Router {
    routes: watch::Receiver<Arc<RouteTable>>,
    health: Arc<Health>,
    limits: Limits,
    metrics: Arc<Metrics>,
    /// Descriptors for connections: two per `caps.max_connections`. A connection takes one at
    /// accept and a second when it is routed (its backend's): one still reading its ClientHello
    /// costs one descriptor, so as many can wait as could be spliced.
    slots: Arc<Semaphore>,
    sources: Arc<Sources>,
    pending: Arc<Pending>,
}

/// What a connection holds from accept to its end: its descriptors' permits, its place in its
/// source's counts.
struct Admission {
    slot: OwnedSemaphorePermit,
    source: Admitted,
}

impl Router {
    pub fn new(
        routes: watch::Receiver<Arc<RouteTable>>,
        health: Arc<Health>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let caps = limits.caps;
        metrics.set_max_connections(caps.max_connections);
        Self {
            routes,
            health,
            limits,
            metrics,
            slots: Arc::new(Semaphore::new(
                caps.max_connections
                    .saturating_mul(2)
                    .clamp(2, Semaphore::MAX_PERMITS),
            )),
            sources: Sources::new(caps),
            pending: Pending::new(pending_cap(&caps), caps.pending_bytes.max(limits.max_hello)),
        }
    }

    /// The routes in force.
    pub fn routes(&self) -> &watch::Receiver<Arc<RouteTable>> {
        &self.routes
    }

    /// Accepts on `listener` until `shutdown`; each connection runs on `tracker`.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        kind: Kind,
        shutdown: CancellationToken,
        tracker: TaskTracker,
    ) {
        let port = listener.local_addr().map_or(0, |a| a.port());
        let mut in_a_row = 0_usize;
        loop {
            // Fairness: a full accept queue (a flood) would otherwise be drained up to tokio's
            // budget (128) in one go, and every connection already spliced on this thread,
            // legitimate users among them, would wait behind the whole batch.
            in_a_row += 1;
            if in_a_row == ACCEPT_BATCH {
                in_a_row = 0;
                tokio::task::yield_now().await;
            }
            // Backpressure: with every descriptor taken, accept nothing (the kernel's backlog
            // holds new connections) until one frees — at once if a connection not yet routed
            // is there to evict, its oldest. The slot is taken after the accept (an accept loop
            // waiting for a connection holds none); one lost to another loop meanwhile is
            // waited for with the connection in hand.
            if self.slots.available_permits() == 0 {
                self.metrics.accept_waited();
                self.pending.evict_oldest();
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    freed = self.slots.acquire() => drop(freed),
                }
            }
            let (stream, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        // Out of file descriptors and the like: wait instead of spinning.
                        warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let slot = if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
                slot
            } else {
                self.metrics.accept_waited();
                self.pending.evict_oldest();
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    slot = Arc::clone(&self.slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => return,
                    },
                }
            };
            self.metrics.accepted();
            let source = match self.sources.admit(peer.ip()) {
                Ok(a) => a,
                Err(refusal) => {
                    self.metrics.rejected(refusal.reason());
                    reset(&stream);
                    continue;
                }
            };
            let router = Arc::clone(&self);
            let admission = Admission { slot, source };
            tracker.spawn(async move { router.handle(stream, peer, kind, port, admission).await });
        }
    }

    async fn handle(
        &self,
        mut client: TcpStream,
        peer: SocketAddr,
        kind: Kind,
        port: u16,
        mut admission: Admission,
    ) {
        // TCP_NODELAY and keep-alive are inherited from the listening socket (`bind_shared`).
        let _open = self.metrics.open();
        let (slot, _) = self.pending.enter();
        let mut buf = Vec::new();
        let deadline = Instant::now() + self.limits.hello_timeout;
        let chosen = {
            let _pending = self.metrics.pending();
            tokio::select! {
                chosen = tokio::time::timeout_at(deadline, self.choose(&client, &mut buf, kind, port, &slot)) => {
                    chosen.unwrap_or(Err(Refused::Timeout))
                }
                () = slot.evicted() => Err(Refused::Evicted),
            }
        };
        drop(slot);
        admission.source.routed();
        if chosen.is_ok() {
            self.backend_slot(&mut admission).await;
        }
        let (set, skip) = match chosen {
            Ok(c) => c,
            Err(why) => {
                if let Refused::Health = why {
                    self.metrics.health_check();
                } else {
                    self.metrics.rejected(why.reason());
                }
                debug!(%peer, %why, "connection refused");
                if why.answered() {
                    let _ = client.write_all(&UNRECOGNIZED_NAME).await;
                    let _ = client.shutdown().await;
                } else {
                    reset(&client);
                }
                return;
            }
        };
        let mut backend = match self.connect(&set).await {
            Ok(b) => b,
            Err(reason) => {
                self.metrics.rejected(reason);
                debug!(%peer, tenant = set.name, reason, "no backend");
                reset(&client);
                return;
            }
        };
        let tenant = set.metrics(&self.metrics);
        let _guard = tenant.spliced();
        if let Err(error) = backend.write_all(&buf[skip..]).await {
            debug!(%peer, %error, "replaying the ClientHello failed");
            return;
        }
        tenant
            .to_backend()
            .inc_by(u64::try_from(buf.len() - skip).unwrap_or(0));
        drop(buf);
        if let Err(error) = pump::both_ways(
            &client,
            &backend,
            self.limits.timeouts,
            self.limits.transfer,
            tenant.to_backend(),
            tenant.to_client(),
        )
        .await
        {
            self.metrics.closed(error.reason());
            debug!(%peer, %error, tenant = set.name, "splice ended");
            if !matches!(error, PumpError::Io(_)) {
                reset(&client);
                reset(&backend);
            }
        }
    }

    /// Reads the first bytes and picks the backend set; returns it and how many of the bytes
    /// read are a PROXY header (not forwarded).
    async fn choose(
        &self,
        client: &TcpStream,
        buf: &mut Vec<u8>,
        kind: Kind,
        port: u16,
        slot: &PendingSlot,
    ) -> Result<(Arc<BackendSet>, usize), Refused> {
        let max = self.limits.max_hello;
        let mut skip = 0;
        if kind == Kind::Proxy {
            let header = loop {
                match proxy_protocol::parse_with(buf, max, self.limits.proxy_tenant_tlv)? {
                    Proxied::Complete(h) => break h,
                    Proxied::Incomplete { need } => read_more(client, buf, need, max, slot).await?,
                }
            };
            skip = header.len;
            let routes = self.routes.borrow().clone();
            let host = header
                .tenant
                .as_deref()
                .or_else(|| header.destination.and_then(|d| routes.host_for_destination(d)));
            if let Some(host) = host {
                return match routes
                    .is_routed(host)
                    .then(|| routes.for_host_port(Some(host), port))
                {
                    Some(Some(set)) => Ok((set.clone(), skip)),
                    _ => Err(Refused::Unknown(host.to_owned())),
                };
            }
        }
        let sni = loop {
            match hello::parse(&buf[skip..], max)? {
                Hello::Complete { sni } => break sni,
                Hello::Incomplete { need } => read_more(client, buf, skip + need, max, slot).await?,
            }
        };
        if sni.as_deref() == Some(HEALTH_NAME) {
            return Err(Refused::Health);
        }
        let routes = self.routes.borrow().clone();
        match (routes.for_host_port(sni.as_deref(), port), sni) {
            (Some(set), _) => Ok((set.clone(), skip)),
            (None, Some(name)) => Err(Refused::Unknown(name)),
            (None, None) => Err(Refused::NoSni),
        }
    }

    /// The routed connection's second descriptor (its backend's). With every descriptor taken,
    /// the oldest connection not yet routed makes room (it gives its own back when it ends).
    async fn backend_slot(&self, admission: &mut Admission) {
        let more = if let Ok(more) = Arc::clone(&self.slots).try_acquire_owned() {
            more
        } else {
            self.pending.evict_oldest();
            let Ok(more) = Arc::clone(&self.slots).acquire_owned().await else {
                return;
            };
            more
        };
        admission.slot.merge(more);
    }

    /// Connects to the first backend of `set` that accepts; else the reason for the metrics.
    async fn connect(&self, set: &Arc<BackendSet>) -> Result<TcpStream, &'static str> {
        let no_backend = |e: NoBackend| match e {
            NoBackend::Empty => "no_backend",
            NoBackend::NoneHealthy => "no_healthy_backend",
            NoBackend::Busy => "connect_limit",
        };
        let order = set.order(self.health.now_ms()).map_err(no_backend)?;
        let _connecting = set.connecting(self.limits.max_connecting).map_err(no_backend)?;
        for attempt in order {
            let backend = &attempt.backend;
            let tried =
                tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(backend.addr)).await;
            match tried {
                Ok(Ok(stream)) => {
                    if !backend.is_up(self.health.now_ms()) {
                        self.metrics.set_backend_up(&set.name, backend.addr, true);
                    }
                    Health::mark_up(backend);
                    let _ = stream.set_nodelay(true);
                    keepalive(&stream);
                    return Ok(stream);
                }
                Ok(Err(error)) => {
                    debug!(%error, backend = %backend.addr, tenant = set.name, "connect failed");
                }
                Err(_) => debug!(backend = %backend.addr, tenant = set.name, "connect timed out"),
            }
            self.health.mark_down(backend);
            self.metrics.backend_failed(&set.name, backend.addr);
        }
        Err("connect_failed")
    }
}

/// The most connections not yet routed: `max_pending`, and at most `max_connections` — half
/// the descriptors, as each costs one — so that a flood of connections that never send a
/// ClientHello evicts its own oldest before it takes every descriptor (the accept loops would
/// then wait, legitimate clients with them).
pub fn pending_cap(caps: &Caps) -> usize {
    caps.max_pending.min(caps.max_connections).max(1)
}

/// TCP keep-alive probes on `stream` (see [`KEEPALIVE_IDLE`]).
pub fn keepalive_settings() -> socket2::TcpKeepalive {
    socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES)
}

fn keepalive(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive_settings());
}

/// Closes `stream` with a reset when it is dropped (no FIN, no TIME_WAIT kept for it).
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Reads until `buf` holds at least `need` bytes (never more than `max` in all). The buffer
/// grows by what arrived, nothing more; the pending queue counts it.
async fn read_more(
    client: &TcpStream,
    buf: &mut Vec<u8>,
    need: usize,
    max: usize,
    slot: &PendingSlot,
) -> Result<(), Refused> {
    if need > max {
        return Err(Refused::TooMuch(max));
    }
    while buf.len() < need {
        client.readable().await?;
        let room = (max - buf.len()).min(SCRATCH);
        let read = SCRATCH_BUF.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let n = client.try_read(&mut scratch[..room])?;
            buf.reserve_exact(n);
            buf.extend_from_slice(&scratch[..n]);
            Ok::<_, std::io::Error>(n)
        });
        match read {
            Ok(0) => return Err(Refused::Closed),
            Ok(n) => {
                slot.hold(n);
                if slot.is_evicted() {
                    return Err(Refused::Evicted);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
