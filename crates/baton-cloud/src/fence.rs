//! Fencing at the write: a [`Fence`] tells a [`CherryClient`](crate::CherryClient) handle in
//! which term, and until when, it may send writes.
//!
//! ```text
//!  lease task ── watch::Sender<Option<Lead>> (term, "leader until") ──► Receiver: impl Fence
//!                                                                       │
//!  client.fenced(Arc::new(rx)).counting(in_flight)                      │ term captured when
//!    write ──► rate gate ─(same term, before until?)─► [Sending] send ──┤ the call begins
//!                ▲          (full request timeout: a write that left in time gets its answer)
//!                └── backoff / Retry-After: dropped as soon as the term changes or ends;
//!                    Urgent gives up if the wait would reach `until`
//! ```
//!
//! A fenced write captures the term when its call begins (no term: it fails at once). Each
//! attempt is sent only while the fence shows that same term with `until` still ahead, read
//! after the rate gate's grant (first try and every retry); otherwise the call fails with
//! [`CloudError::Fenced`](crate::CloudError::Fenced) and nothing more is sent. A sent attempt is
//! counted in [`InFlight`] until its answer, error, timeout or cancellation. Reads are never
//! fenced.

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

    /// A receiver that is told of every change of [`Fence::lead`], if this fence can tell: a
    /// write waiting in the rate gate or a retry delay is then dropped as soon as its term ends,
    /// not only when it looks again. `None` (the default): the fence is looked at at `until`
    /// and before each attempt only.
    fn changes(&self) -> Option<watch::Receiver<Option<Lead>>> {
        None
    }

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

    fn changes(&self) -> Option<watch::Receiver<Option<Lead>>> {
        Some(self.clone())
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

/// The term a fenced call began in: each of its attempts is sent only in that term, before its
/// deadline.
#[derive(Clone, Debug)]
pub struct CallTerm {
    fence: Arc<dyn Fence>,
    /// `None`: the call began without a term; it sends nothing.
    term: Option<u64>,
}

impl CallTerm {
    /// Captures the fence's term now.
    pub fn begin(fence: Arc<dyn Fence>) -> Self {
        let term = fence.lead().map(|l| l.term);
        Self { fence, term }
    }

    /// The fence's lead if it is still this call's term (paused or not).
    pub fn lead(&self) -> Option<Lead> {
        let term = self.term?;
        self.fence.lead().filter(|l| l.term == term)
    }

    /// Until when an attempt may be sent: this call's term is current and its deadline ahead.
    pub(crate) fn sendable_until(&self) -> Option<Instant> {
        self.lead().map(|l| l.until).filter(|u| *u > Instant::now())
    }

    /// The term changed or ended (a term paused for a late renewal has not).
    pub(crate) fn is_over(&self) -> bool {
        self.lead().is_none()
    }

    /// Waits until an attempt may be sent: this call's term current and its deadline ahead,
    /// a paused term (a late renewal) waited out for at most `limit`. `Err` says why not.
    pub async fn sendable_within(&self, limit: std::time::Duration) -> Result<(), &'static str> {
        let give_up = Instant::now() + limit;
        let mut changes = self.subscribe();
        loop {
            match self.lead() {
                None if self.term.is_none() => return Err("this replica does not lead"),
                None => return Err("the term it was decided in ended"),
                Some(l) if Instant::now() < l.until => return Ok(()),
                Some(_) => {}
            }
            tokio::select! {
                () = tokio::time::sleep_until(give_up) => return Err("the leader's renewal stayed late"),
                () = changed(&mut changes) => {}
            }
        }
    }

    /// A receiver of the fence's changes with the current value marked seen (see
    /// [`changed`]); look at the fence after taking it, so no change is missed.
    pub(crate) fn subscribe(&self) -> Option<watch::Receiver<Option<Lead>>> {
        let mut rx = self.fence.changes()?;
        rx.borrow_and_update();
        Some(rx)
    }
}

/// Resolves at the next change `rx` reports; never without a receiver, or once its sender is
/// gone (nothing can change then; a deadline in the last value still passes).
pub(crate) async fn changed(rx: &mut Option<watch::Receiver<Option<Lead>>>) {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                *rx = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
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
        let fence: Arc<dyn Fence> = Arc::new(rx.clone());
        assert_eq!(CallTerm::begin(Arc::clone(&fence)).sendable_until(), None);
        let until = Instant::now() + Duration::from_secs(2);
        tx.send(Some(Lead { term: 1, until })).unwrap();
        let call = CallTerm::begin(Arc::clone(&fence));
        assert_eq!(call.sendable_until(), Some(until));
        drop(tx);
        assert_eq!(rx.deadline(), Some(until), "the last value outlives the sender");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            call.sendable_until(),
            None,
            "a deadline that is now is not in the future"
        );
        assert!(!call.is_over(), "paused, not over: the same term");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_is_sent_only_in_the_term_it_began_in() {
        let until = Instant::now() + Duration::from_secs(2);
        let (tx, rx) = watch::channel(Some(Lead { term: 1, until }));
        let fence: Arc<dyn Fence> = Arc::new(rx);
        let call = CallTerm::begin(Arc::clone(&fence));
        let mut changes = call.subscribe();
        // A late renewal: paused, then resumed in the same term.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(call.sendable_until(), None, "paused");
        let later = Instant::now() + Duration::from_secs(1);
        tx.send(Some(Lead {
            term: 1,
            until: later,
        }))
        .unwrap();
        changed(&mut changes).await;
        assert_eq!(call.sendable_until(), Some(later), "resumed in the same term");
        // Lost and won again: a new term, never this call's.
        tx.send(None).unwrap();
        changed(&mut changes).await;
        assert!(call.is_over());
        tx.send(Some(Lead {
            term: 2,
            until: later,
        }))
        .unwrap();
        changed(&mut changes).await;
        assert!(call.is_over(), "a later term is not the call's");
        assert_eq!(call.sendable_until(), None);
        assert_eq!(CallTerm::begin(Arc::clone(&fence)).sendable_until(), Some(later));
        // A call that began without a term never sends.
        tx.send(None).unwrap();
        let orphan = CallTerm::begin(Arc::clone(&fence));
        tx.send(Some(Lead {
            term: 3,
            until: later,
        }))
        .unwrap();
        assert!(orphan.is_over());
        changed(&mut changes).await; // both sends seen
        // The sender gone: no change ever comes (the waiter relies on `until`).
        drop(tx);
        let waited = tokio::time::timeout(Duration::from_secs(5), changed(&mut changes)).await;
        assert!(waited.is_err(), "a gone sender is not a change");
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
        let call = |f: Option<Instant>| CallTerm::begin(Arc::new(f));
        assert_eq!(call(Some(Instant::now())).sendable_until(), None);
        assert_eq!(call(None).sendable_until(), None);
        assert!(call(None).is_over());
        let later = Some(Instant::now() + Duration::from_secs(60));
        assert_eq!(call(later).sendable_until(), later);
        assert!(call(later).subscribe().is_none(), "a fixed fence never changes");
    }
}
