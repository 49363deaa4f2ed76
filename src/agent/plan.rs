//! What the kernel should hold, and what to change when it does not (pure: no I/O).
//!
//! ```text
//!  --fip (static) ───────────────┐
//!  FIP table (once listed) ──────┼─► wanted() ─► Wanted { fips, held } ─┐
//!  held at start (until listed) ─┘     ▲ held_here(): the FIPs whose     ├─► plan() ─► InSync
//!  this node's addresses ──────────────┘ holder address is one of them   │            └► Replace { families, … }
//!  kernel, read back (netlink) ─► Observed ──────────────────────────────┘
//! ```
//!
//! Every FIP gets a `redirect` in prerouting (packets the cloud routes here); a FIP this node
//! holds also gets a `dnat` to the node's own address in output (the node's own packets for it,
//! which the cloud's router would send back to the node, where they would be dropped).
//!
//! Until the Service watch has listed once, the FIPs the kernel held when the agent started
//! stay, and so do the FIPs it delivered locally: a restart while the API server is unreachable
//! must not drop the traffic of a FIP that is still routed here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use super::nft::{Family, Hook};
use super::table::FipSet;

/// One of baton's chains in one family's table, as read back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Chain {
    #[default]
    Absent,
    /// Type nat, the hook of its name, priority -100, policy accept.
    Ours,
    /// Something else under that name (described).
    Different(String),
}

/// A rule of the output chain as read back: where the node's own packets for a FIP go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// The node's address the FIP's packets are sent to.
    pub to: IpAddr,
    /// The rule's counter: the node's own connections to the FIP delivered there.
    pub connections: u64,
}

/// One family's table as read back from the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    pub prerouting: Chain,
    pub output: Chain,
    /// The FIPs of baton's prerouting rules and their counters (connections redirected).
    pub fips: BTreeMap<IpAddr, u64>,
    /// The FIPs of baton's output rules.
    pub local: BTreeMap<IpAddr, Local>,
    /// Rules that are not baton's (described).
    pub other: Vec<String>,
}

impl TableState {
    /// The chain of `hook`.
    pub fn chain_mut(&mut self, hook: Hook) -> &mut Chain {
        match hook {
            Hook::Prerouting => &mut self.prerouting,
            Hook::Output => &mut self.output,
        }
    }
}

/// The kernel's state: the families whose `baton` table exists.
pub type Observed = BTreeMap<Family, TableState>;

/// What the kernel should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// The FIPs to accept from the network.
    pub fips: BTreeSet<IpAddr>,
    /// The FIPs this node holds → its own address their locally generated packets go to.
    pub held: BTreeMap<IpAddr, IpAddr>,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    InSync,
    /// Replace these families' tables (one transaction).
    Replace {
        families: Vec<Family>,
        added: BTreeSet<IpAddr>,
        removed: BTreeSet<IpAddr>,
        /// FIPs whose own traffic this node starts (or stops) delivering locally, or delivers
        /// to another of its addresses now.
        now_held: BTreeSet<IpAddr>,
        no_longer_held: BTreeSet<IpAddr>,
        /// Why each family is out of date, for the log.
        reasons: Vec<String>,
    },
}

/// What the FIP table says, or (before it was listed) what the kernel held at the start.
pub enum Source<'a> {
    Table(&'a FipSet),
    HeldAtStart(&'a Wanted),
}

/// The FIPs to accept and those to deliver locally: the static ones plus those of the Services
/// once they were listed, or until then the ones the kernel held when the agent started; held
/// are those whose holder (the Services' annotation, or the kernel's output rule at the start)
/// is one of `local`, this node's addresses.
pub fn wanted(static_fips: &BTreeSet<IpAddr>, source: &Source<'_>, local: &BTreeSet<IpAddr>) -> Wanted {
    let (fips, holders) = match source {
        Source::Table(set) => (&set.fips, set.holders.clone()),
        Source::HeldAtStart(held) => (
            &held.fips,
            held.held
                .iter()
                .map(|(fip, to)| (*fip, BTreeSet::from([*to])))
                .collect(),
        ),
    };
    let fips: BTreeSet<IpAddr> = static_fips.iter().chain(fips).copied().collect();
    let held = held_here(&fips, &holders, local);
    Wanted { fips, held }
}

/// The FIPs among `fips` whose holder is this node: one of their holder addresses is one of
/// `local` (the first such, when several are), of the FIP's family.
pub fn held_here(
    fips: &BTreeSet<IpAddr>,
    holders: &BTreeMap<IpAddr, BTreeSet<IpAddr>>,
    local: &BTreeSet<IpAddr>,
) -> BTreeMap<IpAddr, IpAddr> {
    fips.iter()
        .filter_map(|fip| {
            let to = holders
                .get(fip)?
                .iter()
                .find(|a| local.contains(a) && Family::of(**a) == Family::of(*fip))?;
            Some((*fip, *to))
        })
        .collect()
}

/// What the kernel accepts now: baton's rules in chains of baton's.
pub fn accepted(observed: &Observed) -> Wanted {
    let mut out = Wanted::default();
    for t in observed.values() {
        if t.prerouting == Chain::Ours {
            out.fips.extend(t.fips.keys().copied());
        }
        if t.output == Chain::Ours {
            out.held.extend(t.local.iter().map(|(fip, l)| (*fip, l.to)));
        }
    }
    out
}

/// `fip → to` pairs, for messages.
pub struct Pairs<'a>(pub &'a BTreeMap<IpAddr, IpAddr>);

impl fmt::Display for Pairs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (i, (fip, to)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{fip} → {to}")?;
        }
        Ok(())
    }
}

/// The pairs of `a` that `b` does not have, as `fip → to, …`.
fn missing_from(a: &BTreeMap<IpAddr, IpAddr>, b: &BTreeMap<IpAddr, IpAddr>) -> String {
    a.iter()
        .filter(|(fip, to)| b.get(fip) != Some(to))
        .map(|(fip, to)| format!("{fip} → {to}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why `family`'s table differs from `want`, or `None` when it holds exactly that.
fn difference(family: Family, want: &Wanted, observed: &Observed) -> Option<String> {
    let own: BTreeSet<IpAddr> = want
        .fips
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
    for (hook, chain) in [
        (Hook::Prerouting, &state.prerouting),
        (Hook::Output, &state.output),
    ] {
        match chain {
            Chain::Ours => {}
            Chain::Absent => return Some(format!("{table} has no chain {hook}")),
            Chain::Different(what) => return Some(format!("{table}'s chain {hook} is {what}")),
        }
    }
    if !state.other.is_empty() {
        return Some(format!(
            "{table} holds rules of others: {}",
            state.other.join("; ")
        ));
    }
    let have: BTreeSet<IpAddr> = state.fips.keys().copied().collect();
    if have != own {
        let missing: Vec<String> = own.difference(&have).map(ToString::to_string).collect();
        let extra: Vec<String> = have.difference(&own).map(ToString::to_string).collect();
        return Some(format!(
            "{table} lacks [{}] and has [{}] too many",
            missing.join(", "),
            extra.join(", ")
        ));
    }
    let held: BTreeMap<IpAddr, IpAddr> = want
        .held
        .iter()
        .filter(|(fip, _)| Family::of(**fip) == family)
        .map(|(fip, to)| (*fip, *to))
        .collect();
    let have: BTreeMap<IpAddr, IpAddr> = state.local.iter().map(|(fip, l)| (*fip, l.to)).collect();
    (have != held).then(|| {
        format!(
            "{table}'s chain output lacks [{}] and has [{}] too many",
            missing_from(&held, &have),
            missing_from(&have, &held)
        )
    })
}

/// Whether the kernel holds `want`, and if not which tables to replace.
pub fn plan(want: &Wanted, observed: &Observed) -> Plan {
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
    let changed = |a: &BTreeMap<IpAddr, IpAddr>, b: &BTreeMap<IpAddr, IpAddr>| -> BTreeSet<IpAddr> {
        a.iter()
            .filter(|(fip, to)| b.get(fip) != Some(to))
            .map(|(fip, _)| *fip)
            .collect()
    };
    Plan::Replace {
        families,
        added: want.fips.difference(&now.fips).copied().collect(),
        removed: now.fips.difference(&want.fips).copied().collect(),
        now_held: changed(&want.held, &now.held),
        no_longer_held: now
            .held
            .keys()
            .filter(|fip| !want.held.contains_key(fip))
            .copied()
            .collect(),
        reasons,
    }
}

#[cfg(test)]
mod tests;
