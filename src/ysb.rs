//! `skein ysb ...`: the Yahoo Streaming Benchmark, Kafka -> Skein -> Redis.
//!
//! * `setup`: the campaigns and their ads into Redis as YSB's setup writes
//!   them (`SET <ad> <campaign>`, `SADD campaigns <campaign>`),
//!   old results of those campaigns and the run's offsets removed;
//! * `generate`: events into the topic (4 partitions), the ground truth into
//!   `<dir>/truth.csv`; `--malformed-percent` mixes in undecodable records;
//! * `run`: `queries/ysb.sql`, resuming from the offsets stored in Redis,
//!   until the offsets committed there reach the end of the topic (or for
//!   `--duration`, however many epochs come back empty);
//! * `check`: Redis against the ground truth and against counts recomputed
//!   from the topic itself, the dead-letter topic against the topic's
//!   undecodable records, and the latency `time_updated - window end` as
//!   YSB's `updated.txt` reports it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use object_store::memory::InMemory;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skein_connectors::kafka::{DEAD_LETTERS, format_offsets};
use skein_engine::driver::{RunReport, deploy, trigger_epoch};
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, QueryPlan, plan_query, session};
use skein_generators::ysb::{
    ADS_PER_CAMPAIGN, DEFAULT_SEED, NUM_CAMPAIGNS, WINDOW_MS, YsbCampaigns, YsbConfig,
    YsbGenerator, YsbGroundTruth,
};
use skein_sinks::kafka::ensure_topic;
use skein_sinks::redis::{UNKNOWN_AD_VIEWS, offsets_key, stored_offsets};

use crate::registry::{Registries, registries};
use crate::run::parse_duration;

/// The query, with `{{...}}` parts filled in by `ysb run`.
pub const YSB_SQL: &str = include_str!("../queries/ysb.sql");

#[derive(Subcommand, Debug)]
pub enum YsbCommand {
    /// Campaigns and ads into Redis; clears earlier results of those campaigns.
    Setup(YsbArgs),
    /// Publish events to the topic and write the ground truth.
    Generate(GenerateArgs),
    /// Run queries/ysb.sql: Kafka -> Skein -> Redis.
    Run(YsbRunArgs),
    /// Compare Redis with the ground truth and with counts recomputed from the
    /// topic; exits non-zero on any difference.
    Check(CheckArgs),
    /// With `--rate R --duration D`: publish at R events/s while the query
    /// runs, and report the window latency (time_updated - window end).
    /// Without: pre-load `--events N` into a fresh topic, then time a raw
    /// rdkafka drain and Skein's drain.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// Drain bench: events to pre-load [default: 5000000].
    #[arg(long, conflicts_with = "rate")]
    pub events: Option<u64>,
    /// Latency bench: events per second of wall-clock time, published while
    /// the query runs (needs --duration).
    #[arg(long, requires = "duration")]
    pub rate: Option<u64>,
    /// Latency bench: how long the load lasts.
    #[arg(long, value_parser = parse_duration, requires = "rate")]
    pub duration: Option<Duration>,
    /// Latency bench: time between epochs of the query.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub interval: Duration,
    /// Source instances of the Skein run.
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
}

#[derive(Args, Debug, Clone)]
pub struct YsbArgs {
    #[arg(long, default_value = "127.0.0.1:9092", env = "SKEIN_KAFKA")]
    pub brokers: String,
    #[arg(long, default_value = "redis://127.0.0.1:6379", env = "SKEIN_REDIS")]
    pub redis: String,
    #[arg(long, default_value = "ad-events")]
    pub topic: String,
    /// Seed of the campaign and ad UUIDs and of the events.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Where the ground truth and the campaign mapping are kept.
    #[arg(long, default_value = ".skein/ysb")]
    pub dir: PathBuf,
    /// Print one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Print nothing (when `bench` runs the steps).
    #[arg(skip)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Events per second of event time.
    #[arg(long, default_value_t = 100_000)]
    pub rate: u64,
    #[arg(long, default_value_t = 4)]
    pub partitions: i32,
    /// Percent of extra, undecodable records mixed into the topic.
    #[arg(long, default_value_t = 0.0)]
    pub malformed_percent: f64,
}

#[derive(Args, Debug)]
pub struct YsbRunArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// Stop once an epoch finds nothing new and the offsets stored in Redis
    /// have reached the end of every partition (the default).
    #[arg(long, conflicts_with = "duration")]
    pub until_drained: bool,
    /// Run this long, pulling whatever arrives meanwhile (an empty epoch does
    /// not end the run).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Time between epochs.
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub interval: Duration,
    /// Source instances (partitions are spread over them).
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// Records one source instance reads per epoch at most.
    #[arg(long, default_value_t = 250_000)]
    pub max_records: usize,
    /// Where undecodable records go (default: `<topic>-dead-letters`).
    #[arg(long)]
    pub dead_letter_topic: Option<String>,
    /// Set once a producer in the same process (`bench --rate`) has
    /// finished; until then the run does not stop for being drained.
    #[arg(skip)]
    pub load_done: Option<Arc<AtomicBool>>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    /// The dead-letter topic to compare with the topic's undecodable records
    /// (default: `<topic>-dead-letters`, as `ysb run` uses).
    #[arg(long)]
    pub dead_letter_topic: Option<String>,
}

pub async fn ysb(cmd: YsbCommand) -> Result<()> {
    match cmd {
        YsbCommand::Setup(a) => setup(&a).await,
        YsbCommand::Generate(a) => generate(&a).await,
        YsbCommand::Run(a) => run(&a).await,
        YsbCommand::Check(a) => check(&a).await,
        YsbCommand::Bench(a) => bench(a).await,
    }
}

fn checkpoint(topic: &str) -> String {
    format!("ysb:{topic}")
}

/// Where `ysb run` sends undecodable records unless told otherwise.
fn default_dead_letter_topic(topic: &str) -> String {
    format!("{topic}-dead-letters")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

async fn redis_connection(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).with_context(|| format!("Redis URL {url}"))?;
    // The client's default of 500 ms per reply is short on a loaded machine
    // (a debug build reading a large hash, CI running tests side by side).
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .with_context(|| format!("connecting to Redis at {url} (scripts/services.sh start redis)"))
}

fn campaigns(seed: u64) -> YsbCampaigns {
    YsbCampaigns::generate(seed, NUM_CAMPAIGNS, ADS_PER_CAMPAIGN)
}

async fn setup(a: &YsbArgs) -> Result<()> {
    let campaigns = campaigns(a.seed);
    let mut con = redis_connection(&a.redis).await?;
    // Remove earlier results of these campaigns: the window hashes and lists
    // their hashes point to, then the campaign hashes themselves.
    let mut cleared = 0usize;
    for c in campaigns.campaign_ids() {
        let old: HashMap<String, String> = con.hgetall(c).await?;
        let keys: Vec<&String> = old.values().collect();
        if !keys.is_empty() {
            let _: () = con.del(&keys).await?;
            cleared += keys.len();
        }
        let _: () = con.del(c).await?;
    }
    let _: () = con.del(offsets_key(&checkpoint(&a.topic))).await?;
    // YSB's own layout (its setup's `SET <ad> <campaign>`, `SADD campaigns`),
    // which the sink reads, so events of YSB's generator run unchanged. Only
    // added to: ads are UUIDs, so the mappings of several seeds (e.g. tests
    // running side by side) coexist.
    let mut pipe = redis::pipe();
    for (ad, campaign) in campaigns.ad_campaign_pairs() {
        pipe.set(ad, campaign).ignore();
    }
    for c in campaigns.campaign_ids() {
        pipe.sadd("campaigns", c).ignore();
    }
    let _: () = pipe.query_async(&mut con).await?;
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let mapping = a.dir.join("ad-to-campaign-ids.txt");
    campaigns.write_mapping(&mapping)?;
    if a.quiet {
        // `bench` prints one line of its own.
    } else if a.json {
        println!(
            "{}",
            json!({"campaigns": campaigns.campaign_ids().len(), "ads": campaigns.ad_ids().len(), "cleared_keys": cleared})
        );
    } else {
        println!(
            "{} campaigns, {} ads in Redis; mapping in {}; {cleared} old keys removed",
            campaigns.campaign_ids().len(),
            campaigns.ad_ids().len(),
            mapping.display()
        );
    }
    Ok(())
}

/// What `generate` leaves for `check`.
#[derive(Debug, Serialize, Deserialize)]
struct Generated {
    seed: u64,
    topic: String,
    events: u64,
    malformed: u64,
    views: u64,
}

/// Undecodable records of several kinds, for the dead-letter path.
fn malformed_record(n: u64, ad: &str) -> Vec<u8> {
    match n % 5 {
        0 => b"{\"ad_id\": \"".to_vec(),
        1 => format!(
            "{{\"event_type\": \"view\", \"event_time\": \"{}\"}}",
            now_ms()
        )
        .into_bytes(),
        2 => format!(
            "{{\"ad_id\": \"{ad}\", \"event_type\": \"view\", \"event_time\": \"yesterday\"}}"
        )
        .into_bytes(),
        3 => b"this is not JSON".to_vec(),
        _ => format!(
            "{{\"ad_id\": 17, \"event_type\": \"view\", \"event_time\": \"{}\"}}",
            now_ms()
        )
        .into_bytes(),
    }
}

async fn generate(a: &GenerateArgs) -> Result<()> {
    let c = &a.common;
    ensure_topic(&c.brokers, &c.topic, a.partitions, &[])
        .await
        .map_err(anyhow::Error::msg)?;
    let config = YsbConfig {
        seed: c.seed,
        base_time_ms: now_ms(),
        events_per_second: a.rate,
        max_events: Some(a.events),
        ..YsbConfig::default()
    };
    let mut generator = YsbGenerator::new(config)?;
    let mut truth = YsbGroundTruth::new(WINDOW_MS);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &c.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000")
        .create()
        .context("Kafka producer")?;
    let every = if a.malformed_percent > 0.0 {
        Some(((100.0 / a.malformed_percent).round() as u64).max(1))
    } else {
        None
    };
    let started = Instant::now();
    let mut pending = Vec::with_capacity(20_000);
    let mut buf = Vec::with_capacity(256);
    let (mut n, mut malformed, mut sent) = (0u64, 0u64, 0u64);
    let mut records: Vec<Vec<u8>> = Vec::with_capacity(2);
    loop {
        records.clear();
        let Some(event) = generator.next_event() else {
            break;
        };
        truth.record(&event);
        buf.clear();
        event.write_json(&mut buf);
        records.push(buf.clone());
        if every.is_some_and(|k| n % k == k - 1) {
            records.push(malformed_record(malformed, event.ad_id));
            malformed += 1;
        }
        for r in &records {
            let partition = (sent % a.partitions as u64) as i32;
            sent += 1;
            let record: FutureRecord<'_, (), Vec<u8>> =
                FutureRecord::to(&c.topic).partition(partition).payload(r);
            match producer.send_result(record) {
                Ok(f) => pending.push(f),
                Err((e, _)) => bail!("producing to {}: {e}", c.topic),
            }
        }
        n += 1;
        if pending.len() >= 20_000 {
            for f in pending.drain(..) {
                f.await
                    .context("delivery cancelled")?
                    .map_err(|(e, _)| anyhow::anyhow!("delivery to {} failed: {e}", c.topic))?;
            }
        }
    }
    for f in pending.drain(..) {
        f.await
            .context("delivery cancelled")?
            .map_err(|(e, _)| anyhow::anyhow!("delivery to {} failed: {e}", c.topic))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&c.dir)?;
    truth.write_csv(&c.dir.join("truth.csv"), &campaigns(c.seed))?;
    let generated = Generated {
        seed: c.seed,
        topic: c.topic.clone(),
        events: n,
        malformed,
        views: truth.total_views(),
    };
    std::fs::write(
        c.dir.join("generated.json"),
        serde_json::to_vec(&generated)?,
    )?;
    if c.quiet {
        // `bench` prints one line of its own.
    } else if c.json {
        println!(
            "{}",
            json!({"events": n, "malformed": malformed, "views": generated.views, "elapsed_s": elapsed, "events_per_s": (n as f64 / elapsed).round()})
        );
    } else {
        println!(
            "{n} events ({} views) and {malformed} malformed records to {} in {elapsed:.2} s; truth in {}",
            generated.views,
            c.topic,
            c.dir.join("truth.csv").display()
        );
    }
    Ok(())
}

/// queries/ysb.sql with its placeholders filled.
pub fn ysb_sql(a: &YsbRunArgs, offsets: &BTreeMap<i32, i64>) -> String {
    let c = &a.common;
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&c.topic));
    YSB_SQL
        .replace("{{topic}}", &c.topic)
        .replace("{{brokers}}", &c.brokers)
        .replace("{{parallelism}}", &a.parallelism.to_string())
        .replace("{{offsets}}", &format_offsets(offsets))
        .replace("{{max_records}}", &a.max_records.to_string())
        .replace("{{dead_letter_topic}}", &dlt)
        .replace("{{redis}}", &c.redis)
        .replace("{{checkpoint}}", &checkpoint(&c.topic))
}

async fn run(a: &YsbRunArgs) -> Result<()> {
    let RunOutcome {
        report,
        dead_letters: dead,
        unknown_ad_views,
        resumed,
    } = run_query(a).await?;
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
    }
    Ok(())
}

/// What one `ysb run` did.
struct RunOutcome {
    report: RunReport,
    /// Undecodable records sent to the dead-letter topic.
    dead_letters: u64,
    /// Views of ads without a campaign (sent to the dead-letter topic).
    unknown_ad_views: u64,
    /// Records already done when the run started.
    resumed: i64,
}

/// Run the query until drained (or `--duration`).
async fn run_query(a: &YsbRunArgs) -> Result<RunOutcome> {
    let c = &a.common;
    let offsets = stored_offsets(&c.redis, &checkpoint(&c.topic), &c.topic)
        .await
        .with_context(|| {
            format!(
                "reading stored offsets from {} (scripts/services.sh start redis)",
                c.redis
            )
        })?;
    let resumed: i64 = offsets.values().sum();
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&c.topic));
    create_dead_letter_topic(&c.brokers, &dlt).await?;
    let sql = ysb_sql(a, &offsets);
    let Registries { sources, sinks, .. } = registries();
    let options = PlanOptions {
        // One sink writer: its MULTI/EXEC covers every partition's offsets.
        group_size: 1,
        ..PlanOptions::default()
    };
    let ctx = session(&sources, options.group_size);
    let plan = plan_query(&ctx, &sql, &options)
        .await
        .context("planning queries/ysb.sql")?;
    let runtime = LocalRuntime::new(sources, sinks, Arc::new(InMemory::new()));
    let dead_before = DEAD_LETTERS.load(Ordering::Relaxed);
    let unknown_before = UNKNOWN_AD_VIEWS.load(Ordering::Relaxed);
    let report = drive(&plan, &runtime, &options, a)
        .await
        .context("running queries/ysb.sql")?;
    Ok(RunOutcome {
        report,
        dead_letters: DEAD_LETTERS.load(Ordering::Relaxed) - dead_before,
        unknown_ad_views: UNKNOWN_AD_VIEWS.load(Ordering::Relaxed) - unknown_before,
        resumed,
    })
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

/// The epoch loop of `ysb run`. Unlike the engine's generic driver, an empty
/// epoch is not the end: with `--duration` the run keeps pulling until the
/// time is up (a producer may still be writing), and `--until-drained` stops
/// only once the offsets committed to Redis have reached every partition's
/// high watermark, so a pull that came back empty because the broker was
/// away does not end the run early.
async fn drive(
    plan: &QueryPlan,
    runtime: &Arc<LocalRuntime>,
    options: &PlanOptions,
    a: &YsbRunArgs,
) -> Result<RunReport> {
    let c = &a.common;
    let store = runtime.store();
    let names = deploy(plan, runtime.as_ref(), &store, options, None).await?;
    let stats = runtime.stats();
    let before_inv = stats.invocations.load(Ordering::Relaxed);
    let before_bytes = stats.payload_bytes.load(Ordering::Relaxed);
    let started = Instant::now();
    let deadline = a.duration.map(|d| started + d);
    let mut watermarks: Option<Arc<HighWatermarks>> = None;
    let (mut events, mut epoch) = (0u64, 0u64);
    let mut stuck: (u32, BTreeMap<i32, i64>) = (0, BTreeMap::new());
    let mut redis_away: Option<Instant> = None;
    loop {
        let last = deadline.is_some_and(|d| Instant::now() >= d);
        let fired = Instant::now();
        let pulled = trigger_epoch(plan, runtime.as_ref(), epoch, last).await?;
        runtime.wait_idle().await;
        events += pulled;
        epoch += 1;
        if last {
            break;
        }
        let loading = a
            .load_done
            .as_ref()
            .is_some_and(|done| !done.load(Ordering::Acquire));
        if deadline.is_none() && pulled == 0 && !loading {
            if watermarks.is_none() {
                watermarks = Some(Arc::new(HighWatermarks::new(&c.brokers, &c.topic)?));
            }
            let w = watermarks.clone().expect("set above");
            let state = drained(w, c).await?;
            if !matches!(state, Drained::RedisAway(_)) {
                redis_away = None;
            }
            match state {
                Drained::Yes => {
                    // One more (empty) epoch flushes whatever state is left.
                    trigger_epoch(plan, runtime.as_ref(), epoch, true).await?;
                    runtime.wait_idle().await;
                    epoch += 1;
                    break;
                }
                Drained::BrokerAway => stuck = (0, BTreeMap::new()),
                Drained::RedisAway(e) => {
                    // Waited out as the sink waits for Redis, then given up.
                    let since = *redis_away.get_or_insert_with(Instant::now);
                    if since.elapsed() >= skein_sinks::redis::REDIS_WAIT {
                        bail!(
                            "Redis at {} did not answer for {:?}: {e}",
                            c.redis,
                            skein_sinks::redis::REDIS_WAIT
                        );
                    }
                    stuck = (0, BTreeMap::new());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Drained::Behind(stored) => {
                    if stored == stuck.1 {
                        stuck.0 += 1;
                    } else {
                        stuck = (1, stored);
                    }
                    if stuck.0 >= STUCK_EPOCHS {
                        tracing::warn!(
                            topic = %c.topic,
                            stored = ?stuck.1,
                            "{STUCK_EPOCHS} empty epochs without progress below the high watermarks; stopping"
                        );
                        trigger_epoch(plan, runtime.as_ref(), epoch, true).await?;
                        runtime.wait_idle().await;
                        epoch += 1;
                        break;
                    }
                }
            }
        } else {
            stuck = (0, BTreeMap::new());
        }
        tokio::time::sleep(a.interval.saturating_sub(fired.elapsed())).await;
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let pending = runtime.pending().await;
    if !pending.is_empty() {
        bail!("functions left waiting for input: {}", pending.join("; "));
    }
    let failed = runtime.dead_letters();
    if let Some(first) = failed.first() {
        bail!(
            "{} async invocations failed; first, of {}: {}",
            failed.len(),
            first.function,
            first.error
        );
    }
    Ok(RunReport {
        query_code: plan.query_code.clone(),
        stages: plan.stages.len(),
        functions: names.len(),
        epochs: epoch,
        invocations: stats.invocations.load(Ordering::Relaxed) - before_inv,
        payload_bytes: stats.payload_bytes.load(Ordering::Relaxed) - before_bytes,
        events,
        elapsed_s,
        events_per_s: if elapsed_s > 0.0 {
            events as f64 / elapsed_s
        } else {
            0.0
        },
        result_rows: 0,
        verified: None,
        late_rows: runtime.late_rows().values().sum(),
        late_rows_by_table: runtime.late_rows(),
        resumed_after: None,
    })
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

enum Drained {
    Yes,
    /// The broker did not answer: nothing can be concluded.
    BrokerAway,
    /// Redis did not answer (the error): nothing can be concluded either.
    RedisAway(String),
    /// Some stored offset is below its high watermark: these are the stored ones.
    Behind(BTreeMap<i32, i64>),
}

/// Have the offsets committed to Redis reached every partition's end?
async fn drained(w: Arc<HighWatermarks>, c: &YsbArgs) -> Result<Drained> {
    let stored = match stored_offsets(&c.redis, &checkpoint(&c.topic), &c.topic).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(redis = %c.redis, "stored offsets unknown: {e}");
            return Ok(Drained::RedisAway(e.to_string()));
        }
    };
    let Some(marks) = tokio::task::spawn_blocking(move || w.fetch()).await? else {
        return Ok(Drained::BrokerAway);
    };
    let done = marks
        .iter()
        .all(|(p, (low, high))| stored.get(p).copied().unwrap_or(*low) >= *high);
    Ok(if done {
        Drained::Yes
    } else {
        Drained::Behind(stored)
    })
}

/// The result of comparing Redis with the ground truth and with the topic.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// Redis matches the ground truth and the topic, and every undecodable
    /// record of the topic is in the dead-letter topic.
    pub exact: bool,
    /// Redis matches the ground truth file of `ysb generate`; `null` without
    /// one (a live topic), when only the topic's recount is compared.
    pub truth_exact: Option<bool>,
    /// Redis matches the counts recomputed from the topic.
    pub topic_exact: bool,
    /// Every undecodable record has a dead letter (with a reason), and no
    /// dead letter names a record that decodes.
    pub dead_letters_exact: bool,
    /// Windows and views counted in Redis.
    pub windows: usize,
    pub views: u64,
    /// Views in the ground truth, if there is one.
    pub expected_views: Option<u64>,
    /// Windows of the ground truth that Redis lacks, has but does not
    /// expect, or counts differently.
    pub missing: usize,
    pub extra: usize,
    pub wrong: usize,
    /// Records the counts in Redis cover (the committed offsets); the topic
    /// is recounted up to there.
    pub committed_records: i64,
    /// Records read back from the topic, the undecodable ones among them.
    pub topic_records: u64,
    pub topic_malformed: u64,
    /// Windows and views recomputed from the topic.
    pub topic_windows: usize,
    pub topic_views: u64,
    /// Views in the topic whose ad has no campaign.
    pub topic_unknown_ad_views: u64,
    /// Windows of the topic's counts that Redis lacks, has but the topic does
    /// not give, or counts differently.
    pub topic_missing: usize,
    pub topic_extra: usize,
    pub topic_wrong: usize,
    pub topic_read_s: f64,
    pub dead_letter_topic: String,
    /// Distinct records of this topic found in the dead-letter topic.
    pub dead_letters: u64,
    /// Letters beyond the first for a record (a crash replay sends again).
    pub dead_letter_duplicates: u64,
    /// Undecodable records without a letter; letters for records that decode.
    pub dead_letters_missing: usize,
    pub dead_letters_extra: usize,
    pub dead_letters_without_reason: u64,
    /// Views of ads without a campaign that the sink sent as dead letters;
    /// `topic_exact` needs them to equal `topic_unknown_ad_views`.
    pub dead_letter_unknown_ad_views: u64,
    pub latency_ms_p50: i64,
    pub latency_ms_p90: i64,
    pub latency_ms_p99: i64,
    pub latency_ms_max: i64,
}

type Counts = BTreeMap<(String, i64), u64>;

fn read_truth(dir: &Path) -> Result<Counts> {
    let path = dir.join("truth.csv");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (run `skein ysb generate` first)",
            path.display()
        )
    })?;
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let mut f = line.split(',');
        let (Some(c), Some(w), Some(v)) = (f.next(), f.next(), f.next()) else {
            bail!("{}: bad line {line:?}", path.display());
        };
        out.insert((c.to_string(), w.parse()?), v.parse()?);
    }
    Ok(out)
}

/// (missing, extra, wrong) windows of `found` against `expected`.
fn compare(
    expected: &Counts,
    found: &BTreeMap<(String, i64), (u64, i64)>,
) -> (usize, usize, usize) {
    let missing = expected.keys().filter(|k| !found.contains_key(*k)).count();
    let extra = found.keys().filter(|k| !expected.contains_key(*k)).count();
    let wrong = expected
        .iter()
        .filter(|(k, v)| found.get(*k).is_some_and(|(n, _)| n != *v))
        .count();
    (missing, extra, wrong)
}

/// What Redis holds, read in one script so that it is one consistent
/// snapshot while a run is still writing: the committed offsets of `topic`
/// and, for the campaigns of `seed`, (campaign, window start) ->
/// (seen_count, time_updated).
struct RedisSnapshot {
    offsets: BTreeMap<i32, i64>,
    windows: BTreeMap<(String, i64), (u64, i64)>,
}

/// Returns `{offsets hash}` then, per campaign, `{window start, seen_count,
/// time_updated}` triples.
const SNAPSHOT_SCRIPT: &str = r"
local out = {redis.call('HGETALL', KEYS[1])}
for _, c in ipairs(ARGV) do
  local h = redis.call('HGETALL', c)
  local rows = {}
  for j = 1, #h, 2 do
    if h[j] ~= 'windows' then
      local v = redis.call('HMGET', h[j + 1], 'seen_count', 'time_updated')
      table.insert(rows, {h[j], v[1] or '0', v[2] or '0'})
    end
  end
  table.insert(out, rows)
end
return out";

async fn read_redis(redis: &str, topic: &str, seed: u64) -> Result<RedisSnapshot> {
    let mut con = redis_connection(redis).await?;
    let campaigns = campaigns(seed);
    let mut all: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(SNAPSHOT_SCRIPT)
        .arg(1)
        .arg(offsets_key(&checkpoint(topic)))
        .arg(campaigns.campaign_ids())
        .query_async(&mut con)
        .await
        .context("reading the results from Redis")?;
    // The first element is the offsets hash, one per campaign follows.
    let rest = all.split_off(1);
    let stored: Vec<String> = redis::from_redis_value(all.pop().unwrap_or(redis::Value::Nil))?;
    let offsets = stored
        .chunks(2)
        .filter_map(|f| {
            let (t, p) = f.first()?.rsplit_once(':')?;
            (t == topic).then(|| Some((p.parse().ok()?, f.get(1)?.parse().ok()?)))?
        })
        .collect();
    let mut windows = BTreeMap::new();
    for (campaign, rows) in campaigns.campaign_ids().iter().zip(rest) {
        let rows: Vec<(String, i64, i64)> = redis::from_redis_value(rows)?;
        for (field, seen, updated) in rows {
            let window: i64 = field
                .parse()
                .with_context(|| format!("campaign {campaign}: field {field:?}"))?;
            windows.insert((campaign.clone(), window), (seen.max(0) as u64, updated));
        }
    }
    Ok(RedisSnapshot { offsets, windows })
}

pub async fn check_report(a: &YsbArgs) -> Result<CheckReport> {
    Ok(check_windows(a, &default_dead_letter_topic(&a.topic))
        .await?
        .0)
}

/// The ground truth of `generate`, if the one in `a.dir` is of this topic
/// and seed (a live topic has none).
fn truth_of(a: &YsbArgs) -> Result<Option<Counts>> {
    let Ok(text) = std::fs::read(a.dir.join("generated.json")) else {
        return Ok(None);
    };
    let generated: Generated = serde_json::from_slice(&text)
        .with_context(|| format!("reading {}", a.dir.join("generated.json").display()))?;
    if generated.topic != a.topic || generated.seed != a.seed {
        return Ok(None);
    }
    read_truth(&a.dir).map(Some)
}

/// The check, and the windows read from Redis: (campaign, window start) ->
/// (seen_count, time_updated).
async fn check_windows(
    a: &YsbArgs,
    dead_letter_topic: &str,
) -> Result<(CheckReport, BTreeMap<(String, i64), (u64, i64)>)> {
    let truth = truth_of(a)?;
    // Redis first: the topic is recounted up to the offsets committed with
    // these counts, so a run (or a producer) may still be going.
    let RedisSnapshot {
        offsets,
        windows: found,
    } = read_redis(&a.redis, &a.topic, a.seed).await?;
    let (brokers, topic, seed) = (a.brokers.clone(), a.topic.clone(), a.seed);
    let until = offsets.clone();
    let recount =
        tokio::task::spawn_blocking(move || recount_topic(&brokers, &topic, seed, &until));
    let (brokers, topic, dlt) = (
        a.brokers.clone(),
        a.topic.clone(),
        dead_letter_topic.to_string(),
    );
    let letters = tokio::task::spawn_blocking(move || read_dead_letters(&brokers, &dlt, &topic));
    let recount = recount.await.context("recount task")??;
    let mut letters = letters.await.context("dead-letter task")??;
    // Letters are sent before their offsets are committed: those beyond the
    // committed offsets belong to a write still to come (or to be replayed).
    let committed = |p: i32, o: i64| offsets.get(&p).is_some_and(|c| o < *c);
    letters.keys.retain(|(p, o)| committed(*p, *o));
    let field = |f: &str| -> Option<i32> {
        let (t, p) = f.rsplit_once(':')?;
        (t == a.topic).then(|| p.parse().ok())?
    };
    let unknown_ad_letter_views: u64 = letters
        .unknown_ads
        .values()
        .filter(|(_, to)| {
            to.iter()
                .all(|(f, o)| field(f).is_some_and(|p| committed(p, *o - 1)))
        })
        .map(|(n, _)| n)
        .sum();

    let (missing, extra, wrong) = match &truth {
        Some(t) => compare(t, &found),
        None => (0, 0, 0),
    };
    let truth_exact = truth
        .as_ref()
        .map(|_| missing == 0 && extra == 0 && wrong == 0);
    let (topic_missing, topic_extra, topic_wrong) = compare(&recount.counts, &found);
    let topic_exact = topic_missing == 0
        && topic_extra == 0
        && topic_wrong == 0
        && recount.unknown_ad_views == unknown_ad_letter_views;
    let dead_letters_missing = recount.malformed.difference(&letters.keys).count();
    let dead_letters_extra = letters.keys.difference(&recount.malformed).count();
    let dead_letters_exact =
        dead_letters_missing == 0 && dead_letters_extra == 0 && letters.without_reason == 0;

    let latency = latencies(&found, None);
    let report = CheckReport {
        exact: truth_exact.unwrap_or(true) && topic_exact && dead_letters_exact,
        truth_exact,
        topic_exact,
        dead_letters_exact,
        windows: found.len(),
        views: found.values().map(|(n, _)| n).sum(),
        expected_views: truth.as_ref().map(|t| t.values().sum()),
        missing,
        extra,
        wrong,
        committed_records: offsets.values().sum(),
        topic_records: recount.records,
        topic_malformed: recount.malformed.len() as u64,
        topic_windows: recount.counts.len(),
        topic_views: recount.counts.values().sum(),
        topic_unknown_ad_views: recount.unknown_ad_views,
        topic_missing,
        topic_extra,
        topic_wrong,
        topic_read_s: recount.elapsed_s,
        dead_letter_topic: dead_letter_topic.to_string(),
        dead_letters: letters.keys.len() as u64,
        dead_letter_duplicates: letters.records.saturating_sub(letters.keys.len() as u64),
        dead_letters_missing,
        dead_letters_extra,
        dead_letters_without_reason: letters.without_reason,
        dead_letter_unknown_ad_views: unknown_ad_letter_views,
        latency_ms_p50: latency.p50,
        latency_ms_p90: latency.p90,
        latency_ms_p99: latency.p99,
        latency_ms_max: latency.max,
    };
    Ok((report, found))
}

/// The distribution of `time_updated - window end` (YSB's `updated.txt`),
/// over the windows that ended by `until_ms` if given.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Latency {
    pub windows: usize,
    pub p50: i64,
    pub p90: i64,
    pub p99: i64,
    pub max: i64,
}

fn latencies(found: &BTreeMap<(String, i64), (u64, i64)>, until_ms: Option<i64>) -> Latency {
    let mut l: Vec<i64> = found
        .iter()
        .filter(|((_, w), _)| until_ms.is_none_or(|u| w + WINDOW_MS <= u))
        .map(|((_, w), (_, updated))| updated - (w + WINDOW_MS))
        .collect();
    l.sort_unstable();
    let pct = |p: f64| -> i64 {
        if l.is_empty() {
            return 0;
        }
        l[((l.len() as f64 - 1.0) * p).round() as usize]
    };
    Latency {
        windows: l.len(),
        p50: pct(0.5),
        p90: pct(0.9),
        p99: pct(0.99),
        max: l.last().copied().unwrap_or(0),
    }
}

async fn check(a: &CheckArgs) -> Result<()> {
    let dlt = a
        .dead_letter_topic
        .clone()
        .unwrap_or_else(|| default_dead_letter_topic(&a.common.topic));
    let r = check_windows(&a.common, &dlt).await?.0;
    if a.common.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let truth = match (r.truth_exact, r.expected_views) {
            (Some(_), Some(expected)) => format!(
                "ground truth: {expected} views expected; {} missing, {} extra, {} wrong windows",
                r.missing, r.extra, r.wrong
            ),
            _ => "no ground truth for this topic and seed: checked against the topic".into(),
        };
        println!(
            "{}\n\
             Redis: {} windows, {} views, covering {} records\n\
             {truth}\n\
             topic: {} records ({} undecodable, {} views of ads without a campaign) read in {:.2} s \
             give {} windows, {} views; {} missing, {} extra, {} wrong\n\
             dead letters in {}: {} records ({} duplicates); {} missing, {} extra, {} without a reason; \
             {} views of ads without a campaign\n\
             latency (time_updated - window end): p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
            if r.exact { "EXACT" } else { "DIFFERENT" },
            r.windows,
            r.views,
            r.committed_records,
            r.topic_records,
            r.topic_malformed,
            r.topic_unknown_ad_views,
            r.topic_read_s,
            r.topic_windows,
            r.topic_views,
            r.topic_missing,
            r.topic_extra,
            r.topic_wrong,
            r.dead_letter_topic,
            r.dead_letters,
            r.dead_letter_duplicates,
            r.dead_letters_missing,
            r.dead_letters_extra,
            r.dead_letters_without_reason,
            r.dead_letter_unknown_ad_views,
            r.latency_ms_p50,
            r.latency_ms_p90,
            r.latency_ms_p99,
            r.latency_ms_max
        );
    }
    let mut differences = vec![];
    if r.truth_exact == Some(false) {
        differences.push("the ground truth");
    }
    if !r.topic_exact {
        differences.push("the counts recomputed from the topic");
    }
    if !r.dead_letters_exact {
        differences.push("the dead letters the topic calls for");
    }
    if !differences.is_empty() {
        bail!("Redis differs from {}", differences.join(" and "));
    }
    Ok(())
}

/// The topic read back and counted again, with a decoder of its own (serde,
/// only the three fields the query uses), so that a fault of the engine's
/// decoder shows up as a difference rather than being repeated.
struct TopicCount {
    records: u64,
    /// (campaign, window start) -> views.
    counts: Counts,
    /// (partition, offset) of every record that does not decode.
    malformed: BTreeSet<(i32, i64)>,
    unknown_ad_views: u64,
    elapsed_s: f64,
}

/// The fields of one event the query reads; serde skips the others.
#[derive(Deserialize)]
struct EventFields<'a> {
    #[serde(borrow)]
    ad_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    event_type: std::borrow::Cow<'a, str>,
    event_time: EventTime,
}

/// Milliseconds since the epoch, as a JSON integer or a string holding one
/// (YSB writes strings); what the query's `TIMESTAMP` column accepts.
struct EventTime(i64);

impl<'de> Deserialize<'de> for EventTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = EventTime;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("milliseconds as an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<EventTime, E> {
                Ok(EventTime(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<EventTime, E> {
                i64::try_from(v)
                    .map(EventTime)
                    .map_err(|_| E::custom("out of range"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<EventTime, E> {
                v.trim()
                    .parse()
                    .map(EventTime)
                    .map_err(|_| E::custom("not an integer"))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The largest record the query decodes (the Kafka source's default
/// `max.record.bytes`).
const MAX_RECORD_BYTES: usize = 1 << 20;

/// Counts of one group of partitions.
#[derive(Default)]
struct PartialCount {
    records: u64,
    counts: HashMap<(usize, i64), u64>,
    malformed: Vec<(i32, i64)>,
    unknown_ad_views: u64,
}

impl PartialCount {
    fn add(&mut self, campaigns: &YsbCampaigns, partition: i32, offset: i64, payload: &[u8]) {
        self.records += 1;
        let event = (payload.len() <= MAX_RECORD_BYTES)
            .then(|| serde_json::from_slice::<EventFields<'_>>(payload).ok())
            .flatten()
            // The column is TIMESTAMP (nanoseconds): it must fit.
            .filter(|e| e.event_time.0.checked_mul(1_000_000).is_some());
        let Some(event) = event else {
            self.malformed.push((partition, offset));
            return;
        };
        if event.event_type != "view" {
            return;
        }
        match campaigns.campaign_index_of_ad(&event.ad_id) {
            Some(c) => {
                let window = event.event_time.0.div_euclid(WINDOW_MS) * WINDOW_MS;
                *self.counts.entry((c, window)).or_insert(0) += 1;
            }
            None => self.unknown_ad_views += 1,
        }
    }
}

/// Consumer settings of the read-back: no group offsets, large fetches.
fn read_back_consumer(brokers: &str, purpose: &str) -> Result<rdkafka::consumer::BaseConsumer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("skein-ysb-{purpose}-{}", now_ms()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    for (key, value) in skein_connectors::kafka::FETCH_DEFAULTS {
        config.set(*key, *value);
    }
    config
        .create()
        .with_context(|| format!("Kafka consumer for {purpose} at {brokers}"))
}

/// (partition, low, high) of every partition of `topic`; empty if the topic
/// does not exist.
fn partition_ranges(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
) -> Result<Vec<(i32, i64, i64)>> {
    use rdkafka::consumer::Consumer;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("metadata of {topic} (scripts/services.sh start kafka)"))?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(vec![]);
    };
    if t.error().is_some() {
        // UnknownTopicOrPartition: nothing there.
        return Ok(vec![]);
    }
    let mut out = vec![];
    for p in t.partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{}", p.id()))?;
        out.push((p.id(), low, high));
    }
    out.sort_unstable();
    Ok(out)
}

/// Reads `ranges` of `topic` (each partition from low up to high), handing
/// every record to `each`. Fails if nothing arrives for a minute.
fn read_ranges(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    ranges: &[(i32, i64, i64)],
    mut each: impl FnMut(i32, i64, &[u8]),
) -> Result<()> {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Message, Offset, TopicPartitionList};
    let mut next: HashMap<i32, (i64, i64)> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for &(p, low, high) in ranges {
        if low < high {
            next.insert(p, (low, high));
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    if next.is_empty() {
        return Ok(());
    }
    consumer.assign(&tpl)?;
    let mut last_progress = Instant::now();
    while !next.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => tracing::warn!(topic, "reading back: {e}"),
            Some(Ok(m)) => {
                let (p, off) = (m.partition(), m.offset());
                if let Some((pos, high)) = next.get_mut(&p) {
                    if off >= *pos && off < *high {
                        each(p, off, m.payload().unwrap_or_default());
                        *pos = off + 1;
                        last_progress = Instant::now();
                    }
                    if *pos >= *high {
                        next.remove(&p);
                    }
                }
            }
        }
        if last_progress.elapsed() > Duration::from_secs(60) {
            bail!("reading {topic} back: no record for 60 s, still to read {next:?}");
        }
    }
    Ok(())
}

/// Recount the views per (campaign, window) from the topic, each partition
/// up to the offset committed to Redis with the counts (`until`; a live
/// topic goes on beyond it), one thread per group of partitions.
fn recount_topic(
    brokers: &str,
    topic: &str,
    seed: u64,
    until: &BTreeMap<i32, i64>,
) -> Result<TopicCount> {
    let started = Instant::now();
    let campaigns = campaigns(seed);
    let ranges = partition_ranges(&read_back_consumer(brokers, "recount")?, topic)?;
    if ranges.is_empty() {
        bail!("topic {topic} not found at {brokers} (run `skein ysb generate` first)");
    }
    let ranges: Vec<(i32, i64, i64)> = ranges
        .into_iter()
        .map(|(p, low, high)| {
            (
                p,
                low,
                high.min(until.get(&p).copied().unwrap_or(low)).max(low),
            )
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, ranges.len());
    let groups: Vec<Vec<(i32, i64, i64)>> = (0..threads)
        .map(|t| {
            ranges
                .iter()
                .enumerate()
                .filter(|(i, _)| i % threads == t)
                .map(|(_, r)| *r)
                .collect()
        })
        .collect();
    let partials: Vec<Result<PartialCount>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|group| {
                let campaigns = &campaigns;
                s.spawn(move || -> Result<PartialCount> {
                    let consumer = read_back_consumer(brokers, "recount")?;
                    let mut partial = PartialCount::default();
                    read_ranges(&consumer, topic, group, |p, off, payload| {
                        partial.add(campaigns, p, off, payload)
                    })?;
                    Ok(partial)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("recount thread panicked")))
            })
            .collect()
    });
    let mut out = TopicCount {
        records: 0,
        counts: BTreeMap::new(),
        malformed: BTreeSet::new(),
        unknown_ad_views: 0,
        elapsed_s: 0.0,
    };
    for partial in partials {
        let partial = partial?;
        out.records += partial.records;
        out.unknown_ad_views += partial.unknown_ad_views;
        out.malformed.extend(partial.malformed);
        for ((c, window), n) in partial.counts {
            *out.counts
                .entry((campaigns.campaign_ids()[c].clone(), window))
                .or_insert(0) += n;
        }
    }
    out.elapsed_s = started.elapsed().as_secs_f64();
    Ok(out)
}

/// The letters of one source topic found in a dead-letter topic.
struct DeadLetterSummary {
    /// Letters of undecodable records, duplicates included.
    records: u64,
    /// Distinct (partition, offset) they name.
    keys: BTreeSet<(i32, i64)>,
    without_reason: u64,
    /// The sink's letters for views of ads without a campaign, the last one
    /// per key (as compaction keeps): key -> (views, offsets after the write).
    unknown_ads: BTreeMap<String, (u64, BTreeMap<String, i64>)>,
}

/// One dead letter: an undecodable record as the Kafka source writes it
/// (partition, offset), or the Redis sink's letter for the views of an ad
/// without a campaign (key, seen_count, offsets_to).
#[derive(Deserialize)]
struct Letter<'a> {
    #[serde(borrow)]
    topic: std::borrow::Cow<'a, str>,
    partition: Option<i32>,
    offset: Option<i64>,
    #[serde(borrow, default)]
    reason: std::borrow::Cow<'a, str>,
    key: Option<String>,
    seen_count: Option<u64>,
    #[serde(default)]
    offsets_to: BTreeMap<String, i64>,
}

/// Reads the whole dead-letter topic (none there: no letters).
fn read_dead_letters(brokers: &str, dlt: &str, topic: &str) -> Result<DeadLetterSummary> {
    let consumer = read_back_consumer(brokers, "dead-letters")?;
    let ranges = partition_ranges(&consumer, dlt)?;
    let mut out = DeadLetterSummary {
        records: 0,
        keys: BTreeSet::new(),
        without_reason: 0,
        unknown_ads: BTreeMap::new(),
    };
    let mut unreadable = 0u64;
    read_ranges(
        &consumer,
        dlt,
        &ranges,
        |_, _, payload| match serde_json::from_slice::<Letter<'_>>(payload) {
            Ok(l) if l.topic == topic => {
                if l.reason.trim().is_empty() {
                    out.without_reason += 1;
                }
                match (l.partition, l.offset, l.key, l.seen_count) {
                    (Some(p), Some(o), _, _) => {
                        out.records += 1;
                        out.keys.insert((p, o));
                    }
                    (_, _, Some(key), Some(n)) => {
                        out.unknown_ads.insert(key, (n, l.offsets_to));
                    }
                    _ => unreadable += 1,
                }
            }
            Ok(_) => {}
            Err(_) => unreadable += 1,
        },
    )?;
    if unreadable > 0 {
        tracing::warn!(
            dlt,
            unreadable,
            "records of the dead-letter topic that are not letters"
        );
    }
    Ok(out)
}

/// Read every record of `topic` with a plain rdkafka consumer, no parsing:
/// the ceiling a Kafka reader on this machine can reach. Returns (records, s).
fn raw_drain(brokers: &str, topic: &str) -> Result<(u64, f64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("skein-raw-drain-{}", now_ms()))
        .set("enable.auto.commit", "false");
    // The same fetch settings as the Kafka source, for a fair comparison.
    for (key, value) in skein_connectors::kafka::FETCH_DEFAULTS {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config.create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut tpl = TopicPartitionList::new();
    let mut total = 0i64;
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        total += high - low;
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    // librdkafka's batch API, as the Kafka source reads: a `poll` per record
    // caps one thread near 0.55 M records/s here (docs/benchmarks.md).
    let consumer = skein_connectors::kafka::BatchConsumer::new(consumer);
    let started = Instant::now();
    let mut n = 0i64;
    let mut bytes = 0usize;
    let mut error = None;
    while n < total {
        if started.elapsed() > Duration::from_secs(600) {
            bail!("raw drain: {n} of {total} records after 10 minutes");
        }
        consumer.read(
            Duration::from_millis(100),
            usize::MAX,
            |fetched| match fetched {
                skein_connectors::kafka::Fetched::Record { payload, .. } => {
                    bytes += payload.len();
                    n += 1;
                }
                skein_connectors::kafka::Fetched::Error(e) => error = Some(e),
            },
        );
        if let Some(e) = error.take() {
            bail!("raw drain: {e}");
        }
    }
    tracing::debug!(bytes, "raw drain done");
    Ok((n as u64, started.elapsed().as_secs_f64()))
}

async fn bench(a: BenchArgs) -> Result<()> {
    match (a.rate, a.duration) {
        (Some(rate), Some(duration)) => latency_bench(&a, rate, duration).await,
        _ => drain_bench(&a, a.events.unwrap_or(5_000_000)).await,
    }
}

/// What `ysb bench --rate R --duration D` reports.
#[derive(Debug, Serialize)]
pub struct LatencyBench {
    pub target_rate: u64,
    pub duration_s: f64,
    /// Published and acknowledged, and the rate that makes.
    pub events: u64,
    pub achieved_events_per_s: f64,
    /// Events behind the target when the load stopped.
    pub lag_events: u64,
    /// Records the query read.
    pub events_read: u64,
    /// Windows that ended before the load stopped: the ones measured.
    pub windows: usize,
    pub latency_ms_p50: i64,
    pub latency_ms_p90: i64,
    pub latency_ms_p99: i64,
    pub latency_ms_max: i64,
    /// Redis matches the topic recounted, and the query read every record.
    pub exact: bool,
    /// How long the query took to finish once the load stopped.
    pub drain_after_load_s: f64,
    pub epochs: u64,
    pub load_avg_1m: Option<f64>,
    pub topic: String,
}

/// The 1-minute load average, for the record of how busy the machine was.
fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A bench's arguments on a fresh topic unless one is named (so it reads
/// exactly the events of this run), and the same, quiet, for the steps.
fn bench_topic(a: &BenchArgs) -> (YsbArgs, YsbArgs) {
    let mut common = a.common.clone();
    if common.topic == "ad-events" {
        common.topic = format!("ad-events-bench-{}", now_ms());
    }
    let quiet = YsbArgs {
        quiet: true,
        ..common.clone()
    };
    (common, quiet)
}

/// YSB as YSB measures it: a load at a fixed rate, the query running beside
/// it, and the latency of every window from Redis afterwards.
async fn latency_bench(a: &BenchArgs, rate: u64, duration: Duration) -> Result<()> {
    let (common, quiet) = bench_topic(a);
    setup(&quiet).await?;
    ensure_topic(&common.brokers, &common.topic, 4, &[])
        .await
        .map_err(anyhow::Error::msg)?;
    let done = Arc::new(AtomicBool::new(false));
    let gen_args = crate::publish::GenArgs {
        benchmark: crate::publish::Benchmark::Ysb,
        to: format!("kafka://{}/{}", common.brokers, common.topic),
        events: None,
        rate: Some(rate),
        event_rate: None,
        duration: Some(duration),
        table: crate::publish::NexmarkTable::All,
        seed: common.seed,
        partitions: 4,
        in_flight: 4,
        json: common.json,
    };
    let load_done = done.clone();
    // The publisher of `skein gen ysb`, beside the query in this process.
    let load = tokio::spawn(async move {
        let report = crate::publish::publish(&gen_args).await;
        let stopped_ms = now_ms();
        load_done.store(true, Ordering::Release);
        report.map(|r| (r, stopped_ms, Instant::now()))
    });
    let run = run_query(&YsbRunArgs {
        common: quiet.clone(),
        until_drained: true,
        duration: None,
        interval: a.interval,
        parallelism: a.parallelism,
        max_records: 250_000,
        dead_letter_topic: None,
        load_done: Some(done.clone()),
    })
    .await;
    if run.is_err() {
        // Let the load end with the run rather than after it.
        load.abort();
    }
    let RunOutcome { report, .. } = run?;
    let finished = Instant::now();
    let (published, stopped_ms, stopped) = load.await.context("the load task")??;
    let (check, found) = check_windows(&quiet, &default_dead_letter_topic(&common.topic)).await?;
    let latency = latencies(&found, Some(stopped_ms));
    let line = LatencyBench {
        target_rate: rate,
        duration_s: duration.as_secs_f64(),
        events: published.events,
        achieved_events_per_s: published.events_per_s.round(),
        lag_events: published.lag_events,
        events_read: report.events,
        windows: latency.windows,
        latency_ms_p50: latency.p50,
        latency_ms_p90: latency.p90,
        latency_ms_p99: latency.p99,
        latency_ms_max: latency.max,
        exact: check.exact && report.events == published.events,
        drain_after_load_s: finished.saturating_duration_since(stopped).as_secs_f64(),
        epochs: report.epochs,
        load_avg_1m: load_avg(),
        topic: common.topic.clone(),
    };
    if common.json {
        println!("{}", serde_json::to_string(&line)?);
    } else {
        println!(
            "{} events at {:.0}/s (target {rate}/s) over {:.0} s; {} windows ended under load: \
             latency p50 {} ms, p90 {} ms, p99 {} ms, max {} ms; counts {}",
            line.events,
            line.achieved_events_per_s,
            line.duration_s,
            line.windows,
            line.latency_ms_p50,
            line.latency_ms_p90,
            line.latency_ms_p99,
            line.latency_ms_max,
            if line.exact { "exact" } else { "DIFFERENT" }
        );
    }
    if !line.exact {
        bail!("the Skein run's counts differ from the topic recounted");
    }
    Ok(())
}

/// Pre-load a fresh topic, then time a raw rdkafka drain and Skein's drain.
async fn drain_bench(a: &BenchArgs, events: u64) -> Result<()> {
    let (common, quiet) = bench_topic(a);
    eprintln!(
        "setting up and publishing {} events to {}",
        events, common.topic
    );
    setup(&quiet).await?;
    generate(&GenerateArgs {
        common: quiet.clone(),
        events,
        rate: 100_000,
        partitions: 4,
        malformed_percent: 0.0,
    })
    .await?;
    let (brokers, topic) = (common.brokers.clone(), common.topic.clone());
    let (raw_events, raw_s) =
        tokio::task::spawn_blocking(move || raw_drain(&brokers, &topic)).await??;
    let raw_rate = raw_events as f64 / raw_s;
    let RunOutcome { report, .. } = run_query(&YsbRunArgs {
        common: quiet.clone(),
        until_drained: true,
        duration: None,
        interval: Duration::from_millis(1),
        parallelism: a.parallelism,
        max_records: 250_000,
        dead_letter_topic: None,
        load_done: None,
    })
    .await?;
    let check = check_report(&quiet).await?;
    let skein_rate = report.events_per_s;
    let line = json!({
        "events": events,
        "raw_drain_events_per_s": raw_rate.round(),
        "skein_events_per_s": skein_rate.round(),
        "ratio": (skein_rate / raw_rate * 1000.0).round() / 1000.0,
        "correct": check.exact && report.events == events,
        "skein_elapsed_s": report.elapsed_s,
        "raw_elapsed_s": raw_s,
        "latency_ms_p50": check.latency_ms_p50,
        "latency_ms_p99": check.latency_ms_p99,
        "topic": common.topic,
    });
    if common.json {
        println!("{line}");
    } else {
        println!(
            "{} events: raw rdkafka drain {:.0} events/s, Skein {:.0} events/s (ratio {:.3}); counts {}",
            events,
            raw_rate,
            skein_rate,
            skein_rate / raw_rate,
            if check.exact { "exact" } else { "DIFFERENT" }
        );
    }
    if !check.exact {
        bail!("the Skein run's counts differ from the ground truth");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recount_decodes_like_the_query_and_rejects_every_malformed_kind() {
        let campaigns = campaigns(5);
        let ad = campaigns.ad_ids()[13].clone();
        let campaign = campaigns.campaign_of(&ad).unwrap().to_string();
        let mut partial = PartialCount::default();
        // Both forms of event_time, extra fields of any kind skipped.
        let good = [
            format!(
                r#"{{"user_id": "u", "ad_id": "{ad}", "event_type": "view", "event_time": "12345", "ip_address": "1.2.3.4"}}"#
            ),
            format!(
                r#"{{"ad_id": "{ad}", "nested": {{"a": [1, 2]}}, "event_type": "view", "event_time": 19999}}"#
            ),
            format!(r#"{{"ad_id": "{ad}", "event_type": "click", "event_time": "12345"}}"#),
        ];
        for (i, r) in good.iter().enumerate() {
            partial.add(&campaigns, 0, i as i64, r.as_bytes());
        }
        for n in 0..5 {
            partial.add(&campaigns, 1, n as i64, &malformed_record(n, &ad));
        }
        partial.add(
            &campaigns,
            1,
            5,
            br#"{"ad_id": null, "event_type": "view", "event_time": 1}"#,
        );
        partial.add(
            &campaigns,
            1,
            6,
            br#"{"ad_id": "x", "event_type": "view", "event_time": 1.5}"#,
        );
        partial.add(&campaigns, 1, 7, b"");
        let unknown = br#"{"ad_id": "not-an-ad", "event_type": "view", "event_time": 1}"#;
        partial.add(&campaigns, 2, 0, unknown);

        assert_eq!(partial.records, 12);
        assert_eq!(
            partial.malformed,
            (0..8).map(|o| (1, o)).collect::<Vec<_>>(),
            "every malformed kind is rejected, nothing else"
        );
        assert_eq!(partial.unknown_ad_views, 1);
        let c = campaigns.campaign_index_of_ad(&ad).unwrap();
        assert_eq!(campaigns.campaign_ids()[c], campaign);
        let expected: HashMap<(usize, i64), u64> = [((c, 10_000), 2)].into_iter().collect();
        assert_eq!(
            partial.counts, expected,
            "two views in window 10 000; the click is not one"
        );
    }
}
