//! A query made ready to run, whichever backend runs it: planned in a
//! session over the catalog, its sources resumed from the offsets its sink
//! committed, and whether (and where) it checkpoints. The local run, the
//! Lambda run and YSB all start here; each then opens its checkpoint store
//! its own way (a local directory, S3).

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::prelude::SessionContext;

use crate::catalog::Catalog;
use crate::error::{EngineError, Result};
use crate::exec::{StageInput, StageInputExec};
use crate::planner::{Exchange, PlanOptions, QueryPlan};
use crate::source::ReplayMode;

/// A planned query and the session it was planned in (a `--verify` run
/// plans it again there, in one process).
pub struct Prepared {
    /// The plan every function is built from.
    pub plan: QueryPlan,
    /// The session, with the query's tables.
    pub ctx: SessionContext,
    /// The tables that start where the sink committed, with the offsets
    /// (`partition:offset,...`), for the log.
    pub resumed: Vec<(String, String)>,
}

/// Plan `sql` (its tables, then one query) over `catalog`, and resolve
/// the tables that resume from the sink (`'startup' 'checkpoint'`).
#[cfg(feature = "sql")]
pub async fn prepare(catalog: &Catalog, sql: &str, options: &PlanOptions) -> Result<Prepared> {
    let ctx = crate::session::session(catalog, options.group_size);
    let plan = crate::planner::plan_query(&ctx, sql, options).await?;
    finish(catalog, ctx, plan).await
}

/// [`prepare`] for a query built with DataFusion's DataFrame API in `ctx`
/// (a session over `catalog`) instead of SQL text.
pub async fn prepare_dataframe(
    catalog: &Catalog,
    ctx: SessionContext,
    frame: datafusion::dataframe::DataFrame,
    options: &PlanOptions,
) -> Result<Prepared> {
    let plan = crate::planner::plan_dataframe(&ctx, frame, options).await?;
    finish(catalog, ctx, plan).await
}

/// The rest of [`prepare`] for a plan made some other way (a DataFrame).
pub async fn finish(
    catalog: &Catalog,
    ctx: SessionContext,
    mut plan: QueryPlan,
) -> Result<Prepared> {
    let resumed = resume_from_sink(catalog, &mut plan).await?;
    for (table, offsets) in &resumed {
        tracing::info!(%table, %offsets, "resuming from the sink's checkpoint");
    }
    Ok(Prepared { plan, ctx, resumed })
}

/// Resolve every source of `plan` that resumes from its sink: the offsets
/// the sink committed become the table's explicit start, in the plan every
/// function is built from. Returns the tables resolved with their offsets.
pub async fn resume_from_sink(
    catalog: &Catalog,
    plan: &mut QueryPlan,
) -> Result<Vec<(String, String)>> {
    let sink = plan.sink.clone();
    let mut resolved = vec![];
    for stage in &mut plan.stages {
        for leaf in &mut stage.sources {
            if !catalog.resumes_from_sink(&leaf.config) {
                continue;
            }
            let (config, offsets) = catalog
                .resume_from_sink(&leaf.table, &leaf.config, &sink)
                .await?;
            leaf.config = config;
            let text = offsets
                .iter()
                .map(|(p, o)| format!("{p}:{o}"))
                .collect::<Vec<_>>()
                .join(",");
            resolved.push((leaf.table.clone(), text));
        }
    }
    Ok(resolved)
}

/// What the user asked of checkpoints (`--checkpoint-dir`, `--no-checkpoint`).
#[derive(Debug, Clone, Default)]
pub struct CheckpointRequest {
    /// Where, if given.
    pub dir: Option<PathBuf>,
    /// Not at all.
    pub off: bool,
}

/// Where a query checkpoints, when it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointLocation {
    /// `--checkpoint-dir`.
    Given(PathBuf),
    /// The backend's default place for this query.
    Default,
}

/// Whether the query reads a live source: one with no end of its own.
pub fn reads_live_source(catalog: &Catalog, plan: &QueryPlan) -> bool {
    plan.source_tables().any(|c| catalog.is_live(c))
}

/// The tables a checkpoint cannot read again, as `table (KIND)`.
fn unreplayable(catalog: &Catalog, plan: &QueryPlan) -> Vec<String> {
    plan.stages
        .iter()
        .flat_map(|s| s.sources.iter())
        .filter(|l| catalog.replay_mode(&l.config) == ReplayMode::Unsupported)
        .map(|l| format!("{} ({})", l.table, l.config.kind))
        .collect()
}

/// Whether the query checkpoints: an explicit directory (refused for a
/// table a checkpoint cannot read again), or by default a query that reads
/// a live source, every table of which a checkpoint can read again, into
/// an exactly-once sink.
pub fn checkpoint_location(
    catalog: &Catalog,
    plan: &QueryPlan,
    request: &CheckpointRequest,
) -> Result<Option<CheckpointLocation>> {
    if request.off {
        return Ok(None);
    }
    let cannot = unreplayable(catalog, plan);
    match &request.dir {
        Some(dir) => {
            if !cannot.is_empty() {
                return Err(EngineError::plan(format!(
                    "--checkpoint-dir: a checkpoint cannot read these tables again: {} \
                     (run with --no-checkpoint for at-least-once across restarts)",
                    cannot.join(", ")
                )));
            }
            Ok(Some(CheckpointLocation::Given(dir.clone())))
        }
        None if reads_live_source(catalog, plan)
            && cannot.is_empty()
            && catalog.sink_exactly_once(&plan.sink) =>
        {
            Ok(Some(CheckpointLocation::Default))
        }
        None => Ok(None),
    }
}

/// Why a query that does not checkpoint is not exactly once across
/// restarts, when it reads a live source into an exactly-once sink: to be
/// said before it runs rather than left for the user to find out.
pub fn at_least_once_reason(
    catalog: &Catalog,
    plan: &QueryPlan,
    request: &CheckpointRequest,
) -> Option<String> {
    if !reads_live_source(catalog, plan) || !catalog.sink_exactly_once(&plan.sink) {
        return None;
    }
    if request.off {
        return Some("--no-checkpoint: a restart reads the source afresh".into());
    }
    let cannot = unreplayable(catalog, plan);
    (!cannot.is_empty()).then(|| {
        format!(
            "{} cannot be read again from a checkpoint, so the query does not checkpoint",
            cannot.join(", ")
        )
    })
}

/// When a run stops, as asked before its plan is known (its interval may
/// come from the tables' `'epoch.interval'`).
#[derive(Debug, Clone, Default)]
pub struct RunBound {
    /// A number of epochs.
    pub epochs: Option<u64>,
    /// A wall-clock duration, one epoch per interval.
    pub duration: Option<std::time::Duration>,
    /// Until every source partition reached the end it had at the start.
    pub until_drained: bool,
    /// Time between epochs (default: the tables' option, else 1 s).
    pub interval: Option<std::time::Duration>,
}

/// Epochs of a bounded run given no bound.
pub const DEFAULT_EPOCHS: u64 = 10;

impl RunBound {
    /// No epochs, duration or drain: a standing query, for a live source.
    pub fn unbounded(&self) -> bool {
        self.epochs.is_none() && self.duration.is_none() && !self.until_drained
    }

    /// Time between epochs of `plan`.
    pub fn interval(&self, plan: &QueryPlan) -> Result<std::time::Duration> {
        crate::interval::effective_interval(self.interval, plan.source_tables())
    }

    /// When a bounded run of `plan` stops (an unbounded one runs
    /// [`DEFAULT_EPOCHS`]).
    pub fn stop(&self, plan: &QueryPlan) -> Result<crate::epochs::StopAfter> {
        use crate::epochs::StopAfter;
        let interval = self.interval(plan)?;
        Ok(match (self.duration, self.until_drained) {
            (_, true) => StopAfter::Drained { interval },
            (Some(duration), false) => StopAfter::Duration { duration, interval },
            (None, false) => StopAfter::Epochs(self.epochs.unwrap_or(DEFAULT_EPOCHS)),
        })
    }
}

/// A consolidated result in the query's order: a changelog's table has the
/// order of its changes, so a query that ends in ORDER BY and updates is
/// sorted again by its last sort. Other results are returned as they are.
pub async fn in_query_order(
    plan: &QueryPlan,
    batches: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>> {
    if !(plan.ordered && plan.updates()) {
        return Ok(batches);
    }
    let Some(last) = plan.stages.iter().find(|s| s.output == Exchange::Sink) else {
        return Ok(batches);
    };
    let Some(sort) = last.plan.downcast_ref::<SortExec>() else {
        return Ok(batches);
    };
    if sort.schema() != plan.output_schema && sort.schema().fields() != plan.output_schema.fields()
    {
        return Ok(batches);
    }
    let leaf =
        StageInputExec::new(StageInput::Shuffle { shuffle_id: 0 }, sort.schema()).bind(batches);
    let sorted: Arc<dyn ExecutionPlan> =
        Arc::new(SortExec::new(sort.expr().clone(), Arc::new(leaf)).with_fetch(sort.fetch()));
    let ctx = SessionContext::new().task_ctx();
    let stream = sorted.execute(0, ctx)?;
    Ok(datafusion::physical_plan::common::collect(stream).await?)
}

/// The name a query's text gives itself: a comment line `-- name: NAME`
/// (the first one; the name is trimmed and may not be empty).
pub fn declared_name(sql: &str) -> Option<String> {
    sql.lines()
        .filter_map(|l| l.trim().strip_prefix("--"))
        .filter_map(|c| c.trim().strip_prefix("name:"))
        .map(|n| n.trim().to_string())
        .find(|n| !n.is_empty())
}

#[cfg(test)]
mod name_tests {
    use super::declared_name;

    #[test]
    fn a_query_names_itself_in_a_comment() {
        let sql = "-- counts per key\n-- name: clicks-per-ad\nSELECT 1;";
        assert_eq!(declared_name(sql).as_deref(), Some("clicks-per-ad"));
        assert_eq!(declared_name("-- name:   \nSELECT 1"), None);
        assert_eq!(declared_name("SELECT 'name: x'"), None);
    }
}
