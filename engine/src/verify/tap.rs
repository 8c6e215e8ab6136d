//! What a run's sources read, kept for `--verify`: the single-process
//! reference then runs over exactly those rows, whatever bound, pull size
//! or start position the run had (a reference that pulled the source again
//! would read one pull, or a topic that has moved on).
//!
//! Only in-process runs tap their sources (a function on Lambda keeps
//! nothing here); a query that was not tapped keeps the reference that
//! pulls the source itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::LogicalPlan;

use crate::error::Result;
use crate::exec::SourceTable;
use crate::source::{EpochSpec, MicroBatch, Source};

/// Per query code: per table, the batches its sources pulled.
type Tapped = HashMap<String, BTreeMap<String, Vec<RecordBatch>>>;

static TAPS: LazyLock<Mutex<Tapped>> = LazyLock::new(Mutex::default);

fn taps() -> std::sync::MutexGuard<'static, Tapped> {
    TAPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keep what the sources of `query_code` read from now on.
pub fn start(query_code: &str) {
    taps().insert(query_code.to_string(), BTreeMap::new());
}

/// Keep `batches` that a source of `query_code` read for `table`, if the
/// query is tapped.
pub fn record(query_code: &str, table: &str, batches: &[RecordBatch]) {
    if let Some(tables) = taps().get_mut(query_code) {
        tables
            .entry(table.to_string())
            .or_default()
            .extend(batches.iter().filter(|b| b.num_rows() > 0).cloned());
    }
}

/// Stop tapping `query_code`; what its sources read, per table, if it was
/// tapped.
pub fn take(query_code: &str) -> Option<BTreeMap<String, Vec<RecordBatch>>> {
    taps().remove(query_code)
}

/// `plan` with each scan of a table in `read` reading those rows instead
/// of its source.
pub fn over_read_rows(
    plan: &LogicalPlan,
    mut read: BTreeMap<String, Vec<RecordBatch>>,
) -> Result<LogicalPlan> {
    let swapped = plan.clone().transform_up(|node| {
        let LogicalPlan::TableScan(mut scan) = node else {
            return Ok(Transformed::no(node));
        };
        let Ok(provider) = datafusion::datasource::source_as_provider(&scan.source) else {
            return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
        };
        let any: &dyn std::any::Any = provider.as_ref();
        let Some(table) = any.downcast_ref::<SourceTable>() else {
            return Ok(Transformed::no(LogicalPlan::TableScan(scan)));
        };
        let batches = read.get(&table.name).cloned().unwrap_or_default();
        let recorded = ReadRows {
            schema: table.source.schema(),
            changelog: table.source.changelog(),
            batches,
        };
        let swapped =
            SourceTable::new(table.name.clone(), table.config.clone(), Arc::new(recorded));
        scan.source = provider_as_source(Arc::new(swapped));
        Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
    })?;
    read.clear();
    Ok(swapped.data)
}

/// A source that yields rows read earlier, once, as one instance.
#[derive(Debug)]
struct ReadRows {
    schema: SchemaRef,
    changelog: bool,
    batches: Vec<RecordBatch>,
}

#[async_trait]
impl Source for ReadRows {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn parallelism(&self) -> usize {
        1
    }

    fn changelog(&self) -> bool {
        self.changelog
    }

    async fn pull(&self, _spec: EpochSpec) -> Result<MicroBatch> {
        Ok(MicroBatch {
            batches: self.batches.clone(),
            ..Default::default()
        })
    }
}
