//! A shared, coalesced cache of the project's IP list.
//!
//! - Concurrent readers of a missing or stale list wait for one fetch and share its result, so N
//!   reconciles cause one `GET /v1/projects/{id}/ips`, not N.
//! - A write whose result is known patches the cached list in place ([`IpCache::apply`]); a write
//!   whose outcome is unknown, or an explicit [`IpCache::invalidate`], drops it.
//! - Each change bumps a generation; a fetch that started before a change is returned to its
//!   callers but not cached, so a write is never hidden by an older read.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{IpAddress, IpList};

#[derive(Debug)]
struct Entry {
    generation: u64,
    fetched: Instant,
    ips: IpList,
}

/// The cache. `ttl` bounds how old a list may be before a read refetches it.
#[derive(Debug)]
pub(crate) struct IpCache {
    ttl: Duration,
    generation: AtomicU64,
    entry: Mutex<Option<Entry>>,
    fetching: tokio::sync::Mutex<()>,
}

impl IpCache {
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            generation: AtomicU64::new(0),
            entry: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Entry>> {
        self.entry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fresh(&self) -> Option<IpList> {
        let entry = self.lock();
        let e = entry.as_ref()?;
        (e.generation == self.generation.load(Ordering::Acquire) && e.fetched.elapsed() < self.ttl)
            .then(|| e.ips.clone())
    }

    /// The cached list, or the result of one (shared) call of `fetch`.
    pub(crate) async fn get<F, Fut, E>(&self, fetch: F) -> Result<IpList, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<IpAddress>, E>>,
    {
        if let Some(ips) = self.fresh() {
            return Ok(ips);
        }
        let _one_fetch = self.fetching.lock().await;
        if let Some(ips) = self.fresh() {
            return Ok(ips);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let list = fetch().await?;
        // Collected at its exact length (decoding grew the list by doubling); kept until the
        // next fetch.
        let ips: IpList = Arc::new(list.into_iter().map(Arc::new).collect());
        let mut entry = self.lock();
        if self.generation.load(Ordering::Acquire) == generation {
            *entry = Some(Entry {
                generation,
                fetched: Instant::now(),
                ips: ips.clone(),
            });
        }
        Ok(ips)
    }

    /// Drops the cached list.
    pub(crate) fn invalidate(&self) {
        let _entry = self.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Records a completed write: patches a current list in place (and keeps it current), and
    /// makes sure a fetch already under way is not cached. A list some reader still holds is
    /// copied first: its `Arc`s, not the IPs.
    pub(crate) fn apply(&self, change: impl FnOnce(&mut Vec<Arc<IpAddress>>)) {
        let mut entry = self.lock();
        let old = self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(e) = entry.as_mut().filter(|e| e.generation == old) {
            change(Arc::make_mut(&mut e.ips));
            e.generation = old + 1;
        }
    }

    /// Inserts or replaces one IP.
    pub(crate) fn upsert(&self, ip: &IpAddress) {
        self.apply(|ips| match ips.iter_mut().find(|i| i.id == ip.id) {
            Some(slot) => *slot = Arc::new(ip.clone()),
            None => ips.push(Arc::new(ip.clone())),
        });
    }

    /// Removes one IP.
    pub(crate) fn remove(&self, id: &crate::model::IpId) {
        self.apply(|ips| ips.retain(|i| &i.id != id));
    }
}

#[cfg(test)]
mod tests;
