//! Lab nodes without kubelets: each API server in its own network namespace on the lab bridge,
//! with a real kube-proxy; the hub routes, forwards and makes no FIP local.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use baton_testbed::control_plane::ProxyMode;
use baton_testbed::{ControlPlane, Options, lab};

/// `curl` on lab node `name`: the HTTP status of `url` (`000` when nothing answered).
async fn curl_on(cp: &ControlPlane, name: &str, url: &str) -> String {
    let out = cp
        .node_command(name, "curl")
        .unwrap()
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-m",
            "2",
            "--cacert",
        ])
        .arg(cp.dir().join("ca.crt"))
        .arg(url)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kube-proxy in `mode` on every node makes the `kubernetes` Service's ClusterIP (10.0.0.1)
/// answer on each of them, the way pods and kubelets reach the API in a cluster.
fn cluster_ip_answers_on_every_node(mode: ProxyMode) {
    lab::run(move || async move {
        let cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: mode,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        assert_eq!(cp.node_names(), ["cp-0", "cp-1"]);
        for name in cp.node_names() {
            let mut last = String::new();
            for _ in 0..120 {
                last = curl_on(&cp, &name, "https://10.0.0.1:443/readyz").await;
                if last == "200" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            assert_eq!(last, "200", "{mode:?}: the ClusterIP from {name}");
        }
        // The hub is a router, not a host of the FIP range: nothing there answers a FIP.
        let fip = std::net::SocketAddr::new(lab::fip(9), 6443);
        let err = tokio::net::TcpStream::connect(fip)
            .await
            .expect_err("no FIP is local in the hub");
        assert_ne!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    });
}

#[test]
fn kube_proxy_iptables_on_lab_nodes() {
    cluster_ip_answers_on_every_node(ProxyMode::Iptables);
}

#[test]
fn kube_proxy_nftables_on_lab_nodes() {
    cluster_ip_answers_on_every_node(ProxyMode::Nftables);
}
