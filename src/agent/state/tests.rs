use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn the_node_file_round_trips_and_rejects_what_it_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/agent/fips.json");
    assert!(load::<NodeFile>(&path).unwrap().is_none(), "no file yet: nothing");
    let file = NodeFile {
        fips: vec![FipEntry {
            address: ip("203.0.113.10"),
            holder: Some(ip("198.51.100.11")),
        }],
        node_address: Some(ip("198.51.100.12")),
    };
    save(&path, &file).unwrap();
    assert_eq!(load::<NodeFile>(&path).unwrap(), Some(file));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"nodeAddress\": \"198.51.100.12\""), "{text}");
    // No temporary file is left beside it.
    let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["fips.json"]);

    std::fs::write(&path, "{\"fips\": [], \"extra\": 1}").unwrap();
    let err = load::<NodeFile>(&path).unwrap_err().to_string();
    assert!(
        err.contains("fips.json is not a valid baton state file") && err.contains("extra"),
        "{err}"
    );
    std::fs::write(&path, "{\"fips\": [{\"address\": \"not an ip\"}]}").unwrap();
    assert!(load::<NodeFile>(&path).is_err());
}

#[test]
fn the_file_records_the_tables_holders() {
    let want = Wanted {
        fips: BTreeSet::from([ip("203.0.113.10"), ip("203.0.113.11"), ip("203.0.113.12")]),
        held: BTreeMap::from([(ip("203.0.113.12"), ip("198.51.100.12"))]),
    };
    let table = FipSet {
        fips: want.fips.clone(),
        holders: BTreeMap::from([
            (ip("203.0.113.10"), BTreeSet::from([ip("198.51.100.11")])),
            (ip("203.0.113.12"), BTreeSet::from([ip("198.51.100.12")])),
        ]),
        problems: Vec::new(),
    };
    let file = NodeFile::of(&want, &table, Some(ip("198.51.100.12")));
    let rows: Vec<(IpAddr, Option<IpAddr>)> = file.fips.iter().map(|e| (e.address, e.holder)).collect();
    assert_eq!(
        rows,
        [
            (ip("203.0.113.10"), Some(ip("198.51.100.11"))),
            (ip("203.0.113.11"), None),
            (ip("203.0.113.12"), Some(ip("198.51.100.12"))),
        ]
    );
}

#[test]
fn the_boot_marker_is_removed_quietly_once_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("boot.json");
    let marker = BootMarker {
        delivered: BTreeMap::from([(ip("203.0.113.10"), ip("198.51.100.12"))]),
    };
    save(&path, &marker).unwrap();
    assert_eq!(load::<BootMarker>(&path).unwrap(), Some(marker));
    remove(&path).unwrap();
    remove(&path).unwrap();
    assert!(load::<BootMarker>(&path).unwrap().is_none());
}

#[test]
fn the_boot_binary_is_written_once_and_executable() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("bin/baton");
    assert!(install_self(&dest).unwrap(), "first install writes");
    assert!(
        !install_self(&dest).unwrap(),
        "the same bytes are not written again"
    );
    let mode = std::fs::metadata(&dest).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        std::fs::read("/proc/self/exe").unwrap()
    );
}
