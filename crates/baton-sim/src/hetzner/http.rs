//! The Hetzner dialect on the wire: the `/v1` routes of `api.hetzner.cloud` (behind the same
//! faults layer as Cherry's), its error bodies, pages, rate-limit headers, and the timers that
//! end the actions.
//!
//! ```text
//!  dispatch ─► bearer token? (401 unauthorized) ─► route ─► HetznerWorld op ─► JSON (model types)
//!                                                    │ assign / unassign: Action { running }
//!                                                    └► finish_later(action_ms) ─► complete()
//!                                                          ─► committed(): routes + state file
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{Instrument as _, debug, info_span};

use baton_cloud::hetzner::model::{
    Action, ActionAnswer, ActionList, AssignRequest, CreateFloatingIpAnswer, CreateFloatingIpRequest,
    ErrorBody, ErrorDetail, FloatingIpAnswer, FloatingIpList, LocationList, Meta, Pagination, ServerAnswer,
    ServerList, UpdateFloatingIpRequest, codes, headers as rate_header,
};

use super::bucket::Quota;
use super::labels::Selector;
use super::world::{FipFilter, HetznerErr, HetznerWorld, ServerFilter};
use super::{HetznerSettings, Runtime};
use crate::cloud::{CloudWorld, unix_now};
use crate::faults::proxy_html;
use crate::guard::lock;
use crate::shared::Shared;

/// Where Hetzner announced the removal of listing every action.
const ACTIONS_LIST_REMOVED: &str = "https://docs.hetzner.cloud/changelog#2025-01-30-listing-arbitrary-actions-in-the-actions-list-endpoint-is-removed";

/// `/v1/floating_ips/7/actions/assign` → `/v1/floating_ips/{id}/actions/assign`,
/// `/v1/floating_ips/7/actions/9` → `/v1/floating_ips/{id}/actions/{action_id}`.
pub(crate) fn route_template(path: &str) -> String {
    let mut out = String::new();
    for (i, seg) in path.trim_start_matches('/').split('/').enumerate() {
        out.push('/');
        out.push_str(match i {
            2 if !seg.is_empty() => "{id}",
            4 if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) => "{action_id}",
            _ => seg,
        });
    }
    out
}

/// The code Hetzner answers with `status` (its error table), for answers the simulator makes
/// without an API error of its own (injected, rate limited, hung).
fn code_for(status: u16) -> &'static str {
    match status {
        400 => "json_error",
        401 => codes::UNAUTHORIZED,
        403 => codes::FORBIDDEN,
        404 => codes::NOT_FOUND,
        405 => "method_not_allowed",
        409 => codes::CONFLICT,
        410 => "deprecated_api_endpoint",
        412 => "resource_unavailable",
        422 => codes::INVALID_INPUT,
        423 => codes::LOCKED,
        429 => codes::RATE_LIMIT_EXCEEDED,
        502 => "bad_gateway",
        503 => "unavailable",
        504 => "timeout",
        500..=599 => "server_error",
        _ => "unknown_error",
    }
}

/// `{"error": {"code", "message", "details"}}` with its status.
fn error(e: HetznerErr) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorBody {
        error: ErrorDetail {
            code: e.code.into(),
            message: e.message,
            details: e.details,
        },
    };
    (status, axum::Json(body)).into_response()
}

/// An error answer with the code Hetzner gives `status`; `invalid_input` and
/// `uniqueness_error` carry an empty `fields` list (hcloud-go parses their details).
pub(crate) fn error_for_status(status: u16, message: &str) -> Response {
    let code = code_for(status);
    let details =
        matches!(code, "invalid_input" | "uniqueness_error").then(|| serde_json::json!({ "fields": [] }));
    error(HetznerErr {
        details,
        ..HetznerErr::new(status, code, message)
    })
}

/// An injected error: a 4xx as the API would answer it (a 404 with the message of a real one
/// on `route`), a 5xx as Hetzner JSON or, when `non_json`, a proxy's HTML page.
pub(crate) fn injected(status: u16, non_json: bool, route: &str) -> Response {
    if status >= 500 && non_json {
        return proxy_html(status);
    }
    if status == 404 {
        let what = ["floating_ips", "servers", "actions", "locations"]
            .into_iter()
            .find(|c| route.starts_with(&format!("/v1/{c}/")))
            .map_or("resource", |c| c.trim_end_matches('s'));
        return error_for_status(404, &format!("{what} not found"));
    }
    error_for_status(status, "Injected failure")
}

/// Takes a request from its bucket: the API token's (the whole `Authorization` value), or its
/// client address's when it has none. `None` when the limit is off.
pub(crate) fn take_quota(rt: &Runtime, headers: &HeaderMap, peer: SocketAddr) -> Option<Quota> {
    let limit = lock(&rt.settings).limit();
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| format!("address {}", peer.ip()), str::to_owned);
    lock(&rt.buckets).take(&key, limit, tokio::time::Instant::now())
}

/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (Unix seconds when the bucket
/// is full again).
pub(crate) fn rate_headers(headers: &mut HeaderMap, quota: Quota) {
    let full_in = quota.full_in.as_secs() + u64::from(quota.full_in.subsec_nanos() > 0);
    headers.insert(rate_header::LIMIT, HeaderValue::from(quota.limit));
    headers.insert(rate_header::REMAINING, HeaderValue::from(quota.remaining));
    headers.insert(rate_header::RESET, HeaderValue::from(unix_now() + full_in));
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The field a serde error names (`missing field `type``), else `body`.
fn field_of(e: &serde_json::Error) -> String {
    let text = e.to_string();
    text.split('`')
        .nth(1)
        .map_or_else(|| "body".into(), str::to_owned)
}

/// A JSON body: 400 `json_error` when it is no JSON, 422 `invalid_input` naming the field when
/// it does not fit. An empty body reads as `{}`.
fn parse_value(body: &Bytes) -> Result<serde_json::Value, HetznerErr> {
    if body.is_empty() {
        return Ok(serde_json::json!({}));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| HetznerErr::new(400, "json_error", format!("invalid JSON: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(HetznerErr {
            details: Some(serde_json::json!({ "fields": [] })),
            ..HetznerErr::new(422, codes::INVALID_INPUT, "invalid input: root must be an object")
        })
    }
}

fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, HetznerErr> {
    serde_json::from_value(value).map_err(|e| HetznerErr::invalid(&field_of(&e), vec![e.to_string()]))
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, HetznerErr> {
    from_value(parse_value(body)?)
}

/// What one request is answered with and sets going.
struct Outcome {
    resp: Response,
    /// A successful write: route the FIPs as they are now and save the state.
    write: bool,
    /// Actions that run: (id, how long).
    running: Vec<(u64, Duration)>,
}

impl Outcome {
    fn read<T: Serialize>(body: &T) -> Self {
        Self {
            resp: json(StatusCode::OK, body),
            write: false,
            running: Vec::new(),
        }
    }
}

/// One request, parsed, with the world and the dice it may need.
struct Cx<'a> {
    world: &'a mut HetznerWorld,
    settings: &'a HetznerSettings,
    query: Vec<(String, String)>,
    body: &'a Bytes,
    /// `http://host/path` of the request (for the `Link` header), when it named its host.
    url: Option<String>,
    now: u64,
    /// A new action ends in `error`.
    fails: bool,
    /// How long a new action runs.
    action_time: Duration,
}

impl Cx<'_> {
    fn param(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn params(&self, key: &str) -> impl Iterator<Item = &str> {
        self.query
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether a new assign action to `server` ends in error: drawn, or a server the settings
    /// fail.
    fn fails_for(&self, server: u64) -> bool {
        self.fails || self.settings.fails_on(server, self.world.server_name(server))
    }

    fn selector(&self) -> Result<Selector, HetznerErr> {
        Selector::parse(self.param("label_selector").unwrap_or(""))
            .map_err(|e| HetznerErr::invalid("label_selector", vec![e]))
    }

    /// A running action the answer shows: ended at once when the action time is 0, else timed.
    fn settle(&mut self, action: Action) -> (Action, Vec<(u64, Duration)>) {
        if self.action_time.is_zero() {
            self.world.complete(action.id, self.now);
            let ended = self.world.get_action(action.id).unwrap_or(action);
            (ended, Vec::new())
        } else {
            let id = action.id;
            (action, vec![(id, self.action_time)])
        }
    }

    /// One page of `items` (`page` from 1, `per_page` 25 by default and at most 50), its
    /// `meta` and `Link` header.
    fn page<T>(&self, items: Vec<T>) -> Result<(Vec<T>, Meta, Option<String>), HetznerErr> {
        let number =
            |key: &str, default: u64| match self.param(key) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    HetznerErr::invalid(key, vec![format!("{v:?} is not a positive integer")])
                }),
            };
        let page = number("page", 1)?;
        let per_page = number("per_page", 25)?.min(50);
        let total = u64::try_from(items.len()).unwrap_or(u64::MAX);
        let last = total.div_ceil(per_page).max(1);
        let skip = usize::try_from((page - 1).saturating_mul(per_page)).unwrap_or(usize::MAX);
        let take = usize::try_from(per_page).unwrap_or(usize::MAX);
        let items: Vec<T> = items.into_iter().skip(skip).take(take).collect();
        let meta = Meta {
            pagination: Pagination {
                page,
                per_page,
                previous_page: (page > 1).then(|| (page - 1).min(last)),
                next_page: (page < last).then_some(page + 1),
                last_page: Some(last),
                total_entries: Some(total),
            },
        };
        Ok((items, meta, self.link(&meta.pagination)))
    }

    /// `Link: <url?page=2&per_page=50>; rel="next", ...` (prev, next, last).
    fn link(&self, p: &Pagination) -> Option<String> {
        let url = self.url.as_ref()?;
        let rels = [
            ("prev", p.previous_page),
            ("next", p.next_page),
            ("last", p.last_page),
        ];
        let links: Vec<String> = rels
            .into_iter()
            .filter_map(|(rel, page)| {
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                for (k, v) in self.query.iter().filter(|(k, _)| k != "page" && k != "per_page") {
                    query.append_pair(k, v);
                }
                query.append_pair("page", &page?.to_string());
                query.append_pair("per_page", &p.per_page.to_string());
                Some(format!("<{url}?{}>; rel=\"{rel}\"", query.finish()))
            })
            .collect();
        (!links.is_empty()).then(|| links.join(", "))
    }
}

/// A page's answer, with its `Link` header.
fn listed<T: Serialize>(body: &T, link: Option<String>) -> Outcome {
    let mut out = Outcome::read(body);
    if let Some(link) = link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        out.resp.headers_mut().insert(header::LINK, link);
    }
    out
}

/// A path id: a number, else the resource is not there.
fn id_of(seg: &str, what: &str) -> Result<u64, HetznerErr> {
    seg.parse().map_err(|_| HetznerErr::not_found(what, seg))
}

/// Whether a path names an API resource (so a wrong method is a 405, not a 404).
fn known_path(segs: &[&str]) -> bool {
    matches!(
        segs,
        ["floating_ips" | "actions" | "servers" | "locations"]
            | ["floating_ips" | "actions" | "servers" | "locations", _]
            | ["floating_ips", _, "actions"]
            | ["floating_ips", _, "actions", _]
    )
}

/// The Hetzner dialect's routes, after the faults layer.
pub(crate) fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Response {
    let Some(rt) = &shared.hetzner else {
        return error_for_status(404, "not found");
    };
    let settings = lock(&rt.settings).clone();
    // Only a POST may start an action: reads leave the dice alone.
    let (fails, action_time) = if method == Method::POST {
        let mut rng = lock(&shared.rng);
        let fails = rng.random::<f64>() < settings.action_error_rate;
        (fails, settings.action_ms.sample(&mut *rng))
    } else {
        (false, Duration::ZERO)
    };
    let mut guard = lock(&shared.world);
    let CloudWorld::Hetzner(world) = &mut *guard else {
        return error_for_status(404, "not found");
    };
    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| !token.is_empty() && token == world.api_key);
    if !authorized {
        return error(HetznerErr::new(
            401,
            codes::UNAUTHORIZED,
            "unable to authenticate",
        ));
    }
    let url = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|host| format!("http://{host}{}", uri.path()));
    let mut cx = Cx {
        world,
        settings: &settings,
        query: url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect(),
        body,
        url,
        now: unix_now(),
        fails,
        action_time,
    };
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).skip(1).collect();
    let outcome = match route(&mut cx, method, &segs) {
        Ok(outcome) => outcome,
        Err(e) => return error(e),
    };
    if outcome.write {
        shared.committed(&guard);
    }
    drop(guard);
    for (id, after) in outcome.running {
        finish_later(shared, id, after);
    }
    outcome.resp
}

fn route(cx: &mut Cx<'_>, method: &Method, segs: &[&str]) -> Result<Outcome, HetznerErr> {
    match (method, segs) {
        (&Method::GET, ["floating_ips"]) => list_fips(cx),
        (&Method::POST, ["floating_ips"]) => create_fip(cx),
        (&Method::GET, ["floating_ips", id]) => {
            let floating_ip = cx.world.get_fip(id_of(id, "floating_ip")?)?;
            Ok(Outcome::read(&FloatingIpAnswer { floating_ip }))
        }
        (&Method::PUT, ["floating_ips", id]) => {
            let req: UpdateFloatingIpRequest = parse(cx.body)?;
            let floating_ip = cx.world.update_fip(id_of(id, "floating_ip")?, req)?;
            Ok(Outcome {
                write: true,
                ..Outcome::read(&FloatingIpAnswer { floating_ip })
            })
        }
        (&Method::DELETE, ["floating_ips", id]) => {
            cx.world.delete_fip(id_of(id, "floating_ip")?)?;
            Ok(Outcome {
                resp: StatusCode::NO_CONTENT.into_response(),
                write: true,
                running: Vec::new(),
            })
        }
        (&Method::GET, ["floating_ips", id, "actions"]) => {
            let mut actions = cx.world.fip_actions(id_of(id, "floating_ip")?)?;
            let statuses: Vec<&str> = cx.params("status").collect();
            actions.retain(|a| statuses.is_empty() || statuses.contains(&a.status.as_str()));
            let (actions, meta, link) = cx.page(actions)?;
            Ok(listed(
                &ActionList {
                    actions,
                    meta: Some(meta),
                },
                link,
            ))
        }
        (&Method::GET, ["floating_ips", id, "actions", action])
            if action.bytes().all(|b| b.is_ascii_digit()) =>
        {
            let action = cx
                .world
                .fip_action(id_of(id, "floating_ip")?, id_of(action, "action")?)?;
            Ok(Outcome::read(&ActionAnswer { action }))
        }
        (&Method::POST, ["floating_ips", id, "actions", command]) => {
            fip_action(cx, id_of(id, "floating_ip")?, command)
        }
        (&Method::GET, ["actions"]) => actions_by_id(cx),
        (&Method::GET, ["actions", id]) => {
            let action = cx.world.get_action(id_of(id, "action")?)?;
            Ok(Outcome::read(&ActionAnswer { action }))
        }
        (&Method::GET, ["servers"]) => list_servers(cx),
        (&Method::GET, ["servers", id]) => {
            let server = cx.world.get_server(id_of(id, "server")?)?;
            Ok(Outcome::read(&ServerAnswer { server }))
        }
        (&Method::GET, ["locations"]) => {
            let locations = cx.world.list_locations(cx.param("name"));
            let (locations, meta, link) = cx.page(locations)?;
            Ok(listed(
                &LocationList {
                    locations,
                    meta: Some(meta),
                },
                link,
            ))
        }
        (&Method::GET, ["locations", id]) => {
            let location = cx.world.get_location(id_of(id, "location")?)?;
            Ok(Outcome::read(&serde_json::json!({ "location": location })))
        }
        (_, path) if known_path(path) => {
            Err(HetznerErr::new(405, "method_not_allowed", "method not allowed"))
        }
        _ => Err(HetznerErr::new(404, codes::NOT_FOUND, "not found")),
    }
}

fn list_fips(cx: &Cx<'_>) -> Result<Outcome, HetznerErr> {
    let filter = FipFilter {
        selector: cx.selector()?,
        name: cx.param("name").map(str::to_owned),
    };
    let (floating_ips, meta, link) = cx.page(cx.world.list_fips(&filter))?;
    Ok(listed(&FloatingIpList { floating_ips, meta }, link))
}

fn list_servers(cx: &Cx<'_>) -> Result<Outcome, HetznerErr> {
    let filter = ServerFilter {
        selector: cx.selector()?,
        name: cx.param("name").map(str::to_owned),
        status: cx.params("status").map(str::to_owned).collect(),
    };
    let (servers, meta, link) = cx.page(cx.world.list_servers(&filter))?;
    Ok(listed(&ServerList { servers, meta }, link))
}

/// `POST /v1/floating_ips`: 201 with the Floating IP, and the assign action when a `server`
/// was given (`null` otherwise).
fn create_fip(cx: &mut Cx<'_>) -> Result<Outcome, HetznerErr> {
    let mut value = parse_value(cx.body)?;
    // A client may name the home location by its id.
    if let Some(id) = value.get("home_location").and_then(serde_json::Value::as_u64) {
        let name = cx
            .world
            .location_name(id)
            .ok_or_else(|| HetznerErr::invalid("home_location", vec![format!("location {id} not found")]))?;
        value["home_location"] = name.into();
    }
    let req: CreateFloatingIpRequest = from_value(value)?;
    let fails = req.server.is_some_and(|s| cx.fails_for(s));
    let (floating_ip, action) = cx.world.create_fip(req, cx.now, fails)?;
    let (action, running) = match action {
        Some(action) => {
            let (action, running) = cx.settle(action);
            (Some(action), running)
        }
        None => (None, Vec::new()),
    };
    // The answer shows the FIP as it is once the answer is made (assigned if the action ended).
    let floating_ip = cx.world.get_fip(floating_ip.id).unwrap_or(floating_ip);
    Ok(Outcome {
        resp: json(
            StatusCode::CREATED,
            &CreateFloatingIpAnswer { floating_ip, action },
        ),
        write: true,
        running,
    })
}

/// `POST /v1/floating_ips/{id}/actions/{assign|unassign|change_protection}`: 201 `{"action"}`.
fn fip_action(cx: &mut Cx<'_>, id: u64, command: &str) -> Result<Outcome, HetznerErr> {
    let action = match command {
        "assign" => {
            let req: AssignRequest = parse(cx.body)?;
            let fails = cx.fails_for(req.server);
            cx.world
                .assign(id, req.server, cx.settings.reassign, cx.now, fails)?
        }
        "unassign" => {
            parse_value(cx.body)?;
            cx.world.unassign(id, cx.now, cx.fails)?
        }
        "change_protection" => {
            let delete = parse_value(cx.body)?
                .get("delete")
                .and_then(serde_json::Value::as_bool);
            cx.world.change_protection(id, delete, cx.now)?
        }
        _ => return Err(HetznerErr::new(404, codes::NOT_FOUND, "not found")),
    };
    let (action, running) = if command == "change_protection" {
        (action, Vec::new())
    } else {
        cx.settle(action)
    };
    Ok(Outcome {
        resp: json(StatusCode::CREATED, &ActionAnswer { action }),
        write: true,
        running,
    })
}

/// `GET /v1/actions?id=1&id=2`; without `id`, 410 `deprecated_api_endpoint`, as the API answers
/// since listing every action was removed (2025-01-30).
fn actions_by_id(cx: &Cx<'_>) -> Result<Outcome, HetznerErr> {
    let ids = cx
        .params("id")
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| HetznerErr::invalid("id", vec![format!("{v:?} is not an action id")]))
        })
        .collect::<Result<Vec<u64>, _>>()?;
    if ids.is_empty() {
        return Err(HetznerErr {
            details: Some(serde_json::json!({ "announcement": ACTIONS_LIST_REMOVED })),
            ..HetznerErr::new(410, "deprecated_api_endpoint", "API functionality was removed")
        });
    }
    let (actions, meta, link) = cx.page(cx.world.actions_by_id(&ids))?;
    Ok(listed(
        &ActionList {
            actions,
            meta: Some(meta),
        },
        link,
    ))
}

/// Ends action `id` after `after`: the FIP moves (or stays, on error) and its route follows.
fn finish_later(shared: &Arc<Shared>, id: u64, after: Duration) {
    let shared = shared.clone();
    let task = async move {
        tokio::select! {
            () = shared.shutdown.cancelled() => {}
            () = tokio::time::sleep(after) => {
                let mut guard = lock(&shared.world);
                if let CloudWorld::Hetzner(world) = &mut *guard
                    && world.complete(id, unix_now())
                {
                    debug!(action = id, "action ended");
                    shared.committed(&guard);
                }
            }
        }
    };
    tokio::spawn(task.instrument(info_span!("hetzner_action", id)));
}

// ---- admin ---------------------------------------------------------------------------------

/// `GET /_sim/hetzner`: the dialect's settings.
pub(crate) async fn admin_settings(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.hetzner {
        Some(rt) => json(StatusCode::OK, &*lock(&rt.settings)),
        None => error_for_status(404, "not found"),
    }
}

/// Replaces the settings after checking them.
pub(crate) fn apply_settings(rt: &Runtime, settings: HetznerSettings) -> Result<(), String> {
    settings.validate()?;
    *lock(&rt.settings) = settings;
    Ok(())
}

/// `PATCH /_sim/hetzner`: changes the given fields, e.g. `{"reassign": "refuse"}`.
pub(crate) async fn admin_patch_settings(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some(rt) = &shared.hetzner else {
        return error_for_status(404, "not found");
    };
    let patch = match parse_value(&body) {
        Ok(serde_json::Value::Object(patch)) => patch,
        Ok(_) => return error_for_status(422, "root must be an object"),
        Err(e) => return error(e),
    };
    let current = lock(&rt.settings).clone();
    let Ok(serde_json::Value::Object(mut merged)) = serde_json::to_value(current) else {
        return error_for_status(500, "cannot read the current settings");
    };
    merged.extend(patch);
    let result = serde_json::from_value::<HetznerSettings>(serde_json::Value::Object(merged))
        .map_err(|e| e.to_string())
        .and_then(|settings| apply_settings(rt, settings));
    match result {
        Ok(()) => json(StatusCode::OK, &*lock(&rt.settings)),
        Err(e) => error_for_status(422, &format!("invalid settings: {e}")),
    }
}
