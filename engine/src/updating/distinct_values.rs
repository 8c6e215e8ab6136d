//! `count(DISTINCT x)` of 64-bit integers over rows that append, for every
//! group at once. The distinct counts of one argument share one set per
//! group: each value once, with a bit per aggregate that counted it (each
//! may have a FILTER of its own). NEXMark q15 counts distinct bidders and
//! auctions at four price levels: one set of each, where DataFusion's
//! accumulators kept four. A value costs 9 bytes and its slot in the index
//! 5; a count per aggregate and group says how many values have its bit.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{FieldRef, Int64Type};
use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;
use std::sync::Arc;

use super::aggregate_columns::Op;
use crate::error::{EngineError, Result};

/// Distinct counts that share a set: at most this many per family.
pub(super) const MEMBERS: usize = 8;

/// One group's values, each with the bits of the aggregates that counted
/// it.
#[derive(Default)]
struct MaskedSet {
    values: Vec<i64>,
    masks: Vec<u8>,
    /// Positions in `values`, by the value's hash.
    index: HashTable<u32>,
}

impl MaskedSet {
    /// Count `v` for the aggregate of `bit`: whether it was new to it.
    fn insert(&mut self, hasher: &DefaultHashBuilder, v: i64, bit: u8) -> bool {
        let hash = hasher.hash_one(v);
        let values = &self.values;
        if let Some(i) = self.index.find(hash, |i| values[*i as usize] == v) {
            let mask = &mut self.masks[*i as usize];
            let new = *mask & bit == 0;
            *mask |= bit;
            return new;
        }
        let i = self.values.len() as u32;
        self.values.push(v);
        self.masks.push(bit);
        let values = &self.values;
        self.index
            .insert_unique(hash, i, |j| hasher.hash_one(values[*j as usize]));
        true
    }

    fn bytes(&self) -> usize {
        self.values.capacity() * 8 + self.masks.capacity() + self.index.capacity() * 5
    }
}

/// The shared sets of one argument, by group slot.
pub(super) struct DistinctFamily {
    hasher: DefaultHashBuilder,
    sets: Vec<Option<MaskedSet>>,
}

impl DistinctFamily {
    pub(super) fn new() -> Self {
        DistinctFamily {
            hasher: DefaultHashBuilder::default(),
            sets: vec![],
        }
    }

    /// Slot `slot` holds no value (a new group's, or a group gone).
    pub(super) fn reset(&mut self, slot: usize) {
        if slot < self.sets.len() {
            self.sets[slot] = None;
        } else {
            self.sets.resize_with(slot + 1, || None);
        }
    }

    /// Bytes the set of `slot` holds.
    pub(super) fn bytes(&self, slot: usize) -> usize {
        self.sets
            .get(slot)
            .and_then(Option::as_ref)
            .map_or(0, MaskedSet::bytes)
    }

    /// Row `r`'s value goes to group `slots[r]` for the aggregate of
    /// `bit`, where `mask` lets it, and `counts` counts each value new to
    /// it. `values` are the argument (`Add`) or, merged, lists of values
    /// (a partial aggregate's state, or a checkpoint's).
    pub(super) fn add(
        &mut self,
        slots: &[u32],
        values: &ArrayRef,
        mask: Option<&BooleanArray>,
        bit: u8,
        counts: &mut [i64],
        op: Op,
    ) -> Result<()> {
        let counted = |r: usize| mask.is_none_or(|m| m.is_valid(r) && m.value(r));
        let mut put = |set: &mut Option<MaskedSet>, slot: usize, v: i64| {
            let set = set.get_or_insert_with(MaskedSet::default);
            if set.insert(&self.hasher, v, bit) {
                counts[slot] += 1;
            }
        };
        match op {
            Op::Add => {
                let v = values
                    .as_primitive_opt::<Int64Type>()
                    .ok_or_else(mistyped)?;
                for (r, s) in slots.iter().enumerate() {
                    if counted(r) && v.is_valid(r) {
                        let s = *s as usize;
                        put(&mut self.sets[s], s, v.value(r));
                    }
                }
            }
            Op::Merge => {
                let lists = values.as_list_opt::<i32>().ok_or_else(mistyped)?;
                let items = lists
                    .values()
                    .as_primitive_opt::<Int64Type>()
                    .ok_or_else(mistyped)?;
                for (r, s) in slots.iter().enumerate() {
                    if lists.is_null(r) {
                        continue;
                    }
                    let s = *s as usize;
                    let (from, to) = (
                        lists.value_offsets()[r] as usize,
                        lists.value_offsets()[r + 1] as usize,
                    );
                    for i in from..to {
                        if items.is_valid(i) {
                            put(&mut self.sets[s], s, items.value(i));
                        }
                    }
                }
            }
            Op::Retract => {
                return Err(EngineError::Context(
                    "a distinct count over rows that append was asked to take a value back".into(),
                ));
            }
        }
        Ok(())
    }

    /// The values of each of `slots` that the aggregate of `bit` counted,
    /// as DataFusion's distinct count writes its state: a list per group,
    /// of items `item`.
    pub(super) fn state(&self, slots: &[u32], bit: u8, item: &FieldRef) -> Result<ArrayRef> {
        let mut values: Vec<i64> = vec![];
        let mut offsets: Vec<i32> = vec![0];
        for s in slots {
            if let Some(set) = self.sets.get(*s as usize).and_then(Option::as_ref) {
                values.extend(
                    set.values
                        .iter()
                        .zip(&set.masks)
                        .filter(|(_, m)| **m & bit != 0)
                        .map(|(v, _)| *v),
                );
            }
            offsets.push(i32::try_from(values.len()).map_err(|_| {
                EngineError::Context(
                    "a distinct count's checkpoint list is over 2^31 values".into(),
                )
            })?);
        }
        Ok(Arc::new(ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(offsets.into()),
            Arc::new(Int64Array::from(values)),
            None,
        )?))
    }
}

fn mistyped() -> EngineError {
    EngineError::Context("a distinct count's values are not 64-bit integers".into())
}
