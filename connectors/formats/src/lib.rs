//! skein-formats: how a table's records are laid out, in both directions.
//! Sources (skein-connectors) decode with it; sinks (skein-sinks) encode.
//!
//! * [`format`]: the [`Format`] a table declares (`'format'` and the
//!   options that go with it);
//! * [`decode`]: records straight into Arrow columns of the table's schema
//!   ([`decode::RecordDecoder`]), by format; [`rejected`]: what it says of
//!   a record it did not decode, and what of it a dead letter carries;
//! * `text/`: the text formats (JSON, CSV, raw): scanners and the column
//!   builders Protobuf shares;
//! * [`avro`]: plain Avro (`'avro.schema'`) and the Confluent wire format,
//!   decoded by arrow-avro with the table's columns as reader schema, and
//!   the encoder of rows as Avro records;
//! * [`protobuf`]: messages of a descriptor set (`'protobuf.descriptor'`,
//!   `'protobuf.message'`), plain or Confluent-framed with message indexes,
//!   both ways;
//! * [`debezium`]: `debezium-json` and `debezium-avro-confluent` envelopes
//!   as a changelog;
//! * [`registry`]: the schema registry client; [`confluent`]: the wire
//!   format's header;
//! * [`options`]: the options of the formats and the registry;
//! * `conform.rs`: decoded Arrow columns into the table's column types.
//!
//! Errors are skein-clients' `ConnectorError`, the one error of sources and
//! sinks.

pub mod avro;
pub mod confluent;
pub(crate) mod conform;
pub mod debezium;
pub mod decode;
pub mod format;
pub mod options;
pub mod protobuf;
#[cfg(test)]
mod recorded;
pub mod registry;
pub mod rejected;
pub mod sniff;
pub(crate) mod text;

pub use format::{FORMAT_NAMES, Format};
pub use options::{FORMAT_OPTIONS, all_options, is_format_option};
