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
        assert!(!l.observe(v, None, now, AFTER), "renewed at read {i}");
    }
}

#[test]
fn a_lease_left_unrenewed_wakes_it_after_the_wait_on_its_own_clock() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    let v = || version(Some(&lease(Some("baton-a"), "7")));
    assert!(
        !l.observe(v(), None, t0, AFTER),
        "the first read starts the clock"
    );
    assert!(!l.observe(v(), None, t0 + Duration::from_millis(2_999), AFTER));
    assert!(l.observe(v(), None, t0 + AFTER, AFTER));
}

#[test]
fn no_lease_or_no_holder_counts_as_nobody_leading_but_a_new_holder_resets() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    assert!(!l.observe(version(None), None, t0, AFTER));
    // Released (holder emptied) is the same "nobody": the clock keeps running.
    assert!(!l.observe(
        version(Some(&lease(Some(""), "3"))),
        None,
        t0 + Duration::from_secs(1),
        AFTER
    ));
    assert!(!l.observe(
        version(Some(&lease(None, "4"))),
        None,
        t0 + Duration::from_secs(2),
        AFTER
    ));
    // A Deployment replica takes it just in time: the clock starts again.
    assert!(!l.observe(
        version(Some(&lease(Some("baton-b"), "5"))),
        None,
        t0 + Duration::from_millis(2_900),
        AFTER
    ));
    assert!(!l.observe(
        version(Some(&lease(Some("baton-b"), "5"))),
        None,
        t0 + Duration::from_secs(5),
        AFTER
    ));
    assert!(l.observe(
        version(Some(&lease(Some("baton-b"), "5"))),
        None,
        t0 + Duration::from_secs(6),
        AFTER
    ));
}

#[test]
fn a_lease_that_expired_long_ago_wakes_it_at_the_first_read() {
    let t0 = Instant::now();
    let mut l = Leaderless::default();
    let v = || version(Some(&lease(Some("baton-a"), "7")));
    // Found after a power loss: renewed a minute ago, 1 s duration.
    assert!(l.observe(v(), Some(Duration::from_secs(59)), t0, AFTER));
    // Expired a moment ago only (a normal failover): the own-clock wait applies.
    let mut l = Leaderless::default();
    assert!(!l.observe(v(), Some(Duration::from_millis(500)), t0, AFTER));
    // No holder (released): the own-clock wait applies, whatever the stamps say.
    let mut l = Leaderless::default();
    assert!(!l.observe(version(None), Some(Duration::from_secs(59)), t0, AFTER));
}

#[test]
fn expiry_is_read_from_renew_time_and_duration() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let now = std::time::SystemTime::now();
    let renewed = k8s_openapi::jiff::Timestamp::try_from(now - Duration::from_secs(10)).unwrap();
    let mut l = lease(Some("baton-a"), "7");
    let spec = l.spec.as_mut().unwrap();
    spec.renew_time = Some(MicroTime(renewed));
    spec.lease_duration_seconds = Some(2);
    let e = expired_for(Some(&l), now).unwrap();
    assert!(
        e >= Duration::from_secs(7) && e <= Duration::from_secs(9),
        "{e:?}"
    );
    spec_still_valid(&mut l, now);
}

fn spec_still_valid(l: &mut Lease, now: std::time::SystemTime) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let renewed = k8s_openapi::jiff::Timestamp::try_from(now).unwrap();
    l.spec.as_mut().unwrap().renew_time = Some(MicroTime(renewed));
    assert_eq!(expired_for(Some(l), now), None, "not expired yet");
}

/// A gate fed by hand: this replica's term (`lead`) and another holder's (`handover`).
fn gate() -> (
    super::super::LeaderGate,
    tokio::sync::watch::Sender<Option<baton_cloud::Lead>>,
    tokio::sync::watch::Sender<Option<super::super::context::Handover>>,
) {
    let (lead, rx) = tokio::sync::watch::channel(None);
    let (handover, hrx) = tokio::sync::watch::channel(None);
    (super::super::LeaderGate::new(rx, hrx), lead, handover)
}

fn held_elsewhere() -> super::super::context::Handover {
    let now = Instant::now();
    super::super::context::Handover {
        holder_stopped: now + Duration::from_secs(1),
        takeover: now + Duration::from_secs(2),
    }
}

#[tokio::test(start_paused = true)]
async fn an_active_standby_rests_after_following_another_leader_for_the_wait() {
    let (g, _lead, handover) = gate();
    handover.send_replace(Some(held_elsewhere()));
    let round = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(rest_when_led_elsewhere(g, Duration::from_secs(60), round.clone()));
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(!round.is_cancelled(), "still within the wait");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(round.is_cancelled(), "a minute of following ends the round");
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_leading_or_leaderless_standby_does_not_rest() {
    let (g, lead, handover) = gate();
    let round = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(rest_when_led_elsewhere(g, Duration::from_secs(60), round.clone()));
    // Nobody holds the Lease: this replica will contend, it must stay.
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(!round.is_cancelled(), "no other leader");
    // Another replica leads for 40 s, then this one takes over: the clock starts again.
    handover.send_replace(Some(held_elsewhere()));
    tokio::time::sleep(Duration::from_secs(40)).await;
    handover.send_replace(None);
    lead.send_replace(Some(baton_cloud::Lead {
        term: 1,
        until: Instant::now() + Duration::from_secs(3600),
    }));
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(!round.is_cancelled(), "leading: it stays active");
    round.cancel();
    task.await.unwrap();
}
