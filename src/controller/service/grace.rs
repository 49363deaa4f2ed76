//! When a Service FIP that is no longer wanted may be released: a public address, once released,
//! can go to another customer, so one signal (a deletion, a type change, an annotation typo) only
//! starts a hold; the FIP is released when it has been unwanted for the grace period.
//!
//! ```text
//!  Service deleted / no longer a managed LoadBalancer / asks for another address / orphan found
//!      │  grace_for(annotations, setting)   the Service's own baton.dev/fip-release-grace-period wins
//!      ▼
//!  Holds::unwanted(fip, now, grace) ──► Release (grace over, or 0)  |  Keep { until }
//!      ▲                                                                   │ timer (next_due)
//!      │ Holds::wanted(fip): its Service came back (re-created, type back)  ▼
//!      └──────────────────────────────────────────────── due(now) ─► still_unwanted()? ─► release
//! ```
//!
//! Holds live in the leader's memory. A new leader starts its own holds when it first sees the
//! FIP unwanted (its reconciles, the orphan sweep at start): a grace period can only get longer
//! across a change of leader, never shorter.
//!
//! No I/O here: everything is a function of plain values, unit-tested in `tests.rs`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use baton_core::LoadBalancerMode;
use baton_core::duration::parse_duration;
use tokio::time::Instant;

use super::plan::{InvalidField, Record, Scope, ServiceFacts, requested_ip, scope};

/// A Service's own grace period (a duration: `30s`, `10m`, or `0` to release at once when the
/// Service goes), overriding the `fipReleaseGracePeriod` setting.
pub const GRACE_ANNOTATION: &str = "baton.dev/fip-release-grace-period";

/// The grace period of a Service's FIP: its [`GRACE_ANNOTATION`], else `default`. A value that is
/// not a duration is an error naming the annotation (the caller warns and keeps `default`: a typo
/// never shortens the wait).
pub fn grace_for(
    annotations: &BTreeMap<String, String>,
    default: Duration,
) -> Result<Duration, InvalidField> {
    match annotations.get(GRACE_ANNOTATION) {
        None => Ok(default),
        Some(v) => parse_duration(v.trim()).map_err(|e| InvalidField {
            field: GRACE_ANNOTATION.to_owned(),
            value: v.clone(),
            reason: format!("not a duration ({e}); the grace period of the setting applies"),
        }),
    }
}

/// What to do with an unwanted FIP now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its grace period is over (or zero): release it.
    Release,
    /// Keep it until then.
    Keep {
        /// When its grace period ends.
        until: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    since: Instant,
    grace: Duration,
}

impl Hold {
    fn until(self) -> Instant {
        self.since + self.grace
    }
}

/// The FIPs (by id) seen unwanted, each since when and with which grace period.
#[derive(Debug, Default)]
pub struct Holds {
    held: HashMap<String, Hold>,
    /// Held FIPs whose delete is on its way (a reconcile's): not due for another one.
    releasing: std::collections::HashSet<String>,
}

impl Holds {
    /// `fip` is unwanted at `now`. The hold starts the first time; a later call keeps its start
    /// and takes the newer `grace` (a Service annotated `0` after its deletion started releases
    /// at once).
    pub fn unwanted(&mut self, fip: &str, now: Instant, grace: Duration) -> Verdict {
        let hold = self
            .held
            .entry(fip.to_owned())
            .and_modify(|h| h.grace = grace)
            .or_insert(Hold { since: now, grace });
        if now >= hold.until() {
            Verdict::Release
        } else {
            Verdict::Keep { until: hold.until() }
        }
    }

    /// `fip` is wanted again (its Service is back): its hold ends. Returns whether it was held.
    pub fn wanted(&mut self, fip: &str) -> bool {
        self.releasing.remove(fip);
        self.held.remove(fip).is_some()
    }

    /// `fip`'s delete is on its way: until it ends ([`Holds::wanted`]) it is not [`Holds::due`],
    /// so the release loop does not send a second one (a delete may wait long in the rate limit).
    pub fn releasing(&mut self, fip: &str) {
        self.releasing.insert(fip.to_owned());
    }

    /// `fip`'s delete failed: it is held as before (due again for the release loop).
    pub fn release_failed(&mut self, fip: &str) {
        self.releasing.remove(fip);
    }

    /// Whether `fip` is held, its grace period over at `now`, and no delete of it on its way.
    pub fn is_due(&self, fip: &str, now: Instant) -> bool {
        self.held.get(fip).is_some_and(|h| now >= h.until()) && !self.releasing.contains(fip)
    }

    /// Whether `fip` is held.
    pub fn is_held(&self, fip: &str) -> bool {
        self.held.contains_key(fip)
    }

    /// The held FIPs whose grace period is over at `now`, in id order.
    pub fn due(&self, now: Instant) -> Vec<String> {
        let mut due: Vec<String> = self
            .held
            .iter()
            .filter(|(id, h)| now >= h.until() && !self.releasing.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        due.sort();
        due
    }

    /// When the next grace period ends.
    pub fn next_due(&self) -> Option<Instant> {
        self.held.values().map(|h| h.until()).min()
    }

    /// How many FIPs are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// Whether the FIP at `address`, made for the Service `svc` now shows (`None`: the Service is
/// gone), is still unwanted when its grace period ends: the Service is gone, being deleted, no
/// longer a managed LoadBalancer (`mode` unset: nothing is managed), or asks for another
/// address. A Service whose IP annotation cannot be parsed keeps its FIP (a typo is no request
/// for another address).
pub fn still_unwanted(
    svc: Option<&ServiceFacts>,
    address: IpAddr,
    mode: Option<&LoadBalancerMode>,
    mirror: (&str, &str),
) -> bool {
    let Some(svc) = svc else { return true };
    if svc.deleting {
        return true;
    }
    let Some(mode) = mode else { return false };
    if scope(svc, mirror) != Scope::Managed {
        return true;
    }
    match requested_ip(svc, mode) {
        // The address baton recorded (its earlier FIP) is baton's own, as `decide` reads it.
        Ok(Some(ip)) => ip != address && Record::read(svc).and_then(|r| r.address) != Some(ip),
        Ok(None) | Err(_) => false,
    }
}

#[cfg(test)]
mod tests;
