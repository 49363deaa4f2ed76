//! The FIP splice (the opt-in for labs without nodes: `forward_ports`), in a lab (a private
//! network namespace where the documentation ranges are local): traffic to the FIP reaches the
//! server it is targeted to, and after one retarget call the other one. Labs with nodes route
//! the FIP instead (tests/route.rs).

mod common;

use std::net::SocketAddr;

use baton_cloud::Cloud;
use baton_cloud::model::{CreateIpRequest, ServerId, Tags};
use baton_sim::{Faults, Sim, Topology};
use baton_testbed::lab;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP server that answers every connection with `name`.
async fn named_server(addr: SocketAddr, name: &'static str) {
    let listener = TcpListener::bind(addr).await.expect("bind a lab address");
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 16];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let _ = conn
                    .write_all(format!("{name}:{}", String::from_utf8_lossy(&buf[..n])).as_bytes())
                    .await;
            });
        }
    });
}

async fn ask(addr: SocketAddr) -> std::io::Result<String> {
    let mut conn = TcpStream::connect(addr).await?;
    conn.write_all(b"hi").await?;
    let mut out = String::new();
    conn.read_to_string(&mut out).await?;
    Ok(out)
}

#[test]
fn traffic_follows_the_fip() {
    lab::run(|| async {
        const PORT: u16 = 6443;
        // Two "API servers" on two simulated servers' primary IPs (cp-0, cp-1).
        named_server(SocketAddr::new(lab::public_ip(11), PORT), "cp-0").await;
        named_server(SocketAddr::new(lab::public_ip(12), PORT), "cp-1").await;

        let sim = Sim::builder()
            .topology(Topology {
                forward_ports: vec![6443],
                ..Topology::default()
            })
            .faults(Faults::none())
            .bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let cloud = common::client(&sim, None);
        let tags = Tags::from([("cluster".to_owned(), "lab-cp".to_owned())]);
        let fip = cloud
            .create_ip(CreateIpRequest {
                region: "LT-Siauliai".into(),
                tags,
                ..Default::default()
            })
            .await
            .unwrap();
        let fip_addr = SocketAddr::new(fip.address, PORT);
        assert_eq!(fip.address, lab::fip(1));
        assert!(ask(fip_addr).await.is_err(), "an unassigned FIP accepts nothing");

        cloud.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap();
        assert_eq!(ask(fip_addr).await.unwrap(), "cp-0:hi");

        // One call moves it; the very next connection lands on the other server.
        cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        assert_eq!(ask(fip_addr).await.unwrap(), "cp-1:hi");
        assert_eq!(ask(fip_addr).await.unwrap(), "cp-1:hi");

        cloud.unassign_ip(&fip.id).await.unwrap();
        assert!(ask(fip_addr).await.is_err(), "unassigned again");
        sim.shutdown().await;
    });
}
