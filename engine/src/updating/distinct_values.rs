//! `count(DISTINCT x)` of 64-bit integers over rows that append, for every
//! group at once. The distinct counts of one argument share one set per
//! group: each value once, with a bit per aggregate that counted it (each
//! may have a FILTER of its own). NEXMark q15 counts distinct bidders and
//! auctions at four price levels: one set of each, where DataFusion's
//! accumulators kept four. A value costs 9 bytes and its slot in the index
//! 5; a count per aggregate and group says how many values have its bit.
//!
//! Past the memory budget, the values no row named since the last time
//! values moved go to local disk (a second chance: each value carries a
//! bit set when a row names it, cleared when values move). A group's set
//! then knows how many of its values are on disk; a value it does not hold
//! is looked up there (behind a key filter, so a new value costs no read)
//! and comes back with its bits before the row counts it. A value is in
//! memory or on disk, never both. A group that moves to disk whole, or is
//! dropped, takes its values off the disk with it.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{FieldRef, Int64Type};
use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;
use std::sync::Arc;

use super::aggregate_columns::Op;
use super::distinct_on_disk::ValuesOnDisk;
use crate::error::{EngineError, Result};

/// Values a move writes at a time (few in unit tests, so that their moves
/// take several writes).
const MOVE_BATCH: usize = if cfg!(test) { 64 } else { 1 << 16 };

/// Distinct counts that share a set: at most this many per family (the
/// mask's last bit is [`NAMED`]).
pub(super) const MEMBERS: usize = 7;

/// The bit of a mask that says a row named the value since values last
/// moved to disk (the aggregates' bits are below it).
const NAMED: u8 = 1 << MEMBERS;

/// One group's values, each with the bits of the aggregates that counted
/// it.
struct MaskedSet {
    /// The set's name on disk (never reused within a family).
    id: u64,
    values: Vec<i64>,
    /// The aggregates' bits, and [`NAMED`].
    masks: Vec<u8>,
    /// Positions in `values`, by the value's hash.
    index: HashTable<u32>,
    /// Values of the set on disk, and the least and greatest of them
    /// (a value outside is not there: ids that only grow never ask the
    /// disk's filter).
    on_disk: usize,
    disk_range: (i64, i64),
}

impl MaskedSet {
    fn new(id: u64) -> Self {
        MaskedSet {
            id,
            values: vec![],
            masks: vec![],
            index: HashTable::new(),
            on_disk: 0,
            disk_range: (i64::MAX, i64::MIN),
        }
    }

    fn find(&self, hasher: &DefaultHashBuilder, v: i64) -> Option<usize> {
        let values = &self.values;
        self.index
            .find(hasher.hash_one(v), |i| values[*i as usize] == v)
            .map(|i| *i as usize)
    }

    /// Count `v` (at `found`, if the set holds it) for the aggregate of
    /// `bit`: whether it was new to it.
    fn count(
        &mut self,
        hasher: &DefaultHashBuilder,
        found: Option<usize>,
        v: i64,
        bit: u8,
    ) -> bool {
        if let Some(i) = found {
            let mask = &mut self.masks[i];
            let new = *mask & bit == 0;
            *mask |= bit | NAMED;
            return new;
        }
        self.push(hasher, v, bit | NAMED);
        true
    }

    /// A value not in the set, with its mask.
    fn push(&mut self, hasher: &DefaultHashBuilder, v: i64, mask: u8) {
        self.values.push(v);
        self.masks.push(mask);
        self.index_at(hasher, self.values.len() - 1);
    }

    /// Put `values[i]` in the index.
    fn index_at(&mut self, hasher: &DefaultHashBuilder, i: usize) {
        let values = &self.values;
        self.index
            .insert_unique(hasher.hash_one(values[i]), i as u32, |j| {
                hasher.hash_one(values[*j as usize])
            });
    }

    /// Take out the values no row named since the last call (they are
    /// returned with their aggregates' bits), and clear the rest's
    /// [`NAMED`].
    fn take_unnamed(&mut self, hasher: &DefaultHashBuilder) -> Vec<(i64, u8)> {
        let mut out = vec![];
        let mut kept = 0;
        for i in 0..self.values.len() {
            let (v, m) = (self.values[i], self.masks[i]);
            if m & NAMED == 0 {
                out.push((v, m));
            } else {
                self.values[kept] = v;
                self.masks[kept] = m & !NAMED;
                kept += 1;
            }
        }
        if out.is_empty() {
            return out;
        }
        for (v, _) in &out {
            self.disk_range = (self.disk_range.0.min(*v), self.disk_range.1.max(*v));
        }
        self.values.truncate(kept);
        self.masks.truncate(kept);
        self.values.shrink_to_fit();
        self.masks.shrink_to_fit();
        self.index = HashTable::with_capacity(kept);
        for i in 0..kept {
            self.index_at(hasher, i);
        }
        self.on_disk += out.len();
        out
    }

    fn bytes(&self) -> usize {
        self.values.capacity() * 8 + self.masks.capacity() + self.index.capacity() * 5
    }

    /// Whether `v` may be on disk.
    fn may_be_on_disk(&self, v: i64) -> bool {
        self.on_disk > 0 && (self.disk_range.0..=self.disk_range.1).contains(&v)
    }
}

/// A set's id and values with their masks, as they go to disk.
type Run = (u64, Vec<(i64, u8)>);

/// The shared sets of one argument, by group slot.
pub(super) struct DistinctFamily {
    hasher: DefaultHashBuilder,
    sets: Vec<Option<MaskedSet>>,
    /// The id of the next set.
    next_id: u64,
    /// Where values go past the memory budget, if they may.
    disk: Option<ValuesOnDisk>,
    /// Values looked up on disk, and found there, since the last call of
    /// [`Self::lookups`].
    asked: usize,
    found: usize,
    /// Writes to disk that succeed before one fails (tests of that path).
    #[cfg(test)]
    pub(super) fail_writes_after: Option<usize>,
}

impl DistinctFamily {
    pub(super) fn new() -> Self {
        DistinctFamily {
            hasher: DefaultHashBuilder::default(),
            sets: vec![],
            next_id: 0,
            disk: None,
            asked: 0,
            found: 0,
            #[cfg(test)]
            fail_writes_after: None,
        }
    }

    /// From now on, values may move to local disk ([`Self::spill_unnamed`]).
    /// False when no file can be made for them.
    pub(super) fn spill_to_disk(&mut self) -> bool {
        match ValuesOnDisk::create() {
            Ok(store) => {
                self.disk = Some(store);
                true
            }
            Err(e) => {
                tracing::warn!("distinct values stay in memory: {e}");
                false
            }
        }
    }

    /// Values looked up on disk and found there since the last call.
    pub(super) fn lookups(&mut self) -> (usize, usize) {
        (
            std::mem::take(&mut self.asked),
            std::mem::take(&mut self.found),
        )
    }

    /// Values on local disk.
    pub(super) fn spilled(&self) -> usize {
        self.disk.as_ref().map_or(0, ValuesOnDisk::len)
    }

    /// Drop every set, in memory and on disk.
    pub(super) fn clear(&mut self) -> Result<()> {
        self.sets.clear();
        if let Some(disk) = &mut self.disk {
            disk.clear()?;
        }
        Ok(())
    }

    /// Slot `slot` holds no value (a new group's, or a group gone); its
    /// values on disk go too.
    pub(super) fn reset(&mut self, slot: usize) {
        if slot >= self.sets.len() {
            self.sets.resize_with(slot + 1, || None);
        }
        if let Some(set) = self.sets[slot].take()
            && set.on_disk > 0
            && let Some(disk) = &mut self.disk
            && let Err(e) = disk.drop_set(set.id, set.on_disk)
        {
            // Harmless beside the file's space: no set reuses the id.
            tracing::warn!("values of a dropped group stay on disk: {e}");
        }
    }

    /// Move to disk the values no row named since the last move, from
    /// every set. Returns the slots whose sets changed, with the bytes each
    /// held before and after. If the disk fails, every value comes back
    /// into memory and none moves again; an error then is one reading them
    /// back.
    pub(super) fn spill_unnamed(&mut self) -> Result<Vec<(usize, usize, usize)>> {
        let Some(disk) = &mut self.disk else {
            return Ok(vec![]);
        };
        // Written a batch at a time, so a move holds little beside the
        // sets: (slot, set id, values) of the sets taken from since the
        // last write.
        let mut batch: Vec<(usize, Run)> = vec![];
        let mut in_batch = 0;
        let mut before: Vec<(usize, usize)> = vec![];
        let slots = self.sets.len();
        for slot in 0..=slots {
            if let Some(Some(set)) = self.sets.get_mut(slot) {
                let bytes = set.bytes();
                let out = set.take_unnamed(&self.hasher);
                if !out.is_empty() {
                    before.push((slot, bytes));
                    in_batch += out.len();
                    batch.push((slot, (set.id, out)));
                }
            }
            if batch.is_empty() || (in_batch < MOVE_BATCH && slot < slots) {
                continue;
            }
            // The ids stay in `batch`, for a failed write to find the sets.
            let mut runs: Vec<Run> = batch
                .iter_mut()
                .map(|(_, (id, values))| (*id, std::mem::take(values)))
                .collect();
            #[cfg(test)]
            let failed = self.fail_writes_after.as_mut().is_some_and(|n| {
                *n = n.saturating_sub(1);
                *n == 0
            });
            #[cfg(not(test))]
            let failed = false;
            let written = if failed {
                Err(EngineError::Context("a write failed (test)".into()))
            } else {
                disk.put(&mut runs)
            };
            if let Err(e) = written {
                tracing::warn!("distinct values come back into memory and stay there: {e}");
                let slot_of: hashbrown::HashMap<u64, usize> =
                    batch.iter().map(|(slot, (id, _))| (*id, *slot)).collect();
                self.bring_back(runs, &slot_of, &mut before)?;
                return Ok(self.changed(before));
            }
            batch.clear();
            in_batch = 0;
        }
        Ok(self.changed(before))
    }

    /// After a failed write: `unwritten` (set id, values) back into their
    /// sets (at `slot_of`), then every value on disk, and the disk goes.
    /// Adds to `before` the bytes of each set it changes first. If the
    /// disk cannot be read, the values on it stay there.
    fn bring_back(
        &mut self,
        unwritten: Vec<Run>,
        slot_of: &hashbrown::HashMap<u64, usize>,
        before: &mut Vec<(usize, usize)>,
    ) -> Result<()> {
        for (id, values) in unwritten {
            if let Some(set) = slot_of.get(&id).and_then(|s| self.sets[*s].as_mut()) {
                set.on_disk -= values.len();
                for (v, mask) in values {
                    set.push(&self.hasher, v, mask);
                }
            }
        }
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        // All read before any goes in, so a failed read changes nothing.
        let mut read: Vec<(usize, Vec<(i64, u8)>)> = vec![];
        for (slot, set) in self.sets.iter().enumerate() {
            if let Some(set) = set.as_ref().filter(|s| s.on_disk > 0) {
                read.push((slot, disk.read_set(set.id)?));
            }
        }
        let seen: hashbrown::HashSet<usize> = before.iter().map(|(s, _)| *s).collect();
        for (slot, values) in read {
            let Some(set) = self.sets[slot].as_mut() else {
                continue;
            };
            if !seen.contains(&slot) {
                before.push((slot, set.bytes()));
            }
            for (v, mask) in values {
                set.push(&self.hasher, v, mask);
            }
            set.on_disk = 0;
        }
        self.disk = None;
        Ok(())
    }

    /// `before` (slot, bytes) with each set's bytes now.
    fn changed(&self, before: Vec<(usize, usize)>) -> Vec<(usize, usize, usize)> {
        before
            .into_iter()
            .map(|(slot, was)| (slot, was, self.bytes(slot)))
            .collect()
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
        // Values that may be on disk wait until the disk is read.
        let mut waiting: Vec<(usize, i64)> = vec![];
        let mut put = |sets: &mut [Option<MaskedSet>], slot: usize, v: i64| {
            let set = sets[slot].get_or_insert_with(|| {
                self.next_id += 1;
                MaskedSet::new(self.next_id)
            });
            let found = set.find(&self.hasher, v);
            if found.is_none()
                && set.may_be_on_disk(v)
                && self.disk.as_ref().is_some_and(|d| d.may_hold(set.id, v))
            {
                waiting.push((slot, v));
            } else if set.count(&self.hasher, found, v, bit) {
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
                        put(&mut self.sets, *s as usize, v.value(r));
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
                    let (from, to) = (
                        lists.value_offsets()[r] as usize,
                        lists.value_offsets()[r + 1] as usize,
                    );
                    for i in from..to {
                        if items.is_valid(i) {
                            put(&mut self.sets, *s as usize, items.value(i));
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
        if !waiting.is_empty() {
            self.take_back(&waiting)?;
            for (slot, v) in waiting {
                if let Some(set) = &mut self.sets[slot]
                    && set.count(&self.hasher, set.find(&self.hasher, v), v, bit)
                {
                    counts[slot] += 1;
                }
            }
        }
        Ok(())
    }

    /// Bring back into their sets those of `values` (slot, value) that are
    /// on disk, with their bits.
    fn take_back(&mut self, values: &[(usize, i64)]) -> Result<()> {
        let Some(disk) = &mut self.disk else {
            return Ok(());
        };
        let wanted: Vec<(u64, i64)> = values
            .iter()
            .filter_map(|(slot, v)| self.sets[*slot].as_ref().map(|s| (s.id, *v)))
            .collect();
        let found = disk.take(&wanted)?;
        self.asked += wanted.len();
        self.found += found.len();
        if found.is_empty() {
            return Ok(());
        }
        let slot_of: hashbrown::HashMap<u64, usize> = values
            .iter()
            .filter_map(|(slot, _)| self.sets[*slot].as_ref().map(|s| (s.id, *slot)))
            .collect();
        for (id, v, mask) in found {
            if let Some(set) = slot_of.get(&id).and_then(|s| self.sets[*s].as_mut()) {
                set.push(&self.hasher, v, mask);
                set.on_disk -= 1;
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
                if set.on_disk > 0
                    && let Some(disk) = &self.disk
                {
                    values.extend(
                        disk.read_set(set.id)?
                            .into_iter()
                            .filter(|(_, m)| m & bit != 0)
                            .map(|(v, _)| v),
                    );
                }
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
