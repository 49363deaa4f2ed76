//! The node controller against a real API server and the simulator: Nodes tainted
//! uninitialized get their provider ID, addresses, labels and lose the taint; a Node whose server
//! is gone is deleted, but only after reads across a minute agree, and never on a 404 storm or
//! while the project cannot be read; a shut-down server's Node is tainted and reported.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use baton::controller::node::{self, PROVIDED_NODE_IP_ANNOTATION, SHUTDOWN_TAINT, UNINITIALIZED_TAINT};
use baton::controller::watches::Watches;
use baton_sim::{Faults, Topology};
use baton_testbed::lab;
use common::eventually;
use k8s_openapi::api::core::v1::{Event, Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(60);

fn node(name: &str, provider_id: Option<&str>, uninitialized: bool, annotations: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: provider_id.map(str::to_owned),
            taints: uninitialized.then(|| {
                vec![
                    Taint {
                        key: UNINITIALIZED_TAINT.into(),
                        value: Some("true".into()),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    },
                    Taint {
                        key: "example.com/keep".into(),
                        effect: "NoSchedule".into(),
                        ..Taint::default()
                    },
                ]
            }),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}

fn taints(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

async fn initialised(api: &Api<Node>, name: &str) -> Node {
    eventually(WAIT, &format!("{name} initialised"), || async {
        api.get_opt(name)
            .await
            .unwrap()
            .filter(|n| !taints(n).iter().any(|t| t == UNINITIALIZED_TAINT))
    })
    .await
}

#[test]
fn nodes_are_initialised_and_deleted_with_their_servers() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        let mut topology = Topology::default();
        // worker-1 is shut down.
        topology
            .servers
            .iter_mut()
            .find(|s| s.hostname == "worker-1")
            .unwrap()
            .state = "inactive".into();
        let sim = common::sim(Faults::none(), topology).await;
        let env = common::env_for(&sim, &[]);
        let ctx = common::context(client.clone(), &env).await;
        let api: Api<Node> = Api::all(client.clone());
        let pp = PostParams::default();

        // cp-0: no provider ID (found by hostname); worker-0: by provider ID, with --node-ip.
        api.create(&pp, &node("cp-0", None, true, &[])).await.unwrap();
        api.create(
            &pp,
            &node(
                "worker-0",
                Some("cherryservers://600111"),
                true,
                &[(PROVIDED_NODE_IP_ANNOTATION, "192.0.2.21")],
            ),
        )
        .await
        .unwrap();
        // Initialised earlier, server since deleted: the Node goes.
        api.create(&pp, &node("ghost", Some("cherryservers://999999"), false, &[]))
            .await
            .unwrap();
        // Initialised, server shut down: tainted and reported, not deleted.
        api.create(&pp, &node("worker-1", Some("cherryservers://600112"), false, &[]))
            .await
            .unwrap();
        // Another provider's Node: untouched.
        api.create(
            &pp,
            &node("elsewhere", Some("aws:///eu-west-1a/i-0abc"), false, &[]),
        )
        .await
        .unwrap();

        let (stop, rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut watches = Watches::new(&ctx.client);
        tokio::spawn(node::run_nodes(ctx, &mut watches, stopped(rx.clone())));
        tokio::spawn(watches.run(stopped(rx)));
        let started = tokio::time::Instant::now();

        let cp0 = initialised(&api, "cp-0").await;
        assert_eq!(
            cp0.spec.as_ref().unwrap().provider_id.as_deref(),
            Some("cherryservers://600101")
        );
        assert_eq!(
            addresses(&cp0),
            pairs(&[
                ("Hostname", "cp-0"),
                ("ExternalIP", "198.51.100.11"),
                ("InternalIP", "192.0.2.11")
            ])
        );
        let labels: &BTreeMap<String, String> = cp0.labels();
        assert_eq!(labels["node.kubernetes.io/instance-type"], "amd-ryzen-9950x");
        assert_eq!(labels["topology.kubernetes.io/region"], "LT-Siauliai");
        // Other taints stay (kube-controller-manager adds not-ready ones too).
        assert!(
            taints(&cp0).contains(&"example.com/keep".to_owned()),
            "{:?}",
            taints(&cp0)
        );

        let w0 = initialised(&api, "worker-0").await;
        assert_eq!(
            w0.spec.as_ref().unwrap().provider_id.as_deref(),
            Some("cherryservers://600111")
        );
        assert_eq!(
            addresses(&w0),
            pairs(&[
                ("InternalIP", "192.0.2.21"),
                ("Hostname", "worker-0"),
                ("ExternalIP", "198.51.100.21")
            ]),
            "--node-ip first"
        );

        // Not on the first 404: several reads across at least a minute must agree.
        eventually(2 * WAIT, "ghost deleted", || async {
            api.get_opt("ghost").await.unwrap().is_none().then_some(())
        })
        .await;
        assert!(
            started.elapsed() >= node::GONE_SPAN,
            "ghost deleted {:?} after the controller started, before the {:?} of agreeing reads",
            started.elapsed(),
            node::GONE_SPAN
        );
        let w1 = eventually(WAIT, "worker-1 tainted shut down", || async {
            api.get_opt("worker-1")
                .await
                .unwrap()
                .filter(|n| taints(n).iter().any(|t| t == SHUTDOWN_TAINT))
        })
        .await;
        assert!(w1.metadata.deletion_timestamp.is_none());
        let events = Api::<Event>::all(client.clone())
            .list(&ListParams::default().fields("involvedObject.kind=Node"))
            .await
            .unwrap()
            .items;
        let reasons: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                (
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                )
            })
            .collect();
        for want in [
            ("ghost", "ServerNotFound"),
            ("ghost", "DeletingNode"),
            ("worker-1", "ServerShutdown"),
            ("cp-0", "NodeInitialized"),
        ] {
            assert!(
                reasons.iter().any(|(n, r)| n == want.0 && r == want.1),
                "missing Event {want:?} in {reasons:?}"
            );
        }
        let elsewhere = api.get("elsewhere").await.unwrap();
        assert!(elsewhere.labels().is_empty() && addresses(&elsewhere).is_empty());
        stop.send(true).unwrap();
    });
}

async fn node_names(api: &Api<Node>) -> Vec<String> {
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    names.sort();
    names
}

/// Every server look-up answers 404 (the real API's 404, injected by the simulator): while the
/// project's server list cannot be read either, no Node is deleted, not even one whose server
/// really is gone; once the list answers, Nodes whose servers it shows are kept through the storm
/// and only the one whose server is really gone goes, a minute after the list showed it missing.
#[test]
fn a_404_storm_on_server_look_ups_deletes_no_node() {
    lab::run(|| async {
        baton_testbed::init_tracing();
        let (_cp, client) = common::control_plane_with_controllers().await;
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let env = common::env_for(&sim, &[]);
        let ctx = common::context(client.clone(), &env).await;
        let api: Api<Node> = Api::all(client.clone());
        let pp = PostParams::default();
        // Initialised, not Ready (no kubelet posts their status): their servers are checked.
        for (name, id) in [("cp-0", 600_101), ("cp-1", 600_102), ("ghost", 999_999)] {
            api.create(
                &pp,
                &node(name, Some(&format!("cherryservers://{id}")), false, &[]),
            )
            .await
            .unwrap();
        }
        let storm = |routes: &[&str]| Faults {
            error_rate: 1.0,
            error_statuses: vec![404],
            error_routes: routes.iter().map(|r| (*r).to_owned()).collect(),
            ..Faults::none()
        };
        // Phase 1: look-ups 404 and the project's list fails too (a key for the wrong project).
        sim.set_faults(storm(&["GET /v1/servers/{id}", "GET /v1/projects/{id}/servers"]))
            .unwrap();
        let (stop, rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut watches = Watches::new(&ctx.client);
        tokio::spawn(node::run_nodes(ctx, &mut watches, stopped(rx.clone())));
        tokio::spawn(watches.run(stopped(rx)));
        let all = vec!["cp-0".to_owned(), "cp-1".to_owned(), "ghost".to_owned()];
        let phase1 = tokio::time::Instant::now();
        while phase1.elapsed() < node::GONE_SPAN + node::GONE_RECHECK {
            assert_eq!(node_names(&api).await, all, "at {:?}", phase1.elapsed());
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let held = |name: &'static str| {
            let client = client.clone();
            async move {
                Api::<Event>::all(client)
                    .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("NodeDeletionHeld"))
            }
        };
        assert!(held("ghost").await, "the held deletion is reported on the Node");
        let lookups = sim.stats().route("GET /v1/servers/{id}");
        assert!(
            lookups >= 6,
            "the servers were checked through the storm: {lookups} look-ups"
        );

        // Phase 2: the list answers again, the look-ups still 404.
        sim.set_faults(storm(&["GET /v1/servers/{id}"])).unwrap();
        let phase2 = tokio::time::Instant::now();
        eventually(3 * WAIT, "ghost deleted", || async {
            let names = node_names(&api).await;
            assert!(
                names.contains(&"cp-0".to_owned()) && names.contains(&"cp-1".to_owned()),
                "a Node whose server the project lists was deleted: {names:?}"
            );
            (!names.contains(&"ghost".to_owned())).then_some(())
        })
        .await;
        assert!(
            phase2.elapsed() >= node::GONE_SPAN,
            "ghost deleted {:?} after the list showed it missing",
            phase2.elapsed()
        );
        // And the storm goes on a while: the listed ones stay.
        tokio::time::sleep(node::GONE_SPAN / 2).await;
        assert_eq!(node_names(&api).await, vec!["cp-0".to_owned(), "cp-1".to_owned()]);
        stop.send(true).unwrap();
    });
}
