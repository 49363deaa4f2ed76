//! The simulator's request log names who sent each request (`User-Agent`) and when, in
//! wall-clock time (`unix_ms`), so benchmarks can attribute every write to a controller replica.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use baton_cloud::{CherryClient, Cloud as _};
use baton_sim::{Faults, LogEntry};
use serde_json::Value;

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

#[tokio::test]
async fn log_entries_carry_user_agent_and_wall_clock_time() {
    let sim = common::sim(Faults::none()).await;
    let mut cfg = common::config(&sim, None);
    cfg.user_agent = "baton-bench/replica-1".into();
    let replica = CherryClient::new(cfg).unwrap();

    let before = now_ms();
    replica.ips().await.unwrap();
    // A plain client that sends no User-Agent at all.
    let raw = baton_testbed::http_client(None).unwrap();
    let status = raw
        .get(format!("http://{}/v1/regions", sim.addr()))
        .bearer_auth(sim.api_key())
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    let after = now_ms();

    let log = sim.log(0);
    let (from_replica, from_raw): (Vec<&LogEntry>, Vec<&LogEntry>) =
        log.iter().partition(|e| e.route != "/v1/regions");
    assert!(!from_replica.is_empty(), "{log:?}");
    for entry in &from_replica {
        assert_eq!(entry.user_agent, "baton-bench/replica-1", "{entry:?}");
    }
    assert_eq!(from_raw.len(), 1, "{log:?}");
    assert_eq!(from_raw[0].user_agent, "", "no header, empty user agent");
    for entry in &log {
        assert!(
            (before..=after).contains(&entry.unix_ms),
            "unix_ms {} not within [{before}, {after}]",
            entry.unix_ms
        );
    }
    assert!(from_replica[0].unix_ms <= from_raw[0].unix_ms);

    // The admin endpoint serves the same fields.
    let admin: Value = raw
        .get(format!("http://{}/_sim/log?since=0", sim.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(admin[0]["user_agent"], "baton-bench/replica-1");
    assert_eq!(admin[0]["unix_ms"], log[0].unix_ms);
    let last = log.len() - 1;
    assert_eq!(admin[last]["user_agent"], "");
    sim.shutdown().await;
}

#[test]
fn log_written_before_the_new_fields_still_parses() {
    let old = r#"{"seq": 3, "at_ms": 120, "client": "127.0.0.1:5000", "method": "GET",
                  "path": "/v1/regions", "route": "/v1/regions", "status": 200, "duration_ms": 1}"#;
    let entry: LogEntry = serde_json::from_str(old).unwrap();
    assert_eq!(entry.user_agent, "");
    assert_eq!(entry.unix_ms, 0);
    assert_eq!(entry.seq, 3);
}
