//! The `baton` binary: parse arguments, run, map the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = baton::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(baton::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `baton status` already printed its report; its exit code is the verdict.
            if !matches!(e, baton::Error::Status(_)) {
                eprintln!("baton: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
