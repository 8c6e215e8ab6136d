//! Record decoders: JSON, CSV and raw bytes straight into Arrow columns of a
//! declared schema.
//!
//! Only the declared fields are decoded; other JSON keys are skipped without
//! being parsed into values. A record that does not fit the schema (bad
//! syntax, a missing non-nullable field, a value of the wrong type, too many
//! bytes) is rejected with its reason and adds no row: the caller sends it to
//! the dead-letter destination.

//!
//! The files: this one is the API (formats, the decoder and its batch
//! builder, dead-letter records); `columns.rs` checks values against column
//! types and builds the Arrow columns; `json.rs` and `csv.rs` are the
//! scanners that find each declared field's raw value in a record.

mod columns;
mod csv;
mod json;

use std::str::FromStr;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{ConnectorError, Result};
use columns::{ColumnBuilder, Typed, typed_value};
use csv::scan_csv;
use json::{fast_scan_json, scan_json};

/// How record bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One flat JSON object per record.
    Json,
    /// One line of delimited text per record, fields in declared order.
    Csv { delimiter: u8 },
    /// The whole record in the first declared column (Utf8 or Binary).
    Raw,
}

impl FromStr for Format {
    type Err = ConnectorError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv { delimiter: b',' }),
            "raw" => Ok(Format::Raw),
            other => Err(ConnectorError::Config(format!(
                "unknown format {other:?}; known: json, csv, raw"
            ))),
        }
    }
}

/// A record that was not decoded, by its index in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub index: usize,
    pub reason: String,
}

/// Decodes records of one format into batches of one schema.
#[derive(Debug, Clone)]
pub struct RecordDecoder {
    schema: SchemaRef,
    format: Format,
    names: Vec<Vec<u8>>,
    max_record_bytes: usize,
}

/// One value as found in a record, before it is checked against its type.
/// Positions are byte offsets into the record, so that the scratch space
/// holding them can outlive any one record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raw {
    Null,
    /// String contents without quotes; `escaped` if they hold a backslash.
    Str {
        start: u32,
        end: u32,
        escaped: bool,
    },
    Num {
        start: u32,
        end: u32,
    },
    Bool(bool),
    /// An object or array: no declared type takes one.
    Nested,
}

/// The most of a rejected record a dead letter carries. A letter must fit
/// its destination (a Kafka message, about 1 MiB by default; a Kinesis
/// record, 1 MiB): one embedding a whole oversized record is refused, and
/// the query would fail on it at every restart. Even escaped (at most six
/// bytes a byte) 64 KiB stays well under.
pub const DEAD_LETTER_PREFIX_BYTES: usize = 64 << 10;

/// A rejected record as its dead letter carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterRecord {
    /// The record as text (invalid UTF-8 replaced), or its first
    /// [`DEAD_LETTER_PREFIX_BYTES`] when it is longer.
    pub record: String,
    /// The record's size in bytes.
    pub size: usize,
    pub truncated: bool,
}

impl LetterRecord {
    pub fn new(record: &[u8]) -> Self {
        let truncated = record.len() > DEAD_LETTER_PREFIX_BYTES;
        let kept = &record[..record.len().min(DEAD_LETTER_PREFIX_BYTES)];
        LetterRecord {
            record: String::from_utf8_lossy(kept).into_owned(),
            size: record.len(),
            truncated,
        }
    }
}

/// What the scanner found about a record as a whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanned {
    /// The whole record is known to be UTF-8 (all ASCII, or checked), so
    /// every slice of it between quotes is too.
    pub(crate) utf8: bool,
}

impl RecordDecoder {
    pub fn new(schema: SchemaRef, format: Format, max_record_bytes: usize) -> Result<Self> {
        for f in schema.fields() {
            let supported = matches!(
                f.data_type(),
                DataType::Utf8
                    | DataType::Utf8View
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::Float64
                    | DataType::Boolean
                    | DataType::Timestamp(_, None)
            ) || (format == Format::Raw && *f.data_type() == DataType::Binary);
            if !supported {
                return Err(ConnectorError::Config(format!(
                    "column {} has type {}, which the {format:?} decoder does not produce",
                    f.name(),
                    f.data_type()
                )));
            }
        }
        if format == Format::Raw && schema.fields().is_empty() {
            return Err(ConnectorError::Config(
                "the raw format needs one column".into(),
            ));
        }
        Ok(RecordDecoder {
            names: schema
                .fields()
                .iter()
                .map(|f| f.name().as_bytes().to_vec())
                .collect(),
            schema,
            format,
            // Positions are kept as u32.
            max_record_bytes: max_record_bytes.min(u32::MAX as usize),
        })
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// A builder that decodes records one at a time into one batch; room
    /// for `capacity` rows is reserved up front.
    pub fn builder(&self, capacity: usize) -> BatchBuilder<'_> {
        BatchBuilder {
            decoder: self,
            columns: self
                .schema
                .fields()
                .iter()
                .map(|f| ColumnBuilder::new(f.data_type(), capacity))
                .collect(),
            rejected: vec![],
            records: 0,
            raw: vec![None; self.names.len()],
            typed: Vec::with_capacity(self.names.len()),
            quotes: Vec::with_capacity(64),
            keys: vec![],
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

    fn check(
        &self,
        record: &[u8],
        scanned: Scanned,
        raw: &[Option<Raw>],
        typed: &mut Vec<Typed>,
    ) -> std::result::Result<(), String> {
        for (field, value) in self.schema.fields().iter().zip(raw) {
            let name = field.name();
            let v = match value {
                None | Some(Raw::Null) if field.is_nullable() => Typed::Null,
                None => return Err(format!("missing field {name:?}")),
                Some(Raw::Null) => return Err(format!("field {name:?} is null")),
                Some(v) => typed_value(field.data_type(), *v, self.format, record, scanned)
                    .map_err(|why| format!("field {name:?}: {why}"))?,
            };
            typed.push(v);
        }
        Ok(())
    }
}

/// Decodes records one at a time into the columns of one batch.
pub struct BatchBuilder<'d> {
    decoder: &'d RecordDecoder,
    columns: Vec<ColumnBuilder>,
    rejected: Vec<Rejected>,
    /// Records pushed so far, rejected ones included.
    records: usize,
    raw: Vec<Option<Raw>>,
    typed: Vec<Typed>,
    /// Positions of the quotes of the record being scanned.
    quotes: Vec<u32>,
    /// The keys of the last record the fast scanner read, in order, with
    /// their columns: records of one stream mostly repeat their keys.
    keys: Vec<(Vec<u8>, Option<usize>)>,
}

impl BatchBuilder<'_> {
    /// Decode one record into a row, or reject it; returns the reason of a
    /// rejection (the record is also listed in what `finish` returns).
    pub fn push(&mut self, record: &[u8]) -> Option<&str> {
        let d = self.decoder;
        let index = self.records;
        self.records += 1;
        self.raw.iter_mut().for_each(|r| *r = None);
        self.typed.clear();
        let outcome = if record.len() > d.max_record_bytes {
            Err(format!(
                "record of {} bytes exceeds the limit of {} bytes",
                record.len(),
                d.max_record_bytes
            ))
        } else {
            match d.format {
                Format::Json => {
                    match fast_scan_json(
                        record,
                        &d.names,
                        &mut self.raw,
                        &mut self.quotes,
                        &mut self.keys,
                    ) {
                        Some(scanned) => Ok(scanned),
                        None => {
                            // Anything unusual (escapes, nesting, bad syntax):
                            // the careful scanner decides, and says why.
                            self.raw.iter_mut().for_each(|r| *r = None);
                            scan_json(record, &d.names, &mut self.raw)
                                .map(|()| Scanned { utf8: false })
                        }
                    }
                    // JSON is UTF-8 throughout, undeclared fields included.
                    .and_then(|scanned| match scanned.utf8 {
                        true => Ok(scanned),
                        false => std::str::from_utf8(record)
                            .map(|_| Scanned { utf8: true })
                            .map_err(|e| format!("invalid UTF-8: {e}")),
                    })
                }
                Format::Csv { delimiter } => {
                    scan_csv(record, delimiter, &mut self.raw).map(|()| Scanned { utf8: false })
                }
                Format::Raw => {
                    self.raw[0] = Some(Raw::Str {
                        start: 0,
                        end: record.len() as u32,
                        escaped: false,
                    });
                    Ok(Scanned { utf8: false })
                }
            }
            .and_then(|scanned| d.check(record, scanned, &self.raw, &mut self.typed))
        };
        match outcome {
            Ok(()) => {
                for (col, value) in self.columns.iter_mut().zip(self.typed.drain(..)) {
                    col.append(value, record);
                }
                None
            }
            Err(reason) => {
                self.rejected.push(Rejected { index, reason });
                self.rejected.last().map(|r| r.reason.as_str())
            }
        }
    }

    /// Records pushed so far, rejected ones included.
    pub fn records(&self) -> usize {
        self.records
    }

    /// The batch of every accepted record, and the rejected ones.
    pub fn finish(self) -> Result<(RecordBatch, Vec<Rejected>)> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .into_iter()
            .map(ColumnBuilder::finish)
            .collect();
        let batch = RecordBatch::try_new(self.decoder.schema.clone(), arrays)?;
        Ok((batch, self.rejected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray, Int64Array};
    use datafusion::arrow::datatypes::{Field, Schema, TimeUnit, TimestampNanosecondType};
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
    fn dead_letters_keep_a_bounded_prefix() {
        let small = LetterRecord::new(b"{\"a\": 1}");
        assert_eq!(
            (small.record.as_str(), small.size, small.truncated),
            ("{\"a\": 1}", 8, false)
        );
        let big = vec![b'x'; 3 << 20];
        let letter = LetterRecord::new(&big);
        assert_eq!(letter.record.len(), DEAD_LETTER_PREFIX_BYTES);
        assert_eq!((letter.size, letter.truncated), (3 << 20, true));
        // Cut inside a character: replaced, never a panic.
        let mut text = vec![b'a'; DEAD_LETTER_PREFIX_BYTES - 1];
        text.extend_from_slice("é".repeat(10).as_bytes());
        assert!(LetterRecord::new(&text).record.ends_with('\u{FFFD}'));
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
