use clap::{CommandFactory, Parser};

use super::{DnsArgs, DnsCommand, parse_records, parse_server};
use baton_dns::DnsName;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    dns: DnsArgs,
}

fn zone() -> DnsName {
    "c1.example.com".parse().unwrap()
}

#[test]
fn verify_cli() {
    Cli::command().debug_assert();
}

#[test]
fn serve_parses_repeated_listen_and_records() {
    let cli = Cli::try_parse_from([
        "dns",
        "serve",
        "--listen",
        "127.0.0.1:5300",
        "--listen",
        "[::1]:5300",
        "--zone",
        "c1.example.com",
        "--a",
        "api=192.0.2.10,203.0.113.5",
        "--a",
        "api-int=192.0.2.10",
        "--ttl",
        "60",
    ])
    .unwrap();
    let DnsCommand::Serve(serve) = cli.dns.command else {
        panic!("not serve")
    };
    assert_eq!(serve.listen.len(), 2);
    assert_eq!(serve.records.ttl, 60);
    let snap = parse_records(&serve.records.zone, &serve.records.a).unwrap();
    let api: DnsName = "api.c1.example.com".parse().unwrap();
    assert_eq!(snap.get(&api).unwrap().served().len(), 2);
    assert_eq!(snap.len(), 2);
}

#[test]
fn push_requires_server_and_key_file() {
    assert!(Cli::try_parse_from(["dns", "push", "--zone", "z.example", "--a", "api=192.0.2.1"]).is_err());
    let cli = Cli::try_parse_from([
        "dns",
        "push",
        "--server",
        "192.0.2.53",
        "--zone",
        "c1.example.com",
        "--tsig-key-file",
        "/k",
        "--a",
        "api=192.0.2.1",
    ])
    .unwrap();
    let DnsCommand::Push(push) = cli.dns.command else {
        panic!("not push")
    };
    assert_eq!(push.server.port(), 53);
}

#[test]
fn server_addresses() {
    assert_eq!(parse_server("192.0.2.1").unwrap().to_string(), "192.0.2.1:53");
    assert_eq!(
        parse_server("192.0.2.1:5353").unwrap().to_string(),
        "192.0.2.1:5353"
    );
    assert_eq!(
        parse_server("[2001:db8::1]:54").unwrap().to_string(),
        "[2001:db8::1]:54"
    );
    assert_eq!(
        parse_server("2001:db8::1").unwrap().to_string(),
        "[2001:db8::1]:53"
    );
    assert!(parse_server("dns.example").is_err());
}

#[test]
fn bad_records_name_the_flag_and_value() {
    for (spec, needle) in [
        ("api", "expected NAME=IP"),
        ("api=192.0.2.300", "\"192.0.2.300\" is not an IP address"),
        ("www.example.org.=192.0.2.1", "not inside zone"),
        ("bad name=192.0.2.1", "invalid character"),
    ] {
        let err = parse_records(&zone(), &[spec.to_owned()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--a"), "{err}");
        assert!(err.contains(spec), "{err}");
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn repeated_names_merge() {
    let snap = parse_records(&zone(), &["api=192.0.2.1".into(), "api=2001:db8::1".into()]).unwrap();
    let api: DnsName = "api.c1.example.com".parse().unwrap();
    assert_eq!(snap.get(&api).unwrap().served_v6().len(), 1);
    assert_eq!(snap.get(&api).unwrap().served_v4().len(), 1);
}

#[test]
fn a_file_adds_names_to_the_flags_and_names_a_bad_line() {
    let dir = std::env::temp_dir().join(format!("baton-dns-a-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("records");
    std::fs::write(
        &file,
        "# the workers\n\nw1=10.0.0.1\n  w2=10.0.0.2,10.0.0.3  \napi=2001:db8::1\n",
    )
    .unwrap();
    let parse = |extra: &[&str]| {
        let mut argv = vec![
            "dns",
            "serve",
            "--listen",
            "127.0.0.1:5300",
            "--zone",
            "c1.example.com",
        ];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv)?;
        let DnsCommand::Serve(serve) = cli.dns.command else {
            panic!("not serve")
        };
        Ok::<_, clap::Error>(serve.records)
    };
    let file_arg = file.to_str().unwrap();
    let records = parse(&["--a", "api=192.0.2.1", "--a-file", file_arg]).unwrap();
    let snap = records.snapshot().unwrap();
    assert_eq!(snap.len(), 3);
    let api: DnsName = "api.c1.example.com".parse().unwrap();
    assert_eq!(snap.get(&api).unwrap().served().len(), 2, "a name in both merges");
    let w2: DnsName = "w2.c1.example.com".parse().unwrap();
    assert_eq!(snap.get(&w2).unwrap().served_v4().len(), 2);

    // The file alone is enough; neither is an error.
    assert_eq!(
        parse(&["--a-file", file_arg]).unwrap().snapshot().unwrap().len(),
        3
    );
    assert!(parse(&[]).is_err());

    std::fs::write(&file, "w1=10.0.0.1\nw3=not-an-ip\n").unwrap();
    let err = parse(&["--a-file", file_arg])
        .unwrap()
        .snapshot()
        .unwrap_err()
        .to_string();
    assert!(err.contains("w3=not-an-ip") && err.contains("not-an-ip"), "{err}");
    let missing = dir.join("missing");
    let err = parse(&["--a-file", missing.to_str().unwrap()])
        .unwrap()
        .snapshot()
        .unwrap_err()
        .to_string();
    assert!(err.contains("--a-file") && err.contains("missing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
