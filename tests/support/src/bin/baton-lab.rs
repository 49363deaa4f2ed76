//! `baton-lab`: start a real control plane in a fresh lab and run a command inside that lab.
//!
//! ```text
//! baton-lab [--servers N] [--bootstrap] [--nodes N] [--controller-manager]
//!           [--kubelets [--image ARCHIVE[=REPOSITORY]]… [--kubelets-via URL --node-dns IP]]
//!           -- CMD [ARGS…]
//! ```
//!
//! - `--servers N`: control-plane API servers on 198.51.100.11, .12, … (the simulator's cp-0…).
//! - `--bootstrap`: one more API server first, on 198.51.100.10 (the simulator's `bootstrap`
//!   host); `KUBECONFIG` then points at it, as on a bootstrap host.
//! - `--nodes N`: registers Nodes cp-0…cp-(N-1) as kubelets started with
//!   `--cloud-provider=external` do: no provider ID, tainted
//!   `node.cloudprovider.kubernetes.io/uninitialized` until a cloud controller initialises them.
//! - `--kubelets`: instead, every control-plane server is a lab node (`baton_testbed::node`):
//!   its own network namespace on the lab bridge, a real kubelet with containerd + runc,
//!   kube-controller-manager and kube-scheduler; the kubelets register cp-0… themselves
//!   (`--cloud-provider=external`: tainted uninitialized). `--image` loads an OCI archive into
//!   every node's runtime (repository default `docker.io/library/baton`). `BATON_LAB_NODES`
//!   then lists the nodes as `name=address=netns` (comma-separated).
//! - `--kubelets-via URL`: once the nodes are Ready, every kubelet is pointed at `URL` (e.g.
//!   `https://api-int.baton.test:6443`, the endpoint's name, as kubeadm's workers and OpenShift's
//!   nodes reach the API) and restarted; `--node-dns IP` makes `IP` every node's DNS server
//!   (`/etc/resolv.conf`), e.g. where `baton bootstrap` will serve the name.
//!
//! CMD runs in the lab's network namespace with `KUBECONFIG` (admin, API server 0),
//! `BATON_LAB_DIR` (PKI, kubeconfigs, logs), `BATON_LAB_APISERVERS` (comma-separated addresses)
//! and `BATON_LAB_CA` (the cluster CA file) set. Everything stops when CMD exits; its exit code is
//! returned.

use std::process::ExitCode;

use baton_testbed::{ADMIN_TOKEN, ControlPlane, NodeImage, Options, lab};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

fn usage() -> ExitCode {
    eprintln!(
        "usage: baton-lab [--servers N] [--bootstrap] [--nodes N] [--controller-manager] \
         [--kubelets [--image ARCHIVE[=REPOSITORY]]... [--kubelets-via URL --node-dns IP]] -- CMD [ARGS...]"
    );
    ExitCode::from(2)
}

/// The command line.
struct Args {
    servers: u8,
    kcm: bool,
    bootstrap: bool,
    nodes: u8,
    kubelets: bool,
    images: Vec<NodeImage>,
    kubelets_via: Option<String>,
    node_dns: Option<std::net::IpAddr>,
    cmd: Vec<String>,
}

fn parse_args() -> Option<Args> {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        servers: 3,
        kcm: false,
        bootstrap: false,
        nodes: 0,
        kubelets: false,
        images: Vec::new(),
        kubelets_via: None,
        node_dns: None,
        cmd: Vec::new(),
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--servers" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if (1..=9).contains(&n) => out.servers = n,
                _ => return None,
            },
            "--controller-manager" => out.kcm = true,
            "--bootstrap" => out.bootstrap = true,
            "--kubelets" => out.kubelets = true,
            "--image" => out.images.push(NodeImage::parse(&args.next()?)),
            "--kubelets-via" => out.kubelets_via = Some(args.next()?),
            "--node-dns" => out.node_dns = Some(args.next()?.parse().ok()?),
            "--nodes" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n <= 9 => out.nodes = n,
                _ => return None,
            },
            "--" => {
                out.cmd.extend(args.by_ref());
                break;
            }
            _ => return None,
        }
    }
    (!out.cmd.is_empty() && (out.kubelets || out.kubelets_via.is_none())).then_some(out)
}

fn main() -> ExitCode {
    let Some(Args {
        servers,
        kcm,
        bootstrap,
        nodes,
        kubelets,
        images,
        kubelets_via,
        node_dns,
        cmd,
    }) = parse_args()
    else {
        return usage();
    };
    lab::run(move || async move {
        let mut opts = Options {
            controller_manager: kcm,
            kubelets,
            images,
            ..Options::servers(servers)
        };
        if bootstrap {
            opts.servers.insert(0, lab::public_ip(10));
        }
        // Signals while the lab starts stop it too: dropping the unfinished start powers off
        // whatever nodes it had made.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        let (mut cp, addrs, node_list) = tokio::select! {
            p = prepare(opts, kubelets, nodes) => match p {
                Ok(p) => p,
                Err(code) => return code,
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("baton-lab: interrupted while starting; stopping the lab");
                return ExitCode::from(130);
            }
            _ = term.recv() => {
                eprintln!("baton-lab: terminated while starting; stopping the lab");
                return ExitCode::from(143);
            }
        };
        if let Some(server) = node_dns
            && let Err(e) = cp.set_node_nameserver(server)
        {
            eprintln!("baton-lab: setting the nodes' DNS server failed: {e:#}");
            return ExitCode::FAILURE;
        }
        if let Some(url) = &kubelets_via {
            if let Err(e) = cp.point_kubelets_at(url).await {
                eprintln!("baton-lab: pointing the kubelets at {url} failed: {e:#}");
                return ExitCode::FAILURE;
            }
            eprintln!("baton-lab: every kubelet now reaches the API through {url}");
        }
        let status = run_cmd(&cp, &cmd, &addrs, &node_list).await;
        drop(cp);
        match status {
            Ok(s) => ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1)),
            Err(e) => {
                eprintln!("baton-lab: cannot run {}: {e}", cmd[0]);
                ExitCode::from(127)
            }
        }
    })
}

/// Starts the control plane (and lab nodes), waits for `default/kubernetes`, registers Nodes;
/// the running control plane, its API server addresses and `BATON_LAB_NODES`' entries.
async fn prepare(
    opts: Options,
    kubelets: bool,
    nodes: u8,
) -> Result<(ControlPlane, Vec<String>, Vec<String>), ExitCode> {
    let started = tokio::time::Instant::now();
    let cp = match ControlPlane::start(opts).await {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("baton-lab: control plane failed to start: {e:#}");
            return Err(ExitCode::FAILURE);
        }
    };
    let addrs: Vec<String> = cp.addresses().iter().map(ToString::to_string).collect();
    eprintln!(
        "baton-lab: {} kube-apiserver(s) ready in {:.1}s on {} (files in {})",
        addrs.len(),
        started.elapsed().as_secs_f64(),
        addrs.join(", "),
        cp.dir().display()
    );
    // default/kubernetes fills in as each API server's lease reconciler runs.
    let slices = Api::<EndpointSlice>::namespaced(cp.client(0).expect("client"), "default");
    for _ in 0..60 {
        let lp = ListParams::default().labels("kubernetes.io/service-name=kubernetes");
        let n = slices
            .list(&lp)
            .await
            .map_or(0, |l| l.items.iter().flat_map(|s| &s.endpoints).count());
        if n == addrs.len() {
            eprintln!("baton-lab: default/kubernetes lists all {n} API servers");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    if kubelets {
        eprintln!(
            "baton-lab: lab nodes {} Ready (kubelet + containerd each)",
            cp.node_names().join(", ")
        );
    }
    let node_list: Vec<String> = cp
        .node_names()
        .iter()
        .filter_map(|n| {
            let i = cp.apiserver_of_node(n)?;
            Some(format!("{n}={}={}", cp.addresses()[i], cp.node_netns(n)?))
        })
        .collect();
    if !kubelets {
        if let Err(e) = cp.register_nodes(nodes.into()).await {
            eprintln!("baton-lab: registering Nodes failed: {e:#}");
            return Err(ExitCode::FAILURE);
        }
        if nodes > 0 {
            eprintln!(
                "baton-lab: registered Nodes cp-0..cp-{} (uninitialized)",
                nodes - 1
            );
        }
    }
    Ok((cp, addrs, node_list))
}

/// Runs CMD in the lab with the lab's environment; its exit status.
async fn run_cmd(
    cp: &ControlPlane,
    cmd: &[String],
    addrs: &[String],
    node_list: &[String],
) -> std::io::Result<std::process::ExitStatus> {
    let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).expect("kubeconfig");
    let ca = cp.dir().join("ca.crt");
    // CMD dies with this process (--pdeathsig); SIGINT/SIGTERM to baton-lab stop CMD first
    // and then everything in the lab (nodes, containers, API servers), so nothing outlives
    // it.
    let child = tokio::process::Command::new("setpriv")
        .args(["--pdeathsig", "TERM", "--"])
        .args(cmd)
        .env("KUBECONFIG", &kubeconfig)
        .env("BATON_LAB_DIR", cp.dir())
        .env("BATON_LAB_APISERVERS", addrs.join(","))
        .env("BATON_LAB_CA", &ca)
        .env("BATON_LAB_NODES", node_list.join(","))
        .env("BATON_LAB", "1")
        .kill_on_drop(true)
        .spawn();
    match child {
        Ok(mut child) => {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("SIGTERM handler");
            tokio::select! {
                s = child.wait() => s,
                _ = tokio::signal::ctrl_c() => stop(&mut child).await,
                _ = term.recv() => stop(&mut child).await,
            }
        }
        Err(e) => Err(e),
    }
}

/// SIGTERM to CMD, SIGKILL 10 s later; its exit status.
async fn stop(child: &mut tokio::process::Child) -> std::io::Result<std::process::ExitStatus> {
    eprintln!("baton-lab: interrupted; stopping the command and the lab");
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid.cast_signed()),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if let Ok(s) = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait()).await {
        s
    } else {
        child.kill().await?;
        child.wait().await
    }
}
