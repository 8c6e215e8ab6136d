//! Rows kept by key: a multiset of rows of one schema, indexed by the value
//! of some of their columns, from which an updating stage takes the rows of
//! the keys an epoch touched, and takes back rows a retraction names.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::row::Rows;

pub use crate::changelog::row_key::Key;
use crate::changelog::row_key::{RowEncoder, interleave_rows};
use crate::error::Result;

/// Where a row is kept: batch and row index.
type Slot = (u32, u32);

/// A multiset of rows indexed by key.
#[derive(Debug)]
pub struct KeyedRows {
    schema: SchemaRef,
    /// `None`: every row has the same (empty) key.
    keys: Option<RowEncoder>,
    whole: RowEncoder,
    batches: Vec<RecordBatch>,
    index: HashMap<Key, Vec<Slot>>,
    live: usize,
    dead: usize,
}

impl KeyedRows {
    /// Rows of `schema` keyed by `key` columns (`None`: one group).
    pub fn new(schema: SchemaRef, key: Option<Vec<usize>>) -> Result<Self> {
        Ok(KeyedRows {
            keys: key.map(|k| RowEncoder::new(&schema, k)).transpose()?,
            whole: RowEncoder::whole(&schema)?,
            schema,
            batches: vec![],
            index: HashMap::new(),
            live: 0,
            dead: 0,
        })
    }

    /// The rows' schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Rows kept.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Keys kept.
    pub fn key_count(&self) -> usize {
        self.index.len()
    }

    /// Every key kept.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.index.keys()
    }

    /// Rows kept under `keys`.
    pub fn count_of(&self, keys: &HashSet<Key>) -> usize {
        keys.iter()
            .filter_map(|k| self.index.get(k))
            .map(Vec::len)
            .sum()
    }

    /// Those of `keys` that have at least `rows` rows.
    pub fn crowded(&self, keys: &HashSet<Key>, rows: usize) -> HashSet<Key> {
        keys.iter()
            .filter(|k| self.index.get(*k).is_some_and(|s| s.len() >= rows))
            .cloned()
            .collect()
    }

    /// Bytes of the batches the rows are kept in (taken-back rows included
    /// until a compaction).
    pub fn bytes(&self) -> usize {
        self.batches
            .iter()
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    /// The key of every row of `batch` (of this schema).
    pub fn keys_of(&self, batch: &RecordBatch) -> Result<Vec<Key>> {
        Ok(match &self.keys {
            Some(enc) => {
                let rows = enc.encode(batch)?;
                rows.iter().map(|r| Box::from(r.as_ref())).collect()
            }
            None => vec![Key::default(); batch.num_rows()],
        })
    }

    /// Keep every row of `batch`.
    pub fn insert(&mut self, batch: RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let keys = self.keys_of(&batch)?;
        let b = self.batches.len() as u32;
        for (r, key) in keys.into_iter().enumerate() {
            self.index.entry(key).or_default().push((b, r as u32));
        }
        self.live += batch.num_rows();
        self.batches.push(batch);
        Ok(())
    }

    /// Whether rows are kept under their own keys (not all under one).
    pub fn by_key(&self) -> bool {
        self.keys.is_some()
    }

    /// Whether a row of `key` is kept.
    pub fn has_key(&self, key: &Key) -> bool {
        self.index.contains_key(key)
    }

    /// Take back one kept row equal to each row of `batch`; returns how
    /// many rows of `batch` matched nothing kept.
    pub fn retract(&mut self, batch: &RecordBatch) -> Result<usize> {
        Ok(self
            .retract_matching(batch)?
            .iter()
            .filter(|m| !**m)
            .count())
    }

    /// Take back one kept row equal to each row of `batch`; returns, per
    /// row of `batch`, whether it matched a kept row (and took it back).
    pub fn retract_matching(&mut self, batch: &RecordBatch) -> Result<Vec<bool>> {
        if batch.num_rows() == 0 {
            return Ok(vec![]);
        }
        let keys = self.keys_of(batch)?;
        let wanted = self.whole.encode(batch)?;
        // Kept batches encoded whole, once each, as candidates need them.
        let mut encoded: HashMap<u32, Rows> = HashMap::new();
        let mut matched = vec![false; batch.num_rows()];
        for (r, key) in keys.iter().enumerate() {
            let Some(slots) = self.index.get_mut(key) else {
                continue;
            };
            let mut found = None;
            for (i, (b, row)) in slots.iter().enumerate() {
                if !encoded.contains_key(b) {
                    let rows = self.whole.encode(&self.batches[*b as usize])?;
                    encoded.insert(*b, rows);
                }
                if encoded[b].row(*row as usize) == wanted.row(r) {
                    found = Some(i);
                    break;
                }
            }
            if let Some(i) = found {
                slots.swap_remove(i);
                if slots.is_empty() {
                    self.index.remove(key);
                }
                self.live -= 1;
                self.dead += 1;
                matched[r] = true;
            }
        }
        Ok(matched)
    }

    /// The rows of the given keys (all rows when this keeps one group and
    /// `keys` holds its empty key), as one batch.
    pub fn gather(&self, keys: &HashSet<Key>) -> Result<RecordBatch> {
        let mut slots: Vec<(usize, usize)> = vec![];
        for key in keys {
            if let Some(s) = self.index.get(key) {
                slots.extend(s.iter().map(|(b, r)| (*b as usize, *r as usize)));
            }
        }
        self.take(&mut slots)
    }

    /// Every kept row, as one batch.
    pub fn all(&self) -> Result<RecordBatch> {
        let mut slots: Vec<(usize, usize)> = self
            .index
            .values()
            .flatten()
            .map(|(b, r)| (*b as usize, *r as usize))
            .collect();
        self.take(&mut slots)
    }

    fn take(&self, slots: &mut [(usize, usize)]) -> Result<RecordBatch> {
        if slots.is_empty() {
            return Ok(RecordBatch::new_empty(self.schema.clone()));
        }
        // In the order they were kept: the same input gives the same output.
        slots.sort_unstable();
        let batches: Vec<&RecordBatch> = self.batches.iter().collect();
        interleave_rows(&self.schema, &batches, slots)
    }

    /// Drop every row of the given keys.
    pub fn remove_keys(&mut self, keys: &HashSet<Key>) {
        for key in keys {
            if let Some(slots) = self.index.remove(key) {
                self.live -= slots.len();
                self.dead += slots.len();
            }
        }
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.index.clear();
        self.live = 0;
        self.dead = 0;
    }

    /// Once more rows were taken back than are kept, copy the kept ones
    /// into fresh batches so the taken-back ones free their memory.
    pub fn compact_if_sparse(&mut self) -> Result<()> {
        if self.dead < 4096 || self.dead < self.live {
            return Ok(());
        }
        let all = self.all()?;
        self.clear();
        self.insert(all)
    }

    /// Every kept row, in batches of at most `rows` rows, for a checkpoint.
    pub fn chunks(&self, rows: usize) -> Result<Vec<RecordBatch>> {
        let all = self.all()?;
        let mut out = vec![];
        let mut at = 0;
        while at < all.num_rows() {
            let n = rows.min(all.num_rows() - at);
            out.push(all.slice(at, n));
            at += n;
        }
        Ok(out)
    }
}

/// Rows of several batches of one schema as one.
pub fn concat(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch> {
    match batches {
        [] => Ok(RecordBatch::new_empty(schema.clone())),
        [one] => Ok(one.clone()),
        many => Ok(concat_batches(schema, many)?),
    }
}

/// The schema `Arc` without further ado (keeps call sites short).
pub fn schema_of(batch: &RecordBatch) -> SchemaRef {
    Arc::clone(&batch.schema())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn rows(keys: &[&str], values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    fn key_set(kept: &KeyedRows, keys: &[&str]) -> HashSet<Key> {
        kept.keys_of(&rows(keys, &vec![0; keys.len()]))
            .unwrap()
            .into_iter()
            .collect()
    }

    #[test]
    fn rows_are_found_by_key_and_taken_back_one_at_a_time() {
        let b = rows(&["a"], &[0]);
        let mut kept = KeyedRows::new(b.schema(), Some(vec![0])).unwrap();
        kept.insert(rows(&["a", "b", "a"], &[1, 2, 1])).unwrap();
        kept.insert(rows(&["c"], &[3])).unwrap();
        assert_eq!(kept.len(), 4);
        assert_eq!(kept.gather(&key_set(&kept, &["a"])).unwrap().num_rows(), 2);
        // One of the two equal rows goes; a row never kept matches nothing.
        assert_eq!(kept.retract(&rows(&["a", "a"], &[1, 9])).unwrap(), 1);
        assert_eq!(
            kept.gather(&key_set(&kept, &["a"])).unwrap(),
            rows(&["a"], &[1])
        );
        kept.remove_keys(&key_set(&kept, &["b", "z"]));
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.key_count(), 2);
        assert_eq!(kept.all().unwrap(), rows(&["a", "c"], &[1, 3]));
    }

    #[test]
    fn one_group_gathers_everything() {
        let b = rows(&["a"], &[0]);
        let mut kept = KeyedRows::new(b.schema(), None).unwrap();
        kept.insert(rows(&["x", "y"], &[1, 2])).unwrap();
        let all: HashSet<Key> = [Key::default()].into();
        assert_eq!(kept.gather(&all).unwrap().num_rows(), 2);
        assert_eq!(kept.retract(&rows(&["y"], &[2])).unwrap(), 0);
        assert_eq!(kept.all().unwrap(), rows(&["x"], &[1]));
    }
}
