//! Logging: `tracing` with an `EnvFilter` (`RUST_LOG`), as text or JSON, to stderr.
//!
//! Lines fit where they go: ANSI colour only when stderr is a terminal (and `NO_COLOR` is not
//! set), so a file, a pipe, journald (the systemd unit) or a pod's log gets plain lines.
//! `--log-color always|never` overrides the detection; `--log-format json` is never coloured.

use std::io::IsTerminal as _;

use clap::{Args, ValueEnum};

/// Log output options, shared by every subcommand.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, global = true, env = "BATON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter, in `RUST_LOG` syntax (e.g. `info,baton=debug`). The default keeps
    /// per-request logging of the libraries (hickory's per-query lines, kube-client's ERROR line
    /// for every failed request, which its caller reports anyway) off.
    #[arg(
        long,
        global = true,
        env = "BATON_LOG",
        default_value = "info,hickory_server=warn,hickory_proto=warn,kube_client::client::builder=off"
    )]
    pub log: String,

    /// Colour in text logs: `auto` (only when stderr is a terminal and `NO_COLOR` is unset),
    /// `always` or `never`.
    #[arg(long, global = true, env = "BATON_LOG_COLOR", value_enum, default_value_t = LogColor::Auto)]
    pub log_color: LogColor,
}

/// When text log lines carry ANSI colour codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogColor {
    /// Only on a terminal, unless `NO_COLOR` is set (<https://no-color.org>).
    Auto,
    /// Always (e.g. a pager that understands colour).
    Always,
    /// Never.
    Never,
}

/// Whether to write ANSI colour: a pure decision from the choice, whether stderr is a terminal
/// and the value of `NO_COLOR` (set and non-empty disables colour).
pub fn use_color(choice: LogColor, stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    match choice {
        LogColor::Always => true,
        LogColor::Never => false,
        LogColor::Auto => stderr_is_terminal && no_color.is_none_or(std::ffi::OsStr::is_empty),
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Why logging cannot start.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LogError(String);

/// Installs the global subscriber, writing to stderr. `RUST_LOG` overrides `--log`.
pub fn init(args: &LogArgs) -> Result<(), LogError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .map_err(|e| LogError(format!("invalid log filter {:?}: {e}", args.log)))?;
    let no_color = std::env::var_os("NO_COLOR");
    let ansi = use_color(
        args.log_color,
        std::io::stderr().is_terminal(),
        no_color.as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = match args.log_format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).try_init(),
    };
    res.map_err(|e| LogError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::{LogColor, use_color};

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let none = None;
        let set = Some(OsStr::new("1"));
        let empty = Some(OsStr::new(""));
        for (choice, terminal, no_color, want) in [
            (LogColor::Auto, true, none, true),
            (LogColor::Auto, false, none, false), // file, pipe, journald
            (LogColor::Auto, true, set, false),
            (LogColor::Auto, true, empty, true), // an empty NO_COLOR is "unset"
            (LogColor::Always, false, set, true),
            (LogColor::Never, true, none, false),
        ] {
            assert_eq!(
                use_color(choice, terminal, no_color),
                want,
                "{choice:?} {terminal} {no_color:?}"
            );
        }
    }
}
