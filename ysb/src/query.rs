//! queries/ysb.sql as `ysb run` runs it: the query with its placeholders
//! filled, the dead-letter topic it writes, the run it announces for
//! `ysb check`, and the offsets its checkpoints have committed.

use std::collections::BTreeMap;

use skein_engine::checkpoint::CheckpointStore;
use skein_engine::driver::committed_offsets;
use skein_engine::planner::QueryPlan;
use skein_sinks::kafka::ensure_topic;

use crate::error::{Context, Result, YsbError};
use crate::{Workload, checkpoint, redis_connection, run_key};

/// The query, with `{{...}}` parts filled in by [`ysb_sql`].
pub const YSB_SQL: &str = include_str!("../../queries/ysb.sql");

/// How the query reads its topic.
#[derive(Debug, Clone)]
pub struct QueryParams {
    /// Source instances (partitions are spread over them).
    pub parallelism: usize,
    /// Records one source instance reads per epoch at most.
    pub max_records: usize,
    /// Where undecodable records and views of ads without a campaign go.
    pub dead_letter_topic: String,
}

/// queries/ysb.sql with its placeholders filled.
pub fn ysb_sql(w: &Workload, p: &QueryParams) -> String {
    YSB_SQL
        .replace("{{topic}}", &w.topic)
        .replace("{{brokers}}", &w.brokers)
        .replace("{{parallelism}}", &p.parallelism.to_string())
        .replace("{{max_records}}", &p.max_records.to_string())
        .replace("{{dead_letter_topic}}", &p.dead_letter_topic)
        .replace("{{redis}}", &w.redis)
        .replace("{{checkpoint}}", &checkpoint(&w.topic))
}

/// Tell `ysb check` which run lineage writes the topic's results and with
/// how many sink members: a snapshot of Redis is consistent when every one
/// of them has written the same epoch.
pub async fn announce_run(w: &Workload, plan: &QueryPlan, run: &str) -> Result<()> {
    let members = plan.stages.last().map_or(1, |s| s.members);
    let mut con = redis_connection(&w.redis).await?;
    let _: () = redis::pipe()
        .atomic()
        .hset(run_key(&w.topic), "run", run)
        .ignore()
        .hset(run_key(&w.topic), "members", members)
        .ignore()
        .query_async(&mut con)
        .await
        .context("recording the run in Redis")?;
    Ok(())
}

/// partition -> next offset of `topic` after the last committed epoch
/// (empty before the first commit).
pub async fn committed_topic_offsets(
    plan: &QueryPlan,
    store: &CheckpointStore,
    topic: &str,
) -> Result<BTreeMap<i32, i64>> {
    let committed = committed_offsets(plan, store)
        .await
        .context("reading the committed offsets from the checkpoint directory")?;
    Ok(committed
        .into_iter()
        .flat_map(|(_, offsets)| offsets)
        .filter(|o| o.source == topic)
        .map(|o| (o.partition, o.offset))
        .collect())
}

/// The dead-letter topic, created compacted if it does not exist: letters
/// are keyed `<topic>/<partition>/<offset>`, so the copy a replayed epoch
/// sends again after a crash replaces the first one when Kafka compacts.
pub async fn create_dead_letter_topic(brokers: &str, topic: &str) -> Result<()> {
    ensure_topic(brokers, topic, 1, &[("cleanup.policy", "compact")])
        .await
        .map_err(|e| YsbError::Failed(format!("the dead-letter topic: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_and_the_sink_is_ysb_redis() {
        let w = Workload {
            brokers: "b:9092".into(),
            redis: "redis://r:6379".into(),
            topic: "t".into(),
            seed: 0,
            dir: "d".into(),
        };
        let sql = ysb_sql(
            &w,
            &QueryParams {
                parallelism: 3,
                max_records: 7,
                dead_letter_topic: "t-dead".into(),
            },
        );
        // Only the comment's `{{...}}` is left.
        assert_eq!(
            sql.matches("{{").count(),
            sql.matches("{{...}}").count(),
            "{sql}"
        );
        assert!(sql.contains("STORED AS YSB_REDIS LOCATION 'redis://r:6379'"));
        assert!(sql.contains("'checkpoint' 'ysb:t'"));
        assert!(sql.contains("'dead.letter.topic' 't-dead'"));
    }
}
