//! Where the simulator once differed from the real Cherry Servers API (found by running real
//! clients against it; issue #16), each checked on the wire: deleting an attached FIP is
//! refused, a server's own IPs are `targeted_to` it, `"tags": null` is accepted, the server list
//! honours `search`, and an empty forward-port list starts a simulator that forwards nothing.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use baton_sim::{Faults, SimOptions};
use common::Raw;
use reqwest::Method as M;
use serde_json::{Value, json};

async fn create_fip(raw: &Raw, body: Value) -> Value {
    let (s, _, ip) = raw.send(M::POST, "/v1/projects/123456/ips", Some(body)).await;
    assert_eq!(s, 201, "{ip}");
    ip
}

#[tokio::test]
async fn deleting_an_attached_fip_is_refused_by_default() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    let ip = create_fip(&raw, json!({"region": "LT-Siauliai", "targeted_to": 600_101})).await;
    let path = format!("/v1/ips/{}", ip["id"].as_str().unwrap());

    let (s, _, body) = raw.send(M::DELETE, &path, None).await;
    assert_eq!(s, 400);
    assert_eq!(
        body,
        json!({"code": 400, "message": "Attached IP address cannot be deleted"})
    );
    // still there, still targeted
    let (s, _, now) = raw.send(M::GET, &path, None).await;
    assert_eq!((s, now["targeted_to"]["id"].as_u64()), (200, Some(600_101)));

    // unassign, then delete: what Terraform and Ansible do
    let (s, _, _) = raw.send(M::PUT, &path, Some(json!({"targeted_to": "0"}))).await;
    assert_eq!(s, 200);
    assert_eq!(raw.send(M::DELETE, &path, None).await.0, 204);

    // a lenient API can still be asked for
    sim.set_faults(Faults {
        reject_delete_attached: false,
        ..Faults::none()
    })
    .unwrap();
    let ip = create_fip(&raw, json!({"region": "LT-Siauliai", "targeted_to": 600_102})).await;
    let path = format!("/v1/ips/{}", ip["id"].as_str().unwrap());
    assert_eq!(raw.send(M::DELETE, &path, None).await.0, 204);
    assert!(Faults::default().reject_delete_attached && Faults::none().reject_delete_attached);
}

#[tokio::test]
async fn primary_and_private_ips_are_targeted_to_their_server() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    let (_, _, ips) = raw.send(M::GET, "/v1/projects/123456/ips", None).await;
    let own: Vec<&Value> = ips
        .as_array()
        .unwrap()
        .iter()
        .filter(|ip| ip["type"] == "primary-ip" || ip["type"] == "private-ip")
        .collect();
    assert_eq!(own.len(), 12, "6 servers × (primary + private)");
    for ip in own {
        assert_eq!(ip["targeted_to"]["id"], ip["assigned_to"]["id"], "{ip}");
        assert!(ip["targeted_to"]["hostname"].is_string(), "{ip}");
        assert!(ip.get("routed_to").is_none(), "{ip}");
    }
    // the same inside a server's ip_addresses
    let (_, _, server) = raw.send(M::GET, "/v1/servers/600102", None).await;
    for ip in server["ip_addresses"].as_array().unwrap() {
        assert_eq!(ip["targeted_to"]["id"], 600_102, "{ip}");
        assert_eq!(ip["targeted_to"]["hostname"], "cp-1", "{ip}");
    }
    // an unassigned FIP still shows none
    let fip = create_fip(&raw, json!({"region": "LT-Siauliai"})).await;
    assert!(
        fip.get("targeted_to").is_none() && fip.get("routed_to").is_none(),
        "{fip}"
    );
}

#[tokio::test]
async fn creating_an_ip_accepts_null_tags() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    // what the official Python SDK sends when no tags are given
    let ip = create_fip(
        &raw,
        json!({"region": "LT-Siauliai", "routed_to": null, "targeted_to": null,
               "ptr_record": null, "a_record": null, "tags": null}),
    )
    .await;
    assert_eq!(ip["tags"], json!({}));
    assert!(ip.get("targeted_to").is_none());
}

#[tokio::test]
async fn server_list_search_matches_hostname_or_public_ip() {
    let sim = common::sim(Faults::none()).await;
    let raw = Raw::new(&sim);
    let search = |q: &'static str| {
        let raw = &raw;
        async move {
            let (s, h, list) = raw
                .send(M::GET, &format!("/v1/projects/123456/servers?search={q}"), None)
                .await;
            assert_eq!(s, 200);
            let names: Vec<String> = list
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["hostname"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(
                h["x-total-count"].to_str().unwrap(),
                names.len().to_string(),
                "{q}"
            );
            names
        }
    };
    assert_eq!(search("cp-").await, ["cp-0", "cp-1", "cp-2"]);
    assert_eq!(search("CP-1").await, ["cp-1"], "case-insensitive");
    assert_eq!(search("198.51.100.21").await, ["worker-0"], "public IP");
    assert_eq!(
        search("100.1").await,
        ["bootstrap", "cp-0", "cp-1", "cp-2"],
        "IP phrase"
    );
    assert!(
        search("192.0.2.11").await.is_empty(),
        "private IPs are not searched"
    );
    assert!(search("nothing").await.is_empty());
    assert_eq!(search("").await.len(), 6, "empty: no filter");
    // it composes with limit
    let (_, h, page) = raw
        .send(M::GET, "/v1/projects/123456/servers?search=cp&limit=1", None)
        .await;
    assert_eq!(
        (
            h["x-total-count"].to_str().unwrap(),
            page.as_array().unwrap().len()
        ),
        ("3", 1)
    );
}

#[tokio::test]
async fn an_empty_forward_port_list_forwards_nothing() {
    // `baton sim --forward-ports ''` gives these options (src/sim/tests.rs checks the parsing).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let options = SimOptions {
        listen,
        cloud: baton_sim::CloudKind::Cherry,
        hetzner: baton_sim::HetznerSettings::default(),
        topology: None,
        state: None,
        api_key: None,
        fip_pool: None,
        forward_ports: Some(Vec::new()),
        route_fips: None,
        faults: Faults::none(),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(baton_sim::serve(options, stop.clone().cancelled_owned()));
    let http = baton_testbed::http_client(None).unwrap();
    let mut state = Value::Null;
    for _ in 0..100 {
        if let Ok(resp) = http.get(format!("http://{listen}/_sim/state")).send().await {
            state = resp.json().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(state["forward_ports"], json!([]), "{state}");
    stop.cancel();
    server.await.unwrap().unwrap();
}
