//! Shared helpers of the integration tests: the simulator's own (`baton_sim::testing`).
#![allow(unused_imports, unreachable_pub)] // each test binary uses a subset

pub use baton_sim::testing::*;
