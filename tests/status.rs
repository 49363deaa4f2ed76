//! `baton status` against a real control plane, the simulator and a running `baton controller`,
//! in a lab: the JSON names the leader, the endpoint's holder and every candidate's health, and a
//! Service that cannot get a FIP with its reason; the exit code is the verdict.
//!
//! On the path real nodes have: three lab nodes (each its own network namespace and API
//! server), `baton agent` on each, the simulator routing the control-plane FIP to its holder as
//! the cloud does, the controller on cp-1 (the FIP starts on cp-0, whose API server is later
//! killed), and `baton status` run where docs/operations.md says to run it, on the controller's
//! node: its `--admin` URL is that node's loopback, and its probe of the FIP crosses the cloud's
//! route like anyone else's.
// in tests a panic is the failure report; the lab story reads best as one sequence
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use baton_sim::{Faults, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::Value;
use tokio::process::Child;

/// The binary under test.
const BATON: &str = env!("CARGO_BIN_EXE_baton");
const CP0: u64 = 600_101;
/// The lab node (index) the controller and `baton status` run on: not the FIP's first holder.
const NODE: usize = 1;
/// The controller's admin endpoint, on its node's loopback (the shipped default).
const ADMIN_LISTEN: &str = "127.0.0.1:9590";

/// `baton status` with the controller's settings, run on lab node cp-[`NODE`] (where its
/// `--admin` URL, the controller's loopback, is reachable); returns (exit code, stdout).
async fn status(
    cp: &ControlPlane,
    kubeconfig: &std::path::Path,
    sim: &baton_sim::SimHandle,
    extra: &[&str],
) -> (i32, String) {
    let out = cp
        .node_command(&format!("cp-{NODE}"), BATON)
        .unwrap()
        .arg("status")
        .args(extra)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CHERRY_API_KEY", sim.api_key())
        .env("CHERRY_PROJECT_ID", sim.project_id().to_string())
        .env("CHERRY_FIP_TAG", "cluster=lab-cp")
        .env("CHERRY_BASE_URL", sim.base_url().as_str())
        .env("CHERRY_LOAD_BALANCER", "empty://")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(sim.api_key()) && !stderr.contains(sim.api_key()),
        "the API key is printed"
    );
    (out.status.code().unwrap_or(-1), stdout)
}

#[test]
fn status_reports_leader_holder_candidates_and_a_pending_service() {
    lab::run(|| async {
        let mut cp = ControlPlane::start(Options {
            nodes: true,
            ..Options::servers(3)
        })
        .await
        .unwrap();
        let sim = common::routed_sim(Faults::none(), Topology::default()).await;
        let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), CP0).await;
        let fip_addr = SocketAddr::new(fip.address, 6443);
        let ca = cp.ca_der().to_vec();
        let client = cp.client(NODE).unwrap();
        let kubeconfig = cp.write_kubeconfig(NODE, ADMIN_TOKEN).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let _agents: Vec<Child> = (0..3)
            .map(|i| common::node::agent(&cp, BATON, i, &logs.path().join(format!("agent-{i}.log"))))
            .collect();
        // The controller on cp-1, its node's API server, its admin endpoint on that node's
        // loopback; it knows its Node (as the shipped Deployment's downward API gives it).
        let start_controller = |cp: &ControlPlane, log: &str| {
            common::node::command(
                cp,
                BATON,
                NODE,
                &[
                    "controller",
                    "--kubeconfig",
                    kubeconfig.to_str().unwrap(),
                    "--identity",
                    "replica-a",
                    "--node-name",
                    &format!("cp-{NODE}"),
                    "--admin-listen",
                    ADMIN_LISTEN,
                ],
                &logs.path().join(log),
            )
            .env("CHERRY_API_KEY", sim.api_key())
            .env("CHERRY_PROJECT_ID", sim.project_id().to_string())
            .env("CHERRY_FIP_TAG", "cluster=lab-cp")
            .env("CHERRY_BASE_URL", sim.base_url().as_str())
            // Service FIPs on, but no region: a Service without the region annotation waits.
            .env("CHERRY_LOAD_BALANCER", "empty://")
            .env("BATON_API_RATE_LIMIT", "0")
            .spawn()
            .unwrap()
        };
        let mut controller = start_controller(&cp, "controller.log");
        let admin = format!("http://{ADMIN_LISTEN}");

        common::namespace(&client, "apps").await;
        Api::<Service>::namespaced(client.clone(), "apps")
            .create(&PostParams::default(), &common::lb_service("apps", "web", &[]))
            .await
            .unwrap();
        common::wait_for("the leader Lease", Duration::from_secs(30), || {
            let api = Api::<Lease>::namespaced(client.clone(), "kube-system");
            async move {
                api.get_opt("baton-controller")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|l| l.spec?.holder_identity)
                    .as_deref()
                    == Some("replica-a")
            }
        })
        .await;
        common::wait_for("the mirror Service", Duration::from_secs(30), || {
            let api = Api::<Service>::namespaced(client.clone(), "kube-system");
            async move {
                api.get_opt("baton-kubernetes-external")
                    .await
                    .ok()
                    .flatten()
                    .is_some()
            }
        })
        .await;
        common::wait_for("the Service's Warning Event", Duration::from_secs(30), || {
            let api = Api::<Event>::namespaced(client.clone(), "apps");
            async move {
                api.list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|e| {
                        e.involved_object.name.as_deref() == Some("web")
                            && e.type_.as_deref() == Some("Warning")
                    })
            }
        })
        .await;

        // Every API server has registered itself in default/kubernetes (the candidates).
        common::wait_for(
            "three API servers in default/kubernetes",
            Duration::from_secs(30),
            || {
                let api = Api::<EndpointSlice>::namespaced(client.clone(), "default");
                async move {
                    api.list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
                        .await
                        .map_or(0, |l| {
                            l.items
                                .iter()
                                .map(|s| s.endpoints.iter().map(|e| e.addresses.len()).sum::<usize>())
                                .sum::<usize>()
                        })
                        == 3
                }
            },
        )
        .await;

        // The FIP answers through the cloud's route to cp-0, accepted there by its agent (once
        // the leader has written the FIP table).
        common::wait_for("the FIP answers", Duration::from_secs(60), || {
            common::readyz(&ca, fip_addr)
        })
        .await;

        let (code, out) = status(&cp, &kubeconfig, &sim, &["--output", "json", "--admin", &admin]).await;
        let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(code, 10, "degraded (a Service waits): {report:#}");
        // The replica's admin endpoints: it leads and is healthy.
        let controllers = report["controllers"].as_array().unwrap();
        assert_eq!(controllers.len(), 1, "{report:#}");
        assert_eq!(controllers[0]["role"], "leader", "{report:#}");
        assert_eq!(controllers[0]["healthy"], true, "{report:#}");
        assert_eq!(report["verdict"], "degraded", "{report:#}");
        assert_eq!(report["exitCode"], 10);
        assert_eq!(report["leader"]["holder"], "replica-a", "{report:#}");
        assert_eq!(report["leader"]["valid"], true);

        let endpoints = report["endpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 1, "{report:#}");
        let ep = &endpoints[0];
        assert_eq!(ep["service"], "kube-system/baton-kubernetes-external");
        assert_eq!(ep["fip"], fip.address.to_string());
        assert_eq!(ep["holder"]["id"], CP0);
        assert_eq!(ep["holder"]["hostname"], "cp-0");
        assert_eq!(ep["fipReady"], true, "{ep:#}");
        let candidates = ep["candidates"].as_array().unwrap();
        assert_eq!(candidates.len(), 3, "{ep:#}");
        assert!(candidates.iter().all(|c| c["ready"] == true), "{ep:#}");
        let holders: Vec<&Value> = candidates.iter().filter(|c| c["holder"] == true).collect();
        assert_eq!(holders.len(), 1);
        assert_eq!(holders[0]["server"]["hostname"], "cp-0");

        let pending = report["pendingServices"].as_array().unwrap();
        let web = pending
            .iter()
            .find(|s| s["service"] == "apps/web")
            .unwrap_or_else(|| panic!("apps/web is not listed: {report:#}"));
        let reason = web["reason"].as_str().unwrap();
        assert!(reason.contains("NoRegion"), "{reason}");
        assert!(report["cloud"]["reachable"] == true && report["kubernetes"]["reachable"] == true);

        // The human form says the same on one screen.
        let (code, text) = status(&cp, &kubeconfig, &sim, &[]).await;
        assert_eq!(code, 10);
        assert!(text.starts_with("baton status: DEGRADED (exit 10)"), "{text}");
        assert!(
            text.contains("replica-a") && text.contains("apps/web") && text.contains("cp-0"),
            "{text}"
        );
        eprintln!("{text}");

        // The waiting Service goes: nothing is wrong any more (exit 0).
        Api::<Service>::namespaced(client.clone(), "apps")
            .delete("web", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        common::wait_for("apps/web gone", Duration::from_secs(30), || {
            let api = Api::<Service>::namespaced(client.clone(), "apps");
            async move { api.get_opt("web").await.unwrap().is_none() }
        })
        .await;
        let (code, out) = status(&cp, &kubeconfig, &sim, &["--output", "json", "--admin", &admin]).await;
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(code, 0, "healthy: {report:#}");
        assert_eq!(report["verdict"], "healthy");
        assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
        assert!(
            report["endpoints"][0]["lastMove"].is_null(),
            "nothing moved yet: {report:#}"
        );
        let (code, text) = status(&cp, &kubeconfig, &sim, &[]).await;
        assert_eq!(code, 0);
        assert!(text.starts_with("baton status: HEALTHY (exit 0)"), "{text}");

        // No controller runs, and the holder's API server stops: nothing moves the FIP, so the
        // endpoint is down (exit 11), and no one leads.
        controller.kill().await.unwrap();
        cp.kill_apiserver(0).await;
        let (code, out) = status(&cp, &kubeconfig, &sim, &["--output", "json", "--admin", &admin]).await;
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(code, 11, "down: {report:#}");
        assert_eq!(report["verdict"], "down");
        let ep = &report["endpoints"][0];
        assert_eq!(ep["holder"]["hostname"], "cp-0", "{report:#}");
        assert_eq!(ep["fipReady"], false, "{report:#}");
        assert!(
            report["controllers"][0]["error"].is_string(),
            "the replica's admin endpoint does not answer: {report:#}"
        );
        let problems = report["problems"].to_string();
        assert!(
            problems.contains("the holder cp-0 fails its health check"),
            "{problems}"
        );

        // The controller is back: it moves the FIP; the move is on the screen, the dead
        // candidate still reported while default/kubernetes lists it (degraded), or gone.
        let _controller = start_controller(&cp, "controller-2.log");
        let report = common::eventually(
            Duration::from_secs(30),
            "the FIP moved away from cp-0",
            || async {
                let (code, out) =
                    status(&cp, &kubeconfig, &sim, &["--output", "json", "--admin", &admin]).await;
                let report: Value = serde_json::from_str(&out).unwrap();
                let ep = &report["endpoints"][0];
                (ep["holder"]["hostname"] != "cp-0" && ep["fipReady"] == true && !ep["lastMove"].is_null())
                    .then_some((code, report))
            },
        )
        .await;
        let (code, report) = report;
        assert!(code == 0 || code == 10, "{report:#}");
        let ep = &report["endpoints"][0];
        let moved = ep["lastMove"]["message"].as_str().unwrap();
        let to = ep["holder"]["hostname"].as_str().unwrap();
        assert!(
            moved.contains(to),
            "the last move names the new holder {to}: {moved}"
        );
        assert!(
            common::readyz(&ca, fip_addr).await,
            "the FIP answers from {to} through the cloud's route"
        );
        let failing: Vec<&Value> = ep["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["ready"] == false)
            .collect();
        assert!(failing.len() <= 1, "{report:#}");
        if let Some(dead) = failing.first() {
            assert_eq!(dead["server"]["hostname"], "cp-0");
            assert_eq!(code, 10, "a failing candidate is degraded: {report:#}");
        }
        let (_, text) = status(&cp, &kubeconfig, &sim, &["--admin", &admin]).await;
        assert!(text.contains(to) && text.contains("replica-a"), "{text}");
        eprintln!("{text}");
        drop(logs);
    });
}
