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
//!
//! An API that announces its bucket in `RateLimit-*` headers (Hetzner Cloud: 3,600 requests an
//! hour, refilled at one a second, bursts allowed) is followed too ([`RateGate::observe_budget`]):
//! the gate keeps an estimate of the requests left, refilled at the announced rate and set again
//! from every answer, and grants a normal call only while more than `reserve` are left, an urgent
//! one while any is. Normal work therefore slows to the refill rate before the bucket is empty,
//! and a failover still finds requests left.

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

/// The API's request bucket as last announced, and what was spent since.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// Requests left at `at`.
    left: f64,
    at: Instant,
    /// The bucket's size.
    limit: f64,
    /// Requests added per second.
    refill_per_s: f64,
    /// Left for urgent calls only.
    reserve: f64,
}

impl Budget {
    fn left_at(&self, now: Instant) -> f64 {
        (self.left + now.saturating_duration_since(self.at).as_secs_f64() * self.refill_per_s).min(self.limit)
    }

    /// How long a call of `priority` waits for the bucket; zero: it may go now.
    fn wait(&self, priority: Priority, now: Instant) -> Duration {
        let floor = match priority {
            Priority::Urgent => 0.0,
            Priority::Normal => self.reserve,
        };
        let missing = floor + 1.0 - self.left_at(now);
        if missing <= 0.0 {
            Duration::ZERO
        } else if self.refill_per_s > 0.0 {
            Duration::from_secs_f64(missing / self.refill_per_s)
        } else {
            Duration::from_secs(1)
        }
    }

    fn spend(&mut self, now: Instant) {
        self.left = self.left_at(now) - 1.0;
        self.at = now;
    }
}

#[derive(Debug)]
struct State {
    next_slot: Instant,
    budget: Option<Budget>,
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
                budget: None,
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
        let interval = match self.interval {
            Some(interval) => interval,
            None if self.lock().budget.is_none() => {
                // Unlimited, but a Retry-After pause still applies.
                let wait = self.lock().next_slot.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                return;
            }
            None => Duration::ZERO,
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
                    let for_budget = s.budget.map_or(Duration::ZERO, |b| b.wait(priority, now));
                    if now >= s.next_slot && for_budget.is_zero() {
                        s.next_slot = now + interval;
                        if let Some(budget) = s.budget.as_mut() {
                            budget.spend(now);
                        }
                        s.queue(priority).pop_front();
                        ticket.armed = false;
                        drop(s);
                        self.changed.notify_waiters();
                        return;
                    }
                    Some(s.next_slot.saturating_duration_since(now).max(for_budget))
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

    /// Follows the API's bucket from an answer's `RateLimit-*` headers: `limit` requests, `left`
    /// of them now, full again at Unix time `reset_unix` (`now_unix` is this machine's Unix time).
    /// Normal calls keep `reserve` requests for urgent ones. The refill rate is what the headers
    /// imply (`(limit - left) / (reset - now)`), one a second when they imply none.
    pub(crate) fn observe_budget(&self, limit: u64, left: u64, reset_unix: u64, now_unix: u64, reserve: u32) {
        #[allow(clippy::cast_precision_loss)] // request counts
        let (limit, left) = (limit as f64, left as f64);
        let refill_per_s = if reset_unix > now_unix && limit > left {
            #[allow(clippy::cast_precision_loss)]
            let secs = (reset_unix - now_unix) as f64;
            ((limit - left) / secs).max(0.01)
        } else {
            1.0
        };
        let mut s = self.lock();
        s.budget = Some(Budget {
            left,
            at: Instant::now(),
            limit,
            refill_per_s,
            reserve: f64::from(reserve).min(limit / 2.0),
        });
        drop(s);
        self.changed.notify_waiters();
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
