//! The client under injected faults and the simulator's rate limit, measured from the
//! simulator's own counters and log.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use baton_cloud::model::{CreateIpRequest, IpType, ServerId};
use baton_cloud::tags::service_fip_tags;
use baton_cloud::{CherryClient, Cloud};
use baton_sim::{Faults, LogEntry};

fn fip_request(name: &str) -> CreateIpRequest {
    CreateIpRequest {
        region: "LT-Siauliai".into(),
        tags: service_fip_tags("default", name, "uid"),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_percent_faults_no_failure_no_duplicate() {
    let faults = Faults {
        error_rate: 0.3,
        error_statuses: vec![429, 502, 503, 504],
        non_json_ratio: 0.5,
        lost_response_ratio: 0.5,
        retry_after_secs: None,
        seed: Some(42),
        ..Faults::none()
    };
    let sim = common::sim(faults).await;
    let client = common::client(&sim, None);
    let names: Vec<String> = (0..30).map(|i| format!("svc-{i}")).collect();

    // Each FIP is asked for by three callers at once.
    let mut tasks = Vec::new();
    for name in &names {
        for _ in 0..3 {
            let (c, name) = (client.clone(), name.clone());
            tasks.push(tokio::spawn(async move { c.create_ip(fip_request(&name)).await }));
        }
    }
    let mut ids: BTreeMap<String, String> = BTreeMap::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let ip = t.await.unwrap().expect("create under faults");
        let name = &names[i / 3];
        let prev = ids.insert(name.clone(), ip.id.0.clone());
        assert!(
            prev.is_none_or(|p| p == ip.id.0),
            "{name}: two different FIPs returned"
        );
    }

    // Idempotent operations on all of them.
    let mut tasks = Vec::new();
    for (i, id) in ids.values().enumerate() {
        let (c, id) = (client.clone(), baton_cloud::model::IpId(id.clone()));
        tasks.push(tokio::spawn(async move {
            let server = ServerId(if i % 2 == 0 { 600_101 } else { 600_102 });
            let ip = c.retarget_ip(&id, server).await?;
            assert_eq!(ip.target(), Some(server));
            c.ip(&id).await?;
            let ip = c.unassign_ip(&id).await?;
            assert!(ip.target().is_none());
            c.server(server).await?;
            Ok::<_, baton_cloud::CloudError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("idempotent op under faults");
    }

    // Ground truth, read with faults off: exactly one FIP per Service.
    sim.set_faults(Faults::none()).unwrap();
    let truth = common::client(&sim, None).ips().await.unwrap();
    let fips: Vec<_> = truth.iter().filter(|i| i.ip_type == IpType::FloatingIp).collect();
    assert_eq!(fips.len(), names.len(), "a FIP was created twice (or lost)");
    for name in &names {
        let n = fips
            .iter()
            .filter(|f| f.has_tags(&fip_request(name).tags))
            .count();
        assert_eq!(n, 1, "{name}");
    }

    // The faults really happened, including writes whose response was lost.
    let stats = sim.stats();
    let log = sim.log(0);
    assert!(stats.injected_errors > 20, "{stats:?}");
    assert!(
        log.iter().any(|e| e.method == "POST" && e.status >= 500),
        "no create met an unknown outcome"
    );
    assert!(
        log.iter().any(|e| e.fault.as_deref() == Some("lost_response")),
        "no lost response"
    );

    // Deletes under faults: the retried DELETE that finds nothing is a success.
    sim.set_faults(Faults {
        error_rate: 0.3,
        seed: Some(3),
        ..Faults::none()
    })
    .unwrap();
    for f in &fips {
        client.delete_ip(&f.id).await.expect("delete under faults");
    }
    sim.set_faults(Faults::none()).unwrap();
    client.invalidate_ips();
    assert!(
        client
            .ips()
            .await
            .unwrap()
            .iter()
            .all(|i| i.ip_type != IpType::FloatingIp)
    );
}

/// Requests of one client address, in arrival order.
fn api_requests(log: &[LogEntry]) -> Vec<&LogEntry> {
    log.iter().filter(|e| e.path.starts_with("/v1/")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stays_within_its_rate() {
    const RATE: u32 = 8;
    // The simulator limits at the same rate: any excess shows as a 429.
    let sim = common::sim(Faults {
        rate_limit: Some(f64::from(RATE)),
        ..Faults::none()
    })
    .await;
    let client = common::client(&sim, Some(f64::from(RATE)));
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                c.server(ServerId(600_101 + i % 3)).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = sim.stats();
    assert_eq!(stats.requests, 24);
    assert_eq!(stats.rate_limited, 0, "{stats:?}");
    let log = sim.log(0);
    let reqs = api_requests(&log);
    let span_ms = reqs.last().unwrap().at_ms - reqs.first().unwrap().at_ms;
    let floor_ms = (reqs.len() as u64 - 1) * 900 / u64::from(RATE);
    assert!(
        span_ms >= floor_ms,
        "{} requests in {span_ms} ms: faster than {RATE}/s",
        reqs.len()
    );
    // No one-second window holds more than the rate (+1 for the window's edges).
    for (i, first) in reqs.iter().enumerate() {
        let n = reqs[i..]
            .iter()
            .take_while(|e| e.at_ms < first.at_ms + 1000)
            .count();
        assert!(
            n <= RATE as usize + 1,
            "{n} requests within 1 s from {}",
            first.at_ms
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_limit_429s_come_and_retry_after_is_honoured() {
    let sim = common::sim(Faults {
        rate_limit: Some(4.0),
        retry_after_secs: Some(1),
        ..Faults::none()
    })
    .await;
    let mut cfg = common::config(&sim, None);
    cfg.backoff_cap = Duration::from_secs(2);
    let client = CherryClient::new(cfg).unwrap();
    for _ in 0..8 {
        client.project().await.unwrap();
    }
    let log = sim.log(0);
    let reqs = api_requests(&log);
    let limited: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].status == 429).collect();
    assert!(
        !limited.is_empty(),
        "the simulator never limited an unlimited client"
    );
    for i in limited {
        let next = reqs.get(i + 1).expect("a retry follows every 429");
        assert!(
            next.at_ms - reqs[i].at_ms >= 900,
            "retried {} ms after a 429 with Retry-After: 1",
            next.at_ms - reqs[i].at_ms
        );
    }
    assert_eq!(reqs.iter().filter(|e| e.status == 200).count(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_requests_time_out_and_are_retried() {
    let sim = common::sim(Faults {
        hang_rate: 0.5,
        seed: Some(1),
        ..Faults::none()
    })
    .await;
    let mut cfg = common::config(&sim, None);
    cfg.request_timeout = Duration::from_millis(300);
    let client = CherryClient::new(cfg).unwrap();
    for _ in 0..4 {
        client.servers().await.unwrap();
    }
    assert!(sim.stats().hung > 0);
    sim.shutdown().await; // releases the hung handlers
}

#[tokio::test]
async fn post_is_not_retried_blindly() {
    // Every create answers 400: a definite refusal, tried once.
    let sim = common::sim(Faults::none()).await;
    let client = common::client(&sim, None);
    let mut req = fip_request("x");
    req.region = "nowhere".into();
    assert_eq!(client.create_ip(req).await.unwrap_err().status(), Some(400));
    assert_eq!(sim.stats().route("POST /v1/projects/{id}/ips"), 1);
}
