//! Where values come from, in order: the flag, the environment, the JSON file(s), the default.
//!
//! ```text
//!   ConfigArgs ─┐
//!   Env ────────┼─▶ RawValues::collect: per setting, the first non-empty value and its Source
//!   FileValues ─┘     (--cloud-config / BATON_CLOUD_CONFIG, or a Section: the bootstrap's `cloud:`)
//!        ▼ each value parsed into its field by the table (Config::parse_value)
//!   Config::resolve*: the Config, or every invalid value at once
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::{ConfigError, InvalidValue};
use super::settings::{Config, ConfigArgs, FLAGS, Flag, FlagArgs, Id, SETTINGS, Source};

/// The environment variable of `--cloud-config`.
pub const CLOUD_CONFIG_ENV: &str = "BATON_CLOUD_CONFIG";

/// Where settings come from: the process environment, or a fixed map in tests.
pub trait Env {
    /// The value of environment variable `key`, if set.
    fn var(&self, key: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

/// `cloud-sa.json` keys from another file (the bootstrap config's `cloud:` section), and the
/// `cloud-sa.json` it names (`configFile`), which ranks like `--cloud-config`, below it.
#[derive(Debug, Clone)]
pub struct Section {
    /// The file the keys were read from (named by errors and `Source::File`).
    pub origin: PathBuf,
    /// The keys, as in `cloud-sa.json`.
    pub object: serde_json::Map<String, serde_json::Value>,
    /// A `cloud-sa.json`, used when neither `--cloud-config` nor `BATON_CLOUD_CONFIG` is set.
    pub config_file: Option<PathBuf>,
}

/// The `--cloud-config` file: the flag, else `BATON_CLOUD_CONFIG` (empty counts as unset).
pub fn cloud_config_path(args: &ConfigArgs, env: &dyn Env) -> Option<PathBuf> {
    args.cloud_config.clone().or_else(|| {
        env.var(CLOUD_CONFIG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

impl Config {
    /// Resolves the configuration from flags, the environment and the config file.
    pub fn resolve(args: &ConfigArgs, env: &dyn Env) -> Result<Self, ConfigError> {
        let file = FileValues::layered(None, cloud_config_path(args, env).as_deref())?;
        Self::resolve_values(args, env, file.as_ref())
    }

    /// Like [`Config::resolve`], with the bootstrap config's `cloud:` section as one more layer:
    /// flag > env > `--cloud-config` file (else the section's `configFile`) > the section's own
    /// keys > default.
    pub fn resolve_with_section(
        args: &ConfigArgs,
        env: &dyn Env,
        section: Section,
    ) -> Result<Self, ConfigError> {
        let file = cloud_config_path(args, env).or_else(|| section.config_file.clone());
        let merged = FileValues::layered(Some(section), file.as_deref())?;
        Self::resolve_values(args, env, merged.as_ref())
    }

    fn resolve_values(
        args: &ConfigArgs,
        env: &dyn Env,
        file: Option<&FileValues>,
    ) -> Result<Self, ConfigError> {
        let raw = RawValues::collect(args, env, file);
        let mut errors = raw.type_errors.clone();
        errors.extend(refused_secret_flags(args));
        let mut cfg = Self::empty();
        for (id, (value, source)) in &raw.values {
            let Some(value) = value else { continue };
            if let Err(reason) = cfg.parse_value(*id, value) {
                let s = id.setting();
                errors.push(InvalidValue {
                    key: s.file_key,
                    source: source.clone(),
                    value: if s.secret {
                        "<redacted>".to_owned()
                    } else {
                        value.clone()
                    },
                    reason,
                });
            }
        }
        cfg.sources = raw.sources();
        if cfg.cloud == baton_cloud::CloudKind::Hetzner {
            match cfg.load_balancer {
                // Hetzner Cloud has no customer BGP: a Service FIP is routed to a healthy node
                // by the cloud's API (baton's placement), published in an annotation and the
                // Service's ingress, as `empty://` does.
                None => {
                    cfg.load_balancer = Some(baton_core::LoadBalancerMode::Empty {
                        ip_annotation: super::HETZNER_IP_ANNOTATION.to_owned(),
                    });
                }
                Some(ref mode) => {
                    let source = cfg
                        .sources
                        .get(&Id::LoadBalancer)
                        .cloned()
                        .unwrap_or(Source::Unset);
                    errors.push(InvalidValue {
                        key: Id::LoadBalancer.setting().file_key,
                        source,
                        value: mode.to_string(),
                        reason: "Hetzner Cloud offers no BGP: leave loadbalancer unset (baton routes each Service FIP to a healthy node)".to_owned(),
                    });
                }
            }
        }
        if !errors.is_empty() {
            return Err(ConfigError::Invalid(errors));
        }
        cfg.unknown_file_keys = raw.unknown_file_keys;
        Ok(cfg)
    }
}

/// A secret given as a flag (`--api-key`) is refused, whatever its value: any local user reads a
/// process's arguments (`ps`, `/proc/<pid>/cmdline`). The error names where to put it instead.
fn refused_secret_flags(args: &ConfigArgs) -> Vec<InvalidValue> {
    SETTINGS
        .iter()
        .filter(|s| s.secret && args.flag(s.id).is_some())
        .map(|s| InvalidValue {
            key: s.file_key,
            source: Source::Flag {
                flag: s.flag.to_owned(),
            },
            value: "<redacted>".to_owned(),
            reason: format!(
                "--{} is not accepted on the command line, where every local user can read it (ps, /proc/<pid>/cmdline): set the environment variable {} or the key {} of the --cloud-config file (cloud-sa.json)",
                s.flag, s.env, s.file_key
            ),
        })
        .collect()
}

/// Empty values count as unset, like `os.Getenv` checks in the CCM.
fn nonempty(v: Option<String>) -> Option<String> {
    v.filter(|v| !v.trim().is_empty())
}

/// The value of `flag` (flag > env > default) and its source.
pub fn flag_value(args: &FlagArgs, env: &dyn Env, flag: &Flag) -> (Option<String>, Source) {
    nonempty(args.get(flag).map(str::to_owned))
        .map(|v| {
            (
                v,
                Source::Flag {
                    flag: flag.flag.to_owned(),
                },
            )
        })
        .or_else(|| {
            nonempty(env.var(flag.env)).map(|v| {
                (
                    v,
                    Source::Env {
                        var: flag.env.to_owned(),
                    },
                )
            })
        })
        .or_else(|| flag.default.map(|d| (d.to_owned(), Source::Default)))
        .map_or((None, Source::Unset), |(v, s)| (Some(v), s))
}

/// Every flag of [`FLAGS`] with its value and source.
pub fn flag_values(args: &FlagArgs, env: &dyn Env) -> Vec<(&'static Flag, Option<String>, Source)> {
    FLAGS
        .iter()
        .map(|f| {
            let (v, s) = flag_value(args, env, f);
            (f, v, s)
        })
        .collect()
}

/// Each setting's raw (string) value and its source, before parsing.
struct RawValues {
    values: BTreeMap<Id, (Option<String>, Source)>,
    unknown_file_keys: Vec<String>,
    type_errors: Vec<InvalidValue>,
}

/// The keys of the config file(s).
struct FileValues {
    /// Lower-cased key -> (file, key as written, value as text or an error).
    entries: BTreeMap<String, (PathBuf, String, Result<String, String>)>,
}

impl RawValues {
    fn collect(args: &ConfigArgs, env: &dyn Env, file: Option<&FileValues>) -> Self {
        let mut values = BTreeMap::new();
        let mut type_errors = Vec::new();
        for s in SETTINGS {
            let mut from_file = None;
            if let Some(f) = file
                && let Some((path, key, v)) = f.entries.get(&s.file_key.to_ascii_lowercase())
            {
                let source = Source::File {
                    path: path.clone(),
                    key: key.clone(),
                };
                match v {
                    Ok(v) => from_file = nonempty(Some(v.clone())).map(|v| (v, source)),
                    // A value of the wrong JSON type is an error even when a flag overrides it:
                    // the file is wrong and its owner should hear about it.
                    Err(reason) => type_errors.push(InvalidValue {
                        key: s.file_key,
                        source,
                        value: "<non-scalar JSON>".to_owned(),
                        reason: reason.clone(),
                    }),
                }
            }
            let resolved = nonempty(args.flag(s.id).map(str::to_owned))
                .map(|v| {
                    (
                        v,
                        Source::Flag {
                            flag: s.flag.to_owned(),
                        },
                    )
                })
                .or_else(|| {
                    nonempty(env.var(s.env)).map(|v| {
                        (
                            v,
                            Source::Env {
                                var: s.env.to_owned(),
                            },
                        )
                    })
                })
                .or(from_file)
                .or_else(|| s.default.map(|d| (d.to_owned(), Source::Default)));
            let entry = match resolved {
                Some((v, src)) => (Some(v), src),
                None => (None, Source::Unset),
            };
            values.insert(s.id, entry);
        }
        let known: Vec<String> = SETTINGS.iter().map(|s| s.file_key.to_ascii_lowercase()).collect();
        let unknown_file_keys = file
            .map(|f| {
                f.entries
                    .iter()
                    .filter(|(k, _)| !known.contains(k))
                    .map(|(_, (_, key, _))| key.clone())
                    .collect()
            })
            .unwrap_or_default();
        Self {
            values,
            unknown_file_keys,
            type_errors,
        }
    }

    /// The source of every setting.
    fn sources(&self) -> BTreeMap<Id, Source> {
        self.values
            .iter()
            .map(|(id, (_, src))| (*id, src.clone()))
            .collect()
    }
}

impl FileValues {
    /// The keys of `section`, then those of the `cloud-sa.json` file over them.
    fn layered(section: Option<Section>, file: Option<&Path>) -> Result<Option<Self>, ConfigError> {
        let mut merged = section.map(|s| object_values(&s.origin, s.object));
        if let Some(path) = file {
            let read = read_file(path)?;
            match &mut merged {
                Some(m) => m.entries.extend(read.entries),
                None => merged = Some(read),
            }
        }
        Ok(merged)
    }
}

fn read_file(path: &Path) -> Result<FileValues, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|source| ConfigError::ParseFile {
        path: path.to_owned(),
        source,
    })?;
    let serde_json::Value::Object(map) = json else {
        return Err(ConfigError::NotAnObject {
            path: path.to_owned(),
        });
    };
    Ok(object_values(path, map))
}

fn object_values(path: &Path, map: serde_json::Map<String, serde_json::Value>) -> FileValues {
    let entries = map
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => Ok(s),
                serde_json::Value::Number(n) => Ok(n.to_string()),
                serde_json::Value::Bool(b) => Ok(b.to_string()),
                // A list setting (`controlPlaneNamespaces`, `adoptFips`) as a JSON array of
                // strings: the same as its comma-separated form.
                serde_json::Value::Array(items) => items
                    .iter()
                    .map(|i| i.as_str().map(str::to_owned).ok_or(()))
                    .collect::<Result<Vec<_>, ()>>()
                    .map(|v| v.join(","))
                    .map_err(|()| "must be a string, number, boolean or list of strings".to_owned()),
                _ => Err("must be a string, number, boolean or list of strings".to_owned()),
            };
            (k.to_ascii_lowercase(), (path.to_owned(), k, text))
        })
        .collect();
    FileValues { entries }
}
