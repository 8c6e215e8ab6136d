//! Looking at what a kind's clusters hold before a table is declared: the
//! streams there are (Kafka topics, Kinesis streams), a sample of each one's
//! recent records, the columns Skein would read from them, and the
//! `CREATE EXTERNAL TABLE` that declares one. `skein ui` shows them; a
//! connector registers its browser beside its source.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Serialize;

use crate::error::Result;

/// One partition (or shard) of a stream: where it starts and ends now.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRange {
    /// The partition's id as the source names it.
    pub partition: String,
    /// The first offset still held, where the system says.
    pub start: Option<i64>,
    /// The offset the next record will get (Kafka's high watermark).
    pub end: Option<i64>,
}

/// One stream of a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct StreamListing {
    /// Its name (the table's `LOCATION`).
    pub name: String,
    /// Its partitions (Kafka) or open shards (Kinesis).
    pub partitions: Vec<PartitionRange>,
    /// Records held now, where the offsets tell (sum of end − start).
    pub records: Option<i64>,
}

/// One record of a sample.
#[derive(Debug, Clone, Serialize)]
pub struct SampledRecord {
    /// The partition (shard) it is in.
    pub partition: String,
    /// Its offset (sequence number).
    pub offset: String,
    /// Its timestamp, ms since the epoch, where it has one.
    pub timestamp_ms: Option<i64>,
    /// Its key as text (lossy UTF-8), if any.
    pub key: Option<String>,
    /// Its value as text: UTF-8 as is, other bytes as hex.
    pub value: String,
}

/// A column Skein would read from the sampled records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InferredColumn {
    /// The field's name.
    pub name: String,
    /// Its SQL type in a `CREATE EXTERNAL TABLE` (`BIGINT`, `VARCHAR`, ...).
    pub sql_type: String,
}

/// What the records of a stream look like.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// The most recent records, oldest first.
    pub records: Vec<SampledRecord>,
    /// The `'format'` they are in (`json`, `avro-confluent`, ...), where
    /// one fits every sampled record.
    pub format: Option<String>,
    /// Where the columns come from: `inferred from N records` or the
    /// registry subject and version.
    pub columns_from: String,
    /// The columns to declare.
    pub columns: Vec<InferredColumn>,
    /// The column that looks like event time, if one does.
    pub event_time: Option<String>,
    /// The options the declaration needs besides the format (the
    /// cluster's address, a registry).
    pub options: BTreeMap<String, String>,
    /// The registry's schema text (Avro, Protobuf), where the records name one.
    pub schema: Option<String>,
}

/// A kind's clusters as `skein ui` shows them. `options` are the
/// cluster's (e.g. `bootstrap.servers`, `schema.registry.url`), as a table
/// of the kind would give them.
#[async_trait]
pub trait SourceBrowser: Send + Sync {
    /// The streams there are, with their partitions.
    async fn list(&self, options: &BTreeMap<String, String>) -> Result<Vec<StreamListing>>;

    /// Up to `records` of the stream's most recent records, and the columns
    /// and format they suggest.
    async fn sample(
        &self,
        options: &BTreeMap<String, String>,
        stream: &str,
        records: usize,
    ) -> Result<Sample>;
}

/// A name SQL takes unquoted: lower-case letters, digits and `_`, not
/// starting with a digit; `stream` made into one.
pub fn table_name(stream: &str) -> String {
    let mut name: String = stream
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, 't');
        name.insert(1, '_');
    }
    name
}

/// A column name as SQL reads it: as is when it is plain lower case,
/// else in double quotes.
fn column_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The `CREATE EXTERNAL TABLE` that reads `stream` of `kind` as `sample`
/// suggests, named `table`.
pub fn declaration(kind: &str, table: &str, stream: &str, sample: &Sample) -> String {
    let columns: Vec<String> = sample
        .columns
        .iter()
        .map(|c| format!("  {} {}", column_name(&c.name), c.sql_type))
        .collect();
    let mut options: Vec<(String, String)> = sample
        .options
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(format) = &sample.format {
        options.push(("format".into(), format.clone()));
    }
    if let Some(column) = &sample.event_time {
        options.push(("event_time".into(), column.clone()));
    }
    let options: Vec<String> = options
        .iter()
        .map(|(k, v)| format!("  {} {}", quoted(k), quoted(v)))
        .collect();
    let columns = if columns.is_empty() {
        String::new()
    } else {
        format!(" (\n{}\n)", columns.join(",\n"))
    };
    format!(
        "CREATE EXTERNAL TABLE {table}{columns} STORED AS {} LOCATION {} OPTIONS (\n{}\n);",
        kind.to_ascii_uppercase(),
        quoted(stream),
        options.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_declares_its_table() {
        let sample = Sample {
            records: vec![],
            format: Some("json".into()),
            columns_from: "inferred from 2 records".into(),
            columns: vec![
                InferredColumn {
                    name: "k".into(),
                    sql_type: "VARCHAR".into(),
                },
                InferredColumn {
                    name: "Event Time".into(),
                    sql_type: "TIMESTAMP".into(),
                },
            ],
            event_time: Some("Event Time".into()),
            options: BTreeMap::from([("bootstrap.servers".into(), "b:9092".into())]),
            schema: None,
        };
        assert_eq!(table_name("ad-events.v2"), "ad_events_v2");
        assert_eq!(table_name("2024"), "t_2024");
        assert_eq!(
            declaration("kafka", "ev", "it's", &sample),
            "CREATE EXTERNAL TABLE ev (\n  k VARCHAR,\n  \"Event Time\" TIMESTAMP\n) STORED AS KAFKA \
             LOCATION 'it''s' OPTIONS (\n  'bootstrap.servers' 'b:9092',\n  'format' 'json',\n  \
             'event_time' 'Event Time'\n);"
        );
    }
}
