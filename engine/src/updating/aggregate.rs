//! An aggregate without a window, kept as accumulators: per group, one
//! DataFusion accumulator per aggregate expression. An epoch's rows update
//! them (or, over a changelog, retract from them), and only the groups the
//! epoch touched are evaluated again. Work per epoch follows the epoch's
//! rows, and the state holds one entry per group (plus what an accumulator
//! needs, such as a `count(DISTINCT ...)`'s values), not the rows that made
//! it.
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

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, UInt32Array,
};
use datafusion::arrow::compute::{cast, filter, take};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::Accumulator;

pub use super::aggregate_plan::AggregatePlan;
use super::keyed::Key;
use crate::error::{EngineError, Result};

/// Groups per batch of a whole checkpoint.
const CHECKPOINT_BATCH_GROUPS: usize = 16 * 1024;

struct Group {
    accumulators: Vec<Box<dyn Accumulator>>,
    /// Input rows in the group (partial rows, when merging).
    rows: i64,
    /// The epoch that last had a row of the group.
    touched: u64,
    /// Bytes its accumulators held when last touched.
    bytes: usize,
}

/// One member's groups and their accumulators.
pub struct GroupAccumulators {
    plan: Arc<AggregatePlan>,
    /// Encodes group values as keys; `None` for an aggregate without
    /// `GROUP BY` (one group, the empty key).
    keys: Option<RowConverter>,
    groups: HashMap<Key, Group>,
    bytes: usize,
}

impl std::fmt::Debug for GroupAccumulators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupAccumulators({} groups)", self.groups.len())
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
        Ok(GroupAccumulators {
            plan,
            keys,
            groups: HashMap::new(),
            bytes: 0,
        })
    }

    /// How it aggregates.
    pub fn plan(&self) -> &Arc<AggregatePlan> {
        &self.plan
    }

    /// Groups kept.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// No group kept.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Bytes the accumulators held when last touched.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        self.groups.clear();
        self.bytes = 0;
    }

    /// Drop the given groups.
    pub fn remove(&mut self, keys: &HashSet<Key>) {
        for k in keys {
            if let Some(g) = self.groups.remove(k) {
                self.bytes -= g.bytes;
            }
        }
    }

    /// Groups last touched more than `ttl` epochs before `epoch`.
    /// An aggregate without `GROUP BY` keeps its one group.
    pub fn idle(&self, epoch: u64, ttl: u64) -> HashSet<Key> {
        if self.keys.is_none() {
            return HashSet::new();
        }
        self.groups
            .iter()
            .filter(|(_, g)| epoch.saturating_sub(g.touched) > ttl)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Encoded group values of `columns`, one per row.
    fn encode(&self, columns: &[ArrayRef], rows: usize) -> Result<Vec<Key>> {
        Ok(match &self.keys {
            Some(conv) => conv
                .convert_columns(columns)?
                .iter()
                .map(|r| Box::from(r.as_ref()))
                .collect(),
            None => vec![Key::default(); rows],
        })
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
        let keys = self.encode(&group_columns, n)?;
        // Rows of each group, groups in the order they first come.
        let mut slot: HashMap<&Key, usize> = HashMap::new();
        let mut members: Vec<Vec<u32>> = vec![];
        let mut order: Vec<&Key> = vec![];
        for (i, k) in keys.iter().enumerate() {
            let s = *slot.entry(k).or_insert_with(|| {
                members.push(vec![]);
                order.push(k);
                members.len() - 1
            });
            members[s].push(i as u32);
        }
        let by_group = UInt32Array::from(members.concat());
        // Each aggregate's arguments (or states), rows grouped.
        let mut arguments: Vec<Vec<ArrayRef>> = vec![];
        let mut filters: Vec<Option<BooleanArray>> = vec![];
        for (i, agg) in plan.aggs.iter().enumerate() {
            let columns: Vec<ArrayRef> = match &plan.merge_columns {
                Some(ranges) => ranges[i].clone().map(|c| batch.column(c).clone()).collect(),
                None => agg
                    .expressions()
                    .iter()
                    .map(|e| Ok(e.evaluate(batch)?.into_array(n)?))
                    .collect::<Result<_>>()?,
            };
            arguments.push(
                columns
                    .iter()
                    .map(|c| Ok(take(c, &by_group, None)?))
                    .collect::<Result<_>>()?,
            );
            let predicate = match (&plan.merge_columns, plan.filters.get(i)) {
                (None, Some(Some(f))) => {
                    let mask = f.evaluate(batch)?.into_array(n)?;
                    let mask = take(&mask, &by_group, None)?;
                    Some(
                        mask.as_any()
                            .downcast_ref::<BooleanArray>()
                            .ok_or_else(|| {
                                EngineError::Context("an aggregate's FILTER is not boolean".into())
                            })?
                            .clone(),
                    )
                }
                _ => None,
            };
            filters.push(predicate);
        }
        let mut at = 0;
        let mut touched = Vec::with_capacity(order.len());
        for (k, rows) in order.into_iter().zip(&members) {
            let len = rows.len();
            let group = match self.groups.get_mut(k) {
                Some(g) => g,
                None => {
                    let fresh = Group {
                        accumulators: plan.accumulators()?,
                        rows: 0,
                        touched: epoch,
                        bytes: 0,
                    };
                    self.groups.entry(k.clone()).or_insert(fresh)
                }
            };
            for (i, acc) in group.accumulators.iter_mut().enumerate() {
                let mut values: Vec<ArrayRef> =
                    arguments[i].iter().map(|a| a.slice(at, len)).collect();
                if let Some(mask) = &filters[i] {
                    let mask = mask.slice(at, len);
                    if mask.true_count() == 0 {
                        continue;
                    }
                    if mask.true_count() < len {
                        values = values
                            .iter()
                            .map(|v| Ok(filter(v, &mask)?))
                            .collect::<Result<_>>()?;
                    }
                }
                if plan.merge_columns.is_some() {
                    acc.merge_batch(&values)?;
                } else if retract {
                    acc.retract_batch(&values)?;
                } else {
                    acc.update_batch(&values)?;
                }
            }
            group.rows += if retract { -(len as i64) } else { len as i64 };
            group.touched = epoch;
            let bytes: usize = group.accumulators.iter().map(|a| a.size()).sum::<usize>() + k.len();
            self.bytes = self.bytes + bytes - group.bytes;
            group.bytes = bytes;
            touched.push(k.clone());
            at += len;
        }
        if retract && self.keys.is_some() {
            // A group whose every row was taken back is no longer a group.
            let gone: HashSet<Key> = touched
                .iter()
                .filter(|k| self.groups.get(*k).is_some_and(|g| g.rows <= 0))
                .cloned()
                .collect();
            if gone
                .iter()
                .any(|k| self.groups.get(k).is_some_and(|g| g.rows < 0))
            {
                tracing::warn!(
                    "retractions named rows this aggregate never counted; their groups were dropped"
                );
            }
            self.remove(&gone);
        }
        Ok(touched)
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
            .filter(|k| self.groups.contains_key(*k))
            .collect();
        keys.sort_unstable();
        let plan = self.plan.clone();
        if keys.is_empty() {
            return Ok(RecordBatch::new_empty(plan.output.clone()));
        }
        let mut columns = self.group_columns(&keys)?;
        for i in 0..plan.aggs.len() {
            let values = keys
                .iter()
                .map(|k| self.groups.get_mut(*k).expect("a group").accumulators[i].evaluate())
                .collect::<datafusion::common::Result<Vec<ScalarValue>>>()?;
            let field = plan.output.field(plan.group_count() + i);
            columns.push(as_type(
                ScalarValue::iter_to_array(values)?,
                field.data_type(),
            )?);
        }
        Ok(RecordBatch::try_new(plan.output.clone(), columns)?)
    }

    /// An aggregate without `GROUP BY` has its one row whatever its input
    /// (`count(*)` 0, `sum` NULL over no rows): its group exists from the
    /// start, and stays when every row is taken back.
    fn ensure_global_group(&mut self) -> Result<()> {
        if self.keys.is_none() && !self.groups.contains_key(&Key::default()) {
            let fresh = Group {
                accumulators: self.plan.accumulators()?,
                rows: 0,
                touched: 0,
                bytes: 0,
            };
            self.groups.insert(Key::default(), fresh);
        }
        Ok(())
    }

    /// Every group's output row.
    pub fn evaluate_all(&mut self) -> Result<RecordBatch> {
        self.ensure_global_group()?;
        let keys: Vec<Key> = self.groups.keys().cloned().collect();
        self.evaluate(keys.iter())
    }

    fn group_columns(&self, keys: &[&Key]) -> Result<Vec<ArrayRef>> {
        let Some(conv) = &self.keys else {
            return Ok(vec![]);
        };
        let parser = conv.parser();
        Ok(conv.convert_rows(keys.iter().map(|k| parser.parse(k)))?)
    }

    /// Every group as a checkpoint writes it ([`AggregatePlan::saved_schema`]).
    pub fn whole(&mut self) -> Result<Vec<RecordBatch>> {
        let plan = self.plan.clone();
        let mut keys: Vec<Key> = self.groups.keys().cloned().collect();
        keys.sort_unstable();
        let mut out = vec![];
        for chunk in keys.chunks(CHECKPOINT_BATCH_GROUPS) {
            let refs: Vec<&Key> = chunk.iter().collect();
            let mut columns = self.group_columns(&refs)?;
            columns.push(Arc::new(Int64Array::from_iter_values(
                chunk.iter().map(|k| self.groups[k].rows),
            )));
            let mut states: Vec<Vec<ScalarValue>> = vec![];
            for k in chunk {
                let group = self.groups.get_mut(k).expect("a group");
                let mut row = vec![];
                for (i, acc) in group.accumulators.iter_mut().enumerate() {
                    // Taking an accumulator's state may empty it: it is
                    // built again from what was taken.
                    let state = acc.state()?;
                    let mut again = plan.accumulator(i)?;
                    let arrays = state
                        .iter()
                        .map(|s| Ok(s.to_array()?))
                        .collect::<Result<Vec<ArrayRef>>>()?;
                    again.merge_batch(&arrays)?;
                    *acc = again;
                    row.extend(state);
                }
                states.push(row);
            }
            let first_state = plan.group_count() + 1;
            for (c, field) in plan.saved.fields().iter().enumerate().skip(first_state) {
                let values = states.iter().map(|r| r[c - first_state].clone());
                columns.push(as_type(
                    ScalarValue::iter_to_array(values)?,
                    field.data_type(),
                )?);
            }
            out.push(RecordBatch::try_new(plan.saved.clone(), columns)?);
        }
        Ok(out)
    }

    /// Take back groups a checkpoint wrote ([`Self::whole`]), as of `epoch`.
    pub fn restore(&mut self, batch: &RecordBatch, epoch: u64) -> Result<()> {
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
        let keys = self.encode(&group_columns, n)?;
        let rows = batch
            .column(g)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| {
                EngineError::Context("a checkpoint's group counts are not Int64".into())
            })?;
        let mut state_at = g + 1;
        let mut ranges = vec![];
        for i in 0..plan.aggs.len() {
            let width = plan
                .saved
                .fields()
                .iter()
                .filter(|f| f.name().starts_with(&format!("s{i}_")))
                .count();
            ranges.push(state_at..state_at + width);
            state_at += width;
        }
        for (r, key) in keys.into_iter().enumerate() {
            let mut accumulators = plan.accumulators()?;
            for (acc, range) in accumulators.iter_mut().zip(&ranges) {
                let states: Vec<ArrayRef> =
                    range.clone().map(|c| batch.column(c).slice(r, 1)).collect();
                acc.merge_batch(&states)?;
            }
            let bytes = accumulators.iter().map(|a| a.size()).sum::<usize>() + key.len();
            self.bytes += bytes;
            if let Some(old) = self.groups.insert(
                key,
                Group {
                    accumulators,
                    rows: rows.value(r),
                    touched: epoch,
                    bytes,
                },
            ) {
                self.bytes -= old.bytes;
            }
        }
        Ok(())
    }
}

/// `array` as `to`, cast where an accumulator's type differs in name only.
fn as_type(array: ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        return Ok(array);
    }
    Ok(cast(&array, to)?)
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
