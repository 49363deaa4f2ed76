//! baton's processes on the testbed's lab nodes, as the shipped manifests run them there: each
//! in its node's network (and mount) namespaces, talking to its own node's API server. `baton`
//! is the binary (`env!("CARGO_BIN_EXE_baton")` in a test: this module is shared with the
//! examples, where that variable does not exist).

use std::path::Path;
use std::process::Stdio;

use baton_sim::SimHandle;
use baton_testbed::{ADMIN_TOKEN, ControlPlane};
use tokio::process::{Child, Command};

/// `baton ARGS` on lab node cp-`i`, its log (`BATON_LOG=info,baton=debug`) in `log`; not
/// started yet, so that a caller can add to its environment.
pub fn command(cp: &ControlPlane, baton: &str, i: usize, args: &[&str], log: &Path) -> Command {
    let mut cmd = cp.node_command(&format!("cp-{i}"), baton).unwrap();
    cmd.args(args)
        .env("BATON_LOG", "info,baton=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true);
    cmd
}

/// `baton controller` on lab node cp-`i` (identity and Node `cp-i`, no admin server), moving the FIP
/// tagged `fip_tag` with the simulator as its cloud, no client rate limit; its log in
/// `logs/controller-i.log`.
pub fn controller(
    cp: &ControlPlane,
    baton: &str,
    sim: &SimHandle,
    i: usize,
    fip_tag: &str,
    logs: &Path,
) -> Child {
    let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
    command(
        cp,
        baton,
        i,
        &[
            "controller",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--identity",
            &format!("cp-{i}"),
            "--admin-listen",
            "off",
        ],
        &logs.join(format!("controller-{i}.log")),
    )
    // As the manifests give it (the downward API's spec.nodeName).
    .env("NODE_NAME", format!("cp-{i}"))
    .env("CHERRY_API_KEY", "sim-token")
    .env("CHERRY_PROJECT_ID", "123456")
    .env("CHERRY_FIP_TAG", fip_tag)
    .env("CHERRY_BASE_URL", sim.base_url().as_str())
    .env("BATON_API_RATE_LIMIT", "0")
    .spawn()
    .unwrap()
}

/// `baton agent` on lab node cp-`i` (the DaemonSet's job), no health server; its log in `log`.
pub fn agent(cp: &ControlPlane, baton: &str, i: usize, log: &Path) -> Child {
    let kubeconfig = cp.write_kubeconfig(i, ADMIN_TOKEN).unwrap();
    command(
        cp,
        baton,
        i,
        &[
            "agent",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--health-listen",
            "off",
        ],
        log,
    )
    .spawn()
    .unwrap()
}

/// `bin` wrapped to run on lab node `node` (its network and mount namespaces, as a host-network
/// pod there): a script in `dir` that execs [`ControlPlane::node_command`]'s wrapper with its
/// own arguments. `common::pod` starts a program by path; this is that path.
pub fn on_node(cp: &ControlPlane, node: &str, bin: &Path, dir: &Path) -> std::path::PathBuf {
    let wrapper = cp.node_command(node, bin).unwrap();
    let wrapper = wrapper.as_std();
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_str().unwrap().replace('\'', r"'\''"));
    let mut line = quote(wrapper.get_program());
    for arg in wrapper.get_args() {
        line.push(' ');
        line.push_str(&quote(arg));
    }
    let path = dir.join(format!(
        "{}-on-{node}",
        bin.file_name().unwrap().to_str().unwrap()
    ));
    std::fs::write(&path, format!("#!/bin/sh\nexec {line} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}
