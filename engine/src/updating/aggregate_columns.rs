//! An aggregate's state for every group at once, one typed column per
//! aggregate, indexed by the group's slot: `count`, `sum`, `avg`, and `min`
//! and `max` over rows that append, of 64-bit integers and floats. A group
//! then costs a few machine words per aggregate, not a boxed DataFusion
//! accumulator each (NEXMark q17's eight aggregates took ~600 bytes a
//! group boxed). The columns keep exactly what DataFusion's accumulators
//! keep and write the same checkpoint state, so a checkpoint reads back
//! either way. Other aggregates stay boxed, one accumulator per group.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, PrimitiveArray, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::compute::{filter, take};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, FieldRef, Float64Type, Int64Type, UInt64Type,
};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;

use super::keyed::Key;
use crate::error::{EngineError, Result};

/// Which aggregates run as a column, and the state each keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ColumnKind {
    /// `count(x)`: rows with `x` not null.
    Count,
    /// `sum` of `Int64`; `sliding` is the retracting accumulator, whose
    /// state also counts the values.
    SumInt { sliding: bool },
    /// `sum` of `Float64`.
    SumFloat { sliding: bool },
    /// `avg` of `Float64` (SQL's coercion casts integers to it).
    Avg,
    /// `min` (`max` when true) of `Int64` over rows that append.
    Extreme { max: bool },
    /// `count(DISTINCT x)` of `Int64` over rows that append: bit `bit` of
    /// the shared sets of `family` ([`super::distinct_values`]).
    Distinct { family: usize, bit: u8 },
}

impl ColumnKind {
    /// The column `a` runs as, if any. `state` is the state DataFusion's
    /// accumulator for it writes: the column must write the same.
    pub(super) fn of(
        a: &AggregateFunctionExpr,
        argument: Option<&DataType>,
        retracts: bool,
        state: &[DataType],
    ) -> Option<ColumnKind> {
        use DataType::{Float64, Int64, UInt64};
        if a.expressions().len() != 1 {
            return None;
        }
        let returns = a.field().data_type().clone();
        if a.is_distinct() {
            // Its family and bit are given by the plan.
            let lists_of_int64 =
                matches!(state, [DataType::List(item)] if item.data_type() == &Int64);
            let counts_int64 = argument.is_none_or(|t| *t == Int64);
            return (a.fun().name() == "count"
                && returns == Int64
                && !retracts
                && lists_of_int64
                && counts_int64)
                .then_some(ColumnKind::Distinct { family: 0, bit: 0 });
        }
        let kind = match (a.fun().name(), &returns) {
            ("count", Int64) => ColumnKind::Count,
            ("sum", Int64) => ColumnKind::SumInt { sliding: retracts },
            ("sum", Float64) => ColumnKind::SumFloat { sliding: retracts },
            ("avg", Float64) => ColumnKind::Avg,
            ("min", Int64) if !retracts => ColumnKind::Extreme { max: false },
            ("max", Int64) if !retracts => ColumnKind::Extreme { max: true },
            _ => return None,
        };
        // The argument (when rows, not partial states, come in).
        let takes = match kind {
            ColumnKind::Count => None,
            ColumnKind::SumInt { .. } | ColumnKind::Extreme { .. } => Some(Int64),
            ColumnKind::SumFloat { .. } | ColumnKind::Avg => Some(Float64),
            ColumnKind::Distinct { .. } => return None,
        };
        if let (Some(want), Some(got)) = (takes, argument)
            && want != *got
        {
            return None;
        }
        let writes: Vec<DataType> = match kind {
            ColumnKind::Count => vec![Int64],
            ColumnKind::SumInt { sliding: false } | ColumnKind::Extreme { .. } => vec![Int64],
            ColumnKind::SumInt { sliding: true } => vec![Int64, UInt64],
            ColumnKind::SumFloat { sliding: false } => vec![Float64],
            ColumnKind::SumFloat { sliding: true } => vec![Float64, UInt64],
            ColumnKind::Avg => vec![UInt64, Float64],
            ColumnKind::Distinct { .. } => return None,
        };
        (writes == state).then_some(kind)
    }
}

/// What a batch of values does to the groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Rows added.
    Add,
    /// Rows taken back.
    Retract,
    /// Partial states (or a checkpoint's states) merged in.
    Merge,
}

/// One aggregate's state for every slot.
pub(super) enum AggColumn {
    Count(Vec<i64>),
    /// Sums and how many values each holds (a sum of none is NULL).
    SumInt {
        sums: Vec<i64>,
        seen: Vec<u64>,
        sliding: bool,
    },
    SumFloat {
        sums: Vec<f64>,
        seen: Vec<u64>,
        sliding: bool,
    },
    /// As DataFusion's `AvgAccumulator`: a count, and a sum that is NULL
    /// until a value came.
    Avg {
        sums: Vec<f64>,
        counts: Vec<u64>,
        has: Vec<bool>,
    },
    Extreme {
        values: Vec<i64>,
        has: Vec<bool>,
        max: bool,
    },
    /// A distinct count: how many values of its family's set have its
    /// bit, per slot; the checkpoint lists items of type `item`.
    Distinct {
        family: usize,
        bit: u8,
        counts: Vec<i64>,
        item: FieldRef,
    },
    /// Any other aggregate: DataFusion's accumulator per slot (`None` for a
    /// free slot).
    Boxed(Vec<Option<Box<dyn Accumulator>>>),
}

impl AggColumn {
    /// An empty column of `kind` (`None`: boxed); `state` is the
    /// checkpoint state's types.
    pub(super) fn new(kind: Option<ColumnKind>, state: &[DataType]) -> Self {
        match kind {
            Some(ColumnKind::Distinct { family, bit }) => AggColumn::Distinct {
                family,
                bit,
                counts: vec![],
                item: match state {
                    [DataType::List(item)] => item.clone(),
                    _ => Arc::new(datafusion::arrow::datatypes::Field::new(
                        "item",
                        DataType::Int64,
                        true,
                    )),
                },
            },
            Some(ColumnKind::Count) => AggColumn::Count(vec![]),
            Some(ColumnKind::SumInt { sliding }) => AggColumn::SumInt {
                sums: vec![],
                seen: vec![],
                sliding,
            },
            Some(ColumnKind::SumFloat { sliding }) => AggColumn::SumFloat {
                sums: vec![],
                seen: vec![],
                sliding,
            },
            Some(ColumnKind::Avg) => AggColumn::Avg {
                sums: vec![],
                counts: vec![],
                has: vec![],
            },
            Some(ColumnKind::Extreme { max }) => AggColumn::Extreme {
                values: vec![],
                has: vec![],
                max,
            },
            None => AggColumn::Boxed(vec![]),
        }
    }

    /// Whether this aggregate is a DataFusion accumulator per group.
    pub(super) fn is_boxed(&self) -> bool {
        matches!(self, AggColumn::Boxed(_))
    }

    /// Bytes a group takes in this column (a boxed one's accumulator
    /// aside).
    pub(super) fn width(&self) -> usize {
        match self {
            AggColumn::Count(_) => 8,
            AggColumn::SumInt { .. } | AggColumn::SumFloat { .. } => 16,
            AggColumn::Avg { .. } => 17,
            AggColumn::Extreme { .. } => 9,
            AggColumn::Distinct { .. } => 8,
            AggColumn::Boxed(_) => 16,
        }
    }

    /// Slot `slot` as a new group's (`fresh` makes a boxed one's
    /// accumulator).
    pub(super) fn reset(
        &mut self,
        slot: usize,
        fresh: impl FnOnce() -> Result<Box<dyn Accumulator>>,
    ) -> Result<()> {
        fn at<T: Clone>(v: &mut Vec<T>, slot: usize, zero: T) {
            if slot < v.len() {
                v[slot] = zero;
            } else {
                v.resize(slot + 1, zero);
            }
        }
        match self {
            AggColumn::Count(counts) | AggColumn::Distinct { counts, .. } => at(counts, slot, 0),
            AggColumn::SumInt { sums, seen, .. } => {
                at(sums, slot, 0);
                at(seen, slot, 0);
            }
            AggColumn::SumFloat { sums, seen, .. } => {
                at(sums, slot, 0.0);
                at(seen, slot, 0);
            }
            AggColumn::Avg { sums, counts, has } => {
                at(sums, slot, 0.0);
                at(counts, slot, 0);
                at(has, slot, false);
            }
            AggColumn::Extreme { values, has, .. } => {
                at(values, slot, 0);
                at(has, slot, false);
            }
            AggColumn::Boxed(accs) => {
                let acc = fresh()?;
                if slot < accs.len() {
                    accs[slot] = Some(acc);
                } else {
                    accs.resize_with(slot, || None);
                    accs.push(Some(acc));
                }
            }
        }
        Ok(())
    }

    /// A group is gone: a boxed one's accumulator is dropped now.
    pub(super) fn free(&mut self, slot: usize) {
        if let AggColumn::Boxed(accs) = self
            && let Some(a) = accs.get_mut(slot)
        {
            *a = None;
        }
    }

    /// The boxed accumulator of `slot`.
    pub(super) fn boxed(&mut self, slot: usize) -> Result<&mut Box<dyn Accumulator>> {
        match self {
            AggColumn::Boxed(accs) => accs
                .get_mut(slot)
                .and_then(Option::as_mut)
                .ok_or_else(|| EngineError::Context(format!("no accumulator in slot {slot}"))),
            _ => Err(EngineError::Context("a typed column is not boxed".into())),
        }
    }

    /// Bytes of a boxed accumulator of `slot` (0 for a column).
    pub(super) fn boxed_size(&self, slot: usize) -> usize {
        match self {
            AggColumn::Boxed(accs) => accs
                .get(slot)
                .and_then(Option::as_ref)
                .map_or(0, |a| a.size()),
            _ => 0,
        }
    }

    /// Row `r` of `values` goes to group `slots[r]`, where `mask` (a
    /// FILTER) lets it. `values` are the argument (`Add`, `Retract`) or the
    /// state columns (`Merge`).
    pub(super) fn update(
        &mut self,
        slots: &[u32],
        values: &[ArrayRef],
        mask: Option<&BooleanArray>,
        op: Op,
    ) -> Result<()> {
        let counted = |r: usize| mask.is_none_or(|m| m.is_valid(r) && m.value(r));
        let first = values
            .first()
            .ok_or_else(|| EngineError::Context("an aggregate without arguments".into()))?;
        match self {
            AggColumn::Count(counts) => {
                let merged = (op == Op::Merge).then(|| first.as_primitive::<Int64Type>());
                for (r, s) in slots.iter().enumerate() {
                    if !counted(r) || first.is_null(r) {
                        continue;
                    }
                    let c = &mut counts[*s as usize];
                    match (op, merged) {
                        (Op::Merge, Some(m)) => *c += m.value(r),
                        (Op::Retract, _) => *c -= 1,
                        _ => *c += 1,
                    }
                }
            }
            AggColumn::SumInt { sums, seen, .. } => {
                let v = first.as_primitive_opt::<Int64Type>().ok_or_else(mistyped)?;
                let step = |sum: i64, x: i64| match op {
                    Op::Retract => sum.wrapping_sub(x),
                    _ => sum.wrapping_add(x),
                };
                add_to_sums(sums, seen, slots, v, values, &counted, op, step);
            }
            AggColumn::SumFloat { sums, seen, .. } => {
                let v = first
                    .as_primitive_opt::<Float64Type>()
                    .ok_or_else(mistyped)?;
                let step = |sum: f64, x: f64| match op {
                    Op::Retract => sum - x,
                    _ => sum + x,
                };
                add_to_sums(sums, seen, slots, v, values, &counted, op, step);
            }
            AggColumn::Avg { sums, counts, has } => {
                if op == Op::Merge {
                    // State: the count, then the sum.
                    let c = first
                        .as_primitive_opt::<UInt64Type>()
                        .ok_or_else(mistyped)?;
                    let v = values
                        .get(1)
                        .and_then(|v| v.as_primitive_opt::<Float64Type>())
                        .ok_or_else(mistyped)?;
                    for (r, s) in slots.iter().enumerate() {
                        let s = *s as usize;
                        if c.is_valid(r) {
                            counts[s] += c.value(r);
                        }
                        if v.is_valid(r) {
                            sums[s] += v.value(r);
                            has[s] = true;
                        }
                    }
                    return Ok(());
                }
                let v = first
                    .as_primitive_opt::<Float64Type>()
                    .ok_or_else(mistyped)?;
                for (r, s) in slots.iter().enumerate() {
                    let s = *s as usize;
                    if !counted(r) || v.is_null(r) {
                        continue;
                    }
                    if op == Op::Retract {
                        counts[s] = counts[s].saturating_sub(1);
                        sums[s] -= v.value(r);
                    } else {
                        counts[s] += 1;
                        sums[s] += v.value(r);
                    }
                    has[s] = true;
                }
            }
            AggColumn::Extreme { values, has, max } => {
                if op == Op::Retract {
                    return Err(EngineError::Context(
                        "min and max in a column cannot take a value back".into(),
                    ));
                }
                let v = first.as_primitive_opt::<Int64Type>().ok_or_else(mistyped)?;
                for (r, s) in slots.iter().enumerate() {
                    let s = *s as usize;
                    if !counted(r) || v.is_null(r) {
                        continue;
                    }
                    let x = v.value(r);
                    let better = if *max { x > values[s] } else { x < values[s] };
                    if !has[s] || better {
                        values[s] = x;
                        has[s] = true;
                    }
                }
            }
            AggColumn::Boxed(_) | AggColumn::Distinct { .. } => {
                return Err(EngineError::Context(
                    "a boxed aggregate or a distinct count is updated by its owner".into(),
                ));
            }
        }
        Ok(())
    }

    /// The aggregate's value for each of `slots`.
    pub(super) fn evaluate(&mut self, slots: &[u32]) -> Result<ArrayRef> {
        if let AggColumn::Boxed(_) = self {
            let values = slots
                .iter()
                .map(|s| Ok(self.boxed(*s as usize)?.evaluate()?))
                .collect::<Result<Vec<_>>>()?;
            return Ok(datafusion::common::ScalarValue::iter_to_array(values)?);
        }
        self.typed_values(slots)
    }

    /// A typed column's value for each of `slots`.
    fn typed_values(&self, slots: &[u32]) -> Result<ArrayRef> {
        let at = |s: &u32| *s as usize;
        let array: ArrayRef = match self {
            AggColumn::Count(counts) | AggColumn::Distinct { counts, .. } => Arc::new(
                Int64Array::from_iter_values(slots.iter().map(|s| counts[at(s)])),
            ),
            AggColumn::SumInt { sums, seen, .. } => Arc::new(Int64Array::from_iter(
                slots
                    .iter()
                    .map(|s| (seen[at(s)] > 0).then_some(sums[at(s)])),
            )),
            AggColumn::SumFloat { sums, seen, .. } => Arc::new(Float64Array::from_iter(
                slots
                    .iter()
                    .map(|s| (seen[at(s)] > 0).then_some(sums[at(s)])),
            )),
            AggColumn::Avg { sums, counts, has } => {
                Arc::new(Float64Array::from_iter(slots.iter().map(|s| {
                    let s = at(s);
                    (counts[s] > 0 && has[s]).then(|| sums[s] / counts[s] as f64)
                })))
            }
            AggColumn::Extreme { values, has, .. } => Arc::new(Int64Array::from_iter(
                slots.iter().map(|s| has[at(s)].then_some(values[at(s)])),
            )),
            AggColumn::Boxed(_) => {
                return Err(EngineError::Context(
                    "a boxed aggregate is not typed".into(),
                ));
            }
        };
        Ok(array)
    }

    /// The checkpoint state of each of `slots`, as DataFusion's accumulator
    /// writes it: the value, but for a retracting sum's count of values and
    /// avg's count and sum. A boxed column or a distinct count is written
    /// by its owner.
    pub(super) fn state(&self, slots: &[u32]) -> Result<Vec<ArrayRef>> {
        let at = |s: &u32| *s as usize;
        Ok(match self {
            AggColumn::Count(_) | AggColumn::Extreme { .. } => vec![self.typed_values(slots)?],
            AggColumn::SumInt { seen, sliding, .. } | AggColumn::SumFloat { seen, sliding, .. } => {
                let mut state = vec![self.typed_values(slots)?];
                if *sliding {
                    let counts = UInt64Array::from_iter_values(slots.iter().map(|s| seen[at(s)]));
                    state.push(Arc::new(counts));
                }
                state
            }
            AggColumn::Avg { sums, counts, has } => vec![
                Arc::new(UInt64Array::from_iter_values(
                    slots.iter().map(|s| counts[at(s)]),
                )),
                Arc::new(Float64Array::from_iter(
                    slots.iter().map(|s| has[at(s)].then_some(sums[at(s)])),
                )),
            ],
            AggColumn::Boxed(_) | AggColumn::Distinct { .. } => {
                return Err(EngineError::Context(
                    "a boxed aggregate or a distinct count writes its state by its owner".into(),
                ));
            }
        })
    }
}

/// Rows in the order of their groups (`order`), and where each group's
/// rows start and end in that order.
pub(super) fn group_rows(
    slots: &[u32],
    order: &[(u32, Key)],
) -> (UInt32Array, Vec<(usize, usize)>) {
    let at: HashMap<u32, usize> = order
        .iter()
        .enumerate()
        .map(|(i, (s, _))| (*s, i))
        .collect();
    let mut members: Vec<Vec<u32>> = vec![vec![]; order.len()];
    for (r, s) in slots.iter().enumerate() {
        members[at[s]].push(r as u32);
    }
    let mut bounds = Vec::with_capacity(members.len());
    let mut start = 0;
    for m in &members {
        bounds.push((start, m.len()));
        start += m.len();
    }
    (UInt32Array::from(members.concat()), bounds)
}

/// Aggregate values into boxed accumulators, a group's rows at a time.
pub(super) fn update_boxed(
    column: &mut AggColumn,
    order: &[(u32, Key)],
    by_group: &UInt32Array,
    bounds: &[(usize, usize)],
    values: &[ArrayRef],
    mask: Option<BooleanArray>,
    op: Op,
) -> Result<()> {
    let values: Vec<ArrayRef> = values
        .iter()
        .map(|c| Ok(take(c, by_group, None)?))
        .collect::<Result<_>>()?;
    let mask = match mask {
        Some(m) => Some(as_mask(take(&m, by_group, None)?)?),
        None => None,
    };
    for ((slot, _), (at, len)) in order.iter().zip(bounds) {
        let mut values: Vec<ArrayRef> = values.iter().map(|a| a.slice(*at, *len)).collect();
        if let Some(mask) = &mask {
            let mask = mask.slice(*at, *len);
            if mask.true_count() == 0 {
                continue;
            }
            if mask.true_count() < *len {
                values = values
                    .iter()
                    .map(|v| Ok(filter(v, &mask)?))
                    .collect::<Result<_>>()?;
            }
        }
        let acc = column.boxed(*slot as usize)?;
        match op {
            Op::Merge => acc.merge_batch(&values)?,
            Op::Retract => acc.retract_batch(&values)?,
            Op::Add => acc.update_batch(&values)?,
        }
    }
    Ok(())
}

pub(super) fn as_mask(array: ArrayRef) -> Result<BooleanArray> {
    Ok(array
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| EngineError::Context("an aggregate's FILTER is not boolean".into()))?
        .clone())
}

/// Row `r` of `v` into the sum of group `slots[r]` with `step`, where
/// `counted` lets it; a retracting sum's state (`values[1]`) brings its
/// count of values.
#[allow(clippy::too_many_arguments)]
fn add_to_sums<T: ArrowPrimitiveType>(
    sums: &mut [T::Native],
    seen: &mut [u64],
    slots: &[u32],
    v: &PrimitiveArray<T>,
    values: &[ArrayRef],
    counted: &dyn Fn(usize) -> bool,
    op: Op,
    step: impl Fn(T::Native, T::Native) -> T::Native,
) {
    let counts = values
        .get(1)
        .and_then(|c| c.as_primitive_opt::<UInt64Type>());
    for (r, s) in slots.iter().enumerate() {
        let s = *s as usize;
        if !counted(r) {
            continue;
        }
        if v.is_valid(r) {
            sums[s] = step(sums[s], v.value(r));
        }
        seen[s] = tally(seen[s], op, v.is_valid(r), counts, r);
    }
}

/// A sum's count of values after a row: one more or one less, or a state's
/// count merged (a retracting sum's state carries one; a plain sum's state
/// counts one when not NULL).
fn tally(seen: u64, op: Op, valid: bool, counts: Option<&UInt64Array>, r: usize) -> u64 {
    match (op, counts) {
        (Op::Merge, Some(c)) => seen + if c.is_valid(r) { c.value(r) } else { 0 },
        (Op::Retract, _) if valid => seen.saturating_sub(1),
        (Op::Retract, _) => seen,
        _ => seen + u64::from(valid),
    }
}

fn mistyped() -> EngineError {
    EngineError::Context("an aggregate's values are not of the type its column keeps".into())
}
