//! The project's IP list as one write-through store, shared by every handle of a client and read
//! by every part of baton that needs it (endpoint loop, Service controller, BGP, `baton status`).
//!
//! ```text
//!   list call (one at a time, waiters share it) ──► replace ◄── own writes of the last `list_lag`
//!                                                     │          re-applied (a lagging or
//!   write's answer (create, retarget, delete…) ──► record ─┐     overlapping list hides none)
//!                                                     ▼    │
//!            IPs by id, in list order, indexed by tag ◄────┘──► journal (own writes, `list_lag`)
//!                       │
//!      list() ── a snapshot, built once per change; tagged(), at(), get() ── the indexes, O(matches)
//! ```
//!
//! A read is served from the store unless it must be replaced first:
//! - never fetched, or the periodic full resync is due (`resync` after the last fetch started);
//! - a caller asked for a list fetched after some moment ([`IpStore::require_since`]): after a
//!   write whose outcome is unknown (from the end of the list's lag after it: readers wait for
//!   that moment and share one fetch then), or a caller that must see the truth (a route check);
//! - **a new term**: the reader holds a term now ([`Leadership::term`]) and not the one it held
//!   at its previous read (it held none, or another one: it lost the Lease in between). A term
//!   paused for a late renewal and resumed is the same term: nobody else wrote in between. The list must then have been fetched after the previous holder
//!   stopped writing, or, if that is unknown, from now: so a new leader never acts on a list that
//!   predates the last writes of the one before it. The journal is dropped: another leader may
//!   have changed what this replica once wrote.
//!
//! A write never triggers a fetch: its answer is applied in place (O(1) plus its tags), and a
//! fetch that was under way while it landed keeps it (the journal is re-applied over the fetched
//! list). A lookup by tags, address or id uses an index, never a pass over the list.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{IpAddress, IpId, IpList, IpType, Tags};
use crate::term::Leadership;

/// One write this client made (or one IP it read on its own), as the API answered it.
#[derive(Debug, Clone)]
enum Change {
    Upsert(Arc<IpAddress>),
    Remove(IpId),
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    ip: Arc<IpAddress>,
}

/// What the store's reader last knew of its leadership.
#[derive(Debug, Default)]
struct TermTrack {
    /// The term this replica held at its last look; `None`: none.
    held: Option<u64>,
    /// Seen while following: after this moment the holder sent no more writes.
    holder_stopped: Option<Instant>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    ips: HashMap<IpId, Entry>,
    /// List order (the API's, then creation order), each IP as in `ips` (a snapshot is built
    /// from this alone: no look-up per IP).
    order: BTreeMap<u64, Arc<IpAddress>>,
    next_seq: u64,
    /// `(key, value)` → the IPs carrying that tag.
    by_tag: HashMap<(String, String), HashSet<IpId>>,
    /// Address → the IPs with that address (one, but the list does not promise it).
    by_address: HashMap<std::net::IpAddr, HashSet<IpId>>,
    /// When the list in the store was fetched (the call started); `None`: never.
    fetched: Option<Instant>,
    /// A read needs a list fetched at or after this.
    need_since: Option<Instant>,
    /// The whole list, built on the first full read after a change.
    snapshot: Option<IpList>,
    /// This client's writes of the last `list_lag`, oldest first.
    journal: VecDeque<(Instant, Change)>,
    term: TermTrack,
    /// Full list fetches so far (for tests and metrics).
    fetches: u64,
}

impl State {
    fn insert(&mut self, ip: Arc<IpAddress>) {
        let id = ip.id.clone();
        if let Some(old) = self.ips.get(&id) {
            let old = Arc::clone(&old.ip);
            self.unindex(&old);
        }
        let seq = if let Some(e) = self.ips.get(&id) {
            e.seq
        } else {
            let seq = self.next_seq;
            self.next_seq += 1;
            seq
        };
        self.order.insert(seq, Arc::clone(&ip));
        for (k, v) in &ip.tags {
            self.by_tag
                .entry((k.clone(), v.clone()))
                .or_default()
                .insert(id.clone());
        }
        self.by_address.entry(ip.address).or_default().insert(id.clone());
        self.ips.insert(id, Entry { seq, ip });
        self.snapshot = None;
    }

    fn remove(&mut self, id: &IpId) {
        if let Some(old) = self.ips.remove(id) {
            self.order.remove(&old.seq);
            self.unindex(&old.ip);
            self.snapshot = None;
        }
    }

    fn unindex(&mut self, ip: &IpAddress) {
        if let Some(ids) = self.by_address.get_mut(&ip.address) {
            ids.remove(&ip.id);
            if ids.is_empty() {
                self.by_address.remove(&ip.address);
            }
        }
        for (k, v) in &ip.tags {
            let key = (k.clone(), v.clone());
            if let Some(ids) = self.by_tag.get_mut(&key) {
                ids.remove(&ip.id);
                if ids.is_empty() {
                    self.by_tag.remove(&key);
                }
            }
        }
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Upsert(ip) => self.insert(Arc::clone(ip)),
            Change::Remove(id) => self.remove(id),
        }
    }

    fn fresh(&self, now: Instant, resync: Duration) -> bool {
        self.fetched.is_some_and(|at| {
            now.saturating_duration_since(at) < resync && self.need_since.is_none_or(|t| at >= t)
        })
    }

    fn require_since(&mut self, at: Instant) {
        self.need_since = Some(self.need_since.map_or(at, |t| t.max(at)));
    }

    /// Follows the reader's leadership; on a new term, asks for a list fetched after the
    /// previous holder stopped writing (or from now) and forgets the journal.
    fn observe(&mut self, leadership: &dyn Leadership, now: Instant) {
        let Some(term) = leadership.term() else {
            self.term.held = None;
            if let Some(stopped) = leadership.holder_stopped() {
                self.term.holder_stopped = Some(stopped);
            }
            return;
        };
        let new_term = self.term.held != Some(term);
        self.term.held = Some(term);
        if new_term {
            // The previous holder's stop as the gate shows it now (its last record), else as it
            // was at this replica's last read while following (the read ahead of a takeover).
            let since = leadership
                .holder_stopped()
                .or(self.term.holder_stopped.take())
                .filter(|t| *t <= now)
                .unwrap_or(now);
            self.term.holder_stopped = None;
            self.require_since(since);
            self.journal.clear();
        }
    }

    /// The IPs carrying every one of `tags`, in list order (the smallest of the tags' index
    /// entries, checked).
    fn tagged(&self, tags: &Tags) -> Vec<Arc<IpAddress>> {
        let mut smallest: Option<&HashSet<IpId>> = None;
        for (k, v) in tags {
            let Some(ids) = self.by_tag.get(&(k.clone(), v.clone())) else {
                return Vec::new();
            };
            if smallest.is_none_or(|s| ids.len() < s.len()) {
                smallest = Some(ids);
            }
        }
        let mut found: Vec<&Entry> = match smallest {
            Some(ids) => ids.iter().filter_map(|id| self.ips.get(id)).collect(),
            None => self.ips.values().collect(),
        };
        found.retain(|e| e.ip.has_tags(tags));
        found.sort_by_key(|e| e.seq);
        found.into_iter().map(|e| Arc::clone(&e.ip)).collect()
    }

    /// The IPs with any of `addresses`, in list order.
    fn at(&self, addresses: &BTreeSet<std::net::IpAddr>) -> Vec<Arc<IpAddress>> {
        let mut found: Vec<&Entry> = addresses
            .iter()
            .filter_map(|a| self.by_address.get(a))
            .flatten()
            .filter_map(|id| self.ips.get(id))
            .collect();
        found.sort_by_key(|e| e.seq);
        found.into_iter().map(|e| Arc::clone(&e.ip)).collect()
    }

    fn list(&mut self) -> IpList {
        if let Some(list) = &self.snapshot {
            return Arc::clone(list);
        }
        let list: IpList = Arc::new(self.order.values().cloned().collect());
        self.snapshot = Some(Arc::clone(&list));
        list
    }
}

/// The store. `resync`: how long a fetched list serves before it is replaced; `list_lag`: how
/// far the API's list may lag behind its writes (own writes that recent are kept over a fetch).
#[derive(Debug)]
pub(crate) struct IpStore {
    resync: Duration,
    list_lag: Duration,
    state: Mutex<State>,
    fetching: tokio::sync::Mutex<()>,
}

impl IpStore {
    pub(crate) fn new(resync: Duration, list_lag: Duration) -> Self {
        Self {
            resync,
            list_lag,
            state: Mutex::new(State::default()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// How far the API's list may lag behind its writes.
    pub(crate) fn list_lag(&self) -> Duration {
        self.list_lag
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `read` on the store once it is fresh for this reader: replaced first by one
    /// (shared) call of `fetch` if it must be (see the module doc).
    pub(crate) async fn read<R, F, Fut, E>(
        &self,
        leadership: Option<&dyn Leadership>,
        fetch: F,
        read: impl FnOnce(&mut State) -> R,
    ) -> Result<R, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<IpAddress>, E>>,
    {
        let not_before = {
            let mut state = self.lock();
            let now = Instant::now();
            if let Some(leadership) = leadership {
                state.observe(leadership, now);
            }
            if state.fresh(now, self.resync) {
                return Ok(read(&mut state));
            }
            state.need_since.filter(|t| *t > now)
        };
        // A list is required from a moment still to come (after a write of unknown outcome: its
        // effect may show only after the list's lag). A list fetched before then could not serve
        // it, so every reader until then would fetch one of its own: wait for the moment, and
        // the readers waiting with this one share one fetch.
        if let Some(at) = not_before {
            tokio::time::sleep_until(at).await;
        }
        let _one_fetch = self.fetching.lock().await;
        {
            let mut state = self.lock();
            if state.fresh(Instant::now(), self.resync) {
                return Ok(read(&mut state));
            }
        }
        let started = Instant::now();
        let list = fetch().await?;
        let mut state = self.lock();
        self.replace(&mut state, list, started);
        Ok(read(&mut state))
    }

    /// Replaces the list with one fetched at `started`, keeping this client's writes that the
    /// list may not show yet (made after `started - list_lag`).
    fn replace(&self, state: &mut State, list: Vec<IpAddress>, started: Instant) {
        state.ips.clear();
        state.order.clear();
        state.by_tag.clear();
        state.by_address.clear();
        state.snapshot = None;
        state.ips.reserve(list.len());
        for ip in list {
            state.insert(Arc::new(ip));
        }
        let keep_from = started.checked_sub(self.list_lag).unwrap_or(started);
        let kept: Vec<Change> = state
            .journal
            .iter()
            .filter(|(at, _)| *at >= keep_from)
            .map(|(_, c)| c.clone())
            .collect();
        for change in &kept {
            state.apply(change);
        }
        state.fetched = Some(state.fetched.map_or(started, |t| t.max(started)));
        state.fetches += 1;
        Self::prune(state, self.list_lag);
    }

    fn prune(state: &mut State, list_lag: Duration) {
        let now = Instant::now();
        while state
            .journal
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > list_lag)
        {
            state.journal.pop_front();
        }
    }

    fn record(&self, change: Change) {
        let mut state = self.lock();
        state.apply(&change);
        Self::prune(&mut state, self.list_lag);
        state.journal.push_back((Instant::now(), change));
    }

    /// A write's answer (or a fresh read of one IP): now in the store.
    pub(crate) fn upsert(&self, ip: &IpAddress) {
        self.record(Change::Upsert(Arc::new(ip.clone())));
    }

    /// One IP as the store holds it now, without a fetch (what a write's answer is applied to
    /// when the API answers with less than the whole IP).
    pub(crate) fn peek(&self, id: &IpId) -> Option<Arc<IpAddress>> {
        reads::get(id)(&mut self.lock())
    }

    /// A delete that succeeded (or found the IP gone).
    pub(crate) fn remove(&self, id: &IpId) {
        self.record(Change::Remove(id.clone()));
    }

    /// Follows `leadership` without reading (the client's watcher calls this every 100 ms): a
    /// reader that reads less often than the lease is renewed would otherwise take continuous
    /// leadership for a new term.
    pub(crate) fn observe(&self, leadership: &dyn Leadership) {
        self.lock().observe(leadership, Instant::now());
    }

    /// The next read uses a list whose fetch started at or after `at`.
    pub(crate) fn require_since(&self, at: Instant) {
        self.lock().require_since(at);
    }

    /// Full list fetches made so far.
    #[cfg(test)]
    pub(crate) fn fetches(&self) -> u64 {
        self.lock().fetches
    }
}

/// Reads of the store (run under its lock).
pub(crate) mod reads {
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use super::{Arc, IpAddress, IpId, IpList, IpType, State, Tags};

    /// The whole list (a snapshot built once per change).
    pub(crate) fn list(state: &mut State) -> IpList {
        state.list()
    }

    /// The Floating IPs carrying every one of `tags`, in list order.
    pub(crate) fn tagged(tags: &Tags) -> impl FnOnce(&mut State) -> Vec<Arc<IpAddress>> + '_ {
        move |state| {
            let mut found = state.tagged(tags);
            found.retain(|ip| ip.ip_type == IpType::FloatingIp);
            found
        }
    }

    /// The IPs with any of `addresses`, in list order.
    pub(crate) fn at(addresses: &BTreeSet<IpAddr>) -> impl FnOnce(&mut State) -> Vec<Arc<IpAddress>> + '_ {
        move |state| state.at(addresses)
    }

    /// One IP, if the list shows it.
    pub(crate) fn get(id: &IpId) -> impl FnOnce(&mut State) -> Option<Arc<IpAddress>> + '_ {
        move |state| state.ips.get(id).map(|e| Arc::clone(&e.ip))
    }
}

#[cfg(test)]
mod tests;
