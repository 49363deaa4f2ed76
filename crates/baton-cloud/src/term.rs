//! What the IP store needs to know of leadership to tell a new term: a [`Leadership`] says until
//! when this replica leads and, while another replica does, when that one stopped writing.
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
    /// Until when this replica leads; `None` (or a past instant): it does not.
    fn leads_until(&self) -> Option<Instant>;

    /// While another replica holds the lease: the moment after which that holder sends no more
    /// writes unless it renews (its fence), plus any margin for requests still on the way.
    fn holder_stopped(&self) -> Option<Instant>;
}

/// A fixed leadership (tests, one-shot tools): leads until the instant given, no other holder.
impl Leadership for Option<Instant> {
    fn leads_until(&self) -> Option<Instant> {
        *self
    }

    fn holder_stopped(&self) -> Option<Instant> {
        None
    }
}
