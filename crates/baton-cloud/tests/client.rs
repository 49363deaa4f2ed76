//! The client against the simulator over HTTP: the FIP life cycle, BGP, errors, redaction.

mod common;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use baton_cloud::model::{CreateIpRequest, IpId, IpType, ServerId};
use baton_cloud::tags::service_fip_tags;
use baton_cloud::{CherryClient, Cloud, CloudError, Op};
use baton_core::Secret;
use baton_sim::{Faults, Topology};

fn fip_request(name: &str) -> CreateIpRequest {
    CreateIpRequest {
        region: "LT-Siauliai".into(),
        tags: service_fip_tags("default", name, "cluster-uid-1"),
        ..Default::default()
    }
}

#[tokio::test]
async fn fip_life_cycle() {
    let sim = common::sim(Faults::none()).await;
    let cloud: Arc<dyn Cloud> = Arc::new(common::client(&sim, None));

    // create, then find by tags (the create is not repeated)
    let fip = cloud.create_ip(fip_request("api")).await.unwrap();
    assert_eq!(fip.ip_type, IpType::FloatingIp);
    assert_eq!(fip.address.to_string(), "203.0.113.1");
    assert!(fip.target().is_none());
    let again = cloud.create_ip(fip_request("api")).await.unwrap();
    assert_eq!(again.id, fip.id);
    let found = cloud
        .find_ip_by_tags(&fip_request("api").tags)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, fip.id);
    assert!(
        cloud
            .find_ip_by_tags(&fip_request("other").tags)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(sim.stats().route("POST /v1/projects/{id}/ips"), 1);

    // retarget: the API shows the server and its primary IP
    let cp0 = ServerId(600_101);
    let ip = cloud.retarget_ip(&fip.id, cp0).await.unwrap();
    assert_eq!(ip.target(), Some(cp0));
    assert_eq!(
        ip.routed_to.as_ref().unwrap().address.to_string(),
        "198.51.100.11"
    );
    let read = cloud.ip(&fip.id).await.unwrap();
    assert_eq!(read.target(), Some(cp0));
    let ip = cloud.retarget_ip(&fip.id, ServerId(600_102)).await.unwrap();
    assert_eq!(
        ip.routed_to.as_ref().unwrap().address.to_string(),
        "198.51.100.12"
    );
    // the cached list reflects the write without a new list call
    let lists = sim.stats().route("GET /v1/projects/{id}/ips");
    let cached = cloud.ips().await.unwrap();
    assert_eq!(
        cached.iter().find(|i| i.id == fip.id).unwrap().target(),
        Some(ServerId(600_102))
    );
    assert_eq!(sim.stats().route("GET /v1/projects/{id}/ips"), lists);

    // unassign
    let ip = cloud.unassign_ip(&fip.id).await.unwrap();
    assert!(ip.target().is_none() && ip.routed_to.is_none());

    // delete
    cloud.delete_ip(&fip.id).await.unwrap();
    let err = cloud.ip(&fip.id).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(cloud.ips().await.unwrap().iter().all(|i| i.id != fip.id));
    let stats = sim.stats();
    assert_eq!(stats.route_status("POST /v1/projects/{id}/ips", 201), 1);
    assert_eq!(stats.route_status("PUT /v1/ips/{id}", 200), 3);
    assert_eq!(stats.route_status("DELETE /v1/ips/{id}", 204), 1);
}

#[tokio::test]
async fn n_concurrent_reads_cause_one_list_call() {
    let sim = common::sim(Faults::none()).await;
    let client = common::client(&sim, None);
    let reads = (0..25).map(|_| {
        let c = client.clone();
        tokio::spawn(async move { c.ips().await.unwrap().len() })
    });
    for r in futures::future::join_all(reads).await {
        assert_eq!(r.unwrap(), 12, "6 servers x (primary + private)");
    }
    assert_eq!(sim.stats().route("GET /v1/projects/{id}/ips"), 1);
    client.invalidate_ips();
    client.ips().await.unwrap();
    assert_eq!(sim.stats().route("GET /v1/projects/{id}/ips"), 2);
}

#[tokio::test]
async fn bgp_on_project_and_server() {
    let sim = common::sim(Faults::none()).await;
    let cloud = common::client(&sim, None);
    let project = cloud.project().await.unwrap();
    assert!(!project.bgp.enabled);
    let project = cloud.enable_project_bgp().await.unwrap();
    assert!(project.bgp.enabled);
    assert_eq!(project.bgp.local_asn, 65_000);
    assert_eq!(sim.stats().route_status("PUT /v1/projects/{id}", 201), 1);
    // enabling again is a read only
    cloud.enable_project_bgp().await.unwrap();
    assert_eq!(sim.stats().route("PUT /v1/projects/{id}"), 1);

    let server = cloud.update_server_bgp(ServerId(600_101), true).await.unwrap();
    assert!(server.bgp.enabled);
    assert_eq!(
        server.first_ipv4(&IpType::PrimaryIp).unwrap().to_string(),
        "198.51.100.11"
    );
    assert_eq!(sim.stats().route_status("PUT /v1/servers/{id}", 201), 1);
    let region = server.region.unwrap();
    assert_eq!(region.bgp.asn, 16_125);
    assert_eq!(region.bgp.hosts.len(), 2);
    assert!(cloud.server(ServerId(600_101)).await.unwrap().bgp.enabled);
    assert!(
        cloud
            .update_server_bgp(ServerId(1), true)
            .await
            .unwrap_err()
            .is_not_found()
    );

    let servers = cloud.servers().await.unwrap();
    assert_eq!(servers.len(), 6);
    let regions = cloud.regions().await.unwrap();
    assert_eq!(regions[0].slug, "LT-Siauliai");
}

#[tokio::test]
async fn errors_carry_op_object_and_api_message() {
    let sim = common::sim(Faults::none()).await;
    let cloud = common::client(&sim, None);

    let missing = IpId::from("00000000-0000-4000-8000-000000000000");
    match cloud.ip(&missing).await.unwrap_err() {
        CloudError::Api {
            op,
            object,
            status,
            code,
            message,
            ..
        } => {
            assert_eq!(op, Op::GetIp);
            assert!(object.0.contains(missing.as_str()));
            assert_eq!((status, code), (404, 404));
            assert_eq!(message, "IP address not found");
        }
        other => panic!("unexpected {other:?}"),
    }

    let mut bad_region = fip_request("x");
    bad_region.region = "Mars".into();
    let err = cloud.create_ip(bad_region).await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert!(err.to_string().contains("Region Mars not found"), "{err}");

    let err = cloud.retarget_ip(&missing, ServerId(600_101)).await.unwrap_err();
    assert_eq!(err.op(), Some(Op::RetargetIp));
    assert!(err.is_not_found());

    let mut no_tags = fip_request("x");
    no_tags.tags.clear();
    assert!(matches!(
        cloud.create_ip(no_tags).await.unwrap_err(),
        CloudError::InvalidRequest { .. }
    ));

    // Nothing listens here: a transport error, retried, then reported.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = common::config(&sim, None);
    cfg.base_url = format!("http://{dead}/").parse().unwrap();
    cfg.max_retries = 1;
    let err = CherryClient::new(cfg).unwrap().project().await.unwrap_err();
    assert!(
        matches!(err, CloudError::Transport { kind: "connect", .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn non_json_error_body_is_an_error_not_a_panic() {
    let faults = Faults {
        error_rate: 1.0,
        error_statuses: vec![500],
        non_json_ratio: 1.0,
        ..Faults::none()
    };
    let sim = common::sim(faults).await;
    let err = common::client(&sim, None).project().await.unwrap_err();
    match &err {
        CloudError::UnexpectedBody {
            status: 500,
            snippet,
            op: Op::GetProject,
            ..
        } => {
            assert!(snippet.contains("<html>"), "{snippet}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(sim.stats().requests, 1, "500 is not retried");
}

/// Captures every log line of the current thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test] // current-thread runtime: the client, hyper and the simulator all log here
async fn the_api_key_never_shows() {
    const KEY: &str = "s3cr3t-API-key-0123456789";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let topology = Topology {
        api_key: KEY.into(),
        ..Topology::default()
    };
    let faults = Faults {
        error_rate: 0.5,
        seed: Some(7),
        ..Faults::none()
    };
    let sim = common::sim_with(topology, faults).await;
    let mut errors = Vec::new();

    // Right key, with injected failures and retries.
    let cloud = common::client(&sim, None);
    let fip = cloud.create_ip(fip_request("redaction")).await.unwrap();
    cloud.retarget_ip(&fip.id, ServerId(600_101)).await.unwrap();
    errors.push(cloud.ip(&IpId::from("nope")).await.unwrap_err());
    let debug = format!("{cloud:?} {:?}", common::config(&sim, None));

    // Wrong key: 401 errors.
    sim.set_faults(Faults::none()).unwrap();
    let mut cfg = common::config(&sim, None);
    cfg.api_key = Secret::new(format!("{KEY}-wrong"));
    let wrong = CherryClient::new(cfg).unwrap();
    let err = wrong.project().await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert_eq!(err.category(), "unauthorized");
    errors.push(err);

    // Unreachable endpoint: transport errors.
    let mut cfg = common::config(&sim, None);
    cfg.base_url = "http://127.0.0.1:1/".parse().unwrap();
    cfg.max_retries = 0;
    errors.push(CherryClient::new(cfg).unwrap().servers().await.unwrap_err());

    let mut text = debug;
    for e in &errors {
        let _ = write!(text, "{e} {e:?} ");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let _ = write!(text, "{s} {s:?} ");
            source = s.source();
        }
    }
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("cloud call"), "the capture works");
    assert!(
        logs.contains("retrying") || logs.contains("create failed"),
        "faults were hit"
    );
    assert!(!text.contains(KEY), "{text}");
    assert!(!logs.contains(KEY), "the key appears in the logs");
    drop(sim);
}
