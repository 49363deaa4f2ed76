//! The embedded authoritative server.
//!
//! ```text
//!   RecordStore ──watch──▶ Shared::compiled_for(snapshot) ──▶ Arc<Compiled> (cached per generation)
//!                                   │                                   │
//!        UDP: N blocking worker threads per address            TCP: hickory `Server` + our
//!        (recv → Compiled::respond_udp → send; no               `RequestHandler`, one per address,
//!        task, lock or allocation per query)                    supervised and restarted if it stops
//! ```
//!
//! UDP is where the load is, so it bypasses hickory's per-datagram task and answers from
//! precomputed packets (see `answer`); TCP uses hickory-server's listener and connection
//! handling with the same answering code. Neither logs per query.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use hickory_proto::op::{Header, HeaderCounts, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::answer::{Compiled, ZoneSettings};
use crate::model::{RecordStore, Snapshot};
use crate::{DnsError, DnsName};

/// How often a blocked UDP worker wakes up to check for shutdown.
const UDP_WAKEUP: Duration = Duration::from_millis(100);
/// Pause before re-binding a TCP listener that stopped.
const TCP_RESTART_DELAY: Duration = Duration::from_millis(200);

/// Settings of the embedded server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The zone served, e.g. `c1.example.com`.
    pub zone: DnsName,
    /// Addresses to listen on, UDP and TCP each. Port 0 picks a free port (the same one for UDP
    /// and TCP).
    pub listen: Vec<SocketAddr>,
    /// TTL of every record, and the SOA minimum (negative-caching TTL).
    pub ttl: u32,
    /// Threads answering UDP per listen address. 0 means one per CPU.
    pub udp_workers: usize,
    /// A TCP connection idle for this long is closed.
    pub tcp_idle_timeout: Duration,
    /// The name of the apex NS record / SOA MNAME; `ns1.<zone>` by default. If it lies in the
    /// zone and has no addresses in the store, the specific (non-wildcard) listen addresses are
    /// served as its glue.
    pub ns_name: Option<DnsName>,
}

impl ServerConfig {
    /// A configuration with the defaults: TTL 30 s, one UDP worker per CPU, 5 s TCP idle timeout.
    pub fn new(zone: DnsName, listen: Vec<SocketAddr>) -> Self {
        Self {
            zone,
            listen,
            ttl: 30,
            udp_workers: 0,
            tcp_idle_timeout: Duration::from_secs(5),
            ns_name: None,
        }
    }
}

/// State shared by every listener: the settings, the store and the compiled zone.
#[derive(Debug)]
struct Shared {
    settings: ZoneSettings,
    store: RecordStore,
    cache: Mutex<Arc<Compiled>>,
}

impl Shared {
    /// The compiled zone for `snapshot`, compiling it once per generation.
    fn compiled_for(&self, snapshot: &Snapshot) -> Arc<Compiled> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.generation != snapshot.generation {
            match Compiled::compile(&self.settings, snapshot) {
                Ok(compiled) => *cache = Arc::new(compiled),
                Err(error) => {
                    error!(%error, generation = snapshot.generation, "cannot compile the DNS zone; serving the previous records");
                }
            }
        }
        cache.clone()
    }

    fn current(&self) -> Arc<Compiled> {
        self.compiled_for(&self.store.snapshot())
    }
}

/// The embedded authoritative DNS server.
#[derive(Debug)]
pub struct DnsServer;

impl DnsServer {
    /// Serves `store`'s records for `config.zone` until `shutdown` completes, then stops the
    /// server and waits for it (`baton dns serve` passes its signal handler).
    pub async fn serve(
        config: ServerConfig,
        store: RecordStore,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DnsError> {
        let server = Self::start(config, store, &CancellationToken::new()).await?;
        shutdown.await;
        server.shutdown().await;
        Ok(())
    }

    /// Binds every listen address (UDP and TCP) and starts serving `store`'s records for
    /// `config.zone`. Runs until `shutdown` is cancelled or [`DnsServerHandle::shutdown`].
    pub async fn start(
        config: ServerConfig,
        store: RecordStore,
        shutdown: &CancellationToken,
    ) -> Result<DnsServerHandle, DnsError> {
        if config.listen.is_empty() {
            return Err(DnsError::Config("at least one listen address is required".into()));
        }
        let ns_name = match config.ns_name.clone() {
            Some(name) => name,
            None => DnsName::relative_to("ns1", &config.zone)?,
        };
        let ns_addresses = config
            .listen
            .iter()
            .map(SocketAddr::ip)
            .filter(|ip| !ip.is_unspecified())
            .collect::<Vec<_>>();
        let serial_base = u32::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                % u64::from(u32::MAX),
        )
        .unwrap_or(1);
        let settings = ZoneSettings {
            origin: config.zone.clone(),
            ttl: config.ttl,
            ns_name,
            ns_addresses,
            serial_base,
        };
        let initial = Compiled::compile(&settings, &store.snapshot())?;
        let shared = Arc::new(Shared {
            settings,
            store,
            cache: Mutex::new(Arc::new(initial)),
        });

        let token = shutdown.child_token();
        let workers = if config.udp_workers == 0 {
            thread::available_parallelism().map_or(1, std::num::NonZero::get)
        } else {
            config.udp_workers
        };
        let mut handle = DnsServerHandle {
            udp_addrs: Vec::new(),
            tcp_addrs: Vec::new(),
            token: token.clone(),
            threads: Vec::new(),
            tasks: Vec::new(),
        };
        for addr in &config.listen {
            let (udp, tcp) = bind_pair(*addr)
                .await
                .map_err(|source| DnsError::Bind { addr: *addr, source })?;
            let udp_addr = udp
                .local_addr()
                .map_err(|source| DnsError::Bind { addr: *addr, source })?;
            let tcp_addr = tcp
                .local_addr()
                .map_err(|source| DnsError::Bind { addr: *addr, source })?;
            udp.set_read_timeout(Some(UDP_WAKEUP))
                .map_err(|source| DnsError::Bind { addr: *addr, source })?;
            for i in 0..workers {
                let socket = udp
                    .try_clone()
                    .map_err(|source| DnsError::Bind { addr: *addr, source })?;
                let (shared, token) = (shared.clone(), token.clone());
                let thread = thread::Builder::new()
                    .name(format!("dns-udp-{i}"))
                    .spawn(move || udp_worker(&socket, &shared, &token))
                    .map_err(|source| DnsError::Bind { addr: *addr, source })?;
                handle.threads.push(thread);
            }
            let handler = Handler {
                shared: shared.clone(),
            };
            let span = info_span!("dns-tcp", addr = %tcp_addr);
            handle.tasks.push(tokio::spawn(
                supervise_tcp(tcp, tcp_addr, handler, config.tcp_idle_timeout, token.clone())
                    .instrument(span),
            ));
            handle.udp_addrs.push(udp_addr);
            handle.tcp_addrs.push(tcp_addr);
        }
        info!(
            zone = %config.zone, udp = ?handle.udp_addrs, tcp = ?handle.tcp_addrs, udp_workers = workers,
            ttl = config.ttl, "DNS server listening"
        );
        Ok(handle)
    }
}

/// Binds UDP and TCP on the same address; with port 0, on the same (free) port.
async fn bind_pair(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind(addr)?;
        let bound = udp.local_addr()?;
        match TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free port")))
}

/// A running server.
#[derive(Debug)]
pub struct DnsServerHandle {
    udp_addrs: Vec<SocketAddr>,
    tcp_addrs: Vec<SocketAddr>,
    token: CancellationToken,
    threads: Vec<thread::JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl DnsServerHandle {
    /// The bound UDP addresses, in `listen` order.
    pub fn udp_addrs(&self) -> &[SocketAddr] {
        &self.udp_addrs
    }

    /// The bound TCP addresses, in `listen` order.
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp_addrs
    }

    /// The token that stops this server (a child of the one given to `start`).
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits until the server has stopped (after its token is cancelled).
    pub async fn wait(self) {
        for task in self.tasks {
            if let Err(error) = task.await {
                warn!(%error, "DNS TCP task ended abnormally");
            }
        }
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                if thread.join().is_err() {
                    warn!("a DNS UDP worker panicked");
                }
            }
        })
        .await;
        if let Err(error) = joined {
            warn!(%error, "joining DNS UDP workers failed");
        }
        debug!("DNS server stopped");
    }

    /// Stops the server and waits for it: listeners close, in-flight TCP answers finish.
    pub async fn shutdown(self) {
        self.token.cancel();
        self.wait().await;
    }
}

fn udp_worker(socket: &UdpSocket, shared: &Shared, token: &CancellationToken) {
    let mut updates = shared.store.subscribe();
    let mut compiled = shared.compiled_for(&updates.borrow_and_update());
    let mut buf = vec![0_u8; 65_535];
    let mut out = Vec::with_capacity(4096);
    while !token.is_cancelled() {
        let (len, src) = match socket.recv_from(&mut buf) {
            Ok(received) => received,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(error) => {
                debug!(%error, "UDP receive failed");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Replies to port 0 (or a broadcast source) would be reflection fodder: drop them.
        if src.port() == 0 || src.ip().is_unspecified() {
            continue;
        }
        if updates.has_changed().unwrap_or(false) {
            compiled = shared.compiled_for(&updates.borrow_and_update());
        }
        if compiled.respond_udp(&buf[..len], &mut out)
            && let Err(error) = socket.send_to(&out, src)
        {
            debug!(%error, "UDP send failed");
        }
    }
}

/// Serves TCP on `listener` through hickory's `Server`, and starts a fresh listener on the same
/// address whenever it stops (hickory 0.26.3 ends the accept loop on `ECONNABORTED`, #3725).
async fn supervise_tcp(
    listener: TcpListener,
    addr: SocketAddr,
    handler: Handler,
    idle_timeout: Duration,
    token: CancellationToken,
) {
    let mut listener = Some(listener);
    loop {
        let current = match listener.take() {
            Some(l) => l,
            None => match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(error) => {
                    warn!(%error, "cannot re-bind the DNS TCP listener; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(TCP_RESTART_DELAY) => continue,
                        () = token.cancelled() => return,
                    }
                }
            },
        };
        let mut server = Server::new(handler.clone());
        server.register_listener(current, idle_timeout, 16);
        let stop = server.shutdown_token().clone();
        let ended = tokio::select! {
            result = server.block_until_done() => Some(result),
            () = token.cancelled() => None,
        };
        match ended {
            None => {
                stop.cancel();
                if let Err(error) = server.block_until_done().await {
                    debug!(%error, "DNS TCP listener stopped with an error");
                }
                return;
            }
            Some(result) => {
                warn!(result = ?result.err(), "DNS TCP listener stopped; restarting it");
                tokio::select! {
                    () = tokio::time::sleep(TCP_RESTART_DELAY) => {}
                    () = token.cancelled() => return,
                }
            }
        }
    }
}

/// hickory `RequestHandler` for TCP: the same reference answering as UDP's slow path.
#[derive(Debug, Clone)]
struct Handler {
    shared: Arc<Shared>,
}

fn servfail(id: u16) -> ResponseInfo {
    let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
    metadata.response_code = ResponseCode::ServFail;
    Header {
        metadata,
        counts: HeaderCounts::default(),
    }
    .into()
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let id = request.metadata.id;
        let compiled = self.shared.current();
        let Some(response) = Message::from_vec(request.as_slice())
            .ok()
            .and_then(|m| compiled.answer(&m))
        else {
            return servfail(id);
        };
        let builder = MessageResponseBuilder::new(&request.queries, response.edns.as_ref());
        let message = builder.build(
            response.metadata,
            response.answers.iter(),
            response.authorities.iter(),
            std::iter::empty(),
            response.additionals.iter(),
        );
        match response_handle.send_response(message).await {
            Ok(info) => info,
            Err(error) => {
                debug!(%error, "sending a TCP DNS response failed");
                servfail(id)
            }
        }
    }
}

#[cfg(test)]
mod tests;
