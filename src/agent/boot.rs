//! Cold start: the node accepts its FIPs at boot, before the kubelet, with no API server, and its
//! own API clients (a kubelet whose kubeconfig names the endpoint) reach an API server while the
//! FIP's holder is away.
//!
//! ```text
//!  `baton agent --boot` (systemd/baton-agent-boot.service, Before=kubelet.service)
//!     <state-dir>/agent/fips.json ─► boot_wanted() ─► one nftables transaction:
//!        every FIP: prerouting `redirect` (the cloud still routes the FIP to its last holder)
//!        every FIP: output `dnat to <this node's address>` (the node's own packets: its kubelet
//!                   reaches its own API server through the FIP, wherever the FIP is routed)
//!     ─► <run-dir>/boot.json: the boot deliveries
//!
//!  `baton agent` (the DaemonSet, once the kubelet runs it) reads boot.json and keeps each boot
//!  delivery until resolve() ends it: the FIP table names a holder that is this node (its
//!  ordinary holder rule takes over) or whose API server answers /readyz (the node's own packets
//!  cross the cloud's route again), or the FIP left the table. Then boot.json shrinks; empty, it
//!  is removed: the boot phase is over until the next boot.
//! ```
//!
//! Why it is safe: a boot delivery changes only where this node's **own** packets for the FIP
//! go, to an API server of the same cluster (one etcd), so no client elsewhere sees anything
//! different and nothing is written to the cloud. It lasts only while the FIP's holder does not
//! answer (or the table is unknown): once the holder serves, the node's packets cross the route
//! again, so the controller's probe of the FIP from this node is honest again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use tracing::{info, warn};

use super::nft::Family;
use super::plan::{self, Pairs, Plan, Wanted};
use super::state::{self, BootMarker, NodeFile};
use super::table::FipSet;
use super::{AgentError, Settings, list};

/// What `--boot` makes the kernel hold, and the marker of the boot deliveries: every FIP of the
/// node file and of `--fip`; each delivered (the node's own packets) to the node file's address
/// when that is one of this node's addresses (`local`) and of the FIP's family.
pub fn boot_wanted(
    file: &NodeFile,
    fixed: &BTreeSet<IpAddr>,
    local: &BTreeSet<IpAddr>,
) -> (Wanted, BootMarker) {
    let fips: BTreeSet<IpAddr> = file
        .fips
        .iter()
        .map(|e| e.address)
        .chain(fixed.iter().copied())
        .filter(|ip| super::table::usable(*ip).is_ok())
        .collect();
    let to = file
        .node_address
        .filter(|a| local.contains(a) && super::table::usable(*a).is_ok());
    let delivered: BTreeMap<IpAddr, IpAddr> = to
        .map(|to| {
            fips.iter()
                .filter(|fip| Family::of(**fip) == Family::of(to))
                .map(|fip| (*fip, to))
                .collect()
        })
        .unwrap_or_default();
    (
        Wanted {
            fips,
            held: delivered.clone(),
        },
        BootMarker { delivered },
    )
}

/// Why a boot delivery stays or ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// The FIP table has not been read yet.
    NotListed,
    /// The table names no holder: the FIP is routed nowhere (or to a server the controller did not
    /// name yet).
    NoHolder,
    /// The holders named do not answer `/readyz`.
    HolderSilent(Vec<IpAddr>),
    /// The delivery's address is no longer one of this node's.
    AddressGone(IpAddr),
    /// The FIP is no longer in the table.
    NotInTable,
    /// The table names this node as the holder: its holder rule delivers its packets.
    HeldHere(IpAddr),
    /// The holder answers: the node's packets cross the cloud's route to it again.
    HolderAnswers(IpAddr),
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotListed => f.write_str("the FIP table is not read yet"),
            Self::NoHolder => f.write_str("the FIP table names no holder"),
            Self::HolderSilent(h) => {
                let h: BTreeSet<IpAddr> = h.iter().copied().collect();
                write!(f, "its holder {} does not answer /readyz", list(&h))
            }
            Self::AddressGone(a) => write!(f, "{a} is no longer this node's address"),
            Self::NotInTable => f.write_str("the FIP is no longer in the FIP table"),
            Self::HeldHere(a) => write!(f, "this node ({a}) holds it"),
            Self::HolderAnswers(h) => write!(f, "its holder {h} answers /readyz"),
        }
    }
}

/// Whether a boot delivery stays or ends, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    Keep(Why),
    End(Why),
}

/// The fate of each boot delivery (`delivered`: FIP → this node's address): it ends once the FIP
/// table (`None`: not listed yet) no longer lists the FIP, names this node as its holder, or
/// names a holder that `answers` (its API server's `/readyz`); it ends too when its address is no
/// longer this node's (`local`). Otherwise it stays.
pub fn resolve(
    delivered: &BTreeMap<IpAddr, IpAddr>,
    table: Option<&FipSet>,
    local: &BTreeSet<IpAddr>,
    answers: impl Fn(IpAddr) -> bool,
) -> BTreeMap<IpAddr, Fate> {
    delivered
        .iter()
        .map(|(fip, to)| {
            let fate = if !local.contains(to) {
                Fate::End(Why::AddressGone(*to))
            } else if let Some(table) = table {
                let holders: Vec<IpAddr> = table.holders.get(fip).into_iter().flatten().copied().collect();
                if !table.fips.contains(fip) {
                    Fate::End(Why::NotInTable)
                } else if let Some(here) = holders.iter().find(|h| local.contains(h)) {
                    Fate::End(Why::HeldHere(*here))
                } else if holders.is_empty() {
                    Fate::Keep(Why::NoHolder)
                } else if let Some(up) = holders.iter().find(|h| answers(**h)) {
                    Fate::End(Why::HolderAnswers(*up))
                } else {
                    Fate::Keep(Why::HolderSilent(holders))
                }
            } else {
                Fate::Keep(Why::NotListed)
            };
            (*fip, fate)
        })
        .collect()
}

/// `want` plus the boot deliveries that still stand: a FIP that is wanted and not delivered by a
/// holder rule is delivered to its boot address (when that is still this node's).
pub fn with_boot(mut want: Wanted, delivered: &BTreeMap<IpAddr, IpAddr>, local: &BTreeSet<IpAddr>) -> Wanted {
    for (fip, to) in delivered {
        if want.fips.contains(fip) && !want.held.contains_key(fip) && local.contains(to) {
            want.held.insert(*fip, *to);
        }
    }
    want
}

/// `baton agent --boot`: restores the FIP rules the node file names and records the boot
/// deliveries. Nothing to restore (no node file) is not an error; neither is a kernel that
/// already holds baton's tables (the agent ran since this boot: its rules stand).
pub async fn run(dir: &std::path::Path, settings: &Settings) -> Result<(), AgentError> {
    let file_path = dir.join(state::NODE_FILE);
    let marker_path = settings.run_dir.join(state::BOOT_MARKER);
    let file: NodeFile = match state::load(&file_path)? {
        Some(f) => f,
        None if settings.fips.is_empty() => {
            info!(file = %file_path.display(), "no node file (the agent has not run on this node yet): nothing to restore");
            return Ok(());
        }
        None => NodeFile::default(),
    };
    let observed = super::netlink::run(super::netlink::Socket::read).await?;
    if !observed.is_empty() {
        let kept = plan::accepted(&observed);
        info!(
            fips = %list(&kept.fips),
            held_here = %Pairs(&kept.held),
            "baton's tables are in place already (the agent ran since this boot): nothing to restore"
        );
        return Ok(());
    }
    let local = super::netlink::local_addresses()?;
    let (want, marker) = boot_wanted(&file, &settings.fips, &local);
    if let Some(a) = file.node_address
        && !marker.delivered.values().any(|to| *to == a)
        && !want.fips.is_empty()
    {
        warn!(
            address = %a,
            "the node file's address is not one of this node's now: the node's own packets for its FIPs are not delivered locally"
        );
    }
    if want.fips.is_empty() {
        info!(file = %file_path.display(), "the node file names no FIP: nothing to restore");
        BootMarker::default().store(&marker_path)?;
        return Ok(());
    }
    let Plan::Replace { families, .. } = plan::plan(&want, &observed) else {
        return Ok(());
    };
    super::put(&want, families).await?;
    marker.store(&marker_path)?;
    info!(
        fips = %list(&want.fips),
        delivered_here = %Pairs(&marker.delivered),
        file = %file_path.display(),
        "FIP acceptance restored at boot; the node's own packets for these FIPs go to its own API server until their holder answers"
    );
    Ok(())
}

#[cfg(test)]
mod tests;
