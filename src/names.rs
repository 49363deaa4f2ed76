//! Names both halves write on Kubernetes objects: the bootstrap creates the API Services that
//! the controller then keeps, so the two must agree on every one of these.

/// The server-side-apply field manager of every object baton writes.
pub const FIELD_MANAGER: &str = "baton";

/// The MetalLB annotation that keeps MetalLB away from the Service (CPEM #258).
pub const METALLB_DISABLE_ANNOTATION: (&str, &str) = (
    "metallb.universe.tf/address-pool",
    "disabled-metallb-do-not-use-any-address-pool",
);
/// Marks a Service as a control-plane endpoint: its FIP is routed to a healthy API server and
/// never handed to a load-balancer implementation.
pub const CONTROL_PLANE_ENDPOINT_ANNOTATION: &str = "baton.dev/control-plane-endpoint";
/// On every control-plane endpoint Service, written by the controller: the name of the node
/// (else the server's hostname) the cloud routes the Service's FIP to now.
pub const FIP_HOLDER_ANNOTATION: &str = "baton.dev/fip-holder";
/// On every control-plane endpoint Service, written by the controller: the primary address of
/// the server the cloud routes the Service's FIP to now. The node agent on that server delivers
/// the server's own packets for the FIP locally: the cloud's router would send them back to the
/// server, which drops packets carrying its own address as their source.
pub const FIP_HOLDER_ADDRESS_ANNOTATION: &str = "baton.dev/fip-holder-address";
/// On every control-plane endpoint Service, written by the leading controller after it moves the
/// Service's FIP: the last move (when, from and to which server, why) and the hold-down it
/// started, as JSON with RFC 3339 times, so that every replica, and the next leader, holds the
/// FIP as the leader that moved it would (docs/controller.md, "No flapping").
pub const FIP_LAST_MOVE_ANNOTATION: &str = "baton.dev/fip-last-move";
/// The label EndpointSlices use to name their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// cloud-provider-cherry's mirror Service (`kube-system`), left behind on a switch to baton.
pub const CCM_MIRROR_SERVICE: &str = "cloud-provider-cherry-kubernetes-external";
/// The `spec.loadBalancerClass` of the control-plane endpoint Services baton creates (the mirror
/// Service, the bootstrap's API Services): no load-balancer
/// implementation handles a class it does not own (MetalLB and kube-vip handle Services without a
/// class, or with theirs), so MetalLB's speaker never announces the control-plane FIP through it,
/// whatever pools exist (CPEM #258). Set only when baton creates the Service: the field is
/// immutable.
pub const CONTROL_PLANE_CLASS: &str = "baton.dev/control-plane";

/// Whether a control-plane endpoint Service baton writes is applied with
/// `spec.loadBalancerClass` [`CONTROL_PLANE_CLASS`]: when it does not exist yet, or already has
/// that class. The field is immutable, so one made without it (by an older baton) keeps none.
pub fn with_class(existing: Option<&k8s_openapi::api::core::v1::Service>) -> bool {
    existing.is_none_or(|svc| {
        svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()) == Some(CONTROL_PLANE_CLASS)
    })
}

/// The ConfigMap (`kube-system`) in which `baton bootstrap` records, at the handoff, what the
/// cluster's endpoints are: the namespaces of its API Services ([`BOOTSTRAP_NAMESPACES_KEY`]) and
/// the Floating IPs it resolved or reserved for them ([`BOOTSTRAP_FIPS_KEY`]). The controller
/// reads it at start: those namespaces may hold control-plane endpoints, and those FIPs are this
/// cluster's. Only cluster administrators (the bootstrap's kubeconfig) write `kube-system`.
pub const BOOTSTRAP_RECORD: &str = "baton-bootstrap";
/// Key of [`BOOTSTRAP_RECORD`]: the API Services' namespaces, comma-separated.
pub const BOOTSTRAP_NAMESPACES_KEY: &str = "endpointNamespaces";
/// Key of [`BOOTSTRAP_RECORD`]: the endpoints' Floating IP addresses, comma-separated.
pub const BOOTSTRAP_FIPS_KEY: &str = "fips";

/// The ConfigMap, in the controller's namespace, through which the controller's leader tells the
/// node agents which control-plane FIPs to accept and who holds each: `<prefix>-control-plane-fips`.
/// The agents read nothing else, so no Service a tenant writes changes a node's NAT.
pub fn fip_table_name(prefix: &str) -> String {
    format!("{prefix}-control-plane-fips")
}
/// Key of the [`fip_table_name`] ConfigMap: the table as JSON ([`FipTable`]).
pub const FIP_TABLE_KEY: &str = "fips.json";

/// What the controller's leader publishes for the node agents: the control-plane FIPs it
/// validated (this cluster's, from allowed namespaces), each with the primary address of the
/// server the cloud routes it to, when known.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FipTable {
    pub fips: Vec<FipEntry>,
}

/// One row of [`FipTable`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct FipEntry {
    pub address: std::net::IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<std::net::IpAddr>,
}
