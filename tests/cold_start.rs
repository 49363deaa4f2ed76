//! Cold start: the whole control plane loses power and the endpoint comes back with no person
//! (docs/operations.md, "Cold start"). Three control-plane lab nodes with real kubelets that
//! reach the API through the endpoint's name, baton deployed as the demo's handoff deploys it
//! (agent DaemonSet, Deployment, standby DaemonSet), `systemd/baton-agent-boot.service` on every
//! node (`tests/common/coldstart.rs` has the lab and the measurements):
//!
//! 1. `all`: the three nodes rebooted at once;
//! 2. `holder-lost`: all down, the FIP's holder never returns, the other two start;
//! 3. `one-left`: all down, only one node that does not hold the FIP (and, when there is one,
//!    no Deployment replica either) returns.
//!
//! In each, `https://<FIP>:6443/readyz` answers from the lab host, every baton pod of the
//! returning nodes runs again and the Lease is held and renewed by one of them. Without the
//! boot unit nothing accepts the FIP after the reboot, the kubelets never reach an API server,
//! and nothing ever comes back (scenario 1 fails at d5e5b04).
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report

mod common;

use common::coldstart::{Lab, Scenario};

#[test]
fn the_endpoint_comes_back_after_the_whole_control_plane_loses_power() {
    baton_testbed::lab::run(|| async {
        let image = baton_testbed::baton_image().expect("baton's image (scripts/build-image)");
        let mut lab = Lab::start(image).await;
        for scenario in Scenario::ALL {
            let out = lab.run(scenario).await;
            eprintln!("coldstart: {out}");
            // The FIP is routed to a node that came back.
            assert!(
                out.returned.contains(&out.holder_after),
                "{}: the FIP ends on {} (returned: {:?})",
                scenario.name(),
                out.holder_after,
                out.returned
            );
            // Every returning node restored its FIP rules at boot, before its kubelet.
            assert_eq!(out.restored, out.returned, "{out}");
            match scenario {
                // The holder returned: nothing needs to move (a move while its API server was
                // still starting would be one at most).
                Scenario::All => assert!(out.retargets <= 1, "{out}"),
                // The holder is gone: exactly one move, by the one leader.
                Scenario::HolderLost => {
                    assert_eq!(out.retargets, 1, "one retarget away from the lost holder: {out}");
                }
                // The node that returned alone had no Deployment replica: its standby replica
                // took the Lease and moved the FIP.
                Scenario::OneLeft => {
                    assert_eq!(out.retargets, 1, "one retarget away from the lost holder: {out}");
                    assert!(out.led_by_standby, "the standby replica leads: {out}");
                }
            }
        }
    });
}
