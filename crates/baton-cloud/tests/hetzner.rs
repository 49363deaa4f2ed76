//! The production client speaking Hetzner Cloud's API to the simulator's Hetzner dialect over
//! HTTP: Floating IPs across pages, a move as one assign action followed to its end, the errors
//! and the rate limit.
#![allow(clippy::unwrap_used)] // helpers outside #[test] fns too: a failure is a test failure

mod common;

use std::time::Duration;

use baton_cloud::model::{CreateIpRequest, IpId, ServerId, Tags};
use baton_cloud::{ClientConfig, Cloud, CloudClient, CloudError, CloudKind};
use baton_core::Secret;
use baton_sim::{Faults, HetznerSettings, SimHandle};

/// The lab's control-plane servers (cp-0..2).
const CP: [u64; 3] = [600_101, 600_102, 600_103];

fn config(sim: &SimHandle) -> ClientConfig {
    let mut cfg = ClientConfig::hetzner(Secret::new(sim.api_key())).with_base_url(sim.base_url());
    cfg.backoff_base = Duration::from_millis(10);
    cfg.backoff_cap = Duration::from_millis(200);
    cfg.request_timeout = Duration::from_secs(2);
    cfg.action_poll = Duration::from_millis(20);
    cfg.max_retries = 10;
    cfg
}

fn client(sim: &SimHandle) -> CloudClient {
    let c = CloudClient::new(config(sim)).unwrap();
    assert_eq!(c.cloud(), CloudKind::Hetzner);
    c
}

fn settings(action_ms: u64) -> HetznerSettings {
    HetznerSettings {
        action_ms: action_ms.into(),
        ..HetznerSettings::default()
    }
}

fn request(name: &str) -> CreateIpRequest {
    CreateIpRequest {
        region: "fsn1".into(),
        tags: Tags::from([("baton.dev/test".to_owned(), name.to_owned())]),
        ..Default::default()
    }
}

/// Requests of `route` in the simulator's log.
fn count(sim: &SimHandle, route: &str) -> usize {
    sim.log(0)
        .iter()
        .filter(|e| format!("{} {}", e.method, e.route) == route)
        .count()
}

#[tokio::test]
async fn a_move_is_one_assign_action_followed_to_its_end_and_the_route_changes_only_then() {
    let sim = common::hetzner_sim(settings(300), Faults::none()).await;
    let cloud = client(&sim);
    let fip = cloud.create_ip(request("api")).await.unwrap();
    assert_eq!(fip.target(), None);
    // Idempotent by labels: the second create finds the first FIP.
    assert_eq!(cloud.create_ip(request("api")).await.unwrap().id, fip.id);
    assert_eq!(count(&sim, "POST /v1/floating_ips"), 1);

    let started = tokio::time::Instant::now();
    let moved = cloud.retarget_ip(&fip.id, ServerId(CP[0])).await.unwrap();
    let took = started.elapsed();
    assert_eq!(moved.target(), Some(ServerId(CP[0])));
    assert_eq!(
        sim.peek_ip(fip.id.as_str()).unwrap().target(),
        Some(ServerId(CP[0]))
    );
    // The call returned once the action had succeeded: not before its 300 ms, not much after.
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(900),
        "{took:?}"
    );
    // Straight to another server: one assign again, no unassign.
    cloud.retarget_ip(&fip.id, ServerId(CP[1])).await.unwrap();
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/assign"), 2);
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/unassign"), 0);
    assert!(count(&sim, "GET /v1/actions") >= 2);
    // The shared list shows the move without a list call.
    let lists = count(&sim, "GET /v1/floating_ips");
    let cached = cloud.cached_ip(&fip.id).await.unwrap().unwrap();
    assert_eq!(cached.target(), Some(ServerId(CP[1])));
    assert_eq!(count(&sim, "GET /v1/floating_ips"), lists);

    let unassigned = cloud.unassign_ip(&fip.id).await.unwrap();
    assert_eq!(unassigned.target(), None);
    cloud.delete_ip(&fip.id).await.unwrap();
    assert!(sim.peek_ip(fip.id.as_str()).is_none());
    let err = cloud.ip(&fip.id).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn the_list_reads_every_page_and_servers_read_with_their_addresses() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    let cloud = client(&sim);
    for i in 0..55 {
        cloud.create_ip(request(&format!("svc-{i}"))).await.unwrap();
    }
    cloud.invalidate_ips();
    let ips = cloud.ips().await.unwrap();
    assert_eq!(ips.len(), 55);
    assert!(
        count(&sim, "GET /v1/floating_ips") >= 2,
        "two pages of at most 50"
    );
    let servers = cloud.servers().await.unwrap();
    let cp0 = servers.iter().find(|s| s.id == ServerId(CP[0])).unwrap();
    assert_eq!(cp0.hostname, "cp-0");
    assert!(cp0.first_ipv4(&baton_cloud::model::IpType::PrimaryIp).is_some());
    assert_eq!(cloud.server(ServerId(CP[0])).await.unwrap().hostname, "cp-0");
    let regions = cloud.regions().await.unwrap();
    assert!(regions.iter().any(|r| r.slug == "fsn1"), "{regions:?}");
    // No BGP on Hetzner: a clear error, nothing sent.
    let err = cloud.enable_project_bgp().await.unwrap_err();
    assert!(err.to_string().contains("no BGP"), "{err}");
}

#[tokio::test]
async fn an_api_that_refuses_a_direct_reassign_gets_an_unassign_first_and_only_then() {
    let sim = common::hetzner_sim(
        HetznerSettings {
            reassign: baton_sim::Reassign::Refuse,
            ..settings(50)
        },
        Faults::none(),
    )
    .await;
    let cloud = client(&sim);
    let fip = cloud.create_ip(request("api")).await.unwrap();
    cloud.retarget_ip(&fip.id, ServerId(CP[0])).await.unwrap();
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/unassign"), 0);
    let moved = cloud.retarget_ip(&fip.id, ServerId(CP[1])).await.unwrap();
    assert_eq!(moved.target(), Some(ServerId(CP[1])));
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/unassign"), 1);
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/assign"), 3);
}

#[tokio::test]
async fn a_failed_action_is_surfaced_with_its_code_and_the_fip_stays() {
    let sim = common::hetzner_sim(
        HetznerSettings {
            action_fail_servers: vec![CP[2].to_string()],
            ..settings(50)
        },
        Faults::none(),
    )
    .await;
    let cloud = client(&sim);
    let fip = cloud.create_ip(request("api")).await.unwrap();
    cloud.retarget_ip(&fip.id, ServerId(CP[0])).await.unwrap();
    let err = cloud.retarget_ip(&fip.id, ServerId(CP[2])).await.unwrap_err();
    let CloudError::ActionFailed { action, .. } = &err else {
        panic!("not an action failure: {err}");
    };
    assert!(!action.code.is_empty());
    assert!(err.to_string().contains(&action.code), "{err}");
    assert!(!err.is_retryable() && !err.outcome_unknown());
    // Sent once, not retried; the FIP is where it was, and the cache says so.
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/assign"), 2);
    assert_eq!(
        sim.peek_ip(fip.id.as_str()).unwrap().target(),
        Some(ServerId(CP[0]))
    );
    assert_eq!(
        cloud.cached_ip(&fip.id).await.unwrap().unwrap().target(),
        Some(ServerId(CP[0]))
    );
}

#[tokio::test]
async fn a_locked_fip_is_moved_once_its_running_action_ends() {
    let sim = common::hetzner_sim(settings(400), Faults::none()).await;
    let cloud = client(&sim);
    let other = client(&sim);
    let fip = cloud.create_ip(request("api")).await.unwrap();
    // Another client's assign runs for 400 ms; this client's, sent meanwhile, meets 423 locked
    // and is sent again once that ended.
    let first = tokio::spawn({
        let id = fip.id.clone();
        async move { other.retarget_ip(&id, ServerId(CP[0])).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let moved = cloud.retarget_ip(&fip.id, ServerId(CP[1])).await.unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(moved.target(), Some(ServerId(CP[1])));
    assert_eq!(
        sim.peek_ip(fip.id.as_str()).unwrap().target(),
        Some(ServerId(CP[1]))
    );
    assert!(sim.stats().with_status(423) >= 1, "{:?}", sim.stats());
}

#[tokio::test]
async fn errors_name_the_api_code_and_never_the_token() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    let mut cfg = config(&sim);
    cfg.api_key = Secret::new("wrong-token-value");
    let err = CloudClient::new(cfg).unwrap().servers().await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert!(err.to_string().contains("unauthorized"), "{err}");
    assert!(!err.to_string().contains("wrong-token-value"));
    let cloud = client(&sim);
    let err = cloud.ip(&IpId::from("999999")).await.unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("not_found"),
        "{err}"
    );
    // A label value Hetzner refuses: the API's field error, not retried.
    let bad = CreateIpRequest {
        region: "fsn1".into(),
        tags: Tags::from([("service".to_owned(), "a/b+c=".to_owned())]),
        ..Default::default()
    };
    let err = cloud.create_ip(bad).await.unwrap_err();
    assert!(err.to_string().contains("invalid_input"), "{err}");
    assert_eq!(count(&sim, "POST /v1/floating_ips"), 1);
}

#[tokio::test]
async fn normal_work_follows_the_bucket_and_never_meets_a_429() {
    // A bucket of 60 refilled at 20/s: 150 creates need more than the bucket holds.
    let sim = common::hetzner_sim(
        HetznerSettings {
            bucket: 60,
            refill_per_s: 20.0,
            ..settings(0)
        },
        Faults::none(),
    )
    .await;
    let mut cfg = config(&sim);
    cfg.budget_reserve = 10;
    let cloud = CloudClient::new(cfg).unwrap();
    let started = tokio::time::Instant::now();
    for i in 0..150 {
        cloud.create_ip(request(&format!("svc-{i}"))).await.unwrap();
    }
    assert_eq!(sim.stats().with_status(429), 0, "{:?}", sim.stats());
    // Paced by the refill once the bucket ran low: at least (150 + lists - 50) / 20 s.
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_hundred_moves_at_once_are_watched_by_shared_reads_of_their_actions() {
    let sim = common::hetzner_sim(settings(300), Faults::none()).await;
    let cloud = client(&sim);
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(cloud.create_ip(request(&format!("svc-{i}"))).await.unwrap().id);
    }
    let moves = ids.iter().enumerate().map(|(i, id)| {
        let cloud = cloud.clone();
        let id = id.clone();
        async move { cloud.retarget_ip(&id, ServerId(CP[i % 3])).await }
    });
    let answers = futures::future::join_all(moves).await;
    for (i, ip) in answers.into_iter().enumerate() {
        assert_eq!(ip.unwrap().target(), Some(ServerId(CP[i % 3])));
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            sim.peek_ip(id.as_str()).unwrap().target(),
            Some(ServerId(CP[i % 3]))
        );
    }
    assert_eq!(count(&sim, "POST /v1/floating_ips/{id}/actions/assign"), 100);
    // One read per round for all of them (2 reads of 50 ids): a round every 50-100 ms for the
    // ~0.5 s the moves take, where one read per action per round would be 300 or more; and no
    // read of each FIP after its move.
    let polls = count(&sim, "GET /v1/actions");
    eprintln!("{polls} reads of actions for 100 moves");
    assert!(polls <= 30, "{polls} reads of actions for 100 moves");
    assert_eq!(count(&sim, "GET /v1/floating_ips/{id}"), 0);
}
