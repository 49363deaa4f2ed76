//! A client-side request gate: at most `rate` requests per second, shared by every clone of a
//! client, with two priority classes.
//!
//! ```text
//!   urgent waiters  ──┐  (FIFO)             one grant every 1/rate s
//!                     ├──► head of queue ──► (urgent first; normal only when no urgent waits)
//!   normal waiters  ──┘  (FIFO)
//! ```
//!
//! Grants are spaced by `1/rate` with no burst, so the client never exceeds the API's per-second
//! budget in any window. A `Retry-After` from the API pauses the whole gate ([`RateGate::defer`]),
//! since the limit is per source address, not per caller. Time is `tokio::time`, so tests run on
//! paused time.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::fence::{Lead, changed};

/// The priority class of a cloud call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Priority {
    /// Failover: served before any queued normal call.
    Urgent,
    /// Everything else.
    #[default]
    Normal,
}

impl Priority {
    /// `urgent` or `normal` (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Urgent => "urgent",
            Self::Normal => "normal",
        }
    }
}

#[derive(Debug)]
struct State {
    next_slot: Instant,
    next_ticket: u64,
    urgent: VecDeque<u64>,
    normal: VecDeque<u64>,
}

impl State {
    fn queue(&mut self, priority: Priority) -> &mut VecDeque<u64> {
        match priority {
            Priority::Urgent => &mut self.urgent,
            Priority::Normal => &mut self.normal,
        }
    }

    fn is_head(&self, priority: Priority, ticket: u64) -> bool {
        match priority {
            Priority::Urgent => self.urgent.front() == Some(&ticket),
            Priority::Normal => self.urgent.is_empty() && self.normal.front() == Some(&ticket),
        }
    }
}

/// The gate. `None` interval means unlimited.
#[derive(Debug)]
pub(crate) struct RateGate {
    interval: Option<Duration>,
    state: Mutex<State>,
    changed: Notify,
}

/// Removes a waiter's ticket if its future is dropped before the grant.
struct Ticket<'a> {
    gate: &'a RateGate,
    priority: Priority,
    id: u64,
    armed: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.gate.lock();
            s.queue(self.priority).retain(|t| *t != self.id);
            drop(s);
            self.gate.changed.notify_waiters();
        }
    }
}

impl RateGate {
    /// A gate admitting `per_second` requests per second (`None`: no limit).
    pub(crate) fn new(per_second: Option<f64>) -> Self {
        let interval = per_second.map(|r| Duration::from_secs_f64(1.0 / r));
        Self {
            interval,
            state: Mutex::new(State {
                next_slot: Instant::now(),
                next_ticket: 0,
                urgent: VecDeque::new(),
                normal: VecDeque::new(),
            }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state inconsistent (plain fields).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a grant. Cancel-safe: dropping the future gives the place up.
    pub(crate) async fn acquire(&self, priority: Priority) {
        let Some(interval) = self.interval else {
            // Unlimited, but a Retry-After pause still applies.
            let wait = self.lock().next_slot.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            return;
        };
        let mut ticket = {
            let mut s = self.lock();
            let id = s.next_ticket;
            s.next_ticket += 1;
            s.queue(priority).push_back(id);
            Ticket {
                gate: self,
                priority,
                id,
                armed: true,
            }
        };
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let sleep_for = {
                let mut s = self.lock();
                if s.is_head(priority, ticket.id) {
                    let now = Instant::now();
                    if now >= s.next_slot {
                        s.next_slot = now + interval;
                        s.queue(priority).pop_front();
                        ticket.armed = false;
                        drop(s);
                        self.changed.notify_waiters();
                        return;
                    }
                    Some(s.next_slot - now)
                } else {
                    None
                }
            };
            match sleep_for {
                Some(d) => {
                    tokio::select! {
                        () = tokio::time::sleep(d) => {}
                        () = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Like [`RateGate::acquire`], but only while `deadline()` is in the future: it is read
    /// again once the current deadline is reached (it may have been extended) and at every
    /// change `changes` reports (a fence's term ending), and if it is `None` or past, the waiter
    /// gives its place up and `false` is returned. `true`: granted.
    pub(crate) async fn acquire_until(
        &self,
        priority: Priority,
        deadline: impl Fn() -> Option<Instant>,
        mut changes: Option<watch::Receiver<Option<Lead>>>,
    ) -> bool {
        let acquire = self.acquire(priority);
        tokio::pin!(acquire);
        loop {
            let Some(until) = deadline().filter(|d| *d > Instant::now()) else {
                // Dropping `acquire` drops its ticket: the queue moves on without it.
                return false;
            };
            tokio::select! {
                biased;
                () = &mut acquire => return true,
                () = tokio::time::sleep_until(until) => {}
                () = changed(&mut changes) => {}
            }
        }
    }

    /// The earliest moment the next grant can happen (a `Retry-After` pause, or the spacing
    /// after the last grant); queued callers may push it further.
    pub(crate) fn next_grant(&self) -> Instant {
        self.lock().next_slot
    }

    /// Pauses every caller until `until` (a `Retry-After` from the API).
    pub(crate) fn defer(&self, until: Instant) {
        let mut s = self.lock();
        if until > s.next_slot {
            s.next_slot = until;
        }
        drop(s);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
