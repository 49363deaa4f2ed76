//! FIP routing: the simulator plays the cloud's router. While a FIP is targeted to a server, the
//! simulator's network namespace (the lab's hub) holds the route `<fip>/32 via <server primary
//! IP> dev <device>`; packets keep the FIP as their destination, as Cherry Servers delivers them,
//! and the server must accept them itself (baton's node agent does, docs/agent.md).
//!
//! ```text
//!  client ─► hub: 203.0.113.5/32 via 198.51.100.12 dev baton0 ─► node cp-1 (dst 203.0.113.5)
//! ```
//!
//! A retarget is one `ip route replace`: the next packet of every connection goes to the new
//! server, which answers a connection it does not know with RST, the way a real re-routed FIP
//! breaks open connections. Unassigning or deleting the FIP removes the route (packets for it
//! are then unroutable in the hub). The propagation delay is applied by the caller
//! ([`crate::paths`]).
//!
//! Routes are changed with iproute2's `ip` (the simulator routes only inside a lab, where `ip`
//! is installed); a route that cannot be installed (no such device, a gateway that is not on the
//! device's network) is logged and skipped, and tried again at the next change.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use tracing::{info, warn};

use crate::guard::lock;

/// The routes of the targeted FIPs, in the simulator's own network namespace.
#[derive(Debug)]
pub(crate) struct Routes {
    dev: String,
    /// FIP → the gateway its route was installed with.
    installed: Mutex<BTreeMap<IpAddr, IpAddr>>,
}

/// One change to the routing table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteChange {
    /// Install or move the route of a FIP.
    Replace { fip: IpAddr, via: IpAddr },
    /// Remove the route of a FIP.
    Delete { fip: IpAddr },
}

/// What turns `installed` into `desired`: pure, so it is tested without a kernel.
pub(crate) fn changes(
    installed: &BTreeMap<IpAddr, IpAddr>,
    desired: &BTreeMap<IpAddr, IpAddr>,
) -> Vec<RouteChange> {
    let removed = installed
        .keys()
        .filter(|fip| !desired.contains_key(fip))
        .map(|&fip| RouteChange::Delete { fip });
    let moved = desired
        .iter()
        .filter(|(fip, via)| installed.get(fip) != Some(via))
        .map(|(&fip, &via)| RouteChange::Replace { fip, via });
    removed.chain(moved).collect()
}

impl Routes {
    /// Routes FIPs through `dev`. Routes of the FIP range left from an earlier simulator on the
    /// same device are not touched until their FIP changes.
    pub(crate) fn new(dev: impl Into<String>) -> Self {
        Self {
            dev: dev.into(),
            installed: Mutex::new(BTreeMap::new()),
        }
    }

    /// Makes the routing table match `desired` (FIP → the primary IP of its server).
    pub(crate) fn apply(&self, desired: &BTreeMap<IpAddr, IpAddr>) {
        let mut installed = lock(&self.installed);
        for change in changes(&installed, desired) {
            match change {
                RouteChange::Replace { fip, via } => {
                    let from = installed.get(&fip).copied();
                    match Self::ip(&[
                        "route",
                        "replace",
                        &host_route(fip),
                        "via",
                        &via.to_string(),
                        "dev",
                        &self.dev,
                    ]) {
                        Ok(()) => {
                            info!(%fip, to = %via, from = ?from, dev = %self.dev, "FIP routed");
                            installed.insert(fip, via);
                        }
                        Err(error) => {
                            warn!(%fip, to = %via, dev = %self.dev, %error, "cannot route the FIP");
                            // A stale route to the old server must not stay.
                            if installed.remove(&fip).is_some() {
                                let _ = Self::ip(&["route", "del", &host_route(fip), "dev", &self.dev]);
                            }
                        }
                    }
                }
                RouteChange::Delete { fip } => {
                    if let Err(error) = Self::ip(&["route", "del", &host_route(fip), "dev", &self.dev]) {
                        warn!(%fip, dev = %self.dev, %error, "cannot remove the FIP's route");
                    } else {
                        info!(%fip, "FIP unrouted");
                    }
                    installed.remove(&fip);
                }
            }
        }
    }

    /// Removes every route this simulator installed (on shutdown).
    pub(crate) fn clear(&self) {
        self.apply(&BTreeMap::new());
    }

    fn ip(args: &[&str]) -> Result<(), String> {
        let family = if args.iter().any(|a| a.contains(':')) {
            "-6"
        } else {
            "-4"
        };
        let out = Command::new("ip")
            .arg(family)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running ip (iproute2): {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }
}

fn host_route(fip: IpAddr) -> String {
    match fip {
        IpAddr::V4(_) => format!("{fip}/32"),
        IpAddr::V6(_) => format!("{fip}/128"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn changes_install_move_and_remove() {
        let installed = BTreeMap::from([
            (ip("203.0.113.1"), ip("198.51.100.11")),
            (ip("203.0.113.2"), ip("198.51.100.12")),
            (ip("203.0.113.3"), ip("198.51.100.13")),
        ]);
        let desired = BTreeMap::from([
            (ip("203.0.113.1"), ip("198.51.100.11")), // unchanged: nothing to do
            (ip("203.0.113.2"), ip("198.51.100.13")), // moved
            (ip("203.0.113.4"), ip("198.51.100.11")), // new
        ]);
        assert_eq!(
            changes(&installed, &desired),
            vec![
                RouteChange::Delete {
                    fip: ip("203.0.113.3")
                },
                RouteChange::Replace {
                    fip: ip("203.0.113.2"),
                    via: ip("198.51.100.13")
                },
                RouteChange::Replace {
                    fip: ip("203.0.113.4"),
                    via: ip("198.51.100.11")
                },
            ]
        );
        assert!(changes(&desired, &desired).is_empty());
    }
}
