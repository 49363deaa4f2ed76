//! The state every handler shares: the world (of either dialect), the faults and their dice,
//! the rate limits, the recorder, the FIP paths and the state file.
//!
//! ```text
//!  handlers ─► Shared { world, faults, rng, limiter | hetzner (settings, buckets), recorder }
//!                 │ committed(world): after a write
//!                 ├─► paths.sync(world.forward_map(), retarget delay)   (routes / splice)
//!                 └─► world.save(state file)
//! ```

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::cloud::CloudWorld;
use crate::faults::{Faults, RateLimiter};
use crate::guard::lock;
use crate::hetzner;
use crate::paths::FipPaths;
use crate::stats::{Recorder, Stats};

/// State shared by all handlers.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) world: Mutex<CloudWorld>,
    pub(crate) faults: Mutex<Faults>,
    pub(crate) rng: Mutex<StdRng>,
    /// Cherry's per-address limit (`Faults::rate_limit`).
    pub(crate) limiter: Mutex<RateLimiter>,
    /// The Hetzner dialect's settings and token buckets (`None`: the simulator speaks Cherry).
    pub(crate) hetzner: Option<hetzner::Runtime>,
    pub(crate) recorder: Mutex<Recorder>,
    pub(crate) paths: FipPaths,
    pub(crate) state_file: Option<std::path::PathBuf>,
    pub(crate) started: Instant,
    pub(crate) shutdown: CancellationToken,
}

impl Shared {
    /// The counters, with the duplicates the world counted.
    pub(crate) fn stats(&self) -> Stats {
        let mut stats = lock(&self.recorder).stats.clone();
        let world = lock(&self.world);
        stats.duplicate_fips = world.duplicate_fips();
        (stats.fips_created, stats.fips_deleted) = world.fips_created_deleted();
        stats
    }

    /// Clears counters, log, rate-limit buckets and the duplicate count.
    pub(crate) fn reset_stats(&self) {
        lock(&self.recorder).reset();
        lock(&self.limiter).reset();
        if let Some(h) = &self.hetzner {
            lock(&h.buckets).reset();
        }
        lock(&self.world).reset_census();
    }

    /// After a successful write: route (or splice) what is targeted now, persist the state.
    pub(crate) fn committed(&self, world: &CloudWorld) {
        let delay = Duration::from_millis(lock(&self.faults).retarget_delay_ms);
        self.paths.sync(&world.forward_map(), delay);
        if let Some(path) = &self.state_file
            && let Err(error) = world.save(path)
        {
            warn!(path = %path.display(), %error, "cannot save the simulator state");
        }
    }
}
