//! FIP splicing (an explicit opt-in, `forward_ports`, for tests that run without lab nodes):
//! while a FIP is targeted to a server, accept TCP on `<fip>:<port>` and splice each connection
//! to `<server primary IP>:<port>`. The server sees connections to its own address, a path no
//! real node has: tests with lab nodes route the FIP instead ([`crate::route`]).
//!
//! A retarget swaps the route: new connections go to the new server, and every connection still
//! forwarded to the old server is reset (RST on both sides, `SO_LINGER` 0), the way the new
//! holder answers packets of a connection it does not know. Connections to a server that keeps
//! the FIP are untouched. Unassigning or deleting the FIP closes its listeners and resets its
//! connections.
//!
//! A propagation delay (`Faults::retarget_delay_ms`) is applied by the caller ([`crate::paths`]):
//! until the change takes effect new connections follow the old route (refused when the FIP had
//! none), and the resets happen when the route switches.
//!
//! Binding a FIP address only works where that address is local (the lab); elsewhere a warning is
//! logged and the API keeps working.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One forwarded connection.
#[derive(Debug)]
struct Conn {
    /// The server it is spliced to.
    to: IpAddr,
    /// Cancelled to reset it.
    reset: CancellationToken,
}

/// Where a FIP leads now, and the connections forwarded through it.
#[derive(Debug)]
struct Route {
    target: IpAddr,
    conns: HashMap<u64, Conn>,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    route: Arc<Mutex<Route>>,
    /// Stops the listeners; the connections' reset tokens are its children.
    cancel: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<IpAddr, Entry>,
}

#[derive(Debug)]
struct Inner {
    ports: Vec<u16>,
    shutdown: CancellationToken,
    state: Mutex<State>,
}

/// The set of forwarded FIPs.
#[derive(Debug, Clone)]
pub(crate) struct Forwarder {
    inner: Arc<Inner>,
}

impl Forwarder {
    pub(crate) fn new(ports: Vec<u16>, shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(Inner {
                ports,
                shutdown,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Makes the listeners match `desired` (FIP → server primary IP) now: when this returns a
    /// new FIP already accepts connections.
    pub(crate) fn apply(&self, desired: &BTreeMap<IpAddr, IpAddr>) {
        if !self.inner.ports.is_empty() {
            self.inner.apply(desired);
        }
    }
}

impl Inner {
    fn apply(&self, desired: &BTreeMap<IpAddr, IpAddr>) {
        let mut state = lock(&self.state);
        state.entries.retain(|fip, entry| {
            let keep = desired.contains_key(fip);
            if !keep {
                let conns = lock(&entry.route).conns.len();
                info!(%fip, reset = conns, "FIP unassigned: forwarding stopped, connections reset");
                entry.cancel.cancel();
            }
            keep
        });
        for (fip, target) in desired {
            if let Some(entry) = state.entries.get(fip) {
                let mut route = lock(&entry.route);
                if route.target != *target {
                    let from = route.target;
                    route.target = *target;
                    let moved_away: Vec<u64> = route
                        .conns
                        .iter()
                        .filter(|(_, c)| c.to != *target)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in &moved_away {
                        if let Some(conn) = route.conns.remove(id) {
                            conn.reset.cancel();
                        }
                    }
                    info!(%fip, %from, to = %target, reset = moved_away.len(), "FIP retargeted");
                }
                continue;
            }
            let entry = Entry {
                route: Arc::new(Mutex::new(Route {
                    target: *target,
                    conns: HashMap::new(),
                    next_id: 0,
                })),
                cancel: self.shutdown.child_token(),
            };
            for &port in &self.ports {
                match bind(SocketAddr::new(*fip, port)) {
                    Ok(listener) => {
                        info!(%fip, port, to = %target, "forwarding FIP");
                        tokio::spawn(
                            accept_loop(listener, port, entry.route.clone(), entry.cancel.clone())
                                .instrument(info_span!("fip_forward", %fip, port)),
                        );
                    }
                    Err(error) => warn!(
                        %fip, port, %error,
                        "cannot listen on the FIP address (not inside the lab?); it will not forward"
                    ),
                }
            }
            state.entries.insert(*fip, entry);
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::bind(addr)?;
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

/// Removes a connection from its route when it ends.
struct Registered {
    route: Arc<Mutex<Route>>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.route).conns.remove(&self.id);
    }
}

async fn accept_loop(listener: TcpListener, port: u16, route: Arc<Mutex<Route>>, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (inbound, peer) = match accepted {
            Ok(conn) => conn,
            Err(error) => {
                debug!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Read the target and register under one lock, so a retarget either sees this
        // connection (and resets it) or happened before it (and it goes to the new server).
        let (to, reset, registered) = {
            let mut r = lock(&route);
            let id = r.next_id;
            r.next_id += 1;
            let to = r.target;
            let reset = cancel.child_token();
            r.conns.insert(
                id,
                Conn {
                    to,
                    reset: reset.clone(),
                },
            );
            let registered = Registered {
                route: route.clone(),
                id,
            };
            (to, reset, registered)
        };
        tokio::spawn(async move {
            splice(inbound, peer, SocketAddr::new(to, port), reset).await;
            drop(registered);
        });
    }
}

/// Closes with RST instead of FIN.
fn abort(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn splice(mut inbound: TcpStream, peer: SocketAddr, to: SocketAddr, reset: CancellationToken) {
    let outbound = tokio::select! {
        () = reset.cancelled() => {
            abort(inbound);
            return;
        }
        outbound = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to)) => outbound,
    };
    let mut outbound = match outbound {
        Ok(Ok(s)) => s,
        Ok(Err(error)) => {
            // The server refused: the client is reset, as by the server itself.
            debug!(%peer, %to, %error, "forward: connect failed");
            abort(inbound);
            return;
        }
        Err(_) => {
            debug!(%peer, %to, "forward: connect timed out");
            abort(inbound);
            return;
        }
    };
    let reset_both = tokio::select! {
        () = reset.cancelled() => {
            debug!(%peer, %to, "forward: connection reset (FIP moved away or unassigned)");
            true
        }
        copied = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => match copied {
            Ok(_) => false,
            Err(error) => {
                // One side was reset (or failed): pass the reset on to the other.
                debug!(%peer, %to, %error, "forward: connection ended with an error");
                true
            }
        },
    };
    if reset_both {
        abort(inbound);
        abort(outbound);
    }
}
