use super::*;

fn kubernetes_service(port: i32, target: i32) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "spec": {"ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": target}]}
    }))
    .unwrap()
}

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: "baton-kubernetes-external".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn spec(fip_port: u16) -> MirrorSpec {
    MirrorSpec::new("baton", "203.0.113.5".parse().unwrap(), fip_port)
}

#[test]
fn service_takes_the_fip_and_the_api_servers_port() {
    let svc = desired_service(&spec(0), &kubernetes_service(443, 6443), true).unwrap();
    assert_eq!(svc.metadata.name.as_deref(), Some("baton-kubernetes-external"));
    assert_eq!(svc.metadata.namespace.as_deref(), Some("kube-system"));
    let s = svc.spec.unwrap();
    assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(s.load_balancer_ip.as_deref(), Some("203.0.113.5"));
    assert!(s.selector.is_none(), "no selector: endpoints are mirrored");
    let p = &s.ports.unwrap()[0];
    assert_eq!(
        (p.port, p.target_port.clone()),
        (6443, Some(IntOrString::Int(6443)))
    );
    let ann = svc.metadata.annotations.unwrap();
    assert_eq!(ann[METALLB_DISABLE_ANNOTATION.0], METALLB_DISABLE_ANNOTATION.1);
    assert_eq!(ann[CONTROL_PLANE_ENDPOINT_ANNOTATION], "true");
}

#[test]
fn api_server_port_setting_overrides_the_fip_port_only() {
    let s = desired_service(&spec(443), &kubernetes_service(443, 6443), true)
        .unwrap()
        .spec
        .unwrap();
    let p = &s.ports.unwrap()[0];
    assert_eq!(
        (p.port, p.target_port.clone()),
        (443, Some(IntOrString::Int(6443)))
    );
}

#[test]
fn status_is_the_fip_with_ip_mode_proxy() {
    let st = desired_status(&spec(0))
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].ip.as_deref(), Some("203.0.113.5"));
    assert_eq!(st[0].ip_mode.as_deref(), Some("Proxy"));
}

#[test]
fn slices_copy_addresses_conditions_and_ports_and_are_owned() {
    let src: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.51.100.11"], "conditions": {"ready": true}, "nodeName": "x"},
                      {"addresses": ["198.51.100.12"]}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]
    }))
    .unwrap();
    let out = desired_slices(&spec(0), &owner(), &[src]);
    assert_eq!(out.len(), 1);
    let s = &out[0];
    assert_eq!(
        s.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL],
        "baton-kubernetes-external"
    );
    assert_eq!(s.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
    let addrs: Vec<_> = s.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
    assert_eq!(addrs, ["198.51.100.11", "198.51.100.12"]);
    assert_eq!(s.endpoints[0].conditions.as_ref().unwrap().ready, Some(true));
    assert_eq!(s.ports.as_ref().unwrap()[0].port, Some(6443));
}

#[test]
fn endpoints_copy_subsets_and_skip_mirroring() {
    let src: Endpoints = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "198.51.100.11"}], "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}]
    }))
    .unwrap();
    let eps = desired_endpoints(&spec(0), &owner(), Some(&src));
    assert_eq!(eps.metadata.labels.as_ref().unwrap()[SKIP_MIRROR_LABEL], "true");
    let subsets = eps.subsets.unwrap();
    assert_eq!(subsets[0].addresses.as_ref().unwrap()[0].ip, "198.51.100.11");
    assert_eq!(subsets[0].ports.as_ref().unwrap()[0].port, 6443);
}

#[test]
fn every_label_and_annotation_we_write_is_valid() {
    use baton_core::names::{is_label_value, is_qualified_key};
    let s = spec(0);
    let objects = [
        desired_service(&s, &kubernetes_service(443, 6443), true)
            .unwrap()
            .metadata,
        desired_slices(&s, &owner(), &[EndpointSlice::default()])[0]
            .metadata
            .clone(),
        desired_endpoints(&s, &owner(), None).metadata,
    ];
    for meta in objects {
        for (k, v) in meta.labels.unwrap_or_default() {
            assert!(is_qualified_key(&k) && is_label_value(&v), "label {k}={v}");
        }
        for k in meta.annotations.unwrap_or_default().keys() {
            assert!(is_qualified_key(k), "annotation {k}");
        }
    }
}

fn leftover(ns: &str, name: &str, lb_ip: Option<&str>, ingress: Option<&str>) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "LoadBalancer", "loadBalancerIP": lb_ip},
        "status": {"loadBalancer": {"ingress": ingress.map(|ip| vec![serde_json::json!({"ip": ip, "ipMode": "Proxy"})])}},
    }))
    .unwrap()
}

#[test]
fn the_ccms_mirror_of_the_same_fip_is_a_leftover_and_nothing_else_is() {
    let fip: IpAddr = "203.0.113.5".parse().unwrap();
    let own = "baton-kubernetes-external";
    let ccm = CCM_MIRROR_SERVICE;
    assert!(is_ccm_leftover(
        &leftover("kube-system", ccm, Some("203.0.113.5"), None),
        fip,
        own
    ));
    assert!(is_ccm_leftover(
        &leftover("kube-system", ccm, None, Some("203.0.113.5")),
        fip,
        own
    ));
    // Another FIP (a user's Service of that name for something else), another namespace,
    // another name, or baton's own mirror under the CCM's name (prefix cloud-provider-cherry).
    assert!(!is_ccm_leftover(
        &leftover("kube-system", ccm, Some("203.0.113.6"), None),
        fip,
        own
    ));
    assert!(!is_ccm_leftover(
        &leftover("default", ccm, Some("203.0.113.5"), None),
        fip,
        own
    ));
    assert!(!is_ccm_leftover(
        &leftover("kube-system", "other", Some("203.0.113.5"), None),
        fip,
        own
    ));
    assert!(!is_ccm_leftover(
        &leftover("kube-system", ccm, Some("203.0.113.5"), None),
        fip,
        ccm
    ));
}

#[test]
fn the_class_is_set_on_a_new_mirror_and_kept_never_added_to_an_old_one() {
    let k = kubernetes_service(443, 6443);
    let with = desired_service(&spec(0), &k, true).unwrap();
    assert_eq!(
        with.spec.as_ref().unwrap().load_balancer_class.as_deref(),
        Some(CONTROL_PLANE_CLASS)
    );
    let without = desired_service(&spec(0), &k, false).unwrap();
    assert_eq!(without.spec.as_ref().unwrap().load_balancer_class, None);
    assert!(with_class(None), "a new mirror gets it");
    assert!(with_class(Some(&with)), "one that has it keeps it");
    assert!(
        !with_class(Some(&without)),
        "the field is immutable: an old mirror keeps none"
    );
}
