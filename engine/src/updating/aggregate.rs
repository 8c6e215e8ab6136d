//! An aggregate without a window, kept as accumulators: each group has a
//! slot, and each aggregate a column indexed by slot: a typed column for
//! the common aggregates ([`super::aggregate_columns`]), shared sets for
//! distinct counts ([`super::distinct_values`]), or a DataFusion
//! accumulator per group for the rest. An epoch's rows update them (or,
//! over a changelog, retract from them), and only the groups the epoch
//! touched are evaluated again. Work per epoch follows the epoch's rows,
//! and the state holds one entry per group (plus what an aggregate needs,
//! such as a `count(DISTINCT ...)`'s values), not the rows that made it.
//! When every epoch emits, the groups' rows before an epoch's first change
//! are what was emitted, and no copy of it is kept ([`GroupAccumulators::take_before`]).
//! Past a memory budget, the groups no epoch touched for a while go to
//! local disk and come back when a row of theirs does (`aggregate_spill.rs`).
//!
//! Which aggregates run so ([`AggregatePlan::of`]):
//! * over rows that only append, any aggregate whose input is partial
//!   states (the sender's partial aggregate ran; here they are merged) or
//!   rows, without an `ORDER BY` inside the call;
//! * over a changelog, `count`, `sum` and `avg` (not DISTINCT), whose
//!   accumulators take a row back exactly, and `min`, `max` and
//!   `count(DISTINCT x)`, which keep a count per value
//!   ([`super::value_counts`]);
//! * over an inner join of two streams that append (NEXMark q4's highest
//!   bid per auction): the join's new pairs each epoch are the
//!   aggregate's new rows, and the stage keeps the join's sides too.
//!
//! Anything else keeps the recompute path ([`super::split`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;

use super::aggregate_columns::{AggColumn, Op, as_mask, group_rows, update_boxed};
pub use super::aggregate_plan::AggregatePlan;
use super::distinct_values::DistinctFamily;
use super::keyed::Key;
use crate::error::{EngineError, Result};

/// Groups per batch of a whole checkpoint.
const CHECKPOINT_BATCH_GROUPS: usize = 16 * 1024;

/// Bytes a group costs beside its columns: its slot in the key index, its
/// row count, last epoch and size.
const GROUP_OVERHEAD: usize = 48;

/// Where an input's rows go: each row's slot, and the groups in the order
/// they first come with their keys.
type Placed = (Vec<u32>, Vec<(u32, Key)>);

/// One member's groups: each group a slot, and per aggregate a column
/// indexed by slot ([`AggColumn`]).
pub struct GroupAccumulators {
    plan: Arc<AggregatePlan>,
    /// Encodes group values as keys; `None` for an aggregate without
    /// `GROUP BY` (one group, the empty key).
    keys: Option<RowConverter>,
    slots: HashMap<Key, u32>,
    /// Slots of groups that are gone, to reuse.
    free: Vec<u32>,
    /// Per slot: input rows in the group (partial rows, when merging).
    rows: Vec<i64>,
    /// Per slot: the epoch that last had a row of the group.
    touched: Vec<u64>,
    /// Per slot: bytes its key and boxed accumulators held when last
    /// touched.
    sizes: Vec<u32>,
    columns: Vec<AggColumn>,
    /// The sets distinct counts share, by family.
    families: Vec<DistinctFamily>,
    /// The sum of `sizes` over live slots.
    bytes: usize,
    /// When the groups, not a copy, say what was emitted (every epoch
    /// emits): the rows of the groups this epoch touched, as they were
    /// before it.
    before: Option<Vec<RecordBatch>>,
    /// Where cold groups go past the memory budget, if they may.
    spill: Option<spill::Spill>,
    /// The last epoch that had rows.
    epoch: u64,
}

impl std::fmt::Debug for GroupAccumulators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupAccumulators({} groups)", self.slots.len())
    }
}

impl GroupAccumulators {
    /// No groups yet.
    pub fn new(plan: Arc<AggregatePlan>) -> Result<Self> {
        let keys = if plan.group_count() == 0 {
            None
        } else {
            let fields: Vec<SortField> = plan
                .output
                .fields()
                .iter()
                .take(plan.group_count())
                .map(|f| SortField::new(f.data_type().clone()))
                .collect();
            Some(RowConverter::new(fields)?)
        };
        let columns = (0..plan.aggs.len()).map(|i| plan.column(i)).collect();
        let families = (0..plan.families).map(|_| DistinctFamily::new()).collect();
        Ok(GroupAccumulators {
            plan,
            keys,
            slots: HashMap::new(),
            free: vec![],
            rows: vec![],
            touched: vec![],
            sizes: vec![],
            columns,
            families,
            bytes: 0,
            before: None,
            spill: None,
            epoch: 0,
        })
    }

    /// How it aggregates.
    pub fn plan(&self) -> &Arc<AggregatePlan> {
        &self.plan
    }

    /// Groups kept, in memory and on disk.
    pub fn len(&self) -> usize {
        self.slots.len() + self.spilled()
    }

    /// No group kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the groups in memory held when last touched.
    pub fn bytes(&self) -> usize {
        let width: usize = self.columns.iter().map(AggColumn::width).sum();
        self.bytes + self.slots.len() * (width + GROUP_OVERHEAD)
    }

    /// Drop everything.
    pub fn clear(&mut self) -> Result<()> {
        self.slots.clear();
        self.free.clear();
        self.rows.clear();
        self.touched.clear();
        self.sizes.clear();
        self.columns = (0..self.plan.aggs.len())
            .map(|i| self.plan.column(i))
            .collect();
        for f in &mut self.families {
            f.clear()?;
        }
        self.bytes = 0;
        if let Some(before) = &mut self.before {
            before.clear();
        }
        self.clear_spilled()
    }

    /// Drop the given groups.
    pub fn remove(&mut self, keys: &HashSet<Key>) {
        for k in keys {
            if let Some(s) = self.slots.remove(k) {
                self.release(s);
            }
        }
    }

    fn release(&mut self, slot: u32) {
        let s = slot as usize;
        self.bytes -= self.sizes[s] as usize;
        self.sizes[s] = 0;
        for c in &mut self.columns {
            c.free(s);
        }
        for f in &mut self.families {
            f.reset(s);
        }
        self.free.push(slot);
    }

    /// A slot for a new group `key`, touched in `epoch`.
    fn allocate(&mut self, key: Key, epoch: u64) -> Result<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.rows.push(0);
                self.touched.push(0);
                self.sizes.push(0);
                (self.rows.len() - 1) as u32
            }
        };
        let s = slot as usize;
        self.rows[s] = 0;
        self.touched[s] = epoch;
        self.sizes[s] = 0;
        self.reset(s)?;
        self.slots.insert(key, slot);
        Ok(slot)
    }

    /// Slot `s`'s aggregates as a new group's.
    fn reset(&mut self, s: usize) -> Result<()> {
        let plan = self.plan.clone();
        for (i, c) in self.columns.iter_mut().enumerate() {
            c.reset(s, || plan.accumulator(i))?;
        }
        for f in &mut self.families {
            f.reset(s);
        }
        Ok(())
    }

    /// Groups in memory last touched more than `ttl` epochs before `epoch`
    /// (those on disk expire when a whole checkpoint reads them).
    /// An aggregate without `GROUP BY` keeps its one group.
    pub fn idle(&self, epoch: u64, ttl: u64) -> HashSet<Key> {
        if self.keys.is_none() {
            return HashSet::new();
        }
        self.slots
            .iter()
            .filter(|(_, s)| epoch.saturating_sub(self.touched[**s as usize]) > ttl)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The slot of each row's group (made for groups not yet kept, touched
    /// in `epoch`), and the groups in the order they first come, with their
    /// keys. Groups on disk come back first, unless `from_disk` is false
    /// (they are being taken back now).
    fn slots_of(
        &mut self,
        columns: &[ArrayRef],
        rows: usize,
        epoch: u64,
        from_disk: bool,
    ) -> Result<Placed> {
        let mut slots = Vec::with_capacity(rows);
        let mut order: Vec<(u32, Key)> = vec![];
        let mut seen: HashSet<u32> = HashSet::new();
        let mut first = |slot: u32, key: &[u8]| {
            if seen.insert(slot) {
                order.push((slot, Box::from(key)));
            }
        };
        match self.keys.take() {
            Some(conv) => {
                let encoded = conv.convert_columns(columns);
                self.keys = Some(conv);
                let encoded = encoded?;
                // Rows of groups kept place at once; the others wait for
                // those on disk to come back, then for new groups.
                let mut missing = vec![];
                for (i, row) in encoded.iter().enumerate() {
                    match self.slots.get(row.as_ref()) {
                        Some(s) => {
                            slots.push(*s);
                            first(*s, row.as_ref());
                        }
                        None => {
                            slots.push(u32::MAX);
                            missing.push(i);
                        }
                    }
                }
                if from_disk && !missing.is_empty() {
                    self.take_back(missing.iter().map(|i| encoded.row(*i).data()))?;
                }
                for i in missing {
                    let key = encoded.row(i);
                    let slot = match self.slots.get(key.as_ref()) {
                        Some(s) => *s,
                        None => self.allocate(Box::from(key.as_ref()), epoch)?,
                    };
                    slots[i] = slot;
                    first(slot, key.as_ref());
                }
            }
            None => {
                if rows > 0 {
                    let slot = match self.slots.get(&[][..]) {
                        Some(s) => *s,
                        None => self.allocate(Key::default(), epoch)?,
                    };
                    first(slot, &[]);
                    slots.resize(rows, slot);
                }
            }
        }
        Ok((slots, order))
    }

    /// Take an epoch's rows of the aggregate's input: add them, or take
    /// them back (`retract`). Returns the groups they touched.
    pub fn apply(&mut self, batch: &RecordBatch, retract: bool, epoch: u64) -> Result<Vec<Key>> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(vec![]);
        }
        if retract && !self.plan.retracts {
            return Err(EngineError::Context(
                "an aggregate over rows that only append was asked to take rows back".into(),
            ));
        }
        let plan = self.plan.clone();
        let group_columns = plan
            .group_exprs
            .iter()
            .map(|e| Ok(e.evaluate(batch)?.into_array(n)?))
            .collect::<Result<Vec<ArrayRef>>>()?;
        self.epoch = self.epoch.max(epoch);
        let (slots, order) = self.slots_of(&group_columns, n, epoch, true)?;
        self.keep_before(&order, epoch)?;
        let op = match (&plan.merge_columns, retract) {
            (Some(_), _) => Op::Merge,
            (None, true) => Op::Retract,
            (None, false) => Op::Add,
        };
        // Boxed accumulators take each group's rows as one slice.
        let boxed = self.columns.iter().any(AggColumn::is_boxed);
        let grouped = boxed.then(|| group_rows(&slots, &order));
        for i in 0..plan.aggs.len() {
            let values: Vec<ArrayRef> = match &plan.merge_columns {
                Some(ranges) => ranges[i].clone().map(|c| batch.column(c).clone()).collect(),
                None => plan.aggs[i]
                    .expressions()
                    .iter()
                    .map(|e| Ok(e.evaluate(batch)?.into_array(n)?))
                    .collect::<Result<_>>()?,
            };
            let mask = match (&plan.merge_columns, plan.filters.get(i)) {
                (None, Some(Some(f))) => Some(as_mask(f.evaluate(batch)?.into_array(n)?)?),
                _ => None,
            };
            match (&mut self.columns[i], &grouped) {
                (AggColumn::Boxed(_), Some((by_group, bounds))) => {
                    let column = &mut self.columns[i];
                    update_boxed(column, &order, by_group, bounds, &values, mask, op)?;
                }
                (
                    AggColumn::Distinct {
                        family,
                        bit,
                        counts,
                        ..
                    },
                    _,
                ) => {
                    let first = values.first().ok_or_else(|| {
                        EngineError::Context("a distinct count without an argument".into())
                    })?;
                    self.families[*family].add(&slots, first, mask.as_ref(), *bit, counts, op)?;
                }
                (column, _) => column.update(&slots, &values, mask.as_ref(), op)?,
            }
        }
        for s in &slots {
            let r = &mut self.rows[*s as usize];
            *r += if retract { -1 } else { 1 };
        }
        let mut touched = Vec::with_capacity(order.len());
        for (slot, key) in order {
            self.touch(slot, &key, epoch, boxed);
            touched.push(key);
        }
        if retract && self.keys.is_some() {
            // A group whose every row was taken back is no longer a group.
            let gone: HashSet<Key> = touched
                .iter()
                .filter(|k| self.rows_of(k).is_some_and(|r| r <= 0))
                .cloned()
                .collect();
            if gone.iter().any(|k| self.rows_of(k).is_some_and(|r| r < 0)) {
                tracing::warn!(
                    "retractions named rows this aggregate never counted; their groups were dropped"
                );
            }
            self.remove(&gone);
        }
        Ok(touched)
    }

    /// From now on, keep the rows of the groups each epoch touches as they
    /// were before it ([`Self::take_before`]): what was last emitted, read
    /// from the groups instead of kept beside them. Every epoch must emit.
    pub fn keep_rows_before(&mut self) {
        self.before.get_or_insert_with(Vec::new);
    }

    /// Whether the rows before each epoch are kept.
    pub fn keeps_rows_before(&self) -> bool {
        self.before.is_some()
    }

    /// The rows of the groups touched since the last emission as they were
    /// then; the next emission starts afresh.
    pub fn take_before(&mut self) -> Result<RecordBatch> {
        let rows = self.before.as_mut().map(std::mem::take).unwrap_or_default();
        super::keyed::concat(&self.plan.output.clone(), &rows)
    }

    /// Keep the rows of the groups in `order` as they are now, those not
    /// touched yet in `epoch` (a group made in it was none before).
    fn keep_before(&mut self, order: &[(u32, Key)], epoch: u64) -> Result<()> {
        if self.before.is_none() {
            return Ok(());
        }
        let now: Vec<&Key> = order
            .iter()
            .filter(|(slot, _)| self.touched[*slot as usize] != epoch)
            .map(|(_, key)| key)
            .collect();
        if now.is_empty() {
            return Ok(());
        }
        let rows = self.evaluate(now)?;
        if let Some(before) = &mut self.before {
            before.push(rows);
        }
        Ok(())
    }

    /// Group `key` in `slot` was touched in `epoch`: what it holds now.
    fn touch(&mut self, slot: u32, key: &Key, epoch: u64, boxed: bool) {
        let s = slot as usize;
        self.touched[s] = epoch;
        let size = key.len() + self.held(s, boxed);
        self.bytes = self.bytes + size - self.sizes[s] as usize;
        self.sizes[s] = size as u32;
    }

    /// Bytes slot `s` holds beside its columns: its distinct sets, and its
    /// boxed accumulators (when there are any).
    fn held(&self, s: usize, boxed: bool) -> usize {
        let sets: usize = self.families.iter().map(|f| f.bytes(s)).sum();
        let accumulators: usize = match boxed {
            true => self.columns.iter().map(|c| c.boxed_size(s)).sum(),
            false => 0,
        };
        sets + accumulators
    }

    fn rows_of(&self, key: &Key) -> Option<i64> {
        self.slots.get(key).map(|s| self.rows[*s as usize])
    }

    /// The aggregate's output rows of `keys` (those that are groups), in
    /// the order of their keys.
    pub fn evaluate<'a>(&mut self, keys: impl IntoIterator<Item = &'a Key>) -> Result<RecordBatch> {
        let keys: Vec<&Key> = keys.into_iter().collect();
        if self.keys.is_none() && !keys.is_empty() {
            self.ensure_global_group()?;
        }
        let mut keys: Vec<&Key> = keys
            .into_iter()
            .filter(|k| self.slots.contains_key(*k))
            .collect();
        keys.sort_unstable();
        let plan = self.plan.clone();
        if keys.is_empty() {
            return Ok(RecordBatch::new_empty(plan.output.clone()));
        }
        let slots: Vec<u32> = keys.iter().map(|k| self.slots[*k]).collect();
        let mut columns = self.group_columns(&keys)?;
        for (i, column) in self.columns.iter_mut().enumerate() {
            let field = plan.output.field(plan.group_count() + i);
            columns.push(as_type(column.evaluate(&slots)?, field.data_type())?);
        }
        Ok(RecordBatch::try_new(plan.output.clone(), columns)?)
    }

    /// An aggregate without `GROUP BY` has its one row whatever its input
    /// (`count(*)` 0, `sum` NULL over no rows): its group exists from the
    /// start, and stays when every row is taken back.
    fn ensure_global_group(&mut self) -> Result<()> {
        if self.keys.is_none() && !self.slots.contains_key(&Key::default()) {
            self.allocate(Key::default(), 0)?;
        }
        Ok(())
    }

    /// Every group's output row (those on disk brought back).
    pub fn evaluate_all(&mut self) -> Result<RecordBatch> {
        self.take_back_all()?;
        self.ensure_global_group()?;
        let keys: Vec<Key> = self.slots.keys().cloned().collect();
        self.evaluate(keys.iter())
    }

    fn group_columns(&self, keys: &[&Key]) -> Result<Vec<ArrayRef>> {
        let Some(conv) = &self.keys else {
            return Ok(vec![]);
        };
        let parser = conv.parser();
        Ok(conv.convert_rows(keys.iter().map(|k| parser.parse(k)))?)
    }

    /// Every group as a checkpoint writes it ([`AggregatePlan::saved_schema`]):
    /// those in memory, then those on disk.
    pub fn whole(&mut self) -> Result<Vec<RecordBatch>> {
        let mut keys: Vec<Key> = self.slots.keys().cloned().collect();
        keys.sort_unstable();
        let mut out = vec![];
        for chunk in keys.chunks(CHECKPOINT_BATCH_GROUPS) {
            let refs: Vec<&Key> = chunk.iter().collect();
            out.push(self.saved_rows(&refs)?);
        }
        out.extend(self.whole_spilled()?);
        Ok(out)
    }

    /// The groups of `keys` (all in memory) as a checkpoint writes them.
    fn saved_rows(&mut self, keys: &[&Key]) -> Result<RecordBatch> {
        let plan = self.plan.clone();
        let slots: Vec<u32> = keys.iter().map(|k| self.slots[*k]).collect();
        let mut columns = self.group_columns(keys)?;
        columns.push(Arc::new(Int64Array::from_iter_values(
            slots.iter().map(|s| self.rows[*s as usize]),
        )));
        for i in 0..plan.aggs.len() {
            let state = match &self.columns[i] {
                AggColumn::Boxed(_) => self.boxed_state(i, &slots)?,
                AggColumn::Distinct {
                    family, bit, item, ..
                } => vec![self.families[*family].state(&slots, *bit, item)?],
                column => column.state(&slots)?,
            };
            columns.extend(state);
        }
        let columns = columns
            .into_iter()
            .zip(plan.saved.fields())
            .map(|(c, f)| as_type(c, f.data_type()))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(plan.saved.clone(), columns)?)
    }

    /// The state of aggregate `i`'s boxed accumulators of `slots`, a column
    /// per state value.
    fn boxed_state(&mut self, i: usize, slots: &[u32]) -> Result<Vec<ArrayRef>> {
        let plan = self.plan.clone();
        let mut rows: Vec<Vec<ScalarValue>> = vec![];
        for s in slots {
            let acc = self.columns[i].boxed(*s as usize)?;
            // Taking an accumulator's state may empty it: it is built
            // again from what was taken.
            let state = acc.state()?;
            let mut again = plan.accumulator(i)?;
            let arrays = state
                .iter()
                .map(|s| Ok(s.to_array()?))
                .collect::<Result<Vec<ArrayRef>>>()?;
            again.merge_batch(&arrays)?;
            *acc = again;
            rows.push(state);
        }
        let width = rows.first().map_or(0, Vec::len);
        (0..width)
            .map(|c| {
                Ok(ScalarValue::iter_to_array(
                    rows.iter().map(|r| r[c].clone()),
                )?)
            })
            .collect()
    }

    /// Take back groups a checkpoint wrote ([`Self::whole`]), as of `epoch`.
    pub fn restore(&mut self, batch: &RecordBatch, epoch: u64) -> Result<()> {
        self.restore_rows(batch, epoch, true).map(|_| ())
    }

    /// [`Self::restore`], returning each row's slot; groups on disk are
    /// first taken back unless `from_disk` is false.
    fn restore_rows(
        &mut self,
        batch: &RecordBatch,
        epoch: u64,
        from_disk: bool,
    ) -> Result<Vec<u32>> {
        let plan = self.plan.clone();
        if batch.schema().fields().len() != plan.saved.fields().len() {
            return Err(EngineError::Context(format!(
                "a checkpoint's groups have {} columns, this aggregate keeps {}",
                batch.schema().fields().len(),
                plan.saved.fields().len()
            )));
        }
        let g = plan.group_count();
        let n = batch.num_rows();
        let group_columns: Vec<ArrayRef> = (0..g)
            .map(|c| as_type(batch.column(c).clone(), plan.output.field(c).data_type()))
            .collect::<Result<_>>()?;
        // A group saved again replaces the one kept.
        let (slots, order) = self.slots_of(&group_columns, n, epoch, from_disk)?;
        for (slot, _) in &order {
            self.reset(*slot as usize)?;
        }
        let rows = batch
            .column(g)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| {
                EngineError::Context("a checkpoint's group counts are not Int64".into())
            })?;
        let mut state_at = g + 1;
        for i in 0..plan.aggs.len() {
            let width = plan
                .saved
                .fields()
                .iter()
                .filter(|f| f.name().starts_with(&format!("s{i}_")))
                .count();
            let states: Vec<ArrayRef> = (state_at..state_at + width)
                .map(|c| batch.column(c).clone())
                .collect();
            state_at += width;
            match &mut self.columns[i] {
                AggColumn::Boxed(_) => {
                    for (r, s) in slots.iter().enumerate() {
                        let row: Vec<ArrayRef> = states.iter().map(|c| c.slice(r, 1)).collect();
                        self.columns[i].boxed(*s as usize)?.merge_batch(&row)?;
                    }
                }
                AggColumn::Distinct {
                    family,
                    bit,
                    counts,
                    ..
                } => {
                    let lists = states.first().ok_or_else(|| {
                        EngineError::Context("a distinct count's checkpoint has no list".into())
                    })?;
                    self.families[*family].add(&slots, lists, None, *bit, counts, Op::Merge)?;
                }
                column => column.update(&slots, &states, None, Op::Merge)?,
            }
        }
        for (r, s) in slots.iter().enumerate() {
            self.rows[*s as usize] = rows.value(r);
        }
        for (slot, key) in order {
            self.touch(slot, &key, epoch, true);
        }
        Ok(slots)
    }
}

/// `array` as `to`, cast where an accumulator's type differs in name only.
fn as_type(array: ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array);
    }
    Ok(cast(&array, to)?)
}

#[path = "aggregate_spill.rs"]
mod spill;

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
