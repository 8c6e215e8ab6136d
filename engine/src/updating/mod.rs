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
//! * `aggregate.rs`: an aggregate kept as accumulators per group, which
//!   an epoch's rows update and retract (no input row is kept);
//!   `aggregate_columns.rs` keeps them in typed columns by group slot,
//!   `distinct_values.rs` the distinct counts' shared sets, and
//!   `spilled_groups.rs` the groups it moved to local disk past its
//!   memory budget;
//! * `join.rs`: an inner join of two streams that append, which joins
//!   each epoch's new rows only;
//! * `value_counts.rs`: `min`, `max` and `count(DISTINCT)` over a
//!   changelog, as a count per value;
//! * `keyed.rs`: rows kept by key;
//! * `diff.rs`: the changes between two results, and consolidating a
//!   changelog into a table;
//! * `state.rs`: a member's state, its checkpoints and its epoch step;
//! * `top_n.rs`: a row-number filter over rows that append, whose kept
//!   rows are cut to its result.

pub mod aggregate;
mod aggregate_columns;
pub mod aggregate_plan;
mod distinct_on_disk;
mod distinct_values;
pub mod join;
pub mod keyed;
mod spilled_groups;
pub mod split;
pub mod state;
pub mod top_n;
mod value_counts;

pub use split::UpdatingPlan;
pub use state::UpdatingState;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::{StageInput, StageInputExec};

/// How an updating stage computes its changes, for `skein explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePath {
    /// Work per epoch follows the epoch's rows, not the touched keys'
    /// history.
    pub incremental: bool,
    /// The operator that runs so.
    pub operator: String,
    /// What the state keeps.
    pub keeps: String,
    /// A key's work per epoch grows with everything it ever had (the
    /// recompute path, but for a top-N cut to its result).
    pub grows: bool,
}

impl std::fmt::Display for StatePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.incremental {
            "incremental"
        } else {
            "recompute"
        };
        write!(f, "{how} {}; keeps {}", self.operator, self.keeps)
    }
}

/// The schema of each exchange leaf of `plan`, by edge.
pub fn leaf_schemas(plan: &Arc<dyn ExecutionPlan>) -> BTreeMap<u32, SchemaRef> {
    let mut out = BTreeMap::new();
    collect_leaf_schemas(plan, &mut out);
    out
}

fn collect_leaf_schemas(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeMap<u32, SchemaRef>) {
    if let Some(leaf) = plan.downcast_ref::<StageInputExec>()
        && let StageInput::Shuffle { shuffle_id } = leaf.input
    {
        out.insert(shuffle_id, plan.schema());
    }
    for c in plan.children() {
        collect_leaf_schemas(c, out);
    }
}
