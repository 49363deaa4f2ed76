//! The IP list as one write-through store, over real HTTP against the simulator: writes never
//! cause a list call, creation stays idempotent when answers are lost, late or the list lags,
//! and a new term reads a list fetched after the previous holder stopped.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a failure is a test failure

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton_cloud::model::CreateIpRequest;
use baton_cloud::tags::service_fip_tags;
use baton_cloud::{CherryClient, Cloud, Leadership};
use baton_sim::{Faults, RouteFaults};
use tokio::time::Instant;

const LIST: &str = "GET /v1/projects/{id}/ips";
const CREATE: &str = "POST /v1/projects/{id}/ips";

fn fip_request(name: &str) -> CreateIpRequest {
    CreateIpRequest {
        region: "LT-Siauliai".into(),
        tags: service_fip_tags("default", name, "cluster-uid-1"),
        ..Default::default()
    }
}

#[tokio::test]
async fn creates_whose_answers_are_lost_or_late_leave_exactly_one_fip_each() {
    // A third of the creates lose their answer after taking effect; answers take 100 ms to
    // 1.5 s (p50, p99), some longer than the client waits; the list lags 500 ms behind.
    let sim = common::sim(Faults {
        routes: BTreeMap::from([(
            CREATE.to_owned(),
            RouteFaults {
                latency_ms: Some("100,1500".parse().unwrap()),
                error_rate: Some(0.3),
                lost_response_ratio: Some(1.0),
            },
        )]),
        list_lag_ms: 500,
        seed: Some(24),
        ..Faults::none()
    })
    .await;
    let mut config = common::config(&sim, None);
    config.request_timeout = Duration::from_millis(900);
    config.ip_list_lag = Duration::from_secs(1);
    let client = CherryClient::new(config).unwrap();
    client.ips().await.unwrap();
    sim.reset_stats();

    let names: Vec<String> = (0..40).map(|i| format!("svc-{i}")).collect();
    let creates = names.iter().map(|name| {
        let client = client.clone();
        let request = fip_request(name);
        async move { client.create_ip(request).await }
    });
    let results = futures::future::join_all(creates).await;
    for (name, result) in names.iter().zip(&results) {
        assert!(result.is_ok(), "{name}: {result:?}");
    }
    let stats = sim.stats();
    assert_eq!(stats.fips_created, 40, "one FIP per tag set");
    assert_eq!(stats.duplicate_fips, 0);
    let unknown = stats.route_status(CREATE, 502)
        + stats.route_status(CREATE, 503)
        + stats.route_status(CREATE, 504)
        + stats.route_status(CREATE, 499);
    assert!(unknown > 0, "the dice lost no answer: the test proves nothing");
    assert!(
        stats.route(LIST) <= unknown,
        "list calls {} for {unknown} unknown outcomes",
        stats.route(LIST)
    );
    // Every FIP is in the store, without another list call.
    let lists = stats.route(LIST);
    for name in &names {
        let found = client.ips_tagged(&fip_request(name).tags).await.unwrap();
        assert_eq!(found.len(), 1, "{name}");
    }
    assert_eq!(sim.stats().route(LIST), lists);
}

#[tokio::test]
async fn a_burst_of_writes_makes_no_list_call() {
    let sim = common::sim(Faults::none()).await;
    let client = common::client(&sim, None);
    client.ips().await.unwrap();
    sim.reset_stats();
    for i in 0..50 {
        let fip = client.create_ip(fip_request(&format!("b{i}"))).await.unwrap();
        client.ips().await.unwrap();
        if i % 2 == 0 {
            client.delete_ip(&fip.id).await.unwrap();
        }
        assert!(client.cached_ip(&fip.id).await.unwrap().is_some() == (i % 2 == 1));
    }
    let stats = sim.stats();
    assert_eq!(stats.route(LIST), 0, "every write's answer went into the list");
    assert_eq!(stats.fips_created, 50);
    assert_eq!(client.ips().await.unwrap().len(), sim.peek_ips().len());
}

/// Leadership a test sets.
#[derive(Debug, Default)]
struct Lead(Mutex<Option<Instant>>);

impl Leadership for Lead {
    fn term(&self) -> Option<u64> {
        self.0.lock().unwrap().map(|_| 1)
    }

    fn holder_stopped(&self) -> Option<Instant> {
        None
    }
}

#[tokio::test]
async fn a_new_leader_never_creates_what_the_previous_one_created() {
    let sim = common::sim(Faults::none()).await;
    let lead = Arc::new(Lead::default());
    let follower = common::client(&sim, None).led_by(Arc::clone(&lead) as _);
    // The follower read the list once (say, at start) ...
    assert!(
        follower
            .ips_tagged(&fip_request("api").tags)
            .await
            .unwrap()
            .is_empty()
    );
    // ... the leader then created the Service's FIP ...
    let theirs = common::client(&sim, None)
        .create_ip(fip_request("api"))
        .await
        .unwrap();
    // ... and the follower wins: its first read in the term sees it, and so the create finds it.
    *lead.0.lock().unwrap() = Some(Instant::now() + Duration::from_secs(30));
    let mine = follower.create_ip(fip_request("api")).await.unwrap();
    assert_eq!(mine.id, theirs.id);
    assert_eq!(sim.stats().duplicate_fips, 0);
    assert_eq!(sim.stats().fips_created, 1);
}
