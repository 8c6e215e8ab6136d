//! `ysb setup` and `ysb generate`: the campaigns into Redis, the events into
//! the topic and the ground truth beside them.

use std::collections::HashMap;
use std::time::Instant;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use skein_generators::ysb::{WINDOW_MS, YsbConfig, YsbGenerator, YsbGroundTruth, malformed_record};
use skein_sinks::kafka::ensure_topic;
use skein_sinks::redis::{epochs_key, offsets_key};

use crate::error::{Context, Result, YsbError, fail};
use crate::{Workload, campaigns, checkpoint, now_ms, redis_connection, run_key};

/// What [`setup`] wrote and removed.
#[derive(Debug, Serialize)]
pub struct SetupReport {
    pub campaigns: usize,
    pub ads: usize,
    /// Keys of earlier results removed.
    pub cleared_keys: usize,
    /// `<dir>/ad-to-campaign-ids.txt`, the reference's mapping file.
    #[serde(skip)]
    pub mapping: std::path::PathBuf,
}

/// Campaigns and ads into Redis; earlier results of those campaigns and the
/// topic's epoch markers and offsets removed, so that the next `ysb run`
/// starts afresh (its checkpoint directory is the caller's to remove).
pub async fn setup(w: &Workload) -> Result<SetupReport> {
    let campaigns = campaigns(w.seed);
    let mut con = redis_connection(&w.redis).await?;
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
    let name = checkpoint(&w.topic);
    let _: () = con
        .del(&[offsets_key(&name), epochs_key(&name), run_key(&w.topic)])
        .await?;
    // YSB's own layout (its setup's `SET <ad> <campaign>`, `SADD campaigns`),
    // which the query's lookup table reads, so events of YSB's generator run
    // unchanged. Only added to: ads are UUIDs, so the mappings of several
    // seeds (e.g. tests running side by side) coexist.
    let mut pipe = redis::pipe();
    for (ad, campaign) in campaigns.ad_campaign_pairs() {
        pipe.set(ad, campaign).ignore();
    }
    for c in campaigns.campaign_ids() {
        pipe.sadd("campaigns", c).ignore();
    }
    let _: () = pipe
        .query_async(&mut con)
        .await
        .context("writing the campaigns")?;
    std::fs::create_dir_all(&w.dir).with_context(|| format!("creating {}", w.dir.display()))?;
    let mapping = w.dir.join("ad-to-campaign-ids.txt");
    campaigns.write_mapping(&mapping)?;
    Ok(SetupReport {
        campaigns: campaigns.campaign_ids().len(),
        ads: campaigns.ad_ids().len(),
        cleared_keys: cleared,
        mapping,
    })
}

/// What to publish: `events` at `rate` per second of event time over
/// `partitions`, with `malformed_percent` undecodable records mixed in.
#[derive(Debug, Clone)]
pub struct GenerateSpec {
    pub events: u64,
    pub rate: u64,
    pub partitions: i32,
    pub malformed_percent: f64,
}

/// What `generate` leaves for `check` (`<dir>/generated.json`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Generated {
    pub seed: u64,
    pub topic: String,
    pub events: u64,
    pub malformed: u64,
    pub views: u64,
    /// How long publishing took.
    #[serde(skip)]
    pub elapsed_s: f64,
}

/// Events into the topic; the ground truth into `<dir>/truth.csv`.
pub async fn generate(w: &Workload, spec: &GenerateSpec) -> Result<Generated> {
    ensure_topic(&w.brokers, &w.topic, spec.partitions, &[]).await?;
    let config = YsbConfig {
        seed: w.seed,
        base_time_ms: now_ms(),
        events_per_second: spec.rate,
        max_events: Some(spec.events),
        ..YsbConfig::default()
    };
    let mut generator = YsbGenerator::new(config)?;
    let mut truth = YsbGroundTruth::new(WINDOW_MS);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &w.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000")
        .create()
        .context("Kafka producer")?;
    let every = if spec.malformed_percent > 0.0 {
        Some(((100.0 / spec.malformed_percent).round() as u64).max(1))
    } else {
        None
    };
    let started = Instant::now();
    let mut pending = Vec::with_capacity(20_000);
    let mut buf = Vec::with_capacity(256);
    let (mut n, mut malformed, mut sent) = (0u64, 0u64, 0u64);
    let mut records: Vec<Vec<u8>> = Vec::with_capacity(2);
    let delivered = |topic: &str, r: Result<_, _>| -> Result<()> {
        match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(YsbError::Failed(format!("delivery to {topic} failed: {e}"))),
            Err(_) => Err(YsbError::Failed("delivery cancelled".into())),
        }
    };
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
            records.push(malformed_record(malformed, event.ad_id, now_ms()));
            malformed += 1;
        }
        for r in &records {
            let partition = (sent % spec.partitions as u64) as i32;
            sent += 1;
            let record: FutureRecord<'_, (), Vec<u8>> =
                FutureRecord::to(&w.topic).partition(partition).payload(r);
            match producer.send_result(record) {
                Ok(f) => pending.push(f),
                Err((e, _)) => fail!("producing to {}: {e}", w.topic),
            }
        }
        n += 1;
        if pending.len() >= 20_000 {
            for f in pending.drain(..) {
                delivered(&w.topic, f.await)?;
            }
        }
    }
    for f in pending.drain(..) {
        delivered(&w.topic, f.await)?;
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&w.dir).with_context(|| format!("creating {}", w.dir.display()))?;
    truth.write_csv(&w.dir.join("truth.csv"), &campaigns(w.seed))?;
    let generated = Generated {
        seed: w.seed,
        topic: w.topic.clone(),
        events: n,
        malformed,
        views: truth.total_views(),
        elapsed_s,
    };
    std::fs::write(
        w.dir.join("generated.json"),
        serde_json::to_vec(&generated)?,
    )
    .with_context(|| format!("writing {}", w.dir.join("generated.json").display()))?;
    Ok(generated)
}
