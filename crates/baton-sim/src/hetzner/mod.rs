//! The Hetzner Cloud dialect (`baton sim --cloud hetzner`): the Floating IP, action, server and
//! location routes of `api.hetzner.cloud/v1`, over the same topology, faults, latency, stats,
//! state file and FIP routing as the Cherry dialect.
//!
//! ```text
//!  client ─HTTP─► faults layer ─► token bucket (RateLimit-* on every answer; 429 when empty)
//!                      │            └► latency / hang / injected 5xx as Hetzner error JSON
//!                      ▼
//!                 http::dispatch ─► HetznerWorld (labels::Selector filters, pages of ≤ 50)
//!                      │ assign / unassign: a running action
//!                      ▼
//!                 timer (action_ms) ─► complete(): success moves the FIP ─► FipPaths (routes)
//! ```
//!
//! Pure parts: [`labels`] (label rules and selectors) and [`bucket`] (the rate limit) are tested
//! without HTTP; [`world`] holds the state and API semantics; [`http`] is the wire.

pub(crate) mod bucket;
pub(crate) mod http;
pub(crate) mod labels;
pub(crate) mod world;

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::latency::Latency;

/// What an assign of a Floating IP that is assigned to another server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reassign {
    /// It moves the FIP, as one call (what baton's client does).
    #[default]
    Direct,
    /// 422 `floating_ip_assigned`: the client must unassign first (what users of
    /// hcloud-fip-controller found more reliable, its issue #36).
    Refuse,
}

impl fmt::Display for Reassign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Direct => "direct",
            Self::Refuse => "refuse",
        })
    }
}

impl FromStr for Reassign {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "direct" => Ok(Self::Direct),
            "refuse" => Ok(Self::Refuse),
            other => Err(format!("{other:?} is not direct or refuse")),
        }
    }
}

/// The Hetzner dialect's own settings (the faults of both dialects are [`crate::Faults`]);
/// changed at run time through `PATCH /_sim/hetzner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HetznerSettings {
    /// How long an assign or unassign action runs before it ends (a [`Latency`] spec; 500 ms
    /// by default; 0: it has ended when the API answers).
    pub action_ms: Latency,
    /// Fraction (0..=1) of assign/unassign actions that end in `error` (`action_failed`),
    /// leaving the Floating IP where it was.
    pub action_error_rate: f64,
    /// Servers (by name or id) every assign action to which ends in `error`: a failure that
    /// hits one server only, e.g. for a client's check of failed actions among good ones.
    pub action_fail_servers: Vec<String>,
    /// An assign of a FIP assigned to another server: moves it or is refused.
    pub reassign: Reassign,
    /// Requests in each token's bucket (3,600, as Hetzner's per-project limit); 0: no limit.
    pub bucket: u64,
    /// Requests added to a bucket per second (1); 0: no limit.
    pub refill_per_s: f64,
}

impl Default for HetznerSettings {
    fn default() -> Self {
        Self {
            action_ms: Latency::Fixed(500),
            action_error_rate: 0.0,
            action_fail_servers: Vec::new(),
            reassign: Reassign::Direct,
            bucket: 3_600,
            refill_per_s: 1.0,
        }
    }
}

impl HetznerSettings {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.action_error_rate) {
            return Err(format!(
                "action_error_rate must be within 0..=1, got {}",
                self.action_error_rate
            ));
        }
        if !(self.refill_per_s.is_finite() && self.refill_per_s >= 0.0) {
            return Err(format!("refill_per_s must be ≥ 0, got {}", self.refill_per_s));
        }
        self.action_ms.validate().map_err(|e| format!("action_ms: {e}"))
    }

    /// Whether assign actions to this server always fail.
    fn fails_on(&self, id: u64, name: Option<&str>) -> bool {
        self.action_fail_servers
            .iter()
            .any(|s| Some(s.as_str()) == name || s.parse() == Ok(id))
    }

    fn limit(&self) -> bucket::Limit {
        bucket::Limit {
            size: self.bucket,
            refill_per_s: self.refill_per_s,
        }
    }
}

/// What a running Hetzner dialect holds besides its world: its settings and the rate-limit
/// buckets.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) settings: Mutex<HetznerSettings>,
    pub(crate) buckets: Mutex<bucket::Buckets>,
}

impl Runtime {
    pub(crate) fn new(settings: HetznerSettings) -> Self {
        Self {
            settings: Mutex::new(settings),
            buckets: Mutex::new(bucket::Buckets::default()),
        }
    }
}
