//! The changelog: how an updating result travels between stages and into
//! sinks.
//!
//! A windowed stage emits each window once, so its output only ever adds
//! rows. A stage whose state no watermark closes (an aggregate without a
//! window, a join of two streams, a top-N) instead emits, each epoch, what
//! changed in its result: new rows, and the retraction of rows it emitted
//! before. An update of a key is the retraction of its old row followed by
//! its new row. Such a batch carries the kind of every row in one extra,
//! last column, [`OP_COLUMN`] (`Int8`, never null): [`INSERT`] or
//! [`RETRACT`]. An updating source (a change-data-capture topic) produces
//! the same shape. Everything else (the plan a stage runs, the schema a
//! table declares) never sees the column: a stage splits its input by kind,
//! runs its plan over each part, and tags what comes out.

pub mod diff;
pub mod row_key;

pub use diff::{Consolidated, consolidate, diff};

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, Int8Array};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{EngineError, Result};

/// The name of the column that holds each row's kind.
pub const OP_COLUMN: &str = "__skein_op";
/// A row added to the result.
pub const INSERT: i8 = 1;
/// A row, emitted before, taken back from the result.
pub const RETRACT: i8 = -1;

/// The field of [`OP_COLUMN`].
pub fn op_field() -> Field {
    Field::new(OP_COLUMN, DataType::Int8, false)
}

/// Whether `schema` is a changelog's: its last column is [`OP_COLUMN`].
pub fn is_changelog(schema: &Schema) -> bool {
    schema
        .fields()
        .last()
        .is_some_and(|f| f.name() == OP_COLUMN && f.data_type() == &DataType::Int8)
}

/// `schema` with [`OP_COLUMN`] added last.
pub fn with_op(schema: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(op_field()));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `schema` without [`OP_COLUMN`] (unchanged when it has none).
pub fn without_op(schema: &SchemaRef) -> SchemaRef {
    if !is_changelog(schema) {
        return schema.clone();
    }
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .take(schema.fields().len() - 1)
        .cloned()
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `batch` with every row tagged `op`.
pub fn tag(batch: &RecordBatch, op: i8) -> Result<RecordBatch> {
    let schema = with_op(&batch.schema());
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(Int8Array::from(vec![op; batch.num_rows()])));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `batch` with its rows tagged by `ops`, one per row.
pub fn tag_each(batch: &RecordBatch, ops: Int8Array) -> Result<RecordBatch> {
    if ops.len() != batch.num_rows() || ops.null_count() > 0 {
        return Err(EngineError::Context(format!(
            "a changelog needs one kind per row: {} kinds ({} null) for {} rows",
            ops.len(),
            ops.null_count(),
            batch.num_rows()
        )));
    }
    let schema = with_op(&batch.schema());
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns.push(Arc::new(ops));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The kinds of a changelog batch's rows.
pub fn ops(batch: &RecordBatch) -> Result<&Int8Array> {
    if !is_changelog(&batch.schema()) {
        return Err(EngineError::Context(format!(
            "a changelog batch ends with the column {OP_COLUMN}; this one has {:?}",
            batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
        )));
    }
    let ops = batch
        .column(batch.num_columns() - 1)
        .as_any()
        .downcast_ref::<Int8Array>()
        .expect("checked Int8");
    if let Some(bad) = ops
        .iter()
        .find(|o| !matches!(o, Some(INSERT) | Some(RETRACT)))
    {
        return Err(EngineError::Context(format!(
            "{OP_COLUMN} holds {bad:?}; a row is an insert ({INSERT}) or a retraction ({RETRACT})"
        )));
    }
    Ok(ops)
}

/// `batch` without its [`OP_COLUMN`].
pub fn strip(batch: &RecordBatch) -> Result<RecordBatch> {
    if !is_changelog(&batch.schema()) {
        return Ok(batch.clone());
    }
    let keep: Vec<usize> = (0..batch.num_columns() - 1).collect();
    Ok(batch.project(&keep)?)
}

/// A changelog batch split by kind: `(retractions, inserts)`, each without
/// [`OP_COLUMN`] and in the order they came.
pub fn split(batch: &RecordBatch) -> Result<(RecordBatch, RecordBatch)> {
    let ops = ops(batch)?;
    let plain = strip(batch)?;
    let is_retract: BooleanArray = ops.iter().map(|o| Some(o == Some(RETRACT))).collect();
    let is_insert: BooleanArray = ops.iter().map(|o| Some(o == Some(INSERT))).collect();
    Ok((
        filter_record_batch(&plain, &is_retract)?,
        filter_record_batch(&plain, &is_insert)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    fn batch(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
    }

    #[test]
    fn tagged_rows_split_back_by_kind() {
        let tagged = tag_each(&batch(&[1, 2, 3]), Int8Array::from(vec![1, -1, 1])).unwrap();
        assert!(is_changelog(&tagged.schema()));
        let (retract, insert) = split(&tagged).unwrap();
        assert_eq!(retract, batch(&[2]));
        assert_eq!(insert, batch(&[1, 3]));
        assert_eq!(
            strip(&tag(&batch(&[4]), RETRACT).unwrap()).unwrap(),
            batch(&[4])
        );
        assert_eq!(without_op(&tagged.schema()), batch(&[]).schema());
    }

    #[test]
    fn a_batch_without_kinds_or_with_a_bad_kind_is_refused() {
        assert!(ops(&batch(&[1])).is_err());
        let bad = tag_each(&batch(&[1]), Int8Array::from(vec![0])).unwrap();
        let err = split(&bad).unwrap_err().to_string();
        assert!(err.contains("insert (1) or a retraction (-1)"), "{err}");
        assert!(tag_each(&batch(&[1, 2]), Int8Array::from(vec![1])).is_err());
    }
}
