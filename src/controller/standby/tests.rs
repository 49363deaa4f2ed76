use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::Instant;

use super::*;

const AFTER: Duration = Duration::from_secs(3);

fn lease(holder: Option<&str>, rv: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(Into::into),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn a_renewing_leader_keeps_the_standby_dormant() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    for i in 0..100_u32 {
        let now = t0 + Duration::from_millis(500) * i;
        let v = version(Some(&lease(Some("baton-a"), &i.to_string())));
        assert!(!l.observe(v, now, AFTER), "renewed at read {i}");
    }
}

#[test]
fn a_lease_left_unrenewed_wakes_it_after_the_wait_on_its_own_clock() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    let v = || version(Some(&lease(Some("baton-a"), "7")));
    assert!(!l.observe(v(), t0, AFTER), "the first read starts the clock");
    assert!(!l.observe(v(), t0 + Duration::from_millis(2_999), AFTER));
    assert!(l.observe(v(), t0 + AFTER, AFTER));
}

#[test]
fn no_lease_or_no_holder_counts_as_nobody_leading_but_a_new_holder_resets() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    assert!(!l.observe(version(None), t0, AFTER));
    // Released (holder emptied) is the same "nobody": the clock keeps running.
    assert!(!l.observe(version(Some(&lease(Some(""), "3"))), t0 + Duration::from_secs(1), AFTER));
    assert!(!l.observe(version(Some(&lease(None, "4"))), t0 + Duration::from_secs(2), AFTER));
    // A Deployment replica takes it just in time: the clock starts again.
    assert!(!l.observe(
        version(Some(&lease(Some("baton-b"), "5"))),
        t0 + Duration::from_millis(2_900),
        AFTER
    ));
    assert!(!l.observe(version(Some(&lease(Some("baton-b"), "5"))), t0 + Duration::from_secs(5), AFTER));
    assert!(l.observe(version(Some(&lease(Some("baton-b"), "5"))), t0 + Duration::from_secs(6), AFTER));
}
