//! `baton bootstrap`: carries the API endpoint from reserved Floating IPs to the running
//! cluster, on the bootstrap host (OpenShift's "Kubernetes Service Owned API Load Balancers"
//! design).
//!
//! ```text
//!  args.rs + config.rs ─▶ settings.rs ─▶ runner.rs      state.rs (facts, atomic file)
//!                                          │               ▲ │
//!  loop { step = plan::next_step(state, observations) ─────┘ │  (pure, unit-tested)
//!         run step (waiting steps: deadline.rs) ─────────────┘ }
//!  summary.rs: the result; error.rs: why it stopped and the exit code (crate::exit::bootstrap)
//!
//!  1 reserve-fips       steps::resolve_fip       (cloud; found by tag/address, or reserved + tagged)
//!  2 publish-dns        dns::Publisher + dns::spawn_sync ◀── health.rs (/readyz of every address)
//!  3 wait-for-api       steps::api_ready          (the bootstrap API server, via the kubeconfig)
//!  4 handoff            steps::apply_services + apply_manifests (server-side apply)
//!  5 wait-for-services  steps::service_readiness  (ingress = FIP, a ready endpoint, FIP serves)
//!  6 drop-bootstrap     the bootstrap address leaves DNS (pushed, in rfc2136 mode)
//!  7 drain              one TTL, so no client still holds it
//!  8 complete           summary; DNS keeps serving until stopped (or --exit-when-complete)
//!                       progress.rs reports every step (terminal, plain, json, status file, sd_notify)
//! ```
//!
//! Every step is idempotent, and the state file records what is settled, so a run killed at any
//! instant continues where it stopped and never reserves a second FIP or duplicates an object.

pub mod args;
pub mod config;
mod deadline;
pub mod dns;
pub mod error;
pub mod health;
pub mod plan;
pub mod progress;
mod runner;
pub mod settings;
pub mod state;
pub mod steps;
mod summary;

use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use self::args::BootstrapArgs;
pub use self::error::BootstrapError;
pub use self::plan::{Observations, next_step};
use self::progress::Reporter;
use self::runner::Runner;
use self::settings::Settings;
use crate::config::Env;
pub use crate::exit::bootstrap as exit;

/// Runs `baton bootstrap`: the steps, then (unless `--exit-when-complete`) serves DNS until
/// SIGTERM/SIGINT. Prints the summary; returns the error that decides the exit code.
pub async fn run(args: BootstrapArgs, env: &dyn Env) -> Result<(), BootstrapError> {
    let token = CancellationToken::new();
    let signal = crate::signal::shutdown();
    let signals = tokio::spawn({
        let token = token.clone();
        async move {
            signal.await;
            info!("signal received; stopping");
            token.cancel();
        }
    });
    let reporter = Arc::new(Reporter::new(args.output, args.status_file.clone()));
    let mut runner = None;
    let result = async {
        let settings = Settings::resolve(&args, env)?;
        let r = Runner::new(settings, args.check_config, reporter.clone(), token.clone())?;
        if args.check_config {
            r.check().await?;
            return Ok(());
        }
        runner = Some(r);
        match runner.as_mut() {
            Some(r) => r.run_steps().await,
            None => Ok(()),
        }
    }
    .await;
    if let Some(r) = runner.as_ref() {
        // Every DNS change so far is reported before the summary (the reporter task may lag);
        // when the process ends with the summary, none after it.
        r.report_dns();
        if args.exit_when_complete || result.is_err() {
            reporter.mute_dns();
        }
    }
    let summary = summary::summary(runner.as_ref(), &reporter, &result, args.check_config);
    reporter.finish(&summary);
    if result.is_ok() && !args.exit_when_complete && !args.check_config && runner.is_some() {
        reporter.event(
            "serving",
            "serving DNS until stopped (SIGTERM); the bootstrap control plane may stop now",
            json!({}),
        );
        token.cancelled().await;
        drop(runner);
    }
    signals.abort();
    result
}
