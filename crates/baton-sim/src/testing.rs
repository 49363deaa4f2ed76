//! Helpers for tests that run against the simulator: a simulator on loopback, and a client for
//! it with fast retries. Used by this crate's tests and by baton-cloud's.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // test helpers: a failure is a test failure

use std::time::Duration;

use crate::{Faults, Sim, SimHandle, Topology};
use baton_cloud::{CherryClient, ClientConfig};
use baton_core::Secret;

/// A simulator on 127.0.0.1:<random> with the lab topology.
pub async fn sim(faults: Faults) -> SimHandle {
    sim_with(Topology::default(), faults).await
}

pub async fn sim_with(topology: Topology, faults: Faults) -> SimHandle {
    Sim::builder()
        .topology(topology)
        .faults(faults)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// A client config for `sim` with fast backoff.
pub fn config(sim: &SimHandle, rate: Option<f64>) -> ClientConfig {
    let mut cfg =
        ClientConfig::new(Secret::new(sim.api_key()), sim.project_id()).with_base_url(sim.base_url());
    cfg.requests_per_second = rate;
    cfg.backoff_base = Duration::from_millis(10);
    cfg.backoff_cap = Duration::from_millis(200);
    cfg.request_timeout = Duration::from_secs(2);
    cfg.max_retries = 10;
    cfg
}

pub fn client(sim: &SimHandle, rate: Option<f64>) -> CherryClient {
    CherryClient::new(config(sim, rate)).unwrap()
}

/// A Hetzner-dialect simulator on 127.0.0.1:<random> with the lab topology.
pub async fn hetzner_sim(settings: crate::HetznerSettings, faults: Faults) -> SimHandle {
    Sim::builder()
        .cloud(crate::CloudKind::Hetzner)
        .hetzner(settings)
        .faults(faults)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}
