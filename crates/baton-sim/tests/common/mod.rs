//! Shared helpers of the integration tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)] // test helpers: a failure is a test failure

use std::time::Duration;

use baton_cloud::{CherryClient, ClientConfig};
use baton_core::Secret;
use baton_sim::{Faults, Sim, SimHandle, Topology};
use serde_json::Value;

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

/// A plain HTTP client for the simulator's wire format (status, headers, JSON body).
pub struct Raw {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Raw {
    pub fn new(sim: &baton_sim::SimHandle) -> Self {
        Self {
            http: baton_testbed::http_client(None).unwrap(),
            base: format!("http://{}", sim.addr()),
            token: sim.api_key().to_owned(),
        }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap()
        };
        (status, headers, value)
    }
}
