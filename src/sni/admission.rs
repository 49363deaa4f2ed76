//! Who gets a connection slot, and for how long before it is routed. Pure bookkeeping (no I/O):
//! the router asks at accept and drops the guards when a connection ends.
//!
//! ```text
//!  accept (global cap: the accept loops wait for a free descriptor — backpressure, not
//!          refusal; a connection not yet routed is evicted to make one)
//!    ─► Sources::admit(ip) ── per source (IPv4 address, IPv6 /64): open ≤ per_source,
//!    │                         not yet routed ≤ pending_per_source; else refused at once
//!    ─► Pending::enter ─ the router-wide queue of connections still reading their first bytes:
//!    │   at most max_pending of them, holding at most pending_bytes; a new one (or new bytes)
//!    │   beyond that evicts the OLDEST (a client that completes its ClientHello in a round trip
//!    │   is never the oldest for long; one that trickles bytes is)
//!    ─► routed: Admitted::routed, the pending slot dropped ─► spliced (open until it ends)
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::Notify;

/// The caps, all counted per router process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Connections open at once (pending and spliced): the accept loops wait beyond it.
    pub max_connections: usize,
    /// Connections open at once from one source.
    pub per_source: usize,
    /// Connections not yet routed (reading their PROXY header and ClientHello).
    pub max_pending: usize,
    /// Connections not yet routed from one source.
    pub pending_per_source: usize,
    /// Bytes held by connections not yet routed.
    pub pending_bytes: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_connections: 100_000,
            per_source: 4_096,
            max_pending: 20_000,
            pending_per_source: 128,
            pending_bytes: 16 << 20,
        }
    }
}

/// Where a connection comes from, as the caps count it: an IPv4 address, or the /64 of an IPv6
/// address (one host's usual allocation: counting single IPv6 addresses would let one host
/// take any number of slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self(ip),
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    Self(IpAddr::V4(v4))
                } else {
                    let s = v6.segments();
                    Self(IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0)))
                }
            }
        }
    }
}

/// Why a source is refused a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("source has its most open connections")]
    SourceOpen,
    #[error("source has its most connections not yet routed")]
    SourcePending,
}

impl Refusal {
    /// A stable label for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            Self::SourceOpen => "source_limit",
            Self::SourcePending => "source_pending_limit",
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Count {
    open: usize,
    pending: usize,
}

/// Open and pending connections per source.
#[derive(Debug)]
pub struct Sources {
    caps: Caps,
    counts: Mutex<HashMap<Source, Count>>,
}

impl Sources {
    pub fn new(caps: Caps) -> Arc<Self> {
        Arc::new(Self {
            caps,
            counts: Mutex::default(),
        })
    }

    /// A new connection from `ip`, counted open and pending until the guard says otherwise.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, Refusal> {
        let source = Source::of(ip);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let c = counts.entry(source).or_default();
        if c.open >= self.caps.per_source {
            return Err(Refusal::SourceOpen);
        }
        if c.pending >= self.caps.pending_per_source {
            return Err(Refusal::SourcePending);
        }
        c.open += 1;
        c.pending += 1;
        Ok(Admitted {
            sources: Arc::clone(self),
            source,
            pending: true,
        })
    }

    /// `(open, pending)` of the source of `ip`.
    pub fn count(&self, ip: IpAddr) -> (usize, usize) {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .get(&Source::of(ip))
            .map_or((0, 0), |c| (c.open, c.pending))
    }

    /// Sources with a connection open.
    pub fn len(&self) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn release(&self, source: Source, pending: bool) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = counts.get_mut(&source) {
            c.open = c.open.saturating_sub(1);
            if pending {
                c.pending = c.pending.saturating_sub(1);
            }
            if c.open == 0 {
                counts.remove(&source);
            }
        }
    }

    fn routed(&self, source: Source) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = counts.get_mut(&source) {
            c.pending = c.pending.saturating_sub(1);
        }
    }
}

/// One admitted connection's place in its source's counts, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    sources: Arc<Sources>,
    source: Source,
    pending: bool,
}

impl Admitted {
    /// The connection is routed: it no longer counts as pending for its source.
    pub fn routed(&mut self) {
        if std::mem::take(&mut self.pending) {
            self.sources.routed(self.source);
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.sources.release(self.source, self.pending);
    }
}

/// One pending connection as the queue sees it.
#[derive(Debug, Default)]
struct Entry {
    notify: Notify,
    evicted: AtomicBool,
    bytes: AtomicUsize,
}

#[derive(Debug, Default)]
struct Queue {
    /// Oldest first; entries of connections that are gone are skipped (and compacted).
    order: VecDeque<Weak<Entry>>,
    live: usize,
    bytes: usize,
}

impl Queue {
    /// Evicts the oldest live entry; returns whether there was one.
    fn evict_oldest(&mut self) -> bool {
        while let Some(weak) = self.order.pop_front() {
            if let Some(e) = weak.upgrade()
                && !e.evicted.swap(true, Ordering::Relaxed)
            {
                self.live = self.live.saturating_sub(1);
                self.bytes = self.bytes.saturating_sub(e.bytes.swap(0, Ordering::Relaxed));
                e.notify.notify_one();
                return true;
            }
        }
        false
    }
}

/// The connections not yet routed, router-wide, oldest first.
#[derive(Debug)]
pub struct Pending {
    max: usize,
    max_bytes: usize,
    queue: Mutex<Queue>,
}

impl Pending {
    pub fn new(max: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            max_bytes,
            queue: Mutex::default(),
        })
    }

    /// Queues a new connection, evicting the oldest if the queue is full; returns its slot and
    /// how many were evicted for it.
    pub fn enter(self: &Arc<Self>) -> (PendingSlot, usize) {
        let entry = Arc::new(Entry::default());
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let mut evicted = 0;
        while q.live >= self.max && q.evict_oldest() {
            evicted += 1;
        }
        q.live += 1;
        q.order.push_back(Arc::downgrade(&entry));
        // Entries of connections routed or closed since: drop them once they are the majority.
        if q.order.len() > 2 * q.live + 64 {
            q.order.retain(|w| w.strong_count() > 0);
        }
        drop(q);
        (
            PendingSlot {
                pending: Arc::clone(self),
                entry,
            },
            evicted,
        )
    }

    /// Evicts the oldest connection not yet routed, if any; returns whether there was one.
    pub fn evict_oldest(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .evict_oldest()
    }

    /// `(connections, bytes)` pending now.
    pub fn load(&self) -> (usize, usize) {
        let q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        (q.live, q.bytes)
    }
}

/// A connection's place in the pending queue, left when dropped (when it is routed or closed).
#[derive(Debug)]
pub struct PendingSlot {
    pending: Arc<Pending>,
    entry: Arc<Entry>,
}

impl PendingSlot {
    /// Counts `n` more bytes held by this connection; evicts the oldest connections (maybe
    /// this one) while the pending ones hold more than the byte cap. Returns how many were
    /// evicted.
    pub fn hold(&self, n: usize) -> usize {
        let mut q = self.pending.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if self.is_evicted() {
            return 0;
        }
        self.entry.bytes.fetch_add(n, Ordering::Relaxed);
        q.bytes += n;
        let mut evicted = 0;
        while q.bytes > self.pending.max_bytes && q.evict_oldest() {
            evicted += 1;
        }
        evicted
    }

    /// Whether this connection was evicted.
    pub fn is_evicted(&self) -> bool {
        self.entry.evicted.load(Ordering::Relaxed)
    }

    /// Returns once this connection is evicted.
    pub async fn evicted(&self) {
        if !self.is_evicted() {
            self.entry.notify.notified().await;
        }
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        if self.entry.evicted.swap(true, Ordering::Relaxed) {
            return; // the evictor already took it out of the counts
        }
        let mut q = self.pending.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.live = q.live.saturating_sub(1);
        q.bytes = q.bytes.saturating_sub(self.entry.bytes.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests;
