//! The topic and its dead letters read back for `ysb check`: the records
//! below the committed offsets counted again (one consumer thread per group
//! of partitions) with `YsbRecount`'s decoder, independent of the engine's.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use serde::Deserialize;
use skein_generators::ysb::YsbRecount;

use crate::error::{Context, Result, YsbError, fail};
use crate::{campaigns, now_ms};

/// (campaign, window start ms) -> views.
pub type Counts = BTreeMap<(String, i64), u64>;

/// The topic read back and counted again, with a decoder of its own (serde,
/// only the three fields the query uses), so that a fault of the engine's
/// decoder shows up as a difference rather than being repeated.
pub struct TopicCount {
    pub records: u64,
    /// (campaign, window start) -> views.
    pub counts: Counts,
    /// (partition, offset) of every record that does not decode.
    pub malformed: BTreeSet<(i32, i64)>,
    pub unknown_ad_views: u64,
    pub elapsed_s: f64,
}

/// Consumer settings of the read-back: no group offsets, large fetches.
pub fn read_back_consumer(brokers: &str, purpose: &str) -> Result<rdkafka::consumer::BaseConsumer> {
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
            fail!("reading {topic} back: no record for 60 s, still to read {next:?}");
        }
    }
    Ok(())
}

/// Recount the views per (campaign, window) from the topic, each partition
/// up to the offset committed to Redis with the counts (`until`; a live
/// topic goes on beyond it), one thread per group of partitions.
pub fn recount_topic(
    brokers: &str,
    topic: &str,
    seed: u64,
    until: &BTreeMap<i32, i64>,
) -> Result<TopicCount> {
    let started = Instant::now();
    let campaigns = campaigns(seed);
    let ranges = partition_ranges(&read_back_consumer(brokers, "recount")?, topic)?;
    if ranges.is_empty() {
        fail!("topic {topic} not found at {brokers} (run `skein ysb generate` first)");
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
    let partials: Vec<Result<YsbRecount>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .map(|group| {
                let campaigns = &campaigns;
                s.spawn(move || -> Result<YsbRecount> {
                    let consumer = read_back_consumer(brokers, "recount")?;
                    let mut partial = YsbRecount::default();
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
                    .unwrap_or_else(|_| Err(YsbError::Failed("recount thread panicked".into())))
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
pub struct DeadLetterSummary {
    /// Letters of undecodable records, duplicates included.
    pub records: u64,
    /// Distinct (partition, offset) they name.
    pub keys: BTreeSet<(i32, i64)>,
    pub without_reason: u64,
    /// The letters for views of ads without a campaign (rows the lookup join
    /// with `campaigns` set aside), the last one per key (as compaction
    /// keeps): key -> (views, offsets after the epoch that sent it).
    pub unknown_ads: BTreeMap<String, (u64, BTreeMap<String, i64>)>,
}

/// One dead letter: an undecodable record as the Kafka source writes it
/// (topic, partition, offset), or a view whose ad has no campaign, as the
/// lookup join sets it aside (key, the row, offsets_to naming the topic).
#[derive(Deserialize)]
struct Letter<'a> {
    #[serde(borrow)]
    topic: Option<std::borrow::Cow<'a, str>>,
    partition: Option<i32>,
    offset: Option<i64>,
    #[serde(borrow, default)]
    reason: std::borrow::Cow<'a, str>,
    key: Option<String>,
    seen_count: Option<u64>,
    #[serde(default)]
    offsets_to: BTreeMap<String, i64>,
}

/// Whether a letter is about `topic`: it names the topic, or (a row set
/// aside after decoding) only the topic's partitions in its offsets.
fn letter_of(l: &Letter<'_>, topic: &str) -> bool {
    match &l.topic {
        Some(t) => t == topic,
        None => {
            !l.offsets_to.is_empty()
                && l.offsets_to
                    .keys()
                    .all(|f| f.rsplit_once(':').is_some_and(|(t, _)| t == topic))
        }
    }
}

/// Reads the whole dead-letter topic (none there: no letters).
pub fn read_dead_letters(brokers: &str, dlt: &str, topic: &str) -> Result<DeadLetterSummary> {
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
            Ok(l) if letter_of(&l, topic) => {
                if l.reason.trim().is_empty() {
                    out.without_reason += 1;
                }
                match (l.partition, l.offset, l.key, l.seen_count) {
                    (Some(p), Some(o), _, _) => {
                        out.records += 1;
                        out.keys.insert((p, o));
                    }
                    (None, None, Some(key), n) => {
                        out.unknown_ads.insert(key, (n.unwrap_or(1), l.offsets_to));
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
