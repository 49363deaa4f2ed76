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
async fn a_thread_that_does_not_accept_leaves_its_connections_to_the_others() {
    // Three threads; the first never accepts (as if busy). Every connection, whichever socket
    // the kernel hashed it to, is still accepted by the others (the first's by the last).
    let mut per_thread = bind_all(&["127.0.0.1:0".parse().unwrap()], &[], 3).unwrap();
    let busy = per_thread.remove(0);
    assert_eq!(busy.len(), 2, "a thread holds its own socket and its neighbour's");
    let idle: Vec<TcpListener> = per_thread
        .into_iter()
        .flatten()
        .map(|(l, _)| TcpListener::from_std(l).unwrap())
        .collect();
    let addr = idle[0].local_addr().unwrap();
    let mut clients = Vec::new();
    for _ in 0..32 {
        clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut accepted = 0;
    while accepted < clients.len() {
        let next = futures::future::select_all(idle.iter().map(|l| Box::pin(l.accept())));
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .unwrap_or_else(|_| panic!("{accepted} of {} accepted", clients.len()))
            .0
            .unwrap();
        accepted += 1;
    }
    drop(busy);
}

#[tokio::test]
async fn every_thread_listens_on_the_same_port_and_connections_come_without_nagle() {
    let per_thread = bind_all(&["127.0.0.1:0".parse().unwrap()], &[], 3).unwrap();
    assert_eq!(per_thread.len(), 3);
    assert!(
        per_thread.iter().all(|own| own.len() == 2),
        "each thread holds its own socket and the next thread's"
    );
    let ports: Vec<u16> = per_thread
        .iter()
        .flatten()
        .map(|(l, _)| l.local_addr().unwrap().port())
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
    let sock = socket2::SockRef::from(&accepted);
    assert!(sock.keepalive().unwrap(), "keep-alive is inherited too");
    assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(60));
}

#[tokio::test]
async fn bad_caps_and_timeouts_name_the_flag() {
    for (args, want) in [
        (&["--max-pending", "0"][..], "--max-pending 0: must be at least 1"),
        (
            &["--idle-timeout-s", "0"][..],
            "--idle-timeout-s 0: must be at least 1",
        ),
        (
            &["--max-pending-bytes", "1000"][..],
            "--max-pending-bytes 1000: must be at least --max-hello-bytes",
        ),
    ] {
        let mut all = vec!["--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let e = run_serve(serve_args(&all)).await.unwrap_err();
        assert!(e.is_config());
        assert_eq!(e.to_string(), want);
    }
    let e = Cli::try_parse_from(["baton", "sni", "serve", "--proxy-tenant-tlv", "0x1FF"]).unwrap_err();
    assert!(e.to_string().contains("\"0x1FF\" is not a TLV type"), "{e}");
    let args = serve_args(&["--listen", "127.0.0.1:0", "--proxy-tenant-tlv", "0xEE"]);
    assert_eq!(check_limits(&args).unwrap().proxy_tenant_tlv, Some(0xEE));
    let args = serve_args(&["--listen", "127.0.0.1:0", "--proxy-tenant-tlv", "0"]);
    assert_eq!(check_limits(&args).unwrap().proxy_tenant_tlv, None);
}

#[test]
fn max_connections_fit_the_open_files_limit() {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    let args = serve_args(&["--listen", "127.0.0.1:0"]);
    let limits = fit_to_open_files(check_limits(&args).unwrap(), 2, 4);
    let fit = (soft - RESERVED_FDS - 4) / 2;
    assert_eq!(
        limits.caps.max_connections as u64,
        fit.min(DEFAULT_MAX_CONNECTIONS as u64),
        "two descriptors per connection, after the listening sockets'"
    );
    let args = serve_args(&["--listen", "127.0.0.1:0", "--max-connections", "100000000"]);
    let limits = fit_to_open_files(check_limits(&args).unwrap(), 2, 4);
    assert_eq!(limits.caps.max_connections as u64, fit, "lowered to what fits");
    let args = serve_args(&[
        "--listen",
        "127.0.0.1:0",
        "--splice",
        "--max-connections",
        "100000000",
    ]);
    let limits = fit_to_open_files(check_limits(&args).unwrap(), 2, 4);
    let fit = (soft - RESERVED_FDS - 4 - 2 * 2 * pump::PIPES_PER_THREAD as u64) / 2;
    assert_eq!(
        limits.caps.max_connections as u64, fit,
        "with --splice, two descriptors per connection after every thread's pipes"
    );
    // 64 threads on two addresses hold 256 listening descriptors: not taken from the reserve.
    let args = serve_args(&["--listen", "127.0.0.1:0", "--max-connections", "100000000"]);
    let limits = fit_to_open_files(check_limits(&args).unwrap(), 64, 256);
    assert_eq!(
        limits.caps.max_connections as u64,
        (soft - RESERVED_FDS - 256) / 2,
        "the listening sockets come before the connections"
    );
}
