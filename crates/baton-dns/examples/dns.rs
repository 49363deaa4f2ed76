//! `baton dns …` as a stand-alone binary, for the benchmark and for debugging:
//! `cargo run --release -p baton-dns --example dns -- serve --listen 127.0.0.1:5300 --zone c1.example.com --a api=192.0.2.10`.

use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    dns: baton_dns::cli::DnsArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match baton_dns::cli::run(cli.dns).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
