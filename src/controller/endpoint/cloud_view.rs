//! What the loop reads from the cloud: the servers ([`ServerList`]), the IP list and its
//! fallback while the cloud cannot be read ([`CloudView`]), the read ahead of a takeover
//! ([`Takeover`]), re-reads for endpoint addresses the list does not show ([`UnknownFips`]), and
//! the `baton_fips_owned` count.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::model::{IpAddress, IpList, IpType, Server, each_ip};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use tokio::time::Instant;

use super::EndpointOptions;
use super::candidates::server_by_ip;
use super::discover::{discover, service_of};
use super::finalizer::lb_ip;
use crate::controller::context::TAKEOVER_MARGIN;
use crate::controller::metrics::Metrics;
use crate::controller::mirror::CONTROL_PLANE_ENDPOINT_ANNOTATION;
use crate::controller::trust::EndpointPolicy;
use crate::controller::{Context, LeaderGate};

/// The project's servers, as the endpoint loop knows them: read at start, every
/// `servers_refresh` on the leader, and soon when an API server has no known server. Followers do
/// not poll it.
pub(super) struct ServerList {
    servers: Vec<Server>,
    at: Option<Instant>,
    /// How long an API server address without a known server waits for the next list (5 s,
    /// doubling up to `servers_refresh`): an address that is no server of the project (a
    /// bootstrap host elsewhere) must not cost a list call every few seconds.
    unknown_wait: Duration,
}

impl Default for ServerList {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            at: None,
            unknown_wait: Self::UNKNOWN_FIRST_WAIT,
        }
    }
}

impl ServerList {
    const UNKNOWN_FIRST_WAIT: Duration = Duration::from_secs(5);

    pub(super) async fn refresh(
        &mut self,
        opts: &EndpointOptions,
        api_servers: &[SocketAddr],
        leading: bool,
    ) -> &[Server] {
        let unknown = api_servers
            .iter()
            .any(|a| server_by_ip(&self.servers, a.ip()).is_none());
        if !unknown {
            self.unknown_wait = Self::UNKNOWN_FIRST_WAIT;
        }
        let due = self.at.is_none_or(|t| {
            (leading && t.elapsed() > opts.servers_refresh) || (unknown && t.elapsed() > self.unknown_wait)
        });
        if due {
            if self.at.is_some() && unknown {
                self.unknown_wait = (self.unknown_wait * 2).min(opts.servers_refresh);
            }
            // Urgent, like the move itself: a queue of Service FIP work must not delay failover;
            // and with a list to go on, a slow cloud holds the loop up at most a second.
            let read = opts.urgent_cloud.servers();
            let result = if self.servers.is_empty() {
                Some(read.await)
            } else {
                tokio::time::timeout(CloudView::READ_LIMIT, read).await.ok()
            };
            match result {
                Some(Ok(s)) => self.servers = s,
                Some(Err(error)) => tracing::warn!(%error, "listing servers failed"),
                None => tracing::warn!("listing servers is slow: going on with the last list"),
            }
            self.at = Some(Instant::now());
        }
        &self.servers
    }
}

/// A new leader must not act on a holder the previous leader changed a moment before it
/// stopped: the shared IP store makes the first read of a new term wait for a list fetched after
/// the previous holder stopped writing (`baton_cloud::Leadership`). That read costs a cloud round
/// trip (and a slot of the rate limit) on the failover path when the previous leader's node died.
/// So a follower makes it *before* it takes over: once the holder has not renewed for
/// `leaseRenewDeadline` + [`TAKEOVER_MARGIN`], the holder has stopped writing (its fence) and its
/// last writes have landed; the list read then is as good as one read at the takeover, 250 ms
/// later, and the store takes it for the new term. Without such a read (a graceful release, say),
/// the new leader's first read fetches the list.
#[derive(Default)]
pub(super) struct Takeover {
    leading: bool,
    /// For which holder's stop the list was read ahead.
    prefetched: Option<Instant>,
}

impl Takeover {
    /// When to read the list ahead, if a takeover is coming and it has not been read for it.
    pub(super) fn prefetch_at(&self, leader: &LeaderGate) -> Option<Instant> {
        let h = leader.handover()?;
        let at = h.holder_stopped + TAKEOVER_MARGIN;
        (!self.leading && at < h.takeover && self.prefetched != Some(h.holder_stopped)).then_some(at)
    }

    /// Follows leadership; returns whether the IP list is to be read now (ahead of a takeover).
    pub(super) fn step(&mut self, ctx: &Context) -> bool {
        let mut read_now = false;
        let now_leading = ctx.leader.is_leader();
        if !now_leading
            && let Some(h) = ctx.leader.handover()
            && self
                .prefetch_at(&ctx.leader)
                .is_some_and(|at| Instant::now() >= at)
        {
            tracing::debug!("the leader has stopped renewing: reading the FIP list ahead of a takeover");
            ctx.cloud.invalidate_ips();
            read_now = true;
            self.prefetched = Some(h.holder_stopped);
        }
        if now_leading && !self.leading {
            self.prefetched = None;
        }
        self.leading = now_leading;
        read_now
    }
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The last IP list read from the cloud, kept for decisions while the cloud cannot be read.
#[derive(Default)]
pub(super) struct CloudView {
    last: Option<(IpList, Instant)>,
    failing_since: Option<Instant>,
    reported: bool,
}

impl CloudView {
    /// After this long without a successful read, the operator is told (Event, log).
    const REPORT_AFTER: Duration = Duration::from_secs(10);

    /// The last list read, if any.
    pub(super) fn last_list(&self) -> Option<IpList> {
        self.last.as_ref().map(|(ips, _)| Arc::clone(ips))
    }

    fn read(&mut self, ips: &IpList, metrics: &Metrics) {
        if self.failing_since.take().is_some() {
            tracing::info!("the cloud API answers again");
            metrics.cloud_stale(false);
        }
        self.reported = false;
        self.last = Some((Arc::clone(ips), Instant::now()));
    }

    /// The list to go on after a failed read, if there is one.
    fn stale(&mut self, error: &baton_cloud::CloudError, metrics: &Metrics) -> Option<IpList> {
        if self.failing_since.is_none() {
            tracing::warn!(%error, "the cloud API cannot be read; deciding from the last IP list read");
            metrics.cloud_stale(true);
        }
        self.failing_since.get_or_insert_with(Instant::now);
        self.last.as_ref().map(|(ips, _)| Arc::clone(ips))
    }

    /// How long a read of the IP list may hold up the loop when an earlier list exists: a slow
    /// cloud (or a list fetch shared with a Service reconcile, retrying) must not delay a
    /// failover; the decision is made from the last list read, and the read is tried again on
    /// the next pass.
    const READ_LIMIT: Duration = Duration::from_secs(1);

    /// Reads the IP list, or falls back on the last one read (and tells the operator).
    pub(super) async fn fetch(
        &mut self,
        ctx: &Context,
        metrics: &Metrics,
        services: &[Arc<Service>],
        api_servers: &[SocketAddr],
    ) -> Option<IpList> {
        let read = ctx.cloud.ips();
        let result = if self.last.is_some() {
            if let Ok(result) = tokio::time::timeout(Self::READ_LIMIT, read).await {
                result
            } else {
                tracing::debug!(
                    limit_ms = Self::READ_LIMIT.as_millis(),
                    "the IP list read is slow: deciding from the last list read"
                );
                return self.last_list();
            }
        } else {
            read.await
        };
        let error = match result {
            Ok(ips) => {
                self.read(&ips, metrics);
                return Some(ips);
            }
            Err(error) => error,
        };
        let Some(ips) = self.stale(&error, metrics) else {
            tracing::warn!(%error, "listing IPs failed (no earlier list to go on)");
            return None;
        };
        if self.should_report() && ctx.leader.is_leader() {
            self.reported = true;
            for ep in discover(ctx, services, &ips, api_servers).0 {
                if let Some(svc) = service_of(services, &ep.service) {
                    ctx.event(
                        &*svc,
                        EventType::Warning,
                        "CloudUnavailable",
                        "Failover",
                        format!(
                            "the cloud API cannot be read ({}); deciding from the IP list read {} s ago",
                            error.category(),
                            self.age_secs()
                        ),
                    )
                    .await;
                }
            }
        }
        Some(ips)
    }

    fn should_report(&self) -> bool {
        !self.reported
            && self
                .failing_since
                .is_some_and(|t| t.elapsed() >= Self::REPORT_AFTER)
    }

    fn age_secs(&self) -> u64 {
        self.last.as_ref().map_or(0, |(_, at)| at.elapsed().as_secs())
    }

    /// A move this replica made: its own list must not show the old holder any more.
    pub(super) fn moved(&mut self, ip: IpAddress) {
        if let Some((ips, _)) = self.last.as_mut() {
            let list = Arc::make_mut(ips);
            if let Some(entry) = list.iter_mut().find(|i| i.id == ip.id) {
                *entry = Arc::new(ip);
            }
        }
    }
}

/// The `loadBalancerIP`s of live annotated endpoint Services that are no FIP in `ips`.
pub(super) fn unknown_endpoint_ips<B: Borrow<IpAddress>>(
    policy: &EndpointPolicy,
    services: &[Arc<Service>],
    ips: &[B],
) -> BTreeSet<IpAddr> {
    services
        .iter()
        .filter(|s| {
            s.metadata.deletion_timestamp.is_none()
                && policy.allows_namespace(s.metadata.namespace.as_deref().unwrap_or_default())
                && s.annotations()
                    .get(CONTROL_PLANE_ENDPOINT_ANNOTATION)
                    .is_some_and(|v| v == "true")
        })
        .filter_map(|s| lb_ip(s))
        .filter(|ip| !each_ip(ips).any(|f| f.address == *ip && f.ip_type == IpType::FloatingIp))
        .collect()
}

/// When to read the IP list again for endpoint addresses it does not show: at once when the set
/// of unknown addresses changes, then after [`Self::FIRST_WAIT`], doubling up to [`Self::MAX_WAIT`].
#[derive(Debug)]
pub(super) struct UnknownFips {
    last: BTreeSet<IpAddr>,
    at: Option<Instant>,
    wait: Duration,
}

impl Default for UnknownFips {
    fn default() -> Self {
        Self {
            last: BTreeSet::new(),
            at: None,
            wait: Self::FIRST_WAIT,
        }
    }
}

impl UnknownFips {
    const FIRST_WAIT: Duration = Duration::from_secs(5);
    const MAX_WAIT: Duration = Duration::from_secs(600);

    /// Whether the list should be read again now, given the addresses it does not show.
    pub(super) fn due(&mut self, unknown: &BTreeSet<IpAddr>) -> bool {
        if unknown.is_empty() {
            *self = Self::default();
            return false;
        }
        let now = Instant::now();
        if !unknown.is_subset(&self.last) {
            self.last.clone_from(unknown);
            self.at = Some(now);
            self.wait = Self::FIRST_WAIT;
            return true;
        }
        self.last.clone_from(unknown);
        match self.at {
            Some(at) if now.duration_since(at) < self.wait => false,
            _ => {
                self.at = Some(now);
                self.wait = (self.wait * 2).min(Self::MAX_WAIT);
                true
            }
        }
    }
}

/// `baton_fips_owned`: the control-plane endpoints routed, and this cluster's Service FIPs in
/// `ips` (counted once per list read, not once per tick, and at most every [`COUNT_EVERY`]:
/// during a burst of creates the list changes at every tick, and a count walks all of it).
pub(super) fn count_owned(
    ctx: &Context,
    metrics: &Metrics,
    endpoints: usize,
    ips: &IpList,
    counted: &mut Counted,
) {
    metrics.set_fips_owned("control_plane", endpoints);
    let list = Arc::downgrade(ips);
    if !counted.list.ptr_eq(&list) && counted.at.is_none_or(|at| at.elapsed() >= COUNT_EVERY) {
        *counted = Counted {
            list,
            at: Some(Instant::now()),
        };
        let owned = ips
            .iter()
            .filter(|ip| crate::controller::service::is_cluster_service_fip(ip, &ctx.cluster_id))
            .count();
        metrics.set_fips_owned("service", owned);
    }
}

/// How often `baton_fips_owned{kind="service"}` may be counted again.
const COUNT_EVERY: Duration = Duration::from_secs(5);

/// The IP list `baton_fips_owned` last counted, and when.
#[derive(Default)]
pub(super) struct Counted {
    list: std::sync::Weak<Vec<Arc<IpAddress>>>,
    at: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::endpoint::fixtures::{endpoint_svc, fip_at, policy};

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_address_the_list_does_not_show_rereads_it_at_once_then_ever_more_rarely() {
        let mut u = UnknownFips::default();
        let none = BTreeSet::new();
        let one: BTreeSet<IpAddr> = BTreeSet::from(["203.0.113.9".parse().unwrap()]);
        let two: BTreeSet<IpAddr> =
            BTreeSet::from(["203.0.113.9".parse().unwrap(), "203.0.113.10".parse().unwrap()]);
        assert!(!u.due(&none));
        assert!(u.due(&one), "a new unknown address: at once");
        assert!(!u.due(&one));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(u.due(&one), "then after 5 s");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!u.due(&one), "then after 10 s");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(u.due(&one));
        assert!(u.due(&two), "another new address: at once again");
        assert!(!u.due(&one), "one of the known ones going is no reason");
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(600)).await;
            assert!(u.due(&one));
        }
        assert_eq!(u.wait, UnknownFips::MAX_WAIT);
        assert!(!u.due(&none));
        assert!(u.due(&one), "known again, then unknown: at once");
    }

    #[test]
    fn unknown_endpoint_ips_are_live_annotated_services_addresses_missing_from_the_list() {
        let ips = vec![fip_at("203.0.113.1", Some(1), &[])];
        let services = vec![
            endpoint_svc("default", "api", "203.0.113.1", false, false, true),
            endpoint_svc("default", "new", "203.0.113.2", false, false, true),
            endpoint_svc("default", "going", "203.0.113.3", true, true, true),
            endpoint_svc("default", "plain", "203.0.113.4", false, false, false),
            // A namespace that may not hold endpoints costs no list read.
            endpoint_svc("tenant", "probe", "203.0.113.5", false, false, true),
        ];
        assert_eq!(
            unknown_endpoint_ips(&policy(None), &services, &ips),
            BTreeSet::from(["203.0.113.2".parse().unwrap()])
        );
    }

    fn ip(id: &str, target: Option<u64>) -> IpAddress {
        serde_json::from_value(serde_json::json!({
            "id": id,
            "address": "203.0.113.1",
            "type": "floating-ip",
            "targeted_to": target.map(|t| serde_json::json!({"id": t})),
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_cloud_cannot_be_read_decisions_use_the_last_list_and_its_own_moves() {
        let metrics = Metrics::default();
        let mut view = CloudView::default();
        let error = baton_cloud::CloudError::Config("outage".into());
        assert!(
            view.stale(&error, &metrics).is_none(),
            "nothing read yet: nothing to go on"
        );

        let list: IpList = Arc::new(vec![Arc::new(ip("a", Some(1))), Arc::new(ip("b", Some(2)))]);
        view.read(&list, &metrics);
        let stale = view.stale(&error, &metrics).expect("the last list");
        assert_eq!(stale.len(), 2);
        assert!(metrics.encode().contains("baton_cloud_ip_list_stale 1"));
        assert!(!view.should_report(), "a short outage is not reported");
        tokio::time::advance(CloudView::REPORT_AFTER).await;
        assert!(view.should_report(), "a long one is");

        // A move made during the outage is part of the list decisions use.
        view.moved(ip("a", Some(3)));
        let stale = view.stale(&error, &metrics).unwrap();
        assert_eq!(stale[0].target().map(|s| s.0), Some(3));
        assert_eq!(stale[1].target().map(|s| s.0), Some(2));

        view.read(&list, &metrics);
        assert!(metrics.encode().contains("baton_cloud_ip_list_stale 0"));
        assert!(!view.should_report());
    }
}
