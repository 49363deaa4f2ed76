//! Fencing at the write: a [`Fence`] tells a [`CherryClient`](crate::CherryClient) handle until
//! when it may send writes.
//!
//! ```text
//!  lease task ── watch::Sender<Option<Instant>> ("leader until") ──► Receiver: impl Fence
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

use tokio::sync::watch;
use tokio::time::Instant;

/// Tells a client until when it may send writes. `None` = not now.
///
/// A write attempt is sent only while `Instant::now() < deadline`, and its HTTP timeout is cut
/// to the time left, so no byte of it leaves after the deadline.
pub trait Fence: Send + Sync + Debug {
    /// Until when writes may be sent; `None`: not at all (not the leader).
    fn deadline(&self) -> Option<Instant>;
}

/// The controller's leader gate publishes "leader until" on a watch channel: its receiver is a
/// fence as it is. A receiver whose sender is gone keeps the last value.
impl Fence for watch::Receiver<Option<Instant>> {
    fn deadline(&self) -> Option<Instant> {
        *self.borrow()
    }
}

/// A fixed deadline (tests, one-shot tools): `Some(t)` allows writes until `t`, `None` never.
impl Fence for Option<Instant> {
    fn deadline(&self) -> Option<Instant> {
        *self
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
        tx.send(Some(until)).unwrap();
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
