//! Where a lookup join goes: a physical optimizer rule that replaces a hash
//! join of a stream with a lookup table by a [`LookupJoinExec`] over the
//! stream side alone. It runs before DataFusion enforces distributions, so
//! no exchange is planned for the join and it stays in the stage that reads
//! the stream (the source stage, for a join straight after the scan).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, JoinType, Result as DfResult};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;

use super::LookupOptions;
use super::exec::{
    LookupHandle, LookupJoinExec, LookupJoinType, LookupScanExec, LookupSpec, not_a_stream,
};
use crate::exec::SourceScanExec;
use crate::source::{SourceConfig, SourceRegistry};

/// The rule's name; it runs right after DataFusion's `join_selection`.
pub const RULE_NAME: &str = "place_lookup_joins";
/// The DataFusion rule this one runs after.
pub const RUNS_AFTER: &str = "join_selection";

/// The physical optimizer rule that replaces a hash join of a stream with a
/// lookup table by a lookup join.
pub struct PlaceLookupJoins {
    registry: SourceRegistry,
}

impl PlaceLookupJoins {
    /// The rule, opening lookups through `registry`.
    pub fn new(registry: SourceRegistry) -> Self {
        PlaceLookupJoins { registry }
    }
}

impl std::fmt::Debug for PlaceLookupJoins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlaceLookupJoins({:?})", self.registry.kinds())
    }
}

impl PhysicalOptimizerRule for PlaceLookupJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = plan
            .transform_up(|node| {
                let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                    return Ok(Transformed::no(node));
                };
                match self.replace(join)? {
                    Some(replaced) => Ok(Transformed::yes(replaced)),
                    None => Ok(Transformed::no(node)),
                }
            })?
            .data;
        // A lookup table anywhere else (read on its own, in a join of
        // another kind) cannot run.
        match first_lookup_table(&plan)? {
            Some(table) => Err(not_a_stream(&table)),
            None => Ok(plan),
        }
    }

    fn name(&self) -> &str {
        RULE_NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Below operators that only move rows between partitions.
fn strip(plan: &Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    let mut p = plan.clone();
    loop {
        let moves_rows = p.downcast_ref::<RepartitionExec>().is_some()
            || p.downcast_ref::<CoalescePartitionsExec>().is_some()
            || crate::exec::passes_batches_through(&p);
        if !moves_rows {
            return p;
        }
        p = p.children()[0].clone();
    }
}

/// The table of the first lookup scan in `plan`, if any.
fn first_lookup_table(plan: &Arc<dyn ExecutionPlan>) -> DfResult<Option<String>> {
    let mut found = None;
    plan.apply(|n| {
        if let Some(scan) = n.downcast_ref::<LookupScanExec>() {
            found = Some(scan.table.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// The lookup scan under `side`, if that side is a lookup table.
fn lookup_scan(side: &Arc<dyn ExecutionPlan>) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
    let p = strip(side);
    if p.downcast_ref::<LookupScanExec>().is_some() {
        return Ok(Some(p));
    }
    match first_lookup_table(&p)? {
        // A filter on the table's columns, say: the join would have to
        // see the whole table.
        Some(table) if p.children().len() == 1 => Err(DataFusionError::Plan(format!(
            "lookup table {table}: the join must take the table as it is, but the plan puts {} \
             between them (a condition on the table's columns belongs after the join)",
            p.name()
        ))),
        _ => Ok(None),
    }
}

/// The one source table under `plan`, if there is exactly one.
fn stream_table(plan: &Arc<dyn ExecutionPlan>) -> DfResult<Option<(String, SourceConfig)>> {
    let mut found: Vec<(String, SourceConfig)> = vec![];
    plan.apply(|n| {
        if let Some(scan) = n.downcast_ref::<SourceScanExec>()
            && !found.iter().any(|(t, _)| *t == scan.table)
        {
            found.push((scan.table.clone(), scan.config.clone()));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((found.len() == 1).then(|| found.remove(0)))
}

fn column_name(e: &Arc<dyn PhysicalExpr>) -> Option<(&str, usize)> {
    e.downcast_ref::<Column>().map(|c| (c.name(), c.index()))
}

impl PlaceLookupJoins {
    fn replace(&self, join: &HashJoinExec) -> DfResult<Option<Arc<dyn ExecutionPlan>>> {
        let (scan, lookup_left) = match (lookup_scan(join.left())?, lookup_scan(join.right())?) {
            (None, None) => return Ok(None),
            (Some(s), None) => (s, true),
            (None, Some(s)) => (s, false),
            (Some(s), Some(_)) => {
                let table = &s
                    .downcast_ref::<LookupScanExec>()
                    .expect("a lookup scan")
                    .table;
                return Err(DataFusionError::Plan(format!(
                    "lookup table {table} is joined with another lookup table; join it with a stream"
                )));
            }
        };
        let scan = scan
            .downcast_ref::<LookupScanExec>()
            .expect("a lookup scan");
        let table = &scan.table;
        let plan_err = |msg: String| DataFusionError::Plan(format!("lookup table {table}: {msg}"));
        let join_type = match (join.join_type(), lookup_left) {
            (JoinType::Inner, _) => LookupJoinType::Inner,
            (JoinType::Left, false) | (JoinType::Right, true) => LookupJoinType::Outer,
            (other, _) => {
                return Err(plan_err(format!(
                    "a {other} join with a stream is not supported: use JOIN or LEFT JOIN, \
                     the stream on the left"
                )));
            }
        };
        if join.filter().is_some() {
            return Err(plan_err(format!(
                "the join condition must be only <stream column> = {table}.<its lookup.key>"
            )));
        }
        let options = LookupOptions::from_config(&scan.config, &scan.table_schema)
            .map_err(|e| plan_err(e.to_string()))?;
        let [(l, r)] = join.on() else {
            return Err(plan_err(format!(
                "join on its key column {} alone, not on {} columns",
                options.key,
                join.on().len()
            )));
        };
        let (stream_expr, table_expr) = if lookup_left { (r, l) } else { (l, r) };
        match column_name(table_expr) {
            Some((name, _)) if name == options.key => {}
            _ => {
                return Err(plan_err(format!(
                    "join on its key column {} (its lookup.key), not on {table_expr}",
                    options.key
                )));
            }
        }
        let Some((_, stream_key)) = column_name(stream_expr) else {
            return Err(plan_err(format!(
                "the stream's side of the join must be a column, not {stream_expr}"
            )));
        };
        let stream = strip(if lookup_left {
            join.right()
        } else {
            join.left()
        });
        let spec = LookupSpec {
            table: table.clone(),
            config: scan.config.clone(),
            options,
            projection: scan.projection.clone(),
            stream_key,
            join_type,
            letters_to: stream_table(&stream)?,
        };
        let handle = LookupHandle::open(&self.registry, spec, scan.table_schema.clone())
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let stream_width = stream.schema().fields().len();
        let mut out: Arc<dyn ExecutionPlan> =
            Arc::new(LookupJoinExec::try_new(stream, Arc::new(handle))?);
        let joined = join.join_schema().clone();
        if lookup_left {
            // The join's order: the table's columns first.
            let table_width = joined.fields().len() - stream_width;
            let order = (stream_width..stream_width + table_width).chain(0..stream_width);
            out = select(out, order)?;
        }
        if let Some(p) = &join.projection {
            out = select(out, p.iter().copied())?;
        }
        Ok(Some(out))
    }
}

/// A projection of `input`'s columns at `indices`, names kept.
fn select(
    input: Arc<dyn ExecutionPlan>,
    indices: impl Iterator<Item = usize>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let schema = input.schema();
    let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = indices
        .map(|i| {
            let name = schema.field(i).name().clone();
            (
                Arc::new(Column::new(&name, i)) as Arc<dyn PhysicalExpr>,
                name,
            )
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(exprs, input)?))
}

/// DataFusion's physical optimizer rules with [`PlaceLookupJoins`] after
/// `join_selection` (which has fixed the join's sides by then).
pub fn rules(registry: &SourceRegistry) -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == RUNS_AFTER)
        .map_or(0, |i| i + 1);
    rules.insert(at, Arc::new(PlaceLookupJoins::new(registry.clone())));
    rules
}
