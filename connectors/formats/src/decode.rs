//! Record decoders: records of a table's format straight into Arrow
//! columns of its declared schema.
//!
//! The formats: JSON, CSV and raw bytes (`text/`, with the scanners in
//! `json.rs` and `csv.rs` and the column builders in `columns.rs`); Avro and
//! Protobuf, plain or in the Confluent wire format with a schema registry,
//! and Debezium change events, which make an updating table (in
//! [`crate::avro`], [`crate::protobuf`] and [`crate::debezium`]). What a
//! rejection says is in `rejected.rs`.
//!
//! Only the declared fields are decoded; other fields are skipped. A record
//! that does not fit the schema (bad syntax, a missing non-nullable field, a
//! value of the wrong type, too many bytes, a schema id the registry does
//! not know, a writer schema the columns cannot be read from) is rejected
//! with its reason and adds no row: the caller sends it to the dead-letter
//! destination.

pub use crate::rejected::{DEAD_LETTER_PREFIX_BYTES, LetterRecord, Rejected};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use skein_clients::error::Result;

use crate::avro::{AvroBuilder, AvroDecoder};
use crate::debezium::{DebeziumBuilder, DebeziumDecoder};
use crate::format::Format;
use crate::protobuf::{ProtobufBuilder, ProtobufDecoder};
use crate::text::scanned::TextFormat;
use crate::text::{TextBuilder, TextDecoder};

/// Decodes records of one format into batches of one schema.
#[derive(Debug)]
pub struct RecordDecoder {
    schema: SchemaRef,
    max_record_bytes: usize,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Text(TextDecoder),
    Avro(AvroDecoder),
    Protobuf(ProtobufDecoder),
    Debezium(DebeziumDecoder),
}

impl RecordDecoder {
    /// A decoder into `schema`; a table declared without columns takes
    /// them from its format's schema where it has one (Avro, Protobuf).
    pub fn new(schema: SchemaRef, format: Format, max_record_bytes: usize) -> Result<Self> {
        let inner = match format {
            Format::Json => Inner::Text(TextDecoder::new(schema, TextFormat::Json)?),
            Format::Csv { delimiter } => {
                Inner::Text(TextDecoder::new(schema, TextFormat::Csv { delimiter })?)
            }
            Format::Raw => Inner::Text(TextDecoder::new(schema, TextFormat::Raw)?),
            Format::Avro(f) => Inner::Avro(AvroDecoder::new(schema, f)?),
            Format::Protobuf(f) => Inner::Protobuf(ProtobufDecoder::new(schema, f)?),
            Format::DebeziumJson => Inner::Debezium(DebeziumDecoder::json(schema)?),
            Format::DebeziumAvro(f) => Inner::Debezium(DebeziumDecoder::avro(schema, f)?),
        };
        Ok(RecordDecoder {
            schema: match &inner {
                Inner::Text(d) => d.schema().clone(),
                Inner::Avro(d) => d.schema().clone(),
                Inner::Protobuf(d) => d.schema().clone(),
                Inner::Debezium(d) => d.schema().clone(),
            },
            // Text positions are kept as u32.
            max_record_bytes: max_record_bytes.min(u32::MAX as usize),
            inner,
        })
    }

    /// The table's columns. A changelog's batches carry one more, last,
    /// column: [`skein_engine::changelog::OP_COLUMN`].
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Whether a record may be rejected only when its batch is built
    /// ([`BatchBuilder::finish`] then lists it with its bytes): Avro, whose
    /// strings are checked then.
    pub fn rejects_late(&self) -> bool {
        matches!(self.inner, Inner::Avro(_))
    }

    /// Whether the records are changes to a table (Debezium).
    pub fn changelog(&self) -> bool {
        matches!(self.inner, Inner::Debezium(_))
    }

    /// What is wrong with the schema registry the decoder uses, if it has
    /// one and it does not answer (for `skein status`).
    pub fn registry_problem(&self) -> Option<String> {
        match &self.inner {
            Inner::Avro(d) => d.registry_problem(),
            Inner::Protobuf(d) => d.registry_problem(),
            Inner::Debezium(d) => d.registry_problem(),
            Inner::Text(_) => None,
        }
    }

    /// [`Self::registry_problem`] asked off the async threads (the
    /// registry call blocks), as a source's `problems`.
    pub async fn problems(decoder: &std::sync::Arc<Self>) -> Vec<String> {
        let decoder = decoder.clone();
        tokio::task::spawn_blocking(move || decoder.registry_problem())
            .await
            .ok()
            .flatten()
            .into_iter()
            .collect()
    }

    /// A builder that decodes records one at a time into one batch; room
    /// for `capacity` rows is reserved up front.
    pub fn builder(&self, capacity: usize) -> BatchBuilder<'_> {
        BatchBuilder {
            max_record_bytes: self.max_record_bytes,
            records: 0,
            rejected: vec![],
            rows: match &self.inner {
                Inner::Text(d) => Rows::Text(d.builder(capacity)),
                Inner::Avro(d) => Rows::Avro(d.builder()),
                Inner::Protobuf(d) => Rows::Protobuf(d.builder(capacity)),
                Inner::Debezium(d) => Rows::Debezium(d.builder(capacity)),
            },
        }
    }

    /// Decode every record; rejected ones add no row.
    pub fn decode<'a>(
        &self,
        records: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<(RecordBatch, Vec<Rejected>)> {
        let mut builder = self.builder(records.len());
        for record in records {
            builder.push(record);
        }
        builder.finish()
    }
}

/// Decodes records one at a time into one batch.
pub struct BatchBuilder<'d> {
    max_record_bytes: usize,
    /// Records pushed so far, rejected ones included.
    records: usize,
    rejected: Vec<Rejected>,
    rows: Rows<'d>,
}

enum Rows<'d> {
    Text(TextBuilder<'d>),
    Avro(AvroBuilder<'d>),
    Protobuf(ProtobufBuilder<'d>),
    Debezium(DebeziumBuilder<'d>),
}

impl BatchBuilder<'_> {
    /// Decode one record into a row (a changelog: into the rows it
    /// changes), or reject it; returns the reason of a rejection (the
    /// record is also listed in what `finish` returns).
    pub fn push(&mut self, record: &[u8]) -> Option<&str> {
        let index = self.records;
        self.records += 1;
        let outcome = if record.len() > self.max_record_bytes {
            Err(format!(
                "record of {} bytes exceeds the limit of {} bytes",
                record.len(),
                self.max_record_bytes
            ))
        } else {
            match &mut self.rows {
                Rows::Text(b) => b.push(record),
                Rows::Avro(b) => b.push(index, record),
                Rows::Protobuf(b) => b.push(record),
                Rows::Debezium(b) => b.push(record),
            }
        };
        match outcome {
            Ok(()) => None,
            Err(reason) => {
                self.rejected.push(Rejected {
                    index,
                    reason,
                    record: None,
                });
                self.rejected.last().map(|r| r.reason.as_str())
            }
        }
    }

    /// Records pushed so far, rejected ones included.
    pub fn records(&self) -> usize {
        self.records
    }

    /// The batch of every accepted record, and the rejected ones (by
    /// index; those rejected only now carry their bytes).
    pub fn finish(self) -> Result<(RecordBatch, Vec<Rejected>)> {
        let mut rejected = self.rejected;
        let batch = match self.rows {
            Rows::Text(b) => b.finish()?,
            Rows::Avro(b) => {
                let (batch, late) = b.finish()?;
                rejected.extend(late);
                rejected.sort_by_key(|r| r.index);
                batch
            }
            Rows::Protobuf(b) => b.finish()?,
            Rows::Debezium(b) => b.finish()?,
        };
        Ok((batch, rejected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Int64Array};
    use datafusion::arrow::datatypes::{
        DataType, Field, Schema, TimeUnit, TimestampNanosecondType,
    };
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ad_id", DataType::Utf8, false),
            Field::new("event_type", DataType::Utf8, false),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                false,
            ),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn json_keeps_declared_fields_and_rejects_bad_records() {
        let d = RecordDecoder::new(schema(), Format::Json, 1024).unwrap();
        let records: Vec<&[u8]> = vec![
            br#"{"user_id": "u", "ad_id": "a1", "event_type": "view", "event_time": "1000", "x": {"y": [1, "}"]}}"#,
            br#"{"ad_id": "a\"2", "event_type": "click", "event_time": 2000, "n": 7}"#,
            br#"{"ad_id": "a3", "event_type": "view""#,
            br#"{"ad_id": 5, "event_type": "view", "event_time": "1"}"#,
            br#"{"event_type": "view", "event_time": "1"}"#,
            br#"{"ad_id": "a", "event_type": "view", "event_time": "soon"}"#,
            b"not json",
        ];
        let (batch, rejected) = d.decode(records.into_iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(0).as_string::<i32>().value(1), "a\"2");
        let ts = batch.column(2).as_primitive::<TimestampNanosecondType>();
        assert_eq!(ts.value(0), 1_000_000_000);
        let n = batch
            .column(3)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert!(n.is_null(0));
        assert_eq!(n.value(1), 7);
        let idx: Vec<usize> = rejected.iter().map(|r| r.index).collect();
        assert_eq!(idx, vec![2, 3, 4, 5, 6]);
        assert!(
            rejected[2].reason.contains("missing field \"ad_id\""),
            "{rejected:?}"
        );
    }

    #[test]
    fn json_numbers_bad_utf8_and_bad_nesting_are_rejected_with_a_reason() {
        let d = RecordDecoder::new(schema(), Format::Json, 1024).unwrap();
        let ok = r#"{"ad_id": "a", "event_type": "v", "event_time": "1000""#;
        let mut bad_utf8 = format!(r#"{ok}, "x": "caf"#).into_bytes();
        bad_utf8.extend_from_slice(&[0xC3, 0x28]);
        bad_utf8.extend_from_slice(b"\"}");
        let records: Vec<Vec<u8>> = vec![
            // A timestamp still takes a string of ms.
            format!("{ok}, \"n\": 12}}").into_bytes(),
            format!("{ok}, \"n\": \"12\"}}").into_bytes(),
            format!("{ok}, \"n\": 1.5}}").into_bytes(),
            bad_utf8,
            format!("{ok}, \"x\": {{\"y\": [1}}]}}}}").into_bytes(),
            format!("{ok}, \"x\": [1 2]}}").into_bytes(),
        ];
        let (batch, rejected) = d.decode(records.iter().map(Vec::as_slice)).unwrap();
        assert_eq!(batch.num_rows(), 1, "{rejected:?}");
        let reasons: Vec<(usize, &str)> = rejected
            .iter()
            .map(|r| (r.index, r.reason.as_str()))
            .collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert_eq!(
            reasons[0],
            (1, "field \"n\": expected a number, got a string")
        );
        assert!(reasons[1].1.contains("expected an integer"), "{reasons:?}");
        assert!(reasons[2].1.starts_with("invalid UTF-8"), "{reasons:?}");
        assert!(
            reasons[3].1.contains("bad JSON in the object or array"),
            "{reasons:?}"
        );
        assert!(
            reasons[4].1.contains("bad JSON in the object or array"),
            "{reasons:?}"
        );

        let floats = Arc::new(Schema::new(vec![Field::new("f", DataType::Float64, false)]));
        let d = RecordDecoder::new(floats, Format::Json, 1024).unwrap();
        let (batch, rejected) = d
            .decode([&br#"{"f": 1.5}"#[..], br#"{"f": "1.5"}"#].into_iter())
            .unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert!(
            rejected[0]
                .reason
                .contains("expected a number, got a string")
        );
    }

    #[test]
    fn csv_and_size_limit() {
        let d = RecordDecoder::new(schema(), Format::Csv { delimiter: b',' }, 40).unwrap();
        let records: Vec<&[u8]> = vec![
            b"a1,view,1000,3\n",
            b"\"a,2\",view,1000,",
            b"a1,view\n",
            b"a1,view,1000,3,this line is far too long for the limit",
        ];
        let (batch, rejected) = d.decode(records.into_iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(0).as_string::<i32>().value(1), "a,2");
        assert_eq!(rejected.len(), 2);
        assert!(rejected[1].reason.contains("exceeds"));
    }
}
