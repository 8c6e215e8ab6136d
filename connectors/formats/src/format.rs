//! The format a table declares: `'format'` and the options that go with
//! it, for a source's decoder and a sink's encoder alike.

use std::collections::BTreeMap;
use std::str::FromStr;

use skein_clients::error::{ConnectorError, Result};

use crate::avro::AvroFormat;
use crate::protobuf::ProtobufFormat;

/// How record bytes are laid out: a table's `'format'` and the options
/// that go with it.
#[derive(Debug, Clone)]
pub enum Format {
    /// One flat JSON object per record.
    Json,
    /// One line of delimited text per record, fields in declared order.
    Csv { delimiter: u8 },
    /// The whole record in the first declared column (Utf8 or Binary).
    Raw,
    /// Avro records, plain or in the Confluent wire format.
    Avro(AvroFormat),
    /// Protobuf messages, plain or in the Confluent wire format.
    Protobuf(ProtobufFormat),
    /// Debezium change events as JSON: an updating table.
    DebeziumJson,
    /// Debezium change events as Confluent Avro: an updating table.
    DebeziumAvro(AvroFormat),
}

/// The names `'format'` takes.
pub const FORMAT_NAMES: &str = "json, csv, raw, avro, avro-confluent, protobuf, \
                                protobuf-confluent, debezium-json, debezium-avro-confluent";

impl FromStr for Format {
    type Err = ConnectorError;
    /// The formats that need no other option.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv { delimiter: b',' }),
            "raw" => Ok(Format::Raw),
            "debezium-json" => Ok(Format::DebeziumJson),
            other => Err(ConnectorError::Config(format!(
                "unknown format {other:?}; known: {FORMAT_NAMES}"
            ))),
        }
    }
}

impl Format {
    /// The format a table's options declare (`'format'`, default `json`,
    /// with the options of Avro, Protobuf and the registry). `location`
    /// (the topic or stream) names the registry subject by default.
    pub fn from_options(options: &BTreeMap<String, String>, location: &str) -> Result<Self> {
        let name = options
            .get("format")
            .map(|f| f.trim().to_ascii_lowercase())
            .unwrap_or_else(|| "json".into());
        Ok(match name.as_str() {
            "avro" => Format::Avro(AvroFormat::from_options(options, location, false)?),
            "avro-confluent" => Format::Avro(AvroFormat::from_options(options, location, true)?),
            "protobuf" => Format::Protobuf(ProtobufFormat::from_options(options, location, false)?),
            "protobuf-confluent" => {
                Format::Protobuf(ProtobufFormat::from_options(options, location, true)?)
            }
            "debezium-avro-confluent" => {
                Format::DebeziumAvro(AvroFormat::from_options(options, location, true)?)
            }
            other => other.parse()?,
        })
    }

    /// Whether records of this format are changes to a table (Debezium).
    pub fn is_changelog(&self) -> bool {
        matches!(self, Format::DebeziumJson | Format::DebeziumAvro(_))
    }
}
