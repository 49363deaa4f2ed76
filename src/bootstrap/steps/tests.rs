use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};
use k8s_openapi::api::discovery::v1::{Endpoint as SliceEndpoint, EndpointConditions};

use super::*;
use crate::bootstrap::config::{Publish, ServicePort, ServiceRef};

fn endpoint() -> Endpoint {
    Endpoint {
        name: "api".into(),
        dns_name: "api.c1.example.com".parse().unwrap(),
        fip: FipSource::Reserve,
        service: ServiceRef {
            namespace: "openshift-kube-apiserver".into(),
            name: "api".into(),
            ports: vec![ServicePort {
                name: "https".into(),
                port: 6443,
                target_port: 6443,
            }],
        },
        publish: Publish::Public,
    }
}

fn fip() -> IpAddr {
    "203.0.113.1".parse().unwrap()
}

fn with_ingress(ip: &str) -> Service {
    let mut svc = desired_service(&endpoint(), fip(), true);
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip.into()),
                ip_mode: Some("Proxy".into()),
                ..LoadBalancerIngress::default()
            }]),
        }),
        ..ServiceStatus::default()
    });
    svc
}

fn slice(ready: Option<bool>) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        endpoints: vec![SliceEndpoint {
            addresses: vec!["198.51.100.11".into()],
            conditions: Some(EndpointConditions {
                ready,
                ..EndpointConditions::default()
            }),
            ..SliceEndpoint::default()
        }],
        ..EndpointSlice::default()
    }
}

#[test]
fn the_service_is_a_control_plane_endpoint_without_selector() {
    let svc = desired_service(&endpoint(), fip(), true);
    let spec = svc.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_ip.as_deref(), Some("203.0.113.1"));
    assert_eq!(
        spec.load_balancer_class.as_deref(),
        Some("baton.dev/control-plane"),
        "no load-balancer implementation handles it"
    );
    let old = desired_service(&endpoint(), fip(), false);
    assert_eq!(
        old.spec.unwrap().load_balancer_class,
        None,
        "never added to an existing one"
    );
    assert!(
        spec.selector.is_none(),
        "endpoints mirror default/kubernetes; no selector"
    );
    let ann = svc.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        ann.get(CONTROL_PLANE_ENDPOINT_ANNOTATION).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        svc.metadata
            .labels
            .as_ref()
            .unwrap()
            .get(ENDPOINT_LABEL)
            .map(String::as_str),
        Some("api")
    );
    assert_eq!(spec.ports.as_ref().unwrap()[0].port, 6443);
}

#[test]
fn readiness_needs_ingress_a_ready_endpoint_and_a_serving_fip() {
    use Readiness::*;
    let ip = fip();
    assert_eq!(service_readiness(None, &[], ip, true), Missing);
    let bare = desired_service(&endpoint(), ip, true);
    assert_eq!(
        service_readiness(Some(&bare), &[slice(Some(true))], ip, true),
        NoIngress
    );
    let other = with_ingress("203.0.113.99");
    assert_eq!(
        service_readiness(Some(&other), &[slice(Some(true))], ip, true),
        NoIngress
    );
    let svc = with_ingress("203.0.113.1");
    assert_eq!(service_readiness(Some(&svc), &[], ip, true), NoReadyEndpoints);
    assert_eq!(
        service_readiness(Some(&svc), &[slice(Some(false))], ip, true),
        NoReadyEndpoints
    );
    assert_eq!(
        service_readiness(Some(&svc), &[slice(Some(true))], ip, false),
        FipNotServing
    );
    assert_eq!(
        service_readiness(Some(&svc), &[slice(Some(true))], ip, true),
        Ready
    );
    // An unknown ready condition counts as ready (the API's documented reading).
    assert_eq!(service_readiness(Some(&svc), &[slice(None)], ip, true), Ready);
}

#[test]
fn the_record_names_every_endpoints_namespace_and_fip_once() {
    let record = |address: &str| FipRecord {
        id: format!("id-{address}"),
        address: address.parse().unwrap(),
        reserved_by_baton: false,
    };
    let mut api_int = endpoint();
    api_int.name = "api-int".into();
    api_int.service.name = "api-int".into();
    let mut other = endpoint();
    other.service.namespace = "kube-system".into();
    let eps = vec![
        (endpoint(), record("203.0.113.1")),
        (api_int, record("203.0.113.2")),
        (other, record("203.0.113.1")),
    ];
    let cm = bootstrap_record(&eps);
    assert_eq!(cm.metadata.name.as_deref(), Some(BOOTSTRAP_RECORD));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("kube-system"));
    let data = cm.data.unwrap();
    assert_eq!(
        data[BOOTSTRAP_NAMESPACES_KEY],
        "kube-system,openshift-kube-apiserver"
    );
    assert_eq!(data[BOOTSTRAP_FIPS_KEY], "203.0.113.1,203.0.113.2");
}
