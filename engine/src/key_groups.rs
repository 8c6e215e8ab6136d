//! The key group of a row: its key columns hashed as a sender's hash
//! repartition hashes them, modulo the key groups. A state split by this
//! function lands where the senders' rows for the same keys do.

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::common::hash_utils::create_hashes;
use datafusion::physical_plan::repartition::REPARTITION_RANDOM_STATE;

use crate::error::{EngineError, Result};
use crate::ring::HashRing;

/// The key group of each row of `batch`, whose key is `columns`.
pub fn key_groups(batch: &RecordBatch, columns: &[usize], groups: u32) -> Result<Vec<u32>> {
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|c| {
            batch.columns().get(*c).cloned().ok_or_else(|| {
                EngineError::Context(format!(
                    "key column {c} is not in rows of {} columns",
                    batch.num_columns()
                ))
            })
        })
        .collect::<Result<_>>()?;
    let mut hashes = vec![0u64; batch.num_rows()];
    create_hashes(
        &arrays,
        REPARTITION_RANDOM_STATE.random_state(),
        &mut hashes,
    )?;
    let groups = u64::from(groups.max(1));
    Ok(hashes.into_iter().map(|h| (h % groups) as u32).collect())
}

/// The rows of `batch` whose key group `ring` assigns to `member`.
pub fn rows_of_member(
    batch: &RecordBatch,
    columns: &[usize],
    groups: u32,
    ring: &HashRing,
    member: usize,
) -> Result<RecordBatch> {
    let owners: Vec<usize> = (0..groups.max(1) as usize)
        .map(|g| ring.member_for(g))
        .collect();
    let keep: BooleanArray = key_groups(batch, columns, groups)?
        .into_iter()
        .map(|g| Some(owners[g as usize] == member))
        .collect();
    Ok(filter_record_batch(batch, &keep)?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::Column;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::physical_plan::{ExecutionPlan, Partitioning, collect_partitioned};
    use datafusion::prelude::SessionContext;

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let a: Int64Array = (0..500).map(|i| (i % 7 != 0).then_some(i * 31)).collect();
        let b: StringArray = (0..500).map(|i| Some(format!("k{}", i % 13))).collect();
        RecordBatch::try_new(schema, vec![Arc::new(a), Arc::new(b)]).unwrap()
    }

    /// The reference is DataFusion's own repartition: a row's key group is
    /// the partition it sends the row to.
    #[tokio::test]
    async fn a_key_group_is_the_partition_a_hash_repartition_sends_the_row_to() {
        let b = batch();
        let source = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
            &[vec![b.clone()]],
            b.schema(),
            None,
        )
        .unwrap();
        let exprs: Vec<Arc<dyn datafusion::physical_plan::PhysicalExpr>> =
            vec![Arc::new(Column::new("b", 1)), Arc::new(Column::new("a", 0))];
        for n in [1usize, 3, 8, 64] {
            let plan: Arc<dyn ExecutionPlan> = Arc::new(
                RepartitionExec::try_new(source.clone(), Partitioning::Hash(exprs.clone(), n))
                    .unwrap(),
            );
            let parts = collect_partitioned(plan, SessionContext::new().task_ctx())
                .await
                .unwrap();
            for (p, batches) in parts.iter().enumerate() {
                for out in batches {
                    let groups = key_groups(out, &[1, 0], n as u32).unwrap();
                    assert!(
                        groups.iter().all(|g| *g as usize == p),
                        "n {n}, partition {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_members_shares_cover_every_row_once() {
        let b = batch();
        let ring = HashRing::new(3);
        let shares: Vec<usize> = (0..3)
            .map(|m| rows_of_member(&b, &[0], 8, &ring, m).unwrap().num_rows())
            .collect();
        assert_eq!(shares.iter().sum::<usize>(), b.num_rows(), "{shares:?}");
    }
}
