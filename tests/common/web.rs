//! The workload of the tests that serve HTTP through a Service's Floating IP: baton's image
//! serving the simulator's HTTP API on the pod network (`baton sim --listen 0.0.0.0:8080`,
//! `GET /_sim/health` answers `ok`), a LoadBalancer Service in front of it, and the request the
//! host outside the cluster makes.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

/// Two replicas of `app: web` in namespace `apps`.
pub fn deployment() -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "apps"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": format!("baton:{}", env!("CARGO_PKG_VERSION")),
                    "imagePullPolicy": "Never",
                    "args": ["sim", "--listen", "0.0.0.0:8080"],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/_sim/health", "port": 8080}, "periodSeconds": 1},
                }]},
            },
        },
    }))
    .unwrap()
}

/// A LoadBalancer Service `apps/<name>` for the workload, port 80 → 8080, naming
/// `load_balancer_ip` and `class` if given.
pub fn service(
    name: &str,
    load_balancer_ip: Option<IpAddr>,
    class: Option<&str>,
    annotations: &serde_json::Value,
) -> Service {
    let mut spec = json!({
        "type": "LoadBalancer",
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
    });
    if let Some(ip) = load_balancer_ip {
        spec["loadBalancerIP"] = json!(ip.to_string());
    }
    if let Some(class) = class {
        spec["loadBalancerClass"] = json!(class);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "apps", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

/// `GET http://<fip>:80/_sim/health` within `timeout`: the body, or why nothing answered.
pub async fn health(fip: IpAddr, timeout: Duration) -> Result<String, String> {
    let client = baton_testbed::http_client(None).map_err(|e| e.to_string())?;
    let resp = client
        .get(format!("http://{fip}:80/_sim/health"))
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    resp.text().await.map_err(|e| e.to_string())
}
