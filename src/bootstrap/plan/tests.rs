use std::time::Duration;

use super::{Observations, next_step};
use crate::bootstrap::state::{State, Step};

const TTL: Duration = Duration::from_secs(30);

fn obs(fips: bool, dns: bool, api: bool, now_ms: u64) -> Observations {
    Observations {
        fips_resolved: fips,
        dns_running: dns,
        api_ready: api,
        now_ms,
    }
}

#[test]
fn a_fresh_run_walks_every_step_in_order() {
    let mut s = State::new("c1");
    assert_eq!(
        next_step(&s, &obs(false, false, false, 0), TTL),
        Step::ReserveFips
    );
    assert_eq!(next_step(&s, &obs(true, false, false, 0), TTL), Step::PublishDns);
    assert_eq!(next_step(&s, &obs(true, true, false, 0), TTL), Step::WaitForApi);
    assert_eq!(next_step(&s, &obs(true, true, true, 0), TTL), Step::Handoff);
    s.handoff_applied_at = Some(1);
    assert_eq!(
        next_step(&s, &obs(true, true, true, 0), TTL),
        Step::WaitForServices
    );
    s.services_ready_at = Some(2);
    assert_eq!(next_step(&s, &obs(true, true, true, 0), TTL), Step::DropBootstrap);
    s.bootstrap_dropped_at = Some(10_000);
    assert_eq!(next_step(&s, &obs(true, true, true, 39_999), TTL), Step::Drain);
    assert_eq!(next_step(&s, &obs(true, true, true, 40_000), TTL), Step::Complete);
    s.completed_at = Some(40_000);
    assert_eq!(next_step(&s, &obs(true, true, true, 0), TTL), Step::Complete);
}

#[test]
fn a_rerun_resolves_fips_and_republishes_dns_before_anything_else() {
    // A killed run left facts behind; the new process has observed nothing yet.
    let mut s = State::new("c1");
    s.handoff_applied_at = Some(1);
    s.services_ready_at = Some(2);
    s.bootstrap_dropped_at = Some(3);
    s.completed_at = Some(4);
    assert_eq!(
        next_step(&s, &obs(false, false, false, 5), TTL),
        Step::ReserveFips
    );
    assert_eq!(next_step(&s, &obs(true, false, false, 5), TTL), Step::PublishDns);
    // … and then continues where it stopped, without waiting for the API again.
    assert_eq!(next_step(&s, &obs(true, true, false, 5), TTL), Step::Complete);
    s.completed_at = None;
    assert_eq!(next_step(&s, &obs(true, true, false, 5), TTL), Step::Drain);
    s.bootstrap_dropped_at = None;
    assert_eq!(
        next_step(&s, &obs(true, true, false, 5), TTL),
        Step::DropBootstrap
    );
    s.services_ready_at = None;
    assert_eq!(
        next_step(&s, &obs(true, true, false, 5), TTL),
        Step::WaitForServices
    );
}
