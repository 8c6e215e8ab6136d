//! A files table that is a changelog (`'op.column'`): each row written
//! carries its kind as text, and reading back consolidates the rows into
//! the table they add up to.

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use skein_engine::Result;
use skein_engine::sink::{SinkConfig, SinkRows};

use super::bad;

/// Names the column of each row's kind (see the module).
pub const OP_COLUMN_OPTION: &str = "op.column";
/// The kind of a row of the result.
pub const OP_INSERT: &str = "insert";
/// The kind of a row taken back from the result.
pub const OP_DELETE: &str = "delete";

/// The column of each row's kind, if the table is a changelog.
pub fn op_column(config: &SinkConfig) -> Option<String> {
    config
        .options
        .get(OP_COLUMN_OPTION)
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
}

/// A write's rows as written to a changelog table: one batch with the
/// column `name` holding `delete` for each row taken back (first) and
/// `insert` for each row added.
pub(super) fn with_op_text(schema: &SchemaRef, rows: &SinkRows, name: &str) -> Result<RecordBatch> {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{Field, Schema};
    let (retract, insert) = rows.by_kind();
    let count = |bs: &[RecordBatch]| bs.iter().map(|b| b.num_rows()).sum::<usize>();
    let mut ops = vec![OP_DELETE; count(retract)];
    ops.extend(vec![OP_INSERT; count(insert)]);
    let all: Vec<&RecordBatch> = retract.iter().chain(insert).collect();
    let plain = concat_batches(schema, all)?;
    let mut fields: Vec<_> = plain.schema().fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(name, DataType::Utf8, false)));
    let mut columns = plain.columns().to_vec();
    columns.push(Arc::new(StringArray::from(ops)));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Rows read back from a changelog table (with its `name` column) as the
/// table they add up to.
pub fn consolidate_op_text(
    batches: &[RecordBatch],
    name: &str,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    use datafusion::arrow::array::Int8Array;
    use skein_engine::changelog;
    let mut changes = vec![];
    for b in batches {
        let i = b.schema().index_of(name)?;
        let kinds = cast(b.column(i), &DataType::Utf8)?;
        let ops: Int8Array = kinds
            .as_string::<i32>()
            .iter()
            .map(|k| match k {
                Some(OP_DELETE) => Ok(changelog::RETRACT),
                Some(OP_INSERT) => Ok(changelog::INSERT),
                other => Err(bad(
                    name,
                    format!("a row's kind is {other:?}, not insert or delete"),
                )),
            })
            .collect::<Result<Vec<_>>>()?
            .into();
        let keep: Vec<usize> = (0..b.num_columns()).filter(|c| *c != i).collect();
        changes.push(changelog::tag_each(&b.project(&keep)?, ops)?);
    }
    skein_engine::changelog::consolidate(&changelog::with_op(schema), &changes)
}
