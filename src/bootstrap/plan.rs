//! The pure planner: the next step from the persistent facts and what this process observed.
//! A run killed at any instant plans again from the state file and continues where it stopped.

use std::time::Duration;

use super::state::{State, Step};

/// What this process has observed (not persisted: a rerun observes again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observations {
    /// Every endpoint's FIP is resolved in this process.
    pub fips_resolved: bool,
    /// DNS publishing runs in this process.
    pub dns_running: bool,
    /// The bootstrap API server answered `/readyz`.
    pub api_ready: bool,
    /// Now (Unix ms).
    pub now_ms: u64,
}

/// The next step, from the persistent facts and this process's observations.
pub fn next_step(state: &State, obs: &Observations, ttl: Duration) -> Step {
    if !obs.fips_resolved {
        return Step::ReserveFips;
    }
    if !obs.dns_running {
        return Step::PublishDns;
    }
    if state.completed_at.is_some() {
        return Step::Complete;
    }
    if let Some(dropped) = state.bootstrap_dropped_at {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        return if obs.now_ms >= dropped.saturating_add(ttl_ms) {
            Step::Complete
        } else {
            Step::Drain
        };
    }
    if state.services_ready_at.is_some() {
        return Step::DropBootstrap;
    }
    if state.handoff_applied_at.is_some() {
        return Step::WaitForServices;
    }
    if !obs.api_ready {
        return Step::WaitForApi;
    }
    Step::Handoff
}

#[cfg(test)]
mod tests;
