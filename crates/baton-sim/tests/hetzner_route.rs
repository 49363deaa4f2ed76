//! The Hetzner dialect routes FIPs as the Cherry dialect does (`<fip>/32 via <server>` in the
//! lab's hub), but a move is an action: the route changes when the action succeeds, not when it
//! is posted. Checked on the wire of a lab with nodes, as tests/route.rs does for Cherry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use baton_sim::{CloudKind, Faults, HetznerSettings, Latency, Sim};
use baton_testbed::{ControlPlane, Options, lab, node};
use common::Raw;
use reqwest::Method as M;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::process::Child;

const PORT: u16 = 7000;

/// A TCP server on `0.0.0.0:PORT` of lab node `name` answering each connection with the node's
/// name.
fn named_server(cp: &ControlPlane, name: &str) -> Child {
    let script = format!(
        "import socket\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', {PORT})); s.listen(64)\n\
         while True:\n\
         \x20   c, _ = s.accept(); c.sendall(b'{name}\\n'); c.close()\n"
    );
    cp.node_command(name, "python3")
        .unwrap()
        .args(["-c", &script])
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Who answers on `addr` (`None`: nobody within a second).
async fn who(addr: SocketAddr) -> Option<String> {
    let attempt = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        let mut buf = [0u8; 32];
        let n = conn.read(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
}

/// Posts an assign (`Some(server)`) or an unassign and returns the running action's id.
async fn act(raw: &Raw, fip: u64, server: Option<u64>) -> u64 {
    let (path, body) = match server {
        Some(server) => ("assign", Some(json!({"server": server}))),
        None => ("unassign", None),
    };
    let (s, _, answer) = raw
        .send(M::POST, &format!("/v1/floating_ips/{fip}/actions/{path}"), body)
        .await;
    assert_eq!((s, &answer["action"]["status"]), (201, &json!("running")));
    answer["action"]["id"].as_u64().unwrap()
}

async fn wait_success(raw: &Raw, action: u64) {
    for _ in 0..200 {
        let (_, _, body) = raw.send(M::GET, &format!("/v1/actions/{action}"), None).await;
        match body["action"]["status"].as_str() {
            Some("running") => tokio::time::sleep(Duration::from_millis(50)).await,
            Some("success") => return,
            other => panic!("action {action}: {other:?}"),
        }
    }
    panic!("action {action} still runs");
}

#[test]
fn the_route_follows_an_action_when_it_succeeds() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: baton_testbed::control_plane::ProxyMode::None,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        let _servers = [named_server(&cp, "cp-0"), named_server(&cp, "cp-1")];
        let sim = Sim::builder()
            .cloud(CloudKind::Hetzner)
            .hetzner(HetznerSettings {
                action_ms: Latency::Fixed(2_500),
                ..HetznerSettings::default()
            })
            .faults(Faults::none())
            .route_fips(node::BRIDGE)
            .bind(SocketAddr::new(node::LAB_HOST, 0))
            .await
            .unwrap();
        let raw = Raw::new(&sim);
        let (s, _, created) = raw
            .send(
                M::POST,
                "/v1/floating_ips",
                Some(json!({"type": "ipv4", "home_location": "fsn1"})),
            )
            .await;
        assert_eq!(s, 201);
        let fip = created["floating_ip"]["id"].as_u64().unwrap();
        let address = created["floating_ip"]["ip"].as_str().unwrap().parse().unwrap();
        let addr = SocketAddr::new(address, PORT);
        for (node, host) in [("cp-0", 11), ("cp-1", 12)] {
            common::accept(&cp, node, address).await;
            let own = SocketAddr::new(lab::public_ip(host), PORT);
            let mut up = false;
            for _ in 0..100 {
                if who(own).await.is_some() {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(up, "the server on {node} listens");
        }
        assert_eq!(who(addr).await, None, "an unassigned FIP is not routed");

        // Posted: not routed yet; routed to cp-0 once the action succeeded.
        let action = act(&raw, fip, Some(600_101)).await;
        assert_eq!(who(addr).await, None, "routed before the action succeeded");
        wait_success(&raw, action).await;
        assert_eq!(who(addr).await.as_deref(), Some("cp-0"));

        // A move to cp-1: cp-0 keeps it while the action runs.
        let action = act(&raw, fip, Some(600_102)).await;
        assert_eq!(
            who(addr).await.as_deref(),
            Some("cp-0"),
            "moved before the action succeeded"
        );
        wait_success(&raw, action).await;
        assert_eq!(who(addr).await.as_deref(), Some("cp-1"));

        // An unassign: routed until it succeeds.
        let action = act(&raw, fip, None).await;
        assert_eq!(who(addr).await.as_deref(), Some("cp-1"));
        wait_success(&raw, action).await;
        assert_eq!(who(addr).await, None, "unassigned: no route any more");
        let (_, _, now) = raw.send(M::GET, &format!("/v1/floating_ips/{fip}"), None).await;
        assert_eq!(now["floating_ip"]["server"], Value::Null);
        sim.shutdown().await;
    });
}
