//! The I/O shell around the parsers: accept, read the first bytes within the bounds, choose
//! the backend set from the current route table, connect, replay, splice.
//!
//! ```text
//!  accept ─► read ≤ max_hello bytes within hello_timeout ─┬─ SNI listener:   hello::parse
//!                                                         └─ PROXY listener: proxy_protocol::parse,
//!                                                            destination → host, else hello::parse
//!        ─► RouteTable::for_host (the snapshot current now; later reloads do not touch this
//!           connection) ─► BackendSet::order ─► connect (connect_timeout each; next on failure)
//!        ─► write the bytes read (minus a PROXY header) ─► pump::both_ways until both sides end
//!           (a buffer only while bytes flow)
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::hello::{self, Hello, HelloError};
use super::metrics::Metrics;
use super::proxy_protocol::{self, Proxied, ProxyError};
use super::pump;
use super::routes::{BackendSet, Health, RouteTable};

/// A TLS fatal alert `unrecognized_name` (112), sent before closing on an unknown name.
const UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];

/// The bounds every connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes read before a backend is chosen (PROXY header and ClientHello).
    pub max_hello: usize,
    /// The longest time to read them.
    pub hello_timeout: Duration,
    /// The longest time to connect to one backend.
    pub connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_hello: 16 * 1024,
            hello_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Which protocol a listener speaks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TLS: route by the ClientHello's server name.
    Sni,
    /// A PROXY protocol header, then TLS: route by the original destination, else by SNI.
    Proxy,
}

/// Why a connection was closed before it was spliced.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("client closed before a complete ClientHello")]
    Closed,
    #[error("no complete ClientHello within the time limit")]
    Timeout,
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
    #[error("reading from the client: {0}")]
    Io(#[from] std::io::Error),
}

impl Refused {
    fn reason(&self) -> &'static str {
        match self {
            Self::Closed | Self::Io(_) => "closed",
            Self::Timeout => "hello_timeout",
            Self::TooMuch(_) => "too_large",
            Self::Hello(e) => e.category(),
            Self::Proxy(_) => "proxy_header",
            Self::Unknown(_) => "unknown_sni",
            Self::NoSni => "no_sni",
        }
    }
}

/// The router: the current routes, the backends' health, the bounds and the metrics.
#[derive(Debug)]
pub struct Router {
    routes: watch::Receiver<Arc<RouteTable>>,
    health: Arc<Health>,
    limits: Limits,
    metrics: Arc<Metrics>,
}

impl Router {
    pub fn new(
        routes: watch::Receiver<Arc<RouteTable>>,
        health: Arc<Health>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            routes,
            health,
            limits,
            metrics,
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
        loop {
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
            self.metrics.accepted();
            let router = Arc::clone(&self);
            tracker.spawn(async move { router.handle(stream, peer, kind).await });
        }
    }

    async fn handle(&self, mut client: TcpStream, peer: SocketAddr, kind: Kind) {
        // TCP_NODELAY is inherited from the listening socket (`bind_shared`).
        let mut buf = Vec::new();
        let deadline = Instant::now() + self.limits.hello_timeout;
        let chosen = match tokio::time::timeout_at(deadline, self.choose(&mut client, &mut buf, kind)).await {
            Ok(r) => r,
            Err(_) => Err(Refused::Timeout),
        };
        let (set, skip) = match chosen {
            Ok(c) => c,
            Err(why) => {
                self.metrics.rejected(why.reason());
                debug!(%peer, %why, "connection refused");
                if matches!(why, Refused::Unknown(_) | Refused::NoSni) {
                    let _ = client.write_all(&UNRECOGNIZED_NAME).await;
                }
                let _ = client.shutdown().await;
                return;
            }
        };
        let Some(mut backend) = self.connect(&set).await else {
            self.metrics.rejected("no_backend");
            debug!(%peer, tenant = set.name, "no backend accepted");
            return;
        };
        let tenant = set.metrics(&self.metrics);
        let _guard = tenant.spliced();
        if let Err(error) = backend.write_all(&buf[skip..]).await {
            debug!(%peer, %error, "replaying the ClientHello failed");
            return;
        }
        let replayed = u64::try_from(buf.len() - skip).unwrap_or(0);
        drop(buf);
        match pump::both_ways(&mut client, &mut backend).await {
            Ok((to_backend, to_client)) => {
                tenant.bytes(replayed + to_backend, to_client);
            }
            Err(error) => debug!(%peer, %error, tenant = set.name, "splice ended with an error"),
        }
    }

    /// Reads the first bytes and picks the backend set; returns it and how many of the bytes
    /// read are a PROXY header (not forwarded).
    async fn choose(
        &self,
        client: &mut TcpStream,
        buf: &mut Vec<u8>,
        kind: Kind,
    ) -> Result<(Arc<BackendSet>, usize), Refused> {
        let max = self.limits.max_hello;
        let mut skip = 0;
        if kind == Kind::Proxy {
            let header = loop {
                match proxy_protocol::parse(buf, max)? {
                    Proxied::Complete(h) => break h,
                    Proxied::Incomplete { need } => read_more(client, buf, need, max).await?,
                }
            };
            skip = header.len;
            if let Some(dst) = header.destination {
                let routes = self.routes.borrow().clone();
                if let Some(host) = routes.host_for_destination(dst) {
                    return match routes.for_host(Some(host)) {
                        Some(set) => Ok((set.clone(), skip)),
                        None => Err(Refused::Unknown(host.to_owned())),
                    };
                }
            }
        }
        let sni = loop {
            match hello::parse(&buf[skip..], max)? {
                Hello::Complete { sni } => break sni,
                Hello::Incomplete { need } => read_more(client, buf, skip + need, max).await?,
            }
        };
        let routes = self.routes.borrow().clone();
        match (routes.for_host(sni.as_deref()), sni) {
            (Some(set), _) => Ok((set.clone(), skip)),
            (None, Some(name)) => Err(Refused::Unknown(name)),
            (None, None) => Err(Refused::NoSni),
        }
    }

    /// Connects to the first backend of `set` that accepts, in `order`.
    async fn connect(&self, set: &BackendSet) -> Option<TcpStream> {
        for backend in set.order(self.health.now_ms()) {
            let attempt =
                tokio::time::timeout(self.limits.connect_timeout, TcpStream::connect(backend.addr)).await;
            match attempt {
                Ok(Ok(stream)) => {
                    if !backend.is_up(self.health.now_ms()) {
                        self.metrics.set_backend_up(&set.name, backend.addr, true);
                    }
                    Health::mark_up(&backend);
                    let _ = stream.set_nodelay(true);
                    return Some(stream);
                }
                Ok(Err(error)) => {
                    debug!(%error, backend = %backend.addr, tenant = set.name, "connect failed");
                }
                Err(_) => debug!(backend = %backend.addr, tenant = set.name, "connect timed out"),
            }
            self.health.mark_down(&backend);
            self.metrics.backend_failed(&set.name, backend.addr);
        }
        None
    }
}

/// Reads until `buf` holds at least `need` bytes (never more than `max` in all).
async fn read_more(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    need: usize,
    max: usize,
) -> Result<(), Refused> {
    if need > max {
        return Err(Refused::TooMuch(max));
    }
    while buf.len() < need {
        let filled = buf.len();
        // Read what is there (up to the bound), not just the bytes asked for.
        buf.resize(max.min(filled.max(need).max(filled + 2048)), 0);
        let n = match client.read(&mut buf[filled..]).await {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(filled);
                return Err(e.into());
            }
        };
        buf.truncate(filled + n);
        if n == 0 {
            return Err(Refused::Closed);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
