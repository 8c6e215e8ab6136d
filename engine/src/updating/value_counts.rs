//! `min`, `max` and `count(DISTINCT ...)` over a changelog: an accumulator
//! that keeps a count per value (an ordered multiset), so a retraction takes
//! one occurrence back exactly, and whose state lists every value with its
//! count, so a checkpoint restores it whole. DataFusion's sliding `min`/`max`
//! and distinct accumulators retract too, but their state does not hold all
//! they keep, which a restore needs.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, ListArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::Accumulator;

/// What a [`ValueCounts`] reads from its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountedReading {
    Min,
    Max,
    CountDistinct,
}

impl CountedReading {
    /// The reading an aggregate over a changelog gets, if one fits it:
    /// `min`/`max` (DISTINCT changes nothing for them) and `count(DISTINCT x)`
    /// of one argument.
    pub fn of(name: &str, distinct: bool, arguments: usize) -> Option<Self> {
        match (name, distinct, arguments) {
            ("min", _, 1) => Some(CountedReading::Min),
            ("max", _, 1) => Some(CountedReading::Max),
            ("count", true, 1) => Some(CountedReading::CountDistinct),
            _ => None,
        }
    }
}

/// A value ordered as SQL orders it; values of one column share a type,
/// and floats compare totally, so the order is total.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ordered(ScalarValue);

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.partial_cmp(&other.0).unwrap_or(Ordering::Equal)
    }
}

/// Bytes a map entry costs beside its value's own.
const ENTRY_BYTES: usize = std::mem::size_of::<Ordered>() + std::mem::size_of::<i64>() + 16;

/// A count per non-null value of one argument.
#[derive(Debug)]
pub struct ValueCounts {
    reading: CountedReading,
    data_type: DataType,
    counts: BTreeMap<Ordered, i64>,
    bytes: usize,
}

impl ValueCounts {
    pub fn new(reading: CountedReading, data_type: DataType) -> Self {
        ValueCounts {
            reading,
            data_type,
            counts: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// Add `by` occurrences of `value` (negative: take them back). A value
    /// whose count reaches zero is gone; taking back a value never counted
    /// is ignored, as the group's own row count already warns of it.
    fn add(&mut self, value: ScalarValue, by: i64) {
        if value.is_null() || by == 0 {
            return;
        }
        let key = Ordered(value);
        match self.counts.get_mut(&key) {
            Some(n) => {
                *n += by;
                if *n <= 0 {
                    self.bytes -= ENTRY_BYTES + key.0.size();
                    self.counts.remove(&key);
                }
            }
            None if by > 0 => {
                self.bytes += ENTRY_BYTES + key.0.size();
                self.counts.insert(key, by);
            }
            None => {}
        }
    }

    fn add_column(&mut self, values: &ArrayRef, by: i64) -> datafusion::common::Result<()> {
        for i in 0..values.len() {
            if values.is_valid(i) {
                self.add(ScalarValue::try_from_array(values, i)?, by);
            }
        }
        Ok(())
    }

    fn one_argument(values: &[ArrayRef]) -> datafusion::common::Result<&ArrayRef> {
        match values {
            [v] => Ok(v),
            _ => Err(DataFusionError::Internal(format!(
                "a value count takes one argument, got {}",
                values.len()
            ))),
        }
    }
}

/// One list holding `values`.
fn single_list(values: ArrayRef) -> ScalarValue {
    let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
    let offsets = OffsetBuffer::from_lengths([values.len()]);
    ScalarValue::List(Arc::new(ListArray::new(field, offsets, values, None)))
}

impl Accumulator for ValueCounts {
    fn update_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        self.add_column(Self::one_argument(values)?, 1)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        self.add_column(Self::one_argument(values)?, -1)
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn evaluate(&mut self) -> datafusion::common::Result<ScalarValue> {
        let extreme = match self.reading {
            CountedReading::CountDistinct => {
                return Ok(ScalarValue::Int64(Some(self.counts.len() as i64)));
            }
            CountedReading::Min => self.counts.keys().next(),
            CountedReading::Max => self.counts.keys().next_back(),
        };
        match extreme {
            Some(v) => Ok(v.0.clone()),
            None => ScalarValue::try_from(&self.data_type),
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.bytes
    }

    /// Two lists: the values in order, and their counts.
    fn state(&mut self) -> datafusion::common::Result<Vec<ScalarValue>> {
        let values = if self.counts.is_empty() {
            datafusion::arrow::array::new_empty_array(&self.data_type)
        } else {
            ScalarValue::iter_to_array(self.counts.keys().map(|k| k.0.clone()))?
        };
        let counts: ArrayRef =
            Arc::new(Int64Array::from_iter_values(self.counts.values().copied()));
        Ok(vec![single_list(values), single_list(counts)])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> datafusion::common::Result<()> {
        let [values, counts] = states else {
            return Err(DataFusionError::Internal(format!(
                "a value count's state has two columns, got {}",
                states.len()
            )));
        };
        let (values, counts) = (values.as_list::<i32>(), counts.as_list::<i32>());
        for row in 0..values.len() {
            if values.is_null(row) || counts.is_null(row) {
                continue;
            }
            let (v, n) = (values.value(row), counts.value(row));
            let n = n.as_primitive::<Int64Type>();
            if v.len() != n.len() {
                return Err(DataFusionError::Internal(
                    "a value count's state has more values than counts".into(),
                ));
            }
            for i in 0..v.len() {
                if v.is_valid(i) {
                    self.add(ScalarValue::try_from_array(&v, i)?, n.value(i));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(values.to_vec()))
    }

    #[test]
    fn min_max_and_distinct_follow_a_random_changelog_and_survive_a_round_trip() {
        // A reference multiset beside three accumulators, over a fixed
        // pseudo-random sequence of inserts and retractions of live values.
        let mut live: Vec<i64> = vec![];
        let mut accs: Vec<ValueCounts> = [
            CountedReading::Min,
            CountedReading::Max,
            CountedReading::CountDistinct,
        ]
        .into_iter()
        .map(|r| ValueCounts::new(r, DataType::Int64))
        .collect();
        let mut seed = 7u64;
        for step in 0..2_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let retract = !live.is_empty() && (seed >> 33) % 3 == 0;
            let value = if retract {
                live.swap_remove(((seed >> 40) as usize) % live.len())
            } else {
                let v = ((seed >> 45) % 50) as i64;
                live.push(v);
                v
            };
            for a in &mut accs {
                let column = ints(&[Some(value), None]);
                if retract {
                    a.retract_batch(&[column]).unwrap();
                } else {
                    a.update_batch(&[column]).unwrap();
                }
            }
            if step % 97 == 0 {
                // Restore each from its state and go on with the copy.
                for a in &mut accs {
                    let state = a.state().unwrap();
                    let arrays: Vec<ArrayRef> =
                        state.iter().map(|s| s.to_array().unwrap()).collect();
                    let mut again = ValueCounts::new(a.reading, DataType::Int64);
                    again.merge_batch(&arrays).unwrap();
                    *a = again;
                }
            }
            let mut distinct = live.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let want = [
                ScalarValue::Int64(live.iter().min().copied()),
                ScalarValue::Int64(live.iter().max().copied()),
                ScalarValue::Int64(Some(distinct.len() as i64)),
            ];
            for (a, w) in accs.iter_mut().zip(&want) {
                assert_eq!(&a.evaluate().unwrap(), w, "step {step}, {:?}", a.reading);
            }
        }
    }

    #[test]
    fn a_value_never_counted_is_not_taken_back_below_zero() {
        let mut a = ValueCounts::new(CountedReading::Max, DataType::Int64);
        a.retract_batch(&[ints(&[Some(9)])]).unwrap();
        a.update_batch(&[ints(&[Some(3)])]).unwrap();
        assert_eq!(a.evaluate().unwrap(), ScalarValue::Int64(Some(3)));
        a.retract_batch(&[ints(&[Some(3)])]).unwrap();
        assert_eq!(a.evaluate().unwrap(), ScalarValue::Int64(None));
        assert_eq!(a.size(), std::mem::size_of::<ValueCounts>());
    }
}
