//! The record model: per name, a set of A/AAAA addresses, each with a health flag.
//!
//! ```text
//!  bootstrap phase ──set_name / set_health / remove_address──▶ RecordStore
//!                                                                  │ watch::Sender<Arc<Snapshot>>
//!                      ┌───────────────────────────────────────────┴──────────────┐
//!                      ▼                                                          ▼
//!             embedded server (compiles answers)                   RFC 2136 publisher (push)
//! ```
//!
//! Every change replaces the whole published [`Snapshot`] at once (one `watch` send), so a
//! reader never sees half of a change: changes are atomic per name (and per call).
//! The model knows nothing about hickory; the wire side lives in `answer`/`server`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use tokio::sync::watch;

use crate::DnsName;

/// One address of a name, with its health flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// The address; IPv4 gives an A record, IPv6 an AAAA record.
    pub ip: IpAddr,
    /// Whether the address currently serves (for example, answers `/readyz`).
    pub healthy: bool,
}

/// The addresses of one name, in insertion order, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameRecords {
    addresses: Vec<Address>,
}

impl NameRecords {
    /// Builds the set from `(ip, healthy)` pairs; a repeated IP keeps its first position and
    /// its last health flag.
    pub fn new(addresses: impl IntoIterator<Item = (IpAddr, bool)>) -> Self {
        let mut out: Vec<Address> = Vec::new();
        for (ip, healthy) in addresses {
            if let Some(existing) = out.iter_mut().find(|a| a.ip == ip) {
                existing.healthy = healthy;
            } else {
                out.push(Address { ip, healthy });
            }
        }
        Self { addresses: out }
    }

    /// All addresses with their health flags.
    pub fn addresses(&self) -> &[Address] {
        &self.addresses
    }

    /// The addresses to serve: the healthy ones, or all of them if none is healthy (serving
    /// something beats serving nothing when every health check fails, e.g. a probe outage).
    pub fn served(&self) -> Vec<IpAddr> {
        let healthy: Vec<IpAddr> = self
            .addresses
            .iter()
            .filter(|a| a.healthy)
            .map(|a| a.ip)
            .collect();
        if healthy.is_empty() {
            self.addresses.iter().map(|a| a.ip).collect()
        } else {
            healthy
        }
    }

    /// The served IPv4 addresses (A records).
    pub fn served_v4(&self) -> Vec<IpAddr> {
        self.served().into_iter().filter(IpAddr::is_ipv4).collect()
    }

    /// The served IPv6 addresses (AAAA records).
    pub fn served_v6(&self) -> Vec<IpAddr> {
        self.served().into_iter().filter(IpAddr::is_ipv6).collect()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }
}

/// An immutable view of every name, as published by a [`RecordStore`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Bumped by every change that altered something; starts at 0.
    pub generation: u64,
    names: BTreeMap<DnsName, NameRecords>,
}

impl Snapshot {
    /// Builds a snapshot directly (tests, the publisher's desired state).
    pub fn from_names(names: impl IntoIterator<Item = (DnsName, NameRecords)>) -> Self {
        Self {
            generation: 0,
            names: names.into_iter().filter(|(_, r)| !r.is_empty()).collect(),
        }
    }

    /// The records of one name.
    pub fn get(&self, name: &DnsName) -> Option<&NameRecords> {
        self.names.get(name)
    }

    /// All names, in order.
    pub fn names(&self) -> impl Iterator<Item = (&DnsName, &NameRecords)> {
        self.names.iter()
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name has an address.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// The shared, mutable record set: a cheap-to-clone handle.
///
/// Writers call the `set_*`/`remove_*` methods; readers take [`RecordStore::snapshot`] or
/// [`RecordStore::subscribe`] to a `watch` of snapshots. Each method publishes exactly one new
/// snapshot (or none, when nothing changed), so every change is atomic.
#[derive(Debug, Clone)]
pub struct RecordStore {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
}

impl Default for RecordStore {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordStore {
    /// An empty store.
    pub fn new() -> Self {
        let (tx, _rx) = watch::channel(Arc::new(Snapshot::default()));
        Self { tx: Arc::new(tx) }
    }

    /// A store holding `snapshot`'s names.
    pub fn with_snapshot(snapshot: Snapshot) -> Self {
        let store = Self::new();
        store.modify(|names| {
            *names = snapshot.names;
            true
        });
        store
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every published snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Replaces all addresses of `name` at once. An empty list removes the name.
    /// Returns whether anything changed.
    pub fn set_name(&self, name: DnsName, addresses: impl IntoIterator<Item = (IpAddr, bool)>) -> bool {
        let records = NameRecords::new(addresses);
        self.modify(|names| {
            if records.is_empty() {
                return names.remove(&name).is_some();
            }
            if names.get(&name) == Some(&records) {
                return false;
            }
            names.insert(name, records);
            true
        })
    }

    /// Sets the health flag of one address. Returns whether anything changed (false also when
    /// the name or the address is unknown).
    pub fn set_health(&self, name: &DnsName, ip: IpAddr, healthy: bool) -> bool {
        self.modify(|names| {
            let Some(records) = names.get_mut(name) else {
                return false;
            };
            match records.addresses.iter_mut().find(|a| a.ip == ip) {
                Some(a) if a.healthy != healthy => {
                    a.healthy = healthy;
                    true
                }
                _ => false,
            }
        })
    }

    /// Removes one address of a name (the bootstrap phase drops the bootstrap host this way).
    /// Returns whether it was there.
    pub fn remove_address(&self, name: &DnsName, ip: IpAddr) -> bool {
        self.modify(|names| {
            let Some(records) = names.get_mut(name) else {
                return false;
            };
            let before = records.addresses.len();
            records.addresses.retain(|a| a.ip != ip);
            let changed = records.addresses.len() != before;
            if records.is_empty() {
                names.remove(name);
            }
            changed
        })
    }

    /// Removes a name entirely. Returns whether it was there.
    pub fn remove_name(&self, name: &DnsName) -> bool {
        self.modify(|names| names.remove(name).is_some())
    }

    /// Applies `f` to a copy of the names and publishes it if `f` reports a change.
    fn modify(&self, f: impl FnOnce(&mut BTreeMap<DnsName, NameRecords>) -> bool) -> bool {
        self.tx.send_if_modified(|current| {
            let mut names = current.names.clone();
            if !f(&mut names) {
                return false;
            }
            *current = Arc::new(Snapshot {
                generation: current.generation + 1,
                names,
            });
            true
        })
    }
}

#[cfg(test)]
mod tests;
