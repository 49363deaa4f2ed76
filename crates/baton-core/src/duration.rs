//! Durations in configuration: `250ms`, `2s`, `1m`, `1h`, or a bare number of seconds.

use std::time::Duration;

/// Why a duration was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("expected a duration like 250ms, 2s, 1m or a number of seconds")]
pub struct DurationError;

/// Parses a duration.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| DurationError)?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(DurationError),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| DurationError)
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() != 0 || d.as_secs() == 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("250ms", 250)]
    #[case("2s", 2000)]
    #[case("2", 2000)]
    #[case("1.5s", 1500)]
    #[case("1m", 60_000)]
    fn parses(#[case] s: &str, #[case] ms: u64) {
        assert_eq!(parse_duration(s).unwrap(), Duration::from_millis(ms));
        assert_eq!(
            parse_duration(&format_duration(Duration::from_millis(ms))).unwrap(),
            Duration::from_millis(ms)
        );
    }

    #[rstest]
    #[case("")]
    #[case("fast")]
    #[case("-1s")]
    #[case("3 parsecs")]
    fn rejects(#[case] s: &str) {
        assert!(parse_duration(s).is_err());
    }
}
