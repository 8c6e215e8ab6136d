//! Comparing results: what changed between two versions of the rows of
//! some keys, and the table a changelog adds up to.

use std::collections::HashMap;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;

use super::row_key::RowEncoder;
use crate::changelog;
use crate::error::Result;

/// The changes from `old` to `new` (rows of one schema, as multisets):
/// `(retractions, inserts)`. A row in both, as often, is no change.
pub fn diff(
    encoder: &RowEncoder,
    old: &RecordBatch,
    new: &RecordBatch,
) -> Result<(RecordBatch, RecordBatch)> {
    let old_rows = encoder.encode(old)?;
    let new_rows = encoder.encode(new)?;
    let mut unmatched: HashMap<&[u8], Vec<u32>> = HashMap::new();
    for (i, r) in old_rows.iter().enumerate() {
        unmatched.entry(r.data()).or_default().push(i as u32);
    }
    let mut inserts = vec![];
    for (i, r) in new_rows.iter().enumerate() {
        match unmatched.get_mut(r.data()).and_then(Vec::pop) {
            Some(_) => {}
            None => inserts.push(i as u32),
        }
    }
    let mut retracts: Vec<u32> = unmatched.into_values().flatten().collect();
    retracts.sort_unstable();
    Ok((
        take_record_batch(old, &UInt32Array::from(retracts))?,
        take_record_batch(new, &UInt32Array::from(inserts))?,
    ))
}

/// The table a changelog adds up to: each row counted up by its inserts
/// and down by its retractions, whatever order they came in (a reader of
/// files or topics may see epochs out of order); rows counted above zero
/// remain, as often as counted.
#[derive(Debug)]
pub struct Consolidated {
    schema: SchemaRef,
    encoder: RowEncoder,
    batches: Vec<RecordBatch>,
    counts: HashMap<Box<[u8]>, (i64, usize, usize)>,
}

impl Consolidated {
    /// An empty table of `schema` (without the op column).
    pub fn new(schema: SchemaRef) -> Result<Self> {
        Ok(Consolidated {
            encoder: RowEncoder::whole(&schema)?,
            schema,
            batches: vec![],
            counts: HashMap::new(),
        })
    }

    /// Apply one changelog batch (with [`changelog::OP_COLUMN`]).
    pub fn apply(&mut self, batch: &RecordBatch) -> Result<()> {
        let ops = changelog::ops(batch)?.clone();
        let plain = changelog::strip(batch)?;
        let rows = self.encoder.encode(&plain)?;
        let b = self.batches.len();
        for (i, row) in rows.iter().enumerate() {
            let weight = i64::from(ops.value(i));
            let entry = self
                .counts
                .entry(Box::from(row.as_ref()))
                .or_insert((0, b, i));
            entry.0 += weight;
        }
        self.batches.push(plain);
        Ok(())
    }

    /// The table now.
    pub fn rows(&self) -> Result<RecordBatch> {
        let mut slots: Vec<(usize, usize)> = vec![];
        for (count, b, r) in self.counts.values() {
            for _ in 0..(*count).max(0) {
                slots.push((*b, *r));
            }
        }
        if slots.is_empty() {
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        slots.sort_unstable();
        let batches: Vec<&RecordBatch> = self.batches.iter().collect();
        super::row_key::interleave_rows(&self.schema, &batches, &slots)
    }
}

/// The table a sequence of changelog batches adds up to; batches that are
/// no changelog are taken as inserts.
pub fn consolidate(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    let plain = changelog::without_op(schema);
    let mut table = Consolidated::new(plain)?;
    for b in batches {
        if changelog::is_changelog(&b.schema()) {
            table.apply(b)?;
        } else {
            table.apply(&changelog::tag(b, changelog::INSERT)?)?;
        }
    }
    table.rows()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
    }

    #[test]
    fn the_diff_keeps_what_did_not_change() {
        let enc = RowEncoder::whole(&batch(&[]).schema()).unwrap();
        let (retract, insert) = diff(&enc, &batch(&[1, 2, 2, 3]), &batch(&[2, 3, 4, 4])).unwrap();
        assert_eq!(retract, batch(&[1, 2]));
        assert_eq!(insert, batch(&[4, 4]));
    }

    #[test]
    fn a_changelog_adds_up_to_its_last_rows() {
        let schema = changelog::with_op(&batch(&[]).schema());
        let first = changelog::tag(&batch(&[1, 2]), changelog::INSERT).unwrap();
        let second = changelog::tag_each(
            &batch(&[2, 5]),
            datafusion::arrow::array::Int8Array::from(vec![-1, 1]),
        )
        .unwrap();
        let table = consolidate(&schema, &[first, second]).unwrap();
        assert_eq!(table, batch(&[1, 5]));
    }
}
