//! Helm, as a user runs it: the cached binary `scripts/helm-env` builds from Helm's Go module,
//! with its own config, cache and data directories (nothing of the user's).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn helm_bin() -> PathBuf {
    static HELM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    HELM.get_or_init(|| {
        let out = Command::new(root().join("scripts/helm-env")).output().unwrap();
        assert!(
            out.status.success(),
            "scripts/helm-env failed (scripts/setup runs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("bin/helm")
    })
    .clone()
}

/// Runs helm in the repository root (so `charts/baton` is the chart path a user of a checkout
/// types).
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    pub fn new() -> Self {
        Self {
            bin: helm_bin(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// The environment helm runs in here: its config, cache and data directories, and `PATH`
    /// with the cached helm first (for a guide's shell commands that call `helm`).
    pub fn env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        let h = self.home.path();
        let mut path = std::ffi::OsString::from(self.bin.parent().unwrap());
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        vec![
            ("HELM_CACHE_HOME", h.join("cache").into()),
            ("HELM_CONFIG_HOME", h.join("config").into()),
            ("HELM_DATA_HOME", h.join("data").into()),
            ("PATH", path),
        ]
    }

    pub fn run(&self, args: &[&str]) -> Output {
        let h = self.home.path();
        Command::new(&self.bin)
            .args(args)
            .current_dir(root())
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .output()
            .unwrap()
    }

    /// Runs helm and returns stdout; fails the test with helm's stderr.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_keeping(args, None)
    }

    /// [`Helm::ok`], and fails if helm printed `secret` (on stderr ever; on stdout unless it
    /// renders templates, where a Secret's value is expected).
    pub fn ok_keeping(&self, args: &[&str], secret: Option<&str>) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "helm {args:?}: {stderr}\n{stdout}");
        if let Some(secret) = secret {
            assert!(
                !stderr.contains(secret) && (args.contains(&"template") || !stdout.contains(secret)),
                "helm printed the secret"
            );
        }
        stdout
    }
}
