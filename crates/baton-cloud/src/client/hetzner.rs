//! The client's Hetzner Cloud side: paths, pages, the objects' conversion, and actions.
//!
//! ```text
//!  retarget_ip ──► POST /floating_ips/{id}/actions/assign (fenced, once) ──► 201 {action}
//!                    │ 422 floating_ip_assigned: unassign first (only then)
//!                    │ unknown outcome: GET the FIP; moved? done : send again (423 while running)
//!                    ▼
//!                  GET /actions/{id} every `action_poll` until success | error ──► GET the FIP
//! ```
//!
//! A move is one assign action: never unassign then assign unless the API demands it. An action
//! that the API accepted is followed to its end; while it runs it counts as a write in flight (a
//! graceful release waits for it). An action that ends in `error` is surfaced with its code and
//! the FIP is read back; one that outlives `action_timeout` is of unknown outcome and read back.
//!
//! Every action a client follows is polled together ([`Running`]): one caller at a time reads
//! `GET /actions?id=…&id=…` for all of them (as hcloud-go's waiter does), the others take their
//! action from that round. A thousand moves at once cost one read per round, not a thousand: the
//! API's bucket (3,600 requests an hour) is for moves, not for watching them. After a success the
//! IP is the one the store holds with its new server: no read of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use http::Method;
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use super::{CloudClient, decode, encode, fenced, fenced_after};
use crate::cloud::Cloud as _;
use crate::error::{CloudError, Object, Op};
use crate::fence::{CallTerm, InFlight};
use crate::hetzner::model::{
    ACTION_ERROR, ACTION_SUCCESS, Action, ActionAnswer, ActionList, AssignRequest, CreateFloatingIpAnswer,
    CreateFloatingIpRequest, FloatingIpAnswer, FloatingIpList, LocationList, Meta, ServerAnswer, ServerList,
    codes,
};
use crate::hetzner::{ip_of, region_of, server_of};
use crate::limiter::Priority;
use crate::model::{CreateIpRequest, IpAddress, IpId, Region, Server, ServerId};

/// The largest page the API sends.
const PER_PAGE: &str = "50";
/// Actions asked for in one `GET /actions?id=…` (a short URL).
const ACTIONS_PER_READ: usize = 50;

/// The actions this client follows, polled together: one round at a time reads every one of
/// them; each follower takes its own action's state from the latest round.
#[derive(Debug, Default)]
pub(crate) struct Running {
    state: Mutex<RunState>,
    /// A round ended.
    polled: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct RunState {
    /// Followers per action id.
    waiting: BTreeMap<u64, usize>,
    /// The latest state of each action a round read, and when that round began.
    results: HashMap<u64, (tokio::time::Instant, Action)>,
    /// A round is under way.
    polling: bool,
    /// When the last round began.
    last_round: Option<tokio::time::Instant>,
}

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, RunState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One follower of an action: leaves the set when dropped (also when its call is cancelled).
struct Following<'a> {
    running: &'a Running,
    id: u64,
}

impl<'a> Following<'a> {
    fn new(running: &'a Running, id: u64) -> Self {
        *running.lock().waiting.entry(id).or_default() += 1;
        Self { running, id }
    }
}

impl Drop for Following<'_> {
    fn drop(&mut self) {
        let mut state = self.running.lock();
        if let Some(n) = state.waiting.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                state.waiting.remove(&self.id);
                state.results.remove(&self.id);
            }
        }
    }
}

/// Ends a round even if the round's future is dropped.
struct Round<'a>(&'a Running);

impl Drop for Round<'_> {
    fn drop(&mut self) {
        self.0.lock().polling = false;
        self.0.polled.notify_waiters();
    }
}

impl CloudClient {
    /// Every page of a list: `per_page=50`, following `meta.pagination.next_page`.
    async fn h_all_pages<P: DeserializeOwned, X>(
        &self,
        op: Op,
        object: &Object,
        path: &str,
        split: impl Fn(P) -> (Vec<X>, Option<Meta>),
    ) -> Result<Vec<X>, CloudError> {
        let mut out = Vec::new();
        let mut page: u64 = 1;
        loop {
            let mut url = self.url(&[path]);
            url.query_pairs_mut()
                .append_pair("page", &page.to_string())
                .append_pair("per_page", PER_PAGE);
            let answer: P = self.call(op, object, Method::GET, url, None::<&()>, None).await?;
            let (items, meta) = split(answer);
            out.extend(items);
            match meta.and_then(|m| m.pagination.next_page) {
                Some(next) if next > page => page = next,
                _ => return Ok(out),
            }
        }
    }

    fn h_ip(
        op: Op,
        object: &Object,
        fip: &crate::hetzner::model::FloatingIp,
    ) -> Result<IpAddress, CloudError> {
        ip_of(fip).ok_or_else(|| CloudError::InvalidRequest {
            op,
            object: object.clone(),
            reason: format!(
                "the API sent Floating IP {} with the address {:?}",
                fip.id, fip.ip
            ),
        })
    }

    /// Every Floating IP of the project (the token's), all pages.
    pub(super) async fn h_list_ips(&self) -> Result<Vec<IpAddress>, CloudError> {
        let object = Object("floating ips".into());
        let fips = self
            .h_all_pages(Op::ListIps, &object, "floating_ips", |l: FloatingIpList| {
                (l.floating_ips, Some(l.meta))
            })
            .await?;
        fips.iter().map(|f| Self::h_ip(Op::ListIps, &object, f)).collect()
    }

    /// One Floating IP, read from the API.
    pub(super) async fn h_get_ip(&self, id: &IpId) -> Result<IpAddress, CloudError> {
        let object = Object(format!("ip {id}"));
        let url = self.url(&["floating_ips", id.as_str()]);
        let answer: FloatingIpAnswer = self
            .call(Op::GetIp, &object, Method::GET, url, None::<&()>, None)
            .await?;
        Self::h_ip(Op::GetIp, &object, &answer.floating_ip)
    }

    pub(super) async fn h_servers(&self) -> Result<Vec<Server>, CloudError> {
        let object = Object("servers".into());
        let servers = self
            .h_all_pages(Op::ListServers, &object, "servers", |l: ServerList| {
                (l.servers, Some(l.meta))
            })
            .await?;
        Ok(servers.iter().map(server_of).collect())
    }

    pub(super) async fn h_server(&self, id: ServerId) -> Result<Server, CloudError> {
        let sid = id.to_string();
        let object = Object(format!("server {sid}"));
        let answer: ServerAnswer = self
            .call(
                Op::GetServer,
                &object,
                Method::GET,
                self.url(&["servers", &sid]),
                None::<&()>,
                None,
            )
            .await?;
        Ok(server_of(&answer.server))
    }

    pub(super) async fn h_regions(&self) -> Result<Vec<Region>, CloudError> {
        let object = Object("locations".into());
        let locations = self
            .h_all_pages(Op::ListRegions, &object, "locations", |l: LocationList| {
                (l.locations, l.meta)
            })
            .await?;
        Ok(locations.iter().map(region_of).collect())
    }

    /// Follows an accepted action until it ends: `Ok` on `success`.
    async fn h_follow(&self, op: Op, object: &Object, mut action: Action) -> Result<(), CloudError> {
        let started = tokio::time::Instant::now();
        let mut pause = self.inner.action_poll;
        let following = Following::new(&self.inner.running, action.id);
        loop {
            match action.status.as_str() {
                ACTION_SUCCESS => return Ok(()),
                ACTION_ERROR => {
                    let (code, message) = action.error.map_or_else(
                        || ("unknown".into(), "no error given".into()),
                        |e| (e.code, e.message),
                    );
                    return Err(CloudError::ActionFailed {
                        op,
                        object: object.clone(),
                        action: Box::new(crate::error::ActionFailure {
                            id: action.id,
                            command: action.command,
                            code,
                            message: self.mask(&message),
                        }),
                    });
                }
                _ => {}
            }
            let waited = started.elapsed();
            if waited >= self.inner.action_timeout {
                return Err(CloudError::ActionTimeout {
                    op,
                    object: object.clone(),
                    action: action.id,
                    waited,
                });
            }
            let since = tokio::time::Instant::now();
            tokio::time::sleep(pause).await;
            // Quick while a move is expected to land (about a second), then at most every second.
            if started.elapsed() > Duration::from_secs(2) {
                pause = (pause * 3 / 2).min(Duration::from_secs(1)).max(pause);
            }
            if let Some(now) = self.h_poll(object, &following, since).await? {
                action = now;
            }
        }
    }

    /// The action's state from a round that began at or after `since`: taken from such a round
    /// if one ran (another follower's), else from the one under way, else from a round this
    /// caller reads itself. `None`: the round did not show it (read again next time).
    async fn h_poll(
        &self,
        object: &Object,
        following: &Following<'_>,
        since: tokio::time::Instant,
    ) -> Result<Option<Action>, CloudError> {
        let running = &self.inner.running;
        loop {
            let ended = running.polled.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let ids: Vec<u64> = {
                let mut state = running.lock();
                if let Some((at, _)) = state.results.get(&following.id)
                    && *at >= since
                {
                    return Ok(state.results.remove(&following.id).map(|(_, a)| a));
                }
                if state.polling {
                    Vec::new()
                } else if state.last_round.is_some_and(|at| at >= since) {
                    // A round since then did not show this action.
                    return Ok(None);
                } else {
                    state.polling = true;
                    state.last_round = Some(tokio::time::Instant::now());
                    state.waiting.keys().copied().collect()
                }
            };
            if ids.is_empty() {
                // Another caller's round: its end wakes this one (or a second passes).
                let _ = tokio::time::timeout(Duration::from_secs(1), ended).await;
                continue;
            }
            let began = tokio::time::Instant::now();
            let _round = Round(running);
            let read = self.h_read_actions(object, &ids).await?;
            let mut state = running.lock();
            let mine = read.iter().find(|a| a.id == following.id).cloned();
            for action in read {
                if action.id != following.id && state.waiting.contains_key(&action.id) {
                    state.results.insert(action.id, (began, action));
                }
            }
            return Ok(mine);
        }
    }

    /// `GET /actions?id=…` for `ids`, in reads of [`ACTIONS_PER_READ`], in the urgent lane (a
    /// failover may be among them; these reads are few).
    async fn h_read_actions(&self, object: &Object, ids: &[u64]) -> Result<Vec<Action>, CloudError> {
        let urgent = self.with_priority(Priority::Urgent);
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(ACTIONS_PER_READ) {
            let mut url = self.url(&["actions"]);
            {
                let mut query = url.query_pairs_mut();
                for id in chunk {
                    query.append_pair("id", &id.to_string());
                }
            }
            let list: ActionList = urgent
                .call(Op::GetAction, object, Method::GET, url, None::<&()>, None)
                .await?;
            out.extend(list.actions);
        }
        Ok(out)
    }

    /// The IP after a move to `wanted` succeeded: the store's copy with its new server (no read),
    /// or, if the store does not hold it, read from the API.
    async fn h_moved(&self, id: &IpId, wanted: Option<ServerId>) -> Result<IpAddress, CloudError> {
        let Some(held) = self.inner.store.peek(id) else {
            return self.ip(id).await;
        };
        let mut ip = IpAddress::clone(&held);
        ip.targeted_to = wanted.map(|server| Box::new(crate::hetzner::assigned_to(server)));
        self.inner.store.upsert(&ip);
        Ok(ip)
    }

    /// Sends one assign (`Some(server)`) or unassign action in `term` and follows it.
    async fn h_act(
        &self,
        op: Op,
        object: &Object,
        id: &IpId,
        wanted: Option<ServerId>,
        term: Option<&CallTerm>,
    ) -> Result<(), CloudError> {
        let (verb, body) = match wanted {
            Some(server) => (
                "assign",
                Some(encode(op, object, &AssignRequest { server: server.0 })?),
            ),
            None => ("unassign", None),
        };
        let url = self.url(&["floating_ips", id.as_str(), "actions", verb]);
        let bytes = self
            .send_once(op, object, &Method::POST, &url, body.as_deref(), term)
            .await?;
        // Accepted: the change is under way; a graceful release waits for its end.
        let _running = term.and(self.in_flight.as_ref()).map(InFlight::enter);
        let ActionAnswer { action } = decode(op, object, &bytes)?;
        debug!(op = op.as_str(), object = %object, action = action.id, "action accepted");
        self.h_follow(op, object, action).await
    }

    /// Retarget (`Some`) or unassign (`None`) one Floating IP: one action, followed to its end;
    /// the IP as the API shows it afterwards.
    pub(super) async fn h_move_ip(
        &self,
        op: Op,
        id: &IpId,
        wanted: Option<ServerId>,
    ) -> Result<IpAddress, CloudError> {
        let object = Object(format!("ip {id}"));
        let term = self.term_for(op);
        let mut attempt = 0;
        let mut last: Option<CloudError> = None;
        loop {
            let err = match self.h_act(op, &object, id, wanted, term.as_ref()).await {
                Ok(()) => return self.h_moved(id, wanted).await,
                Err(e) if e.is_fenced() => {
                    let e = fenced_after(e, last);
                    if e.outcome_unknown() {
                        self.read_back(id).await;
                    }
                    return Err(e);
                }
                Err(CloudError::Coded { code, .. })
                    if wanted.is_some()
                        && &*code == codes::FLOATING_IP_ASSIGNED
                        && attempt < self.inner.max_retries =>
                {
                    // This API demands an unassign before an assign: only then two actions.
                    debug!(object = %object, "the API demands an unassign first");
                    self.h_act(Op::UnassignIp, &object, id, None, term.as_ref())
                        .await?;
                    attempt += 1;
                    continue;
                }
                Err(e) => e,
            };
            if matches!(err, CloudError::ActionFailed { .. }) {
                warn!(op = op.as_str(), object = %object, error = %err, "the action failed");
                self.read_back(id).await;
                return Err(err);
            }
            if err.outcome_unknown() {
                match self.ip(id).await {
                    Ok(ip) if ip.target() == wanted => {
                        debug!(op = op.as_str(), object = %object, "the move of unknown outcome took effect: not sent again");
                        return Ok(ip);
                    }
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => return Err(e),
                    Err(e) => {
                        warn!(op = op.as_str(), object = %object, error = %e, "cannot read back a move of unknown outcome; not sending it again");
                        self.inner.store.require_since(tokio::time::Instant::now());
                        return Err(err);
                    }
                }
            }
            if !(err.is_retryable() && attempt < self.inner.max_retries) {
                return Err(err);
            }
            // Locked: another action runs on the FIP (ours of unknown outcome, or a predecessor's):
            // it ends within about an action's time.
            let delay = if err.category() == "locked" {
                self.inner.action_poll * 2
            } else {
                self.retry_delay(&err, attempt)
            };
            if !self
                .wait_to_retry(op, &object, attempt, delay, &err, term.as_ref())
                .await
            {
                return Err(fenced_after(fenced(op, &object), Some(err)));
            }
            attempt += 1;
            last = Some(err);
        }
    }

    /// The body of a create: labels are the tags; homed in `request.region` (a location name),
    /// or assigned at once to the server it targets.
    pub(super) fn h_create_body(object: &Object, request: &CreateIpRequest) -> Result<Vec<u8>, CloudError> {
        let server = request.targeted_to.and_then(|t| t.0).map(|s| s.0);
        let body = CreateFloatingIpRequest {
            ip_type: "ipv4".into(),
            home_location: server.is_none().then(|| request.region.clone()),
            server,
            description: Some("baton".into()),
            name: None,
            labels: Some(request.tags.clone()),
        };
        encode(Op::CreateIp, object, &body)
    }

    /// One create attempt; an assign it started is followed (a failed one leaves the FIP
    /// unassigned: the controller's next pass assigns it).
    pub(super) async fn h_post_ip(
        &self,
        object: &Object,
        body: &[u8],
        term: Option<&CallTerm>,
    ) -> Result<IpAddress, CloudError> {
        let url = self.url(&["floating_ips"]);
        let bytes = self
            .send_once(Op::CreateIp, object, &Method::POST, &url, Some(body), term)
            .await?;
        let answer: CreateFloatingIpAnswer = decode(Op::CreateIp, object, &bytes)?;
        let mut ip = Self::h_ip(Op::CreateIp, object, &answer.floating_ip)?;
        if let Some(action) = answer.action {
            let _running = term.and(self.in_flight.as_ref()).map(InFlight::enter);
            match self.h_follow(Op::RetargetIp, object, action).await {
                Ok(()) => {
                    if let Ok(read) = self.h_get_ip(&ip.id).await {
                        ip = read;
                    }
                }
                Err(e) => {
                    warn!(object = %object, error = %e, "the new Floating IP's assign did not succeed");
                    ip.targeted_to = None;
                }
            }
        }
        Ok(ip)
    }
}
