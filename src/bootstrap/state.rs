//! The state file: what earlier runs achieved, so a rerun continues where a killed one stopped.
//!
//! It records facts, not intentions: the FIP found or reserved for each endpoint (so a rerun
//! never reserves a second one, even if the FIP's tags were edited), and the times the handoff
//! was applied, the Services were seen Ready, the bootstrap address left DNS and the run
//! completed. The next step is a pure function of these facts and of what this process has
//! observed (`super::plan::next_step`). Every write goes to a temporary file that is then renamed over
//! the old one, so a kill at any instant leaves either the old or the new state, never a torn
//! one. No secret is ever written here.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The current format version.
pub const STATE_VERSION: u32 = 1;

/// The steps of `baton bootstrap`, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// Find (or reserve) each endpoint's Floating IP.
    ReserveFips,
    /// Publish the API names in DNS (embedded server or RFC 2136), health-filtered.
    PublishDns,
    /// Wait until the bootstrap API server answers `/readyz`.
    WaitForApi,
    /// Create/update the API Services and apply the in-cluster manifests.
    Handoff,
    /// Wait until every API Service is Ready.
    WaitForServices,
    /// Remove the bootstrap address from DNS.
    DropBootstrap,
    /// Wait one TTL so no client still holds the bootstrap address.
    Drain,
    /// Done: the bootstrap control plane may stop.
    Complete,
}

impl Step {
    /// Every step, in order.
    pub const ALL: [Self; 8] = [
        Self::ReserveFips,
        Self::PublishDns,
        Self::WaitForApi,
        Self::Handoff,
        Self::WaitForServices,
        Self::DropBootstrap,
        Self::Drain,
        Self::Complete,
    ];

    /// The step's name as written in the state file and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReserveFips => "reserve-fips",
            Self::PublishDns => "publish-dns",
            Self::WaitForApi => "wait-for-api",
            Self::Handoff => "handoff",
            Self::WaitForServices => "wait-for-services",
            Self::DropBootstrap => "drop-bootstrap",
            Self::Drain => "drain",
            Self::Complete => "complete",
        }
    }

    /// 1-based position, for "step 3/8".
    pub fn number(self) -> usize {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) + 1
    }

    /// One line for people.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ReserveFips => "finding the reserved Floating IPs",
            Self::PublishDns => "publishing the API names in DNS",
            Self::WaitForApi => "waiting for the bootstrap API server",
            Self::Handoff => "creating the API Services and applying the in-cluster manifests",
            Self::WaitForServices => "waiting for the API Services to become Ready",
            Self::DropBootstrap => "removing the bootstrap address from DNS",
            Self::Drain => "waiting one TTL for clients to forget the bootstrap address",
            Self::Complete => "complete: the bootstrap control plane may stop now",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The FIP of one endpoint, as found or reserved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FipRecord {
    /// The cloud's id of the IP.
    pub id: String,
    /// The address.
    pub address: IpAddr,
    /// Whether this tool reserved it (as opposed to finding the installer's reservation).
    pub reserved_by_baton: bool,
}

/// The persistent facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// The cluster this state belongs to; a state file of another cluster is refused.
    pub infra_id: String,
    /// The next step, for people reading the file (derived; not used to decide).
    pub step: Step,
    /// Endpoint name → its FIP.
    #[serde(default)]
    pub fips: BTreeMap<String, FipRecord>,
    /// When the Services and manifests were applied (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_applied_at: Option<u64>,
    /// When every Service was first seen Ready (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services_ready_at: Option<u64>,
    /// When DNS stopped serving the bootstrap address (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_dropped_at: Option<u64>,
    /// When the run completed (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<u64>,
    /// When the state was written (Unix ms).
    pub updated_at: u64,
}

impl State {
    /// A fresh state for cluster `infra_id`.
    pub fn new(infra_id: &str) -> Self {
        Self {
            version: STATE_VERSION,
            infra_id: infra_id.to_owned(),
            step: Step::ReserveFips,
            fips: BTreeMap::new(),
            handoff_applied_at: None,
            services_ready_at: None,
            bootstrap_dropped_at: None,
            completed_at: None,
            updated_at: now_ms(),
        }
    }
}

/// Errors reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read the state file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the state file {path} is not valid: {reason} (move it away to start over)")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "the state file {path} belongs to cluster {found:?}, not {expected:?} (use another --state-file or remove it)"
    )]
    OtherCluster {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("cannot write the state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The state file on disk.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// The state file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, or a fresh one when the file does not exist. Returns whether it resumed.
    pub fn load(&self, infra_id: &str) -> Result<(State, bool), StateError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((State::new(infra_id), false)),
            Err(source) => {
                return Err(StateError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let state: State = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        if state.version != STATE_VERSION {
            return Err(StateError::Corrupt {
                path: self.path.clone(),
                reason: format!("version {} (this baton writes {STATE_VERSION})", state.version),
            });
        }
        if state.infra_id != infra_id {
            return Err(StateError::OtherCluster {
                path: self.path.clone(),
                found: state.infra_id,
                expected: infra_id.to_owned(),
            });
        }
        Ok((state, true))
    }

    /// Writes `state` atomically: a temporary file in the same directory, fsync, rename, fsync
    /// of the directory.
    pub fn save(&self, state: &State) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: self.path.clone(),
            source,
        };
        let mut state = state.clone();
        state.updated_at = now_ms();
        let text = serde_json::to_vec_pretty(&state).map_err(|e| err(std::io::Error::other(e)))?;
        write_atomic(&self.path, &text).map_err(err)
    }
}

/// Writes `bytes` to `path` via a temporary sibling and a rename (creating the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_another_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path().join("sub/state.json"));
        let (mut s, resumed) = file.load("c1").unwrap();
        assert!(!resumed);
        s.fips.insert(
            "api".into(),
            FipRecord {
                id: "uuid-1".into(),
                address: "203.0.113.1".parse().unwrap(),
                reserved_by_baton: true,
            },
        );
        s.handoff_applied_at = Some(5);
        file.save(&s).unwrap();
        let (back, resumed) = file.load("c1").unwrap();
        assert!(resumed);
        assert_eq!(back.fips, s.fips);
        assert_eq!(back.handoff_applied_at, Some(5));
        assert!(matches!(file.load("c2"), Err(StateError::OtherCluster { .. })));
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_torn_file_is_reported_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"version\":1,").unwrap();
        let err = StateFile::new(&path).load("c1").unwrap_err();
        assert!(err.to_string().contains("not valid"), "{err}");
    }

    #[test]
    fn steps_are_ordered_and_named() {
        assert!(Step::ReserveFips < Step::Complete);
        assert_eq!(Step::Handoff.number(), 4);
        assert_eq!(
            serde_json::to_string(&Step::WaitForApi).unwrap(),
            "\"wait-for-api\""
        );
        for s in Step::ALL {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.as_str()));
        }
    }
}
