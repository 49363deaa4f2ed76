//! Fencing at the write: a [`Fence`] tells a [`CherryClient`](crate::CherryClient) handle until
//! when it may send writes.
//!
//! ```text
//!  lease task ── watch::Sender<Option<Lead>> (term, "leader until") ──► Receiver: impl Fence
//!                                                                       │
//!  client.fenced(Arc::new(rx)) ── write ──► rate gate ─(deadline?)─► send (timeout ≤ deadline)
//!                                                ▲                      │ retry delay past the
//!                                                └── (deadline?) ◄──────┘ deadline: Urgent gives up
//! ```
//!
//! The client reads the deadline right before each attempt of a write leaves (after the rate
//! gate's grant, first try and every retry) and sends nothing once it is `None` or past: the
//! call fails with [`CloudError::Fenced`](crate::CloudError::Fenced). Reads are never fenced.

use std::fmt::Debug;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

/// One term of this replica's leadership: which one (a number that grows with every
/// acquisition of the lease, never with a renewal) and until when writes may be sent in it.
/// A renewal that arrives late keeps the term: writes pause past `until` and resume with the
/// same term; a term ended (lease lost, released) never comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lead {
    pub term: u64,
    pub until: Instant,
}

/// Tells a client whether, and until when, it may send writes.
///
/// A write attempt is sent only while `Instant::now() < deadline`.
pub trait Fence: Send + Sync + Debug {
    /// The current term and its deadline; `None`: not the leader.
    fn lead(&self) -> Option<Lead>;

    /// Until when writes may be sent; `None`: not at all (not the leader).
    fn deadline(&self) -> Option<Instant> {
        self.lead().map(|l| l.until)
    }
}

/// The controller's leader gate publishes its [`Lead`] on a watch channel: its receiver is a
/// fence as it is. A receiver whose sender is gone keeps the last value.
impl Fence for watch::Receiver<Option<Lead>> {
    fn lead(&self) -> Option<Lead> {
        *self.borrow()
    }
}

/// A fixed deadline (tests, one-shot tools): `Some(t)` allows writes until `t` (term 0),
/// `None` never.
impl Fence for Option<Instant> {
    fn lead(&self) -> Option<Lead> {
        self.map(|until| Lead { term: 0, until })
    }
}

/// Writes sent under a fence and not yet answered, shared by every client that sends them (the
/// cloud client's fenced handles, the Kubernetes client's leader writes): a graceful release
/// stops new sends first, then waits for [`InFlight::settled`] before it clears the holder.
#[derive(Clone, Debug)]
pub struct InFlight(Arc<watch::Sender<usize>>);

impl Default for InFlight {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(0)))
    }
}

/// One write on its way; dropping it (answer, error, timeout, cancellation) ends it.
#[derive(Debug)]
#[must_use = "the write counts as in flight only while the guard lives"]
pub struct Sending(InFlight);

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl InFlight {
    /// Counts one write from now until the guard drops.
    pub fn enter(&self) -> Sending {
        self.0.send_modify(|n| *n += 1);
        Sending(self.clone())
    }

    /// How many writes are on their way now.
    pub fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no write is on its way, at most `limit`; returns whether it got there.
    pub async fn settled(&self, limit: std::time::Duration) -> bool {
        let mut rx = self.0.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }
}

/// The deadline if it is still in the future.
pub(crate) fn live_deadline(fence: &dyn Fence) -> Option<Instant> {
    fence.deadline().filter(|d| *d > Instant::now())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn watch_receiver_follows_the_sender_and_keeps_the_last_value() {
        let (tx, rx) = watch::channel(None);
        assert_eq!(rx.deadline(), None);
        assert_eq!(live_deadline(&rx), None);
        let until = Instant::now() + Duration::from_secs(2);
        tx.send(Some(Lead { term: 1, until })).unwrap();
        assert_eq!(live_deadline(&rx), Some(until));
        drop(tx);
        assert_eq!(rx.deadline(), Some(until), "the last value outlives the sender");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            live_deadline(&rx),
            None,
            "a deadline that is now is not in the future"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_every_write_on_its_way_and_no_longer_than_its_limit() {
        let in_flight = InFlight::default();
        assert!(in_flight.settled(Duration::ZERO).await, "nothing sent");
        let a = in_flight.enter();
        let b = in_flight.clone().enter();
        assert_eq!(in_flight.count(), 2);
        assert!(
            !in_flight.settled(Duration::from_millis(100)).await,
            "two on their way"
        );
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.settled(Duration::from_secs(5)).await }
        });
        drop(a);
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "one still on its way");
        drop(b);
        assert!(waiter.await.unwrap(), "settled once the last answered");
        assert_eq!(in_flight.count(), 0);
    }

    #[test]
    fn fixed_deadline() {
        let past: Option<Instant> = Some(Instant::now());
        assert_eq!(live_deadline(&past), None);
        let never: Option<Instant> = None;
        assert_eq!(live_deadline(&never), None);
        let later = Some(Instant::now() + Duration::from_secs(60));
        assert_eq!(live_deadline(&later), later);
    }
}
