//! Formats with a schema (Avro, Protobuf), the Confluent wire format and
//! its schema registry, and Debezium change events. The decoders plug into
//! [`crate::decode::RecordDecoder`]; the encoders into
//! [`crate::encode::RowEncoder`].
//!
//! * `avro/`: plain Avro (`'avro.schema'`) and the Confluent wire format,
//!   decoded by arrow-avro with the table's columns as reader schema;
//! * `protobuf/`: messages of a descriptor set (`'protobuf.descriptor'`,
//!   `'protobuf.message'`), plain or Confluent-framed with message indexes;
//! * `debezium/`: `debezium-json` and `debezium-avro-confluent` envelopes
//!   as a changelog;
//! * `registry.rs`: the schema registry client;
//! * `conform.rs`: decoded Arrow columns into the table's column types.

pub mod avro;
pub(crate) mod conform;
pub mod debezium;
pub mod protobuf;
#[cfg(test)]
mod recorded;
pub mod registry;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{ConnectorError, Result};
use registry::{REGISTRY_OPTIONS, Registry, RegistryConfig};

/// The table options of the formats (besides `'format'` itself).
pub const FORMAT_OPTIONS: &[&str] = &["avro.schema", "protobuf.message", "protobuf.descriptor"];

/// Whether `key` is an option of a format or of the schema registry.
pub fn is_format_option(key: &str) -> bool {
    FORMAT_OPTIONS.contains(&key) || REGISTRY_OPTIONS.contains(&key)
}

/// Every option a format may read, for a table kind's list of options.
pub fn all_options() -> Vec<&'static str> {
    FORMAT_OPTIONS
        .iter()
        .chain(REGISTRY_OPTIONS)
        .copied()
        .collect()
}

/// The first byte of a record in the Confluent wire format.
pub const CONFLUENT_MAGIC: u8 = 0;

/// The schema id of a Confluent-framed record and the bytes after it.
pub(crate) fn confluent_header(record: &[u8]) -> std::result::Result<(u32, &[u8]), String> {
    match record {
        [CONFLUENT_MAGIC, a, b, c, d, rest @ ..] => {
            Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest))
        }
        [] => Err("empty record: no Confluent wire-format header".into()),
        [first, ..] if *first != CONFLUENT_MAGIC => Err(format!(
            "not in the Confluent wire format: the first byte is {first:#04x}, not 0x00"
        )),
        _ => Err(format!(
            "a record of {} bytes is too short for the Confluent header (5 bytes)",
            record.len()
        )),
    }
}

/// The Confluent header of schema `id`.
pub(crate) fn confluent_prefix(id: u32) -> [u8; 5] {
    let b = id.to_be_bytes();
    [CONFLUENT_MAGIC, b[0], b[1], b[2], b[3]]
}

/// The schema registry a table's options name, shared with every other
/// table of this process that names the same one (and so its cache).
pub(crate) fn registry_of(options: &BTreeMap<String, String>) -> Result<Option<Arc<Registry>>> {
    RegistryConfig::from_options(options)?
        .map(registry::shared)
        .transpose()
}

/// The registry subject of a table's values: `'schema.registry.subject'`,
/// else `<topic>-value` (the TopicNameStrategy).
pub(crate) fn value_subject(options: &BTreeMap<String, String>, location: &str) -> String {
    options
        .get("schema.registry.subject")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("{location}-value"))
}

/// An option's text, inline or, when it does not look like `inline`
/// (`looks_inline`), read from the file it names.
pub(crate) fn inline_or_file(
    key: &str,
    value: &str,
    looks_inline: impl Fn(&str) -> bool,
) -> Result<String> {
    let v = value.trim();
    if looks_inline(v) {
        return Ok(v.to_string());
    }
    std::fs::read_to_string(v).map_err(|e| {
        ConnectorError::Config(format!(
            "option {key}: {v:?} is neither an inline schema nor a readable file: {e}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confluent_headers_are_checked() {
        assert_eq!(confluent_header(&[0, 0, 0, 1, 2, 9]), Ok((258, &[9u8][..])));
        assert_eq!(confluent_header(&confluent_prefix(7)), Ok((7, &[][..])));
        assert!(
            confluent_header(&[1, 0, 0, 0, 1])
                .unwrap_err()
                .contains("0x01")
        );
        assert!(
            confluent_header(&[0, 0, 1])
                .unwrap_err()
                .contains("too short")
        );
        assert!(confluent_header(&[]).unwrap_err().contains("empty"));
    }
}
