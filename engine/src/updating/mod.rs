//! Updating stages: stateful stages whose state no watermark closes (an
//! aggregate without a window, a join of two streams, a top-N, a window
//! function over a partition, DISTINCT), or whose input is a changelog.
//!
//! Such a stage keeps every input row, per input edge, indexed by the key
//! its rows were hash-partitioned by, and the rows it has emitted, indexed
//! by the same key. At the end of an epoch it runs its sub-plan (the
//! DataFusion operators it was planned with) over the rows of the keys the
//! epoch touched, compares the result with what it emitted for those keys,
//! and sends the difference on as a changelog ([`crate::changelog`]):
//! retractions of rows that are no longer in the result, and new rows. An
//! input retraction takes back the row it names, so any operator can take
//! a changelog as input. Work per epoch follows what the epoch touched,
//! not the whole state, except where no key can be traced through the
//! plan (a gathering stage: one group).
//!
//! * `split.rs`: where the stage compares (the core) and the row-by-row
//!   operators above (the tail);
//! * `keyed.rs`: rows kept by key;
//! * `diff.rs`: the changes between two results, and consolidating a
//!   changelog into a table;
//! * `state.rs`: a member's state, its checkpoints and its epoch step.

pub mod diff;
pub mod keyed;
pub mod split;
pub mod state;

pub use diff::{Consolidated, consolidate};
pub use split::UpdatingPlan;
pub use state::UpdatingState;

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::prelude::SessionContext;

use crate::error::Result;
use crate::exec::{StageInput, StageInputExec};
use crate::planner::{Exchange, QueryPlan};

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
