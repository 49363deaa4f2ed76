//! The Hetzner dialect on the wire, checked with a plain HTTP client against the real server:
//! lists with label selectors and pages, actions that move a Floating IP only when they
//! succeed, locks, reassign modes, failed actions, error bodies, the token bucket's headers
//! and 429, injected faults in Hetzner's shape, and the state file.

// Test code: a failed unwrap is a failed test; the wire walk-throughs read best as sequences.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::time::Duration;

use baton_cloud::model::ServerId;
use baton_sim::{CloudKind, Faults, HetznerSettings, Latency, Reassign, Sim, SimError};
use common::Raw;
use reqwest::Method as M;
use serde_json::{Value, json};
use tokio::time::Instant;

fn settings(action_ms: u64) -> HetznerSettings {
    HetznerSettings {
        action_ms: Latency::Fixed(action_ms),
        ..HetznerSettings::default()
    }
}

async fn create(raw: &Raw, labels: Value) -> Value {
    let (s, _, body) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"type": "ipv4", "home_location": "fsn1", "labels": labels})),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["action"], Value::Null);
    body["floating_ip"].clone()
}

/// Polls `GET /v1/actions/{id}` until the action is no longer running.
async fn wait_action(raw: &Raw, id: u64) -> Value {
    for _ in 0..200 {
        let (s, _, body) = raw.send(M::GET, &format!("/v1/actions/{id}"), None).await;
        assert_eq!(s, 200, "{body}");
        if body["action"]["status"] != "running" {
            return body["action"].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("action {id} still runs");
}

#[tokio::test]
async fn lists_filter_by_label_selector_and_come_in_pages() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    let raw = Raw::new(&sim);
    for i in 0..55 {
        let parity = if i % 2 == 0 { "even" } else { "odd" };
        create(&raw, json!({"parity": parity, "n": i.to_string()})).await;
    }

    let (s, h, page1) = raw.send(M::GET, "/v1/floating_ips?per_page=50", None).await;
    assert_eq!(s, 200);
    assert_eq!(page1["floating_ips"].as_array().unwrap().len(), 50);
    assert_eq!(
        page1["meta"]["pagination"],
        json!({"page": 1, "per_page": 50, "previous_page": null, "next_page": 2, "last_page": 2, "total_entries": 55})
    );
    let link = h["link"].to_str().unwrap();
    assert!(link.contains("page=2&per_page=50>; rel=\"next\""), "{link}");
    let (_, _, page2) = raw
        .send(M::GET, "/v1/floating_ips?per_page=50&page=2", None)
        .await;
    assert_eq!(page2["floating_ips"].as_array().unwrap().len(), 5);
    assert_eq!(
        page2["meta"]["pagination"],
        json!({"page": 2, "per_page": 50, "previous_page": 1, "next_page": null, "last_page": 2, "total_entries": 55})
    );
    // Ids ascend across the pages.
    let first_of_2 = page2["floating_ips"][0]["id"].as_u64().unwrap();
    assert!(first_of_2 > page1["floating_ips"][49]["id"].as_u64().unwrap());

    // Default 25 a page, at most 50.
    let (_, _, default) = raw.send(M::GET, "/v1/floating_ips", None).await;
    assert_eq!(default["floating_ips"].as_array().unwrap().len(), 25);
    assert_eq!(default["meta"]["pagination"]["last_page"], 3);
    let (_, _, big) = raw.send(M::GET, "/v1/floating_ips?per_page=500", None).await;
    assert_eq!(big["meta"]["pagination"]["per_page"], 50);

    // Selectors.
    for (selector, count) in [
        ("parity%3Deven", 28),
        ("parity%3D%3Dodd", 27),
        ("parity!%3Dodd", 28),
        ("parity", 55),
        ("!parity", 0),
        ("n%20in%20(1,2,3)", 3),
        ("parity%3Deven,n%20notin%20(0,2)", 26),
    ] {
        let (s, _, list) = raw
            .send(
                M::GET,
                &format!("/v1/floating_ips?per_page=50&label_selector={selector}"),
                None,
            )
            .await;
        assert_eq!(s, 200, "{selector}");
        assert_eq!(list["meta"]["pagination"]["total_entries"], count, "{selector}");
    }
    let (s, _, e) = raw
        .send(M::GET, "/v1/floating_ips?label_selector=n%20in%20(1", None)
        .await;
    assert_eq!((s, &e["error"]["code"]), (422, &json!("invalid_input")));
    assert_eq!(e["error"]["details"]["fields"][0]["name"], "label_selector");
    let (_, _, by_name) = raw
        .send(M::GET, "/v1/floating_ips?name=floating-ip-100001", None)
        .await;
    assert_eq!(by_name["floating_ips"].as_array().unwrap().len(), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn an_assign_runs_and_moves_the_fip_only_when_it_succeeds() {
    let sim = common::hetzner_sim(settings(400), Faults::none()).await;
    let raw = Raw::new(&sim);
    let fip = create(&raw, json!({"cluster": "lab"})).await;
    let id = fip["id"].as_u64().unwrap();
    assert_eq!(fip["server"], Value::Null);
    assert!(sim.peek_ip(&id.to_string()).unwrap().target().is_none());

    let posted = Instant::now();
    let (s, _, body) = raw
        .send(
            M::POST,
            &format!("/v1/floating_ips/{id}/actions/assign"),
            Some(json!({"server": 600_101})),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    let action = &body["action"];
    assert_eq!(action["status"], "running");
    assert_eq!(action["command"], "assign_floating_ip");
    assert_eq!(action["progress"], 0);
    assert_eq!(action["finished"], Value::Null);
    assert_eq!(
        action["resources"],
        json!([{"id": id, "type": "floating_ip"}, {"id": 600_101, "type": "server"}])
    );
    let action_id = action["id"].as_u64().unwrap();
    // Running: nothing moved yet, and the FIP is locked.
    let (_, _, now) = raw.send(M::GET, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!(now["floating_ip"]["server"], Value::Null);
    assert!(sim.peek_ip(&id.to_string()).unwrap().target().is_none());
    for (path, body) in [("assign", Some(json!({"server": 600_102}))), ("unassign", None)] {
        let (s, _, e) = raw
            .send(M::POST, &format!("/v1/floating_ips/{id}/actions/{path}"), body)
            .await;
        assert_eq!((s, &e["error"]["code"]), (423, &json!("locked")), "{path}");
    }
    // hcloud-go's waiter asks by id.
    let (s, _, listed) = raw
        .send(
            M::GET,
            &format!("/v1/actions?id={action_id}&id=999999&sort=status&sort=id"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(listed["actions"].as_array().unwrap().len(), 1);
    assert_eq!(listed["meta"]["pagination"]["total_entries"], 1);

    let done = wait_action(&raw, action_id).await;
    assert!(
        posted.elapsed() >= Duration::from_millis(400),
        "ended after the action time"
    );
    assert_eq!(done["status"], "success");
    assert_eq!(done["progress"], 100);
    assert!(done["finished"].is_string());
    let (_, _, now) = raw.send(M::GET, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!(now["floating_ip"]["server"], 600_101);
    let peek = sim.peek_ip(&id.to_string()).unwrap();
    assert_eq!(peek.target(), Some(ServerId(600_101)));
    assert_eq!(peek.targeted_to.unwrap().hostname, "cp-0");
    assert_eq!(peek.tags["cluster"], "lab");
    let (_, _, server) = raw.send(M::GET, "/v1/servers/600101", None).await;
    assert_eq!(server["server"]["public_net"]["floating_ips"], json!([id]));
    let (s, _, same) = raw
        .send(
            M::GET,
            &format!("/v1/floating_ips/{id}/actions/{action_id}"),
            None,
        )
        .await;
    assert_eq!((s, &same["action"]["status"]), (200, &json!("success")));

    // Listing every action was removed from the API.
    let (s, _, gone) = raw.send(M::GET, "/v1/actions", None).await;
    assert_eq!(
        (s, &gone["error"]["code"]),
        (410, &json!("deprecated_api_endpoint"))
    );
    assert!(gone["error"]["details"]["announcement"].is_string());

    let stats = sim.stats();
    assert_eq!(stats.route("POST /v1/floating_ips/{id}/actions/assign"), 2);
    assert_eq!(
        stats.route_status("POST /v1/floating_ips/{id}/actions/assign", 423),
        1
    );
    assert_eq!(stats.route("GET /v1/floating_ips/{id}/actions/{action_id}"), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_reassign_moves_directly_or_is_refused() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    let raw = Raw::new(&sim);
    let id = create(&raw, json!({})).await["id"].as_u64().unwrap();
    let assign = |server: u64| {
        let raw = &raw;
        async move {
            raw.send(
                M::POST,
                &format!("/v1/floating_ips/{id}/actions/assign"),
                Some(json!({"server": server})),
            )
            .await
        }
    };
    // An action time of 0: the action has ended when the API answers.
    let (s, _, body) = assign(600_101).await;
    assert_eq!((s, &body["action"]["status"]), (201, &json!("success")));
    let (s, _, body) = assign(600_102).await;
    assert_eq!((s, &body["action"]["status"]), (201, &json!("success")));
    assert_eq!(
        sim.peek_ip(&id.to_string()).unwrap().target(),
        Some(ServerId(600_102))
    );

    let patched: Value = raw
        .http
        .patch(format!("{}/_sim/hetzner", raw.base))
        .json(&json!({"reassign": "refuse"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(patched["reassign"], "refuse");
    assert_eq!(sim.hetzner_settings().unwrap().reassign, Reassign::Refuse);
    let (s, _, e) = assign(600_101).await;
    assert_eq!((s, &e["error"]["code"]), (422, &json!("floating_ip_assigned")));
    assert_eq!(
        sim.peek_ip(&id.to_string()).unwrap().target(),
        Some(ServerId(600_102))
    );
    // Unassign first, then assign: the way that always works.
    let (s, _, _) = raw
        .send(M::POST, &format!("/v1/floating_ips/{id}/actions/unassign"), None)
        .await;
    assert_eq!(s, 201);
    let (s, _, _) = assign(600_101).await;
    assert_eq!(s, 201);
    assert_eq!(
        sim.peek_ip(&id.to_string()).unwrap().target(),
        Some(ServerId(600_101))
    );

    // Unknown server: 404; a server outside the FIP's network zone: 422.
    let (s, _, e) = assign(1).await;
    assert_eq!((s, &e["error"]["code"]), (404, &json!("not_found")));
    let (_, _, far) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"type": "ipv4", "home_location": "ash"})),
        )
        .await;
    let far = far["floating_ip"]["id"].as_u64().unwrap();
    let (s, _, e) = raw
        .send(
            M::POST,
            &format!("/v1/floating_ips/{far}/actions/assign"),
            Some(json!({"server": 600_101})),
        )
        .await;
    assert_eq!((s, &e["error"]["code"]), (422, &json!("invalid_input")));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failed_action_leaves_the_fip_where_it_was() {
    let sim = common::hetzner_sim(
        HetznerSettings {
            action_error_rate: 1.0,
            ..settings(50)
        },
        Faults::none(),
    )
    .await;
    let raw = Raw::new(&sim);
    let id = create(&raw, json!({})).await["id"].as_u64().unwrap();
    let (s, _, body) = raw
        .send(
            M::POST,
            &format!("/v1/floating_ips/{id}/actions/assign"),
            Some(json!({"server": 600_101})),
        )
        .await;
    assert_eq!((s, &body["action"]["status"]), (201, &json!("running")));
    let done = wait_action(&raw, body["action"]["id"].as_u64().unwrap()).await;
    assert_eq!(done["status"], "error");
    assert_eq!(done["error"]["code"], "action_failed");
    assert!(done["error"]["message"].is_string());
    let (_, _, fip) = raw.send(M::GET, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!(fip["floating_ip"]["server"], Value::Null);
    assert!(sim.peek_ip(&id.to_string()).unwrap().target().is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_input_and_missing_tokens_answer_hetzner_errors() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    let raw = Raw::new(&sim);

    let (s, h, e) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"type": "ipv4", "home_location": "fsn1", "labels": {"bad key": "v"}})),
        )
        .await;
    assert_eq!((s, &e["error"]["code"]), (422, &json!("invalid_input")));
    assert_eq!(e["error"]["details"]["fields"][0]["name"], "labels");
    assert!(e["error"]["details"]["fields"][0]["messages"][0].is_string());
    assert!(
        h.contains_key("ratelimit-remaining"),
        "errors carry the rate-limit headers"
    );
    let (s, _, e) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"home_location": "fsn1"})),
        )
        .await;
    assert_eq!(
        (s, &e["error"]["details"]["fields"][0]["name"]),
        (422, &json!("type"))
    );
    let (s, _, e) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"type": "ipv4", "home_location": "mars1"})),
        )
        .await;
    assert_eq!(
        (s, &e["error"]["details"]["fields"][0]["name"]),
        (422, &json!("home_location"))
    );
    let (s, _, _) = raw
        .send(
            M::POST,
            "/v1/floating_ips",
            Some(json!({"type": "ipv4", "home_location": 2})),
        )
        .await;
    assert_eq!(s, 201, "a location id works as well as its name");
    let id = create(&raw, json!({"a": "1"})).await["id"].as_u64().unwrap();
    let (s, _, e) = raw
        .send(
            M::PUT,
            &format!("/v1/floating_ips/{id}"),
            Some(json!({"labels": {"a": "no spaces"}})),
        )
        .await;
    assert_eq!(
        (s, &e["error"]["details"]["fields"][0]["name"]),
        (422, &json!("labels"))
    );
    let (s, _, updated) = raw
        .send(
            M::PUT,
            &format!("/v1/floating_ips/{id}"),
            Some(json!({"labels": {"b": "2"}})),
        )
        .await;
    assert_eq!((s, &updated["floating_ip"]["labels"]), (200, &json!({"b": "2"})));
    let (s, _, e) = raw
        .send(
            M::PUT,
            &format!("/v1/floating_ips/{id}"),
            Some(json!({"name": "floating-ip-100001"})),
        )
        .await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("uniqueness_error")));

    // Delete protection, then delete.
    let (s, _, _) = raw
        .send(
            M::POST,
            &format!("/v1/floating_ips/{id}/actions/change_protection"),
            Some(json!({"delete": true})),
        )
        .await;
    assert_eq!(s, 201);
    let (s, _, e) = raw.send(M::DELETE, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!((s, &e["error"]["code"]), (423, &json!("protected")));
    raw.send(
        M::POST,
        &format!("/v1/floating_ips/{id}/actions/change_protection"),
        Some(json!({"delete": false})),
    )
    .await;
    let (s, _, body) = raw.send(M::DELETE, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!((s, body), (204, Value::Null));

    // Unknown ids and paths, wrong methods, broken JSON.
    for (method, path, status, code) in [
        (M::GET, "/v1/floating_ips/999", 404, "not_found"),
        (M::GET, "/v1/floating_ips/abc", 404, "not_found"),
        (M::GET, "/v1/nothing", 404, "not_found"),
        (M::PATCH, "/v1/floating_ips", 405, "method_not_allowed"),
    ] {
        let (s, _, e) = raw.send(method, path, None).await;
        assert_eq!((s, e["error"]["code"].as_str()), (status, Some(code)), "{path}");
    }
    let resp = raw
        .http
        .post(format!("{}/v1/floating_ips", raw.base))
        .bearer_auth(&raw.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "json_error");

    // No token, or a wrong one: 401 unauthorized.
    for token in [None, Some("wrong")] {
        let mut req = raw.http.get(format!("{}/v1/floating_ips", raw.base));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        assert!(resp.headers().contains_key("ratelimit-limit"));
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["error"]["code"], "unauthorized");
        assert!(e["error"]["message"].is_string());
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn every_answer_reports_the_bucket_and_an_empty_one_answers_429() {
    let sim = common::hetzner_sim(
        HetznerSettings {
            bucket: 5,
            refill_per_s: 0.01,
            ..settings(0)
        },
        Faults::none(),
    )
    .await;
    let raw = Raw::new(&sim);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut remaining = Vec::new();
    for _ in 0..5 {
        let (s, h, _) = raw.send(M::GET, "/v1/servers", None).await;
        assert_eq!(s, 200);
        assert_eq!(h["ratelimit-limit"], "5");
        remaining.push(h["ratelimit-remaining"].to_str().unwrap().parse::<u64>().unwrap());
        let reset: u64 = h["ratelimit-reset"].to_str().unwrap().parse().unwrap();
        assert!(reset > before, "the bucket is full again later");
    }
    assert_eq!(remaining, [4, 3, 2, 1, 0]);
    let (s, h, e) = raw.send(M::GET, "/v1/servers", None).await;
    assert_eq!((s, &e["error"]["code"]), (429, &json!("rate_limit_exceeded")));
    assert_eq!(h["ratelimit-remaining"], "0");
    let reset: u64 = h["ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert!(reset >= before + 400, "5 requests at 0.01/s: 500 s to fill");
    assert_eq!(sim.stats().rate_limited, 1);

    // Another token has a bucket of its own (and is still refused as a token).
    let resp = raw
        .http
        .get(format!("{}/v1/servers", raw.base))
        .bearer_auth("other")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["ratelimit-remaining"], "4");

    // A stats reset fills the buckets.
    sim.reset_stats();
    let (s, h, _) = raw.send(M::GET, "/v1/servers", None).await;
    assert_eq!((s, h["ratelimit-remaining"].to_str().unwrap()), (200, "4"));
    sim.shutdown().await;
}

#[tokio::test]
async fn injected_faults_answer_in_hetzners_shape() {
    let sim = common::hetzner_sim(
        settings(0),
        Faults {
            error_rate: 1.0,
            error_statuses: vec![503],
            non_json_ratio: 0.0,
            error_routes: vec!["GET /v1/floating_ips".into()],
            ..Faults::none()
        },
    )
    .await;
    let raw = Raw::new(&sim);
    let (s, h, e) = raw.send(M::GET, "/v1/floating_ips", None).await;
    assert_eq!(s, 503);
    assert_eq!(e["error"]["code"], "unavailable");
    assert!(e["error"]["message"].is_string());
    assert!(h.contains_key("ratelimit-remaining"));
    // Other routes are spared.
    let (s, _, _) = raw.send(M::GET, "/v1/servers", None).await;
    assert_eq!(s, 200);

    sim.set_faults(Faults {
        error_rate: 1.0,
        error_statuses: vec![404],
        error_routes: vec!["GET /v1/servers/{id}".into()],
        ..Faults::none()
    })
    .unwrap();
    let (s, _, e) = raw.send(M::GET, "/v1/servers/600101", None).await;
    assert_eq!((s, &e["error"]["code"]), (404, &json!("not_found")));
    sim.set_faults(Faults {
        error_rate: 1.0,
        error_statuses: vec![502],
        non_json_ratio: 1.0,
        ..Faults::none()
    })
    .unwrap();
    let resp = raw
        .http
        .get(format!("{}/v1/servers", raw.base))
        .bearer_auth(&raw.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().starts_with("<html>"), "a proxy's page");
    let stats = sim.stats();
    assert_eq!(stats.injected_errors, 3);
    assert_eq!(stats.route_status("GET /v1/floating_ips", 503), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn servers_and_locations_come_from_the_topology() {
    let sim = common::hetzner_sim(settings(0), Faults::none()).await;
    assert_eq!(sim.cloud(), CloudKind::Hetzner);
    assert_eq!(sim.project_id(), 0);
    let raw = Raw::new(&sim);
    let (s, _, list) = raw
        .send(M::GET, "/v1/servers?label_selector=role%3Dcontrol-plane", None)
        .await;
    assert_eq!(s, 200);
    let names: Vec<&str> = list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cp-0", "cp-1", "cp-2"]);
    let (_, _, one) = raw.send(M::GET, "/v1/servers?name=worker-1", None).await;
    let server = &one["servers"][0];
    assert_eq!(server["id"], 600_112);
    assert_eq!(server["status"], "running");
    assert_eq!(server["public_net"]["ipv4"]["ip"], "198.51.100.22");
    assert_eq!(server["private_net"][0]["ip"], "192.0.2.22");
    assert_eq!(server["location"]["name"], "fsn1");
    assert_eq!(server["location"]["network_zone"], "eu-central");
    assert!(server["created"].as_str().unwrap().ends_with("+00:00"));
    let (_, _, off) = raw.send(M::GET, "/v1/servers?status=off", None).await;
    assert_eq!(off["meta"]["pagination"]["total_entries"], 0);
    let (_, _, locations) = raw.send(M::GET, "/v1/locations", None).await;
    let zones: Vec<(&str, &str)> = locations["locations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap(), l["network_zone"].as_str().unwrap()))
        .collect();
    assert_eq!(
        zones[..3],
        [
            ("fsn1", "eu-central"),
            ("nbg1", "eu-central"),
            ("hel1", "eu-central")
        ]
    );
    let (s, _, hel) = raw.send(M::GET, "/v1/locations/3", None).await;
    assert_eq!((s, &hel["location"]["name"]), (200, &json!("hel1")));
    sim.shutdown().await;
}

#[tokio::test]
async fn the_state_file_round_trips_and_belongs_to_its_dialect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hetzner.json");
    let start = || {
        Sim::builder()
            .cloud(CloudKind::Hetzner)
            .hetzner(settings(0))
            .faults(Faults::none())
            .state_file(&path)
            .bind("127.0.0.1:0".parse().unwrap())
    };
    let sim = start().await.unwrap();
    let raw = Raw::new(&sim);
    let id = create(&raw, json!({"cluster": "kept"})).await["id"]
        .as_u64()
        .unwrap();
    let (s, _, _) = raw
        .send(
            M::POST,
            &format!("/v1/floating_ips/{id}/actions/assign"),
            Some(json!({"server": 600_103})),
        )
        .await;
    assert_eq!(s, 201);
    sim.shutdown().await;

    let sim = start().await.unwrap();
    let raw = Raw::new(&sim);
    let (_, _, fip) = raw.send(M::GET, &format!("/v1/floating_ips/{id}"), None).await;
    assert_eq!(fip["floating_ip"]["labels"]["cluster"], "kept");
    assert_eq!(fip["floating_ip"]["server"], 600_103);
    let next = create(&raw, json!({})).await["id"].as_u64().unwrap();
    assert_eq!(next, id + 1, "ids go on");
    sim.shutdown().await;

    // The Cherry dialect refuses a Hetzner world (and the other way round).
    let err = Sim::builder()
        .state_file(&path)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, SimError::State { .. }), "{err}");
    assert!(err.to_string().contains("hetzner"), "{err}");
}

#[tokio::test]
async fn assigns_to_a_failing_server_end_in_error_and_others_succeed() {
    let sim = common::hetzner_sim(
        HetznerSettings {
            action_fail_servers: vec!["worker-1".into()],
            ..settings(0)
        },
        Faults::none(),
    )
    .await;
    let raw = Raw::new(&sim);
    let id = create(&raw, json!({})).await["id"].as_u64().unwrap();
    for (server, status) in [(600_112, "error"), (600_111, "success")] {
        let (s, _, body) = raw
            .send(
                M::POST,
                &format!("/v1/floating_ips/{id}/actions/assign"),
                Some(json!({"server": server})),
            )
            .await;
        assert_eq!(
            (s, body["action"]["status"].as_str()),
            (201, Some(status)),
            "{server}"
        );
    }
    assert_eq!(
        sim.peek_ip(&id.to_string()).unwrap().target(),
        Some(ServerId(600_111))
    );
    sim.shutdown().await;
}
