//! The summary printed when `baton bootstrap` ends: the result and exit code, and (once the
//! run got going) every endpoint, its FIP and the DNS records served.

use serde_json::json;

use super::dns::Publisher;
use super::error::BootstrapError;
use super::progress::{self, Reporter};
use super::runner::Runner;
use super::state::now_ms;
use crate::exit::bootstrap as exit;

pub(super) fn summary(
    runner: Option<&Runner>,
    reporter: &Reporter,
    result: &Result<(), BootstrapError>,
    check_only: bool,
) -> serde_json::Value {
    let (status, code, error, category) = match result {
        Ok(()) if check_only => ("valid", exit::COMPLETE, None, None),
        Ok(()) => ("complete", exit::COMPLETE, None, None),
        Err(e @ BootstrapError::Interrupted(_)) => (
            "interrupted",
            e.exit_code(),
            Some(e.to_string()),
            Some(e.category()),
        ),
        Err(e) => ("failed", e.exit_code(), Some(e.to_string()), Some(e.category())),
    };
    let mut v = json!({
        "result": status,
        "exitCode": code,
        "error": error,
        "category": category,
        "startedAt": progress::rfc3339(reporter.started_ms()),
        "finishedAt": progress::rfc3339(now_ms()),
        "durationSeconds": (reporter.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    });
    if let Some(r) = runner {
        let endpoints: Vec<serde_json::Value> = r
            .cfg
            .endpoints
            .iter()
            .map(|ep| {
                let fip = r.state.fips.get(&ep.name);
                json!({
                    "name": ep.name,
                    "dnsName": ep.dns_name.as_str(),
                    "service": ep.service.to_string(),
                    "bootstrapAddress": r.cfg.bootstrap_address(ep.publish),
                    "fip": fip.map(|f| f.address),
                    "fipId": fip.map(|f| f.id.clone()),
                    "reservedByBaton": fip.map(|f| f.reserved_by_baton),
                })
            })
            .collect();
        let records: serde_json::Map<String, serde_json::Value> = r
            .store
            .snapshot()
            .names()
            .map(|(n, recs)| (n.as_str().to_owned(), json!(recs.served())))
            .collect();
        let extra = json!({
            "cluster": r.cfg.cluster.name,
            "baseDomain": r.cfg.cluster.base_domain,
            "infraId": r.cfg.cluster.infra_id,
            "step": r.state.step.as_str(),
            "resumed": r.resumed,
            "stateFile": r.state_file.path(),
            "endpoints": endpoints,
            "dns": {
                "mode": r.publisher.as_ref().map_or("not started", Publisher::mode),
                "zone": r.cfg.dns.zone.as_str(),
                "ttl": r.cfg.dns.ttl,
                "listen": r.publisher.as_ref().map(Publisher::listen_addrs).unwrap_or_default(),
                "records": records,
            },
        });
        if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            obj.extend(extra);
        }
    }
    v
}
