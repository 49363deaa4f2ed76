//! Exit codes of every subcommand (documented in docs/bootstrap.md, docs/controller.md and
//! docs/operations.md).
//!
//! Every subcommand uses [`OK`], [`FAILURE`] and [`CONFIG`]; `baton bootstrap` adds the codes of
//! [`bootstrap`], so a script can tell a timeout from a cloud failure, and `baton status` those
//! of [`status`] (numbered apart from both, so no code means two things).

/// Success.
pub const OK: u8 = 0;
/// A runtime failure.
pub const FAILURE: u8 = 1;
/// Bad configuration or arguments.
pub const CONFIG: u8 = 2;

/// Exit codes of `baton bootstrap` (documented in docs/bootstrap.md).
pub mod bootstrap {
    /// Complete.
    pub const COMPLETE: u8 = super::OK;
    /// Any other failure (state file unwritable, internal error).
    pub const FAILURE: u8 = super::FAILURE;
    /// Bad configuration: the message names the field.
    pub const CONFIG: u8 = super::CONFIG;
    /// A waiting step ran out of time.
    pub const TIMEOUT: u8 = 4;
    /// The cloud API failed (after retries) or disagrees with the state file.
    pub const CLOUD: u8 = 5;
    /// The Kubernetes API failed (after retries) or refused an object.
    pub const KUBERNETES: u8 = 6;
    /// DNS publishing failed (bind, RFC 2136 update refused or unauthenticated).
    pub const DNS: u8 = 7;
    /// Stopped by SIGTERM/SIGINT before completion; the state is saved, a rerun continues.
    pub const INTERRUPTED: u8 = 8;
}

/// Exit codes of `baton status` (documented in docs/operations.md). 1 and 2 keep their meaning
/// (the command itself failed / bad arguments or configuration).
pub mod status {
    /// Every endpoint serves and nothing waits.
    pub const HEALTHY: u8 = super::OK;
    /// The endpoints serve, but something needs attention (no leader, an unhealthy candidate,
    /// a Service without a FIP, a node not initialised, the cloud unreadable).
    pub const DEGRADED: u8 = 10;
    /// A control-plane endpoint does not serve, or Kubernetes cannot be read.
    pub const DOWN: u8 = 11;
}
