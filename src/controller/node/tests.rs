//! Table tests of the node controller's pure decisions.

use rstest::rstest;

use k8s_openapi::api::core::v1::NodeAddress;

use super::*;

fn server() -> ServerFacts {
    ServerFacts {
        id: 600_101,
        hostname: "cp-0".into(),
        state: "active".into(),
        plan: Some("amd-ryzen-9950x".into()),
        region: Some("LT-Siauliai".into()),
        public: vec!["198.51.100.11".parse().unwrap()],
        private: vec!["192.0.2.11".parse().unwrap()],
    }
}

fn pairs(addresses: &[NodeAddress]) -> Vec<(String, String)> {
    addresses
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect()
}

fn want(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(t, a)| ((*t).to_owned(), (*a).to_owned()))
        .collect()
}

#[test]
fn addresses_from_the_cloud() {
    assert_eq!(
        pairs(&cloud_addresses("node-a", &server())),
        want(&[
            ("Hostname", "cp-0"),
            ("ExternalIP", "198.51.100.11"),
            ("InternalIP", "192.0.2.11")
        ])
    );
    let unnamed = ServerFacts {
        hostname: String::new(),
        ..server()
    };
    assert_eq!(cloud_addresses("node-a", &unnamed)[0].address, "node-a");
}

#[rstest]
#[case::internal("192.0.2.11", Ok(vec![("InternalIP", "192.0.2.11"), ("Hostname", "cp-0"), ("ExternalIP", "198.51.100.11")]))]
#[case::external(" 198.51.100.11 ", Ok(vec![("ExternalIP", "198.51.100.11"), ("Hostname", "cp-0"), ("InternalIP", "192.0.2.11")]))]
#[case::unknown("10.9.9.9", Err("10.9.9.9"))]
#[case::invalid("eth0", Err("\"eth0\""))]
#[case::empty("", Err("\"\""))]
fn node_ip(#[case] provided: &str, #[case] expected: Result<Vec<(&str, &str)>, &str>) {
    let got = honour_node_ip(provided, cloud_addresses("n", &server()));
    match (got, expected) {
        (Ok(got), Ok(w)) => assert_eq!(pairs(&got), want(&w)),
        (Err(e), Err(needle)) => {
            let text = e.to_string();
            assert!(text.contains(needle), "{text}");
            assert!(text.contains(PROVIDED_NODE_IP_ANNOTATION), "{text}");
        }
        (got, w) => panic!("got {got:?}, want {w:?}"),
    }
}

#[test]
fn node_ip_drops_other_addresses_of_its_type() {
    let two = ServerFacts {
        private: vec!["192.0.2.11".parse().unwrap(), "192.0.2.99".parse().unwrap()],
        ..server()
    };
    let got = honour_node_ip("192.0.2.99", cloud_addresses("n", &two)).unwrap();
    assert_eq!(
        pairs(&got),
        want(&[
            ("InternalIP", "192.0.2.99"),
            ("Hostname", "cp-0"),
            ("ExternalIP", "198.51.100.11")
        ])
    );
}

#[test]
fn labels_from_plan_and_region() {
    let labels = cloud_labels(&server());
    assert_eq!(labels[INSTANCE_TYPE_LABEL], "amd-ryzen-9950x");
    assert_eq!(labels[REGION_LABEL], "LT-Siauliai");
    assert_eq!(labels[LEGACY_REGION_LABEL], "LT-Siauliai");
    let bare = ServerFacts {
        plan: None,
        region: None,
        ..server()
    };
    assert!(cloud_labels(&bare).is_empty());
}

fn node(provider_id: Option<&str>, taints: &[&str]) -> NodeFacts {
    NodeFacts {
        name: "cp-0".into(),
        provider_id: provider_id.map(str::to_owned),
        taints: taints.iter().map(|t| (*t).to_owned()).collect(),
        ..NodeFacts::default()
    }
}

#[rstest]
#[case::by_id(Some("cherryservers://600101"), Ok(ServerRef::Id(ProviderId::from(600_101))))]
#[case::bare_id(Some("600101"), Ok(ServerRef::Id(ProviderId::from(600_101))))]
#[case::by_hostname(None, Ok(ServerRef::Hostname("cp-0".into())))]
#[case::blank(Some(""), Ok(ServerRef::Hostname("cp-0".into())))]
#[case::other(Some("aws:///x/i-1"), Err(()))]
fn server_ref_table(#[case] provider_id: Option<&str>, #[case] want: Result<ServerRef, ()>) {
    assert_eq!(server_ref(&node(provider_id, &[])).map_err(|_| ()), want);
}

#[rstest]
#[case::gone(&[], None, Lifecycle::Delete)]
#[case::active(&[], Some("active"), Lifecycle::Keep)]
#[case::shut_down(&[], Some("inactive"), Lifecycle::MarkShutdown)]
#[case::still_shut_down(&[SHUTDOWN_TAINT], Some("inactive"), Lifecycle::Keep)]
#[case::back(&[SHUTDOWN_TAINT], Some("active"), Lifecycle::ClearShutdown)]
fn lifecycle_table(#[case] taints: &[&str], #[case] state: Option<&str>, #[case] want: Lifecycle) {
    let server = state.map(|s| ServerFacts {
        state: s.into(),
        ..server()
    });
    assert_eq!(lifecycle(&node(Some("600101"), taints), server.as_ref()), want);
}

#[test]
fn uninitialized_taint() {
    assert!(node(None, &[UNINITIALIZED_TAINT]).uninitialized());
    assert!(!node(None, &["other"]).uninitialized());
}

#[rstest]
#[case::list_failed(None, &[600_102], Sighting::Unreadable)]
#[case::listed(Some(&[600_101, 600_102][..]), &[600_102], Sighting::Present)]
#[case::gone(Some(&[600_102, 600_103][..]), &[600_102], Sighting::Gone)]
#[case::another_project(Some(&[700_001][..]), &[600_102], Sighting::Unreadable)]
#[case::empty_project(Some(&[][..]), &[600_102], Sighting::Unreadable)]
#[case::no_other_node(Some(&[600_102][..]), &[], Sighting::Unreadable)]
fn what_a_404_means(#[case] listed: Option<&[u64]>, #[case] others: &[u64], #[case] want: Sighting) {
    let others: std::collections::BTreeSet<u64> = others.iter().copied().collect();
    assert_eq!(sighting(listed, 600_101, &others), want);
}

#[tokio::test(start_paused = true)]
async fn a_node_is_deleted_only_after_three_agreeing_reads_across_a_minute() {
    use tokio::time::{Duration, Instant, advance};
    let mut reads = GoneReads::default();
    assert_eq!(
        reads.observe(Sighting::Gone, Instant::now()),
        GoneVerdict::Wait { reads: 1 }
    );
    advance(Duration::from_secs(20)).await;
    assert_eq!(
        reads.observe(Sighting::Gone, Instant::now()),
        GoneVerdict::Wait { reads: 2 }
    );
    advance(Duration::from_secs(20)).await;
    // Three reads, but only 40 s apart.
    assert_eq!(
        reads.observe(Sighting::Gone, Instant::now()),
        GoneVerdict::Wait { reads: 3 }
    );
    advance(Duration::from_secs(20)).await;
    assert_eq!(reads.observe(Sighting::Gone, Instant::now()), GoneVerdict::Delete);
}

#[tokio::test(start_paused = true)]
async fn any_other_sighting_starts_the_count_again() {
    use tokio::time::{Duration, Instant, advance};
    for interruption in [Sighting::Present, Sighting::Unreadable] {
        let mut reads = GoneReads::default();
        for _ in 0..3 {
            reads.observe(Sighting::Gone, Instant::now());
            advance(Duration::from_secs(30)).await;
        }
        assert_eq!(
            reads.observe(interruption, Instant::now()),
            GoneVerdict::Wait { reads: 0 }
        );
        // A 404 storm (every look-up 404, the list failing): never a deletion.
        for _ in 0..10 {
            advance(Duration::from_secs(20)).await;
            assert_eq!(
                reads.observe(interruption, Instant::now()),
                GoneVerdict::Wait { reads: 0 },
                "{interruption:?}"
            );
        }
        assert_eq!(
            reads.observe(Sighting::Gone, Instant::now()),
            GoneVerdict::Wait { reads: 1 }
        );
    }
}
