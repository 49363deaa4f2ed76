//! FIP forwarding: while a FIP is targeted to a server, accept TCP on `<fip>:<port>` and splice
//! each connection to `<server primary IP>:<port>`.
//!
//! A retarget only swaps the target address, so new connections go to the new server at once
//! (connections already open stay where they are). Unassigning or deleting the FIP closes its
//! listeners and the connections through them. Binding a FIP address only works where that
//! address is local (the lab); elsewhere a warning is logged and the API keeps working.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, info, info_span, warn};

#[derive(Debug)]
struct Entry {
    target: Arc<RwLock<IpAddr>>,
    cancel: CancellationToken,
}

/// The set of forwarded FIPs.
#[derive(Debug)]
pub(crate) struct Forwarder {
    ports: Vec<u16>,
    shutdown: CancellationToken,
    entries: Mutex<HashMap<IpAddr, Entry>>,
}

impl Forwarder {
    pub(crate) fn new(ports: Vec<u16>, shutdown: CancellationToken) -> Self {
        Self {
            ports,
            shutdown,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Makes the listeners match `desired` (FIP → server primary IP). Binds synchronously, so
    /// when this returns a new FIP already accepts connections.
    pub(crate) fn sync(&self, desired: &BTreeMap<IpAddr, IpAddr>) {
        if self.ports.is_empty() {
            return;
        }
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.retain(|fip, entry| {
            let keep = desired.contains_key(fip);
            if !keep {
                info!(%fip, "FIP unassigned: forwarding stopped");
                entry.cancel.cancel();
            }
            keep
        });
        for (fip, target) in desired {
            if let Some(entry) = entries.get(fip) {
                let mut current = entry
                    .target
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if *current != *target {
                    info!(%fip, from = %*current, to = %target, "FIP retargeted");
                    *current = *target;
                }
                continue;
            }
            let entry = Entry {
                target: Arc::new(RwLock::new(*target)),
                cancel: self.shutdown.child_token(),
            };
            for &port in &self.ports {
                match bind(SocketAddr::new(*fip, port)) {
                    Ok(listener) => {
                        info!(%fip, port, to = %target, "forwarding FIP");
                        tokio::spawn(
                            accept_loop(listener, port, entry.target.clone(), entry.cancel.clone())
                                .instrument(info_span!("fip_forward", %fip, port)),
                        );
                    }
                    Err(error) => warn!(
                        %fip, port, %error,
                        "cannot listen on the FIP address (not inside the lab?); it will not forward"
                    ),
                }
            }
            entries.insert(*fip, entry);
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::bind(addr)?;
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

async fn accept_loop(
    listener: TcpListener,
    port: u16,
    target: Arc<RwLock<IpAddr>>,
    cancel: CancellationToken,
) {
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
        let to = SocketAddr::new(
            *target.read().unwrap_or_else(std::sync::PoisonError::into_inner),
            port,
        );
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = splice(inbound, peer, to) => {}
            }
        });
    }
}

async fn splice(mut inbound: TcpStream, peer: SocketAddr, to: SocketAddr) {
    let outbound = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to)).await;
    let mut outbound = match outbound {
        Ok(Ok(s)) => s,
        Ok(Err(error)) => {
            debug!(%peer, %to, %error, "forward: connect failed");
            return;
        }
        Err(_) => {
            debug!(%peer, %to, "forward: connect timed out");
            return;
        }
    };
    if let Err(error) = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await {
        debug!(%peer, %to, %error, "forward: connection ended with an error");
    }
}
