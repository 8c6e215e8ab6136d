//! A Kafka table's options, read into the configuration the source and
//! its pull engine (`reader.rs`) share.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use skein_clients::kafka::{KafkaRole, client_config, client_properties};
use skein_engine::source::{SourceConfig, TableOptions};
use skein_formats::Format;

use super::offsets::parse_offsets;
use crate::error::{ConnectorError, Result};
use crate::options;

/// The Kafka source's own options.
pub const SOURCE_OPTIONS: &[&str] = &[
    "format",
    "parallelism",
    "startup",
    "startup.timestamp.ms",
    "offsets",
    "max.records.per.pull",
    "max.bytes.per.pull",
    "max.record.bytes",
    "pull.timeout.ms",
    "dead.letter.topic",
    "offsets.log",
];

/// The options a Kafka source takes: its own, its format's (Avro,
/// Protobuf, the schema registry) and any librdkafka property.
pub(super) fn source_options() -> TableOptions {
    TableOptions::only(SOURCE_OPTIONS)
        .and(&skein_formats::all_options())
        .passing_dotted("librdkafka property")
}

/// Where a partition starts when the source first reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Startup {
    Earliest,
    Latest,
    /// The consumer group's committed offsets (`group.id` must be set).
    Committed,
    /// Explicit next offsets per partition; others start at the earliest.
    Offsets(BTreeMap<i32, i64>),
    /// The first record whose timestamp is at or after this time (ms since
    /// the epoch); a partition with none starts at its end.
    AtTimestamp(i64),
    /// The offsets the query's exactly-once sink committed under its
    /// `checkpoint`. The runner (`skein run`) reads them from the sink and
    /// turns this into `Offsets` before the query starts.
    Checkpoint,
}

#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    pub topic: String,
    pub format: Format,
    pub parallelism: usize,
    pub startup: Startup,
    pub max_records_per_pull: usize,
    pub max_bytes_per_pull: usize,
    pub max_record_bytes: usize,
    pub pull_timeout: Duration,
    pub dead_letter_topic: Option<String>,
    /// `'offsets.log'`: a checkpointing member keeps its log between
    /// checkpoints in Kafka (`kafka`, the default; needs transactions) or
    /// writes it to the checkpoint store every epoch (`store`).
    pub log_in_kafka: bool,
    /// librdkafka properties.
    pub client: BTreeMap<String, String>,
}

impl KafkaSourceConfig {
    pub fn from_source_config(config: &SourceConfig) -> Result<Self> {
        let number = |k: &str, default: usize| options::number(config, k, default);
        options::require_location(config, "topic")?;
        let client = client_properties(&config.options, &source_options().names);
        if !client.contains_key("bootstrap.servers") {
            return Err(ConnectorError::Config(
                "option 'bootstrap.servers' is required".into(),
            ));
        }
        let startup = match config.option("startup").unwrap_or("earliest") {
            "earliest" => Startup::Earliest,
            "latest" => Startup::Latest,
            "committed" => Startup::Committed,
            "offsets" => Startup::Offsets(parse_offsets(config.option("offsets").unwrap_or(""))?),
            "checkpoint" => Startup::Checkpoint,
            "at_timestamp" => {
                let v = config.option("startup.timestamp.ms").ok_or_else(|| {
                    ConnectorError::Config(
                        "startup 'at_timestamp' needs 'startup.timestamp.ms'".into(),
                    )
                })?;
                Startup::AtTimestamp(
                    v.trim()
                        .parse()
                        .map_err(|_| options::bad("startup.timestamp.ms", v))?,
                )
            }
            other => return Err(options::bad("startup", other)),
        };
        let parallelism = options::parallelism(config)?;
        let log_in_kafka = match config.option("offsets.log").unwrap_or("kafka") {
            "kafka" => true,
            "store" => false,
            other => return Err(options::bad("offsets.log", other)),
        };
        Ok(KafkaSourceConfig {
            topic: config.location.clone(),
            format: Format::from_options(&config.options, &config.location)?,
            parallelism,
            startup,
            max_records_per_pull: number("max.records.per.pull", 200_000)?.max(1),
            max_bytes_per_pull: number("max.bytes.per.pull", 64 << 20)?.max(1),
            max_record_bytes: number("max.record.bytes", 1 << 20)?,
            pull_timeout: Duration::from_millis(number("pull.timeout.ms", 2000)? as u64),
            dead_letter_topic: config
                .option("dead.letter.topic")
                .filter(|t| !t.is_empty())
                .map(str::to_string),
            log_in_kafka,
            client,
        })
    }

    /// A client of the table's brokers in `role`.
    pub(super) fn client_config(&self, role: KafkaRole) -> ClientConfig {
        client_config(role, &self.client, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(options: &[(&str, &str)]) -> SourceConfig {
        SourceConfig {
            kind: "KAFKA".into(),
            location: "t".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_table_starts_at_a_time_it_names() {
        let at = config(&[
            ("bootstrap.servers", "b:9092"),
            ("startup", "at_timestamp"),
            ("startup.timestamp.ms", "1700000000000"),
        ]);
        let c = KafkaSourceConfig::from_source_config(&at).unwrap();
        assert_eq!(c.startup, Startup::AtTimestamp(1_700_000_000_000));
        // Its own option, not a librdkafka property.
        assert!(!c.client.contains_key("startup.timestamp.ms"));
        let missing = config(&[("bootstrap.servers", "b:9092"), ("startup", "at_timestamp")]);
        let e = KafkaSourceConfig::from_source_config(&missing).unwrap_err();
        assert!(e.to_string().contains("startup.timestamp.ms"), "{e}");
    }
}
