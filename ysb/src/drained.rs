//! When an `--until-drained` run of queries/ysb.sql has drained: only once
//! the committed offsets reach every partition's high watermark, not when a
//! pull comes back empty.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::driver::{DrainCheck, EpochOutcome};
use skein_engine::planner::QueryPlan;

use crate::error::{Context, Result};
use crate::query::committed_topic_offsets;

/// Empty epochs in a row, with the broker answering and no offset moving,
/// after which `--until-drained` gives up on reaching the high watermarks
/// (a partition that ends in transaction markers never gets there).
const STUCK_EPOCHS: u32 = 50;

/// The engine driver's drained test for YSB: an epoch found nothing new,
/// and the offsets committed in the checkpoint directory have reached every
/// partition's high watermark as the broker gives it now. A pull that came back empty
/// because the broker was away therefore never ends the run, and records
/// written during the run are read before it ends.
pub struct DrainedTest<'a> {
    brokers: String,
    topic: String,
    plan: &'a QueryPlan,
    store: Arc<CheckpointStore>,
    watermarks: Option<Arc<HighWatermarks>>,
    /// Empty epochs in a row that left the committed offsets where they were.
    stuck: (u32, BTreeMap<i32, i64>),
}

#[async_trait::async_trait]
impl DrainCheck for DrainedTest<'_> {
    async fn drained(
        &mut self,
        _epoch: u64,
        outcome: EpochOutcome,
    ) -> skein_engine::error::Result<bool> {
        self.test(outcome)
            .await
            .map_err(|e| skein_engine::error::EngineError::Context(e.to_string()))
    }
}

impl<'a> DrainedTest<'a> {
    pub fn new(
        brokers: &str,
        topic: &str,
        plan: &'a QueryPlan,
        store: Arc<CheckpointStore>,
    ) -> Self {
        DrainedTest {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            plan,
            store,
            watermarks: None,
            stuck: (0, BTreeMap::new()),
        }
    }

    async fn test(&mut self, outcome: EpochOutcome) -> Result<bool> {
        if outcome.events > 0 {
            self.stuck = (0, BTreeMap::new());
            return Ok(false);
        }
        let w = match &self.watermarks {
            Some(w) => w.clone(),
            None => self
                .watermarks
                .insert(Arc::new(HighWatermarks::new(&self.brokers, &self.topic)?))
                .clone(),
        };
        let Some(marks) = tokio::task::spawn_blocking(move || w.fetch())
            .await
            .map_err(|e| crate::YsbError::Failed(format!("high watermarks task: {e}")))?
        else {
            // The broker did not answer: nothing can be concluded.
            self.stuck = (0, BTreeMap::new());
            return Ok(false);
        };
        let committed = committed_topic_offsets(self.plan, &self.store, &self.topic).await?;
        let done = marks
            .iter()
            .all(|(p, (low, high))| committed.get(p).copied().unwrap_or(*low) >= *high);
        if done {
            return Ok(true);
        }
        if committed == self.stuck.1 {
            self.stuck.0 += 1;
        } else {
            self.stuck = (1, committed);
        }
        if self.stuck.0 >= STUCK_EPOCHS {
            tracing::warn!(
                topic = %self.topic,
                committed = ?self.stuck.1,
                "{STUCK_EPOCHS} empty epochs without progress below the high watermarks; stopping"
            );
            return Ok(true);
        }
        Ok(false)
    }
}

/// A consumer kept open to ask for high watermarks.
struct HighWatermarks {
    consumer: rdkafka::consumer::BaseConsumer,
    topic: String,
}

impl HighWatermarks {
    /// No request yet: this works while the broker is away.
    fn new(brokers: &str, topic: &str) -> Result<Self> {
        let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", format!("skein-ysb-watermarks-{topic}"))
            .set("enable.auto.commit", "false")
            .create()
            .context("Kafka consumer for high watermarks")?;
        Ok(HighWatermarks {
            consumer,
            topic: topic.to_string(),
        })
    }

    /// (low, high) per partition, or `None` while the broker does not answer.
    fn fetch(&self) -> Option<BTreeMap<i32, (i64, i64)>> {
        use rdkafka::consumer::Consumer;
        let timeout = Duration::from_secs(5);
        let unknown = |e: rdkafka::error::KafkaError| {
            tracing::debug!(topic = %self.topic, "high watermarks unknown: {e}");
        };
        let metadata = self
            .consumer
            .fetch_metadata(Some(&self.topic), timeout)
            .map_err(unknown)
            .ok()?;
        let topic = metadata.topics().iter().find(|t| t.name() == self.topic)?;
        if topic.error().is_some() || topic.partitions().is_empty() {
            return None;
        }
        let mut out = BTreeMap::new();
        for p in topic.partitions() {
            let w = self
                .consumer
                .fetch_watermarks(&self.topic, p.id(), timeout)
                .map_err(unknown)
                .ok()?;
            out.insert(p.id(), w);
        }
        Some(out)
    }
}
