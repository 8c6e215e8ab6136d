//! Rows as messages: the key and value bytes the Kafka and Kinesis sinks
//! send for each row of a batch.
//!
//! Options (of the sink table):
//! - `'format' 'json'` (default): the value is the row as one JSON object.
//!   Timestamps are written as integer milliseconds since the epoch, which is
//!   what Skein's own JSON decoder reads, so a topic Skein writes is a topic
//!   Skein can read.
//! - `'format' 'raw'`: the value is the bytes of one string or binary column,
//!   `'value' '<column>'` (default `value`), sent as they are.
//! - `'format' 'avro' | 'avro-confluent' | 'protobuf' | 'protobuf-confluent'`:
//!   the row as an Avro record or a Protobuf message, with the same options
//!   as the sources take ([`skein_formats`], docs/formats.md).
//! - `'format' 'debezium-json'`: the value is a Debezium change event,
//!   `{"before": <row or null>, "after": <row or null>, "op": "c"|"u"|"d"}`,
//!   rows as in `json`: what an updating query's changelog becomes on a
//!   Kafka topic (an append-only query writes only creations).
//! - `'key' '<column>'`: the message key (Kafka) or partition key (Kinesis),
//!   the column's value as text (with `avro-confluent`, as an Avro primitive
//!   registered under `<topic>-key`). Without it Kafka messages have no key.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::json::LineDelimitedWriter;
use std::sync::Arc;

use crate::error::{ConnectorError, Result};
use skein_formats::Format;
use skein_formats::avro::encode::AvroEncoder;
use skein_formats::protobuf::encode::ProtobufEncoder;

/// How a row's value is laid out.
#[derive(Debug, Clone)]
pub enum ValueFormat {
    Json,
    Raw { column: String },
    Avro(Arc<AvroEncoder>),
    Protobuf(Arc<ProtobufEncoder>),
    DebeziumJson,
}

/// One row, encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRow {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// Turns batches into messages, as a sink table's options say.
#[derive(Debug, Clone)]
pub struct RowEncoder {
    format: ValueFormat,
    key: Option<String>,
}

/// The options the encoder reads; a sink passes the others on (e.g. to librdkafka).
pub const ENCODER_OPTIONS: &[&str] = &["format", "key", "value"];

impl RowEncoder {
    pub fn new(format: ValueFormat, key: Option<String>) -> Self {
        RowEncoder { format, key }
    }

    /// The encoder of a table's options; `location` (the topic or stream)
    /// names the registry subjects.
    pub fn from_options(options: &BTreeMap<String, String>, location: &str) -> Result<Self> {
        let format = match options.get("format").map(String::as_str).unwrap_or("json") {
            "json" => ValueFormat::Json,
            "debezium-json" => ValueFormat::DebeziumJson,
            "raw" => ValueFormat::Raw {
                column: options
                    .get("value")
                    .cloned()
                    .unwrap_or_else(|| "value".into()),
            },
            other => match Format::from_options(options, location) {
                Ok(Format::Avro(f)) => ValueFormat::Avro(Arc::new(AvroEncoder::new(f)?)),
                Ok(Format::Protobuf(f)) => {
                    ValueFormat::Protobuf(Arc::new(ProtobufEncoder::new(f)?))
                }
                Err(e @ ConnectorError::Config(_))
                    if other.contains("avro") || other.contains("protobuf") =>
                {
                    return Err(e);
                }
                _ => {
                    return Err(ConnectorError::Config(format!(
                        "format {other:?}: a message sink writes 'json', 'raw', 'debezium-json', \
                         'avro', 'avro-confluent', 'protobuf' or 'protobuf-confluent'"
                    )));
                }
            },
        };
        let key = options.get("key").filter(|k| !k.is_empty()).cloned();
        Ok(RowEncoder { format, key })
    }

    pub fn key_column(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// How values are laid out.
    pub fn format(&self) -> &ValueFormat {
        &self.format
    }

    /// Each row's key (`None` without a key column, or for a null value):
    /// its text, or with a registry an Avro primitive.
    pub fn keys(&self, batch: &RecordBatch) -> Result<Vec<Option<Vec<u8>>>> {
        match (&self.key, &self.format) {
            (Some(name), ValueFormat::Avro(avro)) if avro.registered() => avro.keys(batch, name),
            (Some(name), _) => text_column(batch, name, "key"),
            (None, _) => Ok(vec![None; batch.num_rows()]),
        }
    }

    /// The messages of `batch`, one per row, in row order.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Vec<EncodedRow>> {
        let rows = batch.num_rows();
        let keys = self.keys(batch)?;
        let values: Vec<Vec<u8>> = match &self.format {
            ValueFormat::Json => json_rows(batch)?,
            ValueFormat::Raw { column } => bytes_column(batch, column)?,
            ValueFormat::Avro(avro) => avro.values(batch)?,
            ValueFormat::Protobuf(protobuf) => protobuf.values(batch)?,
            ValueFormat::DebeziumJson => json_rows(batch)?
                .iter()
                .map(|after| debezium_event(None, Some(after), "c"))
                .collect(),
        };
        debug_assert_eq!(values.len(), rows);
        Ok(values
            .into_iter()
            .enumerate()
            .map(|(i, value)| EncodedRow {
                key: keys[i].clone(),
                value,
            })
            .collect())
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str, role: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| {
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        ConnectorError::Config(format!(
            "{role} column {name:?} is not among the written columns {names:?}"
        ))
    })
}

/// A column's values as text bytes (nulls stay `None`).
fn text_column(batch: &RecordBatch, name: &str, role: &str) -> Result<Vec<Option<Vec<u8>>>> {
    let col = column(batch, name, role)?;
    let text = cast(col, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    Ok((0..text.len())
        .map(|i| (!text.is_null(i)).then(|| text.value(i).as_bytes().to_vec()))
        .collect())
}

/// A string or binary column's bytes, as they are; a null value is an error
/// (a message without a value would be a tombstone, not a row).
fn bytes_column(batch: &RecordBatch, name: &str) -> Result<Vec<Vec<u8>>> {
    let col = column(batch, name, "value")?;
    let bin = match col.data_type() {
        DataType::Binary => col.clone(),
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::LargeBinary
        | DataType::BinaryView => cast(col, &DataType::Binary)?,
        other => {
            return Err(ConnectorError::Config(format!(
                "raw value column {name:?} is {other}; it must be a string or binary column"
            )));
        }
    };
    let bin = bin.as_binary::<i32>();
    (0..bin.len())
        .map(|i| {
            if bin.is_null(i) {
                Err(ConnectorError::Other(format!(
                    "row {i}: the raw value column {name:?} is null"
                )))
            } else {
                Ok(bin.value(i).to_vec())
            }
        })
        .collect()
}

/// A Debezium change event of rows encoded by [`json_rows`]: `op` is `c`
/// (created: `after` only), `u` (updated: both) or `d` (deleted: `before`
/// only).
pub fn debezium_event(before: Option<&[u8]>, after: Option<&[u8]>, op: &str) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(before.map_or(4, <[u8]>::len) + after.map_or(4, <[u8]>::len) + 40);
    out.extend_from_slice(b"{\"before\":");
    out.extend_from_slice(before.unwrap_or(b"null"));
    out.extend_from_slice(b",\"after\":");
    out.extend_from_slice(after.unwrap_or(b"null"));
    out.extend_from_slice(b",\"op\":\"");
    out.extend_from_slice(op.as_bytes());
    out.extend_from_slice(b"\"}");
    out
}

/// Each row as one JSON object, timestamps as integer milliseconds.
pub(crate) fn json_rows(batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    let batch = timestamps_as_millis(batch)?;
    let mut buf = Vec::with_capacity(batch.num_rows() * 64);
    {
        let mut w = LineDelimitedWriter::new(&mut buf);
        w.write(&batch)?;
        w.finish()?;
    }
    // JSON escapes newlines inside strings, so every '\n' ends a row.
    let rows: Vec<Vec<u8>> = buf
        .split(|b| *b == b'\n')
        .filter(|r| !r.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if rows.len() != batch.num_rows() {
        return Err(ConnectorError::Other(format!(
            "JSON encoding gave {} lines for {} rows",
            rows.len(),
            batch.num_rows()
        )));
    }
    Ok(rows)
}

fn timestamps_as_millis(batch: &RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema_ref()
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Timestamp(..)))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (f, c) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        if matches!(f.data_type(), DataType::Timestamp(..)) {
            let ms = cast(c, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
            columns.push(cast(&ms, &DataType::Int64)?);
            fields.push(Field::new(f.name(), DataType::Int64, f.is_nullable()));
        } else {
            columns.push(c.clone());
            fields.push(f.as_ref().clone());
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![7, 8])),
                Arc::new(StringArray::from(vec![Some("a\nb \"q\""), None])),
                Arc::new(TimestampMillisecondArray::from(vec![1_700_000_000_123, 5])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn json_rows_with_keys_and_millisecond_timestamps() {
        let enc = RowEncoder::new(ValueFormat::Json, Some("id".into()));
        let rows = enc.encode(&batch()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key.as_deref(), Some(&b"7"[..]));
        let v: serde_json::Value = serde_json::from_slice(&rows[0].value).unwrap();
        assert_eq!(v["name"], "a\nb \"q\"");
        assert_eq!(v["at"], 1_700_000_000_123i64);
        let v: serde_json::Value = serde_json::from_slice(&rows[1].value).unwrap();
        assert!(v.get("name").is_none() || v["name"].is_null());
    }

    #[test]
    fn raw_values_and_clear_errors() {
        let opts: BTreeMap<String, String> = [("format", "raw"), ("value", "name"), ("key", "id")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let enc = RowEncoder::from_options(&opts, "t").unwrap();
        let err = enc.encode(&batch()).unwrap_err().to_string();
        assert!(err.contains("row 1") && err.contains("null"), "{err}");
        let one = batch().slice(0, 1);
        assert_eq!(enc.encode(&one).unwrap()[0].value, b"a\nb \"q\"");
        let missing = RowEncoder::new(ValueFormat::Json, Some("nope".into()));
        let err = missing.encode(&batch()).unwrap_err().to_string();
        assert!(err.contains("\"nope\"") && err.contains("id"), "{err}");
        let mut bad = opts.clone();
        bad.insert("format".into(), "xml".into());
        assert!(RowEncoder::from_options(&bad, "t").is_err());
        bad.insert("format".into(), "avro".into());
        let err = RowEncoder::from_options(&bad, "t").unwrap_err().to_string();
        assert!(err.contains("avro.schema"), "{err}");
    }
}
