//! How often a query fires an epoch when it runs on the wall clock
//! (`--duration`, `--until-drained`, a standing query): `--interval` if
//! given, else the shortest `'epoch.interval'` option of its source tables,
//! else one second.

use std::time::Duration;

use crate::error::{EngineError, Result};
use crate::source::SourceConfig;

/// The table option every source kind takes (e.g. `'epoch.interval' '500ms'`).
pub use crate::table_options::EPOCH_INTERVAL_OPTION;

/// Without `--interval` or a table option.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// `500ms`, `30s`, `2m`, `1h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s or 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => return Err(format!("unknown duration unit {other:?} (ms, s, m, h)")),
    };
    // Duration::from_secs_f64 panics past u64::MAX seconds; a flag must not.
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{text:?} is out of range for a duration"))
}

/// A table's `'epoch.interval'`, if it sets one; zero or a malformed value
/// is an error naming the option.
pub fn table_interval(config: &SourceConfig) -> Result<Option<Duration>> {
    duration_option(config, EPOCH_INTERVAL_OPTION)
}

/// A duration option of the engine's, if the table sets it; zero or a
/// malformed value is an error naming the option.
pub fn duration_option(config: &SourceConfig, name: &str) -> Result<Option<Duration>> {
    let Some(text) = config.option(name) else {
        return Ok(None);
    };
    match parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        Ok(_) => Err(EngineError::plan(format!(
            "option '{name}' = {text:?} must be longer than zero"
        ))),
        Err(e) => Err(EngineError::plan(format!(
            "option '{name}' = {text:?}: {e}"
        ))),
    }
}

/// The shortest `'epoch.interval'` of a query's source tables, if any.
pub fn query_interval<'a>(
    tables: impl IntoIterator<Item = &'a SourceConfig>,
) -> Result<Option<Duration>> {
    let mut shortest: Option<Duration> = None;
    for config in tables {
        if let Some(d) = table_interval(config)? {
            shortest = Some(shortest.map_or(d, |s| s.min(d)));
        }
    }
    Ok(shortest)
}

/// The interval a run uses: the flag, the source tables' option (see
/// `QueryPlan::source_tables`), or the default.
pub fn effective_interval<'a>(
    flag: Option<Duration>,
    tables: impl IntoIterator<Item = &'a SourceConfig>,
) -> Result<Duration> {
    match flag {
        Some(d) => Ok(d),
        None => Ok(query_interval(tables)?.unwrap_or(DEFAULT_INTERVAL)),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 30 "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn out_of_range_and_malformed_durations_are_errors_not_panics() {
        for bad in [
            "99999999999999999999",
            "99999999999999999999h",
            &"9".repeat(400),
            "-5s",
            "inf",
            "NaN",
            "1e3s",
            "",
            "5d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
