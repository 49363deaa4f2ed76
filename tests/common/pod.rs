//! A Deployment's container run as a process, the way its kubelet would start it: the lab has no
//! kubelet, so the test reads the Deployment a user installed (by the chart), and runs the same
//! binary with the container's `args` and `env`, its Secret volumes written to a directory
//! (paths under the mount point rewritten), the Downward API's `metadata.name` as the pod name,
//! and the ServiceAccount's token in a kubeconfig in place of the in-cluster one. The process
//! is killed when the `Pod` drops (also on a failed assertion).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tokio::process::{Child, Command};

pub struct Pod {
    pub name: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Pod {
    /// A failing test shows what the pod logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- pod {} (last lines)\n{}", self.name, self.log_tail(60));
        }
    }
}

impl Pod {
    /// The last `n` lines of the process's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the process (SIGKILL) and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Starts pod `name` of Deployment `ns/deployment` as `bin` (the test's
/// `env!("CARGO_BIN_EXE_baton")`: examples include this module too), talking to the API server
/// of `kubeconfig`; `extra_env` is set after the container's own (the lab's differences, each
/// explained by the caller).
pub async fn start(
    bin: &Path,
    client: &kube::Client,
    ns: &str,
    deployment: &str,
    name: &str,
    kubeconfig: &Path,
    extra_env: &[(&str, &str)],
) -> Pod {
    let dep = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(deployment)
        .await
        .unwrap();
    let pod_spec = dep.spec.unwrap().template.spec.unwrap();
    let container = &pod_spec.containers[0];
    let dir = tempfile::tempdir().unwrap();
    // Secret volumes, by mount path.
    let mut mounts: BTreeMap<String, PathBuf> = BTreeMap::new();
    for volume in pod_spec.volumes.unwrap_or_default() {
        let Some(secret) = volume.secret else { continue };
        let secret_name = secret.secret_name.unwrap();
        let data = Api::<Secret>::namespaced(client.clone(), ns)
            .get(&secret_name)
            .await
            .unwrap_or_else(|e| panic!("the pod's Secret {ns}/{secret_name}: {e}"))
            .data
            .unwrap_or_default();
        let vdir = dir.path().join(&volume.name);
        std::fs::create_dir_all(&vdir).unwrap();
        for (key, value) in data {
            std::fs::write(vdir.join(key), value.0).unwrap();
        }
        for m in container.volume_mounts.iter().flatten() {
            if m.name == volume.name {
                mounts.insert(m.mount_path.clone(), vdir.clone());
            }
        }
    }
    let rewrite = |arg: &str| {
        for (mount, local) in &mounts {
            if let Some(rest) = arg.strip_prefix(mount.as_str()) {
                return format!("{}{rest}", local.display());
            }
        }
        arg.to_owned()
    };
    let args: Vec<String> = container.args.iter().flatten().map(|a| rewrite(a)).collect();
    let log = dir.path().join("pod.log");
    let mut cmd = Command::new(bin);
    cmd.args(&args)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for e in container.env.iter().flatten() {
        if let Some(v) = &e.value {
            cmd.env(&e.name, rewrite(v));
        } else if let Some(field) = e.value_from.as_ref().and_then(|f| f.field_ref.as_ref()) {
            // status.hostIP only points KUBERNETES_SERVICE_HOST at the node's API server: the
            // kubeconfig does that here.
            if field.field_path == "metadata.name" {
                cmd.env(&e.name, name);
            }
        }
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Pod {
        name: name.to_owned(),
        child,
        log,
        _dir: dir,
    }
}
