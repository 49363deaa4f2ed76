//! What the kernel should hold, and what to change when it does not (pure: no I/O).
//!
//! ```text
//!  --fip (static) ───────────────┐
//!  Services (once listed) ───────┼─► wanted() ─► FIPs ─┐
//!  held at start (until listed) ─┘                     ├─► plan() ─► InSync
//!  kernel, read back (netlink) ─► Observed ────────────┘          └► Replace { families, added, removed, reasons }
//! ```
//!
//! Until the Service watch has listed once, the FIPs the kernel held when the agent started
//! stay: a restart while the API server is unreachable must not drop the traffic of a FIP that
//! is still routed here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::nft::Family;

/// baton's chain in one family's table, as read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Chain {
    #[default]
    Absent,
    /// Type nat, hook prerouting, priority -100, policy accept.
    Ours,
    /// Something else under that name (described).
    Different(String),
}

/// One family's table as read back from the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    pub chain: Chain,
    /// The FIPs of baton's rules and their counters (connections redirected).
    pub fips: BTreeMap<IpAddr, u64>,
    /// Rules that are not baton's (described).
    pub other: Vec<String>,
}

/// The kernel's state: the families whose `baton` table exists.
pub type Observed = BTreeMap<Family, TableState>;

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    InSync,
    /// Replace these families' tables (one transaction).
    Replace {
        families: Vec<Family>,
        added: BTreeSet<IpAddr>,
        removed: BTreeSet<IpAddr>,
        /// Why each family is out of date, for the log.
        reasons: Vec<String>,
    },
}

/// The FIPs to accept: the static ones, plus those of the Services once they were listed
/// (`None` before), or until then the ones the kernel held when the agent started.
pub fn wanted(
    static_fips: &BTreeSet<IpAddr>,
    from_services: Option<&BTreeSet<IpAddr>>,
    held_at_start: &BTreeSet<IpAddr>,
) -> BTreeSet<IpAddr> {
    static_fips
        .iter()
        .chain(from_services.unwrap_or(held_at_start))
        .copied()
        .collect()
}

/// The FIPs the kernel accepts now: baton's rules in a chain of baton's.
pub fn accepted(observed: &Observed) -> BTreeSet<IpAddr> {
    observed
        .values()
        .filter(|t| t.chain == Chain::Ours)
        .flat_map(|t| t.fips.keys().copied())
        .collect()
}

/// Why `family`'s table differs from `want`, or `None` when it holds exactly that.
fn difference(family: Family, want: &BTreeSet<IpAddr>, observed: &Observed) -> Option<String> {
    let own: BTreeSet<IpAddr> = want
        .iter()
        .copied()
        .filter(|ip| Family::of(*ip) == family)
        .collect();
    let table = format!("table {family} baton");
    let Some(state) = observed.get(&family) else {
        return (!own.is_empty()).then(|| format!("{table} is missing"));
    };
    if own.is_empty() {
        return Some(format!("{table} exists but no {family} FIP is wanted"));
    }
    match &state.chain {
        Chain::Ours => {}
        Chain::Absent => return Some(format!("{table} has no chain prerouting")),
        Chain::Different(what) => return Some(format!("{table}'s chain prerouting is {what}")),
    }
    if !state.other.is_empty() {
        return Some(format!(
            "{table} holds rules of others: {}",
            state.other.join("; ")
        ));
    }
    let have: BTreeSet<IpAddr> = state.fips.keys().copied().collect();
    (have != own).then(|| {
        let missing: Vec<String> = own.difference(&have).map(ToString::to_string).collect();
        let extra: Vec<String> = have.difference(&own).map(ToString::to_string).collect();
        format!(
            "{table} lacks [{}] and has [{}] too many",
            missing.join(", "),
            extra.join(", ")
        )
    })
}

/// Whether the kernel holds `want`, and if not which tables to replace.
pub fn plan(want: &BTreeSet<IpAddr>, observed: &Observed) -> Plan {
    let mut families = Vec::new();
    let mut reasons = Vec::new();
    for family in Family::ALL {
        if let Some(why) = difference(family, want, observed) {
            families.push(family);
            reasons.push(why);
        }
    }
    if families.is_empty() {
        return Plan::InSync;
    }
    let now = accepted(observed);
    Plan::Replace {
        families,
        added: want.difference(&now).copied().collect(),
        removed: now.difference(want).copied().collect(),
        reasons,
    }
}

#[cfg(test)]
mod tests;
