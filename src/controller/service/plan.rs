//! The pure part of the Service FIP controller: which Services baton manages, what IP a Service
//! asks for, which region a new FIP goes to, and what to do given what the cloud holds.
//!
//! ```text
//!  Service ──► ServiceFacts ──► scope()          Managed | Ignored(reason)
//!                    │
//!                    ├──────────► requested_ip() bring-your-own IP (annotations, spec)
//!                    ├──────────► Record          what baton wrote last time (id, address)
//!  cloud FIPs ─► matching ──► pick()            ours (+ duplicates to release)
//!                    └──────────► decide()        Publish | Create(region) | ByoIp | ReleaseForByoIp
//!  cloud FIPs + every Service ──► FipRoles::of()  control-plane addresses (never touched)
//!                                                 | routed to a server (bring-your-own routed:
//!                                                   ingress, never announced by BGP)
//! ```
//!
//! No I/O here: everything is a function of plain values, unit-tested in `tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use baton_cloud::model::{IpAddress, IpType, each_ip};
use baton_core::{FipTag, LoadBalancerMode};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;

/// The finalizer that keeps a Service until its FIP is released.
pub const FINALIZER: &str = "baton.dev/service-fip";
/// The finalizer Kubernetes' own service controller puts on every LoadBalancer Service it runs
/// for a cloud provider (cloud-provider-cherry's included) and removes after its cleanup. With
/// the CCM gone nobody removes it, and such a Service could never be deleted: baton does, once
/// its own cleanup is done ([`clears_ccm_finalizer`]).
pub const CCM_CLEANUP_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// Records the id of the FIP baton reserved for the Service.
pub const FIP_ID_ANNOTATION: &str = "baton.dev/fip-id";
/// Records the address of that FIP (tells baton's own IP annotation from a bring-your-own one).
pub const FIP_ADDRESS_ANNOTATION: &str = "baton.dev/fip-address";
/// Opt-out: `"false"` leaves the Service to someone else (Cherry CCM PR #272).
pub const MANAGED_ANNOTATION: &str = "cherryservers.com/loadbalancer-managed";
/// baton's `spec.loadBalancerClass`; Services without a class are managed too (on Cherry Servers).
pub const LOAD_BALANCER_CLASS: &str = "baton.dev/cherryservers";
/// The `spec.loadBalancerClass` of a Service whose FIP the cloud routes to a healthy node (no
/// BGP); on Hetzner Cloud the only Services baton serves: a Service without a class is
/// hcloud-cloud-controller-manager's (a Hetzner Load Balancer).
pub const FLOATING_IP_CLASS: &str = "baton.dev/floating-ip";
/// MetalLB's IP annotation (written in MetalLB mode, read for bring-your-own IP).
pub const METALLB_IPS_ANNOTATION: &str = "metallb.io/loadBalancerIPs";
/// MetalLB's legacy IP annotation (read only).
pub const METALLB_LEGACY_IPS_ANNOTATION: &str = "metallb.universe.tf/loadBalancerIPs";
/// kube-vip's IP annotation.
pub const KUBE_VIP_IPS_ANNOTATION: &str = "kube-vip.io/loadbalancerIPs";

/// What the controller reads off a Service: plain data, built by the I/O shell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.type`.
    pub type_: Option<String>,
    /// `spec.loadBalancerClass`.
    pub class: Option<String>,
    /// `spec.loadBalancerIP`.
    pub load_balancer_ip: Option<String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// baton's finalizer is present.
    pub has_finalizer: bool,
    /// `status.loadBalancer.ingress[*].ip`.
    pub ingress_ips: Vec<String>,
    /// `metadata.creationTimestamp`, seconds since the epoch (0 when unknown).
    pub created: i64,
    /// `metadata.resourceVersion` as read.
    pub resource_version: String,
    /// Only a Service naming one of baton's classes is baton's (Hetzner Cloud: a Service without
    /// a class is the cloud's own controller's).
    pub needs_class: bool,
}

/// Reads the facts the planner needs off a Service.
pub fn facts_of(svc: &Service) -> ServiceFacts {
    let spec = svc.spec.as_ref();
    ServiceFacts {
        namespace: svc.namespace().unwrap_or_default(),
        name: svc.name_any(),
        type_: spec.and_then(|s| s.type_.clone()),
        class: spec.and_then(|s| s.load_balancer_class.clone()),
        load_balancer_ip: spec.and_then(|s| s.load_balancer_ip.clone()),
        annotations: svc.annotations().clone(),
        deleting: svc.metadata.deletion_timestamp.is_some(),
        created: svc
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second()),
        resource_version: svc.metadata.resource_version.clone().unwrap_or_default(),
        needs_class: false,
        has_finalizer: svc.finalizers().iter().any(|f| f == FINALIZER),
        ingress_ips: svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .map(|ing| ing.iter().filter_map(|i| i.ip.clone()).collect())
            .unwrap_or_default(),
    }
}

impl ServiceFacts {
    /// `ns/name`, for messages.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// Why a Service is not baton's to manage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    /// Not `type: LoadBalancer`.
    NotLoadBalancer,
    /// Another `loadBalancerClass`.
    OtherClass(String),
    /// No `loadBalancerClass`, where a class is needed (Hetzner Cloud: such a Service is
    /// hcloud-cloud-controller-manager's).
    NoClass,
    /// A control-plane endpoint (`baton.dev/control-plane-endpoint: "true"`, or the mirror
    /// Service itself): never touched by this controller.
    ControlPlaneEndpoint,
    /// `cherryservers.com/loadbalancer-managed: "false"`.
    OptedOut,
}

/// Whether baton manages a Service's FIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// baton gives it a FIP (unless it brings its own IP).
    Managed,
    /// baton leaves it alone (and releases a FIP it reserved earlier, except for control-plane
    /// endpoints, which it never touches).
    Ignored(Ignored),
}

/// Decides whether baton manages `svc`. `mirror` is `(namespace, name)` of the control-plane
/// mirror Service, skipped even if its annotation were lost.
pub fn scope(svc: &ServiceFacts, mirror: (&str, &str)) -> Scope {
    let control_plane = svc
        .annotation(crate::controller::mirror::CONTROL_PLANE_ENDPOINT_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || (svc.namespace == mirror.0 && svc.name == mirror.1);
    if control_plane {
        return Scope::Ignored(Ignored::ControlPlaneEndpoint);
    }
    if svc.type_.as_deref() != Some("LoadBalancer") {
        return Scope::Ignored(Ignored::NotLoadBalancer);
    }
    match &svc.class {
        Some(class) if class != LOAD_BALANCER_CLASS && class != FLOATING_IP_CLASS => {
            return Scope::Ignored(Ignored::OtherClass(class.clone()));
        }
        None if svc.needs_class => return Scope::Ignored(Ignored::NoClass),
        _ => {}
    }
    if svc
        .annotation(MANAGED_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("false"))
    {
        return Scope::Ignored(Ignored::OptedOut);
    }
    Scope::Managed
}

/// The `empty` implementation's default IP annotation (the Cherry CCM's).
pub const EMPTY_IPS_ANNOTATION: &str = "cherryservers.com/loadBalancerIPs";

/// Every address a Service asks for, whatever the implementation: `spec.loadBalancerIP` and the
/// IP annotations of MetalLB (both), kube-vip and `empty` (its default and `extra`). Values that do
/// not parse are skipped (the Service controller reports them).
pub fn asked_addresses(svc: &ServiceFacts, extra: Option<&str>) -> BTreeSet<IpAddr> {
    let mut values: Vec<&str> = [
        METALLB_IPS_ANNOTATION,
        METALLB_LEGACY_IPS_ANNOTATION,
        KUBE_VIP_IPS_ANNOTATION,
        EMPTY_IPS_ANNOTATION,
    ]
    .into_iter()
    .chain(extra)
    .filter_map(|k| svc.annotation(k))
    .collect();
    values.extend(svc.load_balancer_ip.as_deref());
    values
        .iter()
        .flat_map(|v| v.split(','))
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Whether `svc` is a control-plane endpoint Service: annotated
/// `baton.dev/control-plane-endpoint: "true"`, of class `baton.dev/control-plane` (the Services
/// baton creates for that: the mirror, the bootstrap's API Services), baton's mirror (`mirror`,
/// even if its annotation were lost), or cloud-provider-cherry's mirror
/// (`kube-system/cloud-provider-cherry-kubernetes-external`, left behind on a switch).
pub fn is_control_plane_service(svc: &ServiceFacts, mirror: (&str, &str)) -> bool {
    svc.annotation(crate::names::CONTROL_PLANE_ENDPOINT_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || svc.class.as_deref() == Some(crate::names::CONTROL_PLANE_CLASS)
        || (svc.namespace == mirror.0 && svc.name == mirror.1)
        || (svc.namespace == "kube-system" && svc.name == crate::names::CCM_MIRROR_SERVICE)
}

/// The control-plane FIPs' addresses: the FIP named by `fipTag`, and every address a
/// control-plane endpoint Service asks for ([`is_control_plane_service`]). A Service of any name
/// asking for one of them is never handed to a load balancer (CPEM #258: MetalLB announcing the
/// control-plane FIP, e.g. through cloud-provider-cherry's leftover mirror Service).
///
/// A FIP routed (targeted) to a server is **not** one by that alone: an operator may route a FIP
/// to a node for a workload Service (a bring-your-own routed FIP, see [`routed_addresses`]).
pub fn control_plane_addresses<B: std::borrow::Borrow<IpAddress>>(
    fip_tag: Option<&FipTag>,
    ips: &[B],
    services: &[ServiceFacts],
    mirror: (&str, &str),
) -> BTreeSet<IpAddr> {
    let mut out: BTreeSet<IpAddr> = each_ip(ips)
        .filter(|ip| ip.ip_type == IpType::FloatingIp)
        .filter(|ip| {
            fip_tag.is_some_and(|t| t.matches(ip.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        })
        .map(|ip| ip.address)
        .collect();
    for svc in services.iter().filter(|s| is_control_plane_service(s, mirror)) {
        out.extend(asked_addresses(svc, None));
    }
    out
}

/// The addresses of the FIPs the cloud routes (targets) to a server. A managed Service asking
/// for one that is not a control-plane address brings its own *routed* FIP: baton sets its
/// ingress (VIP mode, so kube-proxy accepts it on the node the cloud routes it to) and never
/// hands it to a BGP load balancer: the cloud already routes it to one server, and an
/// announcement from other nodes would fight that route.
pub fn routed_addresses<B: std::borrow::Borrow<IpAddress>>(ips: &[B]) -> BTreeMap<IpAddr, u64> {
    each_ip(ips)
        .filter(|ip| ip.ip_type == IpType::FloatingIp)
        .filter_map(|ip| Some((ip.address, ip.target()?.0)))
        .collect()
}

/// What the FIPs of the cloud are to the Service and BGP controllers, from one read of the
/// (cached) IP list and the Services.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FipRoles {
    /// Control-plane addresses ([`control_plane_addresses`]): a Service asking for one is never
    /// touched.
    pub control_plane: BTreeSet<IpAddr>,
    /// The other FIPs routed to a server, with the server's id ([`routed_addresses`]): a
    /// Service asking for one gets its ingress, never an announcement.
    pub routed: BTreeMap<IpAddr, u64>,
}

impl FipRoles {
    /// Sorts the FIPs of `ips` by role.
    pub fn of<B: std::borrow::Borrow<IpAddress>>(
        fip_tag: Option<&FipTag>,
        ips: &[B],
        services: &[ServiceFacts],
        mirror: (&str, &str),
    ) -> Self {
        let control_plane = control_plane_addresses(fip_tag, ips, services, mirror);
        let mut routed = routed_addresses(ips);
        routed.retain(|ip, _| !control_plane.contains(ip));
        Self {
            control_plane,
            routed,
        }
    }

    /// Every address no load balancer may announce: the control-plane ones and the routed ones.
    pub fn never_announced(&self) -> BTreeSet<IpAddr> {
        self.control_plane
            .iter()
            .chain(self.routed.keys())
            .copied()
            .collect()
    }

    /// The server `ip` is routed to, when it is a bring-your-own routed FIP.
    pub fn routed_to(&self, ip: IpAddr) -> Option<u64> {
        self.routed.get(&ip).copied()
    }
}

/// [`scope`], and a Service that asks for a control-plane FIP's address (see
/// [`control_plane_addresses`]) is a control-plane endpoint whatever its name: ignored.
pub fn scope_excluding(
    svc: &ServiceFacts,
    mirror: (&str, &str),
    control_plane: &BTreeSet<IpAddr>,
    extra_annotation: Option<&str>,
) -> Scope {
    match scope(svc, mirror) {
        Scope::Managed
            if asked_addresses(svc, extra_annotation)
                .iter()
                .any(|ip| control_plane.contains(ip)) =>
        {
            Scope::Ignored(Ignored::ControlPlaneEndpoint)
        }
        other => other,
    }
}

/// Whether baton removes the CCM's [`CCM_CLEANUP_FINALIZER`] from a Service carrying it: only
/// while the Service is being deleted, after baton's own finalizer is gone, and never for a
/// Service of another `loadBalancerClass` (another controller's, which Kubernetes' service
/// controller does not handle either).
pub fn clears_ccm_finalizer(svc: &ServiceFacts, has_ccm_finalizer: bool, mirror: (&str, &str)) -> bool {
    has_ccm_finalizer
        && svc.deleting
        && !svc.has_finalizer
        && !matches!(
            scope(svc, mirror),
            Scope::Ignored(Ignored::OtherClass(_) | Ignored::NoClass)
        )
}

/// Whether `svc` is a Service baton manages that still waits for its address (no ingress, not
/// being deleted): `baton_services_pending`, and the pending list of `baton status`. A Service
/// asking for one of the `control_plane` addresses is never given one by baton: not pending
/// (`extra`: the configured implementation's IP annotation, see [`scope_excluding`]).
pub fn is_pending(
    svc: &ServiceFacts,
    mirror: (&str, &str),
    control_plane: &BTreeSet<IpAddr>,
    extra: Option<&str>,
) -> bool {
    scope_excluding(svc, mirror, control_plane, extra) == Scope::Managed
        && !svc.deleting
        && svc.ingress_ips.is_empty()
}

/// The Service annotation baton writes the FIP's address to, per implementation (reference §6).
pub fn ip_annotation(mode: &LoadBalancerMode) -> &str {
    match mode {
        LoadBalancerMode::KubeVip => KUBE_VIP_IPS_ANNOTATION,
        LoadBalancerMode::MetalLb { .. } => METALLB_IPS_ANNOTATION,
        LoadBalancerMode::Empty { ip_annotation } => ip_annotation,
    }
}

/// A Service annotation (or field) whose value baton cannot use. Named in the Warning Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}={value:?}: {reason}")]
pub struct InvalidField {
    /// The annotation key, or `spec.loadBalancerIP`.
    pub field: String,
    /// The value found.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// An address a Service asks for, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// The annotation's key, or `spec.loadBalancerIP`.
    pub field: String,
    /// The address.
    pub ip: IpAddr,
}

/// The IP the Service asks for, if any: the implementation's annotation (MetalLB: also the legacy
/// one), else `spec.loadBalancerIP` — the order the implementations read them in (reference §6).
/// An annotation may list several comma-separated addresses (dual stack); the first IPv4 one is
/// the Service's Floating IP.
pub fn requested_ip(svc: &ServiceFacts, mode: &LoadBalancerMode) -> Result<Option<IpAddr>, InvalidField> {
    Ok(requested(svc, mode)?.map(|r| r.ip))
}

/// [`requested_ip`], with the field it is asked in.
pub fn requested(svc: &ServiceFacts, mode: &LoadBalancerMode) -> Result<Option<Requested>, InvalidField> {
    let mut fields: Vec<&str> = vec![ip_annotation(mode)];
    if matches!(mode, LoadBalancerMode::MetalLb { .. }) {
        fields.push(METALLB_LEGACY_IPS_ANNOTATION);
    }
    let at = |field: &str, ip: Option<IpAddr>| {
        ip.map(|ip| Requested {
            field: field.to_owned(),
            ip,
        })
    };
    for field in fields {
        if let Some(value) = svc.annotation(field) {
            return parse_ip_list(field, value).map(|ip| at(field, ip));
        }
    }
    match svc.load_balancer_ip.as_deref() {
        Some(v) if !v.trim().is_empty() => {
            parse_ip_list("spec.loadBalancerIP", v).map(|ip| at("spec.loadBalancerIP", ip))
        }
        _ => Ok(None),
    }
}

fn parse_ip_list(field: &str, value: &str) -> Result<Option<IpAddr>, InvalidField> {
    let invalid = |reason: &str| InvalidField {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    let mut ips = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        ips.push(
            part.parse::<IpAddr>()
                .map_err(|_| invalid("not an IP address (or a comma-separated list of them)"))?,
        );
    }
    if ips.is_empty() {
        return Err(invalid("empty"));
    }
    Ok(Some(
        ips.iter().find(|ip| ip.is_ipv4()).copied().unwrap_or(ips[0]),
    ))
}

/// What baton recorded on the Service about its FIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The FIP's id.
    pub id: String,
    /// Its address, if recorded and valid.
    pub address: Option<IpAddr>,
}

impl Record {
    /// Reads baton's record annotations; `None` when there is no (non-empty) id.
    pub fn read(svc: &ServiceFacts) -> Option<Self> {
        let id = svc.annotation(FIP_ID_ANNOTATION)?.trim();
        if id.is_empty() {
            return None;
        }
        Some(Self {
            id: id.to_owned(),
            address: svc
                .annotation(FIP_ADDRESS_ANNOTATION)
                .and_then(|a| a.trim().parse().ok()),
        })
    }
}

/// A FIP that carries the Service's three tags (a cloud fact, already verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedFip {
    /// The FIP's id.
    pub id: String,
    /// Its address.
    pub address: IpAddr,
}

/// Among the FIPs carrying the Service's tags, the one the Service uses, and the others (there
/// should be none: duplicates are released). Preference: the recorded id, then the address the
/// Service asks for, then the lowest id (stable across runs).
pub fn pick(
    mut candidates: Vec<OwnedFip>,
    record: Option<&Record>,
    requested: Option<IpAddr>,
) -> (Option<OwnedFip>, Vec<OwnedFip>) {
    candidates.sort_by(|a, b| a.id.cmp(&b.id));
    let index = record
        .and_then(|r| candidates.iter().position(|c| c.id == r.id))
        .or_else(|| requested.and_then(|ip| candidates.iter().position(|c| c.address == ip)))
        .or((!candidates.is_empty()).then_some(0));
    match index {
        Some(i) => {
            let chosen = candidates.remove(i);
            (Some(chosen), candidates)
        }
        None => (None, candidates),
    }
}

/// Where a new FIP's region came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionSource {
    /// The global `region` setting (`CHERRY_REGION_NAME`).
    Global,
    /// The Service annotation (its key).
    Annotation(String),
}

impl std::fmt::Display for RegionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Global => f.write_str("setting region (CHERRY_REGION_NAME)"),
            Self::Annotation(key) => write!(f, "annotation {key}"),
        }
    }
}

/// The region a new FIP is reserved in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionChoice {
    /// The value sent to the API.
    pub region: String,
    /// Where it came from (named when the API rejects it).
    pub source: RegionSource,
}

/// Why no region could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Neither the global setting nor the annotation is set.
    #[error(
        "no region for its Floating IP: set the global region (CHERRY_REGION_NAME / region) or annotate the Service with {annotation}"
    )]
    Missing {
        /// The annotation key to use.
        annotation: String,
    },
    /// The annotation is set to something that cannot be a region.
    #[error("annotation {annotation}={value:?} is not a region: {reason}")]
    Invalid {
        /// The annotation key.
        annotation: String,
        /// Its value.
        value: String,
        /// Why.
        reason: &'static str,
    },
}

/// The precedence cloud-provider-cherry's README documents: the global setting first, else the
/// Service annotation, else an error. (The Cherry CCM's code checks the annotation first; its
/// README, which baton follows, says global first.)
pub fn choose_region(
    global: Option<&str>,
    annotation_key: &str,
    svc: &ServiceFacts,
) -> Result<RegionChoice, RegionError> {
    if let Some(g) = global.map(str::trim).filter(|g| !g.is_empty()) {
        return Ok(RegionChoice {
            region: g.to_owned(),
            source: RegionSource::Global,
        });
    }
    let Some(value) = svc.annotation(annotation_key) else {
        return Err(RegionError::Missing {
            annotation: annotation_key.to_owned(),
        });
    };
    let invalid = |reason| RegionError::Invalid {
        annotation: annotation_key.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(invalid("empty"));
    }
    if trimmed.len() > 64 {
        return Err(invalid("longer than 64 characters"));
    }
    if !trimmed
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
    {
        return Err(invalid(
            "only letters, digits, '-', '_', '.' and spaces are allowed (e.g. LT-Siauliai)",
        ));
    }
    Ok(RegionChoice {
        region: trimmed.to_owned(),
        source: RegionSource::Annotation(annotation_key.to_owned()),
    })
}

/// What to do for a managed Service that is not being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The Service's FIP exists: make sure the Service shows it (annotations + status).
    Publish(OwnedFip),
    /// Reserve a FIP (none carries the Service's tags).
    Create,
    /// The Service brings its own IP and no FIP of baton's exists: nothing to do.
    ByoIp(IpAddr),
    /// The Service now asks for another IP than baton's FIP: release baton's, drop the record.
    ReleaseForByoIp {
        /// The IP the Service asks for.
        requested: IpAddr,
        /// baton's FIP, to release.
        ours: OwnedFip,
    },
}

/// The decision for a managed Service, from the IP it asks for, baton's record on it, and the
/// FIP carrying its tags (if any).
///
/// - Our FIP exists and the Service asks for nothing or for its address: publish it.
/// - Our FIP exists and the Service asks for another address (not one baton recorded): the user
///   brought their own IP.
/// - No FIP of ours: if the Service asks for an address that is not the one baton recorded, it is
///   bring-your-own; otherwise (nothing asked, or our own recorded address — the FIP was deleted
///   behind baton's back) reserve one.
pub fn decide(requested: Option<IpAddr>, record: Option<&Record>, ours: Option<OwnedFip>) -> Decision {
    match (ours, requested) {
        (Some(ours), None) => Decision::Publish(ours),
        (Some(ours), Some(ip)) if ip == ours.address => Decision::Publish(ours),
        // The annotation holds the address baton recorded earlier (a FIP since replaced): ours.
        (Some(ours), Some(ip)) if record.is_some_and(|r| r.address == Some(ip)) => Decision::Publish(ours),
        (Some(ours), Some(ip)) => Decision::ReleaseForByoIp { requested: ip, ours },
        (None, None) => Decision::Create,
        (None, Some(ip)) => {
            if record.is_some_and(|r| r.address == Some(ip)) {
                Decision::Create
            } else {
                Decision::ByoIp(ip)
            }
        }
    }
}

/// The writes needed for the Service to show `fip`: annotations to set (the implementation's IP
/// annotation and baton's record), and whether the status ingress must be applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishChanges {
    /// Annotations to set (empty: none changes).
    pub annotations: BTreeMap<String, String>,
    /// `status.loadBalancer.ingress` is not exactly `[fip]`.
    pub status: bool,
}

/// What differs between the Service and a Service showing `fip`.
pub fn publish_changes(svc: &ServiceFacts, mode: &LoadBalancerMode, fip: &OwnedFip) -> PublishChanges {
    let address = fip.address.to_string();
    let wanted = [
        (ip_annotation(mode), address.as_str()),
        (FIP_ID_ANNOTATION, fip.id.as_str()),
        (FIP_ADDRESS_ANNOTATION, address.as_str()),
    ];
    let annotations = wanted
        .iter()
        .filter(|(k, v)| svc.annotation(k) != Some(*v))
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    PublishChanges {
        annotations,
        status: svc.ingress_ips != [address],
    }
}

/// The changes without the hand-off to the load balancer (the implementation's IP annotation and
/// the status ingress): what a Service refused by the BGP prefix budget gets.
pub fn withhold_handoff(mut changes: PublishChanges, mode: &LoadBalancerMode) -> PublishChanges {
    changes.annotations.remove(ip_annotation(mode));
    changes.status = false;
    changes
}

/// The annotations baton removes when it stops managing a Service's FIP: its record, and the
/// implementation's IP annotation if it still holds baton's address.
pub fn record_removals(svc: &ServiceFacts, mode: Option<&LoadBalancerMode>) -> Vec<String> {
    let recorded = Record::read(svc).and_then(|r| r.address).map(|a| a.to_string());
    let mut keys = Vec::new();
    for key in [FIP_ID_ANNOTATION, FIP_ADDRESS_ANNOTATION] {
        if svc.annotations.contains_key(key) {
            keys.push(key.to_owned());
        }
    }
    if let (Some(mode), Some(recorded)) = (mode, recorded) {
        let key = ip_annotation(mode);
        if svc.annotation(key) == Some(recorded.as_str()) {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// A FIP baton made for a Service of this cluster (its `usage`, `cluster` and `service` tags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaggedFip {
    /// The FIP's id.
    pub id: String,
    /// Its `service` tag (base64 of sha256 of `ns/name`).
    pub service_tag: String,
}

/// The candidates of the orphan sweep: the FIPs whose `service` tag names no Service in
/// `owners` (the `service` tags of every Service the store shows, whatever its type).
///
/// Kubernetes can delete an object whose finalizer was added concurrently with the delete request
/// (kubernetes/kubernetes#77988), so a FIP can outlive its Service without a Cleanup ever running;
/// the sweep releases it. A candidate is only that: each is checked again right before it would
/// be deleted ([`sweep_decision`]), because the list of Services it was picked from ages while
/// the sweep runs (a Service re-created under the same name adopts its FIP).
pub fn orphans<S: std::hash::BuildHasher>(
    fips: &[TaggedFip],
    owners: &std::collections::HashSet<String, S>,
) -> Vec<String> {
    fips.iter()
        .filter(|f| !owners.contains(&f.service_tag))
        .map(|f| f.id.clone())
        .collect()
}

/// How long a new term waits before its orphan sweep deletes anything (its watches may not show
/// every Service yet), and how long after a Service was last seen its FIP is safe from the sweep.
pub const SWEEP_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

/// The FIP of a sweep candidate as the cloud shows it right before the delete (read by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FipNow {
    /// Still a Service FIP of this cluster carrying the candidate's `service` tag.
    pub same_owner_tag: bool,
    /// Routed (targeted) to a server.
    pub routed: bool,
    /// Carries the control-plane FIP tag.
    pub control_plane: bool,
}

/// The Service a sweep candidate's `service` tag names, in the live Service store right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// It exists (whatever its type).
    Exists,
    /// It does not; it was last seen this long ago.
    SeenAgo(std::time::Duration),
    /// Never seen by this replica.
    Unseen,
}

/// What the orphan sweep knows of one candidate right before deleting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepCheck {
    /// How long this replica has led in its current term.
    pub term_age: std::time::Duration,
    /// The FIP as the cloud shows it now; `None`: gone.
    pub fip: Option<FipNow>,
    /// Its Service.
    pub owner: Owner,
}

/// Why the sweep keeps a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The term is younger than [`SWEEP_QUIET`]: the watches may not show every Service yet.
    YoungTerm,
    /// The cloud no longer has it.
    Gone,
    /// It no longer carries the tags that made it a candidate.
    Retagged,
    /// Routed to a server: never deleted.
    Routed,
    /// The control-plane FIP: never deleted.
    ControlPlane,
    /// Its Service exists.
    OwnerExists,
    /// Its Service was seen less than [`SWEEP_QUIET`] ago (deleted and maybe re-created).
    OwnerSeenRecently,
}

/// The sweep's verdict on one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Release it now.
    Delete,
    /// Leave it.
    Keep(Kept),
}

/// Whether to delete a sweep candidate, on what is known right before the delete: never in the
/// first [`SWEEP_QUIET`] of a term, never a FIP whose Service exists or was seen within
/// [`SWEEP_QUIET`], never a routed or control-plane FIP, never one the cloud no longer shows as
/// the candidate it was.
pub fn sweep_decision(check: &SweepCheck) -> Sweep {
    if check.term_age < SWEEP_QUIET {
        return Sweep::Keep(Kept::YoungTerm);
    }
    let Some(fip) = check.fip else {
        return Sweep::Keep(Kept::Gone);
    };
    if !fip.same_owner_tag {
        return Sweep::Keep(Kept::Retagged);
    }
    if fip.routed {
        return Sweep::Keep(Kept::Routed);
    }
    if fip.control_plane {
        return Sweep::Keep(Kept::ControlPlane);
    }
    match check.owner {
        Owner::Exists => Sweep::Keep(Kept::OwnerExists),
        Owner::SeenAgo(ago) if ago < SWEEP_QUIET => Sweep::Keep(Kept::OwnerSeenRecently),
        Owner::SeenAgo(_) | Owner::Unseen => Sweep::Delete,
    }
}
