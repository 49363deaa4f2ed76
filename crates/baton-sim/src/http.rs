//! The simulator's HTTP surface: the API under `/v1` (behind the fault/stats middleware) and the
//! admin endpoint under `/_sim`. The Cherry dialect's routes are here; the Hetzner dialect's are
//! in [`crate::hetzner::http`], behind the same middleware.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use rand::Rng as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::debug;

use super::cloud::CloudWorld;
use super::faults::{Faults, error_route_matches, not_found_message, proxy_html};
use super::guard::lock;
use super::hetzner;
use super::shared::Shared;
use super::stats::{LogEntry, route_template};
use super::world::ApiErr;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let api = Router::new()
        .route("/v1", any(api))
        .route("/v1/{*rest}", any(api))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), faults_layer));
    let admin = Router::new()
        .route("/_sim/health", get(|| async { "ok" }))
        .route("/_sim/stats", get(admin_stats))
        .route("/_sim/stats/reset", post(admin_reset))
        .route("/_sim/log", get(admin_log))
        .route(
            "/_sim/faults",
            get(admin_faults).put(admin_set_faults).patch(admin_patch_faults),
        )
        .route("/_sim/state", get(admin_state));
    let admin = if shared.hetzner.is_some() {
        admin.route(
            "/_sim/hetzner",
            get(hetzner::http::admin_settings).patch(hetzner::http::admin_patch_settings),
        )
    } else {
        admin
    };
    api.merge(admin).fallback(fallback).with_state(shared)
}

/// A path outside `/v1` and `/_sim`: 404 in the dialect's shape.
async fn fallback(State(shared): State<Arc<Shared>>) -> Response {
    refusal(&shared, 404, "Not found")
}

/// An answer the simulator makes itself (not its API's handlers): a rate-limited, hung or
/// failed request, an unknown path; in the dialect's error shape.
fn refusal(shared: &Shared, status: u16, message: &str) -> Response {
    if shared.hetzner.is_some() {
        hetzner::http::error_for_status(status, message)
    } else {
        api_error(status, message)
    }
}

fn api_error(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        axum::Json(serde_json::json!({ "code": status, "message": message })),
    )
        .into_response()
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}

#[allow(clippy::struct_excessive_bools)] // independent dice, one roll each
struct Dice {
    hang: bool,
    error: bool,
    lost: bool,
    non_json: bool,
    status_pick: usize,
}

/// Rate limit, hang, latency, injected errors; then records the request.
///
/// A request that gets past the rate limit and the hang dice is handed to a task of its own,
/// which applies it (after the processing part of its latency) whether or not the client still
/// waits: a client that gives up does not undo a write, as with a real server. Its answer is
/// sent after the rest of the latency.
async fn faults_layer(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    let arrived = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    // Records the request once, also when the client gives up first (status 499).
    let mut record = Record {
        shared: shared.clone(),
        entry: Some(log_entry(&shared, peer, &req, arrived)),
        arrived,
    };
    let faults = lock(&shared.faults).clone();
    let template = template(&shared, &path);
    let route = format!("{method} {template}");
    let applied = faults.for_route(&route);
    let write = matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );

    let (quota, refused) = rate_limit(&shared, &faults, &req, peer);
    let (mut response, fault) = 'answer: {
        if let Some(resp) = refused {
            break 'answer (resp, Some("rate_limited"));
        }
        let (dice, latency) = {
            let mut rng = lock(&shared.rng);
            let dice = Dice {
                hang: rng.random::<f64>() < faults.hang_rate,
                error: rng.random::<f64>() < applied.error_rate
                    && error_route_matches(&faults.error_routes, method.as_str(), &template),
                lost: rng.random::<f64>() < applied.lost_response_ratio,
                non_json: rng.random::<f64>() < faults.non_json_ratio,
                status_pick: rng.random_range(0..faults.error_statuses.len().max(1)),
            };
            (dice, applied.latency.sample(&mut *rng))
        };
        if dice.hang {
            record.set_fault("hang");
            tokio::select! {
                () = shared.shutdown.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
            break 'answer (refusal(&shared, 503, "Service Unavailable"), Some("hang"));
        }
        let processing = latency.mul_f64(faults.processing_ratio);
        let status = faults
            .error_statuses
            .get(dice.status_pick)
            .copied()
            .unwrap_or(503);
        // Refused before acting: an injected error that is not a lost answer.
        if dice.error && !(write && dice.lost && status >= 500) {
            tokio::time::sleep(latency).await;
            break 'answer (inject(&shared, status, dice.non_json, &template), Some("error"));
        }
        // Applied once received, in a task the client cannot cancel.
        let handled = tokio::spawn(async move {
            tokio::time::sleep(processing).await;
            next.run(req).await
        });
        let handled = handled.await;
        tokio::time::sleep(latency.saturating_sub(processing)).await;
        if dice.error {
            // The write happened; its answer is lost. (Only a 5xx: a 4xx such as 429 is a
            // refusal, answered before acting.)
            break 'answer (
                inject(&shared, status, dice.non_json, &template),
                Some("lost_response"),
            );
        }
        match handled {
            Ok(resp) => (resp, None),
            Err(_) => (refusal(&shared, 500, "Internal Server Error"), None),
        }
    };
    if let Some(quota) = quota {
        hetzner::http::rate_headers(response.headers_mut(), quota);
    }

    let status = response.status().as_u16();
    debug!(%method, %path, status, fault, "sim request");
    if let Some(fault) = fault {
        record.set_fault(fault);
    }
    if let Some(entry) = record.entry.as_mut() {
        entry.status = status;
    }
    drop(record);
    response
}

/// The dialect's rate limit, before anything else: Cherry's per-address bucket
/// (`Faults::rate_limit`; 429 with `Retry-After`), or Hetzner's per-token bucket (429
/// `rate_limit_exceeded`), whose quota the `RateLimit-*` headers of every answer report.
fn rate_limit(
    shared: &Shared,
    faults: &Faults,
    req: &Request,
    peer: SocketAddr,
) -> (Option<hetzner::bucket::Quota>, Option<Response>) {
    if let Some(h) = &shared.hetzner {
        let quota = hetzner::http::take_quota(h, req.headers(), peer);
        let refused = quota
            .filter(|q| !q.allowed)
            .map(|_| hetzner::http::error_for_status(429, "rate limit exceeded"));
        return (quota, refused);
    }
    if let Some(rate) = faults.rate_limit
        && let Err(wait) = lock(&shared.limiter).check(peer.ip(), rate)
    {
        let mut resp = api_error(429, "Too Many Requests");
        let secs = faults
            .retry_after_secs
            .unwrap_or_else(|| wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
            .max(1);
        if faults.retry_after_secs.is_some() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return (None, Some(resp));
    }
    (None, None)
}

/// The route template of `path` in the dialect (the stats' and the fault settings' key).
fn template(shared: &Shared, path: &str) -> String {
    if shared.hetzner.is_some() {
        hetzner::http::route_template(path)
    } else {
        route_template(path)
    }
}

/// An injected error's answer in the dialect's shape.
fn inject(shared: &Shared, status: u16, non_json: bool, route: &str) -> Response {
    if shared.hetzner.is_some() {
        hetzner::http::injected(status, non_json, route)
    } else {
        injected(status, non_json, route)
    }
}

/// An injected error's answer: a 4xx comes from the API itself, answered as the API answers (JSON,
/// the message of a real 404 on `route`); only a 5xx may come from a proxy in front of it (HTML,
/// when `non_json`).
fn injected(status: u16, non_json: bool, route: &str) -> Response {
    if status < 500 {
        let message = if status == 404 {
            not_found_message(route)
        } else {
            "Injected failure"
        };
        api_error(status, message)
    } else if non_json {
        proxy_html(status)
    } else {
        api_error(status, "Injected failure")
    }
}

/// The log entry of a request that just arrived (status 499 until it is answered).
fn log_entry(shared: &Shared, peer: SocketAddr, req: &Request, arrived: Instant) -> LogEntry {
    let path = req.uri().path();
    LogEntry {
        seq: 0,
        at_ms: millis(arrived.duration_since(shared.started)),
        unix_ms: unix_ms_now(),
        client: peer.to_string(),
        user_agent: req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned(),
        method: req.method().to_string(),
        route: template(shared, path),
        path: path.to_owned(),
        status: 499,
        fault: None,
        duration_ms: 0,
    }
}

struct Record {
    shared: Arc<Shared>,
    entry: Option<LogEntry>,
    arrived: Instant,
}

impl Record {
    fn set_fault(&mut self, fault: &str) {
        if let Some(entry) = self.entry.as_mut() {
            entry.fault = Some(fault.to_owned());
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if let Some(mut entry) = self.entry.take() {
            entry.duration_ms = millis(self.arrived.elapsed());
            lock(&self.shared.recorder).record(entry);
        }
    }
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiErr> {
    serde_json::from_slice(body).map_err(|e| ApiErr::new(400, format!("Invalid request body: {e}")))
}

fn id_u64(seg: &str, what: &str) -> Result<u64, ApiErr> {
    seg.parse()
        .map_err(|_| ApiErr::new(404, format!("{what} not found")))
}

/// Whether a path names an API resource (so a wrong method is a 405, not a 404).
fn known_path(segs: &[&str]) -> bool {
    match segs {
        ["projects", _, rest @ ..] => matches!(rest, [] | ["servers" | "ips"]),
        ["servers" | "ips" | "regions", _] | ["regions"] => true,
        _ => false,
    }
}

fn answer<T: Serialize>(status: StatusCode, result: Result<T, ApiErr>) -> Response {
    match result {
        Ok(body) => json(status, &body),
        Err(e) => api_error(e.status, &e.message),
    }
}

/// A list: `limit`/`offset`, `X-Total-Count`, a bare array.
fn list<T: Serialize>(items: Vec<T>, query: &[(String, String)]) -> Response {
    let get = |k: &str| {
        query
            .iter()
            .find(|(key, _)| key == k)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let total = items.len();
    let offset = get("offset").unwrap_or(0);
    let limit = get("limit").filter(|l| *l > 0).unwrap_or(usize::MAX);
    let page: Vec<T> = items.into_iter().skip(offset).take(limit).collect();
    let mut resp = json(StatusCode::OK, &page);
    resp.headers_mut()
        .insert("x-total-count", HeaderValue::from(total));
    resp
}

async fn api(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if shared.hetzner.is_some() {
        return hetzner::http::dispatch(&shared, &method, &uri, &headers, &body);
    }
    dispatch(&shared, &method, &uri, &headers, &body).unwrap_or_else(|e| api_error(e.status, &e.message))
}

/// The Cherry dialect's routes.
fn dispatch(
    shared: &Shared,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiErr> {
    let mut guard = lock(&shared.world);
    let CloudWorld::Cherry(world) = &mut *guard else {
        return Err(ApiErr::new(404, "Not found"));
    };
    let authorized = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|token| !token.is_empty() && token == world.api_key);
    if !authorized {
        return Err(ApiErr::new(401, "Unauthorized: a valid API key is required"));
    }
    let query: Vec<(String, String)> = url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).skip(1).collect();
    // (answer, whether it is a write: a successful one is routed and persisted)
    let (resp, write) = match (method, segs.as_slice()) {
        (&Method::GET, ["projects", pid]) => (
            answer(StatusCode::OK, world.get_project(id_u64(pid, "Project")?)),
            false,
        ),
        (&Method::PUT, ["projects", pid]) => {
            let pid = id_u64(pid, "Project")?;
            (
                answer(StatusCode::CREATED, world.update_project(pid, parse(body)?)),
                true,
            )
        }
        (&Method::GET, ["projects", pid, "servers"]) => {
            let search = query.iter().find(|(k, _)| k == "search").map(|(_, v)| v.as_str());
            let resp = match world.list_servers(id_u64(pid, "Project")?, search) {
                Ok(servers) => list(servers, &query),
                Err(e) => api_error(e.status, &e.message),
            };
            (resp, false)
        }
        (&Method::GET, ["projects", pid, "ips"]) => {
            let types: Vec<String> = query
                .iter()
                .filter(|(k, _)| k == "type[]" || k == "type")
                .map(|(_, v)| v.clone())
                .collect();
            let resp = match world.list_ips(id_u64(pid, "Project")?, &types) {
                Ok(ips) => list(ips, &query),
                Err(e) => api_error(e.status, &e.message),
            };
            (resp, false)
        }
        (&Method::POST, ["projects", pid, "ips"]) => {
            let pid = id_u64(pid, "Project")?;
            (
                answer(StatusCode::CREATED, world.create_ip(pid, parse(body)?)),
                true,
            )
        }
        (&Method::GET, ["servers", id]) => (
            answer(StatusCode::OK, world.get_server(id_u64(id, "Server")?)),
            false,
        ),
        (&Method::PUT, ["servers", id]) => {
            let id = id_u64(id, "Server")?;
            (
                answer(StatusCode::CREATED, world.update_server(id, parse(body)?)),
                true,
            )
        }
        (&Method::GET, ["ips", id]) => (answer(StatusCode::OK, world.get_ip(id)), false),
        (&Method::PUT, ["ips", id]) => (answer(StatusCode::OK, world.update_ip(id, parse(body)?)), true),
        (&Method::DELETE, ["ips", id]) => {
            let reject = lock(&shared.faults).reject_delete_attached;
            let resp = match world.delete_ip(id, reject) {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(e) => api_error(e.status, &e.message),
            };
            (resp, true)
        }
        (&Method::GET, ["regions"]) => (list(world.regions(), &query), false),
        (&Method::GET, ["regions", key]) => (answer(StatusCode::OK, world.region(key)), false),
        (_, path) if known_path(path) => (api_error(405, "Method not allowed"), false),
        _ => (api_error(404, "Not found"), false),
    };
    if write && resp.status().is_success() {
        shared.committed(&guard);
    }
    drop(guard);
    Ok(resp)
}

// ---- admin ---------------------------------------------------------------------------------

async fn admin_stats(State(shared): State<Arc<Shared>>) -> Response {
    json(StatusCode::OK, &shared.stats())
}

async fn admin_reset(State(shared): State<Arc<Shared>>) -> Response {
    shared.reset_stats();
    StatusCode::NO_CONTENT.into_response()
}

#[derive(serde::Deserialize)]
struct LogQuery {
    #[serde(default)]
    since: u64,
}

async fn admin_log(State(shared): State<Arc<Shared>>, Query(q): Query<LogQuery>) -> Response {
    json(StatusCode::OK, &lock(&shared.recorder).log_since(q.since))
}

async fn admin_faults(State(shared): State<Arc<Shared>>) -> Response {
    json(StatusCode::OK, &*lock(&shared.faults))
}

pub(crate) fn apply_faults(shared: &Shared, faults: Faults) -> Result<(), String> {
    faults.validate()?;
    if let Some(seed) = faults.seed {
        *lock(&shared.rng) = rand::SeedableRng::seed_from_u64(seed);
    }
    lock(&shared.world).set_list_lag(Duration::from_millis(faults.list_lag_ms));
    *lock(&shared.faults) = faults;
    Ok(())
}

async fn admin_set_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let faults: Faults = match parse(&body) {
        Ok(f) => f,
        Err(e) => return api_error(e.status, &e.message),
    };
    match apply_faults(&shared, faults) {
        Ok(()) => admin_faults(State(shared)).await,
        Err(e) => api_error(400, &e),
    }
}

/// Merges the given fields into the current settings.
async fn admin_patch_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let patch: serde_json::Map<String, serde_json::Value> = match parse(&body) {
        Ok(p) => p,
        Err(e) => return api_error(e.status, &e.message),
    };
    let current = lock(&shared.faults).clone();
    let Ok(serde_json::Value::Object(mut merged)) = serde_json::to_value(current) else {
        return api_error(500, "cannot read the current faults");
    };
    merged.extend(patch);
    let faults: Faults = match serde_json::from_value(serde_json::Value::Object(merged)) {
        Ok(f) => f,
        Err(e) => return api_error(400, &format!("Invalid faults: {e}")),
    };
    match apply_faults(&shared, faults) {
        Ok(()) => admin_faults(State(shared)).await,
        Err(e) => api_error(400, &e),
    }
}

async fn admin_state(State(shared): State<Arc<Shared>>) -> Response {
    let mut state = match lock(&shared.world).to_value() {
        Ok(v) => v,
        Err(e) => return api_error(500, &e.to_string()),
    };
    if let Some(obj) = state.as_object_mut() {
        obj.insert("api_key".into(), "<redacted>".into());
    }
    json(StatusCode::OK, &state)
}
