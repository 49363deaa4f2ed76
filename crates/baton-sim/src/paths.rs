//! How a targeted FIP's traffic reaches its server, and when a change takes effect.
//!
//! ```text
//!  write committed ─► FipPaths::sync(FIP → server primary IP, delay)
//!                        │ after the propagation delay, in the order the writes happened
//!                        ├─► Routes: `<fip>/32 via <primary>` in the hub (the cloud's routing)
//!                        └─► Forwarder: TCP splice on <fip>:<port> (opt-in, labs without nodes)
//! ```
//!
//! Each map is numbered when it is received; with a propagation delay
//! (`Faults::retarget_delay_ms`) it takes effect after the delay, and a map overtaken by a later
//! one that already took effect is skipped. Without a delay it takes effect before `sync`
//! returns, so a FIP answers as soon as the API call that routed it has answered.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::forward::Forwarder;
use crate::guard::lock;
use crate::route::Routes;

#[derive(Debug, Default)]
struct Seq {
    /// Sequence number of the last map applied.
    applied: u64,
    /// Sequence number given to the last map received.
    scheduled: u64,
}

#[derive(Debug)]
struct Inner {
    forwarder: Forwarder,
    routes: Option<Routes>,
    seq: Mutex<Seq>,
    shutdown: CancellationToken,
}

/// The paths of every targeted FIP.
#[derive(Debug, Clone)]
pub(crate) struct FipPaths {
    inner: Arc<Inner>,
}

impl FipPaths {
    /// Splices `forward_ports` (none: no splice) and routes through `route_dev` (none: no
    /// routes).
    pub(crate) fn new(
        forward_ports: Vec<u16>,
        route_dev: Option<String>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                forwarder: Forwarder::new(forward_ports, shutdown.clone()),
                routes: route_dev.map(Routes::new),
                seq: Mutex::new(Seq::default()),
                shutdown,
            }),
        }
    }

    /// Makes the paths match `desired` (FIP → server primary IP) after `delay`.
    pub(crate) fn sync(&self, desired: &BTreeMap<IpAddr, IpAddr>, delay: Duration) {
        let seq = {
            let mut s = lock(&self.inner.seq);
            s.scheduled += 1;
            s.scheduled
        };
        if delay.is_zero() {
            self.inner.apply(seq, desired);
            return;
        }
        debug!(?delay, "FIP paths change after the propagation delay");
        let inner = self.inner.clone();
        let desired = desired.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = inner.shutdown.cancelled() => {}
                () = tokio::time::sleep(delay) => inner.apply(seq, &desired),
            }
        });
    }

    /// Removes the routes this simulator installed (the splice's listeners stop with the
    /// shutdown token).
    pub(crate) fn clear_routes(&self) {
        if let Some(routes) = &self.inner.routes {
            routes.clear();
        }
    }
}

impl Inner {
    fn apply(&self, seq: u64, desired: &BTreeMap<IpAddr, IpAddr>) {
        // The sequence lock is held while applying, so two maps never interleave.
        let mut s = lock(&self.seq);
        if seq <= s.applied {
            debug!(seq, applied = s.applied, "FIP paths overtaken by a later change");
            return;
        }
        s.applied = seq;
        if let Some(routes) = &self.routes {
            routes.apply(desired);
        }
        self.forwarder.apply(desired);
    }
}
