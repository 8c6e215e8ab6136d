//! A Kinesis table's options, read into the configuration its source
//! uses.

use std::time::Duration;

use skein_engine::source::SourceConfig;
use skein_formats::Format;

use crate::error::{ConnectorError, Result};
use crate::options;

/// Where a shard is first read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KinesisStartup {
    TrimHorizon,
    Latest,
    AtTimestamp { ms: i64 },
}

/// The Kinesis source's options, read by [`KinesisSourceConfig`]; the
/// Kinesis sink and the Lambda deployer (`mode`) add theirs.
pub const SOURCE_OPTIONS: &[&str] = &[
    "format",
    "parallelism",
    "startup",
    "startup.timestamp.ms",
    "max.records.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.stream",
];

#[derive(Debug, Clone)]
pub struct KinesisSourceConfig {
    pub stream: String,
    pub format: Format,
    pub parallelism: usize,
    pub startup: KinesisStartup,
    pub max_records_per_pull: usize,
    pub max_record_bytes: usize,
    pub pull_timeout: Duration,
    pub dead_letter_stream: Option<String>,
}

impl KinesisSourceConfig {
    pub fn from_source_config(config: &SourceConfig) -> Result<Self> {
        let number = |k: &str, default: usize| options::number(config, k, default);
        options::require_location(config, "stream")?;
        let startup = match config.option("startup").unwrap_or("trim_horizon") {
            "trim_horizon" | "earliest" => KinesisStartup::TrimHorizon,
            "latest" => KinesisStartup::Latest,
            "at_timestamp" => {
                let v = config.option("startup.timestamp.ms").ok_or_else(|| {
                    ConnectorError::Config(
                        "startup 'at_timestamp' needs 'startup.timestamp.ms'".into(),
                    )
                })?;
                KinesisStartup::AtTimestamp {
                    ms: v
                        .parse()
                        .map_err(|_| options::bad("startup.timestamp.ms", v))?,
                }
            }
            other => return Err(options::bad("startup", other)),
        };
        let parallelism = options::parallelism(config)?;
        Ok(KinesisSourceConfig {
            stream: config.location.clone(),
            format: Format::from_options(&config.options, &config.location)?,
            parallelism,
            startup,
            max_records_per_pull: number("max.records.per.pull", 100_000)?.max(1),
            max_record_bytes: number("max.record.bytes", 1 << 20)?,
            pull_timeout: Duration::from_millis(number("pull.timeout.ms", 2000)? as u64),
            dead_letter_stream: config
                .option("dead.letter.stream")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }
}

/// How errors name a Kinesis source: by kind and stream.
pub(super) fn source_name(stream: &str) -> String {
    format!("kinesis stream {stream}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn config(options: &[(&str, &str)]) -> SourceConfig {
        SourceConfig {
            kind: super::super::KIND.into(),
            location: "s".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn options_parse_or_name_what_is_wrong() {
        let c = KinesisSourceConfig::from_source_config(&config(&[])).unwrap();
        assert_eq!(c.startup, KinesisStartup::TrimHorizon);
        assert_eq!(c.parallelism, 1);
        let c = KinesisSourceConfig::from_source_config(&config(&[
            ("startup", "at_timestamp"),
            ("startup.timestamp.ms", "1700000000000"),
            ("parallelism", "3"),
            ("dead.letter.stream", "bad"),
        ]))
        .unwrap();
        assert_eq!(
            c.startup,
            KinesisStartup::AtTimestamp {
                ms: 1_700_000_000_000
            }
        );
        assert_eq!(c.dead_letter_stream.as_deref(), Some("bad"));
        for (opts, needle) in [
            (vec![("startup", "at_timestamp")], "startup.timestamp.ms"),
            (vec![("startup", "yesterday")], "startup"),
            (vec![("parallelism", "0")], "parallelism"),
            (vec![("format", "avro")], "avro"),
        ] {
            let err = KinesisSourceConfig::from_source_config(&config(&opts))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
        }
        let mut empty = config(&[]);
        empty.location.clear();
        assert!(KinesisSourceConfig::from_source_config(&empty).is_err());
    }
}
