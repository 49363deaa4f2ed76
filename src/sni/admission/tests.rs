use std::net::IpAddr;

use rstest::rstest;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[rstest]
#[case("192.0.2.1", "192.0.2.1", true)]
#[case("192.0.2.1", "192.0.2.2", false)]
#[case("2001:db8:1:2::1", "2001:db8:1:2:ffff::9", true)] // one /64
#[case("2001:db8:1:2::1", "2001:db8:1:3::1", false)]
#[case("::ffff:192.0.2.1", "192.0.2.1", true)] // IPv4-mapped is the IPv4 address
fn sources_are_ipv4_addresses_and_ipv6_slash_64s(#[case] a: &str, #[case] b: &str, #[case] same: bool) {
    assert_eq!(Source::of(ip(a)) == Source::of(ip(b)), same);
}

fn caps(per_source: usize, pending_per_source: usize) -> Caps {
    Caps {
        per_source,
        pending_per_source,
        ..Caps::default()
    }
}

#[test]
fn a_source_gets_at_most_its_pending_and_its_open_connections() {
    let sources = Sources::new(caps(3, 2));
    let a = ip("198.51.100.7");
    let mut first = sources.admit(a).unwrap();
    let second = sources.admit(a).unwrap();
    assert_eq!(sources.admit(a).unwrap_err(), Refusal::SourcePending);
    // Another source is not affected.
    let _other = sources.admit(ip("198.51.100.8")).unwrap();
    // Routed, the first no longer counts as pending: a third may come, not a fourth.
    first.routed();
    first.routed(); // twice is once
    let third = sources.admit(a).unwrap();
    assert_eq!(sources.count(a), (3, 2));
    assert_eq!(sources.admit(a).unwrap_err(), Refusal::SourceOpen);
    drop(third);
    drop(first);
    assert_eq!(sources.count(a), (1, 1));
    drop(second);
    assert_eq!(sources.count(a), (0, 0));
    assert_eq!(sources.len(), 1, "a source with nothing open is forgotten");
}

#[test]
fn a_full_pending_queue_evicts_its_oldest_connection() {
    let pending = Pending::new(3, 1 << 20);
    let (oldest, e0) = pending.enter();
    let (second, _) = pending.enter();
    let (third, _) = pending.enter();
    assert_eq!(e0, 0);
    assert_eq!(pending.load().0, 3);
    let (fourth, evicted) = pending.enter();
    assert_eq!(evicted, 1);
    assert!(oldest.is_evicted() && !second.is_evicted() && !third.is_evicted());
    assert_eq!(pending.load().0, 3);
    // A connection that was routed (its slot dropped) is not evicted: the next oldest live one is.
    drop(second);
    assert_eq!(pending.load().0, 2);
    let (_fifth, evicted) = pending.enter();
    assert_eq!(evicted, 0, "room was made by the routed one");
    let (_sixth, evicted) = pending.enter();
    assert_eq!(evicted, 1);
    assert!(third.is_evicted() && !fourth.is_evicted());
    // Dropping an evicted slot does not count it out twice.
    drop(oldest);
    drop(third);
    assert_eq!(pending.load().0, 3);
}

#[test]
fn bytes_over_the_cap_evict_the_oldest_first_even_the_holder_itself() {
    let pending = Pending::new(100, 1000);
    let (a, _) = pending.enter();
    let (b, _) = pending.enter();
    assert_eq!(a.hold(600), 0);
    assert_eq!(b.hold(300), 0);
    assert_eq!(pending.load(), (2, 900));
    // b takes 200 more: 1100 > 1000, a (the oldest) goes and its bytes with it.
    assert_eq!(b.hold(200), 1);
    assert!(a.is_evicted());
    assert_eq!(pending.load(), (1, 500));
    // Alone and over the cap, b evicts itself.
    assert_eq!(b.hold(600), 1);
    assert!(b.is_evicted());
    assert_eq!(pending.load(), (0, 0));
    assert_eq!(b.hold(10), 0, "an evicted connection holds nothing more");
    drop(b);
    drop(a);
    assert_eq!(pending.load(), (0, 0));
}

#[tokio::test]
async fn an_evicted_connection_is_told_even_if_it_waits_after_the_fact() {
    let pending = Pending::new(1, 1 << 20);
    let (first, _) = pending.enter();
    let (_second, evicted) = pending.enter();
    assert_eq!(evicted, 1);
    tokio::time::timeout(std::time::Duration::from_secs(1), first.evicted())
        .await
        .expect("the eviction wakes the connection");
}

#[test]
fn the_queue_of_finished_connections_is_compacted() {
    let pending = Pending::new(10, 1 << 20);
    for _ in 0..1000 {
        let (slot, _) = pending.enter();
        drop(slot);
    }
    let q = pending.queue.lock().unwrap();
    assert!(q.order.len() <= 65, "{}", q.order.len());
    assert_eq!(q.live, 0);
}
