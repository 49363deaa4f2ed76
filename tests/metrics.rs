//! What an operator scrapes and reads: every metric docs/operations.md names is on `/metrics` of
//! the real `baton controller` binary, the new gauges and the cloud counters carry the values the
//! scenario implies, and the Events docs/operations.md promises on the Lease and the endpoint
//! Service are recorded. Real API server and KCM, the simulator over HTTP, in a lab.
#![allow(clippy::unwrap_used, clippy::expect_used)] // in tests a panic is the failure report
#![allow(clippy::too_many_lines)] // scenario tests read top to bottom

mod common;

use std::process::Stdio;
use std::time::Duration;

use baton_sim::{Faults, Topology};
use baton_testbed::{ADMIN_TOKEN, ControlPlane, Options, lab};
use common::{eventually, ingress, lb_service, metric_sum, namespace};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};
use tokio::process::Command;

const ADMIN: &str = "127.0.0.1:9590";
const WAIT: Duration = Duration::from_secs(60);

/// The metric names docs/operations.md lists in its "Metrics" section.
fn documented_metrics() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let section = doc
        .split("\n## Metrics\n")
        .nth(1)
        .expect("docs/operations.md has a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut names: Vec<String> = section
        .lines()
        .filter(|l| l.starts_with("| `baton_"))
        .map(|l| l.trim_start_matches("| `").split('`').next().unwrap().to_owned())
        .collect();
    names.dedup();
    names
}

async fn scrape() -> Option<String> {
    let client = baton_testbed::http_client(None).unwrap();
    let r = client
        .get(format!("http://{ADMIN}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    r.text().await.ok()
}

async fn event(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Event {
    eventually(WAIT, &format!("Event {reason} on {ns}/{name}"), || async {
        Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
    })
    .await
}

/// No nodes: one API server and nothing fails, so no FIP moves (the failover metrics are only
/// checked to be declared, `# TYPE`; no failover is caused to count one). The simulator's
/// splice (`common::spliced`) only makes the control-plane FIP answer somewhere, so that the
/// endpoint loop sees a healthy endpoint, as it would in a working cluster; a routed FIP would
/// need lab nodes with agents and would change nothing this test reads (the routed path is
/// `tests/datapath.rs`'s and `tests/placement.rs`'s).
#[test]
fn every_documented_metric_is_served_and_the_operator_signals_are_true() {
    lab::run(|| async {
        let names = documented_metrics();
        assert!(
            names.len() >= 20,
            "the Metrics section lists the metrics: {names:?}"
        );

        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let client = cp.client_as(0, ADMIN_TOKEN).unwrap();
        let sim = common::sim(Faults::none(), common::spliced(Topology::default())).await;
        let (_cloud, fip) = common::control_plane_fip(&sim, ("cluster", "lab-cp"), 600_101).await;
        namespace(&client, "apps").await;
        let services: Api<Service> = Api::namespaced(client.clone(), "apps");
        let pp = PostParams::default();
        // One Service that gets a FIP, one that cannot (its requested address is not an IP):
        // pending, with a Warning, and not retried until it changes.
        services
            .create(&pp, &lb_service("apps", "web", &[]))
            .await
            .unwrap();
        services
            .create(
                &pp,
                &lb_service(
                    "apps",
                    "broken",
                    &[("metallb.universe.tf/loadBalancerIPs", "not-an-ip")],
                ),
            )
            .await
            .unwrap();

        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(logs.path().join("controller.log")).unwrap();
        let env = common::env_for(
            &sim,
            &[
                ("CHERRY_REGION_NAME", "LT-Siauliai"),
                ("CHERRY_FIP_TAG", "cluster=lab-cp"),
                ("BATON_API_RATE_LIMIT", "20"),
            ],
        );
        let _controller = Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("controller")
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--identity", "replica-a", "--admin-listen", ADMIN])
            .envs(&env)
            .env("BATON_LOG", "info,baton=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();

        let web = eventually(WAIT, "ingress of apps/web", || async {
            services
                .get_opt("web")
                .await
                .unwrap()
                .filter(|s| ingress(s).is_some())
        })
        .await;
        let web_ip = ingress(&web).unwrap();

        // The gauges settle: leader, one control-plane FIP and one Service FIP owned, one
        // Service pending (the broken one), nothing queued.
        let text = eventually(WAIT, "the gauges to settle", || async {
            let text = scrape().await?;
            let settled = metric_sum(&text, "baton_leader") == Some(1.0)
                && metric_sum(&text, "baton_fips_owned{kind=\"control_plane\"}") == Some(1.0)
                && metric_sum(&text, "baton_fips_owned{kind=\"service\"}") == Some(1.0)
                && metric_sum(&text, "baton_services_pending") == Some(1.0)
                && metric_sum(&text, "baton_queue_depth{controller=\"services\"}") == Some(0.0);
            settled.then_some(text)
        })
        .await;

        for name in &names {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("# TYPE {name} "))),
                "{name} is named in docs/operations.md but not served on /metrics"
            );
        }
        // The cloud calls, by route and status: the IP list read, the FIP created.
        let list = metric_sum(
            &text,
            "baton_cloud_requests_total{route=\"GET /v1/projects/{id}/ips\",status=\"200\"}",
        );
        assert!(list.unwrap_or(0.0) >= 1.0, "IP list reads counted:\n{text}");
        let created = metric_sum(
            &text,
            "baton_cloud_requests_total{route=\"POST /v1/projects/{id}/ips\",status=\"201\"}",
        );
        assert_eq!(created, Some(1.0), "one FIP created, counted once:\n{text}");
        // Every request went through the rate limit; the normal lane's waits are recorded.
        let waits = metric_sum(
            &text,
            "baton_cloud_rate_limit_wait_seconds_count{priority=\"normal\"}",
        );
        assert!(waits.unwrap_or(0.0) >= 2.0, "rate-limit waits recorded:\n{text}");
        let failed = metric_sum(
            &text,
            "baton_reconcile_errors_total{controller=\"services\",category=\"invalid_annotation\"}",
        );
        assert!(
            failed.unwrap_or(0.0) >= 1.0,
            "the broken Service's error counted:\n{text}"
        );
        // Each controller counts its reconciles: the Services', and the endpoint loop's writes
        // of the mirror Service.
        for controller in ["services", "endpoints"] {
            let done = metric_sum(
                &text,
                &format!("baton_reconciles_total{{controller=\"{controller}\"}}"),
            );
            assert!(
                done.unwrap_or(0.0) >= 1.0,
                "{controller} reconciles counted:\n{text}"
            );
        }

        // Events: who became leader, on the Lease; the endpoint Service's ingress and endpoints.
        let lease_event = event(&client, "kube-system", "baton-controller", "LeaderElection").await;
        assert_eq!(lease_event.message.as_deref(), Some("replica-a became leader"));
        let updated = event(
            &client,
            "kube-system",
            "baton-kubernetes-external",
            "EndpointsUpdated",
        )
        .await;
        let note = updated.message.unwrap_or_default();
        assert!(note.contains(&fip.address.to_string()), "{note}");
        assert!(web_ip != fip.address.to_string(), "the Service got its own FIP");
    });
}

/// The admin endpoints' defaults, on the real binary: the plain admin server listens on
/// loopback only (another address of the same host is refused), the authenticated metrics
/// server is off unless asked for; serving plain HTTP to the network is an explicit opt-in
/// (`--admin-listen 0.0.0.0:PORT`), said at start in a warning.
#[test]
fn plain_http_admin_endpoints_are_loopback_only_unless_opted_in() {
    lab::run(|| async {
        let cp = ControlPlane::start(Options::servers(1)).await.unwrap();
        let sim = common::sim(Faults::none(), Topology::default()).await;
        let kubeconfig = cp.write_kubeconfig(0, ADMIN_TOKEN).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let env = common::env_for(&sim, &[]);
        let start = |identity: &str, extra: &[&str]| {
            let log = std::fs::File::create(logs.path().join(format!("{identity}.log"))).unwrap();
            Command::new(env!("CARGO_BIN_EXE_baton"))
                .arg("controller")
                .args([
                    "--kubeconfig",
                    kubeconfig.to_str().unwrap(),
                    "--identity",
                    identity,
                ])
                .args(extra)
                .envs(&env)
                .env_remove("BATON_ADMIN_LISTEN")
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        };
        let http = baton_testbed::http_client(None).unwrap();
        let get = |url: String| {
            let http = http.clone();
            async move {
                http.get(url)
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }
        };
        // The host's own lab address: what another machine would connect to.
        let host = cp.addresses()[0];

        // The defaults.
        let _default = start("defaults", &[]);
        eventually(WAIT, "the admin server on 127.0.0.1:9590", || async {
            (get("http://127.0.0.1:9590/metrics".into()).await.ok() == Some(200)).then_some(())
        })
        .await;
        let other = get(format!("http://{host}:9590/metrics")).await;
        assert!(
            other.as_ref().is_err_and(reqwest::Error::is_connect),
            "the host's other address must refuse the admin port: {other:?}"
        );
        let secure = get(format!("https://{host}:9592/metrics")).await;
        assert!(
            secure.as_ref().is_err_and(reqwest::Error::is_connect),
            "no metrics server unless asked for: {secure:?}"
        );

        // The opt-in: plain HTTP on every address, with a warning at start.
        let _open = start("opted-in", &["--admin-listen", "0.0.0.0:19590"]);
        eventually(
            WAIT,
            "the opted-in admin server on the host's address",
            || async { (get(format!("http://{host}:19590/metrics")).await.ok() == Some(200)).then_some(()) },
        )
        .await;
        let text = std::fs::read_to_string(logs.path().join("opted-in.log")).unwrap();
        assert!(
            text.lines().any(|l| l.contains("WARN")
                && l.contains("without authentication on a non-loopback address")
                && l.contains("0.0.0.0:19590")),
            "the opt-in is said at start:\n{text}"
        );
        let quiet = std::fs::read_to_string(logs.path().join("defaults.log")).unwrap();
        assert!(!quiet.contains("without authentication"), "{quiet}");
    });
}
