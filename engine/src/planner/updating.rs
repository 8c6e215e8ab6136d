//! Updating stages: which stages emit a changelog, and the plan changes a
//! changelog needs.
//!
//! A stateful stage whose inputs are all windowed (and none updates) emits
//! each window once; any other stateful stage is [`StageMode::Updating`]:
//! it emits the changes of its result every epoch. A stateless stage passes
//! on the changes of an updating input. See [`crate::changelog`].
//!
//! A partial aggregate cannot run over a changelog: it would add a
//! retracted row as if it were new. So an aggregate fed by an updating
//! edge is planned in one step instead of two: the sender's partial
//! aggregate goes, the edge carries the rows themselves (hash-partitioned by
//! the group key), and the receiver aggregates them whole, as its state.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use crate::context::StageMode;
use crate::error::{EngineError, Result};
use crate::exec::{StageInput, StageInputExec, passes_batches_through, recompute};

use super::cut::Cutter;
use super::*;

impl Cutter {
    /// Each stage's mode, and whether its output is a changelog. Inputs
    /// are settled before the stages they feed.
    pub(super) fn assign_modes(&mut self) {
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        let mut done = BTreeSet::new();
        for id in ids {
            self.settle(id, &mut done);
        }
    }

    fn settle(&mut self, id: u32, done: &mut BTreeSet<u32>) {
        if !done.insert(id) {
            return;
        }
        let ups: Vec<u32> = self.stages[&id].inputs.iter().map(|(up, _)| *up).collect();
        for up in &ups {
            self.settle(*up, done);
        }
        let inputs_update = ups.iter().any(|up| self.stages[up].updating);
        // Every input arrives as whole windows: it passed a stateful stage.
        let all_complete = !ups.is_empty()
            && ups.iter().all(|up| {
                let s = &self.stages[up];
                s.mode != StageMode::Stream
                    || self.any_upstream(*up, &|x| x.mode != StageMode::Stream)
            });
        let s = self.stages.get_mut(&id).expect("stage");
        let windowed = !s.inputs.is_empty() && s.windows.iter().all(Option::is_some);
        let changelog_source = s.sources.iter().any(|src| src.changelog);
        s.mode = match (s.stateful, inputs_update || !windowed, all_complete) {
            (false, _, _) => StageMode::Stream,
            (true, true, _) => StageMode::Updating,
            (true, false, false) => StageMode::Accumulate,
            (true, false, true) => StageMode::Complete,
        };
        s.updating = match s.mode {
            StageMode::Stream => inputs_update || changelog_source,
            StageMode::Updating => true,
            StageMode::Accumulate | StageMode::Complete => false,
        };
    }

    /// For every final aggregate fed by an updating edge: aggregate the rows
    /// themselves in one step (see the module).
    pub(super) fn rewrite_aggregates_over_changes(&mut self) -> Result<()> {
        let ids: Vec<u32> = self.stages.keys().copied().collect();
        for id in ids {
            let ups: Vec<u32> = self.stages[&id]
                .inputs
                .iter()
                .map(|(up, _)| *up)
                .filter(|up| self.stages[up].updating)
                .collect();
            for up in ups {
                let plan = self.stages[&id].plan.clone();
                let Some(rewritten) = self.one_step_over(&plan, up)? else {
                    continue;
                };
                self.stages.get_mut(&id).expect("stage").plan = rewritten;
            }
        }
        Ok(())
    }

    /// `plan` with the final aggregate over edge `up`'s leaf made whole (and
    /// `up`'s partial aggregate removed), or `None` if it has none.
    fn one_step_over(
        &mut self,
        plan: &Arc<dyn ExecutionPlan>,
        up: u32,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(agg) = plan.downcast_ref::<AggregateExec>()
            && matches!(
                agg.mode(),
                AggregateMode::Final | AggregateMode::FinalPartitioned
            )
            && reads_edge(agg.input(), up)
        {
            let (rows, partial) = self.drop_partial(up)?;
            let mode = match agg.mode() {
                AggregateMode::Final => AggregateMode::Single,
                _ => AggregateMode::SinglePartitioned,
            };
            let group_by = PhysicalGroupBy::new_single(partial.group_by.clone());
            let leaf: Arc<dyn ExecutionPlan> = Arc::new(StageInputExec::new(
                StageInput::Shuffle { shuffle_id: up },
                rows.clone(),
            ));
            let whole = AggregateExec::try_new(
                mode,
                group_by,
                partial.aggr_expr,
                partial.filter_expr,
                leaf,
                rows,
            )?;
            return Ok(Some(Arc::new(whole)));
        }
        let mut changed = false;
        let mut children = vec![];
        for c in plan.children() {
            match self.one_step_over(c, up)? {
                Some(new) => {
                    changed = true;
                    children.push(new);
                }
                None => children.push(c.clone()),
            }
        }
        if !changed {
            return Ok(None);
        }
        Ok(Some(plan.clone().replace_children(children, recompute())?))
    }

    /// Take the partial aggregate off the top of stage `up`: it now sends
    /// the rows under it, hash-partitioned (if it was) by the group key.
    /// Returns the schema of what it sends and the partial aggregate, whose
    /// group key now reads those rows.
    fn drop_partial(&mut self, up: u32) -> Result<(SchemaRef, DroppedPartial)> {
        let stage = self.stages.get_mut(&up).expect("stage");
        let not_found = || {
            tracing::debug!(
                "stage {up} sends no partial aggregate:\n{}",
                datafusion::physical_plan::displayable(stage.plan.as_ref()).indent(true)
            );
            EngineError::plan(format!(
                "stage {up} feeds an aggregate with a changelog, but its output is not a \
                 partial aggregate; this plan shape cannot update (RUST_LOG=debug shows the plan)"
            ))
        };
        let top = skip_passthrough(&stage.plan);
        let (repartition, below) = match top.downcast_ref::<RepartitionExec>() {
            Some(r) => match r.partitioning() {
                Partitioning::Hash(_, n) => (Some(*n), skip_passthrough(r.input())),
                _ => (None, skip_passthrough(r.input())),
            },
            None => (None, top),
        };
        let partial = below
            .downcast_ref::<AggregateExec>()
            .filter(|a| *a.mode() == AggregateMode::Partial)
            .ok_or_else(not_found)?;
        if !partial.group_expr().is_single() {
            return Err(EngineError::plan(
                "GROUPING SETS, CUBE and ROLLUP over a changelog are not supported: write one \
                 GROUP BY per grouping set and UNION ALL them",
            ));
        }
        let rows = partial.input().clone();
        // The group key as plain columns of what is sent, so the receiver
        // knows each row's key (and the hash partitioning is by columns).
        let width = rows.schema().fields().len();
        let mut extra = vec![];
        let mut group_by = vec![];
        for (expr, name) in partial.group_expr().expr() {
            match expr.downcast_ref::<Column>() {
                Some(_) => group_by.push((expr.clone(), name.clone())),
                None => {
                    let index = width + extra.len();
                    let column_name = format!("__skein_group_{}", extra.len());
                    extra.push((expr.clone(), column_name.clone()));
                    group_by.push((
                        Arc::new(Column::new(&column_name, index)) as Arc<dyn PhysicalExpr>,
                        name.clone(),
                    ));
                }
            }
        }
        let sent: Arc<dyn ExecutionPlan> = if extra.is_empty() {
            rows
        } else {
            let mut exprs = super::window_edges::every_column(&rows.schema());
            exprs.extend(extra);
            Arc::new(ProjectionExec::try_new(exprs, rows)?)
        };
        let schema = sent.schema();
        let plan: Arc<dyn ExecutionPlan> = match repartition {
            Some(n) => Arc::new(RepartitionExec::try_new(
                sent,
                Partitioning::Hash(group_by.iter().map(|(e, _)| e.clone()).collect(), n),
            )?),
            None => sent,
        };
        let dropped = DroppedPartial {
            aggr_expr: partial.aggr_expr().to_vec(),
            filter_expr: partial.filter_expr().to_vec(),
            group_by,
        };
        stage.plan = plan;
        Ok((schema, dropped))
    }
}

/// A partial aggregate taken off a sender, with its group key over the rows
/// the sender now sends.
struct DroppedPartial {
    aggr_expr: Vec<Arc<datafusion::physical_expr::aggregate::AggregateFunctionExpr>>,
    filter_expr: Vec<Option<Arc<dyn PhysicalExpr>>>,
    group_by: Vec<(Arc<dyn PhysicalExpr>, String)>,
}

fn skip_passthrough(plan: &Arc<dyn ExecutionPlan>) -> &Arc<dyn ExecutionPlan> {
    if passes_batches_through(plan) {
        skip_passthrough(plan.children()[0])
    } else {
        plan
    }
}

fn reads_edge(plan: &Arc<dyn ExecutionPlan>, up: u32) -> bool {
    let plan = skip_passthrough(plan);
    plan.downcast_ref::<StageInputExec>()
        .is_some_and(|l| l.input == StageInput::Shuffle { shuffle_id: up })
}

/// The columns a stage's output is hash-partitioned by, when they are
/// plain columns of what it sends (see [`crate::context::InputEdge::key`]).
pub(super) fn edge_key(plan: &Arc<dyn ExecutionPlan>) -> Option<Vec<usize>> {
    let top = skip_passthrough(plan);
    let r = top.downcast_ref::<RepartitionExec>()?;
    let Partitioning::Hash(exprs, _) = r.partitioning() else {
        return None;
    };
    exprs
        .iter()
        .map(|e| e.downcast_ref::<Column>().map(Column::index))
        .collect()
}

impl QueryPlan {
    /// What makes the result update, in words: the first updating stage's
    /// stateful operator, or the changelog table it reads.
    pub fn updating_cause(&self) -> String {
        let mut stages: Vec<&Stage> = self.stages.iter().filter(|s| s.updating).collect();
        stages.sort_by_key(|s| s.id);
        for s in &stages {
            if s.mode == StageMode::Updating {
                return format!("{} (stage {})", stateful_operator(&s.plan), s.id);
            }
            if let Some(src) = s.sources.iter().find(|x| x.changelog) {
                return format!("the changelog table {}", src.table);
            }
        }
        "an updating input".into()
    }
}

/// The topmost operator of `plan` that keeps state, described.
fn stateful_operator(plan: &Arc<dyn ExecutionPlan>) -> String {
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::joins::HashJoinExec;
    use datafusion::physical_plan::sorts::sort::SortExec;
    use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
    if let Some(a) = plan.downcast_ref::<AggregateExec>()
        && *a.mode() != AggregateMode::Partial
    {
        let groups: Vec<&str> = a
            .group_expr()
            .expr()
            .iter()
            .map(|(_, name)| name.as_str())
            .collect();
        return if groups.is_empty() {
            "an aggregate of the whole stream without a window".into()
        } else {
            format!(
                "an aggregate without a window (GROUP BY {})",
                groups.join(", ")
            )
        };
    }
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        let on: Vec<String> = j.on().iter().map(|(l, r)| format!("{l} = {r}")).collect();
        return format!(
            "a {} join of two streams without a window (ON {})",
            j.join_type(),
            on.join(" AND ")
        );
    }
    if plan.downcast_ref::<BoundedWindowAggExec>().is_some()
        || plan.downcast_ref::<WindowAggExec>().is_some()
    {
        let line = displayable(plan.as_ref()).one_line().to_string();
        return format!("a window function over a partition ({})", line.trim());
    }
    if let Some(sort) = plan.downcast_ref::<SortExec>() {
        return match sort.fetch() {
            Some(n) => format!("a top {n} (ORDER BY ... LIMIT {n}) over the whole stream"),
            None => "an ORDER BY over the whole stream".into(),
        };
    }
    if super::is_stateful(plan) && !plan.children().into_iter().any(super::is_stateful) {
        return displayable(plan.as_ref())
            .one_line()
            .to_string()
            .trim()
            .to_string();
    }
    plan.children()
        .into_iter()
        .find(|c| super::is_stateful(c))
        .map(stateful_operator)
        .unwrap_or_else(|| "a stateful operator".into())
}

impl QueryPlan {
    /// The joins of two streams that keep every row for ever: an updating
    /// stage with a join whose input tables set no `'state.ttl'` (and the
    /// run gives no default). Each as a line naming the tables.
    pub fn unbounded_joins(&self, default_ttl: Option<std::time::Duration>) -> Vec<String> {
        use datafusion::physical_plan::joins::{
            HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec,
        };
        fn has_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
            plan.downcast_ref::<HashJoinExec>().is_some()
                || plan.downcast_ref::<SortMergeJoinExec>().is_some()
                || plan.downcast_ref::<NestedLoopJoinExec>().is_some()
                || plan.children().into_iter().any(has_join)
        }
        if default_ttl.is_some() {
            return vec![];
        }
        let mut out = vec![];
        for s in &self.stages {
            if s.mode != StageMode::Updating || !has_join(&s.plan) {
                continue;
            }
            let unbounded: Vec<&str> = s
                .input_tables
                .iter()
                .flatten()
                .filter(|t| !t.config.options.contains_key(super::STATE_TTL_OPTION))
                .map(|t| t.table.as_str())
                .collect();
            if !unbounded.is_empty() {
                out.push(format!(
                    "the join in stage {} keeps every row of {} for as long as the query runs: \
                     set 'state.ttl' on the table (or --state-ttl) to bound its state",
                    s.id,
                    unbounded.join(" and ")
                ));
            }
        }
        out
    }

    /// The updating stages on the recompute path (no incremental operator
    /// fits) whose keys never close: a key touched every epoch is computed
    /// again from all its rows every epoch. Each as a line naming the
    /// operator; none when every table (or the run) sets a TTL.
    pub fn recomputing_stages(&self, default_ttl: Option<std::time::Duration>) -> Vec<String> {
        if default_ttl.is_some() {
            return vec![];
        }
        let mut out = vec![];
        for s in &self.stages {
            let Some(path) = self.state_path(s) else {
                continue;
            };
            let bounded = s
                .input_tables
                .iter()
                .flatten()
                .all(|t| t.config.options.contains_key(super::STATE_TTL_OPTION));
            if !path.grows || bounded {
                continue;
            }
            let operator = stateful_operator(&s.plan);
            out.push(format!(
                "stage {} computes {} again from every row it keeps for a key, each epoch \
                 the key is touched: a key that never closes costs more each time; \
                 'state.ttl' bounds it",
                s.id,
                operator.split(" (").next().unwrap_or(&operator),
            ));
        }
        out
    }
}
