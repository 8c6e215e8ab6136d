//! `ysb run`: queries/ysb.sql at the default group size through the engine's
//! checkpointed driver. Exactly once comes from the engine: the offsets log
//! and commits in the topic's checkpoint directory, and the Redis sink's
//! epoch marker per (run, member) in each MULTI/EXEC. What is YSB's own here
//! is when a run has drained: only once the committed offsets reach every
//! partition's high watermark, not when a pull comes back empty.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use object_store::memory::InMemory;
use rdkafka::config::ClientConfig;
use serde_json::json;
use skein_connectors::kafka::DEAD_LETTERS;
use skein_connectors::kafka::ensure_topic;
use skein_engine::checkpoint::CheckpointStore;
use skein_engine::driver::{
    DrainCheck, EpochOutcome, RunReport, StopAfter, committed_offsets, run_local_drained_by,
};
use skein_engine::local::LocalRuntime;
use skein_engine::lookup::LOOKUP_MISSES_SET_ASIDE as UNKNOWN_AD_VIEWS;
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};

use super::{
    YSB_SQL, YsbRunArgs, checkpoint, default_dead_letter_topic, redis_connection, run_key,
};
use crate::registry::{Registries, registries};

/// queries/ysb.sql with its placeholders filled.
pub(super) fn ysb_sql(a: &YsbRunArgs) -> String {
    let c = &a.common;
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&c.topic));
    YSB_SQL
        .replace("{{topic}}", &c.topic)
        .replace("{{brokers}}", &c.brokers)
        .replace("{{parallelism}}", &a.parallelism.to_string())
        .replace("{{max_records}}", &a.max_records.to_string())
        .replace("{{dead_letter_topic}}", &dlt)
        .replace("{{redis}}", &c.redis)
        .replace("{{checkpoint}}", &checkpoint(&c.topic))
}

pub(super) async fn run(a: &YsbRunArgs) -> Result<()> {
    let RunOutcome {
        report,
        dead_letters: dead,
        unknown_ad_views,
        resumed,
        measured,
    } = run_query(a).await?;
    let cost = crate::cost::section(&measured, None, &Default::default())?;
    if a.common.json {
        println!(
            "{}",
            json!({
                "events": report.events,
                "dead_letters": dead,
                "unknown_ad_views": unknown_ad_views,
                "epochs": report.epochs,
                "elapsed_s": report.elapsed_s,
                "events_per_s": report.events_per_s.round(),
                "invocations": report.invocations,
                "payload_bytes": report.payload_bytes,
                "resumed_from": resumed,
                "resumed_after": report.resumed_after,
                "functions": report.functions,
                "cost": crate::cost::to_json(&cost),
            })
        );
    } else {
        println!(
            "{} records read ({} dead letters, {} views of ads without a campaign) in {} epochs, {:.2} s, {:.0} records/s; resumed at {resumed} records",
            report.events,
            dead,
            unknown_ad_views,
            report.epochs,
            report.elapsed_s,
            report.events_per_s
        );
        println!("{}", crate::cost::one_line(&cost));
    }
    Ok(())
}

/// What one `ysb run` did.
pub(super) struct RunOutcome {
    pub report: RunReport,
    /// Undecodable records sent to the dead-letter topic.
    pub dead_letters: u64,
    /// Views of ads without a campaign (sent to the dead-letter topic).
    pub unknown_ad_views: u64,
    /// Records already committed when the run started.
    pub resumed: i64,
    /// What the cost model takes from the run (CPU time includes a load
    /// published from the same process).
    pub measured: skein_cost::Measured,
}

/// Run the query until drained (or `--duration`), from the topic's
/// checkpoint directory.
pub(super) async fn run_query(a: &YsbRunArgs) -> Result<RunOutcome> {
    let c = &a.common;
    if let Some(addr) = a.metrics {
        crate::run::serve_metrics(addr)?;
    }
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&c.topic));
    create_dead_letter_topic(&c.brokers, &dlt).await?;
    let sql = ysb_sql(a);
    let Registries { sources, sinks, .. } = registries();
    let mut options = PlanOptions::default();
    let ctx = session(&sources, options.group_size);
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .context("planning queries/ysb.sql")?;
    let runtime = LocalRuntime::new(sources, sinks, Arc::new(InMemory::new()));
    let request = crate::checkpoint_dir::Request {
        dir: Some(c.checkpoint_dir()),
        off: false,
    };
    let held = crate::checkpoint_dir::open(&plan, &request)
        .await?
        .context("the YSB query cannot checkpoint")?;
    held.attach(&runtime, &mut options, 1);
    let resumed: i64 = committed_topic_offsets(&plan, &held.store, &c.topic)
        .await?
        .values()
        .sum();
    announce_run(a, &plan, &options.run).await?;
    let stop = match a.duration {
        Some(duration) => StopAfter::Duration {
            duration,
            interval: a.interval,
        },
        None => StopAfter::Drained {
            interval: a.interval,
        },
    };
    let dead_before = DEAD_LETTERS.load(Ordering::Relaxed);
    let unknown_before = UNKNOWN_AD_VIEWS.load(Ordering::Relaxed);
    let mut drained = DrainedTest::new(a, &plan, held.store.clone());
    let cpu_before = crate::cost::process_cpu_s();
    let report = run_local_drained_by(
        &plan,
        &runtime,
        &options,
        stop,
        |_, _| {},
        Some(&mut drained),
    )
    .await
    .context("running queries/ysb.sql")?;
    let cpu_s = crate::cost::process_cpu_s() - cpu_before;
    Ok(RunOutcome {
        measured: crate::cost::measured(&report, cpu_s),
        report,
        dead_letters: DEAD_LETTERS.load(Ordering::Relaxed) - dead_before,
        unknown_ad_views: UNKNOWN_AD_VIEWS.load(Ordering::Relaxed) - unknown_before,
        resumed,
    })
}

/// Tell `ysb check` which run lineage writes the topic's results and with
/// how many sink members: a snapshot of Redis is consistent when every one
/// of them has written the same epoch.
async fn announce_run(a: &YsbRunArgs, plan: &QueryPlan, run: &str) -> Result<()> {
    let members = plan.stages.last().map_or(1, |s| s.members);
    let mut con = redis_connection(&a.common.redis).await?;
    let _: () = redis::pipe()
        .atomic()
        .hset(run_key(&a.common.topic), "run", run)
        .ignore()
        .hset(run_key(&a.common.topic), "members", members)
        .ignore()
        .query_async(&mut con)
        .await
        .context("recording the run in Redis")?;
    Ok(())
}

/// partition -> next offset of `topic` after the last committed epoch
/// (empty before the first commit).
async fn committed_topic_offsets(
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
async fn create_dead_letter_topic(brokers: &str, topic: &str) -> Result<()> {
    ensure_topic(brokers, topic, 1, &[("cleanup.policy", "compact")])
        .await
        .map_err(|e| anyhow::anyhow!("the dead-letter topic: {e}"))
}

/// Empty epochs in a row, with the broker answering and no offset moving,
/// after which `--until-drained` gives up on reaching the high watermarks
/// (a partition that ends in transaction markers never gets there).
const STUCK_EPOCHS: u32 = 50;

/// When an `--until-drained` run has drained: an epoch found nothing new,
/// no producer of this process is still writing, and the offsets committed
/// in the checkpoint directory have reached every partition's high
/// watermark as the broker gives it now. A pull that came back empty
/// because the broker was away therefore never ends the run, and records
/// written during the run are read before it ends.
struct DrainedTest<'a> {
    args: &'a YsbRunArgs,
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
        self.test(outcome).await.map_err(|e| {
            skein_engine::error::EngineError::Context(skein_engine::error::one_line(e.as_ref()))
        })
    }
}

impl<'a> DrainedTest<'a> {
    fn new(args: &'a YsbRunArgs, plan: &'a QueryPlan, store: Arc<CheckpointStore>) -> Self {
        DrainedTest {
            args,
            plan,
            store,
            watermarks: None,
            stuck: (0, BTreeMap::new()),
        }
    }

    async fn test(&mut self, outcome: EpochOutcome) -> Result<bool> {
        let c = &self.args.common;
        let loading = self
            .args
            .load_done
            .as_ref()
            .is_some_and(|done: &Arc<AtomicBool>| !done.load(Ordering::Acquire));
        if outcome.events > 0 || loading {
            self.stuck = (0, BTreeMap::new());
            return Ok(false);
        }
        let w = match &self.watermarks {
            Some(w) => w.clone(),
            None => self
                .watermarks
                .insert(Arc::new(HighWatermarks::new(&c.brokers, &c.topic)?))
                .clone(),
        };
        let Some(marks) = tokio::task::spawn_blocking(move || w.fetch()).await? else {
            // The broker did not answer: nothing can be concluded.
            self.stuck = (0, BTreeMap::new());
            return Ok(false);
        };
        let committed = committed_topic_offsets(self.plan, &self.store, &c.topic).await?;
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
                topic = %c.topic,
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
