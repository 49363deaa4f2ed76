//! Latency distributions: how long the simulated API takes to answer a request.
//!
//! ```text
//!  "120"                     every request 120 ms
//!  "300,2000"                p50 300 ms, p99 2 s: a log-normal fitted to the two (a long tail,
//!                            as a loaded API has: p99.9 ≈ 3.7 s for these two)
//!  "p50:300,p90:800,p99:2000" the percentiles given, linear in between; from 0 ms at p0 up to
//!                            the first one (unless p0 is given), the last one above the last
//! ```
//!
//! [`Latency::sample`] draws one request's latency from the simulator's (seedable) dice. In JSON a
//! fixed latency is a number (`"latency_ms": 120`, as before distributions existed), any other
//! one its text (`"latency_ms": "300,2000"`).

// Milliseconds as f64: far below 2^52, no precision lost.
#![allow(clippy::cast_precision_loss)]

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// z of the 99th percentile of the standard normal distribution.
const Z99: f64 = 2.326_347_874;

/// A latency distribution, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub enum Latency {
    /// Every request takes this long.
    Fixed(u64),
    /// Log-normal through the given median and 99th percentile.
    P50P99 {
        /// Median.
        p50: u64,
        /// 99th percentile (at least the median).
        p99: u64,
    },
    /// Piecewise linear through `(percentile, ms)` points, percentiles rising in `0..=100`.
    Percentiles(Vec<(f64, u64)>),
}

impl Default for Latency {
    fn default() -> Self {
        Self::Fixed(0)
    }
}

impl From<u64> for Latency {
    fn from(ms: u64) -> Self {
        Self::Fixed(ms)
    }
}

impl Latency {
    /// No latency.
    pub const ZERO: Self = Self::Fixed(0);

    /// A log-normal through `p50` and `p99` (milliseconds).
    pub fn p50_p99(p50: u64, p99: u64) -> Self {
        Self::P50P99 { p50, p99 }
    }

    /// Whether every sample is 0.
    pub fn is_zero(&self) -> bool {
        match self {
            Self::Fixed(ms) => *ms == 0,
            Self::P50P99 { p99, .. } => *p99 == 0,
            Self::Percentiles(points) => points.iter().all(|(_, ms)| *ms == 0),
        }
    }

    /// Checks the distribution makes sense.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Self::P50P99 { p50, p99 } if p99 < p50 => Err(format!("p99 ({p99} ms) is below p50 ({p50} ms)")),
            Self::Fixed(_) | Self::P50P99 { .. } => Ok(()),
            Self::Percentiles(points) => {
                if points.is_empty() {
                    return Err("no percentile given".into());
                }
                let mut last = (-1.0_f64, 0_u64);
                for &(p, ms) in points {
                    if !(0.0..=100.0).contains(&p) || p <= last.0 {
                        return Err(format!(
                            "percentile {p} must be within 0..=100 and above the one before"
                        ));
                    }
                    if ms < last.1 {
                        return Err(format!("p{p} ({ms} ms) is below an earlier percentile"));
                    }
                    last = (p, ms);
                }
                Ok(())
            }
        }
    }

    /// One request's latency.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        let ms = match self {
            Self::Fixed(ms) => return Duration::from_millis(*ms),
            Self::P50P99 { p50: 0, .. } => 0.0,
            Self::P50P99 { p50, p99 } => {
                let mu = (*p50 as f64).ln();
                let sigma = ((*p99 as f64).ln() - mu).max(0.0) / Z99;
                (mu + sigma * standard_normal(rng)).exp()
            }
            Self::Percentiles(points) => {
                let u = rng.random::<f64>() * 100.0;
                interpolate(points, u)
            }
        };
        // Bounded: a sample of a wide distribution may be huge; an hour is "never answers".
        Duration::from_secs_f64((ms / 1000.0).clamp(0.0, 3600.0))
    }
}

/// One standard normal sample (Box–Muller).
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The value at percentile `u` of piecewise-linear `points` (from 0 ms at p0 unless given).
fn interpolate(points: &[(f64, u64)], u: f64) -> f64 {
    let mut prev = (0.0, 0.0);
    for &(p, ms) in points {
        let ms = ms as f64;
        if u <= p {
            let span = p - prev.0;
            if span <= 0.0 {
                return ms;
            }
            return prev.1 + (ms - prev.1) * (u - prev.0) / span;
        }
        prev = (p, ms);
    }
    prev.1
}

impl FromStr for Latency {
    type Err = String;

    /// `N`, `P50,P99`, or `pNN:MS,...` (see the module doc).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let number = |v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("latency {s:?}: {v:?} is not a number of milliseconds"))
        };
        let latency = if s.contains(':') {
            let points = s
                .split(',')
                .map(|part| {
                    let (p, ms) = part
                        .split_once(':')
                        .ok_or_else(|| format!("latency {s:?}: {part:?} is not pNN:MS"))?;
                    let p = p.trim();
                    let p = p
                        .strip_prefix('p')
                        .or_else(|| p.strip_prefix('P'))
                        .unwrap_or(p)
                        .parse::<f64>()
                        .map_err(|_| format!("latency {s:?}: {p:?} is not a percentile"))?;
                    Ok((p, number(ms)?))
                })
                .collect::<Result<Vec<_>, String>>()?;
            Self::Percentiles(points)
        } else if let Some((p50, p99)) = s.split_once(',') {
            Self::P50P99 {
                p50: number(p50)?,
                p99: number(p99)?,
            }
        } else {
            Self::Fixed(number(s)?)
        };
        latency.validate().map_err(|e| format!("latency {s:?}: {e}"))?;
        Ok(latency)
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(ms) => write!(f, "{ms}"),
            Self::P50P99 { p50, p99 } => write!(f, "{p50},{p99}"),
            Self::Percentiles(points) => {
                for (i, (p, ms)) in points.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "p{p}:{ms}")?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for Latency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fixed(ms) => serializer.serialize_u64(*ms),
            other => serializer.collect_str(other),
        }
    }
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(ms) => Ok(Self::Fixed(ms)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests;
