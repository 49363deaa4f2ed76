//! Which Floating IPs a control-plane node accepts, read from the controller's FIP table (pure:
//! no I/O).
//!
//! ```text
//!  ConfigMap <prefix>-control-plane-fips (the controller's namespace), key fips.json,
//!  written only by the controller's leader (RBAC: only baton's ServiceAccount may)
//!     {"fips": [{"address": FIP, "holder": primary address of the server it is routed to}, …]}
//!        ─► each address: parsed, and one a packet from the cloud can carry as destination
//!        ─► FipSet { fips, holders, problems }   (a bad row is a problem, named, and skipped)
//! ```
//!
//! The table holds only the FIPs the controller validated: this cluster's, of control-plane
//! endpoint Services in allowed namespaces (docs/controller.md). No Service, annotation or
//! other object a tenant writes reaches the agent: a Service naming any address changes no
//! node's NAT.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::names::{FIP_TABLE_KEY, FipTable};

/// The control-plane FIPs, who holds them, and what was wrong with the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FipSet {
    pub fips: BTreeSet<IpAddr>,
    /// FIP → the address of the server the cloud routes it to. Only addresses of the FIP's
    /// own family: the node's packets to an IPv6 FIP cannot be delivered to an IPv4 address.
    pub holders: BTreeMap<IpAddr, BTreeSet<IpAddr>>,
    pub problems: Vec<Problem>,
}

/// A row of the FIP table that cannot be accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("the FIP table has no key {FIP_TABLE_KEY}")]
    NoTable,
    #[error("the FIP table's {FIP_TABLE_KEY} is not valid: {0}")]
    NotATable(String),
    #[error("FIP table: address {value} cannot be a Floating IP ({why})")]
    Unusable { value: IpAddr, why: &'static str },
    #[error("FIP table: the holder {value} of {fip} cannot be a server's address ({why})")]
    UnusableHolder {
        fip: IpAddr,
        value: IpAddr,
        why: &'static str,
    },
}

/// The FIPs and holders of the table text `data` (the ConfigMap's [`FIP_TABLE_KEY`]; `None`:
/// the key is missing). A table that does not parse gives no FIP and a problem.
pub fn fip_set(data: Option<&str>) -> FipSet {
    let mut out = FipSet::default();
    let Some(text) = data else {
        out.problems.push(Problem::NoTable);
        return out;
    };
    let table: FipTable = match serde_json::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            out.problems.push(Problem::NotATable(e.to_string()));
            return out;
        }
    };
    for row in table.fips {
        if let Err(why) = usable(row.address) {
            out.problems.push(Problem::Unusable {
                value: row.address,
                why,
            });
            continue;
        }
        out.fips.insert(row.address);
        let Some(holder) = row.holder else { continue };
        match usable(holder) {
            Err(why) => out.problems.push(Problem::UnusableHolder {
                fip: row.address,
                value: holder,
                why,
            }),
            Ok(h) if h.is_ipv4() == row.address.is_ipv4() => {
                out.holders.entry(row.address).or_default().insert(h);
            }
            Ok(_) => {}
        }
    }
    out
}

/// Whether `ip` can be a Floating IP; the reason when it cannot.
pub fn usable(ip: IpAddr) -> Result<IpAddr, &'static str> {
    let why = if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_multicast() {
        "multicast"
    } else if matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) {
        "broadcast"
    } else {
        return Ok(ip);
    };
    Err(why)
}

#[cfg(test)]
mod tests;
