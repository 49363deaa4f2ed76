//! Shared helpers of the integration tests: the simulator's own (`baton_sim::testing`), and a
//! raw HTTP client for its wire format.
#![allow(unused_imports, unreachable_pub, dead_code, clippy::unwrap_used)] // each test binary uses a subset

use serde_json::Value;

pub use baton_sim::testing::*;

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

/// Makes lab node `name` accept packets addressed to `fip` (a DNAT to its own address in the
/// prerouting hook), as baton's node agent does on a control-plane node.
pub async fn accept(cp: &baton_testbed::ControlPlane, name: &str, fip: std::net::IpAddr) {
    let rules = format!(
        "table ip lab_accept {{ chain prerouting {{ type nat hook prerouting priority dstnat; ip daddr {fip} redirect; }}; }}"
    );
    cp.node_nft(name, &rules).await.unwrap();
}
