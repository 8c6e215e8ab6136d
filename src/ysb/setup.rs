//! `ysb setup` and `ysb generate`: the campaigns into Redis, the events into
//! the topic and the ground truth beside them.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skein_connectors::kafka::ensure_topic;
use skein_connectors::redis::{epochs_key, offsets_key};
use skein_generators::ysb::{WINDOW_MS, YsbConfig, YsbGenerator, YsbGroundTruth, malformed_record};

use super::{GenerateArgs, YsbArgs, campaigns, checkpoint, now_ms, redis_connection, run_key};

/// Campaigns and ads into Redis; earlier results of those campaigns, the
/// topic's epoch markers and offsets, and its checkpoint directory removed,
/// so that the next `ysb run` starts afresh.
pub(super) async fn setup(a: &YsbArgs) -> Result<()> {
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
    let name = checkpoint(&a.topic);
    let _: () = con
        .del(&[offsets_key(&name), epochs_key(&name), run_key(&a.topic)])
        .await?;
    crate::checkpoint_dir::remove(&a.checkpoint_dir())?;
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
pub(super) struct Generated {
    pub seed: u64,
    pub topic: String,
    pub events: u64,
    pub malformed: u64,
    pub views: u64,
}

/// Events into the topic; the ground truth into `<dir>/truth.csv`.
pub(super) async fn generate(a: &GenerateArgs) -> Result<()> {
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
            records.push(malformed_record(malformed, event.ad_id, now_ms()));
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
