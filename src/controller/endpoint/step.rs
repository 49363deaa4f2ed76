//! The decision for one endpoint on one pass ([`Step`]): what is observed, whether a move is
//! held back, and the move itself (one retarget call, its Event and read-back).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use baton_cloud::model::{IpAddress, Server, ServerId};
use baton_core::failover::{
    Candidate, Decision, LastMove, Observation, Reason, avoid, decide, shared_failure_held, storm_held,
};
use baton_core::health::Health;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::events::EventType;
use tokio::time::Instant;

use super::cloud_view::CloudView;
use super::discover::service_of;
use super::record::Clocks;
use super::{EndpointError, EndpointOptions, EndpointRef, EndpointState};
use crate::controller::Context;
use crate::controller::context::object_ref;
use crate::controller::metrics::Metrics;
use crate::probe::Prober;

/// How long the FIP must fail while its holder answers directly before that is a reason to act.
const FIP_GRACE: Duration = Duration::from_millis(800);

/// What one endpoint's decision goes on.
struct Observed {
    obs: Observation,
    /// The last move of its FIP (this replica's or recorded by another).
    last_move: Option<LastMove>,
    /// How long the holder has failed its direct probes (zero: it does not).
    holder_failing_for: Duration,
}

/// What handling one endpoint did.
#[derive(Debug, Default)]
struct Outcome {
    /// The FIP as the cloud answered a move of it.
    moved: Option<IpAddress>,
    /// Run the loop again at once.
    again: bool,
    /// A probe target whose history belongs to the FIP's old holder (reset once every endpoint
    /// of the pass is done).
    reset: Option<SocketAddr>,
}

/// One iteration's view, shared by the endpoints handled in it.
pub(super) struct Step<'a> {
    pub(super) ctx: &'a Context,
    pub(super) opts: &'a EndpointOptions,
    pub(super) metrics: &'a Metrics,
    pub(super) services: &'a [Arc<Service>],
    pub(super) candidates: &'a [(Candidate, SocketAddr)],
    pub(super) api_servers: &'a [SocketAddr],
    pub(super) servers: &'a [Server],
    pub(super) nodes: &'a [Arc<Node>],
}

impl Step<'_> {
    /// Nothing moved, and the loop should run again at once (with a fresh FIP list).
    const AGAIN: Outcome = Outcome {
        moved: None,
        again: true,
        reset: None,
    };

    /// Handles every endpoint; returns whether the loop should run again at once.
    pub(super) async fn all(
        &self,
        endpoints: &[EndpointRef],
        states: &mut BTreeMap<String, EndpointState>,
        prober: &mut Prober,
        cloud_view: &mut CloudView,
    ) -> Result<bool, EndpointError> {
        // The endpoints at once: a move waits for the cloud (on Hetzner Cloud, for an action of
        // about half a second), and the FIPs of one failed holder (`api`, `api-int`) must not wait
        // for each other.
        let mut taken: Vec<(String, EndpointState)> = endpoints
            .iter()
            .map(|ep| {
                let key = ep.fip.id.as_str().to_owned();
                let state = states.remove(&key).unwrap_or_default();
                (key, state)
            })
            .collect();
        let results = {
            let shared: &Prober = prober;
            let runs = endpoints
                .iter()
                .zip(taken.iter_mut())
                .map(|(ep, (_, state))| self.endpoint(ep, state, shared));
            futures::future::join_all(runs).await
        };
        states.extend(taken);
        let mut again = false;
        let mut first_error = None;
        for result in results {
            match result {
                Ok(outcome) => {
                    if let Some(moved) = outcome.moved {
                        cloud_view.moved(moved);
                    }
                    if let Some(target) = outcome.reset {
                        prober.reset(&target)?;
                    }
                    again |= outcome.again;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(again),
        }
    }

    /// What `decide` and the rules against ping-pong go on for one endpoint, after reading the
    /// record of its last move on its Service (another replica's, a previous leader's, holds
    /// here too).
    fn observe(
        &self,
        ep: &EndpointRef,
        state: &mut EndpointState,
        prober: &Prober,
        clocks: Clocks,
    ) -> Observed {
        if let Some(svc) = service_of(self.services, &ep.service) {
            state.read_record(&svc, clocks, ep.fip.address);
        }
        let holder = ep.fip.target().map(|s| s.0);
        let last_move = state.hold.last_move(clocks.now);
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let my_node = self.ctx.leader.succession().node();
        let obs = Observation {
            holder,
            // From the holder's own node the FIP is delivered locally (the agent's rules): a
            // probe through it says nothing of the cloud's route, so it is not taken as an
            // answer ([`Self::probe_is_local`]).
            via_fip: if self.ctx.config.health_check.use_host_ip || self.probe_is_local(holder) {
                Health::Unknown
            } else {
                prober.health(&fip_target)
            },
            candidates: self.candidates.iter().map(|(c, _)| c.clone()).collect(),
            left: avoid(last_move.as_ref(), holder),
            leader_node: my_node.map(str::to_owned),
        };
        let holder_failing_for = holder
            .and_then(|h| self.probed_at(h))
            .and_then(|a| prober.failing_since(a))
            .map_or(Duration::ZERO, |t| clocks.now.saturating_duration_since(t));
        Observed {
            obs,
            last_move,
            holder_failing_for,
        }
    }

    /// Whether a probe through the FIP from this replica's node may be answered by the node
    /// itself rather than through the cloud's route: the node holds the FIP (its agent
    /// delivers it locally), or the node's own API server does not answer (its agent cannot
    /// read the FIP table then and keeps the rules it had, e.g. for a FIP that just left it).
    pub(super) fn probe_is_local(&self, holder: Option<u64>) -> bool {
        let Some(mine) = self.ctx.leader.succession().node() else {
            return false;
        };
        let on_holder = holder
            .and_then(|h| self.candidates.iter().find(|(c, _)| c.server_id == h))
            .is_some_and(|(c, _)| c.node == mine);
        let own_down = self
            .candidates
            .iter()
            .find(|(c, _)| c.node == mine)
            .is_some_and(|(c, _)| c.health != Health::Up);
        on_holder || own_down
    }

    /// The address candidate `server` is probed at.
    fn probed_at(&self, server: u64) -> Option<&SocketAddr> {
        self.candidates
            .iter()
            .find(|(c, _)| c.server_id == server)
            .map(|(_, a)| a)
    }

    /// Why a move `decision` makes waits, if it does (the rules against moving too soon), on
    /// what this pass observed.
    fn held(
        &self,
        state: &EndpointState,
        clocks: Clocks,
        decision: &Decision,
        seen: &Observed,
        prober: &Prober,
    ) -> Option<&'static str> {
        let Decision::Move { to, reason } = *decision else {
            return None;
        };
        let (holder, holder_failing_for) = (seen.obs.holder, seen.holder_failing_for);
        if state.hold.holds(clocks.now, reason) {
            return Some(
                "the FIP does not answer through its route but moved recently; holding it where it is",
            );
        }
        if storm_held(seen.last_move.as_ref(), holder, reason, holder_failing_for) {
            return Some(
                "the FIP's new holder fails its probes since the FIP moved to it; moving it only if that lasts",
            );
        }
        let target_ok_for = self
            .probed_at(to)
            .and_then(|a| prober.last_failure(a))
            .map(|t| clocks.now.saturating_duration_since(t));
        shared_failure_held(reason, holder_failing_for, target_ok_for).then_some(
            "the FIP's holder failed its probes, but so did the other servers until a moment ago (a shared failure, e.g. etcd), or it answers again; moving it only if the holder goes on failing alone",
        )
    }

    /// Decides and acts for one endpoint, then keeps its Service's status and endpoints current.
    async fn endpoint(
        &self,
        ep: &EndpointRef,
        ep_state: &mut EndpointState,
        prober: &Prober,
    ) -> Result<Outcome, EndpointError> {
        let Self { ctx, metrics, .. } = *self;
        let state = ep_state;
        let clocks = Clocks::now();
        let seen = self.observe(ep, state, prober, clocks);
        let obs = &seen.obs;
        // A route that changed since the previous pass (a move by someone else, seen in a
        // fresh list) starts a new episode, and settles before "unreachable" means anything.
        if state.seen && state.seen_holder != obs.holder {
            state.hold.route_changed(Instant::now());
            state.unreachable_since = None;
            state.route_checked = false;
        }
        (state.seen, state.seen_holder) = (true, obs.holder);
        let decision = decide(obs);
        let held = self.held(state, clocks, &decision, &seen, prober);
        let mut moved = None;
        if !matches!(
            decision,
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            }
        ) {
            state.unreachable_since = None;
        }
        match decision {
            Decision::Keep => {
                state.down_since = None;
                state.stuck_reported = false;
                state.route_checked = false;
            }
            // The FIP does not answer but the holder we know of does. A holder that is failing
            // often fails through the FIP a probe earlier than directly: give it a moment to
            // show as down (then it moves at once, for that reason).
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            } if state.unreachable_since.get_or_insert_with(Instant::now).elapsed() < FIP_GRACE => {}
            // Still so: first make sure we know the holder (someone may have moved the FIP since
            // the list was read), once per episode.
            Decision::Move {
                reason: Reason::FipUnreachable,
                ..
            } if !state.route_checked => {
                state.route_checked = true;
                ctx.cloud.invalidate_ips();
                tracing::debug!(fip = %ep.fip.address, "the FIP does not answer through its route: reading its holder afresh");
                return Ok(Step::AGAIN);
            }
            Decision::Stuck { reason } => {
                state.down_since.get_or_insert_with(Instant::now);
                if !state.stuck_reported && ctx.leader.is_leader() {
                    state.stuck_reported = true;
                    metrics.stuck(reason.as_str());
                    tracing::warn!(fip = %ep.fip.address, reason = reason.as_str(), "no healthy control-plane server to move the FIP to");
                    if let Some(svc) = service_of(self.services, &ep.service) {
                        ctx.event(
                            &*svc,
                            EventType::Warning,
                            "NoHealthyControlPlane",
                            "Failover",
                            if reason == Reason::RouterDown {
                                format!("FIP {} should move ({}) but no other control-plane node's API server and SNI router are both healthy; keeping it", ep.fip.address, reason.as_str())
                            } else {
                                format!("FIP {} should move ({}) but no control-plane API server is healthy; keeping it", ep.fip.address, reason.as_str())
                            },
                        )
                        .await;
                    }
                }
            }
            // Held: by the hold-down; or the holder the FIP just moved to fails from the moment
            // it got it (the reconnect storm the move sent there may pass, it moves if it
            // lasts); or the target failed too while the holder was failing (it moves if the
            // holder goes on failing alone).
            Decision::Move { reason, .. } if held.is_some() => {
                if !state.hold.reported && ctx.leader.is_leader() {
                    state.hold.reported = true;
                    metrics.failover_held();
                    tracing::warn!(fip = %ep.fip.address, reason = reason.as_str(), failing_ms = seen.holder_failing_for.as_millis(), "{}", held.unwrap_or_default());
                }
            }
            Decision::Move { to, reason } => {
                // Only the current lease holder writes to the cloud; the cloud client's fence
                // checks again right before the request leaves.
                if !ctx.leader.is_leader() {
                    return Ok(Outcome::default());
                }
                moved = self.move_fip(ep, state, prober, to, reason).await?;
                state.route_checked = false;
            }
        }
        self.keep_status(ep, state).await;
        if moved.is_none() {
            self.keep_holder(ep, state);
        }
        // The FIP's probe history belongs to the old holder: started afresh after the pass.
        let reset = moved
            .as_ref()
            .map(|_| SocketAddr::new(ep.fip.address, ep.fip_port));
        Ok(Outcome {
            moved,
            again: false,
            reset,
        })
    }

    /// Retargets the FIP to `to` in one call (urgent priority), reads it back, and reports.
    async fn move_fip(
        &self,
        ep: &EndpointRef,
        state: &mut EndpointState,
        prober: &Prober,
        to: u64,
        reason: Reason,
    ) -> Result<Option<IpAddress>, EndpointError> {
        let Self {
            ctx,
            opts,
            metrics,
            candidates,
            ..
        } = *self;
        let fip_target = SocketAddr::new(ep.fip.address, ep.fip_port);
        let from = ep.fip.target();
        // The episode began with the first failed probe of the holder (or through the FIP),
        // not with this decision: that is what a client saw.
        let holder_addr = from.and_then(|h| {
            candidates
                .iter()
                .find(|(c, _)| c.server_id == h.0)
                .map(|(_, a)| *a)
        });
        let since = [
            state.down_since,
            holder_addr.and_then(|a| prober.failing_since(&a)),
            prober.failing_since(&fip_target),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(Instant::now);
        state.down_since.get_or_insert(since);
        tracing::info!(fip = %ep.fip.address, ?from, to, reason = reason.as_str(), "moving the control-plane FIP");
        let moved = match opts.urgent_cloud.retarget_ip(&ep.fip.id, ServerId(to)).await {
            Ok(ip) => {
                let recovered = since.elapsed();
                metrics.failover(reason.as_str(), recovered);
                state.down_since = None;
                state.stuck_reported = false;
                state.hold.moved(Clocks::now(), from.map(|s| s.0), to, reason);
                (state.seen, state.seen_holder) = (true, ip.target().map(|s| s.0));
                let confirmed = ip.target() == Some(ServerId(to));
                tracing::info!(fip = %ep.fip.address, to, confirmed, recovered_ms = recovered.as_millis(), "control-plane FIP moved");
                Some(ip)
            }
            Err(error) if error.is_fenced() => {
                metrics.failover_fenced();
                tracing::warn!(%error, fip = %ep.fip.address, to, "not moving the FIP: this replica's leadership ended first");
                None
            }
            Err(error) => {
                metrics.failover_error();
                tracing::warn!(%error, fip = %ep.fip.address, to, "retargeting the FIP failed");
                None
            }
        };
        let result = moved.clone();
        let moved = moved.is_some();
        // The Event and the read-back run aside, the read-back at normal priority: another FIP
        // on the same failed holder must not wait for them (the Event may go through a
        // failing-over API client; the read-back would take the next urgent slot).
        let to_name = candidates
            .iter()
            .find(|(c, _)| c.server_id == to)
            .map_or_else(|| "?".to_owned(), |(c, _)| c.node.clone());
        let service = service_of(self.services, &ep.service);
        let (ctx, cloud, fip) = (ctx.clone(), Arc::clone(&ctx.cloud), ep.fip.clone());
        tokio::spawn(async move {
            if moved && let Some(svc) = service {
                // The node it moved to is the Event's related object: repeated moves to other
                // nodes are separate Events, not one series with the first move's note.
                let node = object_ref("v1", "Node", None, &to_name);
                ctx.event_related(
                    &*svc,
                    Some(node),
                    EventType::Normal,
                    "FloatingIPMoved",
                    "Failover",
                    format!(
                        "moved FIP {} from server {} to {to_name} (server {to}): {}",
                        fip.address,
                        from.map_or_else(|| "none".to_owned(), |s| s.to_string()),
                        reason.as_str()
                    ),
                )
                .await;
            }
            // Read back what the cloud now says (the write's own response already did once).
            match cloud.ip(&fip.id).await {
                Ok(ip) if ip.target() == Some(ServerId(to)) => {}
                Ok(ip) => {
                    tracing::warn!(fip = %fip.address, to, now = ?ip.target(), "the FIP is not where it was moved");
                }
                Err(error) => tracing::debug!(%error, "reading the FIP back failed"),
            }
        });
        Ok(result)
    }
}
