use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser;
use rstest::rstest;

use super::*;
use baton_core::LoadBalancerMode;

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    config: ConfigArgs,
}

fn args(flags: &[String]) -> ConfigArgs {
    let argv = std::iter::once("baton".to_owned()).chain(flags.iter().cloned());
    Flags::try_parse_from(argv).expect("flags parse").config
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// [`env`], for where a local variable of that name hides it.
fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    env(pairs)
}

fn write_file(dir: &Path, json: &serde_json::Value) -> std::path::PathBuf {
    let path = dir.join("cloud-sa.json");
    std::fs::write(&path, serde_json::to_string(json).unwrap()).unwrap();
    path
}

/// Three distinct valid values per setting (for flag, env, file) and one invalid one. The match
/// is exhaustive: a new setting does not compile until it has samples here.
fn samples(id: Id) -> ([&'static str; 3], Option<&'static str>) {
    match id {
        Id::Cloud => (["hetzner", "cherry", "hcloud"], Some("aws")),
        Id::HcloudToken => (["token-flag", "token-env", "token-file"], None),
        Id::HcloudEndpoint => (
            [
                "http://127.0.0.1:4/v1",
                "http://127.0.0.1:5/v1",
                "https://hcloud.example/v1",
            ],
            Some("file:///x"),
        ),
        Id::ApiKey => (["key-flag", "key-env", "key-file"], None),
        Id::ProjectId => (["111", "222", "333"], Some("12ab")),
        Id::Region => (["LT-Siauliai", "NL-Amsterdam", "DE-Frankfurt"], None),
        Id::BaseUrl => (
            [
                "http://127.0.0.1:1",
                "http://127.0.0.1:2",
                "https://sim.example:3",
            ],
            Some("ftp://x"),
        ),
        Id::LoadBalancer => (
            [
                "kube-vip://",
                "metallb:///lb/?bgp-peer-mode=frr",
                "empty://?ip-annotation=x.io/ip",
            ],
            Some("haproxy://"),
        ),
        Id::AnnotationLocalAsn
        | Id::AnnotationPeerAsn
        | Id::AnnotationPeerIp
        | Id::AnnotationSrcIp
        | Id::AnnotationMultiHop => (
            ["a.io/p-{{n}}-x", "b.io/p-{{n}}-x", "c.io/p-{{n}}-x"],
            Some("a.io/no-index"),
        ),
        Id::AnnotationFipRegion => (["a.io/region", "b.io/region", "c.io/region"], Some("bad key/x/y")),
        Id::FipTag => (["cp=flag", "cp=env", "cp=file"], Some("=novalue")),
        Id::InitializeNodes => (["true", "false", "auto"], Some("sometimes")),
        Id::ApiServerPort => (["6443", "443", "8443"], Some("70000")),
        Id::ControlPlaneNamespaces => (["apps", "kube-system,tenants", "infra"], Some("Bad_NS")),
        Id::AdoptFips => (
            ["203.0.113.1", "203.0.113.2,203.0.113.3", "2001:db8::1"],
            Some("203.0.113"),
        ),
        Id::ServiceAllocationNamespaces => (["apps", "web,shop", "tenant-a"], Some("Bad_NS")),
        Id::ServiceAllocationNamespaceSelector => (
            ["team=web", "team in (web,shop)", "baton.dev/addresses"],
            Some("a b=c"),
        ),
        Id::SniRouterPort => (["443", "8443", "9443"], Some("70000")),
        Id::BgpNodeSelector => (["bgp=flag", "bgp=env", "bgp in (file)"], Some("a b=c")),
        Id::BgpPrefixLimit => (["10", "1", "250"], Some("-3")),
        Id::FipHealthCheckUseHostIp => (["true", "1", "True"], Some("yes")),
        Id::ApiRateLimit => (["10", "2.5", "0"], Some("-1")),
        Id::ApiTimeout => (["5s", "250ms", "1m"], Some("soon")),
        Id::LoopStallLimit => (["0", "30s", "5m"], Some("forever")),
        Id::FipReleaseGracePeriod => (["0", "30s", "1h"], Some("ten minutes")),
        Id::Prefix => (["one", "two", "three"], Some("Bad_Prefix")),
        Id::HealthCheckPath => (["/readyz", "/healthz", "/livez"], Some("readyz")),
        Id::HealthCheckInterval
        | Id::HealthCheckTimeout
        | Id::LeaseDuration
        | Id::LeaseRenewDeadline
        | Id::LeaseRenewInterval => (["100ms", "1s", "2s"], Some("0s")),
        Id::HealthCheckRise | Id::HealthCheckFall => (["1", "2", "5"], Some("0")),
    }
}

fn file_json(s: &Setting, value: &str) -> serde_json::Value {
    // Numbers and booleans go in as JSON numbers/booleans, as in real cloud-sa.json files.
    let v = match s.id {
        Id::ProjectId
        | Id::ApiServerPort
        | Id::SniRouterPort
        | Id::HealthCheckRise
        | Id::HealthCheckFall
        | Id::BgpPrefixLimit => serde_json::Value::from(value.parse::<u64>().unwrap()),
        Id::FipHealthCheckUseHostIp if value == "True" => serde_json::Value::Bool(true),
        _ => serde_json::Value::from(value),
    };
    serde_json::json!({ s.file_key: v })
}

/// (flags, environment, expected raw value, layer name)
type Layer<'a> = (
    &'a [String],
    &'a BTreeMap<String, String>,
    Option<&'a str>,
    &'a str,
);

#[test]
fn precedence_is_flag_then_env_then_file_then_default_for_every_setting() {
    let dir = tempfile::tempdir().unwrap();
    for s in SETTINGS {
        let ([flag_v, env_v, file_v], _) = samples(s.id);
        let path = write_file(dir.path(), &file_json(s, file_v));
        let flag = vec![format!("--{}", s.flag), flag_v.to_owned()];
        let file_flag = vec!["--cloud-config".to_owned(), path.display().to_string()];
        let all = [flag.clone(), file_flag.clone()].concat();
        let e = env(&[(s.env, env_v)]);
        let none = env(&[]);

        let cases: [Layer<'_>; 4] = [
            (&all, &e, Some(flag_v), "flag"),
            (&file_flag, &e, Some(env_v), "env"),
            (&file_flag, &none, Some(file_v), "file"),
            (&[], &none, s.default, "default"),
        ];
        for (argv, env, want, layer) in cases {
            if s.secret && layer == "flag" {
                // A secret's flag is refused (the_api_key_flag_is_refused_naming_where_to_put_it).
                assert!(Config::resolve(&args(argv), env).is_err(), "{}", s.file_key);
                continue;
            }
            let cfg =
                Config::resolve(&args(argv), env).unwrap_or_else(|e| panic!("{} ({layer}): {e}", s.file_key));
            let source = &cfg.sources[&s.id];
            let expected_source = match layer {
                "flag" => Source::Flag {
                    flag: s.flag.to_owned(),
                },
                "env" => Source::Env {
                    var: s.env.to_owned(),
                },
                "file" => Source::File {
                    path: path.clone(),
                    key: s.file_key.to_owned(),
                },
                _ if s.default.is_some() => Source::Default,
                _ => Source::Unset,
            };
            assert_eq!(source, &expected_source, "{} from {layer}", s.file_key);
            // The parsed value is the one from that layer: compare through a fresh parse of
            // the expected raw value given in the environment (same parser, known-good source).
            let shown = cfg.display_value(s.id);
            let reference = want.map(|w| {
                let cfg = Config::resolve(&args(&[]), &env_of(&[(s.env, w)])).unwrap();
                cfg.display_value(s.id)
            });
            assert_eq!(
                Some(shown),
                reference.or(Some(None)),
                "{} from {layer}",
                s.file_key
            );
        }
    }
}

#[test]
fn every_invalid_value_is_rejected_naming_key_source_and_value() {
    let dir = tempfile::tempdir().unwrap();
    for s in SETTINGS {
        let (_, Some(bad)) = samples(s.id) else { continue };
        // From a flag, from the environment and from the file.
        let path = write_file(dir.path(), &serde_json::json!({ s.file_key: bad }));
        let layers: [(Vec<String>, BTreeMap<String, String>, String); 3] = [
            (
                vec![format!("--{}", s.flag), bad.to_owned()],
                env(&[]),
                format!("flag --{}", s.flag),
            ),
            (vec![], env(&[(s.env, bad)]), format!("env {}", s.env)),
            (
                vec!["--cloud-config".into(), path.display().to_string()],
                env(&[]),
                format!("file {} key {}", path.display(), s.file_key),
            ),
        ];
        for (argv, env, source) in layers {
            let err = Config::resolve(&args(&argv), &env)
                .expect_err(&format!("{} = {bad:?} must fail", s.file_key));
            let msg = err.to_string();
            assert!(msg.contains(s.file_key), "{msg}");
            assert!(msg.contains(&source), "{msg} should name {source}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg} should quote the value");
        }
    }
}

#[test]
fn all_errors_are_reported_at_once() {
    let e = env(&[
        ("CHERRY_PROJECT_ID", "x"),
        ("CHERRY_FIP_TAG", "=y"),
        ("BATON_PREFIX", "UP"),
    ]);
    let ConfigError::Invalid(errors) = Config::resolve(&args(&[]), &e).unwrap_err() else {
        panic!("expected Invalid")
    };
    let keys: Vec<_> = errors.iter().map(|e| e.key).collect();
    assert_eq!(keys.len(), 3, "{keys:?}");
    for k in ["projectID", "fipTag", "prefix"] {
        assert!(keys.contains(&k), "{keys:?}");
    }
}

#[rstest]
#[case(serde_json::json!({"projectID": 123_456}))]
#[case(serde_json::json!({"projectID": "123456"}))]
#[case(serde_json::json!({"projectId": 123_456}))]
#[case(serde_json::json!({"PROJECTID": "123456"}))]
fn project_id_is_a_number_or_a_string_of_digits_under_either_spelling(#[case] json: serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), &json);
    let cfg = Config::resolve(
        &args(&["--cloud-config".into(), path.display().to_string()]),
        &env(&[]),
    )
    .unwrap();
    assert_eq!(cfg.project_id, Some(123_456));
}

#[test]
fn the_ccm_secret_example_loads_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        &serde_json::json!({"apiKey":"<token>","projectID":123_456,"loadbalancer":"metallb:///metallb-system/",
            "region":"LT-Siauliai","fipTag":"cluster=my-cp"}),
    );
    let cfg = Config::resolve(
        &args(&["--cloud-config".into(), path.display().to_string()]),
        &env(&[]),
    )
    .unwrap();
    assert_eq!(cfg.require_api_key().unwrap().expose(), "<token>");
    assert_eq!(cfg.require_project_id().unwrap(), 123_456);
    assert_eq!(cfg.region.as_deref(), Some("LT-Siauliai"));
    assert_eq!(cfg.fip_tag.unwrap().to_string(), "cluster=my-cp");
    assert!(matches!(
        cfg.load_balancer,
        Some(LoadBalancerMode::MetalLb { .. })
    ));
    assert_eq!(cfg.base_url.as_str(), "https://api.cherryservers.com/");
}

#[test]
fn invalid_json_and_wrong_types_in_the_file_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud-sa.json");
    // The CCM README's own example has a leading zero: invalid JSON.
    std::fs::write(&path, r#"{"apiKey":"k","projectID":0123456789}"#).unwrap();
    let err = Config::resolve(
        &args(&["--cloud-config".into(), path.display().to_string()]),
        &env(&[]),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::ParseFile { .. }), "{err}");
    assert!(err.to_string().contains("cloud-sa.json"));

    let path = write_file(dir.path(), &serde_json::json!({"fipTag": {"k": "v"}}));
    let err = Config::resolve(
        &args(&["--cloud-config".into(), path.display().to_string()]),
        &env(&[]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("fipTag"), "{err}");

    let err = Config::resolve(
        &args(&["--cloud-config".into(), "/nonexistent/cloud-sa.json".into()]),
        &env(&[]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/cloud-sa.json"), "{err}");
}

#[test]
fn empty_values_count_as_unset() {
    let e = env(&[("CHERRY_REGION_NAME", ""), ("CHERRY_FIP_TAG", "  ")]);
    let cfg = Config::resolve(&args(&[]), &e).unwrap();
    assert_eq!(cfg.region, None);
    assert_eq!(cfg.fip_tag, None);
    assert_eq!(cfg.sources[&Id::Region], Source::Unset);
}

#[test]
fn cloud_config_path_also_comes_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), &serde_json::json!({"region": "LT-Siauliai"}));
    let e = env(&[("BATON_CLOUD_CONFIG", &path.display().to_string())]);
    assert_eq!(
        Config::resolve(&args(&[]), &e).unwrap().region.as_deref(),
        Some("LT-Siauliai")
    );
}

#[test]
fn missing_required_settings_name_every_way_to_set_them() {
    let cfg = Config::resolve(&args(&[]), &env(&[])).unwrap();
    let msg = cfg.require_api_key().unwrap_err().to_string();
    for part in ["apiKey", "CHERRY_API_KEY"] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(!msg.contains("--api-key"), "a refused flag is not offered: {msg}");
    let msg = cfg.require_project_id().unwrap_err().to_string();
    for part in ["projectID", "--project-id", "CHERRY_PROJECT_ID"] {
        assert!(msg.contains(part), "{msg}");
    }
}

/// `--api-key` on a command line is readable by every local user (`ps`, /proc/<pid>/cmdline):
/// refused, whatever else is set, with a message naming the variable and the file key to use and
/// never the value.
#[rstest]
#[case::alone(&[])]
#[case::with_the_env_set_too(&[("CHERRY_API_KEY", "other")])]
fn the_api_key_flag_is_refused_naming_where_to_put_it(#[case] vars: &[(&str, &str)]) {
    let err = Config::resolve(&args(&["--api-key".into(), SECRET.into()]), &env(vars)).unwrap_err();
    let msg = err.to_string();
    for part in [
        "--api-key",
        "CHERRY_API_KEY",
        "apiKey",
        "--cloud-config",
        "/proc/<pid>/cmdline",
    ] {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }
    assert!(!msg.contains(SECRET), "{msg}");
    assert!(matches!(err, ConfigError::Invalid(_)), "exit code 2: {err:?}");
}

const SECRET: &str = "s3cr3t-api-key-value";

#[rstest]
#[case(OutputFormat::Text)]
#[case(OutputFormat::Json)]
fn config_show_never_prints_the_api_key(#[case] output: OutputFormat) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        &serde_json::json!({"apiKey": SECRET, "projectID": 7, "bogusKey": 1}),
    );
    let argv = ["--cloud-config".into(), path.display().to_string()];
    for (argv, env) in [
        (vec![], env(&[("CHERRY_API_KEY", SECRET)])),
        (argv.to_vec(), env(&[])),
    ] {
        let text = show(&args(&argv), &FlagArgs::default(), &env, output).unwrap();
        assert!(!text.contains(SECRET), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
        assert!(text.contains("apiKey"), "{text}");
    }
    let text = show(&args(&argv), &FlagArgs::default(), &env(&[]), output).unwrap();
    assert!(text.contains("bogusKey"), "unknown keys are reported: {text}");
}

#[test]
fn secrets_stay_out_of_errors_and_debug_output() {
    // An invalid value of another setting next to a secret: the error lists only that one.
    let e = env(&[("CHERRY_API_KEY", SECRET), ("CHERRY_PROJECT_ID", "nope")]);
    let err = Config::resolve(&args(&[]), &e).unwrap_err();
    assert!(!err.to_string().contains(SECRET));
    let a = args(&["--api-key".into(), SECRET.into()]);
    assert!(!format!("{a:?}").contains(SECRET));
    let err = Config::resolve(&a, &env(&[])).unwrap_err();
    assert!(!err.to_string().contains(SECRET));
    assert!(!format!("{err:?}").contains(SECRET));
    let cfg = Config::resolve(&args(&[]), &env(&[("CHERRY_API_KEY", SECRET)])).unwrap();
    assert!(!format!("{cfg:?}").contains(SECRET));
    assert!(!serde_json::to_string(&cfg).unwrap().contains(SECRET));
}

#[test]
fn settings_table_is_consistent() {
    let mut flags = std::collections::BTreeSet::new();
    let mut envs = std::collections::BTreeSet::new();
    let mut keys = std::collections::BTreeSet::new();
    for s in SETTINGS {
        assert!(flags.insert(s.flag), "duplicate flag {}", s.flag);
        assert!(envs.insert(s.env), "duplicate env {}", s.env);
        assert!(
            keys.insert(s.file_key.to_ascii_lowercase()),
            "duplicate file key {}",
            s.file_key
        );
        assert!(
            s.env.starts_with("CHERRY_") || s.env.starts_with("BATON_") || s.env.starts_with("HCLOUD_"),
            "{}",
            s.env
        );
        // Every default parses.
        if let Some(d) = s.default {
            Config::resolve(&args(&[format!("--{}", s.flag), d.to_owned()]), &env(&[]))
                .unwrap_or_else(|e| panic!("default of {}: {e}", s.file_key));
        }
    }
}

#[test]
fn docs_configuration_md_carries_the_current_reference_table() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    assert!(
        doc.contains(&reference()),
        "docs/configuration.md is out of date: regenerate its table with `baton config reference`"
    );
}

/// The subcommands define these flags themselves; the table that `config show` reads must say
/// the same flag, environment variable and default as they do.
#[test]
fn flags_table_matches_the_subcommands_that_take_them() {
    use clap::CommandFactory as _;
    let cli = crate::cli::Cli::command();
    for f in FLAGS {
        for cmd in f.used_by {
            let sub = cli
                .find_subcommand(cmd)
                .unwrap_or_else(|| panic!("no subcommand {cmd}"));
            let arg = sub
                .get_arguments()
                .find(|a| a.get_long() == Some(f.flag))
                .unwrap_or_else(|| panic!("`baton {cmd}` has no --{}", f.flag));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(f.env),
                "--{} of baton {cmd}",
                f.flag
            );
            let defaults: Vec<&str> = arg
                .get_default_values()
                .iter()
                .filter_map(|v| v.to_str())
                .collect();
            assert_eq!(
                defaults,
                f.default.into_iter().collect::<Vec<_>>(),
                "--{} of baton {cmd}",
                f.flag
            );
        }
    }
}

#[test]
fn config_show_lists_the_flags_outside_the_settings_with_their_source() {
    #[derive(Parser)]
    struct ShowFlags {
        #[command(flatten)]
        flags: FlagArgs,
    }
    let flags = ShowFlags::try_parse_from(["baton", "--identity", "pod-a"])
        .unwrap()
        .flags;
    let e = env(&[("KUBECONFIG", "/etc/kubeconfig"), ("BATON_CLUSTER_CA", "")]);
    let text = show(&args(&[]), &flags, &e, OutputFormat::Text).unwrap();
    for line in [
        "--kubeconfig                /etc/kubeconfig  (env KUBECONFIG)",
        "--identity                  pod-a  (flag --identity)",
        "--admin-listen              127.0.0.1:9590  (default)",
        "--health-check-server-name  kubernetes.default.svc  (default)",
        "--cluster-ca                <unset>  (unset)",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&show(&args(&[]), &flags, &e, OutputFormat::Json).unwrap()).unwrap();
    assert_eq!(
        json["flags"][0],
        serde_json::json!({"flag": "kubeconfig", "value": "/etc/kubeconfig", "source": {"kind": "env", "var": "KUBECONFIG"}})
    );
}
