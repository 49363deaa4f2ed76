//! What the simulator observed: counters per route and status, and a bounded request log.
//! Benchmarks read these to count cloud calls.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Counters since start (or the last reset).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// API requests received (admin requests excluded).
    pub requests: u64,
    /// POST/PUT/DELETE requests received, whatever their outcome.
    pub writes: u64,
    /// POST/PUT/DELETE requests answered 2xx.
    pub writes_ok: u64,
    /// Requests answered 429 by the rate limit.
    pub rate_limited: u64,
    /// Requests answered with an injected error.
    pub injected_errors: u64,
    /// Requests hung on purpose.
    pub hung: u64,
    /// Per route (`GET /v1/ips/{id}`): count and statuses.
    pub routes: BTreeMap<String, RouteStats>,
    /// Per status (`"200"`).
    pub status: BTreeMap<String, u64>,
    /// Floating IPs created, whatever became of the answer (lost, or its client gone).
    #[serde(default)]
    pub fips_created: u64,
    /// Floating IPs deleted, whatever became of the answer.
    #[serde(default)]
    pub fips_deleted: u64,
    /// Over every set of tags FIPs carried: the most FIPs that carried it at the same time,
    /// minus one, summed (two FIPs a tag look-up finds for one Service count 1).
    #[serde(default)]
    pub duplicate_fips: u64,
}

/// Counters of one route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStats {
    /// Requests.
    pub count: u64,
    /// Per status.
    pub status: BTreeMap<String, u64>,
}

impl Stats {
    /// Requests on `route` (e.g. `"GET /v1/projects/{id}/ips"`).
    pub fn route(&self, route: &str) -> u64 {
        self.routes.get(route).map_or(0, |r| r.count)
    }

    /// Requests answered `status`.
    pub fn with_status(&self, status: u16) -> u64 {
        self.status.get(&status.to_string()).copied().unwrap_or(0)
    }

    /// Requests on `route` answered `status`.
    pub fn route_status(&self, route: &str, status: u16) -> u64 {
        self.routes
            .get(route)
            .and_then(|r| r.status.get(&status.to_string()).copied())
            .unwrap_or(0)
    }
}

/// One logged API request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Sequence number (for `?since=`).
    pub seq: u64,
    /// Milliseconds since the simulator started, when the request arrived.
    pub at_ms: u64,
    /// Wall-clock arrival time: milliseconds since the Unix epoch (0 in logs written before
    /// the field existed).
    #[serde(default)]
    pub unix_ms: u64,
    /// Client address.
    pub client: String,
    /// The request's `User-Agent` header; empty when it had none (or it was not text).
    #[serde(default)]
    pub user_agent: String,
    /// Method.
    pub method: String,
    /// Path as sent.
    pub path: String,
    /// Route template.
    pub route: String,
    /// Status answered; 499 when the client gave up before the answer.
    pub status: u16,
    /// `rate_limited`, `error`, `lost_response`, `hang` when a fault decided the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Time to answer, in milliseconds.
    pub duration_ms: u64,
}

/// Counters + log.
#[derive(Debug)]
pub(crate) struct Recorder {
    pub(crate) stats: Stats,
    log: VecDeque<LogEntry>,
    capacity: usize,
    next_seq: u64,
}

impl Recorder {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            stats: Stats::default(),
            log: VecDeque::new(),
            capacity,
            next_seq: 0,
        }
    }

    pub(crate) fn record(&mut self, mut entry: LogEntry) {
        let s = &mut self.stats;
        s.requests += 1;
        let write = matches!(entry.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE");
        if write {
            s.writes += 1;
            if (200..300).contains(&entry.status) {
                s.writes_ok += 1;
            }
        }
        match entry.fault.as_deref() {
            Some("rate_limited") => s.rate_limited += 1,
            Some("error" | "lost_response") => s.injected_errors += 1,
            Some("hang") => s.hung += 1,
            _ => {}
        }
        let status = entry.status.to_string();
        *s.status.entry(status.clone()).or_default() += 1;
        let route = s
            .routes
            .entry(format!("{} {}", entry.method, entry.route))
            .or_default();
        route.count += 1;
        *route.status.entry(status).or_default() += 1;
        entry.seq = self.next_seq;
        self.next_seq += 1;
        if self.log.len() == self.capacity {
            self.log.pop_front();
        }
        self.log.push_back(entry);
    }

    pub(crate) fn log_since(&self, since: u64) -> Vec<LogEntry> {
        self.log.iter().filter(|e| e.seq >= since).cloned().collect()
    }

    pub(crate) fn reset(&mut self) {
        self.stats = Stats::default();
        self.log.clear();
    }
}

/// `/v1/projects/123/ips` → `/v1/projects/{id}/ips`: the third segment is always an id.
pub(crate) fn route_template(path: &str) -> String {
    let mut out = String::new();
    for (i, seg) in path.trim_start_matches('/').split('/').enumerate() {
        out.push('/');
        out.push_str(if i == 2 && !seg.is_empty() { "{id}" } else { seg });
    }
    out
}
