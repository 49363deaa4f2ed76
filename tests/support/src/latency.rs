//! Latency drawn from a log-normal distribution fitted to two percentiles, p50 and p99.
//!
//! ```text
//!  Latency::from_percentiles(p50, p99)      μ = ln p50,  σ = ln(p99 / p50) / z₀.₉₉
//!     └─ sample(&mut rng) -> Duration       exp(μ + σ·N(0,1)), N by Box–Muller
//! ```
//!
//! Network and storage latencies are skewed to the right: most requests are near the median,
//! a few take several times as long. A log-normal distribution has that shape and is fixed by
//! two numbers, so a profile given as "p50 150 ms, p99 600 ms" (how latencies are reported)
//! determines it. `p50 == p99` gives a constant. The random source is the caller's (a seeded
//! `StdRng` in [`crate::slow_api`]), so a run can be repeated draw for draw.

use std::time::Duration;

use rand::Rng;

/// The 99th percentile of the standard normal distribution.
const Z99: f64 = 2.326_347_874_040_840_8;

/// A log-normal latency distribution (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// ln of the median, in seconds.
    mu: f64,
    /// The standard deviation of ln(latency).
    sigma: f64,
}

/// Why percentiles do not describe a latency distribution.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LatencyError {
    /// p50 is zero: a log-normal distribution has a positive median.
    #[error("latency p50 is {0:?}: it must be positive")]
    ZeroMedian(Duration),
    /// p99 is below p50.
    #[error("latency p99 ({p99:?}) is below p50 ({p50:?})")]
    P99BelowP50 { p50: Duration, p99: Duration },
}

impl Latency {
    /// The log-normal distribution whose median is `p50` and whose 99th percentile is `p99`.
    pub fn from_percentiles(p50: Duration, p99: Duration) -> Result<Self, LatencyError> {
        if p50.is_zero() {
            return Err(LatencyError::ZeroMedian(p50));
        }
        if p99 < p50 {
            return Err(LatencyError::P99BelowP50 { p50, p99 });
        }
        Ok(Self {
            mu: p50.as_secs_f64().ln(),
            sigma: (p99.as_secs_f64() / p50.as_secs_f64()).ln() / Z99,
        })
    }

    /// The latency at quantile `q` (0 < q < 1) of the distribution (for reports and tests).
    pub fn quantile(&self, q: f64) -> Duration {
        Duration::from_secs_f64((self.mu + self.sigma * normal_quantile(q)).exp())
    }

    /// One draw.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        if self.sigma == 0.0 {
            return Duration::from_secs_f64(self.mu.exp());
        }
        // Box–Muller: two uniforms in (0, 1] and [0, 1) give one standard normal.
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        // Capped at an hour: a draw so far in the tail (beyond 20 σ) is a bug, not a latency.
        Duration::from_secs_f64((self.mu + self.sigma * z).exp().min(3600.0))
    }
}

/// The quantile function of the standard normal distribution (Acklam's rational
/// approximation, relative error below 1.2e-9), for `0 < q < 1`.
fn normal_quantile(q: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.024_25;
    let q = q.clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON);
    let tail = |p: f64| {
        let t = (-2.0 * p.ln()).sqrt();
        (((((C[0] * t + C[1]) * t + C[2]) * t + C[3]) * t + C[4]) * t + C[5])
            / ((((D[0] * t + D[1]) * t + D[2]) * t + D[3]) * t + 1.0)
    };
    if q < LOW {
        tail(q)
    } else if q > 1.0 - LOW {
        -tail(1.0 - q)
    } else {
        let r = q - 0.5;
        let s = r * r;
        (((((A[0] * s + A[1]) * s + A[2]) * s + A[3]) * s + A[4]) * s + A[5]) * r
            / (((((B[0] * s + B[1]) * s + B[2]) * s + B[3]) * s + B[4]) * s + 1.0)
    }
}

#[cfg(test)]
mod tests;
