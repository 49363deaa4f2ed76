//! What a FIP retarget does to TCP forwarded through the FIP, in a lab: connections to the old
//! holder are reset on both sides, connections to an unchanged holder are untouched, and with a
//! propagation delay new connections keep following the old route for a while.

// Test code: a failed unwrap is a failed test; the scenario reads best as one sequence.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{CreateIpRequest, IpAddress, ServerId, Tags, TargetedTo};
use baton_sim::{Faults, Sim, SimHandle, Topology};
use baton_testbed::lab;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

const PORT: u16 = 6443;

/// An echo server on `addr` that prefixes every answer with `name` and reports each connection
/// that ends with a reset (`ECONNRESET`) on `resets`.
async fn echo_server(addr: SocketAddr, name: &'static str, resets: mpsc::UnboundedSender<&'static str>) {
    let listener = TcpListener::bind(addr).await.expect("bind a lab address");
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let resets = resets.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) => return,
                        Ok(n) => {
                            let reply = format!("{name}:{}", String::from_utf8_lossy(&buf[..n]));
                            if conn.write_all(reply.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            if e.kind() == ErrorKind::ConnectionReset {
                                let _ = resets.send(name);
                            }
                            return;
                        }
                    }
                }
            });
        }
    });
}

/// Sends `msg` on an open connection and reads the answer.
async fn say(conn: &mut TcpStream, msg: &str) -> std::io::Result<String> {
    conn.write_all(msg.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let n = timeout(Duration::from_secs(3), conn.read(&mut buf))
        .await
        .map_err(|_| std::io::Error::new(ErrorKind::TimedOut, "no answer within 3s"))??;
    if n == 0 {
        return Err(std::io::Error::new(ErrorKind::UnexpectedEof, "closed"));
    }
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A new connection through `addr`: who answers `msg`.
async fn ask(addr: SocketAddr, msg: &str) -> std::io::Result<String> {
    let mut conn = TcpStream::connect(addr).await?;
    say(&mut conn, msg).await
}

/// Waits until `conn` is reset by its peer; panics if it is closed otherwise or stays open.
async fn expect_reset(conn: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    match timeout(Duration::from_secs(3), conn.read(&mut buf)).await {
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => {}
        Ok(Err(e)) => panic!("{what}: ended with {e}, not a reset"),
        Ok(Ok(0)) => panic!("{what}: closed with FIN, not reset"),
        Ok(Ok(n)) => panic!("{what}: still answered {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(elapsed) => panic!("{what}: still open 3s after the retarget ({elapsed})"),
    }
}

/// A simulator that splices port 6443 of a targeted FIP (this lab has no nodes to route to).
async fn lab_sim(faults: Faults) -> SimHandle {
    Sim::builder()
        .topology(Topology {
            forward_ports: vec![6443],
            ..Topology::default()
        })
        .faults(faults)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// Replaces a FIP's tags with a plain `PUT /v1/ips/{id}` (the client has no tags-only write).
async fn put_tags(sim: &SimHandle, fip: &IpAddress, tags: serde_json::Value) {
    let url = sim.base_url().join(&format!("v1/ips/{}", fip.id)).unwrap();
    baton_testbed::http_client(None)
        .unwrap()
        .put(url)
        .bearer_auth(sim.api_key())
        .json(&serde_json::json!({ "tags": tags }))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
}

async fn new_fip(cloud: &impl Cloud, name: &str, target: Option<u64>) -> IpAddress {
    cloud
        .create_ip(CreateIpRequest {
            region: "LT-Siauliai".into(),
            tags: Tags::from([("cluster".to_owned(), name.to_owned())]),
            targeted_to: target.map(|t| TargetedTo(Some(ServerId(t)))),
            ..Default::default()
        })
        .await
        .unwrap()
}

#[test]
fn retarget_resets_connections_to_the_old_holder_only() {
    lab::run(|| async {
        let (tx, mut resets) = mpsc::unbounded_channel();
        echo_server(SocketAddr::new(lab::public_ip(11), PORT), "cp-0", tx.clone()).await;
        echo_server(SocketAddr::new(lab::public_ip(12), PORT), "cp-1", tx).await;
        let sim = lab_sim(Faults::none()).await;
        let cloud = common::client(&sim, None);

        let fip = new_fip(&cloud, "moves", Some(600_101)).await;
        let other = new_fip(&cloud, "stays", Some(600_102)).await;
        let fip_addr = SocketAddr::new(fip.address, PORT);
        let other_addr = SocketAddr::new(other.address, PORT);

        let mut to_old = TcpStream::connect(fip_addr).await.unwrap();
        assert_eq!(say(&mut to_old, "a").await.unwrap(), "cp-0:a");
        let mut via_other = TcpStream::connect(other_addr).await.unwrap();
        assert_eq!(say(&mut via_other, "b").await.unwrap(), "cp-1:b");

        // A write that keeps the holder (tags only) touches no connection.
        put_tags(&sim, &fip, serde_json::json!({"cluster": "moves-2"})).await;
        assert_eq!(say(&mut to_old, "c").await.unwrap(), "cp-0:c");

        // The retarget resets the open connection on both sides …
        let moved = cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        assert_eq!(moved.targeted_to.unwrap().id, ServerId(600_102));
        expect_reset(&mut to_old, "the client's connection to the old holder").await;
        let who = timeout(Duration::from_secs(3), resets.recv()).await;
        assert_eq!(who.ok().flatten(), Some("cp-0"), "the old holder's end is reset");
        // … and the next connection reaches the new holder.
        let mut to_new = TcpStream::connect(fip_addr).await.unwrap();
        assert_eq!(say(&mut to_new, "d").await.unwrap(), "cp-1:d");
        // The other FIP's connection (same server as the new holder, other FIP) is untouched.
        assert_eq!(say(&mut via_other, "e").await.unwrap(), "cp-1:e");

        // Retargeting to the holder it already has changes nothing.
        cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        assert_eq!(say(&mut to_new, "f").await.unwrap(), "cp-1:f");

        // Unassigning resets what is left and closes the listener.
        cloud.unassign_ip(&fip.id).await.unwrap();
        expect_reset(&mut to_new, "a connection through an unassigned FIP").await;
        assert!(
            ask(fip_addr, "g").await.is_err(),
            "an unassigned FIP accepts nothing"
        );
        assert_eq!(say(&mut via_other, "h").await.unwrap(), "cp-1:h");
        let who = timeout(Duration::from_secs(3), resets.recv()).await;
        assert_eq!(
            who.ok().flatten(),
            Some("cp-1"),
            "the holder's end is reset on unassign"
        );
        assert!(resets.try_recv().is_err(), "no other connection was reset");
        sim.shutdown().await;
    });
}

#[test]
fn with_a_propagation_delay_new_connections_follow_the_old_route_for_a_while() {
    const DELAY: Duration = Duration::from_secs(2);
    lab::run(|| async {
        let (tx, _resets) = mpsc::unbounded_channel();
        echo_server(SocketAddr::new(lab::public_ip(11), PORT), "cp-0", tx.clone()).await;
        echo_server(SocketAddr::new(lab::public_ip(12), PORT), "cp-1", tx).await;
        let sim = lab_sim(Faults {
            retarget_delay_ms: u64::try_from(DELAY.as_millis()).unwrap(),
            ..Faults::none()
        })
        .await;
        let cloud = common::client(&sim, None);

        // A FIP created targeted: the API says so at once, but there was no route before, so
        // connections are refused until the delay has passed.
        let fip = new_fip(&cloud, "delayed", Some(600_101)).await;
        let created = Instant::now();
        let fip_addr = SocketAddr::new(fip.address, PORT);
        assert_eq!(fip.targeted_to.as_ref().unwrap().id, ServerId(600_101));
        let early = TcpStream::connect(fip_addr).await;
        assert!(created.elapsed() < DELAY, "the machine is too slow for this test");
        assert_eq!(
            early.err().map(|e| e.kind()),
            Some(ErrorKind::ConnectionRefused),
            "no route yet"
        );
        tokio::time::sleep_until(created + DELAY + Duration::from_millis(300)).await;
        assert_eq!(ask(fip_addr, "a").await.unwrap(), "cp-0:a");

        // Retarget: answered at once with the new target …
        let mut before = TcpStream::connect(fip_addr).await.unwrap();
        assert_eq!(say(&mut before, "b").await.unwrap(), "cp-0:b");
        // The delay counts from when the write took effect: after it was sent, before its answer.
        let sent = Instant::now();
        let moved = cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
        let retargeted = Instant::now();
        assert_eq!(moved.targeted_to.unwrap().id, ServerId(600_102));
        assert_eq!(
            sim.peek_ip(&fip.id.0).unwrap().targeted_to.unwrap().id,
            ServerId(600_102)
        );
        // … but within the delay a new connection still reaches the old holder, and the open
        // one keeps working.
        let mut during = TcpStream::connect(fip_addr).await.unwrap();
        assert_eq!(say(&mut during, "c").await.unwrap(), "cp-0:c");
        assert_eq!(say(&mut before, "d").await.unwrap(), "cp-0:d");
        assert!(
            retargeted.elapsed() < DELAY,
            "the machine is too slow for this test"
        );

        // After the delay: both connections to the old holder are reset, new ones reach the
        // new holder.
        expect_reset(&mut before, "a connection opened before the retarget").await;
        expect_reset(&mut during, "a connection opened during the delay").await;
        assert!(sent.elapsed() >= DELAY, "reset before the delay was over");
        assert_eq!(ask(fip_addr, "e").await.unwrap(), "cp-1:e");

        // Unassign: the old route (cp-1) still serves during the delay, then nothing.
        cloud.unassign_ip(&fip.id).await.unwrap();
        let unassigned = Instant::now();
        assert_eq!(ask(fip_addr, "f").await.unwrap(), "cp-1:f");
        assert!(
            unassigned.elapsed() < DELAY,
            "the machine is too slow for this test"
        );
        tokio::time::sleep_until(unassigned + DELAY + Duration::from_millis(300)).await;
        assert_eq!(
            TcpStream::connect(fip_addr).await.err().map(|e| e.kind()),
            Some(ErrorKind::ConnectionRefused)
        );
        sim.shutdown().await;
    });
}
