//! The simulator and the lab's node faults together, as the failover benchmark uses them: real
//! kube-apiservers behind a FIP; the holder fails (hung, blackholed, partitioned), `/readyz`
//! through the FIP stops answering, and one retarget brings it back from the other node. The
//! servers are lab nodes and the FIP is routed to them, as the cloud does.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use baton_cloud::Cloud;
use baton_cloud::model::{CreateIpRequest, ServerId, Tags, TargetedTo};
use baton_sim::{Faults, Sim};
use baton_testbed::control_plane::ProxyMode;
use baton_testbed::{ControlPlane, Fault, Options, lab, node};

#[test]
fn readyz_through_the_fip_follows_a_retarget_away_from_a_failed_holder() {
    lab::run(|| async {
        // cp-0 (600101) on 198.51.100.11, cp-1 (600102) on 198.51.100.12, as in the topology.
        let mut cp = ControlPlane::start(Options {
            nodes: true,
            proxy_mode: ProxyMode::None,
            ..Options::servers(2)
        })
        .await
        .unwrap();
        let sim = Sim::builder()
            .faults(Faults::none())
            .route_fips(node::BRIDGE)
            .bind(std::net::SocketAddr::new(node::LAB_HOST, 0))
            .await
            .unwrap();
        let cloud = common::client(&sim, None);
        let fip = cloud
            .create_ip(CreateIpRequest {
                region: "LT-Siauliai".into(),
                tags: Tags::from([("cluster".to_owned(), "lab-cp".to_owned())]),
                targeted_to: Some(TargetedTo(Some(ServerId(600_101)))),
                ..Default::default()
            })
            .await
            .unwrap();
        for node in ["cp-0", "cp-1"] {
            common::accept(&cp, node, fip.address).await;
        }
        // One pooled client, as a real one keeps its connection to the FIP.
        let http = baton_testbed::http_client(Some(cp.ca_der())).unwrap();
        let url = format!("https://{}:6443/readyz", fip.address);
        let readyz = || async {
            http.get(&url)
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        };
        assert!(readyz().await, "through the FIP to cp-0");

        for fault in [Fault::Hang, Fault::Blackhole, Fault::Partition] {
            cp.inject(0, fault).await.unwrap();
            assert!(!readyz().await, "{fault}: the FIP still answered from cp-0");
            cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
            assert!(readyz().await, "{fault}: no answer from cp-1 after the retarget");
            cp.recover(0, fault).await.unwrap();
            cloud.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap();
            let mut back = false;
            for _ in 0..20 {
                back = readyz().await;
                if back {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            assert!(
                back,
                "{fault}: cp-0 did not answer through the FIP after recovering"
            );
        }
        sim.shutdown().await;
    });
}
