//! What a person, an installer and systemd see while `baton bootstrap` runs.
//!
//! One [`Reporter`] receives every event and fans it out:
//!
//! ```text
//!              ┌─ terminal: live view on stderr (indicatif): the step, each Service, elapsed
//!   events ────┼─ plain:    timestamped lines on stderr (not a terminal)
//!              ├─ json:     one JSON object per line on stdout (installers)
//!              ├─ --status-file: the current step and each Service, rewritten atomically
//!              └─ sd_notify: READY=1 once DNS is published, STATUS=<step> (Type=notify)
//! ```
//!
//! The final summary (JSON) always goes to stdout. Nothing here ever holds a secret.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use clap::ValueEnum;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;
use tracing::warn;

use super::state::{Step, now_ms, write_atomic};
use super::steps::Readiness;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputMode {
    /// `terminal` when stderr is a terminal, else `plain`.
    Auto,
    /// A live view on stderr.
    Terminal,
    /// Timestamped lines on stderr.
    Plain,
    /// JSON events on stdout, one per line.
    Json,
}

/// One API Service's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceProgress {
    pub endpoint: String,
    pub service: String,
    pub fip: IpAddr,
    pub readiness: Readiness,
    pub waiting_for: &'static str,
}

struct Inner {
    step: Option<Step>,
    step_started: Instant,
    services: Vec<ServiceProgress>,
    dns: BTreeMap<String, Vec<IpAddr>>,
    /// No more `dns` events (the summary is out and nothing may follow it).
    dns_muted: bool,
    notified_ready: bool,
    multi: Option<MultiProgress>,
    step_bar: Option<ProgressBar>,
    service_bars: BTreeMap<String, (ProgressBar, Instant)>,
}

/// Fans events out to the chosen outputs.
pub struct Reporter {
    mode: OutputMode,
    status_file: Option<PathBuf>,
    started_ms: u64,
    started: Instant,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("mode", &self.mode)
            .field("status_file", &self.status_file)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    /// A reporter; `Auto` is resolved here.
    pub fn new(mode: OutputMode, status_file: Option<PathBuf>) -> Self {
        let mode = match mode {
            OutputMode::Auto if std::io::stderr().is_terminal() => OutputMode::Terminal,
            OutputMode::Auto => OutputMode::Plain,
            m => m,
        };
        let multi = (mode == OutputMode::Terminal)
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10)));
        Self {
            mode,
            status_file,
            started_ms: now_ms(),
            started: Instant::now(),
            inner: Mutex::new(Inner {
                step: None,
                step_started: Instant::now(),
                services: Vec::new(),
                dns: BTreeMap::new(),
                dns_muted: false,
                notified_ready: false,
                multi,
                step_bar: None,
                service_bars: BTreeMap::new(),
            }),
        }
    }

    /// The effective mode.
    pub fn mode(&self) -> OutputMode {
        self.mode
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// When the run started (Unix ms).
    pub fn started_ms(&self) -> u64 {
        self.started_ms
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn json_line(value: &serde_json::Value) {
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, value);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    fn plain_line(&self, inner: &Inner, text: &str) {
        let step = inner
            .step
            .map(|s| format!("[{}/{} {}] ", s.number(), Step::ALL.len(), s.as_str()))
            .unwrap_or_default();
        let line = format!("{} {step}{text}", rfc3339(now_ms()));
        match (&inner.multi, self.mode) {
            (Some(m), _) => {
                let _ = m.println(line);
            }
            (None, OutputMode::Plain) => eprintln!("{line}"),
            _ => {}
        }
    }

    /// A free-form event: `kind` names it in JSON, `text` is for people, `fields` are extra
    /// JSON fields.
    pub fn event(&self, kind: &str, text: &str, fields: serde_json::Value) {
        let inner = self.lock();
        self.emit(&inner, kind, text, fields);
    }

    fn emit(&self, inner: &Inner, kind: &str, text: &str, fields: serde_json::Value) {
        match self.mode {
            OutputMode::Json => {
                let mut v = json!({
                    "time": rfc3339(now_ms()),
                    "elapsedSeconds": round_secs(self.started.elapsed()),
                    "event": kind,
                    "message": text,
                });
                if let Some(step) = inner.step {
                    v["step"] = json!(step.as_str());
                }
                if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), fields) {
                    obj.extend(extra);
                }
                Self::json_line(&v);
            }
            _ => self.plain_line(inner, text),
        }
    }

    /// A new step begins.
    pub fn step(&self, step: Step) {
        let mut inner = self.lock();
        if inner.step == Some(step) {
            return;
        }
        let previous = inner.step.replace(step);
        inner.step_started = Instant::now();
        if let Some(bar) = inner.step_bar.take() {
            let msg = previous.map(|p| format!("✓ [{}/{}] {}", p.number(), Step::ALL.len(), p.describe()));
            bar.finish_with_message(msg.unwrap_or_default());
        }
        if let Some(m) = &inner.multi {
            let bar = m.add(ProgressBar::new_spinner());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_message(format!(
                "[{}/{}] {}",
                step.number(),
                Step::ALL.len(),
                step.describe()
            ));
            bar.enable_steady_tick(Duration::from_millis(100));
            inner.step_bar = Some(bar);
        }
        self.emit(
            &inner,
            "step",
            step.describe(),
            json!({"number": step.number(), "total": Step::ALL.len()}),
        );
        if step > Step::PublishDns && !inner.notified_ready {
            inner.notified_ready = true;
            notify(&[sd_notify::NotifyState::Ready]);
        }
        notify(&[sd_notify::NotifyState::Status(&format!(
            "step {}/{} {}: {}",
            step.number(),
            Step::ALL.len(),
            step.as_str(),
            step.describe()
        ))]);
        self.write_status(&inner, None);
    }

    /// A detail of the current step for the live view (not an event).
    pub fn detail(&self, text: &str) {
        let inner = self.lock();
        if let (Some(bar), Some(step)) = (&inner.step_bar, inner.step) {
            bar.set_message(format!(
                "[{}/{}] {}: {text}",
                step.number(),
                Step::ALL.len(),
                step.describe()
            ));
        }
    }

    /// The API names' served addresses changed.
    pub fn dns(&self, name: &str, served: Vec<IpAddr>) {
        let mut inner = self.lock();
        if inner.dns_muted || inner.dns.get(name) == Some(&served) {
            return;
        }
        let list: Vec<String> = served.iter().map(ToString::to_string).collect();
        self.emit(
            &inner,
            "dns",
            &format!("{name} now answers {}", list.join(", ")),
            json!({"name": name, "addresses": list}),
        );
        inner.dns.insert(name.to_owned(), served);
        self.write_status(&inner, None);
    }

    /// Reports no more DNS changes: the summary comes next and is the last line.
    pub fn mute_dns(&self) {
        self.lock().dns_muted = true;
    }

    /// The API Services' readiness (called on every poll; reports changes).
    pub fn services(&self, services: Vec<ServiceProgress>) {
        let mut inner = self.lock();
        for s in &services {
            let before = inner.services.iter().find(|o| o.service == s.service);
            if before.map(|b| &b.readiness) != Some(&s.readiness) {
                let text = if s.readiness == Readiness::Ready {
                    format!("Service {} is Ready (FIP {})", s.service, s.fip)
                } else {
                    format!(
                        "Service {} (FIP {}) waits for {}",
                        s.service, s.fip, s.waiting_for
                    )
                };
                self.emit(
                    &inner,
                    "service",
                    &text,
                    json!({"service": s.service, "endpoint": s.endpoint, "fip": s.fip, "readiness": s.readiness}),
                );
            }
            if let Some(m) = inner.multi.clone() {
                let entry = inner.service_bars.entry(s.service.clone()).or_insert_with(|| {
                    let bar = m.add(ProgressBar::new_spinner());
                    bar.set_style(
                        ProgressStyle::with_template("    {spinner} {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    bar.enable_steady_tick(Duration::from_millis(100));
                    (bar, Instant::now())
                });
                let elapsed = format_secs(entry.1.elapsed());
                if s.readiness == Readiness::Ready {
                    if !entry.0.is_finished() {
                        entry.0.finish_with_message(format!(
                            "✓ {} ({}) Ready after {elapsed}",
                            s.service, s.fip
                        ));
                    }
                } else {
                    entry.0.set_message(format!(
                        "{} ({}): waiting for {} — {elapsed}",
                        s.service, s.fip, s.waiting_for
                    ));
                }
            }
        }
        inner.services = services;
        self.write_status(&inner, None);
    }

    /// The run ended: writes the summary to stdout (and the status file).
    pub fn finish(&self, summary: &serde_json::Value) {
        let mut inner = self.lock();
        if let Some(bar) = inner.step_bar.take() {
            let ok = summary["result"] == "complete";
            let step = inner.step.map_or("", Step::describe);
            bar.finish_with_message(if ok {
                format!("✓ {step}")
            } else {
                format!("✗ {step}")
            });
        }
        for (bar, _) in inner.service_bars.values() {
            if !bar.is_finished() {
                bar.abandon();
            }
        }
        let result = summary["result"].as_str().unwrap_or("failed").to_owned();
        let status = match result.as_str() {
            "complete" => "complete: the bootstrap control plane may stop now".to_owned(),
            other => format!("{other}: {}", summary["error"].as_str().unwrap_or("")),
        };
        notify(&[sd_notify::NotifyState::Status(&status)]);
        self.write_status(&inner, Some(summary));
        if self.mode == OutputMode::Json {
            let mut v = summary.clone();
            v["event"] = json!("summary");
            v["time"] = json!(rfc3339(now_ms()));
            Self::json_line(&v);
        } else {
            if let Some(m) = &inner.multi {
                let _ = m.clear();
            }
            let text = serde_json::to_string_pretty(summary).unwrap_or_default();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        inner.multi = None;
    }

    fn write_status(&self, inner: &Inner, summary: Option<&serde_json::Value>) {
        let Some(path) = &self.status_file else { return };
        let step = inner.step;
        let doc = json!({
            "step": step.map(Step::as_str),
            "stepNumber": step.map(Step::number),
            "totalSteps": Step::ALL.len(),
            "description": step.map(Step::describe),
            "stepElapsedSeconds": round_secs(inner.step_started.elapsed()),
            "startedAt": rfc3339(self.started_ms),
            "updatedAt": rfc3339(now_ms()),
            "elapsedSeconds": round_secs(self.started.elapsed()),
            "services": inner.services,
            "dns": inner.dns,
            "result": summary.map(|s| s["result"].clone()),
            "summary": summary,
        });
        let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
        if let Err(error) = write_atomic(path, &bytes) {
            warn!(%error, path = %path.display(), "cannot write the status file");
        }
    }
}

fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(error) = sd_notify::notify(state)
    {
        warn!(%error, "sd_notify failed");
    }
}

fn round_secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

fn format_secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// `2026-05-01T12:00:00.123Z` for Unix milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
    }

    #[test]
    fn status_file_names_the_step_and_services() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let r = Reporter::new(OutputMode::Plain, Some(path.clone()));
        r.step(Step::WaitForServices);
        r.services(vec![ServiceProgress {
            endpoint: "api".into(),
            service: "ns/api".into(),
            fip: "203.0.113.1".parse().unwrap(),
            readiness: Readiness::NoIngress,
            waiting_for: Readiness::NoIngress.waiting_for(),
        }]);
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(doc["step"], "wait-for-services");
        assert_eq!(doc["stepNumber"], 5);
        assert_eq!(doc["services"][0]["readiness"]["state"], "no-ingress");
    }
}
