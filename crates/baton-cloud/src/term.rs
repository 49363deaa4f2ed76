//! What the IP store needs to know of leadership to tell a new term: a [`Leadership`] says which
//! term this replica holds (a number that grows with each acquisition, never with a renewal) and,
//! while another replica leads, when that one stopped writing.
//!
//! ```text
//!  controller: LeaderGate ── impl Leadership ──► CherryClient::led_by ──► IpStore::read
//!                                                   (a read in a new term waits for a list
//!                                                    fetched after the last holder stopped)
//! ```
//!
//! A handle without one (bootstrap, `baton status`, tests) never sees a term change.

use std::fmt::Debug;

use tokio::time::Instant;

/// This replica's leadership, as the store's reads see it.
pub trait Leadership: Send + Sync + Debug {
    /// The term this replica holds, also while its writes pause for a late renewal; `None`:
    /// it holds none. A new number is a new term (a pause and its renewal are not).
    fn term(&self) -> Option<u64>;

    /// While another replica holds the lease: the moment after which that holder sends no more
    /// writes unless it renews (its fence), plus any margin for requests still on the way.
    fn holder_stopped(&self) -> Option<Instant>;
}

/// A fixed leadership (tests, one-shot tools): term 0 until the instant given, no other holder.
impl Leadership for Option<Instant> {
    fn term(&self) -> Option<u64> {
        self.filter(|until| *until > Instant::now()).map(|_| 0)
    }

    fn holder_stopped(&self) -> Option<Instant> {
        None
    }
}
