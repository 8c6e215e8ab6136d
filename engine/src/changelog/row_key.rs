//! Rows as comparable bytes: a key's value (some columns) or a whole row
//! (every column), for indexing kept rows and matching a retraction to the
//! row it takes back.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::interleave_record_batch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, Rows, SortField};

use crate::error::{EngineError, Result};

/// A key's value as comparable bytes; the empty key when rows are kept
/// as one group.
pub type Key = Box<[u8]>;

/// Encodes the key columns of rows (or every column, for whole rows).
pub struct RowEncoder {
    columns: Vec<usize>,
    converter: RowConverter,
}

impl std::fmt::Debug for RowEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RowEncoder({:?})", self.columns)
    }
}

impl RowEncoder {
    /// An encoder of `columns` of `schema`.
    pub fn new(schema: &SchemaRef, columns: Vec<usize>) -> Result<Self> {
        let mut fields: Vec<SortField> = columns
            .iter()
            .map(|i| SortField::new(schema.field(*i).data_type().clone()))
            .collect();
        if fields.is_empty() {
            // Rows without columns (`count(*)` reads none) are all equal:
            // each is encoded as the same constant, so they still count.
            fields.push(SortField::new(DataType::Boolean));
        }
        if !RowConverter::supports_fields(&fields) {
            return Err(EngineError::plan(format!(
                "an updating stage cannot compare rows of columns {:?} ({:?})",
                columns
                    .iter()
                    .map(|i| schema.field(*i).name().as_str())
                    .collect::<Vec<_>>(),
                columns
                    .iter()
                    .map(|i| schema.field(*i).data_type())
                    .collect::<Vec<_>>()
            )));
        }
        Ok(RowEncoder {
            columns,
            converter: RowConverter::new(fields)?,
        })
    }

    /// An encoder of every column of `schema`.
    pub fn whole(schema: &SchemaRef) -> Result<Self> {
        Self::new(schema, (0..schema.fields().len()).collect())
    }

    /// The encoded columns of every row of `batch`.
    pub fn encode(&self, batch: &RecordBatch) -> Result<Rows> {
        let mut columns: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|i| batch.column(*i).clone())
            .collect();
        if columns.is_empty() {
            columns.push(Arc::new(BooleanArray::from(vec![true; batch.num_rows()])));
        }
        Ok(self.converter.convert_columns(&columns)?)
    }
}

/// The rows at `slots` (batch, row) of `batches`. Rows without columns (a
/// `SELECT 1` under `EXISTS` keeps none) are counted, not built.
pub fn interleave_rows(
    schema: &SchemaRef,
    batches: &[&RecordBatch],
    slots: &[(usize, usize)],
) -> Result<RecordBatch> {
    if schema.fields().is_empty() {
        let options = RecordBatchOptions::new().with_row_count(Some(slots.len()));
        return Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            vec![],
            &options,
        )?);
    }
    Ok(interleave_record_batch(batches, slots)?)
}
