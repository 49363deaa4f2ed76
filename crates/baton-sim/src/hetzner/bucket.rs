//! Hetzner's rate limit, without HTTP: one token bucket per API token (per client address for a
//! request without one), `limit` requests big and refilled at `refill_per_s`, bursts allowed.
//! Every answer reports the bucket in the `RateLimit-*` headers ([`Quota`]).
//!
//! ```text
//!  request ─► Buckets::take(key, now) ─► Quota { allowed, limit, remaining, full_in }
//!                                             │ allowed: on to the API; else 429 rate_limit_exceeded
//!                                             └► RateLimit-Limit / -Remaining / -Reset (= now + full_in)
//! ```

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The bucket's shape; a size or a refill rate of 0 turns the limit off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limit {
    /// Requests the bucket holds (the burst).
    pub(crate) size: u64,
    /// Requests added per second.
    pub(crate) refill_per_s: f64,
}

impl Limit {
    fn enabled(self) -> bool {
        self.size > 0 && self.refill_per_s > 0.0
    }
}

/// What one request found in its bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Quota {
    /// Whether a token was left (the request goes on) or not (429).
    pub(crate) allowed: bool,
    /// `RateLimit-Limit`.
    pub(crate) limit: u64,
    /// `RateLimit-Remaining`: whole requests left after this one.
    pub(crate) remaining: u64,
    /// How long until the bucket is full again (`RateLimit-Reset` is now plus this, rounded up
    /// to the second).
    pub(crate) full_in: Duration,
}

/// The buckets of every token seen since the last reset.
#[derive(Debug, Default)]
pub(crate) struct Buckets {
    by_key: HashMap<String, (f64, Instant)>,
}

impl Buckets {
    /// Takes a token for `key` at `now`; `None` when the limit is off.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    // A bucket holds far fewer than 2^52 tokens; `remaining` is a floor of a non-negative count.
    pub(crate) fn take(&mut self, key: &str, limit: Limit, now: Instant) -> Option<Quota> {
        if !limit.enabled() {
            return None;
        }
        let size = limit.size as f64;
        let (tokens, last) = self.by_key.entry(key.to_owned()).or_insert((size, now));
        *tokens =
            (*tokens + now.saturating_duration_since(*last).as_secs_f64() * limit.refill_per_s).min(size);
        *last = now;
        let allowed = *tokens >= 1.0;
        if allowed {
            *tokens -= 1.0;
        }
        Some(Quota {
            allowed,
            limit: limit.size,
            remaining: tokens.floor() as u64,
            full_in: Duration::from_secs_f64(((size - *tokens) / limit.refill_per_s).clamp(0.0, 1e9)),
        })
    }

    /// Every bucket full again.
    pub(crate) fn reset(&mut self) {
        self.by_key.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Limit = Limit {
        size: 3,
        refill_per_s: 1.0,
    };

    #[test]
    fn a_bucket_empties_refills_and_reports_when_full() {
        let mut buckets = Buckets::default();
        let t0 = Instant::now();
        let takes: Vec<(bool, u64)> = (0..4)
            .map(|_| {
                let q = buckets.take("token", SMALL, t0).unwrap();
                (q.allowed, q.remaining)
            })
            .collect();
        assert_eq!(takes, [(true, 2), (true, 1), (true, 0), (false, 0)]);
        let q = buckets.take("token", SMALL, t0).unwrap();
        assert_eq!((q.limit, q.full_in), (3, Duration::from_secs(3)));
        // 1.5 s later: one and a half tokens back, one taken.
        let q = buckets
            .take("token", SMALL, t0 + Duration::from_millis(1500))
            .unwrap();
        assert_eq!((q.allowed, q.remaining), (true, 0));
        assert_eq!(q.full_in, Duration::from_millis(2500));
        // Never above the size.
        let q = buckets
            .take("token", SMALL, t0 + Duration::from_secs(60))
            .unwrap();
        assert_eq!((q.allowed, q.remaining), (true, 2));
    }

    #[test]
    fn tokens_have_buckets_of_their_own_and_reset_fills_them() {
        let mut buckets = Buckets::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            buckets.take("a", SMALL, t0);
        }
        assert!(!buckets.take("a", SMALL, t0).unwrap().allowed);
        assert!(buckets.take("b", SMALL, t0).unwrap().allowed);
        buckets.reset();
        assert_eq!(buckets.take("a", SMALL, t0).unwrap().remaining, 2);
    }

    #[test]
    fn zero_turns_the_limit_off() {
        let mut buckets = Buckets::default();
        let now = Instant::now();
        for limit in [
            Limit {
                size: 0,
                refill_per_s: 1.0,
            },
            Limit {
                size: 10,
                refill_per_s: 0.0,
            },
        ] {
            assert_eq!(buckets.take("a", limit, now), None);
        }
    }
}
