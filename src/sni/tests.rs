use clap::Parser;

use crate::cli::{Cli, Command};

use super::*;

fn serve_args(args: &[&str]) -> ServeArgs {
    let cli = Cli::try_parse_from([&["baton", "sni", "serve"], args].concat()).unwrap();
    let Command::Sni(SniArgs {
        command: SniCommand::Serve(serve),
    }) = cli.command
    else {
        panic!("not sni serve")
    };
    serve
}

#[test]
fn flags_give_routes() {
    let args = serve_args(&[
        "--listen",
        "127.0.0.1:8443",
        "--route",
        "api.t1.example.com=127.0.0.1:6443,127.0.0.1:6444",
        "--route",
        "api.t2.example.com=127.0.0.1:7443",
        "--default",
        "127.0.0.1:9443",
        "--proxy-route",
        "10.96.0.1=api.t1.example.com",
    ]);
    let spec = flag_routes(&args).unwrap();
    assert_eq!(spec.tenants.len(), 2);
    assert_eq!(spec.default.len(), 1);
    assert_eq!(spec.destinations.len(), 1);
}

#[test]
fn a_bad_route_names_the_flag_and_value() {
    let args = serve_args(&["--route", "api.t1.example.com=nowhere"]);
    let e = flag_routes(&args).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--route \"api.t1.example.com=nowhere\": \"nowhere\" is not IP:PORT"
    );
}

#[tokio::test]
async fn serve_needs_a_listener_and_sane_bounds() {
    let e = run_serve(serve_args(&["--route", "a.b=127.0.0.1:1"]))
        .await
        .unwrap_err();
    assert!(e.is_config());
    assert!(e.to_string().starts_with("--listen"), "{e}");
    let e = run_serve(serve_args(&[
        "--listen",
        "127.0.0.1:0",
        "--max-hello-bytes",
        "10",
    ]))
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--max-hello-bytes 10: must be between 512 and 1048576"
    );
}

#[test]
fn the_command_line_is_consistent() {
    use clap::CommandFactory as _;
    Cli::command().debug_assert();
    let e = Cli::try_parse_from(["baton", "sni", "serve", "--dns-listen", "127.0.0.1:53"]).unwrap_err();
    assert!(e.to_string().contains("--dns-zone"), "{e}");
}

#[test]
fn dns_names_are_the_routed_hosts_inside_the_zone() {
    let mut spec = RouteSpec::default();
    spec.add_route("api.t1.example.com,api.t1.internal=127.0.0.1:1")
        .unwrap();
    spec.add_route("api.t2.example.com=127.0.0.1:2").unwrap();
    let table = spec.build(&Health::default());
    let zone: baton_dns::DnsName = "example.com".parse().unwrap();
    let names: Vec<String> = dns::names(&table, &zone)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.contains("example.com")), "{names:?}");
}

#[tokio::test]
async fn every_thread_listens_on_the_same_port_and_connections_come_without_nagle() {
    let per_thread = bind_all(&["127.0.0.1:0".parse().unwrap()], &[], 3).unwrap();
    assert_eq!(per_thread.len(), 3);
    let ports: Vec<u16> = per_thread
        .iter()
        .map(|own| own[0].0.local_addr().unwrap().port())
        .collect();
    assert!(ports.iter().all(|p| *p == ports[0] && *p != 0), "{ports:?}");
    // The router does not set TCP_NODELAY per connection: accepted sockets must inherit it.
    let listeners: Vec<TcpListener> = per_thread
        .into_iter()
        .map(|mut own| TcpListener::from_std(own.remove(0).0).unwrap())
        .collect();
    let addr = listeners[0].local_addr().unwrap();
    let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let accepted = futures::future::select_all(listeners.iter().map(|l| Box::pin(l.accept())))
        .await
        .0
        .unwrap()
        .0;
    assert!(accepted.nodelay().unwrap());
}
