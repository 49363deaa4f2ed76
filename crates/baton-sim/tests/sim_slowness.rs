//! The simulator is truthful about slowness: a request takes effect once received, whether its
//! client still waits or not; latency comes from a distribution, per route where set, and may
//! come before the effect (processing) or only before the answer; the IP list may lag behind
//! the writes; FIPs that one tag look-up would find twice are counted.
#![allow(clippy::unwrap_used, clippy::similar_names)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use baton_sim::{Faults, Latency, RouteFaults};
use common::Raw;
use reqwest::Method as M;
use serde_json::{Value, json};
use tokio::time::Instant;

const IPS: &str = "/v1/projects/123456/ips";
const CREATE: &str = "POST /v1/projects/{id}/ips";

fn create_body(tag: &str) -> Value {
    json!({"region": "LT-Siauliai", "tags": {"service": tag}})
}

/// The FIPs of the state whose `service` tag is `tag`.
fn fips_tagged(sim: &baton_sim::SimHandle, tag: &str) -> usize {
    sim.peek_ips()
        .iter()
        .filter(|ip| ip.tags.get("service").map(String::as_str) == Some(tag))
        .count()
}

#[tokio::test]
async fn a_write_whose_client_gave_up_still_takes_effect() {
    let sim = common::sim(Faults {
        latency_ms: Latency::Fixed(600),
        ..Faults::none()
    })
    .await;
    let raw = Raw::new(&sim);
    let impatient = raw
        .http
        .post(format!("{}{IPS}", raw.base))
        .bearer_auth(&raw.token)
        .json(&create_body("gave-up"))
        .timeout(Duration::from_millis(150))
        .send()
        .await;
    assert!(impatient.unwrap_err().is_timeout());
    // Applied as it arrived (processing ratio 0), though nobody waits for the answer.
    assert_eq!(fips_tagged(&sim, "gave-up"), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let stats = sim.stats();
    assert_eq!(stats.fips_created, 1);
    assert_eq!(stats.route_status(CREATE, 499), 1, "logged as given up");
    assert_eq!(fips_tagged(&sim, "gave-up"), 1, "and not undone");
}

#[tokio::test]
async fn processing_time_comes_before_the_effect_and_the_rest_before_the_answer() {
    let sim = common::sim(Faults {
        latency_ms: Latency::Fixed(800),
        processing_ratio: 0.5,
        ..Faults::none()
    })
    .await;
    let raw = Raw::new(&sim);
    let started = Instant::now();
    let create = tokio::spawn({
        let (http, url, token) = (raw.http.clone(), format!("{}{IPS}", raw.base), raw.token.clone());
        async move {
            http.post(url)
                .bearer_auth(token)
                .json(&create_body("slow"))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fips_tagged(&sim, "slow"), 0, "still processing");
    tokio::time::sleep_until(started + Duration::from_millis(600)).await;
    assert_eq!(fips_tagged(&sim, "slow"), 1, "in effect before the answer");
    assert!(!create.is_finished(), "the answer takes the rest of the latency");
    assert_eq!(create.await.unwrap(), 201);
    assert!(started.elapsed() >= Duration::from_millis(800));
}

#[tokio::test]
async fn a_route_has_its_own_latency_and_faults() {
    let sim = common::sim(Faults {
        routes: BTreeMap::from([(
            CREATE.to_owned(),
            RouteFaults {
                latency_ms: Some("300,2000".parse().unwrap()),
                error_rate: Some(1.0),
                lost_response_ratio: Some(1.0),
            },
        )]),
        error_statuses: vec![503],
        non_json_ratio: 0.0,
        seed: Some(1),
        ..Faults::none()
    })
    .await;
    let raw = Raw::new(&sim);
    let started = Instant::now();
    let (status, _, _) = raw.send(M::GET, IPS, None).await;
    assert_eq!(status, 200, "other routes keep the general faults");
    assert!(started.elapsed() < Duration::from_millis(100));
    let mut slowest = Duration::ZERO;
    for i in 0..6 {
        let started = Instant::now();
        let (status, _, _) = raw.send(M::POST, IPS, Some(create_body(&format!("r{i}")))).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 503, "every answer of this route is lost");
    }
    assert!(slowest > Duration::from_millis(150), "slowest create {slowest:?}");
    let stats = sim.stats();
    assert_eq!(stats.fips_created, 6, "lost answers: every create took effect");
    assert_eq!(stats.route_status(CREATE, 503), 6);
}

#[tokio::test]
async fn the_ip_list_may_lag_behind_the_writes() {
    let sim = common::sim(Faults {
        list_lag_ms: 700,
        ..Faults::none()
    })
    .await;
    let raw = Raw::new(&sim);
    let listed = |list: &Value, id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .any(|ip| ip["id"].as_str() == Some(id))
    };
    let (_, _, created) = raw.send(M::POST, IPS, Some(create_body("lag"))).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, _, list) = raw.send(M::GET, IPS, None).await;
    assert!(!listed(&list, &id), "the list does not show it yet");
    let (status, _, one) = raw.send(M::GET, &format!("/v1/ips/{id}"), None).await;
    assert_eq!(
        (status, one["id"].as_str()),
        (200, Some(id.as_str())),
        "a read of one IP is current"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (_, _, list) = raw.send(M::GET, IPS, None).await;
    assert!(listed(&list, &id), "shown once the lag has passed");

    // A delete and a change, too: the list shows the IP as it was.
    let (s, _, _) = raw
        .send(
            M::PUT,
            &format!("/v1/ips/{id}"),
            Some(json!({"tags": {"service": "changed"}})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, _, list) = raw.send(M::GET, IPS, None).await;
    let shown = list
        .as_array()
        .unwrap()
        .iter()
        .find(|ip| ip["id"] == id.as_str())
        .unwrap();
    assert_eq!(shown["tags"]["service"], "lag", "the change is not shown yet");
    let (s, _, _) = raw.send(M::DELETE, &format!("/v1/ips/{id}"), None).await;
    assert_eq!(s, 204);
    let (_, _, list) = raw.send(M::GET, IPS, None).await;
    assert!(listed(&list, &id), "a deleted IP is still listed for a while");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (_, _, list) = raw.send(M::GET, IPS, None).await;
    assert!(!listed(&list, &id));
}

#[tokio::test]
async fn duplicates_are_counted_at_their_peak() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    let (_, _, a) = raw.send(M::POST, IPS, Some(create_body("twice"))).await;
    raw.send(M::POST, IPS, Some(create_body("once"))).await;
    assert_eq!(sim.stats().duplicate_fips, 0);
    raw.send(M::POST, IPS, Some(create_body("twice"))).await;
    assert_eq!(sim.stats().duplicate_fips, 1);
    raw.send(M::DELETE, &format!("/v1/ips/{}", a["id"].as_str().unwrap()), None)
        .await;
    let stats = sim.stats();
    assert_eq!(stats.duplicate_fips, 1, "the peak is kept");
    assert_eq!((stats.fips_created, stats.fips_deleted), (3, 1));
    sim.reset_stats();
    assert_eq!(sim.stats().duplicate_fips, 0, "counted again from what exists");
    let admin: Value = raw
        .http
        .get(format!("{}/_sim/stats", raw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin["duplicate_fips"], 0);
    assert_eq!(admin["fips_created"], 0);
}
