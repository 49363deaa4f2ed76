//! Health with hysteresis: an endpoint is `Up` after `rise` consecutive successful probes and
//! `Down` after `fall` consecutive failures, so one lost probe never moves a Floating IP.

/// The health of one probed endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Health {
    /// Not enough probes yet to say.
    #[default]
    Unknown,
    /// `rise` consecutive successes.
    Up,
    /// `fall` consecutive failures.
    Down,
}

/// Rise/fall thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub rise: u32,
    pub fall: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { rise: 2, fall: 3 }
    }
}

/// Tracks consecutive probe results of one endpoint.
#[derive(Clone, Debug, Default)]
pub struct HealthTracker {
    thresholds: Thresholds,
    health: Health,
    successes: u32,
    failures: u32,
}

impl HealthTracker {
    /// A tracker in state `Unknown`.
    pub fn new(thresholds: Thresholds) -> Self {
        Self {
            thresholds: Thresholds {
                rise: thresholds.rise.max(1),
                fall: thresholds.fall.max(1),
            },
            ..Self::default()
        }
    }

    /// The current health.
    pub fn health(&self) -> Health {
        self.health
    }

    /// Records one probe result; returns the new health if it changed.
    pub fn observe(&mut self, ok: bool) -> Option<Health> {
        let before = self.health;
        if ok {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            if self.successes >= self.thresholds.rise {
                self.health = Health::Up;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.thresholds.fall {
                self.health = Health::Down;
            }
        }
        (self.health != before).then_some(self.health)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: Thresholds, probes: &str) -> Vec<Health> {
        let mut h = HealthTracker::new(t);
        probes
            .chars()
            .map(|c| {
                h.observe(c == '+');
                h.health()
            })
            .collect()
    }

    #[test]
    fn rises_and_falls_only_after_consecutive_results() {
        use Health::{Down, Unknown, Up};
        let t = Thresholds { rise: 2, fall: 3 };
        assert_eq!(run(t, "++"), [Unknown, Up]);
        assert_eq!(run(t, "++-+--+"), [Unknown, Up, Up, Up, Up, Up, Up]);
        assert_eq!(run(t, "++---"), [Unknown, Up, Up, Up, Down]);
        assert_eq!(run(t, "---+-+"), [Unknown, Unknown, Down, Down, Down, Down]);
        assert_eq!(run(t, "---++"), [Unknown, Unknown, Down, Down, Up]);
    }

    #[test]
    fn one_failed_probe_never_changes_a_healthy_endpoint() {
        let t = Thresholds { rise: 1, fall: 2 };
        let states = run(t, "+-+-+-+-+-");
        assert!(states.iter().all(|h| *h == Health::Up), "{states:?}");
    }

    #[test]
    fn zero_thresholds_behave_as_one() {
        let t = Thresholds { rise: 0, fall: 0 };
        assert_eq!(run(t, "+-"), [Health::Up, Health::Down]);
    }
}
