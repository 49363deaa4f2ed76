//! The simulator routes FIPs as Cherry Servers does: in a lab with nodes, targeting a FIP puts
//! `<fip>/32 via <server>` in the hub's routing table, packets reach the node with the FIP as
//! their destination, and only a node that accepts them (here: an nftables redirect, what
//! baton's node agent installs) answers. Retargeting moves the route (open connections break
//! with a reset from the new holder); unassigning removes it; a propagation delay delays it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{CreateIpRequest, ServerId, Tags};
use baton_sim::{Faults, Sim, Topology};
use baton_testbed::{ControlPlane, Options, lab, node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Child;

const PORT: u16 = 7000;

/// A TCP server on `0.0.0.0:PORT` of lab node `name` answering every connection with the
/// node's name and the address the connection was made to, then keeping it open.
fn named_server(cp: &ControlPlane, name: &str) -> Child {
    let script = format!(
        "import socket\n\
         s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('0.0.0.0', {PORT})); s.listen(64)\n\
         keep = []\n\
         while True:\n\
         \x20   c, _ = s.accept(); keep.append(c)\n\
         \x20   c.sendall(('{name} ' + c.getsockname()[0] + '\\n').encode())\n"
    );
    cp.node_command(name, "python3")
        .unwrap()
        .args(["-c", &script])
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Connects to `addr` and reads the server's first line.
async fn hello(addr: SocketAddr) -> std::io::Result<(String, TcpStream)> {
    let mut conn = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(1), conn.read(&mut buf))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    Ok((String::from_utf8_lossy(&buf[..n]).trim().to_owned(), conn))
}

#[test]
fn a_targeted_fip_is_routed_to_its_node_with_the_fip_as_destination() {
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
            .topology(Topology::default())
            .faults(Faults::none())
            .route_fips(node::BRIDGE)
            .bind(SocketAddr::new(node::LAB_HOST, 0))
            .await
            .unwrap();
        let cloud = common::client(&sim, None);
        let fip = cloud
            .create_ip(CreateIpRequest {
                region: "LT-Siauliai".into(),
                tags: Tags::from([("cluster".to_owned(), "lab-route".to_owned())]),
                ..Default::default()
            })
            .await
            .unwrap();
        let addr = SocketAddr::new(fip.address, PORT);
        // Wait for the servers to listen (on the nodes' own addresses).
        for ip in [lab::public_ip(11), lab::public_ip(12)] {
            let mut ok = false;
            for _ in 0..100 {
                if hello(SocketAddr::new(ip, PORT)).await.is_ok() {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(ok, "the server on {ip} listens");
        }

        assert!(hello(addr).await.is_err(), "an unassigned FIP is not routed");

        // Routed to cp-0, which does not accept the FIP yet: its packets are dropped there.
        cloud.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap();
        let err = hello(addr).await.expect_err("nothing on cp-0 accepts the FIP");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");

        common::accept(&cp, "cp-0", fip.address).await;
        common::accept(&cp, "cp-1", fip.address).await;
        let (who, mut open) = hello(addr).await.unwrap();
        // The packets arrived with the FIP as destination: cp-0's redirect made them its own.
        assert_eq!(who, "cp-0 198.51.100.11");

        // One retarget: the next connection lands on cp-1; the one open to cp-0 is reset by
        // cp-1, which does not know it.
        cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        assert_eq!(hello(addr).await.unwrap().0, "cp-1 198.51.100.12");
        open.write_all(b"still there?").await.unwrap();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(2), open.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Err(ref e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "the old connection is reset by the new holder: {read:?}"
        );

        // A propagation delay: the route moves only after it.
        sim.set_faults(Faults {
            retarget_delay_ms: 800,
            ..Faults::none()
        })
        .unwrap();
        cloud.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap();
        assert_eq!(
            hello(addr).await.unwrap().0,
            "cp-1 198.51.100.12",
            "not yet moved"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            hello(addr).await.unwrap().0,
            "cp-0 198.51.100.11",
            "moved after the delay"
        );

        sim.set_faults(Faults::none()).unwrap();
        cloud.unassign_ip(&fip.id).await.unwrap();
        assert!(hello(addr).await.is_err(), "unassigned: no route any more");
        // The simulator's routes go with it.
        cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        assert!(hello(addr).await.is_ok());
        sim.shutdown().await;
        assert!(
            hello(addr).await.is_err(),
            "a stopped simulator leaves no route behind"
        );
    });
}
