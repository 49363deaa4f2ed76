//! `baton config show` (every effective value and where it came from) and
//! `baton config reference` (the Markdown tables of docs/configuration.md), both from the table.

use std::fmt::Write as _;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use super::error::ConfigError;
use super::settings::{Config, ConfigArgs, FLAGS, FlagArgs, SETTINGS, Source};
use super::sources::{Env, flag_values};

/// `baton config …`
#[derive(Debug, Args)]
pub struct ConfigCommand {
    #[command(subcommand)]
    pub action: ConfigAction,
}

/// What to do with the configuration.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up; boxing buys nothing
pub enum ConfigAction {
    /// Print the effective configuration and where each value came from (secrets redacted).
    Show {
        #[command(flatten)]
        config: ConfigArgs,
        #[command(flatten)]
        flags: FlagArgs,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        output: OutputFormat,
    },
    /// Print the reference table of every setting (Markdown, as in docs/configuration.md).
    Reference,
}

/// Output formats of `baton config show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// One row of `baton config show`.
#[derive(Debug, Serialize)]
pub struct ShowRow {
    pub key: &'static str,
    pub value: Option<String>,
    pub source: Source,
}

/// One flag of `baton config show` read outside the layered configuration.
#[derive(Debug, Serialize)]
pub struct FlagRow {
    pub flag: &'static str,
    pub value: Option<String>,
    pub source: Source,
}

impl ConfigCommand {
    /// Runs the command, printing to stdout.
    pub fn run(self, env: &dyn Env) -> Result<(), ConfigError> {
        let text = match self.action {
            ConfigAction::Show {
                config,
                flags,
                output,
            } => show(&config, &flags, env, output)?,
            ConfigAction::Reference => reference(),
        };
        print!("{text}");
        Ok(())
    }
}

/// Renders `baton config show`: the settings, then the flags read outside them.
pub fn show(
    args: &ConfigArgs,
    flags: &FlagArgs,
    env: &dyn Env,
    output: OutputFormat,
) -> Result<String, ConfigError> {
    let cfg = Config::resolve(args, env)?;
    let rows: Vec<ShowRow> = SETTINGS
        .iter()
        .map(|s| ShowRow {
            key: s.file_key,
            value: cfg.display_value(s.id),
            source: cfg.sources.get(&s.id).cloned().unwrap_or(Source::Unset),
        })
        .collect();
    let flag_rows: Vec<FlagRow> = flag_values(flags, env)
        .into_iter()
        .map(|(f, value, source)| FlagRow {
            flag: f.flag,
            value,
            source,
        })
        .collect();
    Ok(match output {
        OutputFormat::Json => {
            let doc = serde_json::json!({
                "settings": rows,
                "unknownFileKeys": cfg.unknown_file_keys,
                "flags": flag_rows,
            });
            format!("{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default())
        }
        OutputFormat::Text => {
            let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(0);
            let mut out = String::new();
            for r in &rows {
                let value = r.value.as_deref().unwrap_or("<unset>");
                let _ = writeln!(out, "{:width$}  {value}  ({})", r.key, r.source);
            }
            for k in &cfg.unknown_file_keys {
                let _ = writeln!(out, "warning: unknown key {k:?} in the config file is ignored");
            }
            // The flags have no file key: a block of their own, named by flag.
            let _ = writeln!(out, "\nflags read outside the settings above:");
            let width = flag_rows.iter().map(|r| r.flag.len() + 2).max().unwrap_or(0);
            for r in &flag_rows {
                let value = r.value.as_deref().unwrap_or("<unset>");
                let flag = format!("--{}", r.flag);
                let _ = writeln!(out, "{flag:width$}  {value}  ({})", r.source);
            }
            out
        }
    })
}

/// The Markdown reference tables: every setting, then every flag read outside them.
pub fn reference() -> String {
    let mut out = String::from(
        "| key (cloud-sa.json) | flag | environment | default | description |\n|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let default = s.default.map_or_else(|| "unset".to_owned(), |d| format!("`{d}`"));
        let flag = if s.secret {
            format!("none (`--{}` is refused)", s.flag)
        } else {
            format!("`--{}`", s.flag)
        };
        let _ = writeln!(
            out,
            "| `{}` | {flag} | `{}` | {default} | {}{} |",
            s.file_key,
            s.env,
            s.doc.replace('|', "\\|"),
            if s.secret { " (secret: never printed)" } else { "" },
        );
    }
    out.push_str(
        "\nThese flags are read by the subcommands that take them, outside the layers above (no \
         file key); `baton config show` lists them too.\n\n\
         | flag | environment | default | used by | description |\n|---|---|---|---|---|\n",
    );
    for f in FLAGS {
        let default = f.default.map_or_else(|| "unset".to_owned(), |d| format!("`{d}`"));
        let used_by: Vec<String> = f.used_by.iter().map(|c| format!("`baton {c}`")).collect();
        let _ = writeln!(
            out,
            "| `--{}` | `{}` | {default} | {} | {} |",
            f.flag,
            f.env,
            used_by.join(", "),
            f.doc.replace('|', "\\|"),
        );
    }
    out
}
