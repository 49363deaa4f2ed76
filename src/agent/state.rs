//! What the agent keeps on the node, so that the node accepts its FIPs again at boot without any
//! API server (a rack that lost power comes back with empty nftables and kubelets that cannot
//! reach the API until something accepts the FIP: docs/agent.md, "Cold start").
//!
//! ```text
//!  the agent (DaemonSet)                                     at boot (systemd, before the kubelet)
//!  FIP table + --fip ─► NodeFile ─► <state-dir>/agent/fips.json ─► `baton agent --boot`
//!    (written at once on a change: temporary file, fsync,              │ every FIP: prerouting redirect
//!     rename, fsync of the directory: never half a file)               │ every FIP: the node's own packets
//!                                                                      │   → its own API server (boot delivery)
//!                                    <run-dir>/boot.json ◄─ BootMarker ┘ (tmpfs: gone at the next boot)
//!  the agent again (the kubelet started it) ─► reads the marker: each boot delivery stays until the
//!    FIP table names a holder that is this node or answers /readyz (boot::resolve), then ends
//! ```
//!
//! Both files are plain JSON; the node file names no secret (FIPs and server addresses only).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::plan::Wanted;
use super::table::FipSet;
use crate::names::FipEntry;

/// The node file, under `--state-dir`.
pub const NODE_FILE: &str = "agent/fips.json";
/// The boot binary the systemd unit runs, under `--state-dir` (the agent copies itself there).
pub const BOOT_BINARY: &str = "bin/baton";
/// The boot marker, under `--run-dir` (a tmpfs: it describes this boot only).
pub const BOOT_MARKER: &str = "boot.json";

/// What the node accepted when the agent last knew the FIP table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeFile {
    /// Every FIP the node accepted, with the holder the FIP table named (the primary address of
    /// the server the cloud routed it to), when it named one.
    pub fips: Vec<FipEntry>,
    /// This node's address where its own API server listens (the address the agent reached it
    /// on): at boot, the node's own packets for a FIP go there until the FIP's holder answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_address: Option<IpAddr>,
}

impl NodeFile {
    /// The file for what the kernel is to hold now: `want`'s FIPs, with the holders `table`
    /// names (the agent's held FIPs come from those same holders).
    pub fn of(want: &Wanted, table: &FipSet, node_address: Option<IpAddr>) -> Self {
        let fips = want
            .fips
            .iter()
            .map(|fip| FipEntry {
                address: *fip,
                holder: table.holders.get(fip).and_then(|h| h.iter().next().copied()),
            })
            .collect();
        Self { fips, node_address }
    }
}

/// The boot deliveries of this boot: FIP → the node's address its own packets for it go to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootMarker {
    pub delivered: BTreeMap<IpAddr, IpAddr>,
}

impl BootMarker {
    /// Writes the marker to `path`, or removes the file when no delivery stands (the boot phase is
    /// over).
    pub fn store(&self, path: &Path) -> Result<(), StateError> {
        if self.delivered.is_empty() {
            remove(path)
        } else {
            save(path, self)
        }
    }
}

/// A state file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid baton state file: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Reads the JSON file at `path`; `None` when it does not exist.
pub fn load<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, StateError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| StateError::Parse {
            path: path.to_owned(),
            source,
        })
}

/// Writes `value` as JSON to `path` so that a reader (or a power loss) sees the old file or the
/// new one, never a part: a temporary file beside it, fsync, rename over it, fsync of the
/// directory. Missing directories are created.
pub fn save<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StateError::Write {
        path: path.to_owned(),
        source: std::io::Error::other(e),
    })?;
    write_atomically(path, &bytes, 0o644)
}

/// Writes `bytes` to `path` atomically (as [`save`]) with permission bits `mode`.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StateError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| StateError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(err)?;
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(err)
}

/// Removes `path`; a missing file is not an error.
pub fn remove(path: &Path) -> Result<(), StateError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Write {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Copies the running executable to `dest` (atomically, mode 0755) unless `dest` already holds
/// the same bytes: the binary the boot unit runs is always the agent's own version. True when
/// it was written.
pub fn install_self(dest: &Path) -> Result<bool, StateError> {
    let me = Path::new("/proc/self/exe");
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| StateError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let mine = read(me)?;
    if std::fs::read(dest).is_ok_and(|there| there == mine) {
        return Ok(false);
    }
    write_atomically(dest, &mine, 0o755)?;
    Ok(true)
}

#[cfg(test)]
mod tests;
