//! `baton-lab`: start a real control plane in a fresh lab and run a command inside that lab.
//!
//! ```text
//! baton-lab [--servers N] [--bootstrap] [--nodes N] [--controller-manager]
//!           [--kubelets [--image ARCHIVE[=REPOSITORY]]…] -- CMD [ARGS…]
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
//!   then lists the nodes as `name=address` pairs.
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
         [--kubelets [--image ARCHIVE[=REPOSITORY]]...] -- CMD [ARGS...]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut servers = 3u8;
    let mut kcm = false;
    let mut bootstrap = false;
    let mut nodes = 0u8;
    let mut kubelets = false;
    let mut images = Vec::new();
    let mut cmd = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--servers" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if (1..=9).contains(&n) => servers = n,
                _ => return usage(),
            },
            "--controller-manager" => kcm = true,
            "--bootstrap" => bootstrap = true,
            "--kubelets" => kubelets = true,
            "--image" => match args.next() {
                Some(a) => images.push(NodeImage::parse(&a)),
                None => return usage(),
            },
            "--nodes" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n <= 9 => nodes = n,
                _ => return usage(),
            },
            "--" => {
                cmd.extend(args.by_ref());
                break;
            }
            _ => return usage(),
        }
    }
    if cmd.is_empty() {
        return usage();
    }
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
        let started = tokio::time::Instant::now();
        let cp = match ControlPlane::start(opts).await {
            Ok(cp) => cp,
            Err(e) => {
                eprintln!("baton-lab: control plane failed to start: {e:#}");
                return ExitCode::FAILURE;
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
                cp.apiserver_of_node(n)
                    .map(|i| format!("{n}={}", cp.addresses()[i]))
            })
            .collect();
        if kubelets {
            // The kubelets registered their Nodes.
        } else if let Err(e) = cp.register_nodes(nodes.into()).await {
            eprintln!("baton-lab: registering Nodes failed: {e:#}");
            return ExitCode::FAILURE;
        }
        if nodes > 0 {
            eprintln!(
                "baton-lab: registered Nodes cp-0..cp-{} (uninitialized)",
                nodes - 1
            );
        }
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).expect("kubeconfig");
        let ca = cp.dir().join("ca.crt");
        let status = tokio::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .env("KUBECONFIG", &kubeconfig)
            .env("BATON_LAB_DIR", cp.dir())
            .env("BATON_LAB_APISERVERS", addrs.join(","))
            .env("BATON_LAB_CA", &ca)
            .env("BATON_LAB_NODES", node_list.join(","))
            .env("BATON_LAB", "1")
            .status()
            .await;
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
