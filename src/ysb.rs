//! `skein ysb ...`: the Yahoo Streaming Benchmark, Kafka -> Skein -> Redis.
//!
//! * `setup`: the campaigns and their ads into Redis (YSB's `SET <ad>
//!   <campaign>` and `SADD campaigns`, plus one hash the sink reads at once),
//!   old results of those campaigns and the run's offsets removed;
//! * `generate`: events into the topic (4 partitions), the ground truth into
//!   `<dir>/truth.csv`; `--malformed-percent` mixes in undecodable records;
//! * `run`: `queries/ysb.sql`, resuming from the offsets stored in Redis;
//! * `check`: Redis against the ground truth, and the latency
//!   `time_updated - window end` as YSB's `updated.txt` reports it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use object_store::memory::InMemory;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skein_connectors::kafka::{DEAD_LETTERS, format_offsets};
use skein_engine::driver::{RunReport, StopAfter, run_local_until};
use skein_engine::local::LocalRuntime;
use skein_engine::planner::{PlanOptions, plan_query, session};
use skein_generators::ysb::{
    ADS_PER_CAMPAIGN, NUM_CAMPAIGNS, WINDOW_MS, YsbCampaigns, YsbConfig, YsbGenerator,
    YsbGroundTruth,
};
use skein_sinks::redis::{AD_CAMPAIGN_HASH, offsets_key, stored_offsets};

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
    /// Compare Redis with the ground truth; exits non-zero on any difference.
    Check(YsbArgs),
    /// Pre-load a fresh topic, then time a raw rdkafka drain and Skein's drain.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: YsbArgs,
    #[arg(long, default_value_t = 5_000_000)]
    pub events: u64,
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
    #[arg(long, default_value_t = 1)]
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
    /// Stop once an epoch finds nothing new (the default).
    #[arg(long, conflicts_with = "duration")]
    pub until_drained: bool,
    /// Run this long (it still stops early when the topic is drained).
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

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

async fn redis_connection(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).with_context(|| format!("Redis URL {url}"))?;
    client
        .get_multiplexed_async_connection()
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
    // Only added to: ads are UUIDs, so the mappings of several seeds (e.g.
    // tests running side by side) coexist.
    let mut pipe = redis::pipe();
    for (ad, campaign) in campaigns.ad_campaign_pairs() {
        pipe.set(ad, campaign).ignore();
        pipe.hset(AD_CAMPAIGN_HASH, ad, campaign).ignore();
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

pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("Kafka admin client")?;
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .with_context(|| {
            format!("creating topic {topic} at {brokers} (scripts/services.sh start kafka)")
        })?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}

async fn generate(a: &GenerateArgs) -> Result<()> {
    let c = &a.common;
    create_topic(&c.brokers, &c.topic, a.partitions).await?;
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
        .unwrap_or_else(|| format!("{}-dead-letters", c.topic));
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
    let (report, dead, resumed) = run_query(a).await?;
    if a.common.json {
        println!(
            "{}",
            json!({
                "events": report.events,
                "dead_letters": dead,
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
            "{} records read ({} dead letters) in {} epochs, {:.2} s, {:.0} records/s; resumed at {resumed} records",
            report.events, dead, report.epochs, report.elapsed_s, report.events_per_s
        );
    }
    Ok(())
}

/// Run the query until drained (or `--duration`); returns the engine's
/// report, the dead letters and the records already done when it started.
async fn run_query(a: &YsbRunArgs) -> Result<(RunReport, u64, i64)> {
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
    let stop = StopAfter::Duration {
        duration: a.duration.unwrap_or(Duration::from_secs(365 * 86_400)),
        interval: a.interval,
    };
    let dead_before = DEAD_LETTERS.load(Ordering::Relaxed);
    let report = run_local_until(&plan, &runtime, &options, stop, |_, _| {})
        .await
        .context("running queries/ysb.sql")?;
    let dead = DEAD_LETTERS.load(Ordering::Relaxed) - dead_before;
    Ok((report, dead, resumed))
}

/// The result of comparing Redis with the ground truth.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub exact: bool,
    /// Windows in the ground truth.
    pub windows: usize,
    /// Views counted in Redis.
    pub views: u64,
    /// Views in the ground truth.
    pub expected_views: u64,
    pub missing: usize,
    pub extra: usize,
    pub wrong: usize,
    pub latency_ms_p50: i64,
    pub latency_ms_p99: i64,
    pub latency_ms_max: i64,
}

async fn read_truth(dir: &Path) -> Result<BTreeMap<(String, i64), u64>> {
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

pub async fn check_report(a: &YsbArgs) -> Result<CheckReport> {
    let truth = read_truth(&a.dir).await?;
    let mut con = redis_connection(&a.redis).await?;
    let mut found: BTreeMap<(String, i64), (u64, i64)> = BTreeMap::new();
    for campaign in campaigns(a.seed).campaign_ids() {
        let fields: HashMap<String, String> = con.hgetall(campaign).await?;
        for (field, uuid) in fields {
            if field == "windows" {
                continue;
            }
            let window: i64 = field
                .parse()
                .with_context(|| format!("campaign {campaign}: field {field:?}"))?;
            let w: HashMap<String, i64> = con.hgetall(&uuid).await?;
            found.insert(
                (campaign.clone(), window),
                (
                    w.get("seen_count").copied().unwrap_or(0) as u64,
                    w.get("time_updated").copied().unwrap_or(0),
                ),
            );
        }
    }
    let missing = truth.keys().filter(|k| !found.contains_key(*k)).count();
    let extra = found.keys().filter(|k| !truth.contains_key(*k)).count();
    let wrong = truth
        .iter()
        .filter(|(k, v)| found.get(*k).is_some_and(|(n, _)| n != *v))
        .count();
    let mut latencies: Vec<i64> = found
        .iter()
        .map(|((_, w), (_, updated))| updated - (w + WINDOW_MS))
        .collect();
    latencies.sort_unstable();
    let pct = |p: f64| -> i64 {
        if latencies.is_empty() {
            return 0;
        }
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies[i]
    };
    Ok(CheckReport {
        exact: missing == 0 && extra == 0 && wrong == 0,
        windows: truth.len(),
        views: found.values().map(|(n, _)| n).sum(),
        expected_views: truth.values().sum(),
        missing,
        extra,
        wrong,
        latency_ms_p50: pct(0.5),
        latency_ms_p99: pct(0.99),
        latency_ms_max: latencies.last().copied().unwrap_or(0),
    })
}

async fn check(a: &YsbArgs) -> Result<()> {
    let r = check_report(a).await?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{}: {} windows, {} views counted ({} expected); {} missing, {} extra, {} wrong\n\
             latency (time_updated - window end): p50 {} ms, p99 {} ms, max {} ms",
            if r.exact { "EXACT" } else { "DIFFERENT" },
            r.windows,
            r.views,
            r.expected_views,
            r.missing,
            r.extra,
            r.wrong,
            r.latency_ms_p50,
            r.latency_ms_p99,
            r.latency_ms_max
        );
    }
    if !r.exact {
        bail!("Redis differs from the ground truth");
    }
    Ok(())
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
    let started = Instant::now();
    let mut n = 0i64;
    let mut bytes = 0usize;
    while n < total {
        if started.elapsed() > Duration::from_secs(600) {
            bail!("raw drain: {n} of {total} records after 10 minutes");
        }
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            bytes += m?.payload_len();
            n += 1;
        }
    }
    tracing::debug!(bytes, "raw drain done");
    Ok((n as u64, started.elapsed().as_secs_f64()))
}

async fn bench(a: BenchArgs) -> Result<()> {
    let mut common = a.common.clone();
    if common.topic == "ad-events" {
        // A fresh topic, so both drains read exactly the events of this run.
        common.topic = format!("ad-events-bench-{}", now_ms());
    }
    let quiet = YsbArgs {
        quiet: true,
        ..common.clone()
    };
    eprintln!(
        "setting up and publishing {} events to {}",
        a.events, common.topic
    );
    setup(&quiet).await?;
    generate(&GenerateArgs {
        common: quiet.clone(),
        events: a.events,
        rate: 100_000,
        partitions: 4,
        malformed_percent: 0.0,
    })
    .await?;
    let (brokers, topic) = (common.brokers.clone(), common.topic.clone());
    let (raw_events, raw_s) =
        tokio::task::spawn_blocking(move || raw_drain(&brokers, &topic)).await??;
    let raw_rate = raw_events as f64 / raw_s;
    let (report, _, _) = run_query(&YsbRunArgs {
        common: quiet.clone(),
        until_drained: true,
        duration: None,
        interval: Duration::from_millis(1),
        parallelism: a.parallelism,
        max_records: 250_000,
        dead_letter_topic: None,
    })
    .await?;
    let check = check_report(&quiet).await?;
    let skein_rate = report.events_per_s;
    let line = json!({
        "events": a.events,
        "raw_drain_events_per_s": raw_rate.round(),
        "skein_events_per_s": skein_rate.round(),
        "ratio": (skein_rate / raw_rate * 1000.0).round() / 1000.0,
        "correct": check.exact && report.events == a.events,
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
            a.events,
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
