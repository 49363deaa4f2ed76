use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

/// The FIP table ConfigMap with these rows (FIP, holder).
fn table(rows: &[(&str, &str)]) -> ConfigMap {
    let rows: Vec<_> = rows
        .iter()
        .map(|(a, h)| json!({"address": a, "holder": h}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": "kube-system", "name": "baton-control-plane-fips"},
        "data": {"fips.json": json!({"fips": rows}).to_string()},
    }))
    .unwrap()
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn the_index_follows_lists_and_applies() {
    let mut index = Index::default();
    // The first list: nothing counts before InitDone; a list without the table is none yet
    // (the kernel's state at the start stays).
    assert!(!index.apply(Event::Init));
    assert!(index.apply(Event::InitDone));
    assert_eq!(index.fips(), None);

    assert!(index.apply(Event::Apply(table(&[("203.0.113.10", "198.51.100.11")]))));
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.10"]));
    let fip: IpAddr = "203.0.113.10".parse().unwrap();
    assert_eq!(index.fips().unwrap().holders[&fip], ips(&["198.51.100.11"]));
    // The leader moved it.
    index.apply(Event::Apply(table(&[("203.0.113.10", "198.51.100.12")])));
    assert_eq!(index.fips().unwrap().holders[&fip], ips(&["198.51.100.12"]));

    // A relist (after a watch error): the old table serves until the relist is complete.
    index.apply(Event::Init);
    index.apply(Event::InitApply(table(&[("203.0.113.13", "198.51.100.12")])));
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.10"]));
    index.apply(Event::InitDone);
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.13"]));
}

#[test]
fn a_deleted_table_keeps_the_fips_until_it_is_written_again() {
    let mut index = Index::default();
    index.apply(Event::Init);
    index.apply(Event::InitApply(table(&[("203.0.113.10", "198.51.100.11")])));
    index.apply(Event::InitDone);
    assert!(!index.apply(Event::Delete(table(&[("203.0.113.10", "198.51.100.11")]))));
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.10"]));
    // Also when a relist (after the watch failed) no longer shows it.
    index.apply(Event::Init);
    index.apply(Event::InitDone);
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.10"]));
}

#[test]
fn a_table_that_cannot_be_read_keeps_the_fips_and_is_a_problem() {
    let mut index = Index::default();
    index.apply(Event::Apply(table(&[("203.0.113.10", "198.51.100.11")])));
    let mut bad = table(&[]);
    bad.data = Some([("fips.json".to_owned(), "nonsense".to_owned())].into());
    index.apply(Event::Apply(bad));
    assert_eq!(
        index.fips().unwrap().fips,
        ips(&["203.0.113.10"]),
        "a garbled write drops no FIP"
    );
    assert!(index.fips().unwrap().problems.is_empty());
    assert_eq!(index.problems().len(), 1);
    // The next good write replaces it.
    index.apply(Event::Apply(table(&[("203.0.113.11", "198.51.100.11")])));
    assert_eq!(index.fips().unwrap().fips, ips(&["203.0.113.11"]));
    assert!(index.problems().is_empty());
}

#[test]
fn the_watch_status_says_why_it_is_not_ready() {
    let status = WatchStatus::default();
    assert_eq!(
        status.not_ready().as_deref(),
        Some("the FIP table not listed yet")
    );
    status.set(|s| s.listed = true);
    assert_eq!(status.not_ready(), None);
    status.set(|s| s.error = Some("connection refused".into()));
    assert_eq!(
        status.not_ready().as_deref(),
        Some("watching the FIP table: connection refused")
    );
}
