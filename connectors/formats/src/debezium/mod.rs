//! Debezium change events as an updating table: `'format' 'debezium-json'`
//! and `'format' 'debezium-avro-confluent'`.
//!
//! An event is an envelope `{before, after, op, ...}` (in JSON also wrapped
//! in `{schema, payload}` when the converter writes schemas). The table's
//! columns are read from `before` and `after`; each event becomes rows of
//! a changelog ([`skein_engine::changelog`]): a create (`c`) or a snapshot
//! read (`r`) inserts `after`; an update (`u`) retracts `before` and
//! inserts `after`; a delete (`d`) retracts `before`. A tombstone (a record
//! without a value) adds nothing. An event that cannot be applied (an
//! update or delete without `before`, which the source database gives only
//! with full row images; an unknown `op`) is rejected with its reason.

mod avro;
mod json;

use std::collections::HashMap;

use datafusion::arrow::array::{BooleanArray, Int8Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
use skein_engine::changelog::{INSERT, RETRACT};

pub use avro::DebeziumAvroBuilder;
pub use json::DebeziumJsonBuilder;

use crate::avro::AvroFormat;
use crate::text::TextDecoder;
use crate::text::scanned::TextFormat;
use skein_clients::error::{ConnectorError, Result};

/// Decodes Debezium events into changelog batches of the table's columns.
#[derive(Debug)]
pub struct DebeziumDecoder {
    schema: SchemaRef,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Json(TextDecoder),
    Avro(avro::EnvelopeDecoder),
}

impl DebeziumDecoder {
    pub fn json(schema: SchemaRef) -> Result<Self> {
        no_columns(&schema)?;
        Ok(DebeziumDecoder {
            kind: Kind::Json(TextDecoder::new(schema.clone(), TextFormat::Json)?),
            schema,
        })
    }

    pub fn avro(schema: SchemaRef, format: AvroFormat) -> Result<Self> {
        no_columns(&schema)?;
        Ok(DebeziumDecoder {
            kind: Kind::Avro(avro::EnvelopeDecoder::new(schema.clone(), format)),
            schema,
        })
    }

    /// The table's columns (the rows of `before` and `after`).
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    pub(crate) fn registry_problem(&self) -> Option<String> {
        match &self.kind {
            Kind::Avro(d) => d.registry_problem(),
            Kind::Json(_) => None,
        }
    }

    pub fn builder(&self, capacity: usize) -> DebeziumBuilder<'_> {
        match &self.kind {
            Kind::Json(d) => DebeziumBuilder::Json(DebeziumJsonBuilder::new(d, capacity)),
            Kind::Avro(d) => DebeziumBuilder::Avro(DebeziumAvroBuilder::new(d)),
        }
    }
}

fn no_columns(schema: &SchemaRef) -> Result<()> {
    if schema.fields().is_empty() {
        return Err(ConnectorError::Config(
            "a Debezium table declares its columns (those of the rows it carries)".into(),
        ));
    }
    Ok(())
}

/// Decodes Debezium events one at a time into one changelog batch.
pub enum DebeziumBuilder<'d> {
    Json(DebeziumJsonBuilder<'d>),
    Avro(DebeziumAvroBuilder<'d>),
}

impl DebeziumBuilder<'_> {
    pub(crate) fn push(&mut self, record: &[u8]) -> std::result::Result<(), String> {
        match self {
            DebeziumBuilder::Json(b) => b.push(record),
            DebeziumBuilder::Avro(b) => b.push(record),
        }
    }

    /// The rows, with the changelog's op column last.
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        match self {
            DebeziumBuilder::Json(b) => b.finish(),
            DebeziumBuilder::Avro(b) => b.finish(),
        }
    }
}

/// What an event does to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Insert `after` (create, snapshot read).
    Insert,
    /// Retract `before`, insert `after`.
    Update,
    /// Retract `before`.
    Delete,
}

impl Change {
    fn of(op: &str) -> std::result::Result<Self, String> {
        match op {
            "c" | "r" => Ok(Change::Insert),
            "u" => Ok(Change::Update),
            "d" => Ok(Change::Delete),
            other => Err(format!(
                "Debezium op {other:?} is not a change of a row (c, r, u or d)"
            )),
        }
    }

    /// Checks the images an event carries against what its op needs.
    fn check(self, before: bool, after: bool) -> std::result::Result<(), String> {
        let missing = match self {
            Change::Insert if !after => "after",
            Change::Update | Change::Delete if !before => "before",
            Change::Update if !after => "after",
            _ => return Ok(()),
        };
        Err(format!(
            "a Debezium {self:?} without '{missing}' (updates and deletes need the row's full \
             before image)"
        ))
    }

    /// The op column's values for this change's rows.
    fn ops(self) -> &'static [i8] {
        match self {
            Change::Insert => &[INSERT],
            Change::Update => &[RETRACT, INSERT],
            Change::Delete => &[RETRACT],
        }
    }
}

/// `batch` tagged with `ops`, netted: a row inserted and taken back
/// within the batch (created, then updated or deleted, in one pull) leaves
/// neither. What is left retracts only rows of earlier pulls and inserts
/// only rows that stay, so the batch means the same whatever order its
/// retractions and inserts are applied in (a stage applies them by kind).
fn tagged(batch: &RecordBatch, ops: Vec<i8>) -> Result<RecordBatch> {
    let keep = netted(batch, &ops)?;
    let (batch, ops) = match keep {
        Some(keep) => {
            let mask = BooleanArray::from(keep.clone());
            let ops = ops
                .into_iter()
                .zip(keep)
                .filter_map(|(op, k)| k.then_some(op))
                .collect();
            (filter_record_batch(batch, &mask)?, ops)
        }
        None => (batch.clone(), ops),
    };
    skein_engine::changelog::tag_each(&batch, Int8Array::from(ops))
        .map_err(|e| ConnectorError::Decode(e.to_string()))
}

/// Which rows stay once each retraction cancels the latest earlier insert
/// of the same row; None when nothing cancels.
fn netted(batch: &RecordBatch, ops: &[i8]) -> Result<Option<Vec<bool>>> {
    if !ops.contains(&RETRACT) || !ops.contains(&INSERT) {
        return Ok(None);
    }
    let fields = batch
        .schema()
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let rows = RowConverter::new(fields)?.convert_columns(batch.columns())?;
    let mut inserted: HashMap<&[u8], Vec<usize>> = HashMap::new();
    let mut keep = vec![true; ops.len()];
    for (i, op) in ops.iter().enumerate() {
        let row = rows.row(i).data();
        if *op == INSERT {
            inserted.entry(row).or_default().push(i);
        } else if let Some(j) = inserted.get_mut(row).and_then(Vec::pop) {
            keep[i] = false;
            keep[j] = false;
        }
    }
    Ok(keep.contains(&false).then_some(keep))
}
