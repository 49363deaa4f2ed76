//! Cold-start benchmark (run through `scripts/bench/cold-start`): the scenarios of
//! `tests/cold_start.rs` (`tests/common/coldstart.rs`: three control-plane lab nodes with
//! kubelets through the endpoint, baton's shipped agent DaemonSet, Deployment and standby
//! DaemonSet on the image of `scripts/build-image`, the boot unit on every node), each `--runs`
//! times in one lab, and per scenario one line:
//!
//! ```text
//! coldstart scenario=<s> endpoint_s=<p50>/<p99>/<max> pods_s=<p50>/<p99>/<max> runs=N first_api_s=<p50> retargets=<n> standby_led=<n>
//! ```
//!
//! `endpoint_s`: from the first returning API server answering `/readyz` on its node until
//! `https://<FIP>:6443/readyz` answers from the lab host; `pods_s`: until every baton pod of the
//! returning nodes runs again and the Lease is renewed by one of them. Every run's line goes to
//! stderr as it ends.
//!
//! ```text
//! cold-start-bench [--runs N] [--scenario all|holder-lost|one-left]…
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark's panic is its failure report

#[path = "../tests/common/mod.rs"]
mod common;

use common::coldstart::{Lab, Outcome, Scenario};

fn usage() -> ! {
    eprintln!("usage: cold-start-bench [--runs N] [--scenario all|holder-lost|one-left]...");
    std::process::exit(2)
}

/// The nearest-rank `p`th percentile (`p` in whole percent) of `sorted`.
fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{:.2}/{:.2}/{:.2}",
        percentile(&v, 50),
        percentile(&v, 99),
        v.last().copied().unwrap_or_default()
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut runs = 5_usize;
    let mut scenarios = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => {
                runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| usage());
            }
            "--scenario" => scenarios.push(
                args.next()
                    .and_then(|s| Scenario::parse(&s))
                    .unwrap_or_else(|| usage()),
            ),
            _ => usage(),
        }
    }
    if scenarios.is_empty() {
        scenarios = Scenario::ALL.to_vec();
    }
    baton_testbed::lab::run(move || async move {
        let image = baton_testbed::baton_image().expect("baton's image (scripts/build-image)");
        let mut lab = Lab::start(image).await;
        let mut results: Vec<Outcome> = Vec::new();
        for run in 1..=runs {
            for s in &scenarios {
                let out = lab.run(*s).await;
                eprintln!("run {run}: {out}");
                results.push(out);
            }
        }
        for s in &scenarios {
            let of: Vec<&Outcome> = results.iter().filter(|o| o.scenario == *s).collect();
            let mut first: Vec<f64> = of.iter().map(|o| o.first_api_s).collect();
            first.sort_by(f64::total_cmp);
            println!(
                "coldstart scenario={} endpoint_s={} pods_s={} runs={} first_api_s={:.2} retargets={} standby_led={}",
                s.name(),
                spread(of.iter().map(|o| o.endpoint_s).collect()),
                spread(of.iter().map(|o| o.pods_s).collect()),
                of.len(),
                percentile(&first, 50),
                of.iter().map(|o| o.retargets).sum::<usize>(),
                of.iter().filter(|o| o.led_by_standby).count(),
            );
        }
    });
}
