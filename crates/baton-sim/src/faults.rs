//! Injected faults: latency (a distribution, per route where set), errors (some with non-JSON
//! bodies, some after the write happened), a per-client-address rate limit answering 429 with
//! `Retry-After`, hung requests, and a lag of the IP list behind the writes.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use axum::response::{IntoResponse as _, Response};
use http::{StatusCode, header};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::latency::Latency;

/// The fault settings; changed at run time through `PUT`/`PATCH /_sim/faults`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// How long an API request takes: a fixed number of milliseconds or a distribution
    /// ([`Latency`]); a route in `routes` may have its own.
    pub latency_ms: Latency,
    /// Fraction (0..=1) of a request's latency that passes *before* the request takes effect
    /// (the server's processing time); the rest passes before the answer. At 0 a request takes
    /// effect as it arrives. Either way it takes effect once received, whether the client still
    /// waits for the answer or not, as a real server's does.
    pub processing_ratio: f64,
    /// The project's IP list (`GET /v1/projects/{id}/ips`) does not show the IP writes of the
    /// last this many milliseconds (created, changed or deleted ones are shown as they were),
    /// as an eventually consistent API's list does. Reads of one IP are current.
    pub list_lag_ms: u64,
    /// Faults of single routes, by the stats' route key (`"POST /v1/projects/{id}/ips"`):
    /// their fields replace the general ones for that route.
    pub routes: BTreeMap<String, RouteFaults>,
    /// Fraction (0..=1) of API requests answered with an injected error status.
    pub error_rate: f64,
    /// Statuses injected errors pick from.
    pub error_statuses: Vec<u16>,
    /// Routes injected errors are limited to, as `METHOD /v1/path/{id}` templates (the request
    /// log's `method` and `route`, e.g. `GET /v1/servers/{id}`); empty: every API request.
    /// A 404 storm on server look-ups is `error_rate: 1, error_statuses: [404],
    /// error_routes: ["GET /v1/servers/{id}"]`.
    pub error_routes: Vec<String>,
    /// Fraction of injected errors whose body is HTML instead of JSON.
    pub non_json_ratio: f64,
    /// Fraction of injected errors on writes that happen *after* the write took effect (the
    /// response is lost: the client cannot know the outcome).
    pub lost_response_ratio: f64,
    /// Requests per second allowed per client address (token bucket, burst = rate);
    /// beyond it: 429. `None` disables the limit.
    pub rate_limit: Option<f64>,
    /// `Retry-After` seconds sent with a 429 (`None`: no header).
    pub retry_after_secs: Option<u64>,
    /// Fraction of API requests that hang (never answered until the client gives up).
    pub hang_rate: f64,
    /// Refuse `DELETE` of a FIP that is still targeted to a server (400 "Attached IP address
    /// cannot be deleted"), as the real API does; on by default. Turn it off only to mimic a
    /// lenient API.
    pub reject_delete_attached: bool,
    /// Seed of the fault dice (for reproducible runs).
    pub seed: Option<u64>,
    /// Propagation delay of a FIP retarget, in milliseconds: for this long after a FIP is
    /// retargeted (or unassigned), new TCP connections to it still follow the old route
    /// (forwarded to the old server; refused if it had none). The API answers at once.
    pub retarget_delay_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            latency_ms: Latency::ZERO,
            processing_ratio: 0.0,
            list_lag_ms: 0,
            routes: BTreeMap::new(),
            error_rate: 0.0,
            error_statuses: vec![502, 503, 504],
            error_routes: Vec::new(),
            non_json_ratio: 0.5,
            lost_response_ratio: 0.5,
            rate_limit: Some(4.0),
            retry_after_secs: Some(1),
            hang_rate: 0.0,
            reject_delete_attached: true,
            seed: None,
            retarget_delay_ms: 0,
        }
    }
}

impl Faults {
    /// No faults at all, not even the rate limit. (Refusing to delete an attached FIP is the
    /// real API's behaviour, not a fault: it stays on.)
    pub fn none() -> Self {
        Self {
            rate_limit: None,
            ..Self::default()
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("error_rate", self.error_rate),
            ("non_json_ratio", self.non_json_ratio),
            ("lost_response_ratio", self.lost_response_ratio),
            ("hang_rate", self.hang_rate),
            ("processing_ratio", self.processing_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be within 0..=1, got {v}"));
            }
        }
        self.latency_ms
            .validate()
            .map_err(|e| format!("latency_ms: {e}"))?;
        for (route, faults) in &self.routes {
            faults.validate().map_err(|e| format!("routes[{route:?}]: {e}"))?;
        }
        if let Some(r) = self.rate_limit
            && !(r.is_finite() && r > 0.0)
        {
            return Err(format!("rate_limit must be > 0, got {r}"));
        }
        let any_errors = self.error_rate > 0.0
            || self
                .routes
                .values()
                .any(|r| r.error_rate.is_some_and(|e| e > 0.0));
        if any_errors && self.error_statuses.is_empty() {
            return Err("error_statuses is empty".into());
        }
        if let Some(bad) = self.error_statuses.iter().find(|s| !(400..=599).contains(*s)) {
            return Err(format!("error status {bad} is not an error"));
        }
        if let Some(bad) = self
            .error_routes
            .iter()
            .find(|r| !matches!(r.split_once(' '), Some((m, p)) if !m.is_empty() && p.starts_with("/v1")))
        {
            return Err(format!(
                "error route {bad:?} is not `METHOD /v1/...` (e.g. \"GET /v1/servers/{{id}}\")"
            ));
        }
        Ok(())
    }
}

/// Whether an injected error may hit a request of `method` on `route` (its template, as
/// [`Faults::error_routes`] names it): any request when no route is listed.
pub(crate) fn error_route_matches(routes: &[String], method: &str, route: &str) -> bool {
    routes.is_empty()
        || routes.iter().any(|r| {
            r.split_once(' ')
                .is_some_and(|(m, p)| m.eq_ignore_ascii_case(method) && p == route)
        })
}

/// The message the real API gives with a 404 on `route` (the same as the simulator's own for a
/// missing object): an injected 404 must not be told apart from a real one by its body.
pub(crate) fn not_found_message(route: &str) -> &'static str {
    if route.starts_with("/v1/servers/") {
        "Server not found"
    } else if route.starts_with("/v1/ips/") {
        "IP address not found"
    } else if route.starts_with("/v1/projects/") {
        "Project not found"
    } else {
        "Not found"
    }
}

/// A proxy's HTML error page: an injected 5xx with a non-JSON body (`non_json_ratio`), the same
/// in both dialects.
pub(crate) fn proxy_html(status: u16) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = format!("<html><head><title>{code}</title></head><body><h1>{code}</h1></body></html>");
    (code, [(header::CONTENT_TYPE, "text/html")], body).into_response()
}

/// The faults of one route (`Faults::routes`); a field left out keeps the general setting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteFaults {
    /// This route's latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<Latency>,
    /// This route's injected error rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    /// This route's fraction of injected 5xx that come after the write took effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_response_ratio: Option<f64>,
}

impl RouteFaults {
    fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("error_rate", self.error_rate),
            ("lost_response_ratio", self.lost_response_ratio),
        ] {
            if let Some(v) = v
                && !(0.0..=1.0).contains(&v)
            {
                return Err(format!("{name} must be within 0..=1, got {v}"));
            }
        }
        match &self.latency_ms {
            Some(l) => l.validate().map_err(|e| format!("latency_ms: {e}")),
            None => Ok(()),
        }
    }
}

/// The faults that apply to one request: the general ones, with its route's on top.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applied<'a> {
    pub(crate) latency: &'a Latency,
    pub(crate) error_rate: f64,
    pub(crate) lost_response_ratio: f64,
}

impl Faults {
    /// The faults of a request on `route` (the stats' route key).
    pub(crate) fn for_route(&self, route: &str) -> Applied<'_> {
        let own = self.routes.get(route);
        Applied {
            latency: own
                .and_then(|r| r.latency_ms.as_ref())
                .unwrap_or(&self.latency_ms),
            error_rate: own.and_then(|r| r.error_rate).unwrap_or(self.error_rate),
            lost_response_ratio: own
                .and_then(|r| r.lost_response_ratio)
                .unwrap_or(self.lost_response_ratio),
        }
    }
}

/// Per-address token buckets.
#[derive(Debug, Default)]
pub(crate) struct RateLimiter {
    buckets: HashMap<IpAddr, (f64, Instant)>,
}

impl RateLimiter {
    /// Takes a token for `client`; `Err(wait)` if none is left.
    pub(crate) fn check(&mut self, client: IpAddr, rate: f64) -> Result<(), Duration> {
        let burst = rate.max(1.0);
        let now = Instant::now();
        let (tokens, last) = self.buckets.entry(client).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / rate))
        }
    }

    pub(crate) fn reset(&mut self) {
        self.buckets.clear();
    }
}
