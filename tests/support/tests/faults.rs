//! Failing a lab node in each class, proved with real clients: what a TCP connect and `/readyz`
//! see while the fault lasts, and after it is healed.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use baton_testbed::{APISERVER_PORT, ControlPlane, Fault, Options, lab};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// How a TCP connect to `addr` ends within 1 s.
#[derive(Debug, PartialEq, Eq)]
enum Connect {
    Accepted,
    Refused,
    TimedOut,
    Other(String),
}

async fn connect(addr: SocketAddr) -> Connect {
    match timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Connect::Accepted,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Connect::Refused,
        Ok(Err(e)) => Connect::Other(e.to_string()),
        Err(_) => Connect::TimedOut,
    }
}

fn api(cp: &ControlPlane, i: usize) -> SocketAddr {
    SocketAddr::new(cp.addresses()[i], APISERVER_PORT)
}

/// Whether `/readyz` of API server `i` answers 200 within 1 s.
async fn ready(cp: &ControlPlane, i: usize) -> bool {
    let client = baton_testbed::http_client(Some(cp.ca_der())).unwrap();
    client
        .get(format!("{}/readyz", cp.url(i)))
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Polls `ready` for up to 20 s (a resumed API server may need a moment).
async fn ready_again(cp: &ControlPlane, i: usize) -> bool {
    for _ in 0..40 {
        if ready(cp, i).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

#[test]
fn kill_and_hang() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options::servers(2)).await.unwrap();
        assert!(ready(&cp, 0).await);

        // Hang: the kernel still completes the handshake, the process answers nothing.
        cp.inject(0, Fault::Hang).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Hang]);
        assert_eq!(connect(api(&cp, 0)).await, Connect::Accepted);
        assert!(!ready(&cp, 0).await, "a hung API server answered /readyz");
        assert!(ready(&cp, 1).await, "the other node is not affected");
        cp.recover(0, Fault::Hang).await.unwrap();
        assert!(cp.faults(0).is_empty());
        assert!(ready_again(&cp, 0).await, "no answer after SIGCONT");

        // Kill: refused, until restarted.
        cp.inject(0, Fault::Kill).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Kill]);
        assert_eq!(connect(api(&cp, 0)).await, Connect::Refused);
        assert!(ready(&cp, 1).await);
        cp.recover(0, Fault::Kill).await.unwrap();
        assert!(ready(&cp, 0).await);

        // Killing a hung API server works and leaves it not hung.
        cp.hang(1).unwrap();
        cp.kill_apiserver(1).await;
        assert!(!cp.is_hung(1));
        assert_eq!(connect(api(&cp, 1)).await, Connect::Refused);
    });
}

#[test]
fn blackhole_drops_every_address_of_the_node() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options::servers(2)).await.unwrap();
        let addrs = cp.node_addresses(0);
        assert_eq!(addrs, [lab::public_ip(11), lab::private_ip(11)]);
        // Something else on the node's private address, and on the other node.
        let private = TcpListener::bind((lab::private_ip(11), 7000)).await.unwrap();
        let other = TcpListener::bind((lab::private_ip(12), 7000)).await.unwrap();
        assert_eq!(
            connect(SocketAddr::new(lab::private_ip(11), 7000)).await,
            Connect::Accepted
        );

        cp.blackhole(0).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Blackhole]);
        // Connects time out (dropped, not refused), on every address of the node, any port.
        assert_eq!(connect(api(&cp, 0)).await, Connect::TimedOut);
        assert_eq!(
            connect(SocketAddr::new(lab::private_ip(11), 7000)).await,
            Connect::TimedOut
        );
        assert_eq!(
            connect(SocketAddr::new(lab::public_ip(11), 1)).await,
            Connect::TimedOut,
            "a closed port is not refused either"
        );
        assert!(!ready(&cp, 0).await);
        // The other node is untouched.
        assert!(ready(&cp, 1).await);
        assert_eq!(
            connect(SocketAddr::new(lab::private_ip(12), 7000)).await,
            Connect::Accepted
        );

        cp.heal(0).await.unwrap();
        assert!(cp.faults(0).is_empty());
        assert!(ready(&cp, 0).await, "/readyz after heal");
        assert_eq!(
            connect(SocketAddr::new(lab::private_ip(11), 7000)).await,
            Connect::Accepted
        );
        drop((private, other));
    });
}

fn nft_table_exists() -> bool {
    std::process::Command::new("nft")
        .args(["list", "table", "inet", baton_testbed::fault::NFT_TABLE])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// `R`, `S`, `T` (stopped), `Z`… of a process, or `None` once it is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn partition_cuts_only_the_api_server_and_drop_removes_every_fault() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options::servers(2)).await.unwrap();
        let node: IpAddr = cp.addresses()[0];
        // A tiny listener on another port of the partitioned node.
        let side = TcpListener::bind((node, 7001)).await.unwrap();
        let accepts = tokio::spawn(async move {
            loop {
                if side.accept().await.is_err() {
                    return;
                }
            }
        });

        cp.inject(0, Fault::Partition).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Partition]);
        assert_eq!(connect(api(&cp, 0)).await, Connect::TimedOut);
        assert_eq!(
            connect(SocketAddr::new(lab::private_ip(11), APISERVER_PORT)).await,
            Connect::TimedOut,
            "the private address's API port is cut too"
        );
        assert_eq!(connect(SocketAddr::new(node, 7001)).await, Connect::Accepted);
        assert!(!ready(&cp, 0).await);
        assert!(ready(&cp, 1).await, "another node's API server still answers");

        cp.recover(0, Fault::Partition).await.unwrap();
        assert!(ready(&cp, 0).await, "/readyz after heal");

        // Faults left in place are undone when the control plane drops: no rule, no stopped
        // process left behind.
        cp.partition(0).await.unwrap();
        cp.blackhole(1).await.unwrap();
        cp.hang(1).unwrap();
        let pid = cp.apiserver_pid(1).unwrap();
        assert_eq!(proc_state(pid), Some('T'));
        assert!(nft_table_exists());
        drop(cp);
        assert!(!nft_table_exists(), "the nft table outlived the control plane");
        let mut state = proc_state(pid);
        for _ in 0..50 {
            if !matches!(state, Some('T' | 't')) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = proc_state(pid);
        }
        assert!(
            matches!(state, None | Some('Z' | 'X')),
            "API server {pid} left in state {state:?}"
        );
        accepts.abort();
    });
}

/// The same classes on lab nodes (each in its own network namespace, with a kubelet): the
/// network faults act on the node's link and on its own firewall, and a node can be powered
/// off.
#[test]
fn lab_nodes_fail_in_every_class() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options {
            kubelets: true,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        assert_eq!(cp.node_names(), ["cp-0", "cp-1"]);
        // The kubelet's port on the node's address: another port of the same node.
        let kubelet = SocketAddr::new(cp.addresses()[0], 10250);
        assert_eq!(connect(kubelet).await, Connect::Accepted);

        cp.inject(0, Fault::Hang).await.unwrap();
        assert!(!ready(&cp, 0).await, "hung");
        cp.recover(0, Fault::Hang).await.unwrap();
        assert!(ready_again(&cp, 0).await);

        cp.inject(0, Fault::Blackhole).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Blackhole]);
        assert_eq!(connect(api(&cp, 0)).await, Connect::TimedOut);
        assert_eq!(
            connect(kubelet).await,
            Connect::TimedOut,
            "the whole node is cut off"
        );
        assert!(ready(&cp, 1).await, "the other node still answers");
        cp.recover(0, Fault::Blackhole).await.unwrap();
        assert!(ready_again(&cp, 0).await);

        cp.inject(0, Fault::Partition).await.unwrap();
        assert_eq!(cp.faults(0), [Fault::Partition]);
        assert_eq!(connect(api(&cp, 0)).await, Connect::TimedOut);
        assert_eq!(
            connect(kubelet).await,
            Connect::Accepted,
            "only the API server port is cut"
        );
        // The node's own clients reach its API server without crossing the network, but it has
        // lost etcd: it serves nobody.
        let mut local = String::new();
        for _ in 0..40 {
            let out = cp
                .node_command("cp-0", "curl")
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
                .arg(format!("https://{}/readyz", api(&cp, 0)))
                .output()
                .await
                .unwrap();
            local = String::from_utf8_lossy(&out.stdout).into_owned();
            if local != "200" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_ne!(
            local, "200",
            "a partitioned node's API server still served its own node"
        );
        cp.recover(0, Fault::Partition).await.unwrap();
        assert!(ready_again(&cp, 0).await);

        cp.inject(0, Fault::Kill).await.unwrap();
        assert_eq!(connect(api(&cp, 0)).await, Connect::Refused);
        cp.recover(0, Fault::Kill).await.unwrap();
        assert!(ready_again(&cp, 0).await);

        // Powered off: nothing runs on the node any more, nothing answers.
        cp.kill_node("cp-0").await.unwrap();
        assert!(
            cp.node_processes("cp-0").is_empty(),
            "{:?}",
            cp.node_processes("cp-0")
        );
        assert_eq!(connect(api(&cp, 0)).await, Connect::TimedOut);
        assert!(ready(&cp, 1).await);
    });
}
