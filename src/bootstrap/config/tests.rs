use std::path::Path;

use rstest::rstest;

use super::*;

/// A self-signed CA in PEM (any certificate will do for parsing).
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBcjCCARigAwIBAgIUQv5vK8YlU0y0u9C8y1r0S7bq0y0wCgYIKoZIzj0EAwIw
DzENMAsGA1UEAwwEdGVzdDAeFw0yNDAxMDEwMDAwMDBaFw0zNDAxMDEwMDAwMDBa
MA8xDTALBgNVBAMMBHRlc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQx0Qx0
-----END CERTIFICATE-----
";

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), CA_PEM).unwrap();
        std::fs::write(
            dir.path().join("extra.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: baton-system\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: baton-system\ndata: {a: b}\n",
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn parse(&self, yaml: &str) -> Result<BootstrapConfig, ConfigFileError> {
        BootstrapConfig::parse(&self.path().join("bootstrap.yaml"), yaml)
    }
}

const GOOD: &str = r"
cluster: {name: c1, baseDomain: example.com, infraId: c1-x7k2p}
bootstrapHost: {publicAddress: 198.51.100.10, privateAddress: 192.0.2.10}
cloud: {projectID: 123456, region: LT-Siauliai}
kubernetes: {kubeconfig: kubeconfig, clusterCA: ca.crt}
endpoints:
  - name: api
    fip: {tag: cluster=c1-api}
    service: {namespace: openshift-kube-apiserver, name: api}
  - name: api-int
    fip: {reserve: true}
    service:
      namespace: openshift-kube-apiserver
      name: api-int
      ports: [{name: https, port: 6443, targetPort: 6443}]
    publish: private
dns: {mode: embedded, listen: [192.0.2.10, '192.0.2.10:5353'], ttl: 5}
timeouts: {bootstrapApi: 10m, servicesReady: 30s}
handoff: {manifests: [extra.yaml]}
stateFile: state.json
";

#[test]
fn a_good_config_parses_into_types() {
    let d = Dir::new();
    let cfg = d.parse(GOOD).unwrap();
    assert_eq!(cfg.cluster.name, "c1");
    assert_eq!(cfg.dns.zone.as_str(), "c1.example.com");
    assert_eq!(cfg.endpoints[0].dns_name.as_str(), "api.c1.example.com");
    assert_eq!(cfg.endpoints[1].dns_name.as_str(), "api-int.c1.example.com");
    assert!(matches!(cfg.endpoints[0].fip, FipSource::Tag(_)));
    assert_eq!(cfg.endpoints[1].fip, FipSource::Reserve);
    assert_eq!(cfg.endpoints[0].service.ports[0].port, 6443);
    assert_eq!(cfg.bootstrap_address(Publish::Private).to_string(), "192.0.2.10");
    assert_eq!(cfg.kubernetes.api_server_name, "api-int.c1.example.com");
    assert_eq!(cfg.kubernetes.api_server_port, 6443);
    assert_eq!(cfg.timeouts.services_ready, Duration::from_secs(30));
    assert_eq!(cfg.dns.ttl, 5);
    let DnsMode::Embedded { listen } = &cfg.dns.mode else {
        panic!("embedded")
    };
    assert_eq!(listen[0].to_string(), "192.0.2.10:53");
    assert_eq!(listen[1].to_string(), "192.0.2.10:5353");
    assert_eq!(cfg.manifests.len(), 2, "empty documents are skipped");
    assert_eq!(cfg.state_file, d.path().join("state.json"));
    assert_eq!(cfg.kubernetes.kubeconfig, Some(d.path().join("kubeconfig")));
    assert!(cfg.reserves());
}

#[test]
fn json_is_accepted_too() {
    let d = Dir::new();
    let json = r#"{"cluster":{"name":"c1","baseDomain":"example.com","infraId":"i"},
      "bootstrapHost":{"publicAddress":"198.51.100.10"},"cloud":{"projectID":"1"},
      "kubernetes":{"clusterCA":"ca.crt"},"dns":{"mode":"none"},
      "endpoints":[{"name":"api","fip":{"address":"203.0.113.9"},"service":{"namespace":"default","name":"api"}}]}"#;
    let cfg = d.parse(json).unwrap();
    assert_eq!(
        cfg.endpoints[0].fip,
        FipSource::Address("203.0.113.9".parse().unwrap())
    );
    assert!(matches!(cfg.dns.mode, DnsMode::None));
}

fn errors_of(d: &Dir, yaml: &str) -> Vec<String> {
    match d.parse(yaml) {
        Err(ConfigFileError::Invalid { errors, .. }) => errors.iter().map(ToString::to_string).collect(),
        Err(e) => vec![e.to_string()],
        Ok(_) => vec![],
    }
}

#[rstest]
#[case::missing_cluster_name("cluster: {name: c1, ", "cluster: {", "cluster.name: required")]
#[case::bad_public_address(
    "publicAddress: 198.51.100.10",
    "publicAddress: 198.51.100.300",
    "bootstrapHost.publicAddress: \"198.51.100.300\" is not an IP address"
)]
#[case::bad_fip_address(
    "fip: {tag: cluster=c1-api}",
    "fip: {address: 203.0.113}",
    "endpoints[0].fip.address"
)]
#[case::two_fip_sources(
    "fip: {tag: cluster=c1-api}",
    "fip: {tag: a=b, reserve: true}",
    "endpoints[0].fip: give exactly one of"
)]
#[case::bad_dns_mode("mode: embedded", "mode: bind", "dns.mode: \"bind\"")]
#[case::bad_listen("'192.0.2.10:5353'", "'192.0.2.10:99999'", "dns.listen[1]")]
#[case::bad_ttl("ttl: 5", "ttl: 0", "dns.ttl")]
#[case::bad_timeout("bootstrapApi: 10m", "bootstrapApi: soon", "timeouts.bootstrapApi")]
#[case::bad_port(
    "targetPort: 6443",
    "targetPort: 70000",
    "endpoints[1].service.ports[0].targetPort"
)]
#[case::missing_ca("clusterCA: ca.crt", "clusterCA: nope.crt", "kubernetes.clusterCA")]
#[case::unknown_key("stateFile: state.json", "statefile: state.json", "unknown field `statefile`")]
#[case::bad_manifest(
    "manifests: [extra.yaml]",
    "manifests: [missing.yaml]",
    "handoff.manifests[0]"
)]
#[case::bad_service_name("name: api}", "name: API}", "endpoints[0].service.name")]
fn a_bad_field_is_named(#[case] from: &str, #[case] to: &str, #[case] expect: &str) {
    let d = Dir::new();
    assert!(GOOD.contains(from), "{from}");
    let errors = errors_of(&d, &GOOD.replacen(from, to, 1));
    assert!(
        errors.iter().any(|e| e.contains(expect)),
        "want {expect:?} in {errors:#?}"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let d = Dir::new();
    let errors = errors_of(&d, "cluster: {name: C1}\nendpoints: []\n");
    for want in [
        "cluster.name: \"C1\" is not a lowercase DNS label",
        "cluster.baseDomain: required",
        "cluster.infraId: required",
        "bootstrapHost: required",
        "cloud: required",
        "kubernetes: required",
        "endpoints: at least one endpoint",
        "dns.listen: required",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "want {want:?} in {errors:#?}"
        );
    }
}

#[test]
fn private_publish_needs_a_private_address_and_names_must_be_unique() {
    let d = Dir::new();
    let yaml = GOOD.replacen(", privateAddress: 192.0.2.10", "", 1).replacen(
        "name: api-int\n    fip",
        "name: api\n    fip",
        1,
    );
    let errors = errors_of(&d, &yaml);
    assert!(
        errors.iter().any(|e| e.contains("endpoints[1].publish")),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("endpoints[1].name: endpoint \"api\" is listed twice")),
        "{errors:#?}"
    );
}

#[test]
fn manifests_need_kind_and_name() {
    let err = parse_manifests(
        Path::new("m.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
    )
    .unwrap_err();
    assert!(err.contains("metadata.name is required"), "{err}");
    let err = parse_manifests(Path::new("m.yaml"), "metadata: {name: x}\n").unwrap_err();
    assert!(err.contains("m.yaml"), "{err}");
}

#[test]
fn the_shipped_example_is_valid_but_for_files_of_a_real_host() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bootstrap/bootstrap.example.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    match BootstrapConfig::parse(&path, &text) {
        Ok(_) => {}
        Err(ConfigFileError::Invalid { errors, .. }) => {
            // Only the host's files (CA, manifests) are missing here.
            for e in &errors {
                assert!(
                    e.field == "kubernetes.clusterCA" || e.field.starts_with("handoff.manifests["),
                    "{e}"
                );
            }
        }
        Err(e) => panic!("{e}"),
    }
}
