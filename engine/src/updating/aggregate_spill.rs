//! An aggregate's groups past its memory budget. After an epoch's
//! emission, when the groups in memory hold more bytes than the budget,
//! those no epoch touched for a while ([`MIN_IDLE_EPOCHS`] at first) go to local disk
//! ([`SpilledGroups`]), coldest first, until three quarters of the budget
//! is left. A row of a group on disk brings it back at the start of the
//! epoch that has it (one disk transaction for all of them), with the epoch
//! it was last touched, so it is the group it was: what it last emitted is
//! what its change retracts. A whole checkpoint writes the groups on disk
//! beside those in memory, and drops those idle past the state TTL.
//!
//! A group on disk is its checkpoint row (the columns past its key, in
//! Arrow's row format) after the epoch it was last touched; the key is
//! the one the groups are indexed by.

use datafusion::arrow::row::{RowConverter, SortField};

use super::*;
use crate::updating::spilled_groups::{SpilledGroups, distinct};

/// Epochs a group must have gone untouched to go to disk, at first: the
/// groups an epoch's neighbours touch stay. When more than a tenth of the
/// groups moved out come back within four times that, it doubles (groups
/// come back at random every few epochs: moving them out only churns).
const MIN_IDLE_EPOCHS: u64 = 8;

/// The most it doubles to.
const MAX_IDLE_EPOCHS: u64 = 1024;

/// Bytes before a group's checkpoint row on disk: the epoch it was last
/// touched.
const TOUCHED: usize = 8;

/// Where an aggregate's cold groups go.
pub(super) struct Spill {
    store: SpilledGroups,
    /// Bytes of groups kept in memory.
    budget: usize,
    /// Move groups out again once those in memory hold this many bytes
    /// (above the budget when the groups touched lately hold more).
    next_at: usize,
    /// Epochs a group stays after its last touch, if it expires.
    ttl: Option<u64>,
    /// Epochs a group must have gone untouched to go to disk.
    idle: u64,
    /// Groups the last move took out, and those back soon since.
    moved: usize,
    back_soon: usize,
    /// Encodes a group's checkpoint row past its key columns.
    values: RowConverter,
}

impl GroupAccumulators {
    /// From now on, move cold groups to local disk once the groups in
    /// memory hold more than `budget` bytes; `ttl` is the state TTL in
    /// epochs, if any. False (every group stays in memory) when there is
    /// one group, a state Arrow's row format cannot hold, or no file can be
    /// made for them.
    pub fn spill_past(&mut self, budget: usize, ttl: Option<u64>) -> Result<bool> {
        if self.keys.is_none() {
            return Ok(false);
        }
        let fields: Vec<SortField> = self.plan.saved.fields()[self.plan.group_count()..]
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        if !RowConverter::supports_fields(&fields) {
            return Ok(false);
        }
        let store = match SpilledGroups::create() {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!("every group stays in memory: {e}");
                return Ok(false);
            }
        };
        for f in &mut self.families {
            f.spill_to_disk();
        }
        self.spill = Some(Spill {
            store,
            budget,
            next_at: budget,
            ttl,
            idle: MIN_IDLE_EPOCHS,
            moved: 0,
            back_soon: 0,
            values: RowConverter::new(fields)?,
        });
        Ok(true)
    }

    /// Whether cold groups may go to local disk.
    pub fn spills(&self) -> bool {
        self.spill.is_some()
    }

    /// Groups on local disk.
    pub fn spilled(&self) -> usize {
        self.spill.as_ref().map_or(0, |s| s.store.len())
    }

    /// Distinct values on local disk (of groups in memory).
    pub fn spilled_values(&self) -> usize {
        self.families.iter().map(DistinctFamily::spilled).sum()
    }

    pub(super) fn clear_spilled(&mut self) -> Result<()> {
        if let Some(spill) = &mut self.spill {
            spill.store.clear()?;
            spill.next_at = spill.budget;
        }
        Ok(())
    }

    /// After epoch `epoch`'s emission: if the groups in memory hold more
    /// than the budget, move the coldest to disk, and then, if they still
    /// hold more than three quarters of it, the distinct values no row named
    /// since values last moved. Returns how many groups went.
    pub fn spill_cold(&mut self, epoch: u64) -> Result<usize> {
        let Some(spill) = &self.spill else {
            return Ok(0);
        };
        if self.bytes() <= spill.next_at {
            return Ok(0);
        }
        let moved = self.spill_cold_groups(epoch)?;
        let budget = self.spill.as_ref().map_or(usize::MAX, |s| s.budget);
        if self.bytes() > budget / 4 * 3 {
            let (was, started) = (self.spilled_values(), std::time::Instant::now());
            for f in 0..self.families.len() {
                for (slot, was, now) in self.families[f].spill_unnamed()? {
                    let size = (self.sizes[slot] as usize + now).saturating_sub(was);
                    self.bytes = (self.bytes + size).saturating_sub(self.sizes[slot] as usize);
                    self.sizes[slot] = u32::try_from(size).unwrap_or(u32::MAX);
                }
            }
            let after = self.bytes();
            let (asked, found) = self
                .families
                .iter_mut()
                .map(DistinctFamily::lookups)
                .fold((0, 0), |(a, f), (x, y)| (a + x, f + y));
            tracing::debug!(
                asked,
                found,
                values = self.spilled_values().saturating_sub(was),
                on_disk = self.spilled_values(),
                bytes = after,
                took = ?started.elapsed(),
                "distinct values moved to local disk"
            );
            if let Some(spill) = &mut self.spill {
                spill.next_at = budget.max(after.saturating_add(budget / 4));
            }
        }
        Ok(moved)
    }

    /// Move the coldest groups to disk, if those in memory hold more than
    /// the budget. Returns how many went.
    fn spill_cold_groups(&mut self, epoch: u64) -> Result<usize> {
        let Some(spill) = &self.spill else {
            return Ok(0);
        };
        let held = self.bytes();
        let (budget, idle) = (spill.budget, spill.idle);
        let target = budget / 4 * 3;
        let width = self.columns.iter().map(AggColumn::width).sum::<usize>() + GROUP_OVERHEAD;
        let mut cold: Vec<(u64, u32)> = self
            .slots
            .values()
            .map(|s| (self.touched[*s as usize], *s))
            .filter(|(t, _)| epoch.saturating_sub(*t) >= idle)
            .collect();
        cold.sort_unstable();
        let mut chosen = vec![false; self.rows.len()];
        let mut freed = 0;
        for (_, s) in cold {
            if held - freed.min(held) <= target {
                break;
            }
            freed += self.sizes[s as usize] as usize + width;
            chosen[s as usize] = true;
        }
        let mut keys: Vec<Key> = self
            .slots
            .iter()
            .filter(|(_, s)| chosen[**s as usize])
            .map(|(k, _)| k.clone())
            .collect();
        // In key order, the file's tree takes them leaf by leaf.
        keys.sort_unstable();
        let g = self.plan.group_count();
        for chunk in keys.chunks(CHECKPOINT_BATCH_GROUPS) {
            let refs: Vec<&Key> = chunk.iter().collect();
            let saved = self.saved_rows(&refs)?;
            let spill = self.spill.as_mut().expect("checked above");
            let rows = spill.values.convert_columns(&saved.columns()[g..])?;
            let groups: Vec<(Key, Vec<u8>)> = chunk
                .iter()
                .zip(rows.iter())
                .map(|(key, row)| {
                    let touched = self.touched[self.slots[key] as usize];
                    let mut value = Vec::with_capacity(TOUCHED + row.as_ref().len());
                    value.extend_from_slice(&touched.to_le_bytes());
                    value.extend_from_slice(row.as_ref());
                    (key.clone(), value)
                })
                .collect();
            if let Err(e) = spill.store.put(&groups) {
                // Nothing was written: the groups stay, and so do the rest.
                tracing::warn!("cold groups stay in memory from now on: {e}");
                spill.budget = usize::MAX;
                spill.next_at = usize::MAX;
                return Ok(0);
            }
            for key in chunk {
                if let Some(s) = self.slots.remove(key) {
                    self.release(s);
                }
            }
        }
        let after = self.bytes();
        if let Some(spill) = &mut self.spill {
            spill.next_at = budget.max(after.saturating_add(budget / 4));
            spill.moved = keys.len();
            spill.back_soon = 0;
        }
        Ok(keys.len())
    }

    /// Bring back from disk the groups of `keys` (none in memory) that are
    /// there.
    pub(super) fn take_back<'a>(&mut self, keys: impl Iterator<Item = &'a [u8]>) -> Result<()> {
        let Some(spill) = self.spill.as_mut().filter(|s| !s.store.is_empty()) else {
            return Ok(());
        };
        let found = spill.store.take(&distinct(keys))?;
        self.restore_spilled(found)
    }

    /// Bring back every group on disk.
    pub(super) fn take_back_all(&mut self) -> Result<()> {
        let Some(spill) = self.spill.as_mut().filter(|s| !s.store.is_empty()) else {
            return Ok(());
        };
        let found = spill.store.take_all()?;
        self.restore_spilled(found)
    }

    /// Groups read from disk, back in memory as last touched.
    fn restore_spilled(&mut self, found: Vec<(Key, Vec<u8>)>) -> Result<()> {
        for chunk in found.chunks(CHECKPOINT_BATCH_GROUPS) {
            let (batch, touched) = self.decode(chunk)?;
            self.came_back(&touched);
            let slots = self.restore_rows(&batch, self.epoch, false)?;
            for (s, t) in slots.iter().zip(touched) {
                self.touched[*s as usize] = t;
            }
        }
        Ok(())
    }

    /// Groups last touched in `touched` came back: if many come back soon,
    /// wait longer before moving groups out.
    fn came_back(&mut self, touched: &[u64]) {
        let epoch = self.epoch;
        let Some(spill) = &mut self.spill else {
            return;
        };
        let soon = spill.idle.saturating_mul(4);
        spill.back_soon += touched
            .iter()
            .filter(|t| epoch.saturating_sub(**t) < soon)
            .count();
        if spill.moved > 0 && spill.back_soon * 10 > spill.moved && spill.idle < MAX_IDLE_EPOCHS {
            spill.idle = (spill.idle * 2).min(MAX_IDLE_EPOCHS);
            spill.back_soon = 0;
            tracing::debug!(
                epochs = spill.idle,
                "groups came back soon: they must idle longer"
            );
        }
    }

    /// Groups as on disk: their checkpoint rows, and when each was last
    /// touched.
    fn decode(&self, groups: &[(Key, Vec<u8>)]) -> Result<(RecordBatch, Vec<u64>)> {
        let spill = self
            .spill
            .as_ref()
            .ok_or_else(|| EngineError::Context("no groups on disk to read".into()))?;
        let mut touched = Vec::with_capacity(groups.len());
        for (_, value) in groups {
            let epoch = value
                .get(..TOUCHED)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| EngineError::Context("a group on disk is cut short".into()))?;
            touched.push(epoch);
        }
        let keys: Vec<&Key> = groups.iter().map(|(k, _)| k).collect();
        let mut columns = self.group_columns(&keys)?;
        let parser = spill.values.parser();
        columns.extend(
            spill
                .values
                .convert_rows(groups.iter().map(|(_, v)| parser.parse(&v[TOUCHED..])))?,
        );
        let plan = &self.plan;
        let columns = columns
            .into_iter()
            .zip(plan.saved.fields())
            .map(|(c, f)| as_type(c, f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        Ok((RecordBatch::try_new(plan.saved.clone(), columns)?, touched))
    }

    /// The groups on disk as a whole checkpoint writes them; those idle
    /// past the TTL are dropped instead.
    pub(super) fn whole_spilled(&mut self) -> Result<Vec<RecordBatch>> {
        let Some(spill) = &self.spill else {
            return Ok(vec![]);
        };
        let (ttl, epoch) = (spill.ttl, self.epoch);
        let mut out = vec![];
        let mut expired = vec![];
        spill
            .store
            .for_each_chunk(CHECKPOINT_BATCH_GROUPS, |chunk| {
                let (batch, touched) = self.decode(&chunk)?;
                let live: Vec<bool> = touched
                    .iter()
                    .map(|t| ttl.is_none_or(|ttl| epoch.saturating_sub(*t) <= ttl))
                    .collect();
                expired.extend(
                    chunk
                        .into_iter()
                        .zip(&live)
                        .filter(|(_, live)| !**live)
                        .map(|((k, _), _)| k),
                );
                let batch = datafusion::arrow::compute::filter_record_batch(
                    &batch,
                    &datafusion::arrow::array::BooleanArray::from(live),
                )?;
                if batch.num_rows() > 0 {
                    out.push(batch);
                }
                Ok(())
            })?;
        if !expired.is_empty()
            && let Some(spill) = &mut self.spill
        {
            spill.store.remove(&expired)?;
        }
        Ok(out)
    }
}
