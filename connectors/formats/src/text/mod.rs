//! The text formats: JSON, CSV and raw bytes, scanned for the raw value
//! of each declared field, then checked against its column type.

pub(crate) mod columns;
mod csv;
pub(crate) mod json;
pub(crate) mod scanned;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use columns::{ColumnBuilder, Typed, typed_value};
use csv::scan_csv;
use json::{fast_scan_json, scan_json};
use scanned::{Raw, Scanned, TextFormat};
use skein_clients::error::{ConnectorError, Result};

/// Decodes text records into batches of one schema.
#[derive(Debug, Clone)]
pub(crate) struct TextDecoder {
    schema: SchemaRef,
    format: TextFormat,
    names: Vec<Vec<u8>>,
}

impl TextDecoder {
    pub(crate) fn new(schema: SchemaRef, format: TextFormat) -> Result<Self> {
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
            ) || (format == TextFormat::Raw && *f.data_type() == DataType::Binary);
            if !supported {
                return Err(ConnectorError::Config(format!(
                    "column {} has type {}, which the {format:?} format does not produce",
                    f.name(),
                    f.data_type()
                )));
            }
        }
        if format == TextFormat::Raw && schema.fields().is_empty() {
            return Err(ConnectorError::Config(
                "the raw format needs one column".into(),
            ));
        }
        Ok(TextDecoder {
            names: schema
                .fields()
                .iter()
                .map(|f| f.name().as_bytes().to_vec())
                .collect(),
            schema,
            format,
        })
    }

    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// A builder that decodes records one at a time into one batch; room
    /// for `capacity` rows is reserved up front.
    pub(crate) fn builder(&self, capacity: usize) -> TextBuilder<'_> {
        TextBuilder {
            decoder: self,
            columns: ColumnBuilder::for_schema(&self.schema, capacity),
            raw: vec![None; self.names.len()],
            typed: Vec::with_capacity(self.names.len()),
            quotes: Vec::with_capacity(64),
            keys: vec![],
        }
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

/// Decodes text records one at a time into the columns of one batch.
pub(crate) struct TextBuilder<'d> {
    decoder: &'d TextDecoder,
    columns: Vec<ColumnBuilder>,
    raw: Vec<Option<Raw>>,
    typed: Vec<Typed>,
    /// Positions of the quotes of the record being scanned.
    quotes: Vec<u32>,
    /// The keys of the last record the fast scanner read, in order, with
    /// their columns: records of one stream mostly repeat their keys.
    keys: Vec<(Vec<u8>, Option<usize>)>,
}

impl TextBuilder<'_> {
    /// Decode one record into a row, or say why not (adding no row).
    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        self.scan(record)?;
        self.append(record);
        Ok(())
    }

    /// Decode two records into two rows, or neither (a Debezium update:
    /// the row before and the row after).
    pub(crate) fn push_pair(&mut self, a: &[u8], b: &[u8]) -> std::result::Result<(), String> {
        self.scan(a)?;
        let first = std::mem::take(&mut self.typed);
        let second = self.scan(b);
        let mut scanned_b = std::mem::replace(&mut self.typed, first);
        second?;
        self.append(a);
        std::mem::swap(&mut self.typed, &mut scanned_b);
        self.append(b);
        Ok(())
    }

    /// The record's values, checked, into `typed`.
    fn scan(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        let d = self.decoder;
        self.raw.iter_mut().for_each(|r| *r = None);
        self.typed.clear();
        let outcome = {
            match d.format {
                TextFormat::Json => {
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
                TextFormat::Csv { delimiter } => {
                    scan_csv(record, delimiter, &mut self.raw).map(|()| Scanned { utf8: false })
                }
                TextFormat::Raw => {
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
        outcome
    }

    fn append(&mut self, record: &[u8]) {
        for (col, value) in self.columns.iter_mut().zip(self.typed.drain(..)) {
            col.append(value, record);
        }
    }

    /// The batch of every accepted record.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .into_iter()
            .map(ColumnBuilder::finish)
            .collect();
        Ok(RecordBatch::try_new(self.decoder.schema.clone(), arrays)?)
    }
}
