//! The simulator's wire behaviour, checked with a plain HTTP client: status codes, headers,
//! error bodies, quirks, the admin endpoint, persistence.

// Test code: a failed unwrap is a failed test; short names mirror (status, headers, body);
// the wire walk-through reads best as one sequence.
#![allow(
    clippy::unwrap_used,
    clippy::many_single_char_names,
    clippy::similar_names,
    clippy::too_many_lines
)]

mod common;

use baton_sim::{Faults, Sim, Stats};
use common::Raw;
use reqwest::Method as M;
use serde_json::{Value, json};

#[tokio::test]
async fn status_codes_bodies_and_quirks() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);

    // 401 without a valid token, as JSON
    let resp = raw
        .http
        .get(format!("{}/v1/projects/123456", raw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], 401);
    assert!(body["message"].is_string());

    // 404 for unknown ids and routes, JSON too
    for path in [
        "/v1/ips/nope",
        "/v1/servers/1",
        "/v1/servers/abc",
        "/v1/projects/1/ips",
        "/v1/nothing",
    ] {
        let (s, _, b) = raw.send(M::GET, path, None).await;
        assert_eq!((s, b["code"].as_i64()), (404, Some(404)), "{path}");
    }
    let (s, _, b) = raw
        .send(M::POST, "/v1/projects/123456/ips", Some(json!("not an object")))
        .await;
    assert_eq!((s, b["code"].as_i64()), (400, Some(400)));

    // create: 201; region as slug, legacy name or id
    let mut ids = Vec::new();
    for region in [json!("LT-Siauliai"), json!("EU-Nord-1"), json!("1")] {
        let (s, _, ip) = raw
            .send(
                M::POST,
                "/v1/projects/123456/ips",
                Some(json!({"region": region, "tags": {"k": "v"}})),
            )
            .await;
        assert_eq!(s, 201, "{region}");
        assert_eq!(ip["type"], "floating-ip");
        assert_eq!(ip["region"]["slug"], "LT-Siauliai");
        assert_eq!(ip["tags"]["k"], "v");
        ids.push(ip["id"].as_str().unwrap().to_owned());
    }
    let id = &ids[0];

    // list: bare array, X-Total-Count, limit/offset, type filter
    let (s, h, list) = raw.send(M::GET, "/v1/projects/123456/ips", None).await;
    assert_eq!(s, 200);
    assert_eq!(h["x-total-count"], "15");
    assert_eq!(list.as_array().unwrap().len(), 15);
    let (_, h, page) = raw
        .send(M::GET, "/v1/projects/123456/ips?limit=2&offset=1", None)
        .await;
    assert_eq!(
        (
            h["x-total-count"].to_str().unwrap(),
            page.as_array().unwrap().len()
        ),
        ("15", 2)
    );
    let (_, _, fips) = raw
        .send(M::GET, "/v1/projects/123456/ips?type[]=floating-ip", None)
        .await;
    assert_eq!(fips.as_array().unwrap().len(), 3);

    // targeted_to as a number: 200, routed_to = primary IP object, targeted_to = server summary
    let (s, _, ip) = raw
        .send(
            M::PUT,
            &format!("/v1/ips/{id}"),
            Some(json!({"targeted_to": 600_103})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(ip["targeted_to"]["id"], 600_103);
    assert_eq!(ip["targeted_to"]["hostname"], "cp-2");
    assert_eq!(ip["routed_to"]["type"], "primary-ip");
    assert_eq!(ip["routed_to"]["address"], "198.51.100.13");
    // as a string
    let (s, _, ip) = raw
        .send(
            M::PUT,
            &format!("/v1/ips/{id}"),
            Some(json!({"targeted_to": "600101"})),
        )
        .await;
    assert_eq!((s, ip["targeted_to"]["id"].as_u64()), (200, Some(600_101)));
    // "0" unassigns, and so does 0
    for zero in [json!("0"), json!(0)] {
        raw.send(
            M::PUT,
            &format!("/v1/ips/{id}"),
            Some(json!({"targeted_to": "600101"})),
        )
        .await;
        let (s, _, ip) = raw
            .send(
                M::PUT,
                &format!("/v1/ips/{id}"),
                Some(json!({"targeted_to": zero})),
            )
            .await;
        assert_eq!(s, 200);
        assert!(
            ip.get("targeted_to").is_none() && ip.get("routed_to").is_none(),
            "{ip}"
        );
    }
    // tags are replaced wholesale; the target stays
    raw.send(
        M::PUT,
        &format!("/v1/ips/{id}"),
        Some(json!({"targeted_to": 600_101})),
    )
    .await;
    let (s, _, ip) = raw
        .send(
            M::PUT,
            &format!("/v1/ips/{id}"),
            Some(json!({"tags": {"x": "y"}})),
        )
        .await;
    assert_eq!((s, ip["tags"].clone()), (200, json!({"x": "y"})));
    assert_eq!(ip["targeted_to"]["id"], 600_101);
    // unchanged ptr_record: 500
    let ptr = json!({"ptr_record": "api.example.com"});
    assert_eq!(
        raw.send(M::PUT, &format!("/v1/ips/{id}"), Some(ptr.clone()))
            .await
            .0,
        200
    );
    assert_eq!(raw.send(M::PUT, &format!("/v1/ips/{id}"), Some(ptr)).await.0, 500);

    // projects and servers: PUT answers 201; server PUT has no ip_addresses
    let (s, _, p) = raw
        .send(
            M::PUT,
            "/v1/projects/123456",
            Some(json!({"name": "baton-lab", "bgp": true})),
        )
        .await;
    assert_eq!((s, p["bgp"]["enabled"].as_bool()), (201, Some(true)));
    let (s, _, srv) = raw
        .send(
            M::PUT,
            "/v1/servers/600101",
            Some(json!({"tags": {}, "bgp": true})),
        )
        .await;
    assert_eq!(s, 201);
    assert!(srv.get("ip_addresses").is_none());
    assert_eq!(srv["bgp"]["enabled"], true);
    let (_, _, srv) = raw.send(M::GET, "/v1/servers/600101", None).await;
    assert_eq!(srv["ip_addresses"].as_array().unwrap().len(), 2);
    let (_, h, servers) = raw.send(M::GET, "/v1/projects/123456/servers", None).await;
    assert_eq!(
        (
            h["x-total-count"].to_str().unwrap(),
            servers.as_array().unwrap().len()
        ),
        ("6", 6)
    );

    // regions by id or slug
    for key in ["1", "LT-Siauliai"] {
        let (s, _, r) = raw.send(M::GET, &format!("/v1/regions/{key}"), None).await;
        assert_eq!((s, r["bgp"]["asn"].as_u64()), (200, Some(16_125)));
    }

    // delete: 400 on an attached FIP (the default), then 204 once unassigned, then 404
    raw.send(
        M::PUT,
        &format!("/v1/ips/{id}"),
        Some(json!({"targeted_to": 600_101})),
    )
    .await;
    let (s, _, b) = raw.send(M::DELETE, &format!("/v1/ips/{id}"), None).await;
    assert_eq!(
        (s, b["message"].as_str()),
        (400, Some("Attached IP address cannot be deleted"))
    );
    raw.send(M::PUT, &format!("/v1/ips/{id}"), Some(json!({"targeted_to": 0})))
        .await;
    let (s, _, b) = raw.send(M::DELETE, &format!("/v1/ips/{id}"), None).await;
    assert_eq!((s, b), (204, Value::Null));
    assert_eq!(raw.send(M::DELETE, &format!("/v1/ips/{id}"), None).await.0, 404);
}

#[tokio::test]
async fn admin_endpoint_counts_and_changes_faults() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    raw.send(reqwest::Method::GET, "/v1/projects/123456", None).await;
    raw.send(
        reqwest::Method::PUT,
        "/v1/projects/123456",
        Some(json!({"bgp": true})),
    )
    .await;

    let stats: Stats = raw
        .http
        .get(format!("{}/_sim/stats", raw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats.requests, 2);
    assert_eq!(stats.writes, 1);
    assert_eq!(stats.route_status("PUT /v1/projects/{id}", 201), 1);
    assert_eq!(stats.with_status(200), 1);
    let log: Vec<Value> = raw
        .http
        .get(format!("{}/_sim/log?since=1", raw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["method"], "PUT");

    let patched: Value = raw
        .http
        .patch(format!("{}/_sim/faults", raw.base))
        .json(&json!({"error_rate": 1.0, "error_statuses": [503], "non_json_ratio": 0.0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(patched["error_rate"], 1.0);
    assert_eq!(patched["latency_ms"], 0, "other fields kept");
    let (s, _, b) = raw.send(reqwest::Method::GET, "/v1/regions", None).await;
    assert_eq!((s, b["code"].as_i64()), (503, Some(503)));
    let bad = raw
        .http
        .put(format!("{}/_sim/faults", raw.base))
        .json(&json!({"error_rate": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    let state: Value = raw
        .http
        .get(format!("{}/_sim/state", raw.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["api_key"], "<redacted>");
    raw.http
        .post(format!("{}/_sim/stats/reset", raw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(sim.stats().requests, 0);
}

/// A 404 storm on one route (`error_routes`): every server look-up answers 404 with the body a
/// real missing server gets, while the project's server list (another route) still answers.
#[tokio::test]
async fn a_404_storm_on_server_look_ups_looks_like_real_404s_and_spares_other_routes() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    let (s, _, real) = raw.send(M::GET, "/v1/servers/999999", None).await;
    assert_eq!(s, 404);
    sim.set_faults(Faults {
        error_rate: 1.0,
        error_statuses: vec![404],
        error_routes: vec!["GET /v1/servers/{id}".into()],
        // Ignored for a 4xx: the API itself answers it, in JSON.
        non_json_ratio: 1.0,
        ..Faults::none()
    })
    .unwrap();
    let (s, _, injected) = raw.send(M::GET, "/v1/servers/600101", None).await;
    assert_eq!(s, 404);
    assert_eq!(injected, real, "an injected 404 has a real one's body");
    let (s, _, list) = raw.send(M::GET, "/v1/projects/123456/servers", None).await;
    assert_eq!(s, 200, "the list is another route: {list}");
    assert!(
        list.as_array().unwrap().iter().any(|s| s["id"] == 600_101),
        "{list}"
    );
    let bad = sim.set_faults(Faults {
        error_routes: vec!["/v1/servers/{id}".into()],
        ..Faults::none()
    });
    assert!(
        bad.unwrap_err().to_string().contains("METHOD"),
        "a route without a method is refused"
    );
}

#[tokio::test]
async fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim-state.json");
    let start = || {
        Sim::builder()
            .faults(Faults::none())
            .state_file(&path)
            .bind("127.0.0.1:0".parse().unwrap())
    };

    let sim = start().await.unwrap();
    let raw = Raw::new(&sim);
    let (_, _, ip) = raw
        .send(
            reqwest::Method::POST,
            "/v1/projects/123456/ips",
            Some(json!({"region": "LT-Siauliai", "tags": {"a": "b"}})),
        )
        .await;
    let id = ip["id"].as_str().unwrap().to_owned();
    raw.send(
        reqwest::Method::PUT,
        &format!("/v1/ips/{id}"),
        Some(json!({"targeted_to": 600_102})),
    )
    .await;
    sim.shutdown().await;

    let sim = start().await.unwrap();
    let raw = Raw::new(&sim);
    let (s, _, ip) = raw
        .send(reqwest::Method::GET, &format!("/v1/ips/{id}"), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(ip["targeted_to"]["id"], 600_102);
    assert_eq!(ip["tags"]["a"], "b");
    // the next allocation does not reuse the address
    let (_, _, second) = raw
        .send(
            reqwest::Method::POST,
            "/v1/projects/123456/ips",
            Some(json!({"region": "LT-Siauliai"})),
        )
        .await;
    assert_ne!(second["address"], ip["address"]);
}
