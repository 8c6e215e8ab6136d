//! Which aggregates of an updating stage run on accumulators, and how:
//! the plan [`super::aggregate::GroupAccumulators`] follows.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use super::aggregate_columns::{AggColumn, ColumnKind};
use super::distinct_values::MEMBERS;
use super::join::IncrementalJoin;
use super::value_counts::{CountedReading, ValueCounts};
use crate::context::InputEdge;
use crate::error::Result;
use crate::exec::{StageInput, StageInputExec, passes_batches_through};

/// Aggregates whose DataFusion accumulators take a row back exactly, and
/// whose state says all they hold (so a checkpoint restores them whole).
/// `min`, `max` and `count(DISTINCT)` over a changelog count their values
/// instead ([`ValueCounts`]).
const RETRACTABLE: [&str; 3] = ["count", "sum", "avg"];

/// The name of the column that counts a group's rows in a checkpoint.
const ROWS_COLUMN: &str = "__skein_rows";

/// How an updating stage's aggregate runs on accumulators.
#[derive(Debug)]
pub struct AggregatePlan {
    /// The inner join below the aggregate, when two streams feed it: each
    /// epoch's new pairs are its new rows.
    pub join: Option<IncrementalJoin>,
    /// The operators between the edge and the aggregate, if any: run on an
    /// epoch's rows before the accumulators take them.
    pub input: Option<Arc<dyn ExecutionPlan>>,
    /// The aggregate's input schema.
    pub input_schema: SchemaRef,
    pub(super) group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    pub(super) aggs: Vec<Arc<AggregateFunctionExpr>>,
    pub(super) filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    /// Per aggregate, its state columns in the input, when the input is
    /// partial states (merged, not updated).
    pub(super) merge_columns: Option<Vec<std::ops::Range<usize>>>,
    /// The input is a changelog: rows are taken back.
    pub(super) retracts: bool,
    /// Per aggregate over a changelog, the value count it keeps instead of
    /// DataFusion's accumulator, with its argument's type.
    pub(super) counted: Vec<Option<(CountedReading, DataType)>>,
    /// Per aggregate, the typed column it runs as (`None`: a boxed
    /// accumulator per group).
    pub(super) columns: Vec<Option<ColumnKind>>,
    /// Sets of distinct values shared by distinct counts of one argument.
    pub(super) families: usize,
    /// The aggregate's output: group columns, then one per aggregate.
    pub(super) output: SchemaRef,
    /// A group as a checkpoint writes it: group columns, its row count,
    /// each accumulator's state.
    pub(super) saved: SchemaRef,
}

impl AggregatePlan {
    /// The accumulator plan of `core`, an updating stage's core fed by
    /// `edges`, if it is an aggregate that can run so.
    pub fn of(core: &Arc<dyn ExecutionPlan>, edges: &[InputEdge]) -> Option<Self> {
        let agg = core.downcast_ref::<AggregateExec>()?;
        if !agg.group_expr().is_single()
            || agg.aggr_expr().iter().any(|a| !a.order_bys().is_empty())
        {
            return None;
        }
        let (input, join, retracts) = match (edges, leaf_below(agg.input())) {
            ([edge], Some((leaf, input))) if leaf == edge.shuffle_id => {
                (input, None, edge.updating)
            }
            // Fed by an inner join of two streams: its changed pairs are
            // its rows' changes (see join.rs).
            (_, None) => {
                let join = IncrementalJoin::of(agg.input(), edges, false)?;
                let retracts = join.retracts;
                (Some(agg.input().clone()), Some(join), retracts)
            }
            _ => return None,
        };
        let group_count = agg.group_expr().expr().len();
        let merge_columns = match agg.mode().input_mode() {
            AggregateInputMode::Raw => None,
            AggregateInputMode::Partial if retracts || join.is_some() => return None,
            AggregateInputMode::Partial => {
                let mut at = group_count;
                let mut ranges = vec![];
                for a in agg.aggr_expr() {
                    let n = a.state_fields().ok()?.len();
                    ranges.push(at..at + n);
                    at += n;
                }
                // Partial states: the input's columns (input_schema() is the
                // schema the partial aggregate read).
                if at != agg.input().schema().fields().len() {
                    return None;
                }
                Some(ranges)
            }
        };
        let counted = if retracts {
            agg.aggr_expr()
                .iter()
                .map(|a| counted_over_a_changelog(a, &agg.input().schema()))
                .collect::<Option<Vec<_>>>()?
        } else {
            vec![None; agg.aggr_expr().len()]
        };
        let output = agg.schema();
        let mut fields: Vec<Field> = output
            .fields()
            .iter()
            .take(group_count)
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        fields.push(Field::new(ROWS_COLUMN, DataType::Int64, false));
        let mut columns = vec![];
        for (i, a) in agg.aggr_expr().iter().enumerate() {
            let mut probe = make_accumulator(a, retracts, &counted[i]).ok()?;
            let state: Vec<DataType> = probe.state().ok()?.iter().map(|s| s.data_type()).collect();
            for (j, t) in state.iter().enumerate() {
                fields.push(Field::new(format!("s{i}_{j}"), t.clone(), true));
            }
            // Rows in: the argument's type decides; partial states in: the
            // state's.
            let argument = match merge_columns {
                Some(_) => Ok(None),
                None => a
                    .expressions()
                    .first()
                    .and_then(|e| e.data_type(&agg.input().schema()).ok())
                    .map(Some)
                    .ok_or(()),
            };
            columns.push(match (&counted[i], argument) {
                (None, Ok(argument)) => ColumnKind::of(a, argument.as_ref(), retracts, &state),
                _ => None,
            });
        }
        let families = share_distinct_sets(agg.aggr_expr(), &mut columns);
        Some(AggregatePlan {
            join,
            input,
            input_schema: agg.input().schema(),
            group_exprs: agg
                .group_expr()
                .expr()
                .iter()
                .map(|(e, _)| e.clone())
                .collect(),
            aggs: agg.aggr_expr().to_vec(),
            filters: agg.filter_expr().to_vec(),
            merge_columns,
            retracts,
            counted,
            columns,
            families,
            output,
            saved: Arc::new(Schema::new(fields)),
        })
    }

    /// Group columns of the output.
    pub fn group_count(&self) -> usize {
        self.group_exprs.len()
    }

    /// The aggregate's output schema.
    pub fn output(&self) -> &SchemaRef {
        &self.output
    }

    /// The schema a checkpoint writes groups in.
    pub fn saved_schema(&self) -> &SchemaRef {
        &self.saved
    }

    /// What `skein explain` says of the state.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .aggs
            .iter()
            .zip(&self.counted)
            .map(|(a, counted)| match counted {
                Some(_) if a.is_distinct() => {
                    format!("{}(DISTINCT) as a count per value", a.fun().name())
                }
                Some(_) => format!("{} as a count per value", a.fun().name()),
                None if a.is_distinct() => format!("{}(DISTINCT)", a.fun().name()),
                None => a.fun().name().to_string(),
            })
            .collect();
        let over = match (self.retracts, self.join.is_some()) {
            (true, true) => ", retracting, over the changed pairs of an inner join of two streams",
            (true, false) => ", retracting",
            (false, true) => ", over the new pairs of an inner join of two streams that append",
            (false, false) => "",
        };
        let shared = match self.families {
            0 => String::new(),
            n => format!("; distinct values in {n} set(s) per group, shared by argument"),
        };
        let typed = self.columns.iter().filter(|c| c.is_some()).count();
        let columns = match typed {
            0 => String::new(),
            n if n == self.columns.len() => "; each a typed column".to_string(),
            n => format!("; {n} of {} as typed columns", self.columns.len()),
        };
        format!(
            "accumulators per group ({}{columns}{shared}){over}",
            names.join(", ")
        )
    }

    /// Aggregate `i`'s empty column.
    pub(super) fn column(&self, i: usize) -> AggColumn {
        let prefix = format!("s{i}_");
        let state: Vec<DataType> = self
            .saved
            .fields()
            .iter()
            .filter(|f| f.name().starts_with(&prefix))
            .map(|f| f.data_type().clone())
            .collect();
        AggColumn::new(self.columns[i], &state)
    }

    pub(super) fn accumulator(&self, i: usize) -> Result<Box<dyn Accumulator>> {
        make_accumulator(&self.aggs[i], self.retracts, &self.counted[i])
    }
}

/// Gives each distinct count in a column its family, one per argument
/// (up to [`MEMBERS`] each), and its bit in it. Returns how many families.
fn share_distinct_sets(
    aggs: &[Arc<AggregateFunctionExpr>],
    columns: &mut [Option<ColumnKind>],
) -> usize {
    let mut families: Vec<(String, usize)> = vec![];
    for (a, column) in aggs.iter().zip(columns.iter_mut()) {
        let Some(ColumnKind::Distinct { .. }) = column else {
            continue;
        };
        let argument = a.expressions()[0].to_string();
        let family = match families
            .iter()
            .position(|(t, n)| *t == argument && *n < MEMBERS)
        {
            Some(f) => f,
            None => {
                families.push((argument, 0));
                families.len() - 1
            }
        };
        let bit = 1u8 << families[family].1;
        families[family].1 += 1;
        *column = Some(ColumnKind::Distinct { family, bit });
    }
    families.len()
}

/// How `a` runs over a changelog: `Some(None)` on DataFusion's retracting
/// accumulator, `Some(Some(..))` on a value count, `None` not at all.
fn counted_over_a_changelog(
    a: &AggregateFunctionExpr,
    input: &SchemaRef,
) -> Option<Option<(CountedReading, DataType)>> {
    let name = a.fun().name();
    if !a.is_distinct() && RETRACTABLE.contains(&name) {
        return a.create_sliding_accumulator().is_ok().then_some(None);
    }
    let arguments = a.expressions();
    let reading = CountedReading::of(name, a.is_distinct(), arguments.len())?;
    let data_type = arguments[0].data_type(input).ok()?;
    Some(Some((reading, data_type)))
}

fn make_accumulator(
    a: &AggregateFunctionExpr,
    retracts: bool,
    counted: &Option<(CountedReading, DataType)>,
) -> Result<Box<dyn Accumulator>> {
    Ok(match counted {
        Some((reading, data_type)) => Box::new(ValueCounts::new(*reading, data_type.clone())),
        None if retracts => a.create_sliding_accumulator()?,
        None => a.create_accumulator()?,
    })
}

/// The edge below `plan` through operators that pass or reshape rows one
/// at a time, and those operators (`None` when `plan` is the leaf).
pub(super) fn leaf_below(
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<(u32, Option<Arc<dyn ExecutionPlan>>)> {
    let mut node = plan.clone();
    loop {
        if let Some(leaf) = node.downcast_ref::<StageInputExec>() {
            let StageInput::Shuffle { shuffle_id } = leaf.input else {
                return None;
            };
            let only_leaf = Arc::ptr_eq(&node, plan);
            return Some((shuffle_id, (!only_leaf).then(|| plan.clone())));
        }
        let row_by_row = node.downcast_ref::<ProjectionExec>().is_some()
            || node.downcast_ref::<FilterExec>().is_some()
            || node.downcast_ref::<RepartitionExec>().is_some()
            || node.downcast_ref::<CoalescePartitionsExec>().is_some()
            || passes_batches_through(&node);
        if !row_by_row || node.children().len() != 1 {
            return None;
        }
        node = node.children()[0].clone();
    }
}
