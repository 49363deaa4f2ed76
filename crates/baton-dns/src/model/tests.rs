use std::net::IpAddr;

use super::{NameRecords, RecordStore};
use crate::DnsName;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn api() -> DnsName {
    "api.c1.example.com".parse().unwrap()
}

#[test]
fn served_filters_unhealthy_but_never_serves_nothing() {
    let r = NameRecords::new([(ip("192.0.2.1"), true), (ip("203.0.113.5"), false)]);
    assert_eq!(r.served(), vec![ip("192.0.2.1")]);
    let none_healthy = NameRecords::new([(ip("192.0.2.1"), false), (ip("203.0.113.5"), false)]);
    assert_eq!(none_healthy.served(), vec![ip("192.0.2.1"), ip("203.0.113.5")]);
}

#[test]
fn duplicates_keep_first_position_and_last_flag() {
    let r = NameRecords::new([
        (ip("192.0.2.1"), true),
        (ip("192.0.2.2"), true),
        (ip("192.0.2.1"), false),
    ]);
    assert_eq!(r.addresses().len(), 2);
    assert_eq!(r.addresses()[0].ip, ip("192.0.2.1"));
    assert!(!r.addresses()[0].healthy);
}

#[test]
fn families_split() {
    let r = NameRecords::new([(ip("192.0.2.1"), true), (ip("2001:db8::1"), true)]);
    assert_eq!(r.served_v4(), vec![ip("192.0.2.1")]);
    assert_eq!(r.served_v6(), vec![ip("2001:db8::1")]);
}

#[test]
fn store_changes_bump_generation_only_when_something_changed() {
    let store = RecordStore::new();
    assert_eq!(store.snapshot().generation, 0);
    assert!(store.set_name(api(), [(ip("192.0.2.1"), true), (ip("203.0.113.5"), true)]));
    assert_eq!(store.snapshot().generation, 1);
    assert!(!store.set_name(api(), [(ip("192.0.2.1"), true), (ip("203.0.113.5"), true)]));
    assert_eq!(store.snapshot().generation, 1);

    assert!(store.set_health(&api(), ip("192.0.2.1"), false));
    assert!(!store.set_health(&api(), ip("192.0.2.1"), false));
    assert!(!store.set_health(&api(), ip("198.51.100.9"), false));
    assert_eq!(
        store.snapshot().get(&api()).unwrap().served(),
        vec![ip("203.0.113.5")]
    );

    assert!(store.remove_address(&api(), ip("192.0.2.1")));
    assert!(!store.remove_address(&api(), ip("192.0.2.1")));
    assert!(store.remove_address(&api(), ip("203.0.113.5")));
    assert!(store.snapshot().get(&api()).is_none(), "empty names disappear");
    assert_eq!(store.snapshot().generation, 4);
}

#[test]
fn set_name_with_nothing_removes_the_name() {
    let store = RecordStore::new();
    store.set_name(api(), [(ip("192.0.2.1"), true)]);
    assert!(store.set_name(api(), []));
    assert!(store.snapshot().is_empty());
}

#[test]
fn subscribers_see_each_change_whole() {
    let store = RecordStore::new();
    let mut rx = store.subscribe();
    store.set_name(api(), [(ip("192.0.2.1"), true), (ip("203.0.113.5"), true)]);
    assert!(rx.has_changed().unwrap());
    let snap = rx.borrow_and_update().clone();
    assert_eq!(snap.get(&api()).unwrap().addresses().len(), 2);
    assert!(!rx.has_changed().unwrap());
}
